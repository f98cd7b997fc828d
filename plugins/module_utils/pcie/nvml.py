# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What NVML (nvidia-ml-py's ``pynvml``) says about the GPUs' PCIe links and peer paths.

collect() is a thin reader keyed by BDF; merge() folds its result into the sysfs model and is
pure. Every NVML call may be unsupported (VMs, older GPUs): such a field is None and listed in
``unsupported`` instead of failing the whole read.
"""

from __future__ import annotations

import traceback
from typing import Any, Callable

from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import normalize_bdf

try:
    import pynvml
    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None
except ImportError:
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = traceback.format_exc()

# nvmlGpuTopologyLevel_t -> nvidia-smi's names. INTERNAL is two GPUs on one board (its own switch).
TOPOLOGY_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlGpuP2PCapsIndex_t (literal values: some nvidia-ml-py releases define READ as a tuple).
P2P_CAPS = (("read", 0), ("write", 1), ("nvlink", 2), ("atomics", 3), ("pci", 4))
P2P_STATUS = {0: "OK", 1: "CHIPSET_NOT_SUPPORTED", 2: "GPU_NOT_SUPPORTED", 3: "IOH_TOPOLOGY_NOT_SUPPORTED",
              4: "DISABLED_BY_REGKEY", 5: "NOT_SUPPORTED", 6: "UNKNOWN"}
NVLINK_MAX_LINKS = 18
# nvmlIntNvLinkDeviceType_t: what sits at the far end of an NVLink.
NVLINK_REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch", 0xFF: "unknown"}

GPU_FIELDS = (
    ("link_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration"),
    ("link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
    ("link_gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration"),
    ("link_width_current", "nvmlDeviceGetCurrPcieLinkWidth"),
    ("link_width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
    ("pcie_replay_counter", "nvmlDeviceGetPcieReplayCounter"),
    ("numa_node", "nvmlDeviceGetNumaNodeId"),
)


class NvmlUnavailable(Exception):
    """NVML could not be loaded or initialised (no driver, no GPU, library missing)."""


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def collect(lib=None) -> dict[str, Any]:
    """Read per-GPU PCIe data and every pair's topology level and P2P status, keyed by BDF."""
    return session(lib, _collect)


def session(lib, job: Callable[[Any], Any]) -> Any:
    """``job(nv)`` with NVML initialised (``lib``, else pynvml), shut down after; NvmlUnavailable when it cannot
    start. The one place that opens NVML (the PCIe reader above, gpu/readings.py's health reader)."""
    nv = lib if lib is not None else pynvml
    if nv is None:
        raise NvmlUnavailable("the Python library nvidia-ml-py (pynvml) is not installed for this interpreter")
    try:
        nv.nvmlInit()
    except Exception as err:  # pylint: disable=broad-except  # NVMLError or OSError: library or driver missing
        raise NvmlUnavailable(f"nvmlInit failed: {err}") from None
    try:
        return job(nv)
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # pylint: disable=broad-except
            pass


def _call(nv, unsupported: list, field: str, fn: str, *args):
    try:
        return getattr(nv, fn)(*args)
    except Exception:  # pylint: disable=broad-except  # NVMLError_NotSupported and friends
        unsupported.append(field)
        return None


def _collect(nv) -> dict[str, Any]:
    unsupported: list[str] = []
    out: dict[str, Any] = {"available": True, "error": None, "unsupported": unsupported,
                           "driver_version": _call(nv, unsupported, "driver_version", "nvmlSystemGetDriverVersion"),
                           "gpus": {}, "pairs": []}
    if out["driver_version"] is not None:
        out["driver_version"] = _text(out["driver_version"])
    handles = []
    for index in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        bdf = normalize_bdf(_text(nv.nvmlDeviceGetPciInfo(handle).busId))
        gpu: dict[str, Any] = {"index": index, "unsupported": []}
        name = _call(nv, gpu["unsupported"], "name", "nvmlDeviceGetName", handle)
        uuid = _call(nv, gpu["unsupported"], "uuid", "nvmlDeviceGetUUID", handle)
        gpu.update(name=_text(name) if name is not None else None, uuid=_text(uuid) if uuid is not None else None)
        for field, fn in GPU_FIELDS:
            gpu[field] = _call(nv, gpu["unsupported"], field, fn, handle)
        gpu["nvlink_peers"], gpu["nvlink_remote_types"] = _nvlink_peers(nv, handle)
        out["gpus"][bdf] = gpu
        handles.append((bdf, handle))
    _settle_switch_links(out["gpus"])
    for i, (a, ha) in enumerate(handles):
        for b, hb in handles[i + 1:]:
            level = _call(nv, unsupported, "topology", "nvmlDeviceGetTopologyCommonAncestor", ha, hb)
            p2p = {}
            for cap, idx in P2P_CAPS:
                status = _call(nv, unsupported, "p2p_" + cap, "nvmlDeviceGetP2PStatus", ha, hb, idx)
                p2p[cap] = P2P_STATUS.get(status, status) if status is not None else None
            direct = out["gpus"][a]["nvlink_peers"].get(b, 0)
            switched = _switched_links(out["gpus"][a], out["gpus"][b], p2p)
            out["pairs"].append({"a": a, "b": b, "level": TOPOLOGY_LEVELS.get(level), "p2p": p2p,
                                 "nvlinks": direct + switched,
                                 "nvlink_via": "nvswitch" if switched else ("direct" if direct else None)})
    out["unsupported"] = sorted(set(unsupported))
    return out


def _nvlink_peers(nv, handle) -> tuple[dict[str, int], dict[str, str]]:
    """({remote BDF: active NVLink count}, {remote BDF: remote type}); empty without NVLink.

    The remote type (gpu, switch, ...) comes from nvmlDeviceGetNvLinkRemoteDeviceType where the
    driver answers it; an NVSwitch may show a BDF the host cannot see (ffffffff:ff:ff.0 in VMs).
    """
    peers: dict[str, int] = {}
    types: dict[str, str] = {}
    for link in range(NVLINK_MAX_LINKS):
        try:
            if not nv.nvmlDeviceGetNvLinkState(handle, link):
                continue
            peer = normalize_bdf(_text(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except Exception:  # pylint: disable=broad-except  # no such link / NVLink not supported
            break
        if not peer:
            continue
        peers[peer] = peers.get(peer, 0) + 1
        try:
            kind = NVLINK_REMOTE_TYPES.get(nv.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link), "unknown")
        except Exception:  # pylint: disable=broad-except  # older driver or library: type not answered
            kind = "unknown"
        if types.get(peer) in (None, "unknown"):
            types[peer] = kind
    return peers, types


def _settle_switch_links(gpus: dict[str, dict[str, Any]]) -> None:
    """Split each GPU's NVLinks into direct GPU peers and links into an NVSwitch fabric.

    A remote that NVML calls a switch, or one of unknown type that is not a GPU of this host,
    counts as the fabric (``nvswitch_links``); ``nvlink_peers`` keeps only this host's GPUs.
    """
    for gpu in gpus.values():
        direct: dict[str, int] = {}
        fabric = 0
        for peer, count in gpu["nvlink_peers"].items():
            kind = gpu["nvlink_remote_types"].get(peer, "unknown")
            if kind == "switch" or (kind == "unknown" and peer not in gpus):
                fabric += count
            elif peer in gpus:
                direct[peer] = count
        gpu["nvlink_peers"] = direct
        gpu["nvswitch_links"] = fabric


def _switched_links(a: dict[str, Any], b: dict[str, Any], p2p: dict[str, Any]) -> int:
    """NVLinks between two GPUs through an NVSwitch fabric, as nvidia-smi counts them (NV<n>):
    the smaller of their fabric link counts, where NVML says NVLink P2P between them works."""
    if not a.get("nvswitch_links") or not b.get("nvswitch_links") or p2p.get("nvlink") != "OK":
        return 0
    return min(a["nvswitch_links"], b["nvswitch_links"])


def merge(model: dict[str, Any], nvml: dict[str, Any]) -> dict[str, Any]:
    """Fold NVML data into the model (in place, returned): NVML's level wins where it has one.

    A pair joined by NVLink gets level ``NV<n>`` as nvidia-smi prints it; the sysfs level stays
    in ``sysfs_level``.
    """
    model["nvml"] = nvml
    by_pair = {frozenset((p["a"], p["b"])): p for p in nvml.get("pairs") or []}
    for pair in model["pairs"]:
        hit = by_pair.get(frozenset((pair["a"], pair["b"])))
        if not hit:
            continue
        pair["nvml_level"] = hit["level"]
        pair["p2p"] = hit["p2p"]
        pair["nvlinks"] = hit.get("nvlinks", 0)
        pair["nvlink_via"] = hit.get("nvlink_via")
        if hit.get("nvlinks"):
            pair["level"], pair["level_source"] = f"NV{hit['nvlinks']}", "nvml"
        elif hit["level"]:
            pair["level"], pair["level_source"] = hit["level"], "nvml"
    return model

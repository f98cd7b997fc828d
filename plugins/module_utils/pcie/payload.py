# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Path- and peer-safe PCIe MaxPayload (MPS) and MaxReadRequest (MRRS) for gpufleet.inference.pcie_payload.

The model comes from _pci/topology.py's PciWalker (the same path walk and config-space decoder as
pcie_facts); plan_present() and plan_restore() are pure and return the register writes;
apply_writes() runs them with setpci through a ``run(argv) -> (rc, out, err)`` callback, reads
every write back from the sysfs ``config`` file through HostFS and rolls back on failure.

The MPS rule is the kernel's ``pcie_bus_safe`` one: every PCI Express function below one root
port (the root port itself, switch ports, endpoints, their other functions) talks to the others
with one MaxPayload, so all of them end with the same value, and none above what the smallest of
them supports. A function the module does not write keeps its current value, which then fixes
the value of the whole hierarchy. MRRS is a requester setting: it is written on the listed
devices only, within the PCIe encoding (128 to 4096 bytes) and below a user cap.
"""

from __future__ import annotations

import struct
from typing import Any, Callable

from ansible_collections.gpufleet.inference.plugins.module_utils._host.device_apply import (
    SKIP_GROUP, STOP, apply_steps, empty_originals, merge_originals, parse_originals)
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.config import CFG_CONVENTIONAL, read_config
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import (
    PCI_DEVICES, PciWalker, TopologyError, class_name, select_targets,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.boot import setpci_base

# PCIe encodings of the Device Control register (PCI Express capability + 0x08): the payload
# sizes 128 << code for codes 0..5; 6 and 7 are reserved and never written.
SIZES = (128, 256, 512, 1024, 2048, 4096)
DEVCTL = 0x08
REGISTERS = {
    "mps": {"shift": 5, "mask": 0x00E0, "name": "MaxPayload"},
    "mrrs": {"shift": 12, "mask": 0x7000, "name": "MaxReadReq"},
}
REGISTER_ORDER = ("mps", "mrrs")

STATE_DIR = "/var/lib/gpufleet/pcie_payload"
RECORD_FILE = "originals.json"
RECORD_FORMAT = "gpufleet-pcie-payload-originals/1"


class PayloadError(Exception):
    """Bad input or an unsafe request; the message says what, where, why and what to do."""


# ---- sizes and registers ------------------------------------------------------------------------
def parse_size(value: Any, what: str) -> int:
    """``256``, ``'256'`` -> 256; anything that is not a PCIe payload encoding raises PayloadError."""
    text = str(value).strip()
    size = int(text) if text.isdigit() else None
    if size not in SIZES:
        raise PayloadError(
            f"{what}: {value!r} is not a PCIe payload size. Use one of {', '.join(str(s) for s in SIZES)} bytes "
            "(the Device Control encodings 0 to 5; 6 and 7 are reserved).")
    return size


def parse_mps(value: Any) -> int | str | None:
    """None (leave MPS alone), ``max_safe``, or a size in bytes."""
    if value is None:
        return None
    if str(value).strip() == "max_safe":
        return "max_safe"
    return parse_size(value, "mps")


def size_code(size: int) -> int:
    return SIZES.index(size)


def field(devctl: int, register: str) -> int:
    """The size in bytes that a Device Control value holds for ``register``."""
    reg = REGISTERS[register]
    return 128 << ((devctl & reg["mask"]) >> reg["shift"])


def setpci_spec(register: str, size: int) -> str:
    """``CAP_EXP+8.w=VALUE:MASK``: setpci writes only the bits under MASK (read-modify-write)."""
    reg = REGISTERS[register]
    return f"CAP_EXP+{DEVCTL:x}.w={size_code(size) << reg['shift']:04x}:{reg['mask']:04x}"


def setpci_argv(setpci: str, root: str, bdf: str, register: str, size: int) -> list[str]:
    """The setpci command for one register write: ``-A linux-sysfs -O sysfs.path`` pins it to the tree under root."""
    return setpci_base(setpci, root) + ["-s", bdf, setpci_spec(register, size)]


def devctl_of(config: bytes, pcie_offset: int) -> int:
    return struct.unpack_from("<H", config, pcie_offset + DEVCTL)[0]


# ---- reading ------------------------------------------------------------------------------------
def read_payload(fs: HostFS, bdf: str) -> dict[str, Any]:
    """DevCap/DevCtl payload fields of one function, from its sysfs config file.

    Returns ``{readable, error, pcie_offset, port_type, mps_supported, mps, mrrs, devctl}``;
    ``pcie_offset`` is None for a conventional PCI function (no PCI Express capability).
    """
    out: dict[str, Any] = {"readable": False, "error": None, "pcie_offset": None, "port_type": None,
                           "mps_supported": None, "mps": None, "mrrs": None, "devctl": None}
    path, data, cfg, error = read_config(fs, bdf)
    if error:
        out["error"] = error
        return out
    pcie = cfg["pcie"]
    if not cfg["capabilities_complete"] or (pcie and pcie.get("truncated")) or len(data) < CFG_CONVENTIONAL:
        out["error"] = (f"only {len(data)} bytes of {path} are readable, too few for the PCI Express capability "
                        "(non-root readers get 64)")
        return out
    out["readable"] = True
    if pcie:
        out.update(pcie_offset=pcie["offset"], port_type=pcie["port_type"], mps_supported=pcie["mps_supported"],
                   mps=pcie["mps"], mrrs=pcie["mrrs"], devctl=devctl_of(data, pcie["offset"]))
    return out


def function_info(walker: PciWalker, bdf: str) -> dict[str, Any]:
    """Identity, place in the tree and payload fields of one function."""
    basic = walker.basic(bdf)
    host_bridge, chain = walker.path(bdf)
    rec = {"bdf": bdf, "vendor_id": basic["vendor"], "device_id": basic["device"], "class": basic["class"],
           "class_name": class_name(basic["class"]), "host_bridge": host_bridge, "path": chain, "depth": len(chain)}
    rec.update(read_payload(walker.fs, bdf))
    return rec


def describe(info: dict) -> str:
    """``0000:03:00.0 (3D controller [10de:2330])``."""
    ids = f"{(info.get('vendor_id') or '0x?')[2:]}:{(info.get('device_id') or '0x?')[2:]}"
    return f"{info['bdf']} ({info.get('class_name') or 'unknown class'} [{ids}])"


def hierarchy_key(info: dict) -> str:
    """The top of the function's PCIe hierarchy: its root port, or its slot when it sits on a root bus."""
    return info["path"][0] if len(info["path"]) > 1 else info["bdf"][:-2]


def in_hierarchy(key: str, info: dict) -> bool:
    """Whether a function (``bdf`` and ``path``) belongs to the hierarchy ``key`` (hierarchy_key())."""
    return info["path"][0] == key or (len(info["path"]) == 1 and info["bdf"][:-2] == key)


def gather(fs: HostFS, devices=None, extra=None) -> dict[str, Any]:
    """Read the targets and every function of their hierarchies.

    ``devices`` empty: every GPU as pcie_facts finds them (class 03, BMC display controllers left
    out); those without a PCI Express capability are skipped with a warning. Listed devices must
    exist and have one. ``extra``: BDFs (recorded earlier) to read as well when present.
    Raises PayloadError (TopologyError's messages for unknown or malformed addresses).
    """
    walker = PciWalker(fs)
    explicit = bool(devices)
    try:
        targets = select_targets(walker, devices=list(devices or []))
    except TopologyError as err:
        raise PayloadError(str(err)) from None
    warnings: list[str] = []
    functions: dict[str, dict[str, Any]] = {}
    kept = []
    for bdf in targets:
        info = functions[bdf] = function_info(walker, bdf)
        if not info["readable"]:
            raise PayloadError(
                f"Cannot read the payload settings of {describe(info)}: {info['error']}. Run the module as root "
                f"(become: true) and check that the function still exists (lspci -D -s {bdf}).")
        if info["pcie_offset"] is None:
            if explicit:
                raise PayloadError(
                    f"{describe(info)} has no PCI Express capability: MaxPayload and MaxReadReq exist only on PCIe "
                    "functions (this is conventional PCI). Drop it from devices.")
            warnings.append(f"{describe(info)} has no PCI Express capability (conventional PCI); it is skipped.")
            continue
        kept.append(bdf)
    if not kept:
        raise PayloadError(
            f"No PCI Express GPU under {PCI_DEVICES} (root {fs.root}): every display controller found is conventional "
            "PCI. Set devices: to the PCIe functions to tune.")
    present = walker.functions()
    hierarchies: dict[str, list[str]] = {}
    for bdf in kept:
        key = hierarchy_key(functions[bdf])
        if key in hierarchies:
            continue
        members = []
        for other in present:
            if other not in functions:
                host_bridge, chain = walker.path(other)
                probe = {"bdf": other, "path": chain}
                if host_bridge != functions[bdf]["host_bridge"] or not in_hierarchy(key, probe):
                    continue
                functions[other] = function_info(walker, other)
            elif functions[other]["host_bridge"] != functions[bdf]["host_bridge"] or not in_hierarchy(key, functions[other]):
                continue
            members.append(other)
        hierarchies[key] = sorted(members, key=lambda b: (functions[b]["depth"], b))
    for bdf in extra or ():
        if bdf not in functions and bdf in present:
            functions[bdf] = function_info(walker, bdf)
    return {"root": fs.root, "targets": kept, "functions": functions, "hierarchies": hierarchies,
            "present": present, "warnings": warnings}


def gather_recorded(fs: HostFS, bdfs) -> dict[str, Any]:
    """Read the recorded functions that still exist (for state=default)."""
    walker = PciWalker(fs)
    present = walker.functions()
    functions = {b: function_info(walker, b) for b in bdfs if b in present}
    return {"root": fs.root, "functions": functions, "present": present}


# ---- planning -----------------------------------------------------------------------------------
def _cap(info: dict, written: bool) -> int:
    """What a function can take: its capability if it is written, else also its current setting."""
    return info["mps_supported"] if written else min(info["mps_supported"], info["mps"])


def _limit(infos: list[dict], written: set) -> tuple[int | None, str | None]:
    best = None
    for info in infos:
        cap = _cap(info, info["bdf"] in written)
        if best is None or cap < best[0]:
            best = (cap, info["bdf"])
    return best if best else (None, None)


def _relation(limiting: str, members: list[str], targets: list[str], functions: dict) -> str:
    """``on the path of A and a peer of B``: how the limiting function relates to the targets."""
    mine = [t for t in targets if t in members]
    on_path = [t for t in mine if limiting in functions[t]["path"]]
    peers = [t for t in mine if t not in on_path]
    parts = ([f"on the path of {', '.join(on_path)}"] if on_path else []) + ([f"a peer of {', '.join(peers)}"] if peers else [])
    return " and ".join(parts)


def _why(info: dict, written: bool, relation: str) -> str:
    if written or info["mps"] >= info["mps_supported"]:
        return f"{describe(info)} ({relation}) supports only {info['mps_supported']}"
    return (f"{describe(info)} ({relation}) is set to {info['mps']} and is not written by this task "
            "(add it to devices, or keep include_path on for bridges)")


def plan_present(model: dict, mps=None, mrrs: int | None = None, mrrs_cap: int | None = None,
                 include_path: bool = True) -> dict[str, Any]:
    """Decide the register writes. Pure.

    Returns ``{"devices": {bdf: report}, "writes": [write, ...], "managed": {bdf: ...}}``, writes
    ordered top-down (the kernel's order: root port, switch ports, endpoints), each ``{device,
    register, before, after, hierarchy}``; ``managed`` names the registers this task keeps on each
    function (what the boot unit re-applies), changed or not. Raises PayloadError when the request
    is unsafe or cannot be met.
    """
    written, roles = _written(model, mps, include_path)
    report: dict[str, dict[str, Any]] = {}
    writes: list[dict[str, Any]] = []
    managed: dict[str, dict[str, Any]] = {}
    for key, members in model["hierarchies"].items():
        hierarchy = _hierarchy(model, key, members, written, mps)
        for info in hierarchy["pcie"]:
            if info["bdf"] in written or info["bdf"] in model["targets"]:
                report[info["bdf"]] = _plan_function(info, hierarchy, model, written, roles, (mrrs, mrrs_cap), writes, managed)
    writes.sort(key=lambda w: (w["depth"], w["device"], REGISTER_ORDER.index(w["register"])))
    return {"devices": report, "writes": writes, "managed": managed}


def _written(model: dict, mps, include_path: bool) -> tuple[set, dict[str, str]]:
    """The functions whose MaxPayload this task writes (with ``mps``: the targets, the other functions of their
    devices and, with ``include_path``, the bridges above them), and each function's role in the report."""
    functions = model["functions"]
    written: set = set()
    roles = {bdf: "target" for bdf in model["targets"]}
    if mps is None:
        return written, roles
    for bdf in model["targets"]:
        info = functions[bdf]
        written.add(bdf)
        for other in model["hierarchies"][hierarchy_key(info)]:
            o = functions[other]
            if other != bdf and other[:-1] == bdf[:-1] and o["readable"] and o["pcie_offset"] is not None:
                written.add(other)
                roles.setdefault(other, "function")
        if include_path:
            for hop in info["path"][:-1]:
                if functions[hop]["pcie_offset"] is not None:
                    written.add(hop)
                    roles.setdefault(hop, "path")
    return written, roles


def _hierarchy(model: dict, key: str, members: list[str], written: set, mps) -> dict[str, Any]:
    """One PCIe hierarchy's plan inputs: ``key``, its functions with a PCI Express capability (``pcie``), the
    smallest supported MaxPayload (``limit``, ``limiting``) and the MaxPayload to set (``target_mps``, None when
    none is written). Raises PayloadError when a member cannot be read, the value is not safe, or functions this
    task does not write would be left at another MaxPayload."""
    functions = model["functions"]
    for bdf in members if mps is not None else ():
        info = functions[bdf]
        if not info["readable"]:
            raise PayloadError(
                f"Cannot read the payload settings of {describe(info)}, which shares the PCIe hierarchy below {key} "
                f"with the devices to tune: {info['error']}. Its MaxPayload must match theirs; run the module as root "
                "(become: true).")
    pcie = [functions[b] for b in members if functions[b]["pcie_offset"] is not None]
    limit, limiting = _limit(pcie, written)
    target_mps = None
    if mps is not None and any(b in written for b in members):
        target_mps = limit if mps == "max_safe" else mps
        if target_mps > limit:
            relation = _relation(limiting, members, model["targets"], functions)
            raise PayloadError(
                f"mps {mps} is not safe below {key}: {_why(functions[limiting], limiting in written, relation)}. Every function in one "
                f"PCIe hierarchy must use one MaxPayload no larger than the smallest supported one (the kernel's "
                f"pcie_bus_safe rule), so the largest safe value is {limit}: use mps: max_safe or mps: {limit}.")
        _check_fixed(key, [f for f in pcie if f["bdf"] not in written], target_mps)
    return {"key": key, "pcie": pcie, "limit": limit, "limiting": limiting, "target_mps": target_mps}


def _check_fixed(key: str, fixed: list[dict], target_mps: int) -> None:
    """The functions of hierarchy ``key`` this task does not write must already be at ``target_mps`` (else
    PayloadError, saying which to add to devices)."""
    values = sorted({f["mps"] for f in fixed})
    if len(values) > 1:
        listing = ", ".join(f"{describe(f)} at {f['mps']}" for f in fixed)
        raise PayloadError(
            f"The PCIe hierarchy below {key} already mixes MaxPayload values on functions this task does not "
            f"write ({listing}). Add them to devices so that all of them are set to one value.")
    for f in fixed:
        if f["mps"] != target_mps:
            raise PayloadError(
                f"Cannot set MaxPayload {target_mps} below {key}: {describe(f)} shares that hierarchy and stays at "
                f"{f['mps']} because this task does not write it, and functions that exchange packets must use one "
                f"MaxPayload. Add {f['bdf']} to devices (it supports {f['mps_supported']}), or set mps: {f['mps']}.")


def _plan_function(info: dict, hierarchy: dict, model: dict, written: set, roles: dict, mrrs_wanted: tuple,
                   writes: list[dict], managed: dict) -> dict[str, Any]:
    """One function's report entry; its register writes are appended to ``writes``, the registers this task keeps
    on it put in ``managed``. ``mrrs_wanted``: (mrrs, mrrs_cap)."""
    bdf, key, targets = info["bdf"], hierarchy["key"], model["targets"]
    mrrs, mrrs_cap = mrrs_wanted
    target_mps = hierarchy["target_mps"]
    entry = _report_entry(info, hierarchy, model["functions"], written, roles.get(bdf, "path"))
    registers = []
    if target_mps is not None and bdf in written:
        registers.append("mps")
        if info["mps"] != target_mps:
            entry["mps_after"] = target_mps
            writes.append({"device": bdf, "register": "mps", "before": info["mps"], "after": target_mps,
                           "hierarchy": key, "depth": info["depth"]})
    if bdf in targets and (mrrs is not None or mrrs_cap is not None):
        registers.append("mrrs")
    if registers:
        managed[bdf] = {"vendor_id": info["vendor_id"], "device_id": info["device_id"], "hierarchy": key,
                        "depth": info["depth"], "registers": registers}
    if bdf in targets:
        want = mrrs
        if mrrs_cap is not None and (want if want is not None else info["mrrs"]) > mrrs_cap:
            want = mrrs_cap
            entry["mrrs_capped"] = True
        if want is not None and want != info["mrrs"]:
            entry["mrrs_after"] = want
            writes.append({"device": bdf, "register": "mrrs", "before": info["mrrs"], "after": want,
                           "hierarchy": key, "depth": info["depth"]})
    return entry


def _report_entry(info: dict, hierarchy: dict, functions: dict, written: set, role: str) -> dict[str, Any]:
    """A function's report before any write: its registers as they are, and the limits of its hierarchy, of its
    path and of its peers (with the function that sets each)."""
    path_infos = [functions[h] for h in info["path"] if h in functions and functions[h]["pcie_offset"] is not None]
    peer_infos = [p for p in hierarchy["pcie"] if p["bdf"] not in info["path"]]
    path_limit, path_dev = _limit(path_infos, written)
    peer_limit, peer_dev = _limit(peer_infos, written)
    return {
        "bdf": info["bdf"], "role": role, "hierarchy": hierarchy["key"], "class_name": info["class_name"],
        "vendor_id": info["vendor_id"], "device_id": info["device_id"], "port_type": info["port_type"],
        "mps_supported": info["mps_supported"], "mps_before": info["mps"], "mps_after": info["mps"],
        "mrrs_before": info["mrrs"], "mrrs_after": info["mrrs"], "mrrs_capped": False,
        "limit": hierarchy["limit"], "limiting_device": hierarchy["limiting"], "path_limit": path_limit,
        "path_limiting_device": path_dev, "peer_limit": peer_limit, "peer_limiting_device": peer_dev,
    }


# ---- the record of original values --------------------------------------------------------------
def empty_record() -> dict[str, Any]:
    return empty_originals(RECORD_FORMAT)


def parse_record(text: str | None, where: str) -> dict[str, Any]:
    """The JSON record of original values (device_apply.parse_originals: an absent file is no record; an
    empty file is an error (a crash or a full disk truncated it), never read as "nothing was changed")."""
    return parse_originals(text, where, RECORD_FORMAT, "pcie_payload", "MaxPayload/MaxReadReq values", PayloadError)


def merge_record(record: dict, writes: list[dict], functions: dict) -> dict:
    """The record after ``writes``: the first value ever seen for each register is kept."""
    def first_seen(devices: dict, w: dict) -> None:
        info = functions[w["device"]]
        dev = devices.setdefault(w["device"], {
            "vendor_id": info["vendor_id"], "device_id": info["device_id"], "hierarchy": w["hierarchy"],
            "depth": info["depth"], "original": {}})
        dev["original"].setdefault(w["register"], w["before"])
    return merge_originals(record, writes, first_seen)


def restore_scope(record: dict, existing: dict[str, dict], devices=None) -> set:
    """The hierarchies state=default puts back: those of ``devices``, or every recorded or persisted one.

    Each hierarchy is restored whole, so it ends consistent.
    """
    recorded = record["devices"]
    if not devices:
        return {r["hierarchy"] for r in recorded.values()} | {e.get("hierarchy") for e in existing.values()}
    keys = set()
    for bdf in devices:
        if bdf in recorded:
            keys.add(recorded[bdf]["hierarchy"])
        elif bdf in existing:
            keys.add(existing[bdf].get("hierarchy"))
        else:
            raise PayloadError(f"{bdf} has neither recorded original values nor persisted values, so there is nothing to "
                               f"restore for it (recorded: {', '.join(sorted(recorded)) or 'none'}; persisted: "
                               f"{', '.join(sorted(existing)) or 'none'}).")
    return keys


def plan_restore(record: dict, model: dict, hierarchies: set) -> dict[str, Any]:
    """Writes that put the recorded devices of ``hierarchies`` back to their original values. Pure.

    Returns ``{"writes", "restore": [bdfs], "gone": [bdfs]}``.
    """
    recorded = record["devices"]
    chosen = [b for b in recorded if recorded[b]["hierarchy"] in hierarchies]
    functions = model["functions"]
    writes, gone = [], []
    for bdf in sorted(chosen, key=lambda b: (recorded[b].get("depth", 0), b)):
        rec = recorded[bdf]
        info = functions.get(bdf)
        if info is None:
            gone.append(bdf)
            continue
        if (info["vendor_id"], info["device_id"]) != (rec["vendor_id"], rec["device_id"]):
            raise PayloadError(
                f"{describe(info)} is not the device whose values were recorded ({rec['vendor_id'][2:]}:{rec['device_id'][2:]}): "
                "the card was replaced or the bus renumbered. Its recorded values do not apply; remove its entry from the "
                "record by hand after checking the hardware.")
        if not info["readable"] or info["pcie_offset"] is None:
            raise PayloadError(f"Cannot restore {describe(info)}: {info['error'] or 'it has no PCI Express capability'}. "
                               "Run the module as root (become: true).")
        for register in REGISTER_ORDER:
            if register not in rec["original"]:
                continue
            want = parse_size(rec["original"][register], f"recorded {register} of {bdf}")
            if register == "mps" and want > info["mps_supported"]:
                raise PayloadError(f"The recorded MaxPayload {want} of {describe(info)} is above what it supports "
                                   f"({info['mps_supported']}); the record is wrong. Remove its entry by hand.")
            if info[register] != want:
                writes.append({"device": bdf, "register": register, "before": info[register], "after": want,
                               "hierarchy": rec["hierarchy"], "depth": info["depth"]})
    return {"writes": writes, "restore": chosen, "gone": gone}


# ---- persistence (the boot unit lives in pcie/boot.py) -------------------------------------------
def persist_entries(managed: dict[str, dict], existing: dict[str, dict], live: dict[str, dict], skip=()) -> list[dict]:
    """What the boot unit re-applies after this task.

    Every managed register with the value it holds now (``live``: {bdf: {"mps", "mrrs"}}), changed
    by this task or not, so that a firmware reset is undone too; hierarchies in ``skip`` (read-only
    with on_readonly=warn) are left out. Entries of hierarchies this task does not manage are kept
    as they were. Ordered top-down like the writes.
    """
    mine = {m["hierarchy"] for m in managed.values()}
    out = [dict(e) for b, e in existing.items() if e.get("hierarchy") not in mine and b not in managed]
    for bdf, m in managed.items():
        if m["hierarchy"] in skip:
            continue
        entry = {"bdf": bdf, "vendor_id": m["vendor_id"], "device_id": m["device_id"], "hierarchy": m["hierarchy"],
                 "depth": m["depth"]}
        for register in m["registers"]:
            value = (live.get(bdf) or {}).get(register)
            if value is not None:
                entry[register] = value
        out.append(entry)
    out.sort(key=lambda e: (e.get("depth", 0), e["bdf"]))
    return out


# ---- applying -----------------------------------------------------------------------------------
def apply_writes(fs: HostFS, writes: list[dict], run: Callable, setpci: str, stop_on_readonly: bool = True,
                 keep_going: bool = False) -> dict[str, Any]:
    """Run ``writes`` in order with setpci and read each one back from the config file (device_apply).

    A write that setpci refuses, or whose field reads back unchanged (a read-only field: QEMU
    makes DevCtl payload fields read-only) or with another value, fails. The writes already done
    in that hierarchy are rolled back (reverse order), and so are all others unless
    ``stop_on_readonly`` is false and the failure was a read-only field, in which case the other
    hierarchies go on; with ``keep_going`` (the boot unit) every failure only stops its own
    hierarchy. Returns ``{done, failures, rolled_back, rollback_failed, journal}``; each failure is
    ``{device, register, wanted, reads, kind (readonly|error), argv, rc, stderr}``; ``journal`` is
    device_apply's, every attempt in order.
    """
    def write(w: dict, size: int) -> tuple[int, str, list[str]]:
        argv = setpci_argv(setpci, fs.root, w["device"], w["register"], size)
        rc, _out, err = run(argv)
        return rc, err, argv

    def read(w: dict) -> tuple[int | None, str | None]:
        now = read_payload(fs, w["device"])
        return (now[w["register"]] if now["readable"] else None), now["error"]

    def policy(attempt: dict) -> str:
        return SKIP_GROUP if keep_going or (attempt["kind"] == "readonly" and not stop_on_readonly) else STOP

    out = apply_steps(writes, write, read, lambda w, reads, size: reads == size, group=lambda w: w["hierarchy"],
                      on_failure=policy)
    return {
        "done": [dict(a["step"], argv=a["argv"]) for a in out["done"]],
        "failures": [{"device": a["step"]["device"], "register": a["step"]["register"], "wanted": a["step"]["after"],
                      "before": a["step"]["before"], "reads": a["reads"], "kind": a["kind"], "argv": a["argv"], "rc": a["rc"],
                      "stderr": a["stderr"]} for a in out["failures"]],
        "rolled_back": [dict(a["step"], argv=a["argv"], rc=a["rc"], stderr=a["stderr"]) for a in out["rolled_back"]],
        "rollback_failed": [dict(a["step"], argv=a["argv"], rc=a["rc"], stderr=a["stderr"], reads=a["reads"])
                            for a in out["rollback_failed"]],
        "journal": out["journal"],
    }


def failure_message(failure: dict, functions: dict, result: dict) -> str:
    """What went wrong with a write, where, why, and what to do."""
    info = functions.get(failure["device"]) or {"bdf": failure["device"]}
    label = REGISTERS[failure["register"]]["name"]
    cmd = " ".join(failure["argv"])
    if failure["kind"] == "readonly":
        msg = (f"{describe(info)} did not take {label} {failure['wanted']}: '{cmd}' exited 0 but the field still reads "
               f"{failure['reads']}. The device or the hypervisor keeps Device Control read-only (QEMU does, and so do some "
               f"pass-through setups); nothing can set it from this host. Leave {failure['register']} unset for it, or set "
               f"on_readonly: warn to skip such hierarchies.")
    else:
        reads = f"; it reads {failure['reads']}" if failure["reads"] is not None else ""
        msg = (f"Writing {label} {failure['wanted']} to {describe(info)} failed: '{cmd}' exited {failure['rc']}"
               f"{': ' + failure['stderr'] if failure['stderr'] else ''}{reads}. Run the module as root (become: true) "
               f"and check that setpci can write the function's config space (lockdown mode forbids it).")
    if result["rolled_back"]:
        msg += " Rolled back: " + ", ".join(f"{r['device']} {r['register']} {r['before']}" for r in result["rolled_back"]) + "."
    if result["rollback_failed"]:
        msg += (" ROLLBACK FAILED, these keep the new value: "
                + ", ".join(f"{r['device']} {r['register']} reads {r['reads']} (was {r['before']})" for r in result["rollback_failed"])
                + ". Reboot the host, or set the values by hand with setpci.")
    return msg


def payload_mismatches(devices: dict, facts: dict) -> list[str]:
    """Devices whose live MaxPayload/MaxReadReq (as pcie_facts read them) differ from what the
    pcie_payload result says they hold. Empty when everything matches."""
    out = []
    live = (facts or {}).get("devices") or {}
    for bdf, dev in sorted((devices or {}).items()):
        pcie = ((live.get(bdf) or {}).get("config") or {}).get("pcie")
        if not pcie:
            out.append(f"{bdf}: pcie_facts could not read its PCI Express capability")
            continue
        for register in REGISTER_ORDER:
            want = dev.get(f"{register}_after")
            if want is not None and pcie.get(register) != want:
                out.append(f"{bdf}: {REGISTERS[register]['name']} is {pcie.get(register)}, expected {want}")
    return out

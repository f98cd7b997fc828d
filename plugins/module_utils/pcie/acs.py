# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""ACS P2P redirect between the GPUs of a tensor-parallel group, for gpufleet.inference.pcie_acs.

Access Control Services on a switch downstream port or a root port can redirect peer-to-peer
requests (ReqRedir, RR), completions (CmpltRedir, CR) and egress-controlled traffic (EgressCtrl,
EC) up to the root complex instead of straight to the peer: P2P then goes through the IOMMU, is
slow, and has hung NCCL all-reduce on PCIe-only GPUs. The kernel turns these bits on at every
port when an IOMMU is enabled, because ACS is what keeps devices in separate IOMMU groups for vfio.

The real controls (``pci=noacs`` does not exist in mainline Linux):

- at runtime, clear RR/CR/EC in the ACS Control register (ECAP_ACS + 6) of exactly the bridges
  between the group's GPUs: ``setpci -s BRIDGE ECAP_ACS+6.w=0000:002c`` (value:mask, only those
  bits); lasts until the next reset or boot, so the collection's boot unit re-applies it;
- at boot, ``pci=disable_acs_redir=<dev>[;<dev>...]`` (Linux 4.19+, commit aaca43fda742) and ``pci=config_acs=`` (6.11+),
  which the kernel applies while it enumerates the bus, before any driver.

Pure planning here; I/O through HostFS and a ``run(argv)`` callback.
"""

from __future__ import annotations

import re
import struct
from itertools import combinations
from typing import Any, Callable

from ansible_collections.gpufleet.inference.plugins.module_utils._host.device_apply import (
    SKIP_GROUP, STOP, apply_steps, empty_originals, merge_originals, parse_originals)
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.config import read_config
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import PCI_DEVICES, topology_level
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.boot import setpci_base

# ACS Control bits this module manages (same layout as ACS Capability).
BITS = {"RR": 0x04, "CR": 0x08, "EC": 0x20}
MASK = 0x2C
ACSCTL = 6
STATE_DIR = "/var/lib/gpufleet/pcie_acs"
RECORD_FILE = "originals.json"
RECORD_FORMAT = "gpufleet-pcie-acs-originals/1"
# Boot parameters: disable_acs_redir since Linux 4.19 (commit aaca43fda742, merged in the 4.19 window), config_acs since 6.11.
DISABLE_ACS_REDIR_SINCE = (4, 19)
CONFIG_ACS_SINCE = (6, 11)
# config_acs flags, bit 6 (DT) first down to bit 0 (SV): clear EC (5), CR (3), RR (2), keep the rest.
CONFIG_ACS_FLAGS = "x0x00xx"
VFIO_HINTS = ("/etc/modprobe.d/gpufleet-vfio.conf", "/etc/udev/rules.d/61-gpufleet-vfio.rules")


class AcsError(Exception):
    """Bad input or an unsafe request; the message says what, where, why and what to do."""


def bit_names(value: int) -> list[str]:
    return [name for name, bit in BITS.items() if value & bit]


def spec(value: int, mask: int) -> str:
    """``ECAP_ACS+6.w=VALUE:MASK``: setpci writes only the bits under MASK."""
    return f"ECAP_ACS+{ACSCTL:x}.w={value & mask:04x}:{mask:04x}"


def setpci_argv(setpci: str, root: str, bdf: str, value: int, mask: int) -> list[str]:
    return setpci_base(setpci, root) + ["-s", bdf, spec(value, mask)]


def read_acs(fs: HostFS, bdf: str) -> dict[str, Any]:
    """ACS of one function: ``{readable, error, offset, cap, ctrl, vendor_id, device_id}``; offset None without ACS."""
    out: dict[str, Any] = {"readable": False, "error": None, "offset": None, "cap": 0, "ctrl": 0,
                           "vendor_id": None, "device_id": None}
    path, _data, cfg, error = read_config(fs, bdf)
    if error:
        out["error"] = error
        return out
    out.update(vendor_id=cfg["vendor_id"], device_id=cfg["device_id"])
    if cfg["pcie"] is not None and cfg["extended_readable"] is False:
        out["error"] = f"only {cfg['size']} bytes of {path} are readable: the ACS capability is in extended space (run as root)"
        return out
    out["readable"] = True
    acs = cfg["acs"]
    if acs:
        cap = sum(1 << i for i, name in enumerate(("SV", "TB", "RR", "CR", "UF", "EC", "DT")) if acs["cap"][name])
        out.update(offset=acs["offset"], cap=cap, ctrl=acs["ctrl_raw"])
    return out


# ---- which bridges -----------------------------------------------------------------------------
def pair_bridges(model: dict, a: dict, b: dict) -> tuple[str, list[str]]:
    """The level of a GPU pair and the bridges whose ACS decides whether their peer traffic goes
    straight across: the switch ports below their common ancestor (PIX/PXB), or the two root ports
    (PHB, same host bridge). Across host bridges (NODE/SYS) no port's ACS decides the path."""
    level, _common, below = topology_level(a, b)
    if level in ("PIX", "PXB"):
        return level, below
    if level == "PHB":
        return level, [g["path"][0] for g in (a, b) if len(g["path"]) > 1]
    return level, []


def redirecting_bridges(model: dict, group: list[str]) -> dict[str, Any]:
    """From the audit model: the exact bridges whose ACS redirects peer traffic between the GPUs of ``group``.

    Returns ``{"bridges": {bdf: {ctrl, cap, on: [names], clear (mask), pairs: [[a, b]], vendor_id,
    device_id}}, "pairs": [{a, b, level, bridges, redirecting}]}``. A bridge with ACS but none of
    RR/CR/EC on is not listed; one without an ACS capability cannot redirect.
    """
    gpus = {g["bdf"]: g for g in model["gpus"]}
    devices = model["devices"]
    bridges: dict[str, dict[str, Any]] = {}
    pairs = []
    for x, y in combinations([b for b in group if b in gpus], 2):
        level, hops = pair_bridges(model, gpus[x], gpus[y])
        redirecting = []
        for hop in hops:
            acs = ((devices.get(hop) or {}).get("config") or {}).get("acs")
            if not acs:
                continue
            on = acs["ctrl_raw"] & MASK
            if not on:
                continue
            redirecting.append(hop)
            entry = bridges.setdefault(hop, {
                "ctrl": acs["ctrl_raw"], "on": bit_names(on), "clear": on, "pairs": [],
                "vendor_id": devices[hop].get("vendor_id"), "device_id": devices[hop].get("device_id")})
            entry["pairs"].append([x, y])
        pairs.append({"a": x, "b": y, "level": level, "bridges": hops, "redirecting": redirecting})
    return {"bridges": dict(sorted(bridges.items())), "pairs": pairs}


# ---- vfio hosts ---------------------------------------------------------------------------------
def vfio_reasons(fs: HostFS, cmdline: str | None) -> list[str]:
    """Why this host looks like it passes devices to VMs (empty when it does not)."""
    out = []
    for bdf in fs.listdir(PCI_DEVICES):
        driver = fs.readlink(f"{PCI_DEVICES}/{bdf}/driver")
        if driver and driver.rstrip("/").endswith("/vfio-pci"):
            out.append(f"{bdf} is bound to vfio-pci")
    out.extend(f"{path} exists (the vfio role binds devices at boot)" for path in VFIO_HINTS if fs.exists(path))
    out.extend(f"the kernel command line has {arg}" for arg in (cmdline or "").split() if arg.startswith("vfio-pci.ids="))
    return out


# ---- plans --------------------------------------------------------------------------------------
def plan_clear(bridges: dict[str, dict[str, Any]], current: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One write per bridge that still has RR/CR/EC on: ``{device, before, after, mask}``. Pure."""
    writes = []
    for bdf in sorted(bridges):
        now = current[bdf]
        on = now["ctrl"] & MASK
        if on:
            writes.append({"device": bdf, "before": now["ctrl"], "after": now["ctrl"] & ~on & 0xFFFF, "mask": on})
    return writes


def plan_restore(record: dict, current: dict[str, dict[str, Any]], only=None) -> dict[str, Any]:
    """Writes that put the recorded bridges' RR/CR/EC bits back. Pure.

    ``current``: read_acs() of the recorded bridges that are present. Returns ``{writes, restore, gone}``.
    """
    writes, restore, gone = [], [], []
    for bdf, rec in sorted(record["devices"].items()):
        if only and bdf not in only:
            continue
        now = current.get(bdf)
        if now is None:
            gone.append(bdf)
            continue
        if (now["vendor_id"], now["device_id"]) != (rec["vendor_id"], rec["device_id"]):
            raise AcsError(f"{bdf} is {now['vendor_id']}:{now['device_id']}, not the recorded {rec['vendor_id']}:{rec['device_id']}: "
                           "the card was replaced or the bus renumbered, so its recorded ACS Control does not apply. Remove its "
                           "entry from the record by hand after checking the hardware.")
        if not now["readable"] or now["offset"] is None:
            raise AcsError(f"Cannot restore ACS Control of {bdf}: {now['error'] or 'it has no ACS capability'}. Run as root.")
        restore.append(bdf)
        want = rec["ctrl"] & MASK
        if now["ctrl"] & MASK != want:
            writes.append({"device": bdf, "before": now["ctrl"], "after": (now["ctrl"] & ~MASK) | want, "mask": MASK})
    return {"writes": writes, "restore": restore, "gone": gone}


# ---- the record of originals --------------------------------------------------------------------
def empty_record() -> dict[str, Any]:
    return empty_originals(RECORD_FORMAT)


def parse_record(text: str | None, where: str) -> dict[str, Any]:
    """The record of original ACS Control values (device_apply.parse_originals: an absent file is no
    record; an empty, broken or foreign one is an error, never read as "no record")."""
    return parse_originals(text, where, RECORD_FORMAT, "pcie_acs", "ACS Control values", AcsError)


def merge_record(record: dict, writes: list[dict], current: dict[str, dict]) -> dict:
    """The record after ``writes``: the first value ever seen of each bridge is kept."""
    def first_seen(devices: dict, w: dict) -> None:
        now = current[w["device"]]
        devices.setdefault(w["device"], {"vendor_id": now["vendor_id"], "device_id": now["device_id"], "ctrl": w["before"]})
    return merge_originals(record, writes, first_seen)


def persist_entries(bridges: dict[str, dict], current: dict[str, dict]) -> list[dict]:
    """The ``acs`` list of the shared boot file: each managed bridge with the bits to clear."""
    return [{"bdf": b, "vendor_id": current[b]["vendor_id"], "device_id": current[b]["device_id"], "clear": bridges[b]["clear"]}
            for b in sorted(bridges)]


# ---- boot parameters -----------------------------------------------------------------------------
def kernel_version(text: str | None) -> tuple[int, int] | None:
    m = re.match(r"^(\d+)\.(\d+)", (text or "").strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def kernel_args(bdfs: list[str], release: str | None) -> dict[str, Any]:
    """The boot parameters that clear the redirect bits of ``bdfs`` while the kernel enumerates the bus.

    Returns ``{args, notes}``; ``args`` is empty when the running kernel is older than 4.19.
    """
    version = kernel_version(release)
    if not bdfs:
        return {"args": [], "notes": []}
    if version is None or version < DISABLE_ACS_REDIR_SINCE:
        return {"args": [], "notes": [f"kernel {release or 'unknown'} predates pci=disable_acs_redir= (Linux 4.19): only the "
                                      "runtime clear and the boot unit apply"]}
    args = ["pci=disable_acs_redir=" + ";".join(bdfs)]
    notes = []
    if version >= CONFIG_ACS_SINCE:
        args.append("pci=config_acs=" + ";".join(f"{CONFIG_ACS_FLAGS}@{b}" for b in bdfs))
    else:
        notes.append(f"kernel {release} predates pci=config_acs= (Linux 6.11): disable_acs_redir alone is used")
    return {"args": args, "notes": notes}


# ---- applying -----------------------------------------------------------------------------------
def apply_writes(fs: HostFS, writes: list[dict], run: Callable, setpci: str, keep_going: bool = False) -> dict[str, Any]:
    """Run ``writes`` with setpci, read each back (device_apply); on the first failure undo every write done (reverse).

    A write whose bits read back unchanged is ``readonly`` (QEMU's pcie-root-port keeps some ACS
    Control bits read-only), any other outcome ``error``. With ``keep_going`` (the boot unit) a
    failure undoes only its own bridge's write and the others go on. Returns ``{done, failures,
    rolled_back, rollback_failed, journal}``.
    """
    def write(w: dict, value: int) -> tuple[int, str, list[str]]:
        argv = setpci_argv(setpci, fs.root, w["device"], value, w["mask"])
        rc, _out, err = run(argv)
        return rc, err, argv

    def read(w: dict) -> tuple[int | None, str | None]:
        now = read_acs(fs, w["device"])
        return (now["ctrl"] if now["readable"] else None), now["error"]

    out = apply_steps(writes, write, read, lambda w, reads, value: reads & w["mask"] == value & w["mask"],
                      group=(lambda w: w["device"]) if keep_going else None,
                      on_failure=lambda attempt: SKIP_GROUP if keep_going else STOP)
    return {
        "done": [dict(a["step"], argv=a["argv"]) for a in out["done"]],
        "failures": [dict(a["step"], reads=a["reads"], kind=a["kind"], argv=a["argv"], rc=a["rc"], stderr=a["stderr"])
                     for a in out["failures"]],
        "rolled_back": [dict(a["step"], argv=a["argv"], rc=a["rc"], stderr=a["stderr"]) for a in out["rolled_back"]],
        "rollback_failed": [dict(a["step"], argv=a["argv"], rc=a["rc"], stderr=a["stderr"], reads=a["reads"])
                            for a in out["rollback_failed"]],
        "journal": out["journal"],
    }


def failure_message(f: dict, outcome: dict) -> str:
    cmd = " ".join(f["argv"])
    want = ", ".join(bit_names(f["mask"]))
    if f["kind"] == "readonly":
        msg = (f"{f['device']} did not take the ACS Control change ({want} off): '{cmd}' exited 0 but ACSCtl still reads "
               f"0x{f['reads']:04x}. The device or the hypervisor keeps these bits read-only (QEMU's pcie-root-port does "
               "for some); use the boot parameter instead (boot_args), or leave this bridge out.")
    else:
        reads = f"; ACSCtl reads 0x{f['reads']:04x}" if f["reads"] is not None else ""
        msg = (f"Clearing {want} in the ACS Control of {f['device']} failed: '{cmd}' exited {f['rc']}"
               f"{': ' + f['stderr'] if f['stderr'] else ''}{reads}. Run as root (become: true); kernel lockdown forbids "
               "config-space writes from user space.")
    if outcome["rolled_back"]:
        msg += " Rolled back: " + ", ".join(f"{r['device']} ACSCtl 0x{r['before']:04x}" for r in outcome["rolled_back"]) + "."
    if outcome["rollback_failed"]:
        msg += (" ROLLBACK FAILED, these keep the new value: " + ", ".join(
            f"{r['device']} reads {_hex(r['reads'])} (was 0x{r['before']:04x})" for r in outcome["rollback_failed"])
            + ". Reboot the host.")
    return msg


def _hex(value: int | None) -> str:
    return f"0x{value:04x}" if value is not None else "nothing (its config space cannot be read)"


def acsctl_of(config: bytes, offset: int) -> int:
    return struct.unpack_from("<H", config, offset + ACSCTL)[0]

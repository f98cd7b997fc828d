# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure decoder of PCI/PCIe configuration space bytes (the sysfs ``config`` file).

``decode_config`` does no I/O: callers pass the bytes they read (64, 256 or 4096 of them) and get
plain, JSON-ready dicts back. ``read_config`` is the one reader of a function's ``config`` file
(through a HostFS), with the read and decode errors turned into one message. Layouts follow the PCI Local Bus 3.0 and PCI Express Base 6.0
specifications: the standard capability list from the pointer at 0x34, the PCI Express
capability (ID 0x10), MSI (0x05) and MSI-X (0x11), and the extended capability list from
0x100 with AER (0x0001) and ACS (0x000D).
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFSError

# Config space sizes: 64 B is what non-root readers get from sysfs; 256 B is conventional PCI
# (or a kernel that cannot reach extended space); 4096 B is PCI Express.
CFG_HEADER = 64
CFG_CONVENTIONAL = 256
CFG_EXTENDED = 4096
PCI_DEVICES = "/sys/bus/pci/devices"

CAP_PM = 0x01
CAP_MSI = 0x05
CAP_VENDOR = 0x09
CAP_PCIE = 0x10
CAP_MSIX = 0x11

ECAP_AER = 0x0001
ECAP_ACS = 0x000D

CAP_NAMES = {
    0x00: "null", 0x01: "pm", 0x02: "agp", 0x03: "vpd", 0x04: "slot_id", 0x05: "msi", 0x07: "pcix",
    0x09: "vendor", 0x0A: "debug_port", 0x0D: "subsystem_vendor", 0x10: "pcie", 0x11: "msix",
    0x12: "sata", 0x13: "af", 0x14: "ea",
}
# 0x0000 is the Null capability: hypervisors use it to hide a capability while keeping the list linked.
ECAP_NAMES = {
    0x0000: "null", 0x0001: "aer", 0x0002: "vc", 0x0003: "dsn", 0x0004: "power_budget", 0x0007: "rcec",
    0x000B: "vendor", 0x000D: "acs", 0x000E: "ari", 0x000F: "ats", 0x0010: "sriov",
    0x0013: "pri", 0x0015: "resizable_bar", 0x0018: "ltr", 0x0019: "secondary_pcie",
    0x001B: "pasid", 0x001E: "l1ss", 0x001F: "ptm", 0x0023: "dvsec", 0x0025: "dlf",
    0x0026: "phy_16gt", 0x0027: "lane_margining", 0x002A: "phy_32gt", 0x0031: "phy_64gt",
    0x0032: "ide", 0x0034: "flit_logging",
}

# Link speed field value -> GT/s (LnkCap max speed, LnkSta current speed, LnkCtl2 target).
LINK_SPEEDS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0, 7: 128.0}

PORT_TYPES = {
    0x0: "endpoint", 0x1: "legacy_endpoint", 0x4: "root_port", 0x5: "upstream_port",
    0x6: "downstream_port", 0x7: "pcie_to_pci_bridge", 0x8: "pci_to_pcie_bridge",
    0x9: "rc_integrated_endpoint", 0xA: "rc_event_collector",
}
BRIDGE_PORT_TYPES = ("root_port", "upstream_port", "downstream_port", "pcie_to_pci_bridge", "pci_to_pcie_bridge")

ASPM_STATES = {0: "disabled", 1: "L0s", 2: "L1", 3: "L0s L1"}

# ACS capability and control share one bit layout.
ACS_BITS = (("SV", 0), ("TB", 1), ("RR", 2), ("CR", 3), ("UF", 4), ("EC", 5), ("DT", 6))

AER_UNCORRECTABLE = (
    ("DLP", 4), ("SDES", 5), ("PoisonedTLP", 12), ("FCP", 13), ("CmpltTO", 14),
    ("CmpltAbrt", 15), ("UnxCmplt", 16), ("RxOF", 17), ("MalfTLP", 18), ("ECRC", 19),
    ("UnsupReq", 20), ("ACSViol", 21), ("UncorrIntErr", 22), ("BlockedTLP", 23),
    ("AtomicOpBlocked", 24), ("TLPPrefixBlocked", 25), ("PoisonTLPBlocked", 26),
)
AER_CORRECTABLE = (
    ("RxErr", 0), ("BadTLP", 6), ("BadDLLP", 7), ("Rollover", 8), ("Timeout", 12),
    ("AdvNonFatalErr", 13), ("CorrIntErr", 14), ("HeaderOF", 15),
)

_MAX_CAPS = 48  # loop guard: a list longer than this is corrupt


class ConfigSpaceError(ValueError):
    """The bytes are not a usable config space (too short, or the device does not answer)."""


def _u8(data: bytes, off: int) -> int:
    return data[off]


def _u16(data: bytes, off: int) -> int:
    return struct.unpack_from("<H", data, off)[0]


def _u32(data: bytes, off: int) -> int:
    return struct.unpack_from("<I", data, off)[0]


def _has(data: bytes, off: int, width: int) -> bool:
    return off + width <= len(data)


def _bits(value: int, table: tuple) -> dict[str, bool]:
    return {name: bool(value >> bit & 1) for name, bit in table}


def _set_bits(value: int, table: tuple) -> list[str]:
    return [name for name, bit in table if value >> bit & 1]


def _first(items: list[tuple[int, int]]) -> dict[int, int]:
    """{id: offset of its first instance}."""
    out: dict[int, int] = {}
    for cid, off in items:
        out.setdefault(cid, off)
    return out


def link_generation(speed_gts: float | None) -> int | None:
    """PCIe generation for a per-lane rate in GT/s (2.5 -> 1 ... 64 -> 6)."""
    for gen, gts in LINK_SPEEDS.items():
        if speed_gts == gts:
            return gen
    return None


def link_bandwidth_gbps(speed_gts: float | None, width: int | None) -> float | None:
    """Theoretical one-direction data rate in GB/s (10^9 bytes) after line encoding.

    8b/10b for 2.5 and 5 GT/s, 128b/130b for 8 to 32 GT/s, 242/256 FLIT efficiency from 64 GT/s.
    Gen5 x16 gives 63.0 GB/s.
    """
    if not speed_gts or not width:
        return None
    if speed_gts <= 5.0:
        eff = 8.0 / 10.0
    elif speed_gts <= 32.0:
        eff = 128.0 / 130.0
    else:
        eff = 242.0 / 256.0
    return round(speed_gts * eff * width / 8.0, 2)


def _speed(code: int) -> dict[str, Any]:
    gts = LINK_SPEEDS.get(code)
    return {"speed_gts": gts, "gen": code if gts else None}


CAP_POINTER = {0: 0x34, 1: 0x34, 2: 0x14}  # header type -> capability pointer (CardBus bridges: 0x14)


def walk_capabilities(data: bytes) -> tuple[list[tuple[int, int]], bool]:
    """Standard capability list: [(cap_id, offset)] in list order, and whether it was cut short.

    The pointer sits at 0x34, or at 0x14 on a CardBus bridge (header type 2). An entry with ID 0xff
    ends the list (a function that reads all ones there is gone or broken; lspci: ``<chain broken>``).
    """
    caps: list[tuple[int, int]] = []
    pointer = CAP_POINTER.get(_u8(data, 0x0E) & 0x7F) if _has(data, 0x0E, 1) else None
    if pointer is None or not _has(data, pointer, 1) or not _u16(data, 0x06) & 0x10:  # Status: capabilities list
        return caps, False
    ptr = _u8(data, pointer) & 0xFC
    seen = set()
    while ptr and len(seen) < _MAX_CAPS:
        if ptr < 0x40 or ptr in seen:
            break
        if not _has(data, ptr, 2):
            return caps, True
        seen.add(ptr)
        if _u8(data, ptr) == 0xFF:
            break
        caps.append((_u8(data, ptr), ptr))
        ptr = _u8(data, ptr + 1) & 0xFC
    return caps, False


def walk_extended_capabilities(data: bytes) -> list[tuple[int, int]]:
    """Extended capability list from 0x100: [(ecap_id, offset)] in list order."""
    ecaps: list[tuple[int, int]] = []
    ptr = 0x100
    seen = set()
    while ptr and len(seen) < _MAX_CAPS and _has(data, ptr, 4):
        if ptr < 0x100 or ptr in seen:
            break
        seen.add(ptr)
        header = _u32(data, ptr)
        if header in (0, 0xFFFFFFFF):
            break
        ecaps.append((header & 0xFFFF, ptr))
        ptr = (header >> 20) & 0xFFC
    return ecaps


def decode_pcie(data: bytes, off: int) -> dict[str, Any]:
    """The PCI Express capability at ``off``: port type, MPS/MRRS, ASPM, link cap/control/status."""
    flags = _u16(data, off + 2)
    version = flags & 0xF
    port_type = PORT_TYPES.get(flags >> 4 & 0xF, "unknown")
    out: dict[str, Any] = {"offset": off, "version": version, "port_type": port_type,
                           "slot_implemented": bool(flags >> 8 & 1)}
    if not _has(data, off + 0x14, 0):
        out["truncated"] = True
        return out
    devcap = _u32(data, off + 0x04)
    devctl = _u16(data, off + 0x08)
    devsta = _u16(data, off + 0x0A)
    lnkcap = _u32(data, off + 0x0C)
    lnkctl = _u16(data, off + 0x10)
    lnksta = _u16(data, off + 0x12)
    out.update({
        "mps_supported": 128 << (devcap & 0x7),
        "mps": 128 << (devctl >> 5 & 0x7),
        "mrrs": 128 << (devctl >> 12 & 0x7),
        "relaxed_ordering": bool(devctl >> 4 & 1),
        "no_snoop": bool(devctl >> 11 & 1),
        "extended_tag": bool(devctl >> 8 & 1),
        "flr_capable": bool(devcap >> 28 & 1),
        "device_status": {"correctable": bool(devsta & 1), "nonfatal": bool(devsta >> 1 & 1),
                          "fatal": bool(devsta >> 2 & 1), "unsupported_request": bool(devsta >> 3 & 1),
                          "transactions_pending": bool(devsta >> 5 & 1)},
        "link_cap": dict(_speed(lnkcap & 0xF), width=lnkcap >> 4 & 0x3F,
                         aspm_support=ASPM_STATES[lnkcap >> 10 & 0x3], port_number=lnkcap >> 24 & 0xFF),
        "link_ctl": {"aspm": ASPM_STATES[lnkctl & 0x3], "common_clock": bool(lnkctl >> 6 & 1),
                     "link_disabled": bool(lnkctl >> 4 & 1)},
        "link_sta": dict(_speed(lnksta & 0xF), width=lnksta >> 4 & 0x3F,
                         training=bool(lnksta >> 11 & 1), dll_active=bool(lnksta >> 13 & 1)),
        "link_speeds_supported": [],
    })
    # Link Capabilities 2 (cap version 2): the supported speeds vector, bits 7:1 = 2.5 .. 128 GT/s.
    if version >= 2 and _has(data, off + 0x2C, 4):
        vector = _u32(data, off + 0x2C) >> 1 & 0x7F
        out["link_speeds_supported"] = [LINK_SPEEDS[i + 1] for i in range(7) if vector >> i & 1]
    if not out["link_speeds_supported"] and out["link_cap"]["speed_gts"]:
        out["link_speeds_supported"] = [s for g, s in LINK_SPEEDS.items() if g <= out["link_cap"]["gen"]]
    if version >= 2 and _has(data, off + 0x30, 2):
        code = _u16(data, off + 0x30) & 0xF
        # PCIe Base 6.0 7.5.3.19: a function that supports only 2.5 GT/s may hardwire Target Link Speed to 0
        # (lspci reads it as 2.5GT/s too).
        out["link_ctl2"] = {"target": _speed(1) if code == 0 else _speed(code), "target_hardwired": code == 0}
    return out


def decode_msix(data: bytes, off: int) -> dict[str, Any]:
    ctl = _u16(data, off + 2)
    return {"offset": off, "table_size": (ctl & 0x7FF) + 1, "enabled": bool(ctl >> 15 & 1),
            "function_masked": bool(ctl >> 14 & 1)}


def decode_msi(data: bytes, off: int) -> dict[str, Any]:
    ctl = _u16(data, off + 2)
    return {"offset": off, "enabled": bool(ctl & 1), "vectors_capable": 1 << (ctl >> 1 & 0x7),
            "vectors_enabled": 1 << (ctl >> 4 & 0x7), "address_64bit": bool(ctl >> 7 & 1)}


def decode_acs(data: bytes, off: int) -> dict[str, Any]:
    """ACS: which P2P controls exist and which are on. RR/CR on a downstream port send peer
    requests/completions up to the root complex instead of straight across the switch."""
    cap = _u16(data, off + 4)
    ctl = _u16(data, off + 6)
    return {"offset": off, "cap": _bits(cap, ACS_BITS), "ctrl": _bits(ctl, ACS_BITS),
            "egress_vector_size": cap >> 8 & 0xFF, "ctrl_raw": ctl,
            "p2p_redirect": bool(ctl & 0x0C)}


def decode_aer(data: bytes, off: int) -> dict[str, Any]:
    uncor = _u32(data, off + 0x04)
    cor = _u32(data, off + 0x10)
    return {"offset": off,
            "uncorrectable_status": uncor, "uncorrectable_mask": _u32(data, off + 0x08),
            "uncorrectable_severity": _u32(data, off + 0x0C),
            "correctable_status": cor, "correctable_mask": _u32(data, off + 0x14),
            "uncorrectable": _set_bits(uncor, AER_UNCORRECTABLE),
            "correctable": _set_bits(cor, AER_CORRECTABLE)}


def decode_config(data: bytes) -> dict[str, Any]:
    """Decode config space bytes into a dict.

    Raises ConfigSpaceError when fewer than 64 bytes are given or the device reads as absent
    (vendor 0xffff/0x0000). A read shorter than the layout needs is reported, never fatal:
    ``capabilities_complete`` is false when the capability list runs past the bytes given, and
    ``extended_readable`` is false when a PCIe function's extended space (0x100+) is missing.
    """
    if len(data) < CFG_HEADER:
        raise ConfigSpaceError(f"config space is {len(data)} bytes; the header alone needs {CFG_HEADER}")
    vendor, device = _u16(data, 0x00), _u16(data, 0x02)
    if vendor in (0xFFFF, 0x0000):
        raise ConfigSpaceError(f"vendor ID reads 0x{vendor:04x}: the function does not answer (powered off, or removed)")
    header_byte = _u8(data, 0x0E)
    header_type = header_byte & 0x7F
    class_code = _u32(data, 0x08) >> 8
    out: dict[str, Any] = {
        "size": len(data),
        "vendor_id": f"0x{vendor:04x}",
        "device_id": f"0x{device:04x}",
        "revision": f"0x{_u8(data, 0x08):02x}",
        "class": f"0x{class_code:06x}",
        "header_type": header_type,
        "multifunction": bool(header_byte & 0x80),
        "is_bridge": header_type == 1,
        "command": {"memory": bool(_u16(data, 0x04) >> 1 & 1), "bus_master": bool(_u16(data, 0x04) >> 2 & 1)},
        "capabilities": [],
        "capabilities_complete": True,
        "pcie": None,
        "msi": None,
        "msix": None,
        "extended_capabilities": [],
        "extended_readable": None,
        "acs": None,
        "aer": None,
    }
    if header_type in (1, 2):  # PCI-to-PCI and CardBus bridges keep the bus numbers at the same offsets
        out["bus"] = {"primary": _u8(data, 0x18), "secondary": _u8(data, 0x19), "subordinate": _u8(data, 0x1A)}
    elif header_type == 0:
        out["subsystem_vendor_id"] = f"0x{_u16(data, 0x2C):04x}"
        out["subsystem_id"] = f"0x{_u16(data, 0x2E):04x}"

    cap_list, cut = walk_capabilities(data)
    if len(data) <= CFG_HEADER and _u16(data, 0x06) & 0x10:
        cut = True  # the list starts at 0x40 or later: nothing of it was given
    out["capabilities"] = [{"id": CAP_NAMES.get(cid, f"0x{cid:02x}"), "offset": off} for cid, off in cap_list]
    caps = _first(cap_list)
    out["capabilities_complete"] = not cut
    if CAP_PCIE in caps:
        out["pcie"] = decode_pcie(data, caps[CAP_PCIE])
    if CAP_MSIX in caps and _has(data, caps[CAP_MSIX], 4):
        out["msix"] = decode_msix(data, caps[CAP_MSIX])
    if CAP_MSI in caps and _has(data, caps[CAP_MSI], 4):
        out["msi"] = decode_msi(data, caps[CAP_MSI])

    # Extended space exists on PCIe functions only; a 256-byte read of one hides it. A conventional
    # PCI function's bytes past 0x100 are whatever the platform returns (junk, or a copy of the
    # first 256), never a capability list: lspci does not walk them either.
    if out["pcie"] is not None:
        out["extended_readable"] = len(data) > CFG_CONVENTIONAL
    if len(data) > CFG_CONVENTIONAL and out["pcie"] is not None:
        ecap_list = walk_extended_capabilities(data)
        out["extended_capabilities"] = [{"id": ECAP_NAMES.get(eid, f"0x{eid:04x}"), "offset": off} for eid, off in ecap_list]
        ecaps = _first(ecap_list)
        if ECAP_ACS in ecaps and _has(data, ecaps[ECAP_ACS], 8):
            out["acs"] = decode_acs(data, ecaps[ECAP_ACS])
        if ECAP_AER in ecaps and _has(data, ecaps[ECAP_AER], 0x18):
            out["aer"] = decode_aer(data, ecaps[ECAP_AER])
    return out


class ConfigRead(NamedTuple):
    """One read of a function's config file: its host path, the bytes read (None when the read
    failed), the decoded config (None when it could not be decoded) and the error message."""

    path: str
    data: bytes | None
    config: dict[str, Any] | None
    error: str | None


def read_config(fs, bdf: str) -> ConfigRead:
    """Read and decode ``/sys/bus/pci/devices/BDF/config`` through ``fs`` (a HostFS).

    A failed read (``cannot read PATH: why``) or an undecodable one (``PATH: why``) is returned as
    ``error``, never raised: callers report it per device and go on with the others."""
    path = f"{PCI_DEVICES}/{bdf}/config"
    try:
        data = fs.read_bytes(path, CFG_EXTENDED)
    except HostFSError as err:
        return ConfigRead(path, None, None, f"cannot read {path}: {err.strerror}")
    try:
        return ConfigRead(path, data, decode_config(data), None)
    except ConfigSpaceError as err:
        return ConfigRead(path, data, None, f"{path}: {err}")

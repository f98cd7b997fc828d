# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The boot-time applier of the PCIe settings that pcie_payload and pcie_acs persist in
``/etc/gpufleet/pcie_payload.json``: what ``gpufleet-pcie-payload.service`` runs once per boot, before
udev coldplug loads the GPU drivers.

It runs as ``/usr/local/libexec/gpufleet-pcie-payload-apply``, which the modules write with this file
and its import closure in it (_host/bundle.py), so the boot reads config space with _pci/config.py's
capability walk and applies, reads back and rolls back with device_apply, exactly as the modules do:

- payload entries (``devices``), hierarchy by hierarchy: every entry of a hierarchy is checked first
  (the recorded vendor/device ID, a readable PCI Express capability, a valid size, MaxPayload within
  DevCap); a hierarchy with a bad entry is left as it is. The others are written top-down with
  setpci, each write read back; when one does not take, the writes of its hierarchy are undone
  (newest first) and the other hierarchies go on, so a partial apply never leaves mixed MaxPayload;
- ACS entries (``acs``): the recorded ACS Control bits cleared on each bridge, read back.

One log line per change, per value already set and per failure (the unit's journal); exit status 0,
1 when anything failed, 2 when the file or the sysfs tree cannot be used.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess

from ansible_collections.gpufleet.inference.plugins.module_utils._host import bundle as reapply_bundle
from ansible_collections.gpufleet.inference.plugins.module_utils._host.bundle import log
from ansible_collections.gpufleet.inference.plugins.module_utils._host.commands import C_LOCALE
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.config import PCI_DEVICES
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.acs import apply_writes as apply_acs_writes
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.acs import read_acs
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.boot import PERSIST_FORMAT, UNIT_NAME, load_persist
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.payload import (
    REGISTER_ORDER, REGISTERS, SIZES, apply_writes, read_payload,
)

ENTRY = "pcie.reapply"  # this file, under plugins/module_utils
PROG = "gpufleet-pcie-payload-apply"
HEADER = (
    "Installed by Ansible (gpufleet.inference.pcie_payload, pcie_acs). Run at boot by " + UNIT_NAME + ":",
    "  " + PROG + " [--root DIR] [--setpci PATH] CONFIG.json",
    "Re-applies PCIe MaxPayload/MaxReadReq with setpci, reads every write back, and undoes the writes of",
    "a PCIe hierarchy when one of them does not take; clears the recorded ACS Control bits (read back).",
    "setpci runs with -A linux-sysfs only. Exit status 1 when anything failed, 2 for an unusable file.",
)
REINSTALL = "Run gpufleet.inference.pcie_payload (or pcie_acs) again to rewrite this script."
PYTHON_HINT = ("The modules write the interpreter they run under: run them again with ansible_python_interpreter set "
               "to a Python 3.7 or later.")


# The applier as the modules install it: ``#!python``, this module_utils and its closure (_host/bundle.py).
render_script = reapply_bundle.entry_renderer(ENTRY, HEADER, REINSTALL, PYTHON_HINT)


def run_command(argv: list[str]) -> tuple[int, str, str]:
    """One command in the C locale (there is no AnsibleModule at boot, so no HostCmd)."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                              env=dict(os.environ, **C_LOCALE), check=False)
    except OSError as err:
        return 127, "", f"cannot run {argv[0]}: {err.strerror or err}"
    return proc.returncode, proc.stdout, proc.stderr


def identity_problem(fs: HostFS, entry: dict) -> str | None:
    """Why the function at the entry's address is not the one recorded (None when it is)."""
    base = f"{PCI_DEVICES}/{entry.get('bdf')}"
    ids = tuple((fs.read_optional(f"{base}/{attr}") or "").strip() or None for attr in ("vendor", "device"))
    if None in ids:
        return f"cannot be read: {fs.path(base)} has no vendor/device files (the function is gone?)"
    if ids != (entry.get("vendor_id"), entry.get("device_id")):
        return (f"is {ids[0]}:{ids[1]}, not the recorded {entry.get('vendor_id')}:{entry.get('device_id')} "
                "(card replaced?)")
    return None


def payload_writes(fs: HostFS, entry: dict) -> tuple[list[dict], str | None]:
    """The register writes one payload entry needs now, or why it cannot be applied. Logs the values already set."""
    bdf = entry.get("bdf")
    problem = identity_problem(fs, entry)
    if problem:
        return [], problem
    now = read_payload(fs, bdf)
    if not now["readable"] or now["pcie_offset"] is None:
        return [], f"cannot be read: {now['error'] or 'no PCI Express capability in its config space'}"
    writes, already = [], []
    for register in REGISTER_ORDER:
        want = entry.get(register)
        label = REGISTERS[register]["name"]
        if want is None:
            continue
        if want not in SIZES:
            return [], f"{label} {want!r} is not a PCIe payload size"
        if register == "mps" and want > now["mps_supported"]:
            return [], f"{label} {want} is above what it supports ({now['mps_supported']})"
        if now[register] == want:
            already.append(f"{bdf}: {label} {want} already set")
        else:
            writes.append({"device": bdf, "register": register, "before": now[register], "after": want,
                           "hierarchy": entry.get("hierarchy")})
    for line in already:
        log(line)
    return writes, None


def _write_problem(attempt: dict, what: str) -> str:
    if attempt["rc"] != 0:
        return f"setpci exited {attempt['rc']}: {attempt['stderr']}"
    if attempt["reads"] is None:
        return f"the device cannot be read after setpci ({attempt['error']})"
    return f"the device still reads {what} after setpci ({attempt['stderr'] or 'read-only field?'})"


def apply_payload(fs: HostFS, entries: list[dict], setpci: str) -> int:
    """Apply the payload entries hierarchy by hierarchy; the number of failures (one per hierarchy at most)."""
    failed = 0
    planned: list[tuple[dict, list[dict]]] = []  # (entry, its writes), in the file's order (top-down)
    broken: dict[str, str] = {}  # hierarchy -> the entry that cannot be applied
    for entry in entries:
        hierarchy = entry.get("hierarchy")
        if hierarchy in broken:
            continue
        writes, problem = payload_writes(fs, entry)
        if problem:
            failed += 1
            broken[hierarchy] = entry.get("bdf")
            log(f"error: {entry.get('bdf')} {problem}")
            continue
        planned.append((entry, writes))
    for entry in entries:
        hierarchy = entry.get("hierarchy")
        if hierarchy in broken and entry.get("bdf") != broken[hierarchy]:
            log(f"{entry.get('bdf')}: skipped, {broken[hierarchy]} below {hierarchy} cannot be applied")
    writes = [w for entry, mine in planned if entry.get("hierarchy") not in broken for w in mine]
    outcome = apply_writes(fs, writes, run_command, setpci, keep_going=True)
    tried, failed_hierarchies = set(), set()
    for attempt in outcome["journal"]:
        w, cmd = attempt["step"], " ".join(attempt["argv"])
        label = REGISTERS[w["register"]]["name"]
        tried.add(w["device"])
        if attempt["phase"] == "rollback":
            log(f"{w['device']}: {label} rolled back to {w['before']}"
                + ("" if attempt["ok"] else f": FAILED, {_write_problem(attempt, attempt['reads'])}"))
        elif attempt["ok"]:
            log(f"{w['device']}: {label} {w['before']} -> {w['after']} [{cmd}]")
        else:
            failed += 1
            failed_hierarchies.add(w["hierarchy"])
            log(f"error: {w['device']} {label} {w['after']}: {_write_problem(attempt, attempt['reads'])} [{cmd}]")
    never = dict.fromkeys((w["device"], w["hierarchy"]) for w in writes
                          if w["hierarchy"] in failed_hierarchies and w["device"] not in tried)
    for bdf, hierarchy in never:
        log(f"{bdf}: skipped, an earlier write below {hierarchy} failed")
    return failed


def acs_writes(fs: HostFS, entry: dict) -> tuple[list[dict], str | None]:
    """The ACS Control write one entry needs now, or why it cannot be applied. Logs bits already clear."""
    bdf, clear = entry.get("bdf"), entry.get("clear")
    problem = identity_problem(fs, entry)
    if problem:
        return [], problem
    if not (isinstance(clear, int) and 0 < clear <= 0x7F):
        return [], f"clear mask {clear!r} is not an ACS Control bit mask"
    now = read_acs(fs, bdf)
    if not now["readable"] or now["offset"] is None:
        return [], f"cannot be read: {now['error'] or 'no ACS capability in its config space'}"
    if not now["ctrl"] & clear:
        log(f"{bdf}: ACS Control 0x{now['ctrl']:04x}, bits 0x{clear:04x} already clear")
        return [], None
    return [{"device": bdf, "before": now["ctrl"], "after": now["ctrl"] & ~clear & 0xFFFF, "mask": clear}], None


def apply_acs(fs: HostFS, entries: list[dict], setpci: str) -> int:
    """Clear the recorded ACS Control bits of every bridge; the number of bridges that failed."""
    failed = 0
    writes = []
    for entry in entries:
        mine, problem = acs_writes(fs, entry)
        if problem:
            failed += 1
            log(f"error: {entry.get('bdf')} ACS {problem}")
        writes += mine
    outcome = apply_acs_writes(fs, writes, run_command, setpci, keep_going=True)
    for attempt in outcome["journal"]:
        w, cmd = attempt["step"], " ".join(attempt["argv"])
        if attempt["phase"] == "rollback":
            log(f"{w['device']}: ACS Control rolled back to 0x{w['before']:04x}" + ("" if attempt["ok"] else ": FAILED"))
        elif attempt["ok"]:
            log(f"{w['device']}: ACS Control 0x{w['before']:04x} -> 0x{attempt['reads']:04x} [{cmd}]")
        else:
            failed += 1
            if attempt["rc"] != 0:
                why = f"setpci exited {attempt['rc']}: {attempt['stderr']}"
            elif attempt["reads"] is None:
                why = f"cannot be read after setpci: {attempt['error']}"
            else:
                why = f"ACS Control still reads 0x{attempt['reads']:04x} after setpci (read-only bits?)"
            log(f"error: {w['device']} ACS {why} [{cmd}]")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="Re-apply PCIe settings recorded by gpufleet.inference.")
    parser.add_argument("--root", default="/", help="directory standing for / (tests); default /")
    parser.add_argument("--setpci", default=None, help="setpci binary; default: from PATH")
    parser.add_argument("config")
    args = parser.parse_args(argv)
    fs = HostFS(os.path.abspath(args.root))
    setpci = args.setpci or shutil.which("setpci") or "/usr/bin/setpci"
    try:
        text = HostFS("/").read_exact(os.path.abspath(args.config))
    except HostFSError as err:
        log(f"error: {err}")
        return 2
    if text is None:
        log(f"error: cannot read {args.config}: no such file")
        return 2
    data = load_persist(text)
    if data is None:
        log(f"error: {args.config} is not a {PERSIST_FORMAT} file")
        return 2
    if not fs.isdir(PCI_DEVICES):
        log(f"error: {fs.path(PCI_DEVICES)} does not exist: no PCI sysfs tree to apply to")
        return 2
    devices = [e for e in data.get("devices", []) if isinstance(e, dict)]
    acs = [e for e in data.get("acs", []) if isinstance(e, dict)]
    failed = apply_payload(fs, devices, setpci)
    acs_failed = apply_acs(fs, acs, setpci)
    if acs:
        log(f"{PROG}: ACS on {len(acs)} bridge(s), {acs_failed} failed")
    failed += acs_failed
    log(f"{PROG}: {len(devices)} device(s), {failed} failed")
    return 1 if failed else 0

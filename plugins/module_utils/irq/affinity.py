# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pinning a PCI function's MSI/MSI-X vectors to CPUs of its NUMA node, and keeping them there.

Shared by the irq_affinity module and by the re-apply script the irq_affinity role installs on the
host (``gpufleet-irq-affinity-apply``, irq/reapply.py), which carries this file and the module_utils it
imports (_host/bundle.py; all stdlib only) so the boot-time and rebind-time pinning is the same code
as the module's. IRQ numbers change whenever a driver re-requests its vectors, so
nothing here is keyed by IRQ number: the persistent configuration names PCI functions, and the
spread is recomputed from the function's current ``msi_irqs``.

irqbalance is kept, not stopped: a ``--policyscript`` bans the IRQs of the pinned functions by their
sysfs path (stable across rebinds), or the CPUs used are listed in ``IRQBALANCE_BANNED_CPULIST``.
"""

from __future__ import annotations

import errno
import json
import shlex
import time
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.device_apply import IGNORE, STOP, apply_steps
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import (
    PCI_DEVICES, PciWalker, format_cpulist, parse_cpulist,
)

CPU_ONLINE = "/sys/devices/system/cpu/online"
CPU_ISOLATED = "/sys/devices/system/cpu/isolated"
CPU_NOHZ_FULL = "/sys/devices/system/cpu/nohz_full"
DEFAULT_AFFINITY = "/proc/irq/default_smp_affinity"
CONFIG_FILE = "/etc/gpufleet/irq_affinity.json"
PINNED_FILE = "/etc/gpufleet/irq_affinity.pinned"
POLICY_SCRIPT = "/usr/local/libexec/gpufleet-irqbalance-policy"
MANAGED_CACHE = "/run/gpufleet/irq_affinity-managed.json"
IRQBALANCE_BINARIES = ("/usr/sbin/irqbalance", "/usr/bin/irqbalance", "/sbin/irqbalance")
IRQBALANCE_CONFIGS = ("/etc/default/irqbalance", "/etc/sysconfig/irqbalance")
MARKER = "# gpufleet.inference irq_affinity manages the next line: the CPUs its pinned IRQs use."
HEADER = "# Managed by gpufleet.inference irq_affinity: do not edit, run the irq_affinity role (or module) instead.\n"
DEFAULTS = {"cpus": "", "housekeeping_cpus": "", "policy": "spread", "numa_node": None, "allow_remote": False}

POLICY_SCRIPT_TEXT = """#!/bin/sh
# Managed by gpufleet.inference irq_affinity.
# irqbalance --policyscript: irqbalance runs this once per IRQ with the device's sysfs path ($1) and
# the IRQ number ($2). It bans the IRQs of the PCI functions listed in {pinned}, so that
# irqbalance leaves their pinning alone. IRQ numbers change on every driver rebind; the device path does not.
pinned={pinned}
bdf=${{1##*/}}
if [ -r "$pinned" ]; then
    while read -r dev _cpus; do
        if [ "$dev" = "$bdf" ]; then
            echo ban=true
            exit 0
        fi
    done < "$pinned"
fi
exit 0
"""


class IrqError(Exception):
    """The request cannot be done; the message says what, where, why and what to do."""


# ---- pure helpers ----------------------------------------------------------------------------
def parse_cpumask(text: str | None) -> list[int]:
    """``/proc/irq/*/smp_affinity`` style hex mask (``ff,ffffffff``) -> [CPUs]."""
    value = int((text or "0").replace(",", "").strip() or "0", 16)
    return [bit for bit in range(value.bit_length()) if value >> bit & 1]


def spread(irqs: list[int], cpus: list[int], policy: str = "spread", offset: int = 0) -> dict[int, list[int]]:
    """One vector per CPU, round robin from ``offset`` (``spread``), or every vector on every CPU (``node``)."""
    if not cpus:
        return {}
    if policy == "node":
        return {irq: list(cpus) for irq in irqs}
    return {irq: [cpus[(offset + i) % len(cpus)]] for i, irq in enumerate(sorted(irqs))}


def offsets(candidates: dict[str, list[int]]) -> dict[str, int]:
    """Where each function's round robin starts, so functions sharing CPUs do not all start on the first one.

    Functions with the same candidate CPUs are ordered by address; the k-th of m starts at k*len(cpus)//m.
    Depends only on the set of functions, not on their vector counts, so a rebind leaves the others' pins valid.
    """
    groups: dict[tuple, list[str]] = {}
    for bdf, cpus in candidates.items():
        groups.setdefault(tuple(cpus), []).append(bdf)
    out = {}
    for cpus, bdfs in groups.items():
        for k, bdf in enumerate(sorted(bdfs)):
            out[bdf] = k * len(cpus) // len(bdfs)
    return out


def strict_cpulist(text: str) -> list[int]:
    """A CPU list written by a user: ``0-7,16-23``; a reversed range (``7-0``) or junk raises ValueError
    with the reason (parse_cpulist, for kernel files, would read ``7-0`` as no CPU at all)."""
    cpus: list[int] = []
    for part in str(text).strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"'{part}' is not a CPU number or range")
        if sep and int(hi) < int(lo):
            raise ValueError(f"'{part}' is a reversed range (write {hi}-{lo})")
        cpus.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return sorted(set(cpus))


def parse_isolcpus(cmdline: str | None) -> dict[str, list[int]]:
    """CPUs taken from the scheduler or the tick on the kernel command line: ``isolcpus=[flags,]LIST``, ``nohz_full=LIST``."""
    out: dict[str, list[int]] = {}
    for arg in (cmdline or "").split():
        key, _sep, value = arg.partition("=")
        if key == "isolcpus":
            parts = value.split(",")
            while parts and parts[0] and not parts[0][0].isdigit():  # flags: nohz, domain, managed_irq
                parts.pop(0)
            value = ",".join(parts)
        elif key != "nohz_full":
            continue
        try:
            cpus = strict_cpulist(value)
        except ValueError:
            continue
        if cpus:
            out[f"{key}= on the kernel command line"] = sorted(set(out.get(f"{key}= on the kernel command line", [])) | set(cpus))
    return out


def isolated_cpus(fs: HostFS) -> dict[str, list[int]]:
    """{where it is said: CPUs} for every CPU kept free of device interrupts: /sys/devices/system/cpu/isolated,
    .../nohz_full ("(null)" when none) and isolcpus=/nohz_full= on /proc/cmdline."""
    out: dict[str, list[int]] = {}
    for path in (CPU_ISOLATED, CPU_NOHZ_FULL):
        text = (fs.read_optional(path) or "").strip()
        if text and text != "(null)":
            cpus = parse_cpulist(text)
            if cpus:
                out[path] = cpus
    out.update(parse_isolcpus(fs.read_optional("/proc/cmdline")))
    return out


def parse_cpu_option(text: str | None, online: list[int], name: str) -> list[int] | None:
    """A user CPU list, checked against the machine; None when empty."""
    if text is None or not str(text).strip():
        return None
    try:
        cpus = strict_cpulist(str(text))
    except ValueError as err:
        raise IrqError(f"{name}: '{text}' is not a CPU list ({err}); write it like 0-7,16-23 (the format of "
                       "/sys/devices/system/cpu/online).") from None
    outside = sorted(set(cpus) - set(online))
    if outside:
        raise IrqError(f"{name}: '{text}' names CPUs {format_cpulist(outside)} that are not online on this host "
                       f"(online CPUs: {format_cpulist(online)}). Use CPUs from /sys/devices/system/cpu/online.")
    return cpus


def normalize_settings(settings: dict[str, Any] | None) -> dict[str, Any]:
    out = dict(DEFAULTS)
    out.update({k: v for k, v in (settings or {}).items() if k in DEFAULTS})
    out["cpus"] = out["cpus"] or ""
    out["housekeeping_cpus"] = out["housekeeping_cpus"] or ""
    return out


# ---- reading the host ------------------------------------------------------------------------
def online_cpus(walker: PciWalker) -> list[int]:
    cpus = parse_cpulist(walker.fs.read_optional(CPU_ONLINE))
    if not cpus:
        for node in walker.numa_nodes().values():
            cpus.extend(parse_cpulist(node["cpulist"]))
    return sorted(set(cpus))


def node_cpus(walker: PciWalker) -> dict[int, list[int]]:
    return {n: parse_cpulist(info["cpulist"]) for n, info in walker.numa_nodes().items()}


def device_irqs(walker: PciWalker, bdf: str) -> list[dict[str, Any]]:
    """MSI/MSI-X vectors of a function with their current affinity (PciWalker.irqs)."""
    return walker.irqs(walker.sysfs_path(bdf))


def device_numa(walker: PciWalker, bdf: str) -> tuple[int | None, list[int]]:
    """(NUMA node or None when the firmware says -1, the kernel's local_cpulist)."""
    base = f"{PCI_DEVICES}/{bdf}"
    raw = walker.fs.read_optional(base + "/numa_node")
    node = int(raw) if raw and raw.lstrip("-").isdigit() and int(raw) >= 0 else None
    return node, parse_cpulist(walker.fs.read_optional(base + "/local_cpulist"))


def wait_for_irqs(walker: PciWalker, bdf: str, timeout: float, settle: float = 1.0, clock=time.monotonic,
                  sleep=time.sleep) -> list[int]:
    """The function's IRQ numbers once the set has stopped changing for ``settle`` seconds.

    Drivers allocate vectors after the bind event (NVMe in its reset work, the NVIDIA driver when the
    device is first opened), so the re-apply script waits for a stable set instead of reading once.
    Returns whatever is there at the deadline.
    """
    deadline = clock() + timeout
    last: list[int] | None = None
    since = clock()
    while True:
        names = walker.fs.listdir(f"{PCI_DEVICES}/{bdf}/msi_irqs")
        irqs = sorted(int(n) for n in names if n.isdigit())
        now = clock()
        if irqs != last:
            last, since = irqs, now
        elif irqs and now - since >= settle:
            return irqs
        if now >= deadline:
            return irqs
        sleep(min(0.2, max(0.0, deadline - now)))


# ---- planning ------------------------------------------------------------------------------------
def resolve_cpus(walker: PciWalker, devices: dict[str, dict[str, Any]], online: list[int] | None = None,
                 strict: set | None = None) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The candidate CPUs of every function: its node's CPUs, within the allow-list, minus housekeeping.

    ``strict`` names the functions whose settings errors raise IrqError; others (configured earlier,
    for hardware that may be gone) are skipped with a warning. Returns ({bdf: info}, warnings).
    """
    online = online if online is not None else online_cpus(walker)
    nodes = node_cpus(walker)
    isolated = isolated_cpus(walker.fs)
    strict = set(devices) if strict is None else strict
    present = set(walker.functions())
    out: dict[str, dict[str, Any]] = {}
    warnings: list[str] = []
    for bdf in sorted(devices):
        settings = normalize_settings(devices[bdf])
        try:
            if bdf not in present:
                raise IrqError(f"PCI function {bdf} is not on this host; check the address with 'lspci -D'.")
            out[bdf] = _resolve_one(walker, bdf, settings, online, nodes, isolated)
            warnings.extend(out[bdf].pop("warnings"))
        except IrqError as err:
            if bdf in strict:
                raise
            warnings.append(f"{bdf} (configured earlier) skipped: {err}")
    return out, warnings


def _resolve_one(walker: PciWalker, bdf: str, settings: dict[str, Any], online: list[int], nodes: dict[int, list[int]],
                 isolated: dict[str, list[int]] | None = None) -> dict:
    isolated = isolated or {}
    kept_free = set().union(*isolated.values()) if isolated else set()
    allow = parse_cpu_option(settings["cpus"], online, "cpus")
    housekeeping = parse_cpu_option(settings["housekeeping_cpus"], online, "housekeeping_cpus") or []
    if allow is not None and kept_free & set(allow):
        where = "; ".join(f"{format_cpulist(set(c) & set(allow))} in {src}" for src, c in sorted(isolated.items()) if set(c) & set(allow))
        raise IrqError(f"cpus: {format_cpulist(allow)} includes isolated CPUs ({where}): device interrupts are never pinned "
                       "there, the isolation exists to keep them away. Take those CPUs out of cpus.")
    node, local = device_numa(walker, bdf)
    warnings: list[str] = []
    if settings["numa_node"] is not None:
        if int(settings["numa_node"]) not in nodes:
            raise IrqError(f"numa_node: {settings['numa_node']} is not a NUMA node of this host (nodes: "
                           f"{', '.join(str(n) for n in sorted(nodes)) or 'none'}).")
        node = int(settings["numa_node"])
    elif node is None and len(nodes) == 1:
        node = next(iter(nodes))
    if node is not None and node in nodes and not nodes[node]:
        with_cpus = [n for n in sorted(nodes) if nodes[n]]
        raise IrqError(f"NUMA node {node} of {bdf} is a memory-only node (no CPUs: CXL or HBM memory, or all its CPUs "
                       f"offline), so no CPU of its node can serve its interrupts. Set numa_node to the node of the socket "
                       f"the device hangs off (nodes with CPUs: {', '.join(str(n) for n in with_cpus) or 'none'}), or cpus.")
    if node is not None and node in nodes:
        local_cpus = [c for c in nodes[node] if c in online]
    else:
        local_cpus = [c for c in (local or online) if c in online]
        if len(nodes) > 1:
            warnings.append(f"{bdf} reports NUMA node -1 (the firmware does not say where it sits): its vectors are spread "
                            f"over CPUs {format_cpulist(local_cpus)}. Set numa_node for it if you know the node.")
    if kept_free & set(local_cpus):
        warnings.append(f"{bdf}: isolated CPUs {format_cpulist(kept_free & set(local_cpus))} of its node are left out "
                        f"({'; '.join(sorted(isolated))}).")
        local_cpus = [c for c in local_cpus if c not in kept_free]
    cpus = [c for c in local_cpus if allow is None or c in allow]
    remote = False
    if not cpus and allow is not None:
        if not settings["allow_remote"]:
            raise IrqError(
                f"cpus: {format_cpulist(allow)} has no CPU on NUMA node {node} of {bdf} (its CPUs: {format_cpulist(local_cpus)}). "
                f"Add CPUs of node {node} to cpus, or set allow_remote: true to serve its interrupts from another node.")
        cpus, remote = [c for c in allow if c in online], True
    cpus = [c for c in cpus if c not in housekeeping]
    if not cpus:
        raise IrqError(
            f"No CPU is left for the interrupts of {bdf}: NUMA node {node} has CPUs {format_cpulist(local_cpus)}"
            f"{', cpus allows ' + format_cpulist(allow) if allow is not None else ''}, and housekeeping_cpus takes "
            f"{format_cpulist(housekeeping)}"
            + (f"; the isolated CPUs {format_cpulist(kept_free)} are never used" if kept_free else "")
            + ". Shorten housekeeping_cpus or widen cpus.")
    return {"bdf": bdf, "numa_node": node, "local_cpus": local_cpus, "cpus": cpus, "remote": remote,
            "policy": settings["policy"], "warnings": warnings}


def plan(walker: PciWalker, resolved: dict[str, dict[str, Any]], only: list[str], state: str = "present",
         known_managed: dict[str, Any] | None = None, allow_no_irqs: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
    """One entry per vector of the functions in ``only``: what it has and what it should have.

    ``resolved`` is every function of the population (for the round-robin offsets). Entries carry
    ``status`` ``change``, ``ok`` or ``managed`` (known kernel-managed, left alone). Returns (entries, warnings).
    """
    known_managed = known_managed or {}
    starts = offsets({b: r["cpus"] for b, r in resolved.items()})
    default = parse_cpumask(walker.fs.read_optional(DEFAULT_AFFINITY)) if state == "absent" else []
    online = online_cpus(walker)
    entries: list[dict[str, Any]] = []
    warnings: list[str] = []
    for bdf in only:
        info = resolved[bdf]
        irqs = device_irqs(walker, bdf)
        if not irqs:
            driver = walker.fs.readlink(f"{PCI_DEVICES}/{bdf}/driver")
            msg = (f"{bdf} has no MSI/MSI-X vectors ({PCI_DEVICES}/{bdf}/msi_irqs is empty; driver: "
                   f"{driver.rsplit('/', 1)[-1] if driver else 'none'}): there is nothing to pin until its driver enables them. "
                   f"Bind its driver first (the NVIDIA driver enables them when the GPU is opened: run nvidia-persistenced)")
            if not allow_no_irqs:
                raise IrqError(msg + ", or set allow_no_irqs: true to pin them when they appear.")
            warnings.append(msg + "; the re-apply unit pins them when they appear.")
            continue
        numbers = [i["irq"] for i in irqs]
        if state == "absent":
            wanted = {n: [c for c in (default or online) if c in online] for n in numbers}
        else:
            wanted = spread(numbers, info["cpus"], info["policy"], starts.get(bdf, 0))
        managed = known_managed.get(bdf) or {}
        driver_link = walker.fs.readlink(f"{PCI_DEVICES}/{bdf}/driver")
        driver = driver_link.rsplit("/", 1)[-1] if driver_link else None
        local = set(info["local_cpus"]) if info["numa_node"] is not None else None
        for irq in irqs:
            before = irq["smp_affinity_list"]
            if before is None:
                warnings.append(f"IRQ {irq['irq']} of {bdf} vanished while reading it (driver rebinding?); skipped.")
                continue
            current = parse_cpulist(before)
            serving = parse_cpulist(irq["effective_affinity_list"]) or current
            want = wanted[irq["irq"]]
            known = managed.get("driver") == driver and irq["irq"] in (managed.get("irqs") or [])
            entries.append({
                "bdf": bdf, "irq": irq["irq"], "mode": irq["mode"], "numa_node": info["numa_node"],
                "before": before, "effective_before": irq["effective_affinity_list"], "wanted": format_cpulist(want),
                "after": before, "remote_before": (not set(serving) <= local) if local is not None else None,
                "managed": True if known else None,
                "status": "managed" if known else ("ok" if current == want else "change"),
            })
    return entries, warnings


def apply(fs: HostFS, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Write every ``change`` entry, read it back (device_apply); EIO marks a kernel-managed vector, left alone.

    On any other failure the entries already written are put back and IrqError says which failed and why.
    Returns the entries, with ``after`` and ``status`` (changed, ok, managed, failed) filled in.
    """
    def path(step: dict) -> str:
        return f"/proc/irq/{step['entry']['irq']}/smp_affinity_list"

    def write(step: dict, cpus: str) -> tuple[int, str, None]:
        try:
            fs.write_text(path(step), cpus)
        except HostFSError as err:
            return err.errno or -1, err.strerror, None
        return 0, "", None

    def read(step: dict) -> tuple[str | None, str | None]:
        got = fs.read_optional(path(step))
        return got, None if got is not None else f"cannot read {path(step)}"

    steps = [{"entry": e, "before": e["before"], "after": e["wanted"]} for e in entries if e["status"] == "change"]
    out = apply_steps(steps, write, read, lambda step, got, cpus: parse_cpulist(got) == parse_cpulist(cpus),
                      on_failure=lambda attempt: IGNORE if attempt["rc"] == errno.EIO else STOP)
    for attempt in out["ignored"]:
        attempt["step"]["entry"].update(status="managed", managed=True)
    for attempt in out["done"]:
        attempt["step"]["entry"].update(status="changed", after=attempt["reads"], managed=False)
    if not out["failures"]:
        return entries
    failed = out["failures"][0]
    e = failed["step"]["entry"]
    done = []  # the entries that had taken, oldest first, as the rollback left them
    for attempt in reversed([a for a in out["journal"] if a["phase"] == "rollback"]):
        back = attempt["step"]["entry"]
        if back is e:
            continue
        if attempt["ok"]:
            back.update(status="rolled back", after=back["before"], managed=False)
        else:
            back.update(status="rollback failed", after=attempt["reads"], managed=False)
        done.append(back)
    e["status"] = "failed"
    where = path(failed["step"])
    if failed["rc"] != 0:
        hint = {errno.ENOSPC: "that CPU has no free interrupt vectors left; widen cpus",
                errno.EINVAL: "the CPUs are not usable for this interrupt (offline or not allowed)",
                errno.EROFS: "/proc/irq is read-only here: run on the host itself as root, not in a container",
                errno.EACCES: "permission denied: run as root (become: true)",
                errno.EPERM: "permission denied: run as root (become: true)"}.get(failed["rc"], "check dmesg")
        raise IrqError(f"Failed to pin IRQ {e['irq']} of {e['bdf']} to CPUs {e['wanted']}: writing {where} gave "
                       f"'{failed['stderr']}' ({hint}). {_rolled(done)}")
    e["after"] = failed["reads"]
    raise IrqError(f"IRQ {e['irq']} of {e['bdf']} reads back '{failed['reads']}' after writing '{e['wanted']}' to {where}: the kernel "
                   f"did not take the affinity. {_rolled(done)}")


def _rolled(done: list[dict[str, Any]]) -> str:
    if not done:
        return "Nothing had been changed."
    ok = [str(e["irq"]) for e in done if e["status"] == "rolled back"]
    bad = [str(e["irq"]) for e in done if e["status"] != "rolled back"]
    parts = ([f"IRQs {', '.join(ok)} were put back as they were."] if ok else []) + (
        [f"IRQs {', '.join(bad)} could not be put back; check them in /proc/irq."] if bad else [])
    return " ".join(parts)


def report(entries: list[dict[str, Any]], resolved: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per IRQ: before, after, NUMA node, whether it was served remotely, managed, status."""
    out = []
    for e in entries:
        local = resolved.get(e["bdf"], {}).get("local_cpus")
        after = parse_cpulist(e["after"]) if e["after"] else []
        out.append({"irq": e["irq"], "bdf": e["bdf"], "mode": e["mode"], "numa_node": e["numa_node"], "before": e["before"],
                    "effective_before": e["effective_before"], "wanted": e["wanted"], "after": e["after"],
                    "remote_before": e["remote_before"],
                    "remote_after": (not set(after) <= set(local)) if local and after and e["numa_node"] is not None else None,
                    "managed": e["managed"], "status": e["status"]})
    return out


# ---- managed vectors seen before (so check mode knows them) -----------------------------------------
def load_json(fs: HostFS, path: str) -> dict[str, Any]:
    text = fs.read_optional(path)
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def managed_cache_after(cache: dict[str, Any], walker: PciWalker, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The cache with the managed vectors of this run, keyed by function and its current driver."""
    out = {k: dict(v) for k, v in cache.items()}
    for bdf in sorted({e["bdf"] for e in entries}):
        irqs = sorted(e["irq"] for e in entries if e["bdf"] == bdf and e["status"] == "managed")
        link = walker.fs.readlink(f"{PCI_DEVICES}/{bdf}/driver")
        if irqs:
            out[bdf] = {"driver": link.rsplit("/", 1)[-1] if link else None, "irqs": irqs}
        else:
            out.pop(bdf, None)
    return out


# ---- persistent configuration and the pinned list ------------------------------------------------------
def merge_config(config: dict[str, Any], devices: dict[str, dict[str, Any]], state: str, exclusive: bool) -> dict[str, Any]:
    """The re-apply configuration after this run: {version, devices: {bdf: settings}}."""
    current = {} if exclusive else dict((config or {}).get("devices") or {})
    for bdf, settings in devices.items():
        if state == "present":
            current[bdf] = normalize_settings(settings)
        else:
            current.pop(bdf, None)
    return {"version": 1, "devices": {k: current[k] for k in sorted(current)}}


def parse_pinned(text: str | None) -> dict[str, str]:
    out = {}
    for line in (text or "").splitlines():
        fields = line.split()
        if fields and not fields[0].startswith("#"):
            out[fields[0]] = fields[1] if len(fields) > 1 else ""
    return out


def render_pinned(pinned: dict[str, str]) -> str:
    lines = [HEADER, "# PCI function, CPUs its IRQs are pinned to (read by the irqbalance policy script).\n"]
    lines += [f"{bdf} {cpus}\n" for bdf, cpus in sorted(pinned.items())]
    return "".join(lines)


def render_policy_script(pinned_path: str = PINNED_FILE) -> str:
    return POLICY_SCRIPT_TEXT.format(pinned=pinned_path)


# ---- irqbalance's environment file ----------------------------------------------------------------------
def get_var(text: str | None, name: str) -> str | None:
    """Value of the last uncommented ``NAME=value`` line (quotes removed), None when unset."""
    value = None
    for line in (text or "").splitlines():
        stripped = line.strip()
        if stripped.startswith(name + "="):
            raw = stripped[len(name) + 1:]
            try:
                parts = shlex.split(raw)
            except ValueError:
                parts = [raw.strip("\"'")]
            value = " ".join(parts)
    return value


def set_var(text: str | None, name: str, value: str | None, marker: str | None = None) -> str:
    """Set (or with None remove) ``NAME="value"``; replaces the last uncommented assignment, else appends.

    With ``marker``, the line is written below that comment and the comment goes with it on removal.
    """
    lines = (text or "").splitlines()
    idx = [i for i, ln in enumerate(lines) if ln.strip().startswith(name + "=")]
    keep_last = value is not None and bool(idx)
    drop = set(idx[:-1] if keep_last else idx)
    if marker:
        drop |= {i - 1 for i in drop if i > 0 and lines[i - 1] == marker}
    out = []
    for i, line in enumerate(lines):
        if i in drop:
            continue
        if keep_last and i == idx[-1]:
            if marker and (not out or out[-1] != marker):
                out.append(marker)
            line = f'{name}="{value}"'
        out.append(line)
    if value is not None and not idx:
        out += ([marker] if marker else []) + [f'{name}="{value}"']
    return "\n".join(out) + ("\n" if out else "")


def policyscript_tokens(args: str | None) -> tuple[list[str], list[str]]:
    """IRQBALANCE_ARGS -> (tokens, policy scripts named in them)."""
    try:
        tokens = shlex.split(args or "")
    except ValueError:
        tokens = (args or "").split()
    scripts = []
    for i, tok in enumerate(tokens):
        if tok.startswith("--policyscript="):
            scripts.append(tok.split("=", 1)[1])
        elif tok in ("--policyscript", "-l") and i + 1 < len(tokens):
            scripts.append(tokens[i + 1])
        elif tok.startswith("-l") and len(tok) > 2:
            scripts.append(tok[2:])
    return tokens, scripts


def irqbalance_config_text(text: str | None, mode: str, pinned: dict[str, str], script: str = POLICY_SCRIPT) -> str:
    """irqbalance's environment file as it should be for ``mode`` (policyscript, banned_cpus, none).

    Only our parts change: the ``--policyscript`` token for our script in IRQBALANCE_ARGS, and the
    marked IRQBALANCE_BANNED_CPULIST line. Raises IrqError when someone else owns what we need.
    """
    out = text or ""
    args = get_var(out, "IRQBALANCE_ARGS")
    tokens, scripts = policyscript_tokens(args)
    ours = f"--policyscript={script}"
    others = [s for s in scripts if s != script]
    keep = [t for t in tokens if t != ours]
    if mode == "policyscript" and pinned:
        if others:
            raise IrqError(
                f"IRQBALANCE_ARGS already names the policy script {others[0]}, and irqbalance runs only one. Make that "
                f"script also print ban=true for the functions in {PINNED_FILE}, or set irqbalance: banned_cpus.")
        if ours not in tokens:
            out = set_var(out, "IRQBALANCE_ARGS", " ".join(keep + [ours]))
    elif ours in tokens:
        out = set_var(out, "IRQBALANCE_ARGS", " ".join(keep) if keep else None)
    lines = (out or "").splitlines()
    banned_idx = [i for i, ln in enumerate(lines) if ln.strip().startswith("IRQBALANCE_BANNED_CPULIST=")]
    owned = bool(banned_idx) and banned_idx[-1] > 0 and lines[banned_idx[-1] - 1] == MARKER
    if mode == "banned_cpus" and pinned:
        if banned_idx and not owned:
            raise IrqError(
                f"IRQBALANCE_BANNED_CPULIST is already set to '{get_var(out, 'IRQBALANCE_BANNED_CPULIST')}' by someone else. "
                f"Merge the CPUs of the pinned IRQs into it yourself and use irqbalance: none, or use irqbalance: policyscript.")
        cpus = sorted({c for v in pinned.values() for c in parse_cpulist(v)})
        out = set_var(out, "IRQBALANCE_BANNED_CPULIST", format_cpulist(cpus), marker=MARKER)
    elif owned:
        out = set_var(out, "IRQBALANCE_BANNED_CPULIST", None, marker=MARKER)
    return out


def irqbalance_state(fs: HostFS, config: str | None = None) -> dict[str, Any]:
    """Whether irqbalance is installed, and its environment file."""
    binary = next((b for b in IRQBALANCE_BINARIES if fs.exists(b)), None)
    if config is None:
        config = next((c for c in IRQBALANCE_CONFIGS if fs.exists(c)), IRQBALANCE_CONFIGS[0])
    return {"present": binary is not None, "binary": binary, "config": config}

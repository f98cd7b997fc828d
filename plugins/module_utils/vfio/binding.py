# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Binding PCI functions to vfio-pci: selection, IOMMU group checks, in-use checks, plans, persistence.

Everything here is pure or reads through HostFS; the vfio_bind module applies the plan. The kernel
interface is the one driverctl uses: ``driver_override`` names the driver, ``driver/unbind`` releases
the function, ``/sys/bus/pci/drivers_probe`` asks the bus to bind it again, and only the named driver
may take it. Persistence is a udev rule that does the same on every ``add`` event (boot included) or a
modprobe.d ``ids=`` option with a ``softdep`` that loads vfio-pci before the function's own driver.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import (
    BMC_VENDORS, IOMMU_GROUPS, PCI_DEVICES, PciWalker, TopologyError, class_name, is_bridge_class, normalize_bdf,
)

try:
    import pyudev
    HAS_PYUDEV = True
except ImportError:  # optional: without it the bind is awaited by polling the driver link
    pyudev = None
    HAS_PYUDEV = False

VFIO = "vfio-pci"
# Drivers that leave a function harmless for the group (the kernel's vfio viability rule).
PARKING_DRIVERS = (VFIO, "pci-stub")
PCI_DRIVERS = "/sys/bus/pci/drivers"
DRIVERS_PROBE = "/sys/bus/pci/drivers_probe"
UDEV_RULES = "/etc/udev/rules.d/61-gpufleet-vfio.rules"
MODPROBE_CONF = "/etc/modprobe.d/gpufleet-vfio.conf"
STATE_FILE = "/var/lib/gpufleet/vfio/original-drivers.json"
HEADER = "# Managed by gpufleet.inference.vfio_bind: do not edit, run the vfio role (or vfio_bind) instead.\n"

DRIVER_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
ID_RE = re.compile(r"^(?:0x)?([0-9a-f]{4}):(?:0x)?([0-9a-f]{4})$")
UDEV_KERNEL_RE = re.compile(r'KERNEL=="([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])"')
SUBSYS_NVME_RE = re.compile(r"^nvme(\d+)c\d+n(\d+)$")


class VfioError(Exception):
    """The request cannot be done safely; the message says what, where, why and what to do."""


# ---- selection ------------------------------------------------------------------------------
def parse_selector(text: str) -> tuple[str, str]:
    """``0000:3b:00.0``/``3b:00.0`` -> ('bdf', '0000:3b:00.0'); ``10de:2335`` -> ('id', '10de:2335')."""
    raw = str(text).strip().lower()
    bdf = normalize_bdf(raw)
    if bdf:
        return "bdf", bdf
    m = ID_RE.match(raw)
    if m:
        return "id", f"{m.group(1)}:{m.group(2)}"
    raise VfioError(
        f"devices: '{text}' is neither a PCI address nor a vendor:device ID: write an address as DDDD:BB:DD.F "
        f"(0000:3b:00.0, from 'lspci -D') or an ID as vvvv:dddd (10de:2335, from 'lspci -nn').")


def device_id(walker: PciWalker, bdf: str) -> str:
    """``10de:2335`` for a function."""
    b = walker.basic(bdf)
    return f"{(b['vendor'] or '0x????')[2:]}:{(b['device'] or '0x????')[2:]}"


def describe(walker: PciWalker, bdf: str) -> str:
    """``0000:3b:00.2 (USB controller [8086:1234])``."""
    return f"{bdf} ({class_name(walker.basic(bdf)['class']) or 'unknown class'} [{device_id(walker, bdf)}])"


def slot_functions(bdf: str, present: list[str]) -> list[str]:
    """Every function of the slot ``bdf`` sits in (``0000:3b:00.*``)."""
    slot = bdf.rsplit(".", 1)[0]
    return [b for b in present if b.rsplit(".", 1)[0] == slot]


def resolve(walker: PciWalker, selectors: list[str], companions: bool = True) -> list[dict[str, Any]]:
    """The functions the selectors name, in order, plus the other functions of their slots.

    Returns [{bdf, selected_by ('bdf'|'id'|'companion'), companion_of}]. Raises VfioError for a
    malformed selector, an address that is not present or an ID that matches nothing.
    """
    parsed = [(raw, parse_selector(raw)) for raw in selectors]
    if not parsed:
        raise VfioError("devices is empty: name the PCI functions by address (0000:3b:00.0) or vendor:device ID (10de:2335).")
    try:
        present = walker.functions()
    except TopologyError as err:
        raise VfioError(str(err)) from None
    out: list[dict[str, Any]] = []
    seen: set[str] = set()

    def take(bdf: str, how: str, of: str | None = None) -> None:
        if bdf not in seen:
            seen.add(bdf)
            out.append({"bdf": bdf, "selected_by": how, "companion_of": of})

    for raw, (kind, value) in parsed:
        if kind == "bdf":
            if value not in present:
                raise VfioError(
                    f"PCI function {value} (from devices: '{raw}') is not on this host ({PCI_DEVICES} under root "
                    f"{walker.fs.root}): check the address with 'lspci -D', or drop it from devices.")
            take(value, "bdf")
        else:
            matches = [b for b in present if device_id(walker, b) == value]
            if not matches:
                seen_ids = sorted({device_id(walker, b) for b in present if not is_bridge_class(walker.basic(b)["class"])})
                raise VfioError(
                    f"No PCI function has the ID {value} on this host ({len(present)} functions scanned; endpoint IDs "
                    f"present: {', '.join(seen_ids[:16]) or 'none'}). Check it with 'lspci -nn', or drop it from devices.")
            for bdf in matches:
                take(bdf, "id")
    if companions:
        for entry in list(out):
            for other in slot_functions(entry["bdf"], present):
                if other not in seen and not is_bridge_class(walker.basic(other)["class"]):
                    take(other, "companion", entry["bdf"])
    return out


# ---- state ----------------------------------------------------------------------------------
def read_state(walker: PciWalker, bdf: str) -> dict[str, Any]:
    """What binding needs to know about one function, read from sysfs."""
    fs = walker.fs
    base = f"{PCI_DEVICES}/{bdf}"
    driver_link = fs.readlink(base + "/driver")
    group_link = fs.readlink(base + "/iommu_group")
    group = os.path.basename(group_link) if group_link else None
    override = fs.read_optional(base + "/driver_override")
    b = walker.basic(bdf)
    driver = os.path.basename(driver_link) if driver_link else None
    module = None
    if driver:
        mod_link = fs.readlink(f"{PCI_DRIVERS}/{driver}/module")
        module = os.path.basename(mod_link) if mod_link else None
    return {
        "bdf": bdf,
        "id": device_id(walker, bdf),
        "class": b["class"],
        "class_name": class_name(b["class"]),
        "is_bridge": is_bridge_class(b["class"]),
        "driver": driver,
        "driver_module": module,
        "driver_override": None if override in (None, "", "(null)") else override,
        "iommu_group": int(group) if group and group.isdigit() else None,
    }


def iommu_enabled(fs: HostFS) -> bool:
    """True when the kernel made IOMMU groups (an IOMMU is on)."""
    return bool(fs.listdir(IOMMU_GROUPS))


def check_groups(walker: PciWalker, states: dict[str, dict[str, Any]], allow: list[str]) -> tuple[dict, list[str]]:
    """Every member of every target's IOMMU group must be a target, parked (vfio-pci, pci-stub), a bridge or allowed.

    Returns ({group: [member verdicts]}, [problems as sentences that name the blocker and the fix]).
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    problems: list[str] = []
    for bdf, st in states.items():
        group = st["iommu_group"]
        if group is None or str(group) in groups:
            continue
        members = []
        for member in walker.group_members(str(group)):
            mb = member["bdf"]
            mstate = states.get(mb) or read_state(walker, mb)
            if mb in states:
                verdict = "bound with the targets"
            elif mstate["driver"] in PARKING_DRIVERS:
                verdict = f"already on {mstate['driver']}"
            elif member["is_bridge"]:
                verdict = "bridge"
            elif mb in allow:
                verdict = "allowed by group_allow"
            else:
                verdict = "blocks"
                users = [s for s, x in states.items() if x["iommu_group"] == group]
                problems.append(
                    f"Cannot bind {', '.join(users)} to {VFIO}: IOMMU group {group} also holds {describe(walker, mb)}, "
                    f"{'driven by ' + mstate['driver'] if mstate['driver'] else 'with no driver'}, and a group is only "
                    f"safe to hand over whole. Add {mb} to devices (it will be bound to {VFIO} too), list it in "
                    f"group_allow if it may stay as it is, or move the card to a slot with its own group.")
            members.append({"bdf": mb, "class_name": member["class_name"], "driver": mstate["driver"], "verdict": verdict})
        groups[str(group)] = members
    return groups, problems


# ---- display guards ---------------------------------------------------------------------------
def display_reasons(walker: PciWalker, bdf: str) -> list[str]:
    """Why taking this function from the host would take its console: the firmware's boot display
    (sysfs ``boot_vga`` 1), or a BMC's display controller (ASPEED, Matrox: the remote console)."""
    fs = walker.fs
    b = walker.basic(bdf)
    out = []
    if (fs.read_optional(f"{PCI_DEVICES}/{bdf}/boot_vga") or "").strip() == "1":
        out.append(f"{bdf} is the boot display device (boot_vga 1): the firmware and the kernel console draw on it")
    vendor = (b["vendor"] or "").lower().replace("0x", "")
    if (b["class"] or "").lower().replace("0x", "").startswith("03") and vendor in BMC_VENDORS:
        out.append(f"{bdf} is a BMC display controller ({'ASPEED' if vendor == '1a03' else 'Matrox'} [{vendor}:"
                   f"{(b['device'] or '?').replace('0x', '')}]): the remote console of the host")
    return out


# ---- in-use checks ----------------------------------------------------------------------------
def _uevent(fs: HostFS, path: str) -> dict[str, str]:
    out = {}
    for line in (fs.read_optional(path + "/uevent") or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


def device_nodes(fs: HostFS, sysdir: str, depth: int = 4) -> tuple[set[str], list[dict[str, str]], list[tuple[str, str]]]:
    """/dev nodes, block devices and network interfaces that belong to a function: walks its sysfs directory
    (no links), which also finds what sits on a bus below it (virtio: ``virtio2/net/ens3``, ``virtio1/block/vda``).

    Returns ({'/dev/nvme0', ...}, [{name, dev (major:minor), sysdir}] for block devices, [(ifname, sysdir)]).
    """
    nodes: set[str] = set()
    blocks: list[dict[str, str]] = []
    interfaces: list[tuple[str, str]] = []
    stack = [(sysdir, 0)]
    while stack:
        path, level = stack.pop()
        for name in fs.listdir(path):
            child = f"{path}/{name}"
            if fs.readlink(child) is not None or not fs.isdir(child) or name in ("power", "msi_irqs", "subsystem"):
                continue
            if name == "net":
                interfaces.extend((ifname, f"{child}/{ifname}") for ifname in fs.listdir(child))
                continue
            ev = _uevent(fs, child)
            if ev.get("DEVNAME"):
                nodes.add("/dev/" + ev["DEVNAME"])
                if ev.get("DEVTYPE") in ("disk", "partition"):
                    blocks.append({"name": ev["DEVNAME"], "dev": fs.read_optional(child + "/dev") or "", "sysdir": child})
            m = SUBSYS_NVME_RE.match(name)
            if m:  # native NVMe multipath: the block device is the subsystem's head, nvme<S>n<N>
                head = f"nvme{m.group(1)}n{m.group(2)}"
                head_dir = f"/sys/class/block/{head}"
                if fs.exists(head_dir):
                    nodes.add("/dev/" + head)
                    blocks.append({"name": head, "dev": fs.read_optional(head_dir + "/dev") or "", "sysdir": head_dir})
                    for part in fs.listdir(head_dir):
                        if part.startswith(head + "p") and fs.exists(f"{head_dir}/{part}/dev"):
                            nodes.add("/dev/" + part)
                            blocks.append({"name": part, "dev": fs.read_optional(f"{head_dir}/{part}/dev") or "",
                                           "sysdir": f"{head_dir}/{part}"})
            if level + 1 < depth:
                stack.append((child, level + 1))
    return nodes, blocks, sorted(interfaces)


def nvidia_minor(fs: HostFS, bdf: str) -> int | None:
    """The /dev/nvidiaN minor of a GPU, from the NVIDIA driver's procfs."""
    text = fs.read_optional(f"/proc/driver/nvidia/gpus/{bdf}/information") or ""
    m = re.search(r"^Device Minor:\s*(\d+)", text, re.M)
    return int(m.group(1)) if m else None


def process_holders(fs: HostFS, paths: set[str]) -> list[str]:
    """'process 1234 (nvidia-smi) holds /dev/nvidia0' for every open descriptor on ``paths``."""
    if not paths:
        return []
    out = []
    for pid in fs.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = fs.listdir(f"/proc/{pid}/fd")
        except HostFSError:  # gone or not ours to read
            continue
        held = set()
        for fd in fds:
            target = fs.readlink(f"/proc/{pid}/fd/{fd}")
            if target in paths:
                held.add(target)
        if held:
            comm = fs.read_optional(f"/proc/{pid}/comm") or "?"
            out.append(f"process {pid} ({comm}) holds {', '.join(sorted(held))}")
    return out


def in_use(walker: PciWalker, st: dict[str, Any]) -> list[str]:
    """Why unbinding this function's driver would hurt someone now; empty when nothing holds it."""
    fs = walker.fs
    bdf = st["bdf"]
    sysdir = walker.sysfs_path(bdf)
    nodes, blocks, interfaces = device_nodes(fs, sysdir)
    unresolved = []
    if st["driver"] == "nvidia":
        minor = nvidia_minor(fs, bdf)
        if minor is not None:
            nodes.add(f"/dev/nvidia{minor}")
        else:  # cannot tell which /dev/nvidiaN is this GPU: never assume it is idle
            unresolved.append(f"it is bound to nvidia but /proc/driver/nvidia/gpus/{bdf}/information names no device "
                              "minor, so whether a process holds its /dev/nvidiaN cannot be checked (counted as in use)")
    if st["driver"] == VFIO and st["iommu_group"] is not None:
        nodes.add(f"/dev/vfio/{st['iommu_group']}")
    reasons = unresolved + process_holders(fs, nodes)
    devs = {b["dev"]: b["name"] for b in blocks if b["dev"]}
    for line in (fs.read_optional("/proc/self/mountinfo") or "").splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[2] in devs:
            reasons.append(f"/dev/{devs[fields[2]]} is mounted on {fields[4]}")
    swaps = {f"/dev/{b['name']}" for b in blocks}
    for line in (fs.read_optional("/proc/swaps") or "").splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] in swaps:
            reasons.append(f"{fields[0]} is an active swap area")
    for b in blocks:
        holders = fs.listdir(b["sysdir"] + "/holders")
        if holders:
            reasons.append(f"/dev/{b['name']} is held by {', '.join(holders)} (device mapper, MD RAID or LVM)")
    for ifname, ifdir in interfaces:
        flags = fs.read_optional(f"{ifdir}/flags") or "0x0"
        try:
            up = int(flags, 16) & 0x1
        except ValueError:
            up = 0
        if up:
            reasons.append(f"network interface {ifname} is up")
    return reasons


# ---- plans --------------------------------------------------------------------------------------
def plan_present(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Actions that leave every function on vfio-pci with driver_override set (driverctl's order)."""
    actions: list[dict[str, Any]] = []
    for st in states:
        bdf = st["bdf"]
        if st["driver_override"] != VFIO:
            actions.append({"op": "override", "bdf": bdf, "value": VFIO})
        if st["driver"] != VFIO:
            if st["driver"]:
                actions.append({"op": "unbind", "bdf": bdf, "driver": st["driver"]})
            actions.append({"op": "probe", "bdf": bdf, "expect": VFIO})
    return actions


def plan_absent(states: list[dict[str, Any]], originals: dict[str, Any], restore_driver: str | None) -> list[dict[str, Any]]:
    """Actions that hand every function back to its original driver."""
    actions: list[dict[str, Any]] = []
    for st in states:
        bdf = st["bdf"]
        if st["driver_override"] is None and st["driver"] != VFIO:
            continue
        orig = originals.get(bdf) or {}
        expect = restore_driver or orig.get("driver")
        if st["driver_override"] is not None:
            actions.append({"op": "override", "bdf": bdf, "value": None})
        if st["driver"] == VFIO:
            actions.append({"op": "unbind", "bdf": bdf, "driver": VFIO})
            actions.append({"op": "probe", "bdf": bdf, "expect": expect,
                            "module": orig.get("module") if not restore_driver else restore_driver})
    return actions


def describe_action(a: dict[str, Any]) -> str:
    op, bdf = a["op"], a.get("bdf")
    if op == "override":
        return f"set {bdf} driver_override to {a['value']}" if a["value"] else f"clear {bdf} driver_override"
    if op == "unbind":
        return f"unbind {bdf} from {a['driver']}"
    if op == "probe":
        return f"probe {bdf} (bind to {a['expect'] or 'its default driver'})"
    if op == "modprobe":
        return f"load the {a['module']} kernel module"
    if op == "remove_id":
        return f"remove ID {a['id']} from {VFIO}'s dynamic ID table (set by modprobe.d ids=)"
    if op == "write":
        return f"write {a['path']}"
    if op == "remove":
        return f"remove {a['path']}"
    return f"{op} {bdf}"


def result_action(a: dict[str, Any], states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One planned step as the module's result shows it (the action schema of docs/development.md): the verb, what
    it acts on, before/after where there is a value; file contents stay out (the diff has them)."""
    op, bdf = a["op"], a.get("bdf")
    if op == "override":
        return {"action": "set_override", "device": bdf, "path": f"{PCI_DEVICES}/{bdf}/driver_override",
                "before": (states.get(bdf) or {}).get("driver_override"), "after": a["value"]}
    if op == "unbind":
        return {"action": "unbind", "device": bdf, "driver": a["driver"]}
    if op == "probe":
        return {"action": "probe", "device": bdf, "driver": a["expect"]}
    if op == "modprobe":
        return {"action": "load_module", "module": a["module"]}
    if op == "remove_id":
        return {"action": "remove_id", "path": f"{PCI_DRIVERS}/{VFIO}/remove_id", "id": a["id"]}
    return {"action": op, "path": a["path"]}


# ---- persistence ----------------------------------------------------------------------------------
def udev_bdfs(text: str | None) -> list[str]:
    """The functions our own udev rules file keeps on vfio-pci."""
    return sorted(set(UDEV_KERNEL_RE.findall(text or "")))


def render_udev(bdfs) -> str:
    """One pair of rules per function: set driver_override on every add event (boot and hotplug), and when the
    function is not on vfio-pci yet, load vfio-pci, release the current driver and reprobe."""
    lines = [HEADER, "# Each function: driver_override on every add event; if another driver holds it, release and reprobe.\n"]
    for bdf in sorted(set(bdfs)):
        match = f'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="{bdf}"'
        lines.append(f'{match}, ATTR{{driver_override}}="{VFIO}"\n')
        lines.append(f'{match}, DRIVER!="{VFIO}", RUN{{builtin}}+="kmod load {VFIO}", '
                     f'RUN+="/bin/sh -c \'test -e /sys/bus/pci/devices/%k/driver && echo %k > /sys/bus/pci/devices/%k/driver/unbind; '
                     f'echo %k > /sys/bus/pci/drivers_probe\'"\n')
    return "".join(lines)


def parse_modprobe(text: str | None) -> tuple[list[str], list[str]]:
    """Our modprobe.d file -> (IDs, driver modules with a softdep)."""
    ids: list[str] = []
    drivers: list[str] = []
    for line in (text or "").splitlines():
        fields = line.split()
        if fields[:2] == ["options", VFIO] and len(fields) > 2 and fields[2].startswith("ids="):
            ids.extend(i for i in fields[2][4:].split(",") if i)
        elif len(fields) == 4 and fields[0] == "softdep" and fields[2:] == ["pre:", VFIO]:
            drivers.append(fields[1])
    return sorted(set(ids)), sorted(set(drivers))


def render_modprobe(ids, drivers) -> str:
    out = [HEADER, "# vfio-pci claims these vendor:device IDs; the softdeps load it before the functions' own drivers.\n"]
    out.append(f"options {VFIO} ids={','.join(sorted(set(ids)))}\n")
    for drv in sorted(set(drivers)):
        out.append(f"softdep {drv} pre: {VFIO}\n")
    return "".join(out)


def plan_persist(fs: HostFS, method: str, state: str, states: list[dict[str, Any]], originals: dict[str, Any],
                 walker: PciWalker) -> tuple[list[dict[str, Any]], list[str]]:
    """File writes that keep (state=present) or stop keeping (absent) the functions on vfio-pci across reboots.

    Returns (actions of op write/remove with before/after content, problems).
    """
    if method == "none":
        return [], []
    problems: list[str] = []
    bdfs = [s["bdf"] for s in states]
    udev_before = fs.read_optional(UDEV_RULES)
    mod_before = fs.read_optional(MODPROBE_CONF)
    udev_set = set(udev_bdfs(udev_before))
    ids, drivers = parse_modprobe(mod_before)
    ids_set, drv_set = set(ids), set(drivers)
    if state == "present" and method == "udev":
        udev_set |= set(bdfs)
    elif state == "present" and method == "modprobe":
        wanted = {s["id"] for s in states}
        for other in walker.functions():
            if other not in bdfs and device_id(walker, other) in wanted and read_state(walker, other)["driver"] != VFIO:
                problems.append(
                    f"persist: modprobe binds every function with ID {device_id(walker, other)} at boot, and {describe(walker, other)} "
                    f"has that ID but is not in devices: use persist: udev (by address), or add {other} to devices.")
        for s in states:
            orig = (originals.get(s["bdf"]) or {})
            module = s["driver_module"] if s["driver"] not in (None, VFIO) else orig.get("module")
            driver = s["driver"] if s["driver"] not in (None, VFIO) else orig.get("driver")
            if driver and not module:
                problems.append(
                    f"persist: modprobe cannot keep {driver} away from {s['bdf']}: {driver} is built into the kernel, so no "
                    f"softdep can load {VFIO} before it. Use persist: udev for this function.")
            if module:
                drv_set.add(module)
        ids_set |= wanted
    elif state == "absent":
        udev_set -= set(bdfs)
        gone = {s["id"] for s in states}
        ids_set -= gone
        if not ids_set:
            drv_set = set()
    actions: list[dict[str, Any]] = []
    udev_after = render_udev(udev_set) if udev_set else None
    mod_after = render_modprobe(ids_set, drv_set) if ids_set else None
    for path, before, after in ((UDEV_RULES, udev_before, udev_after), (MODPROBE_CONF, mod_before, mod_after)):
        if after is None and before is not None:
            actions.append({"op": "remove", "path": path, "before": before + "\n", "after": ""})
        elif after is not None and (before or "") + "\n" != after:
            actions.append({"op": "write", "path": path, "before": (before + "\n") if before is not None else "", "after": after})
    return actions, problems


# ---- originals ----------------------------------------------------------------------------------
def load_originals(fs: HostFS) -> dict[str, Any]:
    """The drivers recorded before vfio-pci took the functions. An absent file is no record; an empty or
    broken one is an error (the drivers to give the functions back to would be lost silently)."""
    if not fs.exists(STATE_FILE):
        return {}
    text = fs.read_optional(STATE_FILE)
    try:
        data = json.loads(text) if text and text.strip() else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise VfioError(f"{STATE_FILE} is {'empty' if not (text or '').strip() else 'not a JSON object'}: it should hold the "
                        "drivers the functions had before vfio-pci, which state=absent gives them back to. Restore it from "
                        "a backup, or remove it and set restore_driver to the driver to bind.")
    for bdf, entry in data.items():
        why = _bad_original(bdf, entry)
        if why:
            raise VfioError(f"{STATE_FILE}: the entry {bdf!r} {why}: each entry maps a PCI address (0000:3b:00.0) to "
                            '{"driver": ..., "module": ..., "id": "10de:2330"} (strings or null). Restore the file from a '
                            "backup, or remove it and set restore_driver to the driver to bind. Nothing was changed.")
    return data


def _bad_original(bdf: str, entry) -> str | None:
    """Why one entry of the originals record is not of its schema, or None."""
    if normalize_bdf(bdf) != bdf:
        return "is not a PCI address in the sysfs form"
    if not isinstance(entry, dict) or set(entry) != {"driver", "module", "id"}:
        return "is not an object of driver, module and id"
    if not all(v is None or (isinstance(v, str) and DRIVER_NAME_RE.fullmatch(v)) for v in (entry["driver"], entry["module"])):
        return "has a driver or module that is not a kernel driver name"
    if entry["id"] is not None and not (isinstance(entry["id"], str) and ID_RE.match(entry["id"])):
        return "has an id that is not vendor:device"
    return None


def remember(originals: dict[str, Any], states: list[dict[str, Any]]) -> dict[str, Any]:
    """The drivers the functions had before vfio-pci, kept across runs (never overwritten by vfio-pci)."""
    out = dict(originals)
    for st in states:
        if st["driver"] and st["driver"] != VFIO:
            out[st["bdf"]] = {"driver": st["driver"], "module": st["driver_module"], "id": st["id"]}
    return out


# ---- waiting for the kernel ----------------------------------------------------------------------
class BindWatcher:
    """Waits until a function is bound to the expected driver.

    On a live host with pyudev it listens for the udev ``bind`` event (started before the write, so
    none is missed) and re-checks the driver link between events; elsewhere it polls the link. The
    driver link is the truth either way.
    """

    def __init__(self, fs: HostFS, use_udev: bool = True):
        self.fs = fs
        self.monitor = None
        self.source = "poll"
        if use_udev and HAS_PYUDEV and fs.root == "/":
            try:
                monitor = pyudev.Monitor.from_netlink(pyudev.Context())
                monitor.filter_by(subsystem="pci")
                monitor.start()
                self.monitor = monitor
                self.source = "udev"
            except Exception:  # pylint: disable=broad-except  # no netlink (container): poll instead
                self.monitor = None

    def driver(self, bdf: str) -> str | None:
        link = self.fs.readlink(f"{PCI_DEVICES}/{bdf}/driver")
        return os.path.basename(link) if link else None

    def wait(self, bdf: str, expect: str | None, timeout: float) -> str | None:
        """The driver once it is ``expect`` (or any driver when ``expect`` is None), else what it is at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            current = self.driver(bdf)
            if current and (expect is None or current == expect):
                return current
            left = deadline - time.monotonic()
            if left <= 0:
                return current
            if self.monitor is not None:
                self.monitor.poll(timeout=min(0.5, left))  # any pci event: re-check the link
            else:
                time.sleep(min(0.05, left))

    def close(self) -> None:
        if self.monitor is not None:
            try:
                self.monitor.stop()
            except Exception:  # pylint: disable=broad-except
                pass

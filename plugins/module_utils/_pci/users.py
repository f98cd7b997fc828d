# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who is using a PCIe path now: the guard in front of every live config-space write.

Changing MaxPayload or ACS Control while DMA is in flight risks malformed TLPs, fatal AER errors
and a GPU falling off the bus, and on a vfio host it changes what a running VM owns. Before a
live write on a set of functions (the bridges written and everything below them), users() scans
/proc/*/fd through HostFS once and names every process that holds:

- ``/dev/nvidiaN`` of an nvidia-bound GPU on the path (its minor from
  /proc/driver/nvidia/gpus/BDF/information; when the minor cannot be resolved, any process
  holding any ``/dev/nvidiaN`` counts, since it may be this GPU);
- ``/dev/dri/renderD*`` or ``/dev/dri/card*`` of a DRM device on the path (from its sysfs
  ``drm`` children);
- ``/dev/vfio/GROUP`` of its IOMMU group or its iommufd ``/dev/vfio/devices/vfioN`` (an open
  vfio group is a running VM or DPDK/SPDK process).

Pure reading: no writes, no process is touched.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import PCI_DEVICES, PciWalker

NVIDIA_NODE_RE = re.compile(r"^/dev/nvidia\d+$")
WATCHED = ("/dev/nvidia", "/dev/dri/", "/dev/vfio/")


def _link_name(fs: HostFS, path: str) -> str | None:
    target = fs.readlink(path)
    return os.path.basename(target) if target else None


def nvidia_minor(fs: HostFS, bdf: str) -> int | None:
    """The /dev/nvidiaN minor of a GPU, from the NVIDIA driver's procfs."""
    text = fs.read_optional(f"/proc/driver/nvidia/gpus/{bdf}/information") or ""
    m = re.search(r"^Device Minor:\s*(\d+)", text, re.M)
    return int(m.group(1)) if m else None


def device_files(fs: HostFS, bdf: str) -> dict[str, Any]:
    """The /dev files through which a process uses one function.

    Returns ``{driver, paths: set, any_nvidia: bool, note}``; ``any_nvidia`` is true for an
    nvidia-bound GPU whose minor is unknown (every /dev/nvidiaN counts then).
    """
    base = f"{PCI_DEVICES}/{bdf}"
    driver = _link_name(fs, base + "/driver")
    paths: set[str] = set()
    any_nvidia = False
    note = None
    if driver == "nvidia":
        minor = nvidia_minor(fs, bdf)
        if minor is None:
            any_nvidia = True
            note = (f"{bdf} is bound to nvidia but /proc/driver/nvidia/gpus/{bdf}/information names no device minor, "
                    "so every process holding a /dev/nvidiaN counts as its user")
        else:
            paths.add(f"/dev/nvidia{minor}")
    for name in fs.listdir(base + "/drm"):
        if name.startswith(("renderD", "card")):
            paths.add(f"/dev/dri/{name}")
    if driver == "vfio-pci":
        group = _link_name(fs, base + "/iommu_group")
        if group:
            paths.add(f"/dev/vfio/{group}")
        for name in fs.listdir(base + "/vfio-dev"):
            paths.add(f"/dev/vfio/devices/{name}")
    return {"driver": driver, "paths": paths, "any_nvidia": any_nvidia, "note": note}


def open_device_files(fs: HostFS) -> dict[str, dict[str, Any]]:
    """{pid: {comm, files}} for every process with a descriptor on a GPU or vfio device file."""
    out: dict[str, dict[str, Any]] = {}
    for pid in fs.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = fs.listdir(f"/proc/{pid}/fd")
        except HostFSError:  # gone, or not ours to read
            continue
        files = set()
        for fd in fds:
            target = fs.readlink(f"/proc/{pid}/fd/{fd}")
            if target and target.startswith(WATCHED):
                files.add(target)
        if files:
            out[pid] = {"comm": fs.read_optional(f"/proc/{pid}/comm") or "?", "files": files}
    return out


def below(walker: PciWalker, bdfs) -> list[str]:
    """The functions in ``bdfs`` and every present function whose path goes through one of them."""
    wanted = set(bdfs)
    out = []
    for other in walker.functions():
        _hb, chain = walker.path(other)
        if other in wanted or wanted.intersection(chain):
            out.append(other)
    return sorted(out)


def users(walker: PciWalker, bdfs) -> dict[str, Any]:
    """Who uses the functions on and below ``bdfs`` now.

    Returns ``{holders: [{pid, comm, files, device}], lines: ["process 4242 (python3) holds
    /dev/nvidia0 of 0000:03:00.0"], notes: [...], checked: [bdfs]}``; empty ``holders`` means idle.
    """
    fs = walker.fs
    checked = below(walker, bdfs)
    per_device = {b: device_files(fs, b) for b in checked}
    procs = open_device_files(fs) if any(d["paths"] or d["any_nvidia"] for d in per_device.values()) else {}
    holders, lines = [], []
    for pid in sorted(procs, key=int):
        proc = procs[pid]
        for bdf, dev in per_device.items():
            held = sorted(f for f in proc["files"] if f in dev["paths"] or (dev["any_nvidia"] and NVIDIA_NODE_RE.match(f)))
            if held:
                holders.append({"pid": int(pid), "comm": proc["comm"], "files": held, "device": bdf})
                lines.append(f"process {pid} ({proc['comm']}) holds {', '.join(held)} of {bdf}")
    notes = [d["note"] for d in per_device.values() if d["note"]]
    return {"holders": holders, "lines": lines, "notes": notes, "checked": checked}


def refusal(what: str, found: dict[str, Any], boot_way: str) -> str:
    """The message of a refused live write: what, who holds it, and the two ways out."""
    shown = found["lines"][:8] + ([f"... and {len(found['lines']) - 8} more"] if len(found["lines"]) > 8 else [])
    return (f"Refusing to {what} while the path is in use: {'; '.join(shown)}. A config-space change under DMA can "
            "produce malformed TLPs, fatal AER errors and a GPU that falls off the bus. Either stop these users "
            "(the inference service, nvidia-persistenced, the VM) and run again, or let the change happen at boot, "
            f"before the GPU driver and the services start: {boot_way}. force: true writes anyway.")

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the driver executors read on the host, through the Host's files (HostFS, under ``root``) and commands
(HostCmd): the running and installed kernels, the installed packages, the loaded driver's version and who holds its
device files. The parsing is parse.py's; this file only gathers."""

from __future__ import annotations

import re

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.parse import (
    driver_version_from_proc, parse_dpkg_query, parse_modinfo,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.upgrade import installed_kernels, version_key

DPKG_FORMAT = "${Package}\\t${Version}\\t${db:Status-Abbrev}\\n"
# Package names as Debian allows them (policy 5.6.1), and versions (5.6.12): what reaches apt's argv.
PACKAGE_RE = re.compile(r"[a-z0-9][a-z0-9+.-]{0,127}")
VERSION_RE = re.compile(r"([0-9]+:)?[0-9][0-9A-Za-z.+~-]{0,127}")  # starts with a digit (policy 5.6.12)
MODULE_RE = re.compile(r"[A-Za-z0-9_-]{1,56}")
UNIT_RE = re.compile(r"[A-Za-z0-9@_.:\\-]{1,255}")
PROC_SCAN_LIMIT = 100000


def checked(name: str, value: str, pattern: re.Pattern, form: str) -> str:
    """``value`` when it is a whole match of ``pattern``; else Failed naming the option and the form (nothing done)."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise Failed(f"{name}={value!r} is not {form}. Nothing was done.", changed=False)
    return value


def running_kernel(host: Host) -> str:
    text = host.fs.read_optional("/proc/sys/kernel/osrelease")
    if not text:
        raise Failed(f"Cannot read /proc/sys/kernel/osrelease under root {host.fs.root}: the running kernel is unknown. "
                     "Run the module on a Linux host with /proc mounted. Nothing was done.", changed=False)
    return text.strip()


def pending_kernels(host: Host, running: str) -> list[str]:
    """Installed kernels newer than the running one (a reboot may boot them): /boot/vmlinuz-<v> with /lib/modules/<v>."""
    kernels = installed_kernels(host.fs.listdir("/boot"), host.fs.listdir("/lib/modules"))
    return [k for k in kernels if version_key(k) > version_key(running)]


def installed_packages(host: Host) -> dict[str, str]:
    dpkg = host.cmd.find("dpkg-query", required=True, hint="install dpkg (a Debian or Ubuntu host)")
    rc, out, err = host.cmd.run_in_root([dpkg, "-W", "-f", DPKG_FORMAT])
    if rc != 0:
        raise Failed(f"dpkg-query -W failed (rc {rc}): {err.strip()}. Nothing was done.", changed=False)
    return parse_dpkg_query(out)


def held_packages(host: Host) -> list[str]:
    apt_mark = host.cmd.find("apt-mark", required=True, hint="install apt")
    rc, out, err = host.cmd.run_in_root([apt_mark, "showhold"])
    if rc != 0:
        raise Failed(f"apt-mark showhold failed (rc {rc}): {err.strip()}. Nothing was done.", changed=False)
    return sorted(line.strip() for line in out.splitlines() if line.strip())


def loaded_version(host: Host, version_file: str) -> str | None:
    """The loaded module's version from its /proc file (None when the module is not loaded)."""
    return driver_version_from_proc(host.fs.read_optional(version_file))


def modinfo_version(host: Host, module: str, kernel: str | None = None) -> str | None:
    """The version of the module file modprobe would load (for ``kernel``, default the running one); None when there
    is none."""
    modinfo = host.cmd.find("modinfo")
    if modinfo is None:
        return None
    rc, out, _err = host.cmd.run_in_root([modinfo] + (["-k", kernel] if kernel else []) + [module])
    return parse_modinfo(out).get("version") if rc == 0 else None


def device_holders(host: Host, prefix: str) -> list[dict]:
    """Every process with an open file under ``prefix`` (``/dev/nvidia``: /dev/nvidia0, nvidiactl, nvidia-uvm), read from
    /proc/<pid>/fd: [{pid, comm, unit, device}], one per process and device."""
    out = []
    pids = [p for p in host.fs.listdir("/proc") if p.isdigit()][:PROC_SCAN_LIMIT]
    for pid in sorted(pids, key=int):
        seen = set()
        for fd in host.fs.listdir(f"/proc/{pid}/fd"):
            target = host.fs.readlink(f"/proc/{pid}/fd/{fd}")
            if target and target.startswith(prefix) and target not in seen:
                seen.add(target)
                out.append({"pid": int(pid), "comm": (host.fs.read_optional(f"/proc/{pid}/comm") or "?").strip(),
                            "unit": unit_of(host.fs.read_optional(f"/proc/{pid}/cgroup")), "device": target})
    return out


def unit_of(cgroup: str | None) -> str | None:
    """The systemd unit a process runs in, from /proc/<pid>/cgroup (``0::/system.slice/vllm.service``)."""
    for line in (cgroup or "").splitlines():
        path = line.rsplit(":", 1)[-1]
        for part in reversed(path.split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return None

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure parsers of what a GPU driver host says about its driver. Nothing here reads a file or runs a command: the
executors gather the text through the one I/O seam (HostFS) and command runner (HostCmd) and pass it in.

* ``/proc/driver/nvidia/version``: ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ...`` or,
  for the open modules, ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...``;
* ``modinfo MODULE``: ``field: value`` lines (``version``, ``vermagic``, ``filename``);
* ``dkms status``: ``nvidia/550.54.15, 6.1.0-18-amd64, x86_64: installed`` (dkms 3) or
  ``nvidia, 550.54.15, 6.1.0-18-amd64, x86_64: installed`` (dkms 2), with optional ``(WARNING ...)`` tails;
* ``dkms build`` and its ``make.log``: the lines that say why a build failed;
* ``dkms.conf``: ``PACKAGE_NAME``, ``PACKAGE_VERSION`` and ``BUILT_MODULE_NAME[i]``;
* ``dpkg-query -W -f '${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'``: installed packages and versions;
* ``apt-get install -s``: kernel/upgrade.py's ``parse_apt_simulation`` (one parser for both upgrades).
"""

from __future__ import annotations

import re
from typing import Any

# The lines of a failed apt-get or DKMS build that say why: the package kinds' one reader (change/packages.py).
from ansible_collections.gpufleet.inference.plugins.module_utils.change.packages import error_lines

NVRM_RE = re.compile(r"NVRM version:.*?Kernel Module(?: for \S+)?\s+(?P<version>[0-9][0-9A-Za-z.+~-]*)")
DKMS_STATUS_RE = re.compile(
    r"^(?P<module>[^,/\s]+)(?:/|,\s*)(?P<version>[^,\s]+),\s*(?P<kernel>[^,\s]+)(?:,\s*(?P<arch>[^:\s]+))?:\s*"
    r"(?P<state>[A-Za-z-]+)(?P<rest>.*)$")
DKMS_ADDED_RE = re.compile(r"^(?P<module>[^,/\s]+)(?:/|,\s*)(?P<version>[^,:\s]+):\s*(?P<state>added)\s*$")
CONF_RE = re.compile(r"^\s*(?P<key>[A-Z_]+)(?:\[(?P<index>\d+)\])?\s*=\s*(?P<value>.*?)\s*$")
BUILD_LINES_KEPT = 12


def driver_version_from_proc(text: str | None) -> str | None:
    """The kernel module's version in /proc/driver/nvidia/version (None when absent or not NVRM's words)."""
    m = NVRM_RE.search(text or "")
    return m.group("version") if m else None


def parse_modinfo(text: str | None) -> dict[str, str]:
    """``modinfo`` output -> {field: value} (the first value of a repeated field such as ``alias``)."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key and " " not in key.strip() and key.strip() not in out:
            out[key.strip()] = value.strip()
    return out


def parse_dkms_status(text: str | None) -> list[dict[str, Any]]:
    """``dkms status`` -> [{module, version, kernel, arch, state, warning}], dkms 2 and dkms 3 formats; a source that
    is only added (no kernel) has kernel None."""
    out = []
    for line in (text or "").splitlines():
        line = line.strip()
        m = DKMS_STATUS_RE.match(line)
        if m:
            out.append({"module": m.group("module"), "version": m.group("version"), "kernel": m.group("kernel"),
                        "arch": m.group("arch"), "state": m.group("state"), "warning": m.group("rest").strip(" ()") or None})
            continue
        m = DKMS_ADDED_RE.match(line)
        if m:
            out.append({"module": m.group("module"), "version": m.group("version"), "kernel": None, "arch": None,
                        "state": "added", "warning": None})
    return out


def parse_dkms_conf(text: str | None) -> dict[str, Any]:
    """``dkms.conf`` -> {name, version, modules} (PACKAGE_NAME, PACKAGE_VERSION, BUILT_MODULE_NAME[i] in order)."""
    values: dict[str, str] = {}
    modules: dict[int, str] = {}
    for line in (text or "").splitlines():
        m = CONF_RE.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        value = m.group("value").strip("\"'")
        if m.group("key") == "BUILT_MODULE_NAME":
            modules[int(m.group("index") or 0)] = value
        else:
            values.setdefault(m.group("key"), value)
    return {"name": values.get("PACKAGE_NAME"), "version": values.get("PACKAGE_VERSION"),
            "modules": [modules[i] for i in sorted(modules)]}


def build_error_lines(*texts: str | None) -> list[str]:
    """The lines of a failed build (DKMS's output, then its make.log) that say why, each once, the last
    BUILD_LINES_KEPT of them."""
    return error_lines(*texts)[-BUILD_LINES_KEPT:]


def parse_dpkg_query(text: str | None) -> dict[str, str]:
    """``dpkg-query -W -f '${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'`` -> {package: version} of the installed
    ones (status ``ii``, or ``hi`` when held; a package half-configured, ``iF``/``iU``, counts as installed too)."""
    out = {}
    for line in (text or "").splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[2].strip()[1:2] in ("i", "F", "U", "W", "t") and parts[1]:
            out[parts[0].split(":")[0]] = parts[1]
    return out


def upstream(version: str | None) -> str | None:
    """A Debian package version's upstream part: no epoch, no Debian revision (``1:550.54.15-1ubuntu1`` ->
    ``550.54.15``); what the kernel module and NVML report."""
    if not version:
        return None
    v = version.split(":", 1)[1] if ":" in version else version
    return v.rsplit("-", 1)[0] if "-" in v else v

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.driver_verify executes: read the driver's state (NVML's driver version, GPUs and persistence
mode through gpu/readings.py; the loaded module's /proc file; the packages' versions; the kernel log's NVRM lines)
and, given the state read before the change and the expected version, let verify.py judge it. Read-only."""

from __future__ import annotations

from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import PciWalker
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.checks import decide
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.reads import (
    PACKAGE_RE, VERSION_RE, checked, installed_packages, loaded_version,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.verify import verify
from ansible_collections.gpufleet.inference.plugins.module_utils.gpu.readings import read
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.nvml import HAS_PYNVML, NvmlUnavailable, session

DEFAULTS = {"version_file": "/proc/driver/nvidia/version", "include_nvml": "auto", "gpu_vendor": "0x10de",
            "packages": [], "expected_version": None, "before": None}
KERNEL_LOG_KEEP = 200


def execute(params: dict, host: Host, check_mode: bool, nvml_lib=None) -> dict[str, Any]:
    """driver_verify's result: ``state`` (what was read), and with ``expected_version``: ``ok``, ``checks``, ``msg``
    (Failed when a check fails)."""
    p = dict(DEFAULTS, **{k: v for k, v in params.items() if v is not None})
    packages = [checked("packages[]", n, PACKAGE_RE, "a Debian package name") for n in p["packages"]]
    vendor = str(p["gpu_vendor"]).lower()
    if not (vendor.startswith("0x") and len(vendor) == 6 and all(c in "0123456789abcdef" for c in vendor[2:])):
        raise Failed(f"gpu_vendor={p['gpu_vendor']!r} is not a PCI vendor ID (0x10de). Nothing was done.", changed=False)
    before = p["before"]
    if before is not None:
        before = before.get("state", before) if isinstance(before, dict) else None
        if not isinstance(before, dict) or not isinstance(before.get("gpus", {}), dict):
            raise Failed("before must be an earlier driver_verify result (or its state). Nothing was done.",
                         changed=False)
    state = read_state(host, p, packages, vendor, nvml_lib)
    result: dict[str, Any] = {"changed": False, "actions": [], "state": state}
    if p["expected_version"] is None:
        return result
    expected = checked("expected_version", p["expected_version"], VERSION_RE, "a driver version (550.54.15)")
    checks = verify(expected, before or {}, state)
    ok, msg = decide(checks, "verify", "the driver runs but is not the one expected")
    result.update(ok=ok, checks=checks, failed_checks=[c["name"] for c in checks if not c["ok"]], msg=msg)
    if not ok:
        raise Failed(msg, **{k: v for k, v in result.items() if k != "msg"})
    return result


def read_state(host: Host, p: dict, packages: list[str], vendor: str, nvml_lib) -> dict[str, Any]:
    installed = installed_packages(host) if packages else {}
    nvml = read_nvml(host, p["include_nvml"], nvml_lib)
    if nvml["available"]:
        gpus = {b: {"name": g.get("name"), "persistence_mode": g.get("persistence_mode")} for b, g in nvml["gpus"].items()}
        source = "nvml"
    else:
        walker = PciWalker(host.fs)
        gpus = {b: {"name": None, "persistence_mode": None} for b in walker.functions()
                if (walker.basic(b)["vendor"] or "").lower() == vendor and (walker.basic(b)["class"] or "").startswith("0x03")}
        source = "sysfs"
    return {"loaded": loaded_version(host, p["version_file"]), "nvml_version": nvml["driver_version"],
            "nvml_error": nvml["error"], "packages": {n: installed.get(n) for n in packages}, "gpus": gpus,
            "gpu_source": source, "xids": kernel_log(host)}


def read_nvml(host: Host, mode: str, nvml_lib) -> dict[str, Any]:
    none = {"available": False, "driver_version": None, "gpus": {}}
    if mode == "never":
        return dict(none, error="include_nvml is never")
    if nvml_lib is None and (host.fs.root != "/" or (not HAS_PYNVML and mode == "auto")):
        return dict(none, error="nvidia-ml-py (pynvml) is not installed" if host.fs.root == "/" else
                    f"NVML describes the live host, not the tree under root {host.fs.root}")
    try:
        return session(nvml_lib, lambda nv: {"available": True, "error": None, "gpus": read(nv),
                                             "driver_version": _text(nv.nvmlSystemGetDriverVersion())})
    except NvmlUnavailable as err:
        if mode == "always":
            raise Failed(f"NVML could not be read (include_nvml=always): {err}. The driver is not answering: go back to "
                         "the held version.", changed=False) from None
        return dict(none, error=str(err))


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def kernel_log(host: Host) -> list[str]:
    """The kernel log's NVRM lines (dmesg), the last KERNEL_LOG_KEEP of them."""
    if host.cmd.chrooted:  # the kernel log is the live host's, not the tree's
        return []
    dmesg = host.cmd.find("dmesg")
    if dmesg is None:
        return []
    rc, out, _err = host.cmd.run([dmesg])
    return [line for line in out.splitlines() if "NVRM" in line][-KERNEL_LOG_KEEP:] if rc == 0 else []

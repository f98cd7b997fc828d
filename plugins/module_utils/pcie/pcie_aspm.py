# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel's runtime PCIe ASPM policy (``/sys/module/pcie_aspm/parameters/policy``), for
gpufleet.inference.pcie_aspm: pure parsing and planning, set_policy (read, decide, write through a
HostFS, read back), and the module's executor, execute()."""

from __future__ import annotations

import errno
import re
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host

POLICY_FILE = "/sys/module/pcie_aspm/parameters/policy"
POLICIES = ("default", "performance", "powersave", "powersupersave")


def parse_policy(text: str | None) -> tuple[str | None, list[str]]:
    """``default [performance] powersave powersupersave`` -> (``performance``, [all four]).

    A file holding one known word (a tree written by this module) is read as that policy.
    """
    words = (text or "").split()
    available = [w.strip("[]") for w in words if w.strip("[]")]
    current = next((w[1:-1] for w in words if w.startswith("[") and w.endswith("]")), None)
    if current is None and len(words) == 1 and words[0] in POLICIES:
        current, available = words[0], list(POLICIES)
    return current, available


def aspm_off_on_cmdline(cmdline: str | None) -> bool:
    """``pcie_aspm=off``: the kernel leaves ASPM to the firmware and refuses policy changes."""
    return bool(re.search(r"(^|\s)pcie_aspm=off(\s|$)", cmdline or ""))


def plan(current: str | None, available: list[str], wanted: str, cmdline: str | None) -> dict[str, Any]:
    """``{"action": set_policy|None, "skip": reason|None, "error": message|None}``."""
    if current == wanted:
        return {"action": None, "skip": None, "error": None}
    if aspm_off_on_cmdline(cmdline):
        return {"action": None, "error": None,
                "skip": (f"The kernel was booted with pcie_aspm=off, so it does not manage ASPM and refuses policy changes "
                         f"(the policy stays {current}); the firmware's ASPM settings apply. Remove pcie_aspm=off from the "
                         f"command line to let the kernel apply the {wanted} policy.")}
    if wanted not in available:
        return {"action": None, "skip": None,
                "error": f"This kernel offers the ASPM policies {', '.join(available) or 'none'}, not {wanted}."}
    return {"action": {"action": "set_policy", "path": POLICY_FILE, "before": current, "after": wanted},
            "skip": None, "error": None}


class PolicyError(Exception):
    """The policy cannot be read or set; the message says why and what to do."""


def set_policy(fs, wanted: str, check_mode: bool) -> tuple[dict, list[str]]:
    """Read, decide, write, read back. Returns (result, warnings); raises PolicyError."""
    text = fs.read_optional(POLICY_FILE)
    if text is None:
        raise PolicyError(f"{POLICY_FILE} does not exist under root {fs.root}: this kernel has no PCIe ASPM support "
                          "(CONFIG_PCIEASPM), so the firmware alone decides ASPM. Set it in the BIOS, or leave the policy unset.")
    current, available = parse_policy(text)
    decision = plan(current, available, wanted, fs.read_optional("/proc/cmdline"))
    if decision["error"]:
        raise PolicyError(decision["error"])
    result = {"policy": current, "policy_before": current, "available": available, "writable": True, "actions": []}
    warnings = []
    if decision["skip"]:
        result["writable"] = False
        return result, [decision["skip"]]
    if decision["action"] is None:
        return result, warnings
    result["actions"] = [decision["action"]]
    if check_mode:
        result["policy"] = wanted
        return result, warnings
    try:
        fs.write_text(POLICY_FILE, wanted)
    except HostFSError as err:
        if err.errno == errno.EPERM:
            result.update(writable=False, actions=[])
            return result, [f"The kernel refused the ASPM policy {wanted} ({err.strerror}): the firmware does not let the OS "
                            f"control ASPM (the ACPI FADT says so, as on QEMU) or ASPM is off on the command line. The policy "
                            f"stays {current} and the firmware's ASPM settings apply; change them in the BIOS."]
        raise PolicyError(f"Writing {wanted} to {POLICY_FILE} failed: {err.strerror}. Run the module as root (become: true).") from None
    now, _available = parse_policy(fs.read_optional(POLICY_FILE))
    if now != wanted:
        raise PolicyError(f"Wrote {wanted} to {POLICY_FILE} but it reads back {now}: something else sets the ASPM policy "
                          "(a tuned profile, a udev rule); find it and stop it.")
    result["policy"] = now
    return result, warnings


def execute(params: dict, host: Host, check_mode: bool) -> dict:
    """The pcie_aspm module's run: set_policy() on the Host's files, its warnings to ``host.warn``, the diff of the
    policy file (finish() returns it in diff mode only). Raises PolicyError, also for a HostFSError while reading or
    writing (what to do: run as root)."""
    try:
        result, warnings = set_policy(host.fs, params["policy"], check_mode)
    except HostFSError as err:
        raise PolicyError(f"Reading the ASPM policy failed: {err}. Run the module as root (become: true).") from None
    for warning in warnings:
        host.warn(warning)
    result["changed"] = bool(result["actions"])
    result["diff"] = {"before": f"{result['policy_before']}\n", "after": f"{result['policy']}\n",
                      "before_header": POLICY_FILE, "after_header": POLICY_FILE}
    return result

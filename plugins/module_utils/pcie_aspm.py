# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel's runtime PCIe ASPM policy (``/sys/module/pcie_aspm/parameters/policy``), for
gpufleet.inference.pcie_aspm. Pure parsing and planning; the module does the one write."""

from __future__ import annotations

import re
from typing import Any

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

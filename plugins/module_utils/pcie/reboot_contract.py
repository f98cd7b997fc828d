# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The reboot contract shared by the roles that change boot-time state (pure logic).

Each such role exports ``<role>_reboot_required`` and reads ``<role>_reboot_ok`` (default false).
The gpufleet.inference.reboot role reboots a host at most once per play, when some role needs it
and every role that needs it allows it; otherwise it reports which roles wait, without failing.
"""

from __future__ import annotations

from typing import Any

SUFFIX = "_reboot_required"
TRUE = ("1", "true", "yes", "on", "y", "t")


def truthy(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    return str(value).strip().lower() in TRUE


def reboot_plan(names, required, allowed) -> dict[str, Any]:
    """Decide from the ``<role>_reboot_required`` variable names, their values, and the matching
    ``<role>_reboot_ok`` values (same order; a missing one counts as false).

    Returns ``{reboot, pending, needed_by, blocked_by, flags, message}``: ``needed_by`` the roles
    that need a reboot, ``blocked_by`` those of them without permission, ``flags`` the variables to
    clear once the reboot happened.
    """
    names = list(names or [])
    required = list(required or [])
    allowed = list(allowed or [])
    if len(required) != len(names):
        raise ValueError(f"reboot_plan: {len(names)} variable names but {len(required)} values")
    needed, blocked, flags = [], [], []
    for i, name in enumerate(names):
        if not name.endswith(SUFFIX) or name.startswith("_") or not truthy(required[i]):
            continue
        role = name[:-len(SUFFIX)]
        needed.append(role)
        flags.append(name)
        if not truthy(allowed[i] if i < len(allowed) else False):
            blocked.append(role)
    reboot = bool(needed) and not blocked
    if not needed:
        message = "No role needs a reboot."
    elif reboot:
        message = f"Rebooting once for {', '.join(needed)}."
    else:
        oks = " and ".join(f"{r}_reboot_ok: true" for r in blocked)
        message = (f"A reboot is pending for {', '.join(needed)}, but {', '.join(blocked)} "
                   f"{'does' if len(blocked) == 1 else 'do'} not allow it: the new boot-time settings apply only after a "
                   f"reboot. Set {oks} to let gpufleet.inference.reboot reboot the host at the end of the play, or reboot "
                   "it yourself.")
    return {"reboot": reboot, "pending": bool(needed), "needed_by": needed, "blocked_by": blocked, "flags": flags,
            "message": message}

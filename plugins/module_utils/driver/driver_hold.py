# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.driver_hold executes: hold the GPU driver's installed packages (``apt-mark hold``) and keep
unattended-upgrades off them (its own Package-Blacklist, an apt.conf drop-in), or release both. Read, decide, apply
outside check mode, read back: a hold that does not show in ``apt-mark showhold`` afterwards fails the run."""

from __future__ import annotations

from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.holds import UU_DROPIN, dropin, hold_packages
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.reads import (
    PACKAGE_RE, checked, held_packages, installed_packages,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.change.packages import KERNEL_LOCK_DROPIN


def execute(params: dict, host: Host, check_mode: bool) -> dict[str, Any]:
    """driver_hold's result: ``packages`` (the driver's installed packages), ``held`` (those held after the run),
    ``dropin``, ``actions``, ``changed``, ``diff``."""
    extra = [checked("packages[]", n, PACKAGE_RE, "a Debian package name") for n in params.get("packages") or []]
    state = params.get("state") or "held"
    names = hold_packages(list(installed_packages(host)), extra)
    before = held_packages(host)
    before_text = host.fs.read_exact(UU_DROPIN)
    actions = plan(state, names, before, before_text)
    if not names:
        host.warn("no GPU driver package is installed: nothing to hold (name the driver's packages in packages)")
    if state == "released" and host.fs.exists(KERNEL_LOCK_DROPIN):
        host.warn(f"the kernel upgrade's lock ({KERNEL_LOCK_DROPIN}) names the driver's kernel packages too; their "
                  "apt-mark holds are released here, its blacklist stays")
    after = planned_held(state, names, before)
    if not check_mode and actions:
        apply(host, actions)
        after = sorted(set(held_packages(host)) & set(names))
        readback(state, names, after, actions)
    after_text = dropin(names) if state == "held" and names else None
    return {"changed": bool(actions), "actions": actions, "packages": names, "held": after,
            "dropin": {"path": UU_DROPIN, "content": after_text},
            "diff": {"before": {"held": sorted(set(before) & set(names)), UU_DROPIN: before_text or ""},
                     "after": {"held": after, UU_DROPIN: after_text or ""}}}


def plan(state: str, names: list[str], held: list[str], dropin_text: str | None) -> list[dict[str, Any]]:
    """The actions that bring the holds and the drop-in to ``state`` (held or released)."""
    actions: list[dict[str, Any]] = []
    if state == "held":
        missing = [n for n in names if n not in held]
        if missing:
            actions.append({"action": "hold", "packages": missing})
        if names and dropin_text != dropin(names):
            actions.append({"action": "write", "path": UU_DROPIN, "packages": list(names)})
    elif state == "released":
        release = [n for n in names if n in held]
        if release:
            actions.append({"action": "unhold", "packages": release})
        if dropin_text is not None:
            actions.append({"action": "remove", "path": UU_DROPIN})
    else:
        raise Failed(f"state={state!r} is not held or released. Nothing was done.", changed=False)
    return actions


def planned_held(state: str, names: list[str], held: list[str]) -> list[str]:
    """The driver packages held once the plan is applied."""
    return list(names) if state == "held" else []


def apply(host: Host, actions: list[dict[str, Any]]) -> None:
    apt_mark = host.cmd.find("apt-mark", required=True, hint="install apt")
    for a in actions:
        if a["action"] in ("hold", "unhold"):
            rc, out, err = host.cmd.run_in_root([apt_mark, a["action"]] + a["packages"])
            if rc != 0:
                raise Failed(f"apt-mark {a['action']} {' '.join(a['packages'])} failed (rc {rc}): {(err or out).strip()}. "
                             "Fix dpkg's state (dpkg --audit) and run again.", changed=True, actions=actions)
        elif a["action"] == "write":
            host.fs.write_atomic(a["path"], dropin(a["packages"]))
        elif a["action"] == "remove":
            host.fs.remove(a["path"])


def readback(state: str, names: list[str], held: list[str], actions: list[dict[str, Any]]) -> None:
    wrong = [n for n in names if (n in held) != (state == "held")]
    if wrong:
        raise Failed(f"after apt-mark, {', '.join(wrong)} {'is not' if state == 'held' else 'is still'} held "
                     "(apt-mark showhold): another tool changes dpkg's selections; stop it and run again.",
                     changed=True, actions=actions)

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One run of the kernel_boot_entry module: read GRUB, plan the grubenv change, run it, read it back.

execute() reads ``grub.cfg`` and ``grubenv`` through the Host's HostFS, asks kernel/upgrade.py's ``boot_plan()``
which of ``grub-set-default``, ``grub-reboot`` and ``grub-editenv unset next_entry`` to run, runs them
through its HostCmd (chroot under another root, C locale) and reads ``grubenv`` back. Failures are
KernelUpgradeError (bad input, nothing changed) or _host/result.py's Failed (with the actions and the command's rc).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.grub import GRUB_CFG, GRUBENV, parse_grub_cfg, read_grubenv
from ansible_collections.gpufleet.inference.plugins.module_utils._host.commands import HostCmd, ToolMissing
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.upgrade import (
    KernelUpgradeError, boot_plan, validate_version,
)

TOOLS = {"set_default": "grub-set-default", "set_once": "grub-reboot", "clear_once": "grub-editenv"}


def action_argv(cmds: HostCmd, action: dict) -> list[str]:
    """The command of one boot_plan action, as it runs on the host (through chroot under another root)."""
    tool = cmds.find(TOOLS[action["action"]], required=True, hint="install grub2-common")
    argv = [tool, GRUBENV, "unset", "next_entry"] if action["action"] == "clear_once" else [tool, action["entry"]]
    return cmds.argv(argv)


def read_plan(fs: HostFS, version: str, boot: str) -> dict[str, Any]:
    """boot_plan() over the host's GRUB files; KernelUpgradeError when they cannot be used."""
    try:
        cfg = fs.read_optional(GRUB_CFG)
        if cfg is None:
            raise KernelUpgradeError(f"{GRUB_CFG} does not exist under root {fs.root}: this host does not boot through "
                                     "GRUB 2, so there is no entry to select.")
        entries = parse_grub_cfg(cfg)
        env = read_grubenv(fs)
    except HostFSError as err:
        raise Failed(f"Reading the GRUB files under root {fs.root} failed: {err}. Run as root (become: true).") from None
    if not env["valid"]:
        raise KernelUpgradeError(f"{GRUBENV} is not usable ({env['problem']}): recreate it with grub-editenv {GRUBENV} "
                                 "create, then run again.")
    return boot_plan(entries, env["vars"], version, boot)


def predicted(before: dict[str, Any], actions: list[dict]) -> dict[str, Any]:
    """grubenv's saved_entry and next_entry once ``actions`` have run (check mode's answer)."""
    after = dict(before)
    for action in actions:
        if action["action"] == "set_default":
            after["saved_entry"] = action["entry"]
        elif action["action"] == "set_once":
            after["next_entry"] = action["entry"]
        else:
            after["next_entry"] = None
    return after


def apply(fs: HostFS, cmds: HostCmd, plan: dict[str, Any], actions: list[dict], boot: str) -> dict[str, Any]:
    """Run the actions, read grubenv back; its saved_entry and next_entry. Failed when a command or the read-back fails."""
    for action in actions:
        rc, out, err = cmds.run(action["argv"])
        if rc != 0:
            raise Failed(f"'{' '.join(action['argv'])}' exited {rc}: {(err or out).strip()[-600:]}. The boot entry was "
                         f"not changed as asked ({GRUBENV} may be read-only or damaged); check grub-editenv "
                         f"{GRUBENV} list.", rc=rc, stderr=err, actions=actions)
    got = read_grubenv(fs)["vars"]
    want = plan["entry"]["path"]
    key = "saved_entry" if boot == "default" else "next_entry"
    if got.get(key) != want or (boot == "default" and got.get("next_entry")):
        raise Failed(f"{GRUBENV} reads back {key}={got.get(key)!r} and next_entry={got.get('next_entry')!r} after "
                     f"the change, not {want!r}: another tool rewrites it, or the file system drops the write.",
                     actions=actions)
    return {"saved_entry": got.get("saved_entry"), "next_entry": got.get("next_entry")}


def execute(p: dict[str, Any], host: Host, check_mode: bool) -> dict[str, Any]:
    """The module's result: the entry, grubenv after the run (before it in check mode), ``actions`` and ``diff``."""
    fs, cmds = host.fs, host.cmd
    version = validate_version(p["version"], "version")
    plan = read_plan(fs, version, p["boot"])
    try:
        actions = [dict(action, argv=action_argv(cmds, action)) for action in plan["actions"]]
    except ToolMissing as err:
        raise Failed(str(err)) from None
    before = {"saved_entry": plan["saved"], "next_entry": plan["next"]}
    if actions and not check_mode:
        after = apply(fs, cmds, plan, actions, p["boot"])
    else:
        after = predicted(before, actions)
    shown = before if check_mode else after
    return dict(changed=bool(actions), actions=actions, entry=plan["entry"]["path"], title=plan["entry"]["title"],
                saved_entry=shown["saved_entry"], next_entry=shown["next_entry"] or None,
                diff={"before": "".join(f"{k}={v or ''}\n" for k, v in sorted(before.items())),
                      "after": "".join(f"{k}={v or ''}\n" for k, v in sorted(after.items())),
                      "before_header": GRUBENV, "after_header": GRUBENV})

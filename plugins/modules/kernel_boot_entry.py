#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_boot_entry
short_description: Make GRUB boot a kernel by default, or once at the next boot
version_added: 0.1.0
description:
  - Finds the GRUB menu entry that boots O(version) in C(/boot/grub/grub.cfg) (the one in the C(Advanced options) submenu, whose
    id stays the same when newer kernels are installed; the top-level entry always boots the newest) and names it in
    C(/boot/grub/grubenv) by its C(submenu>entry) id.
  - O(boot=default) runs C(grub-set-default) when the saved default is another entry, and clears a pending one-shot entry
    (C(grub-editenv unset next_entry)) so the next boot really is the default.
  - O(boot=once) runs C(grub-reboot), so only the next boot uses the entry; GRUB clears it on the way, and a kernel that does
    not come up is left behind by the next reset, which boots the saved default again.
  - Reads the environment block back after writing it. Never reboots.
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - GRUB 2 with C(GRUB_DEFAULT=saved) (see M(gpufleet.inference.kernel_upgrade_preflight)), C(grub-set-default),
    C(grub-reboot) and C(grub-editenv).
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  version:
    description: The kernel release to boot, as C(uname -r) prints it.
    type: str
    required: true
  boot:
    description: V(default) for every boot from now on, V(once) for the next boot only.
    type: str
    choices: [default, once]
    default: default
seealso:
  - module: gpufleet.inference.kernel_upgrade_preflight
"""

EXAMPLES = r"""
- name: Keep booting the running kernel while a new one is installed
  gpufleet.inference.kernel_boot_entry:
    version: "{{ ansible_facts.kernel }}"
    boot: default

- name: Boot the new kernel once
  gpufleet.inference.kernel_boot_entry:
    version: 6.1.0-56-cloud-amd64
    boot: once
"""

RETURN = r"""
entry:
  description: The entry that boots O(version), in the C(submenu>entry) id form.
  returned: success
  type: str
  sample: gnulinux-advanced-4a1c>gnulinux-6.1.0-56-cloud-amd64-advanced-4a1c
title:
  description: The entry's title.
  returned: success
  type: str
  sample: Debian GNU/Linux, with Linux 6.1.0-56-cloud-amd64
saved_entry:
  description: C(saved_entry) after the task (before it in check mode).
  returned: success
  type: str
  sample: gnulinux-advanced-4a1c>gnulinux-6.1.0-50-cloud-amd64-advanced-4a1c
next_entry:
  description: C(next_entry) after the task (null when none).
  returned: success
  type: str
  sample: gnulinux-advanced-4a1c>gnulinux-6.1.0-56-cloud-amd64-advanced-4a1c
actions:
  description: What was done (or would be done in check mode); C(action) is C(set_default), C(set_once) or C(clear_once), with its C(argv).
  returned: always
  type: list
  elements: dict
  sample: [{action: set_once, entry: "gnulinux-advanced-4a1c>gnulinux-6.1.0-56-cloud-amd64-advanced-4a1c",
            argv: [/usr/sbin/grub-reboot, "gnulinux-advanced-4a1c>gnulinux-6.1.0-56-cloud-amd64-advanced-4a1c"]}]
diff:
  description: The grubenv variables before and after, in diff mode.
  returned: when diff mode is on
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils.grub import GRUB_CFG, GRUBENV, parse_grub_cfg, read_grubenv
from ansible_collections.gpufleet.inference.plugins.module_utils.hostcmd import HostCmd, ToolMissing
from ansible_collections.gpufleet.inference.plugins.module_utils.hostfs import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel_upgrade import KernelUpgradeError, boot_plan, validate_version

TOOLS = {"set_default": "grub-set-default", "set_once": "grub-reboot", "clear_once": "grub-editenv"}


def action_argv(cmds: HostCmd, action: dict) -> list[str]:
    """The command of one boot_plan action, as it runs on the host (through chroot under another root)."""
    tool = cmds.find(TOOLS[action["action"]], required=True, hint="install grub2-common")
    argv = [tool, GRUBENV, "unset", "next_entry"] if action["action"] == "clear_once" else [tool, action["entry"]]
    return cmds.argv(argv)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            version=dict(type="str", required=True),
            boot=dict(type="str", choices=["default", "once"], default="default"),
            root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    fs = HostFS(module.params["root"])
    cmds = HostCmd(module, fs)
    try:
        version = validate_version(module.params["version"], "version")
        cfg = fs.read_optional(GRUB_CFG)
        if cfg is None:
            module.fail_json(msg=f"{GRUB_CFG} does not exist under root {fs.root}: this host does not boot through GRUB 2, "
                                 "so there is no entry to select.")
        entries = parse_grub_cfg(cfg)
        env = read_grubenv(fs)
        if not env["valid"]:
            module.fail_json(msg=f"{GRUBENV} is not usable ({env['problem']}): recreate it with grub-editenv {GRUBENV} create, "
                                 "then run again.")
        plan = boot_plan(entries, env["vars"], version, module.params["boot"])
    except KernelUpgradeError as err:
        module.fail_json(msg=str(err))
    except HostFSError as err:
        module.fail_json(msg=f"Reading the GRUB files under root {fs.root} failed: {err}. Run as root (become: true).")

    try:
        actions = [dict(action, argv=action_argv(cmds, action)) for action in plan["actions"]]
    except ToolMissing as err:
        module.fail_json(msg=str(err))

    before = {"saved_entry": plan["saved"], "next_entry": plan["next"]}
    if actions and not module.check_mode:
        for action in actions:
            rc, out, err = cmds.run(action["argv"])
            if rc != 0:
                module.fail_json(msg=f"'{' '.join(action['argv'])}' exited {rc}: {(err or out).strip()[-600:]}. The boot entry was "
                                     f"not changed as asked ({GRUBENV} may be read-only or damaged); check grub-editenv "
                                     f"{GRUBENV} list.", rc=rc, stderr=err, actions=actions)
        env = read_grubenv(fs)
        got = env["vars"]
        want = plan["entry"]["path"]
        key = "saved_entry" if module.params["boot"] == "default" else "next_entry"
        if got.get(key) != want or (module.params["boot"] == "default" and got.get("next_entry")):
            module.fail_json(msg=f"{GRUBENV} reads back {key}={got.get(key)!r} and next_entry={got.get('next_entry')!r} after "
                                 f"the change, not {want!r}: another tool rewrites it, or the file system drops the write.",
                             actions=actions)
        after = {"saved_entry": got.get("saved_entry"), "next_entry": got.get("next_entry")}
    else:
        after = dict(before)
        for action in actions:
            if action["action"] == "set_default":
                after["saved_entry"] = action["entry"]
            elif action["action"] == "set_once":
                after["next_entry"] = action["entry"]
            else:
                after["next_entry"] = None
    result = dict(changed=bool(actions), actions=actions, entry=plan["entry"]["path"], title=plan["entry"]["title"],
                  saved_entry=after["saved_entry"] if not module.check_mode else before["saved_entry"],
                  next_entry=(after["next_entry"] if not module.check_mode else before["next_entry"]) or None)
    if module._diff:
        result["diff"] = {"before": "".join(f"{k}={v or ''}\n" for k, v in sorted(before.items())),
                          "after": "".join(f"{k}={v or ''}\n" for k, v in sorted(after.items())),
                          "before_header": GRUBENV, "after_header": GRUBENV}
    module.exit_json(**result)


if __name__ == "__main__":
    main()

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

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.kernel_boot_entry import execute
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.upgrade import KernelUpgradeError

ARGUMENT_SPEC = dict(
    version=dict(type="str", required=True),
    boot=dict(type="str", choices=["default", "once"], default="default"),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("kernel_boot_entry", ARGUMENT_SPEC, "reads grub.cfg and writes grubenv through the GRUB tools",
                          (KernelUpgradeError,)), execute)


if __name__ == "__main__":
    main()

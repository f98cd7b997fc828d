#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_cmdline_info
short_description: Compare the kernel arguments every owner asked for with the running kernel's
version_added: 0.1.0
description:
  - Reads what M(gpufleet.inference.kernel_cmdline) recorded (the Debian drop-in C(/etc/default/grub.d/99-gpufleet.cfg), or
    the EL owner record C(/etc/gpufleet/kernel_cmdline.json)) and compares it with C(/proc/cmdline) as sets.
  - The C(gpufleet.inference.reboot) role runs it after a reboot to prove that the running kernel holds every argument asked
    for and none that was removed.
  - Never changes the host.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes_readonly
options:
  owner:
    description: Also report RV(owner_reboot_required) for this owner.
    type: str
"""

EXAMPLES = r"""
- name: Check the running kernel against every owner's arguments
  gpufleet.inference.kernel_cmdline_info:
  register: cmdline

- name: Fail when the running kernel lacks an argument
  ansible.builtin.assert:
    that: cmdline.missing | length == 0
    fail_msg: "Running kernel lacks {{ cmdline.missing | join(' ') }}"
"""

RETURN = r"""
actions:
  description: Always empty; the module changes nothing.
  returned: always
  type: list
  elements: dict
  sample: []
source:
  description: Where the owners were read from, C(dropin), C(state) or C(none).
  returned: success
  type: str
  sample: dropin
owners:
  description: Every owner and its arguments.
  returned: success
  type: dict
  sample: {pcie_link: [pcie_aspm=off]}
wanted:
  description: Every argument the owners want.
  returned: success
  type: list
  elements: str
  sample: [pcie_aspm=off]
current:
  description: The running kernel's arguments.
  returned: success
  type: list
  elements: str
  sample: [BOOT_IMAGE=/boot/vmlinuz-6.1.0-50-cloud-amd64, ro, pcie_aspm=off]
missing:
  description: Wanted arguments the running kernel lacks.
  returned: success
  type: list
  elements: str
  sample: []
unexpected:
  description: Arguments an owner removed that the running kernel still has.
  returned: success
  type: list
  elements: str
  sample: []
pending_removal:
  description: Arguments removed by an owner, with that owner, while they may still be on the command line.
  returned: success
  type: dict
  sample: {"pci=disable_acs_redir=0000:02:00.0": pcie_acs}
reboot_required:
  description: True when RV(missing) or RV(unexpected) is not empty.
  returned: success
  type: bool
  sample: false
owner_reboot_required:
  description: The same for O(owner)'s arguments only.
  returned: when O(owner) is set
  type: bool
  sample: false
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.cmdline import CmdlineError
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.kernel_cmdline_info import execute

ARGUMENT_SPEC = dict(owner=dict(type="str"), root=dict(type="path", default="/"))


def main():
    run_module(ModuleSpec("kernel_cmdline_info", ARGUMENT_SPEC, "reads /proc/cmdline and the kernel argument record",
                          (CmdlineError,)), execute)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pcie_aspm
short_description: Set the kernel's runtime PCIe ASPM policy and read it back
version_added: 0.1.0
description:
  - Writes O(policy) to C(/sys/module/pcie_aspm/parameters/policy) and reads it back. V(performance) turns Active State
    Power Management off on every link the kernel manages, which removes the L0s/L1 exit latency from GPU transfers.
  - The runtime policy is lost at reboot. To keep it, put C(pcie_aspm.policy=<policy>) on the kernel command line with
    M(gpufleet.inference.kernel_cmdline) (the C(gpufleet.inference.pcie_link) role does both).
  - When the kernel refuses the change (booted with C(pcie_aspm=off), or the ACPI FADT says the platform does not let the OS
    control ASPM, as on QEMU), the module changes nothing, warns, and returns RV(writable=false); the firmware's ASPM
    settings then apply.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  policy:
    description: The ASPM policy.
    type: str
    required: true
    choices: [default, performance, powersave, powersupersave]
"""

EXAMPLES = r"""
- name: No ASPM on GPU links, from now on
  gpufleet.inference.pcie_aspm:
    policy: performance
  become: true
"""

RETURN = r"""
actions:
  description: The policy change done, or that would be done in check mode.
  returned: always
  type: list
  elements: dict
  sample: [{action: set_policy, path: /sys/module/pcie_aspm/parameters/policy, before: default, after: performance}]
policy:
  description: The policy in force after the task (read back).
  returned: success
  type: str
  sample: performance
policy_before:
  description: The policy before the task.
  returned: success
  type: str
  sample: default
available:
  description: The policies this kernel offers.
  returned: success
  type: list
  elements: str
  sample: [default, performance, powersave, powersupersave]
writable:
  description: False when the kernel refuses policy changes (C(pcie_aspm=off), or ASPM control denied by the firmware).
  returned: success
  type: bool
  sample: true
diff:
  description: The policy before and after, in diff mode.
  returned: when diff mode is on
  type: dict
  sample: {before: "default\n", after: "performance\n"}
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.pcie_aspm import PolicyError, execute

ARGUMENT_SPEC = dict(
    policy=dict(type="str", required=True, choices=["default", "performance", "powersave", "powersupersave"]),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("pcie_aspm", ARGUMENT_SPEC, "reads and writes the kernel's ASPM policy (sysfs)", (PolicyError,)),
               execute)


if __name__ == "__main__":
    main()

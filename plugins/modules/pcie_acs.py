#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pcie_acs
short_description: Clear ACS P2P redirect on exactly the bridges between the GPUs of a tensor-parallel group
version_added: 0.2.0
description:
  - Finds, from the same PCIe model as M(gpufleet.inference.pcie_facts), the bridges whose Access Control Services
    redirect peer traffic between the GPUs in O(devices) (one tensor-parallel group) up to the root complex. These are the
    switch ports below the GPUs' common switch (C(PIX)/C(PXB) pairs), or the two root ports of a pair on one host bridge
    (C(PHB)). Pairs across host bridges (C(NODE)/C(SYS)) have no such bridge.
  - Clears ReqRedir (RR), CmpltRedir (CR) and EgressCtrl (EC) in their ACS Control register, and nothing else, with
    C(setpci -A linux-sysfs -s BRIDGE ECAP_ACS+6.w=0000:MASK); reads every write back and rolls all of them back when one
    does not take.
  - Records the original ACS Control values on the host (O(state_dir)) before the first write; O(state=default) restores
    them.
  - With O(persist=true) the collection's boot unit C(gpufleet-pcie-payload.service) (shared with
    M(gpufleet.inference.pcie_payload), one file C(/etc/gpufleet/pcie_payload.json)) clears the same bits at every boot,
    before udev loads the GPU drivers, with this module's own module_utils, which its script carries.
  - Returns RV(kernel_args), the boot parameters that do the same while the kernel enumerates the bus
    (C(pci=disable_acs_redir=), Linux 4.19+; C(pci=config_acs=), Linux 6.11+), for M(gpufleet.inference.kernel_cmdline)
    and the reboot contract. C(pci=noacs) is not one of them; mainline Linux has no such option.
  - "Security trade-off: ACS redirect is what lets the IOMMU see, and refuse, peer traffic between devices. With it
    cleared, the GPUs below these bridges can reach each other's memory without the IOMMU, so they belong in one IOMMU
    group and must not be passed to different VMs. The module refuses to run on a host that passes devices to VMs
    (a function bound to vfio-pci, the vfio role's files, C(vfio-pci.ids=) on the command line) unless
    O(force_on_vfio_host=true)."
  - A live write is refused while a process uses a device below the bridges (C(/dev/nvidiaN), C(/dev/dri/*), an open vfio
    group), with the holders named. O(defer_to_boot=true) leaves the change to the boot unit, O(force=true) writes anyway.
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - pciutils (C(setpci)) on the host; Linux with sysfs; root (C(become)).
  - systemd for O(persist=true); the boot script needs Python 3.7 or later (the interpreter the module runs under).
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  devices:
    description:
      - PCI addresses of the GPUs of one tensor-parallel group. Default, every GPU (PCI class C(03), BMC display
        controllers left out).
      - With O(state=default), the recorded bridges on these GPUs' paths are restored (default, every recorded bridge).
    type: list
    elements: str
    default: []
  state:
    description: V(present) clears the redirect bits; V(default) puts back the recorded originals.
    type: str
    choices: [present, default]
    default: present
  persist:
    description: Keep the clear across reboots through the collection's boot unit. V(false) drops the ACS entries from it.
    type: bool
    default: true
  defer_to_boot:
    description: Do not write live; persist the clear for the boot unit and return RV(reboot_required=true). Needs O(persist=true).
    type: bool
    default: false
  force:
    description: Write live even when a process uses a device below the bridges.
    type: bool
    default: false
  force_on_vfio_host:
    description: Clear ACS redirect on a host that passes devices to VMs (see the security trade-off above).
    type: bool
    default: false
  state_dir:
    description: Directory on the host (under O(root)) where the original values are recorded, as C(originals.json).
    type: path
    default: /var/lib/gpufleet/pcie_acs
notes:
  - QEMU's C(pcie-root-port) exposes ACS and the kernel turns RR/CR on there when the IOMMU is on; a bit the emulator keeps
    read-only fails with a message that says so, after the rollback.
seealso:
  - module: gpufleet.inference.pcie_facts
  - module: gpufleet.inference.kernel_cmdline
  - name: Widely copied tuning advice, and what the collection does instead
    description: docs/tuning_myths.md in the collection.
    link: https://github.com/gpufleet/inference/blob/main/docs/tuning_myths.md
"""

EXAMPLES = r"""
- name: Let the four GPUs of the tensor-parallel group reach each other without the root complex
  gpufleet.inference.pcie_acs:
    devices: ['0000:17:00.0', '0000:18:00.0', '0000:19:00.0', '0000:1a:00.0']
  become: true
  register: acs

- name: The same at boot, through the kernel command line (reboot contract)
  gpufleet.inference.kernel_cmdline:
    owner: pcie_acs
    args: "{{ acs.kernel_args }}"
  become: true
  when: acs.kernel_args | length > 0

- name: On a busy host, leave the change to the next boot
  gpufleet.inference.pcie_acs:
    defer_to_boot: true
  become: true

- name: Put ACS back as the kernel set it
  gpufleet.inference.pcie_acs:
    state: default
  become: true
"""

RETURN = r"""
actions:
  description: What was done (or would be), in order. C(set_acs) with C(device), C(before), C(after) and C(argv); file and
    unit steps C(record_originals), C(remove_record), C(write_file), C(remove_file), C(enable_unit), C(disable_unit),
    C(daemon_reload); C(set_at_boot) for deferred writes.
  returned: always
  type: list
  elements: dict
  sample: [{action: set_acs, device: "0000:02:00.0", before: 13, after: 1,
            argv: [/usr/bin/setpci, -A, linux-sysfs, -O, sysfs.path=/sys/bus/pci, -s, "0000:02:00.0", "ECAP_ACS+6.w=0000:000c"]}]
bridges:
  description: Per bridge between the group's GPUs that redirects (or was cleared by this module), ACSCtl before and after
    (read back), the bits cleared and the GPU pairs it sits between.
  returned: success
  type: dict
  sample: {"0000:02:00.0": {ctrl_before: 13, ctrl_after: 1, cleared: [RR, CR], pairs: [["0000:03:00.0", "0000:04:00.0"]]}}
pairs:
  description: Every GPU pair of the group, its level, the bridges on its peer path and those that redirect.
  returned: success
  type: list
  elements: dict
kernel_args:
  description: Boot parameters that clear the same bits while the kernel enumerates the bus, for the running kernel.
  returned: success
  type: list
  elements: str
  sample: ["pci=disable_acs_redir=0000:02:00.0;0000:02:01.0"]
path_users:
  description: Processes that use a device below the bridges to be written.
  returned: success
  type: list
  elements: str
vfio_reasons:
  description: Why the host looks like it passes devices to VMs (empty when it does not).
  returned: success
  type: list
  elements: str
reboot_required:
  description: True when the clear was deferred to the next boot.
  returned: success
  type: bool
persisted:
  description: The ACS entries the boot unit applies.
  returned: success
  type: list
  elements: dict
diff:
  description:
    - First ACS Control per bridge and the persisted bridges before and after, then each file the run writes or removes
      (the record, the persistence configuration, the boot script, the unit) with its text before and after.
  returned: when diff mode is on
  type: list
  elements: dict
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import TopologyError
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.acs import AcsError
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.boot import PERSIST_CONFIG
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.pcie_acs import execute

ARGUMENT_SPEC = dict(
    root=dict(type="path", default="/"),
    devices=dict(type="list", elements="str", default=[]),
    state=dict(type="str", choices=["present", "default"], default="present"),
    persist=dict(type="bool", default=True),
    defer_to_boot=dict(type="bool", default=False),
    force=dict(type="bool", default=False),
    force_on_vfio_host=dict(type="bool", default=False),
    state_dir=dict(type="path", default="/var/lib/gpufleet/pcie_acs"),
)


def main():
    run_module(ModuleSpec("pcie_acs", ARGUMENT_SPEC, f"reads sysfs and writes {PERSIST_CONFIG}, its state_dir and the boot unit",
                          (AcsError, TopologyError)), execute)


if __name__ == "__main__":
    main()

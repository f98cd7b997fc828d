#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_cmdline
short_description: Add and remove kernel command line arguments, one owner per feature
version_added: 0.1.0
description:
  - Keeps the kernel arguments that one owner (a role or feature such as C(pcie_link), C(vfio) or C(hugepages)) asks for in
    the boot configuration, and removes them again with O(state=absent), without touching the arguments of other owners or
    those set outside this module.
  - On Debian and Ubuntu (O(bootloader=grub_dropin)) the arguments live in one drop-in owned by the collection,
    C(/etc/default/grub.d/99-gpufleet.cfg), one line per owner, each appending to C(GRUB_CMDLINE_LINUX_DEFAULT); then
    C(update-grub) (or C(grub-mkconfig -o /boot/grub/grub.cfg)) regenerates C(grub.cfg). The file name sorts after the
    C(50-cloudimg-settings.cfg) of cloud images, which sets C(GRUB_CMDLINE_LINUX_DEFAULT) outright.
  - C(GRUB_CMDLINE_LINUX_DEFAULT) rather than C(GRUB_CMDLINE_LINUX), because only the normal boot entries use it. The
    recovery entries boot without the tuning arguments, which is the way back into a host that one of them (a C(hugepages)
    count too large for the memory, C(vfio-pci.ids) that takes the console GPU) keeps from booting.
  - On EL (O(bootloader=grubby)) C(grubby --update-kernel=ALL --args=... / --remove-args=...) edits every boot entry and
    the default for new kernels; the owners are recorded in C(/etc/gpufleet/kernel_cmdline.json) so that an owner removes
    exactly its own arguments (an argument two owners want stays until both removed it).
  - Compares the wanted arguments of all owners with C(/proc/cmdline) as sets and returns RV(reboot_required); arguments
    an owner removed count as well while the running kernel still has them, also on later runs.
  - Validates every argument (C(flag) or C(key=value), no whitespace, quotes or shell metacharacters) and refuses
    conflicting ones across all owners, such as C(pcie_aspm=off) with C(pcie_aspm=force), before it changes anything.
  - Never reboots. Roles export RV(owner_reboot_required) as C(<role>_reboot_required) for the C(gpufleet.inference.reboot)
    role.
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - GRUB 2 with C(/etc/default/grub) and C(update-grub) or C(grub-mkconfig) (Debian, Ubuntu), or C(grubby) (EL 8 and later).
  - With O(root) other than C(/), the bootloader tool runs through C(chroot) inside O(root).
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  owner:
    description:
      - Name of the role or feature that owns O(args), lower case letters, digits and C(_). Each owner's arguments are kept
        and removed separately.
    type: str
    required: true
  args:
    description:
      - The owner's arguments, each C(flag) or C(key=value) as one list item, for example C(iommu=pt), C(pcie_aspm=off),
        C(hugepagesz=1G), C(hugepages=16), C(pci=disable_acs_redir=0000:02:00.0), C(vfio-pci.ids=10de:2335).
      - "Only letters, digits and these characters: C(_ . , : / + @ % = -)."
      - The list replaces what the owner had; arguments it no longer names are removed.
      - Ignored with O(state=absent).
    type: list
    elements: str
    default: []
  state:
    description:
      - V(present) keeps exactly O(args) for O(owner) (an empty list removes them).
      - V(absent) removes every argument of O(owner).
    type: str
    choices: [present, absent]
    default: present
  bootloader:
    description:
      - V(grub_dropin) for Debian and Ubuntu, V(grubby) for EL.
      - V(auto) takes V(grubby) when C(grubby) is installed, else V(grub_dropin) when C(/etc/default/grub) exists and
        C(update-grub) or C(grub-mkconfig) is installed, and fails otherwise.
      - On a host without GRUB 2 and grubby (systemd-boot, a unified kernel image, a cloud provider's direct kernel boot)
        a run with no argument to add (O(args) empty or O(state=absent)) and none of O(owner) recorded to remove changes
        nothing and says so in RV(msg) (RV(bootloader) is C(none)); a run that asks for arguments fails, naming what to
        do by hand.
    type: str
    choices: [auto, grub_dropin, grubby]
    default: auto
notes:
  - Changes take effect at the next boot. Reboot through the C(gpufleet.inference.reboot) role (the reboot contract),
    which reboots once per play when allowed and then checks C(/proc/cmdline).
  - Arguments set outside this module (in C(/etc/default/grub), or by hand with grubby) are left alone; when one of them
    gives a key another value than an owner wants, the module warns (the argument written later, ours, is the one most
    kernel parameters honour).
  - grubby keeps one value per key, so on EL a key may appear only once across all owners (C(hugepagesz) pairs included).
  - A hand-edited drop-in is rewritten from the owners' lines; lines that are not an owner's line are dropped with a warning.
seealso:
  - module: gpufleet.inference.kernel_cmdline_info
  - name: The reboot contract
    description: docs/reboot_contract.md in the collection.
    link: https://github.com/gpufleet/inference/blob/main/docs/reboot_contract.md
"""

EXAMPLES = r"""
- name: Turn ASPM off at boot (the pcie_link role owns this)
  gpufleet.inference.kernel_cmdline:
    owner: pcie_link
    args: [pcie_aspm=off]
  become: true
  register: cmdline

- name: Export the reboot contract's flag
  ansible.builtin.set_fact:
    pcie_link_reboot_required: "{{ cmdline.owner_reboot_required }}"

- name: IOMMU pass-through and vfio for two NVIDIA functions
  gpufleet.inference.kernel_cmdline:
    owner: vfio
    args: [intel_iommu=on, iommu=pt, "vfio-pci.ids=10de:2335,10de:22a3"]
  become: true

- name: One-GiB huge pages, reserved at boot
  gpufleet.inference.kernel_cmdline:
    owner: hugepages
    args: [default_hugepagesz=1G, hugepagesz=1G, hugepages=64]
  become: true

- name: Remove everything the vfio feature added
  gpufleet.inference.kernel_cmdline:
    owner: vfio
    state: absent
  become: true
"""

RETURN = r"""
actions:
  description:
    - What was done (or would be done in check mode), in order. C(action) is one of C(write_dropin), C(remove_dropin),
      C(update_grub), C(grubby_add), C(grubby_remove), C(write_state), C(remove_state); commands carry their C(argv).
  returned: always
  type: list
  elements: dict
  sample: [{action: write_dropin, path: /etc/default/grub.d/99-gpufleet.cfg},
           {action: update_grub, path: /boot/grub/grub.cfg, reason: drop-in changed, argv: [/usr/sbin/update-grub]}]
bootloader:
  description:
    - The bootloader path used, C(grub_dropin) or C(grubby); C(none) when the host has no bootloader this module drives
      and there was nothing to add or remove.
  returned: success
  type: str
  sample: grub_dropin
msg:
  description: Why nothing was done, when RV(bootloader) is C(none).
  returned: when RV(bootloader) is C(none)
  type: str
  sample: "Nothing to do for owner pcie_link: no argument to add or remove, and this module cannot drive this host's bootloader: ..."
reboot_required:
  description:
    - True when the running kernel's arguments (C(/proc/cmdline)) lack an argument any owner wants, or still hold one an
      owner removed.
  returned: success
  type: bool
  sample: true
owner_reboot_required:
  description: The same, for the arguments of O(owner) only. Roles export it as C(<role>_reboot_required).
  returned: success
  type: bool
  sample: true
wanted:
  description: Every argument all owners want, after this task.
  returned: success
  type: list
  elements: str
  sample: [pcie_aspm=off, intel_iommu=on, iommu=pt]
current:
  description: The arguments of the running kernel, from C(/proc/cmdline).
  returned: success
  type: list
  elements: str
  sample: [BOOT_IMAGE=/boot/vmlinuz-6.1.0-50-cloud-amd64, root=UUID=0f1e, ro, console=ttyS0]
missing:
  description: Wanted arguments the running kernel does not have.
  returned: success
  type: list
  elements: str
  sample: [pcie_aspm=off]
unexpected:
  description: Arguments an owner removed that the running kernel still has.
  returned: success
  type: list
  elements: str
  sample: []
owners:
  description: Every owner and its arguments as recorded after this task.
  returned: success
  type: dict
  sample: {pcie_link: [pcie_aspm=off], vfio: [intel_iommu=on, iommu=pt]}
diff:
  description: The drop-in (Debian) or the owner record (EL) before and after, in diff mode.
  returned: when diff mode is on
  type: dict
  sample: {before: "", after: "GRUB_CMDLINE_LINUX_DEFAULT=\"${GRUB_CMDLINE_LINUX_DEFAULT} pcie_aspm=off\" # gpufleet-owner=pcie_link\n",
           before_header: /etc/default/grub.d/99-gpufleet.cfg, after_header: /etc/default/grub.d/99-gpufleet.cfg}
"""


from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.cmdline import CmdlineError
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.kernel_cmdline import execute

ARGUMENT_SPEC = dict(
    owner=dict(type="str", required=True),
    args=dict(type="list", elements="str", default=[]),
    state=dict(type="str", choices=["present", "absent"], default="present"),
    bootloader=dict(type="str", choices=["auto", "grub_dropin", "grubby"], default="auto"),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("kernel_cmdline", ARGUMENT_SPEC, "reads /proc/cmdline and the boot configuration and writes "
                          "/etc/default/grub.d, /boot/grub and /etc/gpufleet (or runs grubby)", (CmdlineError,)), execute)


if __name__ == "__main__":
    main()

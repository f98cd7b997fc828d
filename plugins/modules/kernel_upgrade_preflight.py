#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_upgrade_preflight
short_description: Decide whether a host may take a new kernel through a one-shot GRUB boot
version_added: 0.1.0
description:
  - Reads what a safe kernel switch depends on and returns one check per condition, each with C(ok), the C(reason) and, when
    it fails, the C(fix). Nothing is installed or booted; the role C(gpufleet.inference.kernel_upgrade) acts on the answer.
  - C(grub_default) - C(GRUB_DEFAULT=saved) as grub-mkconfig ends up with it (C(/etc/default/grub), then
    C(/etc/default/grub.d/*.cfg) in order, last assignment wins), and C(GRUB_SAVEDEFAULT) not true. C(grub-reboot) and
    C(grub-set-default) need the saved default. With O(fix_grub_default=true) the module writes
    C(/etc/default/grub.d/98-gpufleet-kernel-upgrade.cfg) and runs C(update-grub) (behind check mode).
  - C(grubenv) - C(/boot/grub/grubenv) is a valid 1024-byte environment block, writable, and not on LVM, MD RAID, btrfs or
    ZFS, where GRUB cannot clear the one-shot entry at boot.
  - C(boot_space) - free space in the file system holding C(/boot) against the running kernel's files there times 1.3 plus
    16 MiB (or O(boot_space_mb)).
  - C(old_kernel) - the running kernel stays installed (C(/boot/vmlinuz-<v>), C(/lib/modules/<v>)), a GRUB entry boots it,
    and installing the target would not remove its package (from C(apt-get install -s)).
  - C(target) - the target kernel is installed already, or its package is installable (C(apt-get install -s)).
  - C(driver) - where a GPU driver module (O(driver_modules), C(nvidia) by default) is used, a module file for the target
    kernel exists under C(/lib/modules/<target>/) (O(phase=installed)), or DKMS will build one (O(phase=preflight)).
  - C(in_progress) - no upgrade was left half-way. With an upgrade journal (C(/var/lib/gpufleet/kernel_upgrade/journal.json))
    the check passes and says which stage the role resumes; a corrupt journal fails it. Without a journal, a host that
    runs a kernel other than its saved GRUB default fails it, with what to do (reboot into the default, or make the
    running kernel the default).
  - Returns the GRUB entries, which entry boots the running and the target kernel (the C(submenu>entry) id form), the saved
    default and the pending one-shot entry, the installed kernels and the held packages.
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - Debian or Ubuntu with GRUB 2 (C(grub-pc) or C(grub-efi)), C(apt-get) and C(apt-mark).
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  target:
    description: The kernel release to move to, as C(uname -r) prints it (for example C(6.1.0-56-cloud-amd64)).
    type: str
    required: true
  package:
    description: The package that installs O(target); default C(linux-image-<target>).
    type: str
  package_version:
    description: An exact package version to install (C(apt-get install PACKAGE=VERSION)); empty for the candidate.
    type: str
    default: ""
  phase:
    description:
      - V(preflight) before anything is installed; V(installed) after the install, before the reboot (the target must now be
        installed, with its GRUB entry and its driver module).
    type: str
    choices: [preflight, installed]
    default: preflight
  fix_grub_default:
    description: Write the drop-in that sets C(GRUB_DEFAULT=saved) and run C(update-grub) when the check fails (an opt-in).
    type: bool
    default: false
  boot_space_mb:
    description: MiB the new kernel needs in C(/boot); V(0) estimates it from the running kernel's files.
    type: int
    default: 0
  driver:
    description:
      - V(auto) checks the driver when one of O(driver_modules) is loaded now (C(/sys/module/<name>)); V(required) always;
        V(none) never.
    type: str
    choices: [auto, required, none]
    default: auto
  driver_modules:
    description: Names of the GPU driver's kernel modules.
    type: list
    elements: str
    default: [nvidia]
notes:
  - EL (grubby, dnf versionlock) is not supported yet; the module fails there with that message.
seealso:
  - module: gpufleet.inference.kernel_boot_entry
"""

EXAMPLES = r"""
- name: May this host take 6.1.0-56-cloud-amd64?
  gpufleet.inference.kernel_upgrade_preflight:
    target: 6.1.0-56-cloud-amd64
  register: preflight

- name: Stop on a failed check (the message lists each reason and its fix)
  ansible.builtin.fail:
    msg: "{{ preflight.msg }}"
  when: not preflight.ok

- name: After the install, before the reboot
  gpufleet.inference.kernel_upgrade_preflight:
    target: 6.1.0-56-cloud-amd64
    phase: installed
    driver: required
"""

RETURN = r"""
ok:
  description: Every check passed.
  returned: success
  type: bool
  sample: false
msg:
  description: The verdict in words; on failure every failed check with its reason and fix.
  returned: success
  type: str
  sample: "preflight failed, the host stays on its kernel: target: linux-image-6.1.0-99-cloud-amd64 cannot be installed: ..."
checks:
  description: One per condition, in order; C(name), C(ok), C(reason), C(fix) (empty when ok).
  returned: success
  type: list
  elements: dict
  sample: [{name: grub_default, ok: true, reason: "GRUB_DEFAULT=saved (set in /etc/default/grub), ...", fix: ""}]
failed_checks:
  description: Names of the failed checks.
  returned: success
  type: list
  elements: str
  sample: [target]
running:
  description: The running kernel release.
  returned: success
  type: str
  sample: 6.1.0-50-cloud-amd64
target:
  description: The target release.
  returned: success
  type: str
  sample: 6.1.0-56-cloud-amd64
package:
  description: The package that installs the target.
  returned: success
  type: str
  sample: linux-image-6.1.0-56-cloud-amd64
running_package:
  description: The package of the running kernel.
  returned: success
  type: str
  sample: linux-image-6.1.0-50-cloud-amd64
target_installed:
  description: The target kernel is installed.
  returned: success
  type: bool
  sample: false
installed:
  description: Installed kernel releases, oldest first.
  returned: success
  type: list
  elements: str
  sample: [6.1.0-50-cloud-amd64]
running_entry:
  description: The GRUB entry (C(submenu>entry) id) that boots the running kernel.
  returned: success
  type: str
  sample: gnulinux-advanced-4a1c>gnulinux-6.1.0-50-cloud-amd64-advanced-4a1c
target_entry:
  description: The GRUB entry that boots the target, null until it is installed.
  returned: success
  type: str
  sample: null
default_version:
  description: The kernel the saved default boots (null when it names no entry).
  returned: success
  type: str
  sample: 6.1.0-50-cloud-amd64
saved_entry:
  description: C(saved_entry) of grubenv.
  returned: success
  type: str
  sample: gnulinux-advanced-4a1c>gnulinux-6.1.0-50-cloud-amd64-advanced-4a1c
next_entry:
  description: C(next_entry) of grubenv (a pending one-shot boot), or null.
  returned: success
  type: str
  sample: null
held:
  description: Packages on hold (C(apt-mark showhold)).
  returned: success
  type: list
  elements: str
  sample: [linux-image-6.1.0-50-cloud-amd64]
driver_required:
  description: Whether the driver check applied.
  returned: success
  type: bool
  sample: false
dkms_modules:
  description: The modules DKMS holds (C(/var/lib/dkms)); the kernel upgrade installs the target's headers for them.
  returned: success
  type: list
  elements: str
  sample: [nvidia]
entries:
  description: The GRUB menu entries (title, id, path, version, recovery).
  returned: success
  type: list
  elements: dict
actions:
  description: What was done or would be done (only with O(fix_grub_default)).
  returned: always
  type: list
  elements: dict
  sample: [{action: write_dropin, path: /etc/default/grub.d/98-gpufleet-kernel-upgrade.cfg}, {action: update_grub, argv: [/usr/sbin/update-grub]}]
"""


from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.kernel_upgrade_preflight import execute

ARGUMENT_SPEC = dict(
    target=dict(type="str", required=True),
    package=dict(type="str"),
    package_version=dict(type="str", default=""),
    phase=dict(type="str", choices=["preflight", "installed"], default="preflight"),
    fix_grub_default=dict(type="bool", default=False),
    boot_space_mb=dict(type="int", default=0),
    driver=dict(type="str", choices=["auto", "required", "none"], default="auto"),
    driver_modules=dict(type="list", elements="str", default=["nvidia"]),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("kernel_upgrade_preflight", ARGUMENT_SPEC, "reads /boot, /lib/modules, the GRUB files and the "
                          "package manager's answer, and writes the GRUB_DEFAULT=saved drop-in on request"), execute)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: driver_upgrade_preflight
short_description: Decide whether a host may take a candidate GPU driver, by building its DKMS module first
version_added: 0.3.0
description:
  - Returns one check per condition, each with C(ok), the C(reason) and, when it fails, the C(fix), and fails when one
    fails, before anything changes. The playbook C(playbooks/driver_upgrade.yml) acts on the answer.
  - C(candidate) - C(apt-get install -s) installs every package of O(packages) at O(version) (held packages may change,
    as the driver is held between upgrades) and removes nothing; apt's own C(E) lines when it cannot.
  - C(build_<kernel>) - the candidate's DKMS module builds for the running kernel and for every pending kernel
    (installed, newer than the running one). The DKMS package is fetched with C(apt-get install --download-only) into a
    private directory under O(workdir), unpacked with C(dpkg-deb -x) and built with C(dkms add) and C(dkms build)
    C(--dkmstree --sourcetree) there (DKMS's way to build without touching the system's tree); the directory is
    removed after. A build that fails is refused with DKMS's and the compiler's lines and the end of C(make.log).
  - C(versions) - the candidate's packages and the module built from it carry one upstream version (C(modinfo) of the
    built module), so that the user space will match the kernel module (no "Driver/library version mismatch").
  - C(boot_space) - C(/boot) holds a rebuilt initramfs beside the largest of the running and pending kernels' (times
    1.3 plus 16 MiB, as the kernel upgrade counts).
  - Also returns the driver now (the loaded module's version from O(version_file), the version of the module file
    C(modprobe) would load, the packages' installed versions).
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - apt, dpkg, dkms and kmod on a Debian or Ubuntu host; the headers of each kernel the module must build for.
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes_readonly
notes:
  - The trial builds take as long as the driver's DKMS build takes (minutes for NVIDIA's), once per kernel.
  - The docs page C(docs/driver_upgrade.md) says what is locked, what is checked and how the upgrade goes back.
options:
  packages:
    description:
      - The driver packages to upgrade, all to O(version) (for example C(nvidia-driver) and C(nvidia-kernel-dkms)).
    type: list
    elements: str
    required: true
  version:
    description: The candidate version of the packages, as apt names it (C(550.54.15-1)).
    type: str
    required: true
  dkms_package:
    description:
      - The package that carries the kernel module's DKMS source; by default the first of O(packages), then of the
        packages apt would install, whose name ends in C(-dkms).
    type: str
  kernel_module:
    description: The driver's main kernel module (its C(modinfo) is read for the current state).
    type: str
    default: nvidia
  version_file:
    description: The loaded driver's version file (NVRM's words).
    type: path
    default: /proc/driver/nvidia/version
  build_kernels:
    description:
      - C(running_and_pending) builds for the running kernel and every installed newer one; C(running) for the running
        kernel only.
    type: str
    choices: [running_and_pending, running]
    default: running_and_pending
  workdir:
    description: The directory under which the private build directory is made (and removed).
    type: path
    default: /var/tmp
  log_lines:
    description: How many of the last lines of a failed build's C(make.log) the result keeps (0 to 400).
    type: int
    default: 40
"""

EXAMPLES = r"""
- name: May this host take driver 550.54.15?
  gpufleet.inference.driver_upgrade_preflight:
    packages: [nvidia-driver, nvidia-kernel-dkms]
    version: 550.54.15-1
  register: driver_preflight

- name: The lab's stand-in driver
  gpufleet.inference.driver_upgrade_preflight:
    packages: [gpufleet-nvidia-standin-utils, gpufleet-nvidia-standin-dkms]
    version: "1.1"
    kernel_module: gpufleet_nvidia
    version_file: /proc/driver/gpufleet_nvidia/version
"""

RETURN = r"""
ok:
  description: Whether every check passed (the module fails when not).
  returned: always
  type: bool
  sample: true
msg:
  description: The checks in words; the failed ones with their fixes.
  returned: always
  type: str
  sample: "preflight failed, nothing was changed: build_6.1.0-50-cloud-amd64: gpufleet-nvidia/1.3 does not build ..."
checks:
  description: One entry per check, with C(name), C(ok), C(reason) and C(fix).
  returned: always
  type: list
  elements: dict
  sample: [{name: candidate, ok: true, reason: "apt can install nvidia-driver=550.54.15-1 ...", fix: ""}]
failed_checks:
  description: The names of the failed checks.
  returned: always
  type: list
  elements: str
  sample: [build_6.1.0-50-cloud-amd64]
kernels:
  description: The running kernel and the pending ones the module was built for.
  returned: always
  type: dict
  sample: {running: 6.1.0-50-cloud-amd64, pending: [6.1.0-56-cloud-amd64]}
builds:
  description:
    - One trial build per kernel - C(kernel), C(module), C(version) (DKMS's), C(headers), C(ok), C(rc), C(lines) (the
      error lines), C(log) (the end of C(make.log) when it failed), C(make_log) (where it was, in the removed private
      tree) and C(module_version) (C(modinfo) of the built module).
  returned: always
  type: list
  elements: dict
  sample: [{kernel: 6.1.0-50-cloud-amd64, module: nvidia, version: 550.54.15, headers: true, ok: true, rc: 0,
            lines: [], log: [], module_version: 550.54.15}]
current:
  description: The driver now - C(loaded) (the loaded module's version), C(module_file) (the version C(modprobe) would
    load) and C(packages) (each package's installed version, null when not installed).
  returned: always
  type: dict
  sample: {loaded: 535.161.08, module_file: 535.161.08, packages: {nvidia-driver: 535.161.08-1}}
candidate:
  description: The candidate - its C(version), C(packages) and the C(installs) apt would make (name, version).
  returned: always
  type: dict
  sample: {version: 550.54.15-1, packages: [nvidia-driver], installs: [[nvidia-driver, 550.54.15-1]]}
actions:
  description: Always empty - the module changes nothing on the host.
  returned: always
  type: list
  elements: dict
  sample: []
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.driver_upgrade_preflight import execute

ARGUMENT_SPEC = dict(
    packages=dict(type="list", elements="str", required=True),
    version=dict(type="str", required=True),
    dkms_package=dict(type="str"),
    kernel_module=dict(type="str", default="nvidia"),
    version_file=dict(type="path", default="/proc/driver/nvidia/version"),
    build_kernels=dict(type="str", choices=["running_and_pending", "running"], default="running_and_pending"),
    workdir=dict(type="path", default="/var/tmp"),
    log_lines=dict(type="int", default=40),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("driver_upgrade_preflight", ARGUMENT_SPEC, "asks apt, unpacks the candidate's DKMS package and "
                          "builds it in a private directory under workdir"), execute)


if __name__ == "__main__":
    main()

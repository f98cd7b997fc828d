#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: driver_verify
short_description: Read the GPU driver's state, and check it after an upgrade against the state before
version_added: 0.3.0
description:
  - Reads the driver's state - NVML's driver version and, for every GPU, its name and persistence mode (through the
    collection's NVML reader, the one C(gpu_health) uses); the loaded module's version (O(version_file)); the installed
    versions of O(packages); the kernel log's NVRM lines (C(dmesg)). Where NVML cannot be read (no nvidia-ml-py, a VM),
    the GPUs are the PCI functions of vendor O(gpu_vendor) and a display class from sysfs, and persistence is not
    measured (said in the check).
  - Without O(expected_version) it only returns the state (run it before the change and keep the result).
  - With O(expected_version) and O(before) it checks, and fails when a check fails - C(driver_version) (the loaded
    module, NVML and the packages all say the expected upstream version), C(gpus_present) (every GPU present before is
    present), C(persistence) (a GPU in persistence mode before still is) and C(xid) (no Xid line in the kernel log that
    was not there before; Xid 48, 62, 63, 64, 74, 79, 92, 94, 95 ... named as in the health audit).
  - Never changes the host.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes_readonly
options:
  expected_version:
    description: The driver version that must run now (C(550.54.15) or the package's C(550.54.15-1)).
    type: str
  before:
    description: The result of this module run before the change (or its RV(state)).
    type: dict
  packages:
    description: The driver's user-space packages whose installed version must be the expected one.
    type: list
    elements: str
    default: []
  version_file:
    description: The loaded driver's version file (NVRM's words).
    type: path
    default: /proc/driver/nvidia/version
  include_nvml:
    description: C(auto) reads NVML where it can; C(always) fails without it; C(never) reads sysfs only.
    type: str
    choices: [auto, always, never]
    default: auto
  gpu_vendor:
    description: The PCI vendor of the GPUs counted from sysfs when NVML is not read.
    type: str
    default: "0x10de"
"""

EXAMPLES = r"""
- name: The driver before the upgrade
  gpufleet.inference.driver_verify:
    packages: [nvidia-driver]
  register: driver_before

- name: The driver after it
  gpufleet.inference.driver_verify:
    packages: [nvidia-driver]
    expected_version: 550.54.15
    before: "{{ driver_before }}"
"""

RETURN = r"""
state:
  description:
    - What was read - C(loaded), C(nvml_version), C(nvml_error), C(packages) (name to version), C(gpus) (address to
      name and persistence mode), C(gpu_source) (C(nvml) or C(sysfs)) and C(xids) (the kernel log's NVRM lines).
  returned: always
  type: dict
  sample: {loaded: 580.159.04, nvml_version: 580.159.04, nvml_error: null, packages: {},
           gpus: {"0000:00:06.0": {name: NVIDIA H200, persistence_mode: 1}}, gpu_source: nvml, xids: []}
ok:
  description: Whether every check passed (with O(expected_version)).
  returned: when expected_version is given
  type: bool
  sample: true
checks:
  description: One entry per check with C(name), C(ok), C(reason) and C(fix).
  returned: when expected_version is given
  type: list
  elements: dict
  sample: [{name: driver_version, ok: true, reason: "the loaded module, NVML all say 580.159.04", fix: ""}]
failed_checks:
  description: The names of the failed checks.
  returned: when expected_version is given
  type: list
  elements: str
  sample: []
msg:
  description: The checks in words.
  returned: when expected_version is given
  type: str
  sample: "verify passed: ..."
actions:
  description: Always empty - the module only reads.
  returned: always
  type: list
  elements: dict
  sample: []
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.driver_verify import execute

ARGUMENT_SPEC = dict(
    expected_version=dict(type="str"),
    before=dict(type="dict"),
    packages=dict(type="list", elements="str", default=[]),
    version_file=dict(type="path", default="/proc/driver/nvidia/version"),
    include_nvml=dict(type="str", choices=["auto", "always", "never"], default="auto"),
    gpu_vendor=dict(type="str", default="0x10de"),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("driver_verify", ARGUMENT_SPEC, "reads NVML, /proc, sysfs, dpkg and the kernel log"), execute)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_boot_health
short_description: Install or remove the host-local commit-or-revert unit of a candidate kernel
version_added: 0.2.0
description:
  - With O(state=present), before the one-shot boot into O(target), writes C(/etc/gpufleet/boot-health.json),
    C(gpufleet-boot-health.service) and C(gpufleet-boot-health.timer) (both with C(ConditionKernelVersion=<target>)) and
    enables the timer. Under the candidate kernel the check script (C(/usr/local/libexec/gpufleet-boot-health), which the
    role copies first) reboots the host into the saved GRUB default when the controller has not committed within
    O(commit_timeout) of its last contact, when the GPU driver module is not loaded, when C(nvidia-smi) fails, or when
    the inference server's unit failed. A host the controller cannot reach thus returns to the old kernel by itself.
  - O(state=present) also removes the previous check's result file, so that an earlier revert is never read as this one.
  - With O(state=absent) (after the commit and after a rollback), disables the timer and removes the files. It is refused,
    and nothing is changed, while the host runs the guarded candidate and the saved GRUB default does not boot it (the
    unit would be all that can revert it); the rollback reboots into the old kernel first.
  - Files are written durably (temp file, fsync, rename, fsync of the directory).
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  state:
    description: V(present) installs the unit, V(absent) removes it.
    type: str
    choices: [present, absent]
    default: present
  target:
    description:
      - The candidate kernel release (required with O(state=present)), as C(uname -r) prints it - major.minor, then only
        letters, digits and C(. _ + ~ -), 64 characters at most (it is written into the units; a space, newline or
        glob is refused).
    type: str
  old:
    description: The old kernel release (the saved default the host returns to), for the record.
    type: str
    default: ""
  commit_timeout:
    description:
      - Seconds after the controller's last contact (or after boot, whichever is later) before an uncommitted
        candidate reverts. 120 to 86400.
      - The deadline is measured on the candidate boot's own clock (seconds since boot, with the boot id the controller
        recorded in the journal), never on the wall clock; a deadline the check cannot read reverts, as a passed one does.
    type: int
    default: 1800
  driver_modules:
    description: GPU driver modules that must be loaded under the candidate when O(gpu_required).
    type: list
    elements: str
    default: [nvidia]
  gpu_required:
    description: The host uses a GPU driver module (the old kernel had one loaded); then the module and C(nvidia-smi) are checked.
    type: bool
    default: false
  vllm_unit:
    description:
      - The inference server's systemd unit that must be healthy (empty - not checked). A name that is no unit file on the
        host is left out of the check, with a warning.
    type: str
    default: ""
  vllm_grace:
    description: Seconds after boot the unit may take to become active.
    type: int
    default: 900
"""

EXAMPLES = r"""
- name: Install the boot-health unit before the one-shot boot
  gpufleet.inference.kernel_boot_health:
    target: 6.1.0-56-cloud-amd64
    old: 6.1.0-50-cloud-amd64
    commit_timeout: 1800
    gpu_required: true
    vllm_unit: vllm.service

- name: Remove it after the commit
  gpufleet.inference.kernel_boot_health:
    state: absent
"""

RETURN = r"""
files:
  description: The files the unit consists of.
  returned: success
  type: list
  elements: str
  sample: [/etc/gpufleet/boot-health.json, /etc/systemd/system/gpufleet-boot-health.service]
actions:
  description: What was done (or would be done in check mode).
  returned: always
  type: list
  elements: dict
  sample: [{action: write, path: /etc/systemd/system/gpufleet-boot-health.timer}, {action: run, argv: [systemctl, daemon-reload]}]
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.kernel_boot_health import BootHealthError, execute

ARGUMENT_SPEC = dict(
    state=dict(type="str", choices=["present", "absent"], default="present"),
    target=dict(type="str"),
    old=dict(type="str", default=""),
    commit_timeout=dict(type="int", default=1800),
    driver_modules=dict(type="list", elements="str", default=["nvidia"]),
    gpu_required=dict(type="bool", default=False),
    vllm_unit=dict(type="str", default=""),
    vllm_grace=dict(type="int", default=900),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("kernel_boot_health", ARGUMENT_SPEC, "writes systemd units under /etc/systemd/system and runs "
                          "systemctl", (BootHealthError,)), execute)


if __name__ == "__main__":
    main()

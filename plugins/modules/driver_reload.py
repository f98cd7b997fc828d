#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: driver_reload
short_description: Activate an installed GPU driver by reloading its kernel modules, never under a running process
version_added: 0.3.0
description:
  - Reads who holds the GPU - every process with a device file under O(device_prefix) open, from C(/proc/<pid>/fd) - and
    refuses (fails, nothing changed) while any process outside O(stop_services) does, naming each (pid, command,
    systemd unit, device). It never stops, signals or kills such a process; drain the host or reboot instead.
  - Otherwise stops O(stop_services) that hold the devices (C(nvidia-persistenced) by design), runs C(modprobe -r) on
    the loaded modules of O(modules) last-first and C(modprobe) first-last, and starts the services again.
  - Reads back the driver's version file; with O(expected_version) a driver that does not say it fails the run.
  - Nothing to do when the loaded driver already says O(expected_version).
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - kmod (modprobe) and systemd.
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
attributes:
  diff_mode:
    support: none
    details: The module changes loaded modules, not files; RV(before) and RV(after) are the versions.
options:
  modules:
    description: The driver's kernel modules in load order.
    type: list
    elements: str
    default: [nvidia, nvidia_uvm, nvidia_modeset, nvidia_drm]
  device_prefix:
    description: Device files whose holders block the reload (C(/dev/nvidia) covers nvidia0, nvidiactl, nvidia-uvm).
    type: str
    default: /dev/nvidia
  stop_services:
    description: Units whose processes may hold the devices and are stopped for the reload and started after.
    type: list
    elements: str
    default: [nvidia-persistenced.service]
  version_file:
    description: The loaded driver's version file (NVRM's words).
    type: path
    default: /proc/driver/nvidia/version
  expected_version:
    description: The version the reloaded driver must say (its upstream part is compared).
    type: str
"""

EXAMPLES = r"""
- name: Activate the installed driver without a reboot where nothing uses the GPU
  gpufleet.inference.driver_reload:
    expected_version: 550.54.15
"""

RETURN = r"""
before:
  description: The loaded driver's version before (null when not loaded).
  returned: always
  type: str
  sample: 535.161.08
after:
  description: Its version after (the expected one in check mode).
  returned: success
  type: str
  sample: 550.54.15
holders:
  description: The processes that had a device file open (pid, comm, unit, device).
  returned: always
  type: list
  elements: dict
  sample: [{pid: 812, comm: nvidia-persiste, unit: nvidia-persistenced.service, device: /dev/nvidia0}]
reloaded:
  description: The modules loaded again.
  returned: success
  type: list
  elements: str
  sample: [nvidia, nvidia_uvm]
actions:
  description: What was done (or would be) in order - C(stop)/C(start) with C(unit), C(unload)/C(load) with C(module).
  returned: always
  type: list
  elements: dict
  sample: [{action: unload, module: nvidia}, {action: load, module: nvidia}]
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.driver_reload import execute

ARGUMENT_SPEC = dict(
    modules=dict(type="list", elements="str", default=["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]),
    device_prefix=dict(type="str", default="/dev/nvidia"),
    stop_services=dict(type="list", elements="str", default=["nvidia-persistenced.service"]),
    version_file=dict(type="path", default="/proc/driver/nvidia/version"),
    expected_version=dict(type="str"),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("driver_reload", ARGUMENT_SPEC, "reads /proc and unloads and loads kernel modules"), execute)


if __name__ == "__main__":
    main()

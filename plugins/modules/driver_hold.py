#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: driver_hold
short_description: Hold the GPU driver's packages and keep unattended-upgrades off them
version_added: 0.3.0
description:
  - Finds the GPU driver's installed packages - the kernel side the kernel upgrade's lock holds too (C(nvidia-driver*),
    C(nvidia-kernel-*), C(nvidia-dkms-*), C(nvidia-open*), C(cuda-drivers*), C(linux-modules-nvidia-*), any C(*-dkms))
    and the user space (C(libnvidia-*), C(nvidia-utils*), C(libcuda1), C(nvidia-persistenced), C(nvidia-fabricmanager),
    ...) - plus O(packages) where installed.
  - With O(state=held), runs C(apt-mark hold) on those not held yet and writes
    C(/etc/apt/apt.conf.d/51gpufleet-driver-lock), an C(Unattended-Upgrade::Package-Blacklist) of them (C(apt-mark hold)
    alone is not what every unattended-upgrades version honours). With O(state=released), C(apt-mark unhold) and the
    drop-in removed.
  - Reads back C(apt-mark showhold) after the change and fails when a hold did not take.
  - apt clears the hold of a package it installs by name (C(--allow-change-held-packages)); the driver upgrade holds the
    packages again right after each install, and the drop-in keeps unattended-upgrades off them throughout.
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - apt and dpkg (Debian, Ubuntu).
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  packages:
    description: More package names to hold with the driver's (where installed), for example a stand-in's.
    type: list
    elements: str
    default: []
  state:
    description: C(held) holds them and writes the drop-in; C(released) unholds them and removes it.
    type: str
    choices: [held, released]
    default: held
"""

EXAMPLES = r"""
- name: Hold the NVIDIA driver between upgrades
  gpufleet.inference.driver_hold:

- name: Hold the lab's stand-in driver as well
  gpufleet.inference.driver_hold:
    packages: [gpufleet-nvidia-standin-utils]
"""

RETURN = r"""
packages:
  description: The driver's installed packages the module manages.
  returned: always
  type: list
  elements: str
  sample: [libnvidia-compute-550, nvidia-dkms-550, nvidia-utils-550]
held:
  description: Those held after the run (as C(apt-mark showhold) reads; planned in check mode).
  returned: always
  type: list
  elements: str
  sample: [libnvidia-compute-550, nvidia-dkms-550, nvidia-utils-550]
dropin:
  description: The unattended-upgrades drop-in's C(path) and C(content) (null when released).
  returned: always
  type: dict
  sample: {path: /etc/apt/apt.conf.d/51gpufleet-driver-lock, content: "Unattended-Upgrade::Package-Blacklist {...};"}
actions:
  description:
    - What was done (or would be, in check mode), in order - C(hold)/C(unhold) with C(packages), C(write) with C(path)
      and C(content), C(remove) with C(path).
  returned: always
  type: list
  elements: dict
  sample: [{action: hold, packages: [nvidia-dkms-550]}]
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.driver_hold import execute

ARGUMENT_SPEC = dict(
    packages=dict(type="list", elements="str", default=[]),
    state=dict(type="str", choices=["held", "released"], default="held"),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("driver_hold", ARGUMENT_SPEC, "runs apt-mark and writes an apt.conf drop-in"), execute)


if __name__ == "__main__":
    main()

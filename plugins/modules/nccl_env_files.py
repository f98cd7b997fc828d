#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nccl_env_files
short_description: Write the NCCL configuration and EnvironmentFile, read them back, check the per-user override
version_added: 0.2.0
description:
  - Writes the file NCCL reads (O(conf_path), C(/etc/nccl.conf)) and the EnvironmentFile of the systemd units
    (O(env_file)) whole, owned by root with mode C(0644), creating the EnvironmentFile's directory (C(0755)); each
    atomically (a temporary file renamed over the old one).
  - Outside check mode it reads both files back and fails unless they hold exactly what was written, the first with
    C(NCCL_NVLS_ENABLE=0) and the second with the C(CUDA_DEVICE_ORDER) of O(settings).
  - Warns when O(user_conf) (C(/root/.nccl.conf)) exists, since NCCL reads it instead of O(conf_path) for root's processes.
  - The contents come from the C(gpufleet.inference.nccl_env) filter; the C(gpufleet.inference.nccl_env) role runs
    this module once per host for everything above.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  conf_path:
    description: The file NCCL reads.
    type: path
    default: /etc/nccl.conf
  conf_content:
    description: Its whole content.
    type: str
    required: true
  env_file:
    description: The EnvironmentFile that systemd units load; its directory is created.
    type: path
    default: /etc/gpufleet/nccl.env
  env_content:
    description: Its whole content.
    type: str
    required: true
  settings:
    description: The resolved settings (C(KEY) to value) the contents render; the read-back checks their C(CUDA_DEVICE_ORDER).
    type: dict
    required: true
  user_conf:
    description: The per-user NCCL file that would override O(conf_path) for root.
    type: path
    default: /root/.nccl.conf
"""

EXAMPLES = r"""
- name: Write the NCCL settings and read them back
  gpufleet.inference.nccl_env_files:
    conf_content: "{{ __nccl.nccl_conf }}"
    env_content: "{{ __nccl.env_file }}"
    settings: "{{ __nccl.settings }}"
  vars:
    __nccl: "{{ 'pcie_safe' | gpufleet.inference.nccl_env }}"
  become: true
"""

RETURN = r"""
actions:
  description: What was done, or would be done in check mode, to each path.
  returned: always
  type: list
  elements: dict
  sample: [{action: create_directory, path: /etc/gpufleet, after: "0755"}, {action: create, path: /etc/gpufleet/nccl.env,
           after: "0644"}, {action: write, path: /etc/nccl.conf}, {action: set_mode, path: /etc/nccl.conf,
           before: "0600", after: "0644"}]
files:
  description: The two files, O(conf_path) then O(env_file).
  returned: success
  type: list
  elements: str
  sample: [/etc/nccl.conf, /etc/gpufleet/nccl.env]
user_conf_exists:
  description: Whether O(user_conf) exists (a warning says so).
  returned: success
  type: bool
  sample: false
read_back:
  description: Whether the files were read back and checked (not in check mode).
  returned: success
  type: bool
  sample: true
diff:
  description: Per changed path, its text (files) or state and attributes (directory, modes, owners) before and after.
  returned: when diff mode is on and something changes
  type: list
  elements: dict
  sample: [{before: "", after: "# Managed by Ansible ...\nNCCL_NVLS_ENABLE=0\n", before_header: /etc/nccl.conf,
           after_header: /etc/nccl.conf}]
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.nccl.nccl_env_files import NcclFilesError, execute

ARGUMENT_SPEC = dict(
    root=dict(type="path", default="/"),
    conf_path=dict(type="path", default="/etc/nccl.conf"),
    conf_content=dict(type="str", required=True),
    env_file=dict(type="path", default="/etc/gpufleet/nccl.env"),
    env_content=dict(type="str", required=True),
    settings=dict(type="dict", required=True),
    user_conf=dict(type="path", default="/root/.nccl.conf"),
)


def main():
    run_module(ModuleSpec("nccl_env_files", ARGUMENT_SPEC, "writes and reads back /etc/nccl.conf and the NCCL EnvironmentFile",
                          (NcclFilesError,)), execute)


if __name__ == "__main__":
    main()

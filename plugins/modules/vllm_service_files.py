#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_service_files
short_description: Write the vLLM service's environment, secret file and unit, read them back, stamp the NCCL checksum
version_added: 0.2.0
description:
  - Creates O(config_dir) (root, C(0755)) and writes, each whole and atomically (a temporary file renamed over the
    old one), owned by root, C(<config_dir>/<name>.env) (C(0644)) with O(env_content), C(<config_dir>/<name>.secret.env)
    (C(0600)) with O(secret_content), or removes that file when O(secret_content) is empty, and the unit
    C(<unit_dir>/<name>.service) (C(0644)) with O(unit_content).
  - O(unit_content) must hold the line C(# NCCL environment <nccl_env_file>:) once; the module completes it with
    C(sha1 HEX) of O(nccl_env_file) as it is on the host, or C(absent). A change of the NCCL settings so changes the
    unit, and the role's handler restarts the service once.
  - Outside check mode it reads every file back and fails unless each holds exactly what was written (and the secret
    file is gone when unwanted). The secret file's text is never shown, in the diff or anywhere else.
  - Returns whether the unit existed before the run and the NCCL file's setting lines, which the role's verify
    compares with the live process's environment.
  - The C(gpufleet.inference.vllm_service) role runs this module once per host for everything above.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  name:
    description: The service's name, without C(.service); it names the unit and the environment files.
    type: str
    required: true
  config_dir:
    description: The directory of the environment files; created when missing.
    type: path
    required: true
  env_content:
    description: The whole text of C(<name>.env), the service's plain environment.
    type: str
    required: true
  secret_content:
    description: The whole text of C(<name>.secret.env) (the API key and the secret variables); empty removes the file.
    type: str
    default: ""
  unit_content:
    description: The whole text of the unit, with its NCCL stamp line left for the module to complete.
    type: str
    required: true
  unit_dir:
    description: The directory of the unit.
    type: path
    default: /etc/systemd/system
  nccl_env_file:
    description: The nccl_env role's EnvironmentFile, whose checksum the unit records (it may be absent).
    type: path
    default: /etc/gpufleet/nccl.env
"""

EXAMPLES = r"""
- name: Write the environment, the secret file and the unit
  gpufleet.inference.vllm_service_files:
    name: vllm
    config_dir: /etc/gpufleet/vllm
    env_content: "HF_HUB_OFFLINE=1\n"
    unit_content: "{{ lookup('ansible.builtin.template', 'vllm.service.j2') }}"
  register: vllm_files
  notify: restart vllm
  become: true
"""

RETURN = r"""
actions:
  description: What was done, or would be done in check mode, to each path (no file text).
  returned: always
  type: list
  elements: dict
  sample: [{action: write, path: /etc/systemd/system/vllm.service}, {action: remove, path: /etc/gpufleet/vllm/vllm.secret.env}]
files:
  description: The files in place after the run (the environment, the unit, the secret file when wanted).
  returned: success
  type: list
  elements: str
  sample: [/etc/gpufleet/vllm/vllm.env, /etc/systemd/system/vllm.service]
secret_file:
  description: Whether the secret file is wanted (written) or not (removed).
  returned: success
  type: bool
  sample: false
unit_existed:
  description: Whether the unit was there before this run (check mode can preview a service only then).
  returned: success
  type: bool
  sample: true
nccl_env:
  description: The NCCL EnvironmentFile as read (path, exists, sha1, its setting lines).
  returned: success
  type: dict
  sample: {path: /etc/gpufleet/nccl.env, exists: true, sha1: 0d1c..., lines: [NCCL_P2P_LEVEL=PHB, CUDA_DEVICE_ORDER=PCI_BUS_ID]}
read_back:
  description: Whether the files were read back and checked (not in check mode).
  returned: success
  type: bool
  sample: true
diff:
  description: Per changed path its text before and after (the secret file by its size only), or a directory's state.
  returned: when diff mode is on and something changes
  type: list
  elements: dict
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.vllm.vllm_service_files import VllmFilesError, execute

ARGUMENT_SPEC = dict(
    root=dict(type="path", default="/"),
    name=dict(type="str", required=True),
    config_dir=dict(type="path", required=True),
    env_content=dict(type="str", required=True),
    secret_content=dict(type="str", default="", no_log=True),
    unit_content=dict(type="str", required=True),
    unit_dir=dict(type="path", default="/etc/systemd/system"),
    nccl_env_file=dict(type="path", default="/etc/gpufleet/nccl.env"),
)


def main():
    run_module(ModuleSpec("vllm_service_files", ARGUMENT_SPEC, "writes and reads back the vLLM service's environment "
                          "files and unit", (VllmFilesError,)), execute)


if __name__ == "__main__":
    main()

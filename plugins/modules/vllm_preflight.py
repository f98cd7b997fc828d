#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_preflight
short_description: Check a vLLM service's model path and port before it is (re)started
version_added: 0.1.0
description:
  - Run before the vLLM unit is written or restarted, so that a bad setting fails here and a running service keeps
    running.
  - The model must be a directory with a C(config.json) (a Hugging Face model directory) or a C(.gguf) file, readable
    by the service user, and, with O(protect_home), not under C(/home), C(/root) or C(/run/user), which the unit's
    C(ProtectHome=yes) hides.
  - The port must be free on O(host), or held by O(unit) itself (a restart frees it). The module tries to bind the
    address, and when that fails it names the holder from C(/proc/net/tcp) and C(/proc/*/fd), with its PID, command
    line and systemd unit, or, when the process table is hidden, its user.
  - With O(expect_ours), the port must be held by O(unit), the check that a running service is the one answering.
  - Never changes the host.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes_readonly
options:
  model:
    description: The model directory or C(.gguf) file on the host, or a hub id with O(model_is_path=false).
    type: str
    required: true
  model_is_path:
    description: The model is a local path (checked); false for a hub id (not checked).
    type: bool
    default: true
  host:
    description: The address the service binds.
    type: str
    default: 127.0.0.1
  port:
    description: The port the service binds.
    type: int
    required: true
  unit:
    description: The systemd unit of the service; a port held by its processes counts as free.
    type: str
    required: true
  user:
    description: The service user; the model must be readable by it. When it does not exist yet the check uses the
      permissions for others.
    type: str
  protect_home:
    description: The unit sets C(ProtectHome=yes), so a model under C(/home), C(/root) or C(/run/user) is refused.
    type: bool
    default: true
  expect_ours:
    description: Fail unless O(unit) holds the port.
    type: bool
    default: false
  model_pending:
    description:
      - In check mode only, an earlier task of the same run puts the model in place (a copy or sync that check mode
        only previewed). A model path that does not exist yet is then reported with C(kind=pending) and a warning
        instead of failing, and the port is still checked. Ignored in a real run, where the model must be there.
    type: bool
    default: false
notes:
  - In an unprivileged container, root may not read other users' C(/proc/PID/fd); the holder is then named by the
    socket's user only, and a listener owned by O(user) while O(unit) is active counts as the unit's.
"""

EXAMPLES = r"""
- name: Check the model and the port before touching the unit
  gpufleet.inference.vllm_preflight:
    model: /srv/models/DeepSeek-V3
    port: 8000
    host: 0.0.0.0
    unit: vllm.service
    user: vllm
  become: true

- name: Prove that the running service holds its port
  gpufleet.inference.vllm_preflight:
    model: /srv/models/DeepSeek-V3
    port: 8000
    unit: vllm.service
    user: vllm
    expect_ours: true
  become: true
"""

RETURN = r"""
actions:
  description: Always empty; the module changes nothing.
  returned: always
  type: list
  elements: dict
  sample: []
model:
  description: What was found at the model path.
  returned: success
  type: dict
  sample: {path: /srv/models/tiny-llama, kind: directory, config: true, readable_by: vllm}
port:
  description: The port's state. C(listeners) are the sockets listening on it, with their holder.
  returned: success
  type: dict
  sample:
    free: false
    ours: true
    listeners: [{address: 127.0.0.1, port: 8000, uid: 999, user: vllm, pids: [4242], command: "/opt/gpufleet/vllm/current/bin/python -m vllm...",
                 unit: vllm.service}]
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
# The checks live in module_utils/vllm/vllm_preflight.py; their names stay importable from here (tests).
from ansible_collections.gpufleet.inference.plugins.module_utils.vllm.vllm_preflight import (  # noqa: F401 pylint: disable=unused-import
    bind_probe, check_model, check_port, execute, listeners, overlaps, parse_proc_net, unit_active, unit_of,
)


ARGUMENT_SPEC = dict(
    model=dict(type="str", required=True),
    model_is_path=dict(type="bool", default=True),
    host=dict(type="str", default="127.0.0.1"),
    port=dict(type="int", required=True),
    unit=dict(type="str", required=True),
    user=dict(type="str"),
    protect_home=dict(type="bool", default=True),
    expect_ours=dict(type="bool", default=False),
    model_pending=dict(type="bool", default=False),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("vllm_preflight", ARGUMENT_SPEC, "reads the model's files and /proc", (ValueError,)), execute)


if __name__ == "__main__":
    main()

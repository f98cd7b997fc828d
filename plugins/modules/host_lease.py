#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_lease
short_description: Take, renew, release or break a host's lease, so that one run at a time reboots it or writes its devices
version_added: 0.2.0
description:
  - Keeps a small JSON lease on the host (C(/var/lib/gpufleet/lease.json)) naming the run that holds it, its operator,
    its play and its expiry. It lives on the host, so it holds across reboots and a lost controller.
  - A second run is refused while the lease is held (the message names the holder) and nothing is changed.
  - An expired lease is broken only on request (O(break_expired=true) or O(state=broken)); a lease that has not expired is
    never broken.
  - The file is written durably (temp file, fsync, rename, fsync of the directory).
  - Taking, renewing, releasing and breaking are exclusive - of two runs that ask at the same moment exactly one wins. The
    lease is read, decided on and written under an C(flock) of the lock file beside it (O(path) with C(.lock) added,
    created on the first change and never removed), then read back - a lease that names another run after the write
    fails the task. A refusal and check mode take no lock and write nothing.
  - A lease file that is not a lease (not JSON, no run id, an expiry that is not a time from 0 to 253402300799, such as
    NaN or Infinity) is refused with nothing changed; O(state=broken) or O(break_expired=true) replaces it.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  state:
    description:
      - V(acquired) takes the lease (or renews it when this run holds it); V(renewed) extends it and fails, naming the
        holder, when this run no longer holds it (it never takes or breaks a lease); V(released) removes it when this run
        holds it; V(broken) takes over an expired lease; V(query) only reads it.
      - In check mode V(renewed) of a free lease plans a take, since the check-mode take before it wrote nothing.
    type: str
    choices: [acquired, renewed, released, broken, query]
    default: acquired
  run_id:
    description: The run that holds the lease (the playbook's run id).
    type: str
    required: true
  operator:
    description: Who runs it (shown to a second run that is refused).
    type: str
    default: ""
  play:
    description: What it runs (shown to a second run that is refused).
    type: str
    default: ""
  ttl:
    description:
      - Seconds the lease lasts from now, from 60 to 604800 (one week); renew it before then. It must cover the longest
        step between two renewals (a reboot, a benchmark).
    type: int
    default: 7200
  break_expired:
    description: With O(state=acquired), take over a lease whose holder let it expire.
    type: bool
    default: false
  holder:
    description:
      - The controller process that takes the lease (C(controller), C(pid), C(pid_start)), from the lookup
        C(gpufleet.inference.controller_run); kept in the lease so that a re-run on the same controller can tell a dead
        holder from a live one.
    type: dict
  take_over:
    description:
      - The run id of a holder the controller found dead (C(gpufleet.inference.controller_run) V(dead_holder)); its lease,
        expired or not, passes to this run. Empty - no takeover.
    type: str
    default: ""
  path:
    description: The lease file on the host.
    type: path
    default: /var/lib/gpufleet/lease.json
"""

EXAMPLES = r"""
- name: Take the host's lease for this rollout
  gpufleet.inference.host_lease:
    run_id: "{{ kernel_upgrade_run_id }}"
    operator: "{{ lookup('env', 'USER') }}"
    play: kernel_upgrade
    ttl: 7200

- name: Release it at the end
  gpufleet.inference.host_lease:
    run_id: "{{ kernel_upgrade_run_id }}"
    state: released
"""

RETURN = r"""
lease:
  description: The lease after the task (null once released).
  returned: success
  type: dict
  sample: {run_id: 20261201T201500Z, operator: ops, play: kernel_upgrade, taken_at: 1796155200.0, expires_at: 1796162400.0, ttl: 7200}
previous:
  description: The lease before the task (null when there was none).
  returned: success
  type: dict
what:
  description: C(acquired), C(renewed), C(released), C(broken), C(taken_over) or C(unchanged).
  returned: success
  type: str
  sample: acquired
actions:
  description: What was done (or would be done in check mode).
  returned: always
  type: list
  elements: dict
  sample: [{action: write_lease, path: /var/lib/gpufleet/lease.json, what: acquired}]
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.lease.host_lease import LeaseError, execute

ARGUMENT_SPEC = dict(
    state=dict(type="str", choices=["acquired", "renewed", "released", "broken", "query"], default="acquired"),
    run_id=dict(type="str", required=True),
    operator=dict(type="str", default=""),
    play=dict(type="str", default=""),
    ttl=dict(type="int", default=7200),
    break_expired=dict(type="bool", default=False),
    holder=dict(type="dict"),
    take_over=dict(type="str", default=""),
    path=dict(type="path", default="/var/lib/gpufleet/lease.json"),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("host_lease", ARGUMENT_SPEC, "reads and writes the lease file", (LeaseError,)), execute)


if __name__ == "__main__":
    main()

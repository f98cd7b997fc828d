#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nccl_change_step
short_description: One step of the crash-safe NCCL settings change - read the host's journal, decide, write it, say what to do next
version_added: 0.3.0
description:
  - A change of the NCCL settings (the C(gpufleet.inference.nccl_env) profile, its settings and the P2P choice) on a
    running vLLM service, as a state machine kept on the host, on the change flow every kind of change shares
    (docs/change_flow.md, docs/nccl_change.md). The controller reports what it just did (O(event) and O(data)); the
    module reads the two NCCL files (O(conf_path), O(env_file); bytes, mode, owner), the environment of O(unit)'s main
    process (C(systemctl show -p MainPID), then C(/proc/PID/environ)) and the journal
    C(/var/lib/gpufleet/nccl_change/journal.json), decides, writes the journal durably (temp file, fsync, rename, fsync
    of the directory) and returns RV(next_action). A controller lost at any point resumes on the next run from the
    recorded stage, with the recorded baseline, or executes the recorded verdict.
  - A set of settings is named C(nccl-) and 12 hex digits of the SHA-256 of its managed view (every C(NCCL_*) variable
    and the other variables the old or the candidate settings name); RV(running) names the view of the process's
    environment, RV(target) the candidate's.
  - Check first, before anything changes - the candidate O(settings) through nccl_env's validation (unknown keys, bad
    values, NVLink multicast on) and the host lint's NCCL rules (a forced protocol or algorithm, a thread count NCCL
    ignores; each refused unless O(allow_findings) names its code); a service that runs other settings than its files
    hold (a restart pending, another EnvironmentFile) is refused too.
  - The flow - the baseline on the settings the service runs (more runs while the gate asks, or a stop with nothing
    changed), the PCIe audit and the output reference, the files' original bytes kept in the journal, the candidate
    written and read back (V(install)), the unit restarted (V(activate)), its environment holding exactly the
    candidate's values and vllm_ready proving it serves (a new start-log finding fails the verification, or is named in
    the verdict with O(findings=note)), the candidate's benchmark rounds, the outputs and the host's health, the serving
    verdict; V(pass) is committed, anything else puts the original bytes back (a file that did not exist is removed),
    restarts the unit and checks the original environment. No reboot.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
  - gpufleet.inference.change_step
options:
  target:
    description: The name of the candidate settings (the C(gpufleet.inference.nccl_env) filter's C(id)); it must name
      O(settings).
  settings:
    description: The candidate NCCL settings (C(KEY) to value), as the C(gpufleet.inference.nccl_env) filter resolves
      them (its C(settings)).
    type: dict
    required: true
  allow_unknown:
    description: Newer NCCL keys accepted without a value check (C(nccl_env_allow_unknown)).
    type: list
    elements: str
    default: []
  allow_findings:
    description: Codes of the host lint's NCCL findings (C(nccl_proto_forced), C(nccl_algo_forced), C(nccl_nthreads))
      the candidate may carry all the same.
    type: list
    elements: str
    default: []
  unit:
    description: The systemd unit that serves with these settings (its main process's environment is verified).
    type: str
    default: vllm.service
  conf_path:
    description: The file NCCL reads.
    type: path
    default: /etc/nccl.conf
  env_file:
    description: The EnvironmentFile O(unit) loads.
    type: path
    default: /etc/gpufleet/nccl.env
  event:
    choices: [start, locked, benchmarked, audited, outputs, checked, committed, rolled_back, error, installed, activated]
  data:
    description:
      - The event's data. V(benchmarked) - C(label), C(samples), C(files), C(nccl) (the name of the settings measured),
        C(concurrency), C(contaminated), C(failed), C(requests), C(latency), C(server), C(config), C(client). V(audited) -
        C(findings), C(pcie). V(outputs) - C(reference), C(model), C(band), C(aa). V(installed) - C(install) (the
        write's C(failed), C(msg)), C(ready_before) (vllm_ready's answer on the old settings, with its C(kernel_path)).
        V(activated) - C(restart) (C(failed), C(msg)), C(ready) (vllm_ready's answer on the candidate - C(ok), C(msg),
        C(kernel_path)). V(checked) - C(outputs), C(pcie), C(kernel_log). V(committed)/V(rolled_back) - C(locked),
        C(server), C(files). V(error) - C(msg).
  restart_ok:
    description: The explicit yes to write the files and restart the service; without it the answer is the plan
      (C(planned)).
    type: bool
    default: false
  lock:
    description: Answer the V(lock) action at the start (NCCL settings hold no package; the nccl_env role refuses to
      write while a change is open).
  verify_pcie:
    default: false
  findings:
    description:
      - What a start-log finding of the candidate (warning or error, from vllm_ready's kernel path) that the old settings
        did not have does - V(fail) fails the verification (rolled back as V(verify_failed)), V(note) names it in the
        verdict's reason.
    type: str
    choices: [fail, note]
    default: fail
  journal:
    default: /var/lib/gpufleet/nccl_change/journal.json
"""

EXAMPLES = r"""
- name: Start (or resume) the NCCL change to P2P off
  gpufleet.inference.nccl_change_step:
    target: "{{ ('p2p_off' | gpufleet.inference.nccl_env).id }}"
    settings: "{{ ('p2p_off' | gpufleet.inference.nccl_env).settings }}"
    event: start
    restart_ok: true
    run_id: "{{ nccl_change_run_id }}"
  register: step

- name: Report the restart and the candidate's readiness
  gpufleet.inference.nccl_change_step:
    target: "{{ ('p2p_off' | gpufleet.inference.nccl_env).id }}"
    settings: "{{ ('p2p_off' | gpufleet.inference.nccl_env).settings }}"
    event: activated
    data:
      restart: {failed: false}
      ready: "{{ ready_on_candidate }}"
    restart_ok: true
    run_id: "{{ nccl_change_run_id }}"
"""

RETURN = r"""
next_action:
  description:
    - What the controller does next. C(name) is one of C(lock), C(benchmark) (C(label), C(runs), C(seed),
      C(measured_only), C(concurrency)), C(audit), C(outputs), C(install) (C(version), C(settings)), C(activate)
      (C(version), C(restart)), C(check) (C(outputs), C(stability), C(reference)), C(commit) (C(version)), C(rollback)
      (C(version), C(restart), C(files) - each C(path), C(state) V(file) or V(absent), C(content), C(mode), C(uid),
      C(gid)), C(finish) (C(decision), C(reason), C(ok)).
  returned: success
  type: dict
  sample: {name: activate, version: nccl-3f2a9c1e07b4, restart: true}
journal:
  description: The journal after the step (null when no change is in progress).
  returned: success
  type: dict
record:
  description: What the role's record keeps (C(kind) V(nccl), stage, old settings' name, baseline, candidate, gate,
    decision, reason, C(verdict) with the serving verdict's C(parts), C(serving_verdict) for the history).
  returned: success
  type: dict
running:
  description: The name of the settings O(unit)'s main process runs (null when it has none or its environment cannot be
    read).
  returned: success
  type: str
  sample: nccl-9d1c07aa41e2
target:
  description: The name of the candidate settings.
  returned: success
  type: str
  sample: nccl-3f2a9c1e07b4
pid:
  description: O(unit)'s main process (null when it has none).
  returned: success
  type: int
  sample: 4242
environ:
  description: The managed view of that process's environment (C(NCCL_*) and the other keys the settings name).
  returned: success
  type: dict
  sample: {CUDA_DEVICE_ORDER: PCI_BUS_ID, NCCL_NVLS_ENABLE: "0", NCCL_P2P_LEVEL: PXB}
files:
  description: The two files, O(conf_path) then O(env_file).
  returned: success
  type: list
  elements: str
  sample: [/etc/nccl.conf, /etc/gpufleet/nccl.env]
actions:
  description:
    - What was written (or would be in check mode), in order. C(renew_lease), C(take_over_journal), C(write_journal);
      when the change ends, C(archive_journal) and C(remove_journal).
  returned: always
  type: list
  elements: dict
  sample: [{action: write_journal, path: /var/lib/gpufleet/nccl_change/journal.json, stage: baseline}]
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.change.flow import FlowError
from ansible_collections.gpufleet.inference.plugins.module_utils.change.step import step_argument_spec
from ansible_collections.gpufleet.inference.plugins.module_utils.nccl.nccl_change_step import EVENTS, execute

ARGUMENT_SPEC = step_argument_spec(
    EVENTS, "/var/lib/gpufleet/nccl_change/journal.json",
    settings=dict(type="dict", required=True),
    allow_unknown=dict(type="list", elements="str", default=[]),
    allow_findings=dict(type="list", elements="str", default=[]),
    unit=dict(type="str", default="vllm.service"),
    conf_path=dict(type="path", default="/etc/nccl.conf"),
    env_file=dict(type="path", default="/etc/gpufleet/nccl.env"),
    restart_ok=dict(type="bool", default=False),
    findings=dict(type="str", choices=["fail", "note"], default="fail"),
)


def main():
    run_module(ModuleSpec("nccl_change_step", ARGUMENT_SPEC, "reads the NCCL files and the unit's environment and "
                          "writes /var/lib/gpufleet", (FlowError,)), execute)


if __name__ == "__main__":
    main()

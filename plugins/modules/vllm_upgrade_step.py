#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_upgrade_step
short_description: One step of the crash-safe vLLM upgrade - read the host's journal, decide, write it, say what to do next
version_added: 0.3.0
description:
  - The vLLM upgrade of C(gpufleet.inference.vllm_upgrade) as a state machine kept on the host, on the change flow every
    kind of change shares (docs/change_flow.md). The controller reports what it just did (O(event) and O(data)); the
    module reads which vLLM the unit's venv link C(<base_dir>/current) points at (the version its venv's
    C(.gpufleet-complete) records) and the journal C(/var/lib/gpufleet/vllm_upgrade/journal.json), decides, writes the
    journal durably (temp file, fsync, rename, fsync of the directory) and returns RV(next_action). A controller lost at
    any point resumes on the next run from the recorded stage, with the recorded baseline, or executes the recorded
    verdict.
  - The flow - the baseline on the current version (more runs while the gate asks, or a stop with nothing changed), the
    PCIe audit and the output reference, the candidate installed into its own venv beside the current one (V(install)),
    the link switched to it and the unit restarted (V(switch)), its readiness and its start log's kernel path compared
    with the old version's (a new warning or error finding fails the verification, or is named in the verdict with
    O(findings=note)), the candidate's benchmark rounds, the outputs and the host's health, the serving verdict; V(pass)
    is committed, anything else points the link back at the old venv and restarts the unit. No reboot.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
  - gpufleet.inference.change_step
options:
  target:
    description: The vLLM version to move to, as pip prints it (letters, digits and C(. + ! _ -)).
  event:
    choices: [start, locked, benchmarked, audited, outputs, checked, committed, rolled_back, error, installed, switched]
  data:
    description:
      - The event's data. V(benchmarked) - C(label), C(samples), C(files), C(version) (the vLLM version measured),
        C(concurrency), C(contaminated), C(failed), C(requests), C(latency), C(server), C(config), C(client). V(audited) -
        C(findings), C(pcie). V(outputs) - C(reference), C(model), C(band), C(aa). V(installed) - C(venv) (the
        candidate's venv), C(version) (what it holds), C(install) (C(failed), C(msg)), C(ready_before) (vllm_ready's
        answer on the old version, with its C(kernel_path)). V(switched) - C(ready) (vllm_ready's answer on the
        candidate - C(ok), C(msg), C(kernel_path)). V(checked) - C(outputs), C(pcie), C(kernel_log).
        V(committed)/V(rolled_back) - C(locked), C(server), C(removed). V(error) - C(msg).
  restart_ok:
    description: The explicit yes to install, switch and restart the service; without it the answer is the plan
      (C(planned)).
    type: bool
    default: false
  lock:
    description: Answer the V(lock) action at the start (vLLM holds no package; the role keeps the venvs).
  verify_pcie:
    default: false
  findings:
    description:
      - What a start-log finding of the candidate (warning or error, from vllm_ready's kernel path) that the old version
        did not have does - V(fail) fails the verification (the candidate is rolled back as V(verify_failed)), V(note)
        names it in the verdict's reason.
    type: str
    choices: [fail, note]
    default: fail
  base_dir:
    description: The vllm_service role's install root (C(vllm_service_base_dir)); its C(current) link is the unit's venv.
    type: path
    default: /opt/gpufleet/vllm
  journal:
    default: /var/lib/gpufleet/vllm_upgrade/journal.json
"""

EXAMPLES = r"""
- name: Start (or resume) the vLLM upgrade
  gpufleet.inference.vllm_upgrade_step:
    target: 0.33.1
    event: start
    restart_ok: true
    run_id: "{{ vllm_upgrade_run_id }}"
  register: step

- name: Report the candidate's venv
  gpufleet.inference.vllm_upgrade_step:
    target: 0.33.1
    event: installed
    data:
      venv: /opt/gpufleet/vllm/vllm-0.33.1-3f2a9c1e
      version: 0.33.1
      ready_before: "{{ ready_on_old }}"
    restart_ok: true
    run_id: "{{ vllm_upgrade_run_id }}"
"""

RETURN = r"""
next_action:
  description:
    - What the controller does next. C(name) is one of C(lock), C(benchmark) (C(label), C(runs), C(seed),
      C(measured_only), C(concurrency)), C(audit), C(outputs), C(install) (C(version), C(old), C(old_venv)), C(switch)
      (C(version), C(venv), C(restart)), C(check) (C(outputs), C(stability), C(reference)), C(commit) (C(version),
      C(venv), C(old_venv)), C(rollback) (C(version), C(venv), C(restart), C(candidate_venv)), C(finish) (C(decision),
      C(reason), C(ok)).
  returned: success
  type: dict
  sample: {name: switch, version: 0.33.1, venv: /opt/gpufleet/vllm/vllm-0.33.1-3f2a9c1e, restart: true}
journal:
  description: The journal after the step (null when no upgrade is in progress).
  returned: success
  type: dict
record:
  description: What the role's record keeps (C(kind) V(vllm), stage, old version, baseline, candidate, gate, decision,
    reason, C(verdict) with the serving verdict's C(parts), C(serving_verdict) for the history).
  returned: success
  type: dict
running:
  description: The vLLM version of the venv the unit's link points at (null when it points at no finished venv).
  returned: success
  type: str
  sample: 0.32.0
current_venv:
  description: The venv the unit's link points at (null without a link).
  returned: success
  type: str
  sample: /opt/gpufleet/vllm/vllm-0.32.0-9d1c07aa
current_link:
  description: The link itself.
  returned: success
  type: str
  sample: /opt/gpufleet/vllm/current
actions:
  description:
    - What was written (or would be in check mode), in order. C(renew_lease), C(take_over_journal), C(write_journal);
      when the upgrade ends, C(archive_journal) and C(remove_journal).
  returned: always
  type: list
  elements: dict
  sample: [{action: write_journal, path: /var/lib/gpufleet/vllm_upgrade/journal.json, stage: baseline}]
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.change.flow import FlowError
from ansible_collections.gpufleet.inference.plugins.module_utils.change.step import step_argument_spec
from ansible_collections.gpufleet.inference.plugins.module_utils.vllm.vllm_upgrade_step import EVENTS, execute

ARGUMENT_SPEC = step_argument_spec(
    EVENTS, "/var/lib/gpufleet/vllm_upgrade/journal.json",
    restart_ok=dict(type="bool", default=False),
    findings=dict(type="str", choices=["fail", "note"], default="fail"),
    base_dir=dict(type="path", default="/opt/gpufleet/vllm"),
)


def main():
    run_module(ModuleSpec("vllm_upgrade_step", ARGUMENT_SPEC, "reads the vLLM venv link and writes /var/lib/gpufleet",
                          (FlowError,)), execute)


if __name__ == "__main__":
    main()

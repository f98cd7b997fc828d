#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: driver_upgrade_step
short_description: One step of the crash-safe NVIDIA driver upgrade - read the host's journal, decide, write it, say what to do next
version_added: 0.3.0
description:
  - The driver upgrade as a state machine kept on the host, on the change flow every kind of change shares
    (docs/change_flow.md, docs/driver_upgrade.md). The controller reports what it just did (O(event) and O(data)); the
    module reads the loaded driver's version (O(version_file)), the installed versions of O(packages) (C(dpkg-query))
    and the journal C(/var/lib/gpufleet/driver_upgrade/journal.json), decides, writes the journal durably and returns
    RV(next_action). A controller lost at any point resumes on the next run from the recorded stage, or executes the
    recorded verdict.
  - The flow - the lock (the driver's packages held), the baseline on the loaded driver, the PCIe audit and the output
    reference, the candidate's packages installed (V(install), the journal at stage C(installing) first), activated by
    a module reload or a reboot and verified against the driver's state before (V(activate)), the candidate's benchmark
    rounds, the outputs and the host's health, the serving verdict; V(pass) is committed (the holds on the candidate's
    packages), anything else reinstalls each package's old version and activates the old driver again (V(rollback)).
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
  - gpufleet.inference.change_step
options:
  target:
    description: The candidate version of the driver's packages, as apt names it (C(550.54.15-1)).
  packages:
    description: The driver's packages to upgrade; the first one's installed version is the installed driver's.
    type: list
    elements: str
    required: true
  event:
    choices: [start, locked, benchmarked, audited, outputs, checked, committed, rolled_back, error, installed, activated]
  data:
    description:
      - The event's data. V(benchmarked) - C(label), C(samples), C(files), C(driver) (the driver version measured),
        C(concurrency), C(contaminated), C(failed), C(requests), C(latency), C(server), C(config), C(client).
        V(audited) - C(findings), C(pcie). V(outputs) - C(reference), C(model), C(band), C(aa). V(installed) - C(install)
        (C(failed), C(msg), C(stdout), C(stderr)). V(activated) - C(activation) (C(failed), C(msg)), C(verify)
        (M(gpufleet.inference.driver_verify)'s answer - C(ok), C(msg), C(checks)). V(checked) - C(outputs), C(pcie),
        C(kernel_log). V(committed)/V(rolled_back) - C(locked), C(server). V(error) - C(msg).
  activate:
    description: How the candidate (and the old driver on the way back) is activated.
    type: str
    choices: [reload, reboot]
    default: reboot
  reboot_ok:
    description: The explicit yes to a reboot (O(activate=reboot)); without it the answer is the plan (C(planned)).
    type: bool
    default: false
  lock:
    description: Answer the V(lock) action at the start (hold the driver's packages).
  hold_packages:
    description: More packages held with the driver's.
    type: list
    elements: str
    default: []
  verify_pcie:
    default: false
  version_file:
    description: The loaded driver's version file (NVRM's words).
    type: path
    default: /proc/driver/nvidia/version
  state:
    description: M(gpufleet.inference.driver_verify)'s state before the change, kept in the journal.
    type: dict
  journal:
    default: /var/lib/gpufleet/driver_upgrade/journal.json
  preflight:
    description: This run's go or no-go (M(gpufleet.inference.driver_upgrade_preflight)'s C(ok), C(msg)); empty - go.
"""

EXAMPLES = r"""
- name: Start (or resume) the driver upgrade
  gpufleet.inference.driver_upgrade_step:
    target: 550.54.15-1
    packages: [nvidia-driver, nvidia-kernel-dkms]
    activate: reload
    preflight: "{{ driver_preflight }}"
    run_id: "{{ driver_upgrade_run_id }}"
  register: step

- name: Report the activation and its verification
  gpufleet.inference.driver_upgrade_step:
    target: 550.54.15-1
    packages: [nvidia-driver, nvidia-kernel-dkms]
    activate: reload
    event: activated
    data:
      activation: {failed: false}
      verify: "{{ driver_verify_after }}"
    run_id: "{{ driver_upgrade_run_id }}"
"""

RETURN = r"""
next_action:
  description:
    - What the controller does next. C(name) is one of C(lock) (C(hold), C(unattended_upgrades)), C(benchmark)
      (C(label), C(runs), C(seed), C(measured_only), C(concurrency)), C(audit), C(outputs), C(install) (C(version),
      C(packages) - name to version), C(activate) (C(how) - reload, reboot or none, C(version)), C(check), C(commit)
      (C(hold), C(unattended_upgrades)), C(rollback) (C(packages) to reinstall, C(activate), C(reactivate)), C(finish)
      (C(decision), C(reason), C(ok)).
  returned: success
  type: dict
  sample: {name: activate, how: reload, version: 550.54.15}
journal:
  description: The journal after the step (null when no upgrade is in progress).
  returned: success
  type: dict
record:
  description: What the role's record keeps (C(kind) V(driver), stage, old version, baseline, candidate, gate, decision,
    reason, C(verdict), C(serving_verdict) for the history).
  returned: success
  type: dict
running:
  description: The loaded driver's version (null when none is loaded).
  returned: success
  type: str
  sample: 535.216.01
installed:
  description: The installed version of each of O(packages) (null when not installed).
  returned: success
  type: dict
  sample: {nvidia-driver: 535.216.01-1~deb12u1}
actions:
  description:
    - What was written (or would be in check mode), in order. C(renew_lease), C(take_over_journal), C(write_journal);
      when the upgrade ends, C(archive_journal) and C(remove_journal).
  returned: always
  type: list
  elements: dict
  sample: [{action: write_journal, path: /var/lib/gpufleet/driver_upgrade/journal.json, stage: baseline}]
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.change.flow import FlowError
from ansible_collections.gpufleet.inference.plugins.module_utils.change.step import step_argument_spec
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.driver_upgrade_step import EVENTS, execute

ARGUMENT_SPEC = step_argument_spec(
    EVENTS, "/var/lib/gpufleet/driver_upgrade/journal.json",
    packages=dict(type="list", elements="str", required=True),
    activate=dict(type="str", choices=["reload", "reboot"], default="reboot"),
    reboot_ok=dict(type="bool", default=False),
    hold_packages=dict(type="list", elements="str", default=[]),
    version_file=dict(type="path", default="/proc/driver/nvidia/version"),
    state=dict(type="dict"),
)


def main():
    run_module(ModuleSpec("driver_upgrade_step", ARGUMENT_SPEC, "reads the driver's version file and packages and "
                          "writes /var/lib/gpufleet", (FlowError,)), execute)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_rollout_step
short_description: One step of the crash-safe kernel upgrade - read the host's journal, decide, write it, say what to do next
version_added: 0.2.0
description:
  - The kernel upgrade of C(gpufleet.inference.kernel_upgrade) as a state machine kept on the host. The controller reports
    what it just did (O(event) and O(data)); the module reads the host (running kernel, boot id, the kernel the saved GRUB
    default boots, installed packages, the boot-health unit's last result) and the journal
    C(/var/lib/gpufleet/kernel_upgrade/journal.json), decides, writes the journal durably (temp file, fsync, rename, fsync
    of the directory) and returns RV(next_action). A controller lost at any point resumes on the next run from the
    recorded stage, with the recorded baseline, or executes the recorded verdict.
  - A corrupt or unreadable journal, or a host that runs a kernel other than its saved default without a journal, is
    refused (RV(next_action) is C(finish) with the decision C(refused) and the fix), and nothing is changed.
  - The gate is C(gpufleet.inference.throughput_gate)'s decide() over the journal's runs; contaminated runs (foreign load
    on the server) make the answer C(inconclusive). Before the pin the gate judges the baseline alone and asks for more
    baseline runs while it is too noisy, up to its cap, or stops with nothing changed (C(inconclusive), "host too noisy").
    More candidate runs follow while its C(runs_needed) is above 0 (measured only, the gated level alone); its answer
    is then final, and a final C(inconclusive) rolls back. Failed requests and short outputs of each side reach it.
  - With O(lease_run_id) set, every step renews the host's lease (C(gpufleet.inference.host_lease)) and refuses when this
    run no longer holds it. With O(lease_run_id) empty no lease is written, but a live lease of another run (one that is
    not O(run_id)) still refuses the step, naming its holder.
  - A refused step writes nothing (neither the lease nor the journal).
  - The journal belongs to the run that started it (its C(run_id)). Another run resumes it only by a take-over, at its
    V(start) - when it holds the host's lease under its own run id (O(lease_run_id) = O(run_id), as
    C(playbooks/kernel_upgrade.yml) does after taking over the lease of a run that died), or when O(take_over) names
    the journal's run. The journal then names the new run and keeps the take-over (C(taken_over)); RV(actions) says it.
    Any other run is refused and nothing is changed.
  - A journal that is valid JSON but not of the expected shape (a field of the wrong type, a stage without what it
    needs), and event data of the wrong shape, are refused with the file and the field named; nothing is changed.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
  - gpufleet.inference.change_step
options:
  target:
    description: The kernel release to move to, as C(uname -r) prints it.
  event:
    choices: [start, locked, benchmarked, audited, outputs, pinned, installed, rebooted, verified, checked, committed, rolled_back,
              error]
  data:
    description:
      - The event's data. V(start) - C(preflight) (the result of C(kernel_upgrade_preflight)). V(benchmarked) - C(label),
        C(samples), C(files), C(kernel), C(concurrency), C(contaminated) (indices of contaminated runs), C(failed) (failed
        requests and short outputs), C(requests). V(audited) -
        C(findings), C(pcie) (the audit's document, kept for the stability part). V(outputs) - C(reference), C(model),
        C(band), C(aa) (output_equivalence's record). V(checked) - C(outputs) (output_equivalence's compare result),
        C(pcie) (the audit after the candidate's benchmark), C(kernel_log) (the kernel log of the candidate's boot).
        V(installed) - C(preflight) (phase installed). V(verified) - C(cmdline_missing), C(findings_after),
        C(vllm) (C(checked), C(ok), C(msg)). V(committed)/V(rolled_back) - C(locked), C(server). V(error) - C(msg).
  reboot_ok:
    description: The explicit yes to install and reboot; without it the answer is the plan (C(planned)).
    type: bool
    default: false
  lock:
    description: Hold the kernel, its meta-packages and the GPU driver packages between upgrades.
  lock_packages:
    description: More packages to hold where installed.
    type: list
    elements: str
    default: []
  verify_pcie:
    description: Audit the PCIe path before the upgrade, to compare after the boot.
    default: true
  outputs:
    version_added: 0.3.0
  stability:
    version_added: 0.3.0
  headers:
    description:
      - Install the target's C(linux-headers-<target>) with it - V(auto) where DKMS holds modules (the preflight's
        C(dkms_modules)), V(always), V(never).
    type: str
    choices: [auto, always, never]
    default: auto
  commit_timeout:
    description:
      - Seconds from the controller's last contact after which the boot-health unit reboots an uncommitted candidate
        into the saved default. 120 to 86400 (outside, the step is refused and nothing is changed).
      - Every contact records the deadline in the journal as C(deadline) (this boot's id and seconds since this boot),
        which the unit compares with its own uptime, never with the wall clock.
    type: int
    default: 1800
  journal:
    default: /var/lib/gpufleet/kernel_upgrade/journal.json
  preflight:
    description: This run's C(gpufleet.inference.kernel_upgrade_preflight) result (go or no-go before an upgrade starts).
"""

EXAMPLES = r"""
- name: Start (or resume) the upgrade
  gpufleet.inference.kernel_rollout_step:
    target: 6.1.0-56-cloud-amd64
    event: start
    data: {preflight: "{{ preflight_result }}"}
    reboot_ok: true
    run_id: "{{ kernel_upgrade_run_id }}"
  register: step

- name: Report a benchmark
  gpufleet.inference.kernel_rollout_step:
    target: 6.1.0-56-cloud-amd64
    event: benchmarked
    data: {label: baseline, samples: [812.0, 798.5, 805.1, 809.9, 801.2], files: [/var/lib/gpufleet/benchmarks/b.json]}
    reboot_ok: true
"""

RETURN = r"""
next_action:
  description:
    - What the controller does next. C(name) is one of C(lock), C(benchmark) (C(label), C(runs), C(seed),
      C(measured_only), C(concurrency) - an extra round runs only that level, without warm-up or settle runs), C(audit),
      C(pin), C(install) (C(package), C(packages)), C(boot_once) (C(version), C(commit_timeout)), C(verify), C(commit) and C(rollback)
      (C(version), C(hold), C(unattended_upgrades), C(reboot)), C(finish) (C(decision), C(reason), C(ok)).
  returned: success
  type: dict
  sample: {name: benchmark, label: baseline, runs: 5, seed: 0, measured_only: false, concurrency: null}
journal:
  description: The journal after the step (null when no upgrade is in progress).
  returned: success
  type: dict
record:
  description: What the role's record keeps (stage, old kernel, baseline, candidate, gate, decision, reason, locked, and
    C(verdict) - the journal's verdict with the serving verdict's C(parts) (throughput, latency, outputs, stability, each
    with its answer, what it says and why)).
  returned: success
  type: dict
running:
  description: The running kernel.
  returned: success
  type: str
  sample: 6.1.0-50-cloud-amd64
default_version:
  description: The kernel the saved GRUB default boots (null when it names no entry).
  returned: success
  type: str
  sample: 6.1.0-50-cloud-amd64
actions:
  description:
    - What was written (or would be in check mode), in order. C(renew_lease) (the lease's C(path), C(what) happened to
      it), C(take_over_journal) (C(from), C(by), C(why), C(stage)), C(write_journal) (the journal's C(path) and its new
      C(stage)); when the upgrade ends, C(archive_journal) (the C(path) in the history) and C(remove_journal).
  returned: always
  type: list
  elements: dict
  sample: [{action: write_journal, path: /var/lib/gpufleet/kernel_upgrade/journal.json, stage: baseline}]
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.change.step import step_argument_spec
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.kernel_rollout_step import EVENTS, execute
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.flow import FlowError

ARGUMENT_SPEC = step_argument_spec(
    EVENTS, "/var/lib/gpufleet/kernel_upgrade/journal.json", verify_pcie=True,
    reboot_ok=dict(type="bool", default=False),
    lock_packages=dict(type="list", elements="str", default=[]),
    headers=dict(type="str", choices=["auto", "always", "never"], default="auto"),
    commit_timeout=dict(type="int", default=1800),
)


def main():
    run_module(ModuleSpec("kernel_rollout_step", ARGUMENT_SPEC, "reads /proc, /boot/grub and /var/lib/dpkg and writes "
                          "/var/lib/gpufleet", (FlowError,)), execute)


if __name__ == "__main__":
    main()

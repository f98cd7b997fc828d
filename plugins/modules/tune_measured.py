#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tune_measured
short_description: The decisions of measured tuning (baseline, one stage at a time, keep or revert) over a host-side state file
version_added: 0.2.0
description:
  - Drives C(playbooks/tune_measured.yml). The play asks what to do next (O(op=next)), does it (apply or revert a stage
    through its roles, reboot once for the grouped reboot stage, benchmark every profile) and reports back
    (O(op=complete)) with the benchmark results; this module decides everything in between and keeps the progress in
    O(state_file) on the host, written atomically and durably, so a play that dies resumes where it stopped.
  - The baseline is benchmarked before any change. Each stage is judged by the throughput gate per profile and
    concurrency level against the state before it (the last kept measurement) - any regression reverts it, all pass keep
    it, and an inconclusive answer measures more runs (up to O(more_rounds) times) and then follows O(inconclusive).
  - The gate's verdict has a latency part (each run's TTFT and TPOT p50 and p90, judged lower-is-better with the same
    sequential test against per-metric margins); a stage that keeps the throughput but raises a latency beyond its
    margin is a regression and is reverted, the reason naming the metric. Each verdict in the state keeps C(latency)
    (its status and per-metric answer, ratio, interval and margin); a state stored before per-run latency was kept
    judges its old measurements on throughput alone (C(not measured)).
  - Before a stage is applied the module records what its revert needs (C(record) readings such as the ASPM
    policy or the 2 MiB pages per node, and copies of C(files)); before a revert it puts those files back.
  - Stages with C(reboot=true) are grouped into one stage named C(reboot), applied, rebooted and measured as one.
author:
  - gpufleet.inference contributors (@gpufleet)
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: In check mode the state file is read but never written, and no file is restored; RV(next) is the first action.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
options:
  op:
    description:
      - V(start) creates the state from O(stages) and O(profiles), or resumes a state file made from the same plan.
      - V(next) returns the pending or next action. V(complete) reports the pending action O(action_id) done.
      - V(reset) removes the state file.
    type: str
    choices: [start, next, complete, reset]
    default: next
  state_file:
    description: The host-side state (JSON).
    type: path
    default: /var/lib/gpufleet/tune_measured/state.json
  root:
    description: Root of the host's file system, for tests against a fake tree.
    type: path
    default: /
  stages:
    description:
      - For O(op=start), the stages in order. Each has C(name), either C(role) with C(vars) or C(apply) (a list of
        tasks, each with C(role) and C(vars), or C(restart) naming a systemd unit), C(revert) in the same form (values written C(@name) are the readings
        recorded before the stage), C(kind) (V(host) or V(vllm); vLLM stages revert to the kept flags), C(reboot),
        C(record) (V(aspm_policy), V(hugepages_2m_per_node)), C(files) (paths to copy before and put back on revert),
        C(outputs) (compare the outputs after this stage; default true for V(vllm) stages, false otherwise) and
        C(description).
    type: list
    elements: dict
    default: []
  skip:
    description: Stage names to leave out (for example the IRQ stage on a host without irq_affinity_devices).
    type: list
    elements: str
    default: []
  force_revert:
    description:
      - Stage names (or V(reboot) for the reboot group) to measure, judge and then revert whatever the gate says, to
        see what a change does without keeping it. The table keeps the gate's verdict; the reason says it was told.
    type: list
    elements: str
    default: []
  profiles:
    description:
      - Benchmark profiles, names (V(serving), V(latency), V(long_context), V(shared_prefix), V(mixed_open_loop)) or
        dicts with C(name) and overrides.
      - C(profile), C(profile_options), C(arrivals) and C(goodput) are the request profile of
        M(gpufleet.inference.inference_benchmark) (docs/benchmark.md, "Workload profiles"); V(shared_prefix) sends a
        2048-token shared system prompt, V(mixed_open_loop) chat-shaped lengths as Poisson arrivals and needs
        C(arrivals.rate), the request rate the site serves (for example C(name=mixed_open_loop) with C(arrivals.rate=8)); dicts
        are merged key by key over the built-in profile's.
      - A stage's C(judged_on) (in O(stages)) names the profiles whose verdict decides it, the profiles that can see
        its effect; each must be listed here. A stage that sets a vLLM flag names its own, used when that profile is
        listed, prefix caching V(shared_prefix), chunked prefill and max_num_batched_tokens V(mixed_open_loop),
        max_num_seqs V(serving). A regression on any profile reverts the stage all the same; the stage table says
        which profiles judged it.
      - A dict may set C(latency_margins) (as in O(gate)) for its own levels, for example a stricter TTFT for an
        interactive profile; checked at O(op=start).
    type: list
    elements: raw
    default: [serving]
  max_model_len:
    description: The server's max_model_len, for profiles whose prompt is C(near_max) (V(long_context)).
    type: int
  gate:
    description:
      - Throughput gate settings C(threshold), C(alpha), C(pass_alpha), C(min_runs), C(max_runs) (see
        M(gpufleet.inference.throughput_gate)), each at the gate's own default when not set (C(pass_alpha) 0.005, as
        the module's; it was 0.05 here before).
      - C(threshold=auto) sets it from the baseline's largest run-to-run CV, C(1 - auto_k x CV) (C(auto_k) 3), at least
        C(auto_floor) (0.5), at most 0.95. With a threshold given, the state says whether it fits that CV.
      - C(latency_margins), per metric (C(ttft_p50), C(ttft_p90), C(tpot_p50), C(tpot_p90), C(itl_p99)), the largest
        increase still a pass (0.01 to 1.0, null leaves one unjudged; defaults 0.10, 0.15, 0.075, 0.10, 0.25), and
        C(latency_alpha) (0.002), each metric's false-regression rate. A profile's own C(latency_margins) (in
        O(profiles)) overrides these for its levels. With C(threshold=auto) the default margins of metrics not set are
        widened alike, to C(auto_k) x the baseline's largest run-to-run CV of that metric (at most 1.0).
      - C(between_start_sd), the noise between server starts (the sd of the log of a start's mean tok/s, 0 to 0.2; null,
        the default, counts the runs' own noise only); a vLLM flag stage restarts the server, so its runs and the
        baseline's come from different starts; docs/benchmark.md gives the H200's figures.
      - Checked at O(op=start), before the baseline, with the allowed ranges (C(min_runs) 3 to C(max_runs), C(max_runs)
        at most 1000).
    type: dict
    default: {}
  verdict:
    description:
      - For O(op=start), the parts of the serving verdict beyond the gate (a stage is kept only when throughput,
        latency, outputs and stability all say yes; docs/benchmark.md, "The serving verdict").
      - C(outputs) (default true) - record an output reference at the baseline (M(gpufleet.inference.output_equivalence)
        C(mode=record)) and compare the outputs after each stage that can change them (vLLM flag stages, and any stage
        with C(outputs=true)); a V(diverged) stage is reverted. C(stability) (default true) - audit the host
        (M(gpufleet.inference.pcie_facts) and the kernel's Xid lines) after every benchmark and compare each stage's
        audit with its reference's; an V(unstable) stage is reverted. C(reference) - the reference file on the host
        (default C(/var/lib/gpufleet/tune_measured/outputs-reference.json)).
      - A part set false is left out, and each stage's verdict names it as not measured.
    type: dict
    default: {}
    version_added: 0.3.0
  checks:
    description:
      - For O(op=complete) of a benchmark, what C(checks) of RV(next) asked for - C(health) (the audit's C(pcie) document),
        C(kernel_log) (lines; only the Xid lines are kept) and C(outputs) (output_equivalence's result, the record at the
        baseline, the comparison after a stage).
    type: dict
    default: {}
    version_added: 0.3.0
  inconclusive:
    description: What to do with a stage the gate cannot decide once the extra rounds are spent.
    type: str
    choices: [keep, revert]
    default: revert
  more_rounds:
    description: Extra rounds of candidate runs an inconclusive stage gets (the gate says how many runs each).
    type: int
    default: 1
  vllm_defaults:
    description: The vLLM flag values a vLLM stage reverts to when no earlier stage kept a value (the role's defaults).
    type: dict
    default: {}
  restart:
    description: For O(op=start), discard a state file made from another plan instead of failing.
    type: bool
    default: false
  action_id:
    description: For O(op=complete), the C(id) of RV(next) that was done.
    type: int
  results:
    description:
      - For O(op=complete) of a benchmark, one result document per profile, in order.
      - A document whose C(config) does not match its profile (C(prompt_tokens), C(output_tokens), C(requests),
        C(prompt_mode), C(ignore_eos), C(token_id_range), or a level the profile does not have) is refused, and so is
        a stage whose workload (model, lengths, concurrency, requests per run) differs from its reference's; nothing
        is judged. Each level's failed requests and short outputs reach the gate (a stage that fails more cannot be kept).
    type: list
    elements: dict
    default: []
  host:
    description: Host name stored in the state.
    type: str
    default: ""
  now:
    description: Time stamp of this call (UTC, for example C(ansible_date_time.iso8601)), stored as the state's
      C(started_at) when it is created and C(finished_at) when the last stage is decided.
    type: str
    default: ""
seealso:
  - module: gpufleet.inference.throughput_gate
  - module: gpufleet.inference.inference_benchmark
  - name: docs/measured_tuning.md
    description: The loop, the stages and their reverts, the table.
    link: https://github.com/gpufleet/inference/blob/main/docs/measured_tuning.md
"""

EXAMPLES = r"""
- name: Start (or resume) measured tuning
  gpufleet.inference.tune_measured:
    op: start
    stages:
      - name: aspm
        role: gpufleet.inference.pcie_link
        vars: {pcie_link_aspm_policy: performance, pcie_link_mps: "", pcie_link_mrrs: 0, pcie_link_aspm_cmdline: ""}
        record: [aspm_policy]
        revert:
          - role: gpufleet.inference.pcie_link
            vars: {pcie_link_aspm_policy: "@aspm_policy", pcie_link_mps: "", pcie_link_mrrs: 0, pcie_link_aspm_cmdline: ""}
      - name: max_num_seqs_256
        kind: vllm
        role: gpufleet.inference.vllm_service
        vars: {vllm_service_max_num_seqs: 256}
    profiles: [serving, latency]
    vllm_defaults: {vllm_service_max_num_seqs: 0}
  register: tm

- name: Report a benchmark done
  gpufleet.inference.tune_measured:
    op: complete
    action_id: "{{ tm.next.id }}"
    results: "{{ bench.results | map(attribute='benchmark') | list }}"
  register: tm
"""

RETURN = r"""
actions:
  description:
    - What the module wrote or would write, in order. Before a revert, each file the stage changed is put back as the
      apply found it, C(action=restore) (or C(action=remove) when it did not exist) with its C(path); the state file
      is C(action=write) (C(action=remove) for O(op=reset)) with its C(path).
  returned: always
  type: list
  elements: dict
  sample: [{action: restore, path: /etc/nccl.conf}, {action: write, path: /var/lib/gpufleet/tune_measured/state.json}]
next:
  description:
    - The action to do now, C(id), C(action) (V(benchmark), V(apply), V(revert), V(done)), C(stage), C(tasks) (C({role,
      vars}) or C({restart})), C(reboot), C(profiles) (complete benchmark settings per profile), C(repetitions) (set
      for extra rounds) and C(checks) (after a benchmark - C(audit) true to audit the host, C(outputs) V(record) or
      V(compare) or null, C(reference) the reference file).
  returned: always
  type: dict
  sample: {id: 3, action: apply, stage: aspm, reboot: false, profiles: [], repetitions: null,
           tasks: [{role: gpufleet.inference.pcie_link, vars: {pcie_link_aspm_policy: performance}}]}
stages:
  description: One line per stage with C(stage), C(status), C(verdict) (the serving verdict - V(pass), V(unstable),
    V(diverged), V(regression) or V(inconclusive)), C(decision), C(reference), C(reason) and C(parts) (what each part of
    the verdict said - V(yes), V(no), V(wait) or V(not measured)).
  returned: always
  type: list
  elements: dict
verdicts:
  description:
    - Each decided stage's serving verdict as M(gpufleet.inference.bench_history) stores it (its
      O(gpufleet.inference.bench_history#module:verdicts) option) - C(verdict), C(keep), C(reason), C(parts), C(stage)
      and C(decided_at).
  returned: always
  type: list
  elements: dict
  version_added: 0.3.0
state:
  description: The whole state document (stages with measurements, gate verdicts, recorded readings).
  returned: always
  type: dict
state_file:
  description: Path of the state file.
  returned: always
  type: str
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.tuning.tune_measured import TuneError, execute

ARGUMENT_SPEC = dict(
    op=dict(type="str", choices=["start", "next", "complete", "reset"], default="next"),
    state_file=dict(type="path", default="/var/lib/gpufleet/tune_measured/state.json"),
    root=dict(type="path", default="/"),
    stages=dict(type="list", elements="dict", default=[]),
    skip=dict(type="list", elements="str", default=[]),
    force_revert=dict(type="list", elements="str", default=[]),
    profiles=dict(type="list", elements="raw", default=["serving"]),
    max_model_len=dict(type="int"),
    gate=dict(type="dict", default={}),
    verdict=dict(type="dict", default={}),
    checks=dict(type="dict", default={}),
    inconclusive=dict(type="str", choices=["keep", "revert"], default="revert"),
    more_rounds=dict(type="int", default=1),
    vllm_defaults=dict(type="dict", default={}),
    restart=dict(type="bool", default=False),
    action_id=dict(type="int"),
    results=dict(type="list", elements="dict", default=[]),
    host=dict(type="str", default=""),
    now=dict(type="str", default=""),
)


def main():
    run_module(ModuleSpec("tune_measured", ARGUMENT_SPEC, "keeps its state file under state_file", (TuneError,),
                          {"required_if": [("op", "complete", ["action_id"])]}), execute)


if __name__ == "__main__":
    main()

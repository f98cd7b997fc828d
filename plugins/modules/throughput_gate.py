#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: throughput_gate
short_description: Decide pass, regression or inconclusive from baseline and candidate benchmark runs
version_added: 0.1.0
description:
  - Compares per-run throughputs (for example output tokens/s from M(gpufleet.inference.inference_benchmark)) of a baseline
    (old kernel, old tuning) and a candidate (new kernel, new tuning); higher is better.
  - Answers V(regression) only when the candidate's median is below O(threshold) times the baseline's median B(and) the drop
    is significant by a one-sided Mann-Whitney U test (p <= O(alpha)). The ratio alone would roll back on noise; the
    test alone would roll back on drops too small to matter.
  - Answers V(pass) when the candidate is significantly above O(threshold) times the baseline (the same test against the
    scaled baseline, p <= O(pass_alpha)).
  - Otherwise answers V(inconclusive) with RV(runs_needed), the candidate runs to add, until the candidate has O(max_runs)
    runs; at that cap the median ratio alone decides.
  - The p-value is exact for small samples (with or without ties) and a normal approximation with tie correction for large
    ones. A seeded bootstrap interval of the median ratio is reported as well; it does not change the answer.
  - The same logic is the P(gpufleet.inference.throughput_gate#filter) filter. Pure computation, nothing on the host changes.
author:
  - gpufleet.inference contributors (@gpufleet)
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: The module changes nothing, so check mode returns the same answer.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
options:
  baseline:
    description: Throughput of each baseline run, one number per run (at least O(min_runs) for an answer).
    type: list
    elements: float
    required: true
  candidate:
    description: Throughput of each candidate run, one number per run.
    type: list
    elements: float
    required: true
  threshold:
    description: Candidate/baseline median ratio below which a significant drop is a regression (V(0.95) is a 5% drop).
    type: float
    default: 0.95
  alpha:
    description:
      - Significance level of the drop test. With 5 runs per side the smallest p-value possible is 0.004, so V(0.01)
        needs at most one inverted pair of the 25.
    type: float
    default: 0.01
  pass_alpha:
    description: Significance level of the test that the candidate is above O(threshold) times the baseline.
    type: float
    default: 0.05
  min_runs:
    description: Runs needed per side before any answer but V(inconclusive).
    type: int
    default: 5
  max_runs:
    description: Candidate runs after which the median ratio decides alone.
    type: int
    default: 15
  bootstrap_resamples:
    description: Resamples of the bootstrap interval of the median ratio; V(0) skips it.
    type: int
    default: 2000
  seed:
    description: Seed of the bootstrap, so the interval repeats exactly.
    type: int
    default: 0
  unit:
    description: Unit of the numbers, used in RV(reason).
    type: str
    default: tok/s
  fail_on_regression:
    description: Fail the task when the answer is V(regression), with RV(reason) as the message and the full result.
    type: bool
    default: false
notes:
  - Treat one whole benchmark run as one sample; requests inside a run are correlated by the server's batching.
  - At 2% run-to-run noise and 5 runs per side the defaults give under 0.1% false regressions and over 99% detection of
    an 8% drop (tests/benchmarks/bench_throughput_gate.py simulates it; docs/benchmark.md has the figures). At 5% noise
    they do not, so lengthen the runs until their CV is near 2%.
seealso:
  - module: gpufleet.inference.inference_benchmark
"""

EXAMPLES = r"""
- name: Judge the new kernel's runs against the old kernel's
  gpufleet.inference.throughput_gate:
    baseline: "{{ baseline_bench.samples['32'] }}"
    candidate: "{{ candidate_bench.samples['32'] }}"
  register: gate

- name: Run more candidate benchmarks when the gate asks for them
  gpufleet.inference.inference_benchmark:
    concurrency: [32]
    repetitions: "{{ gate.runs_needed }}"
    seed: 1
  register: more_runs
  when: gate.decision == 'inconclusive'

- name: Stop the play on a regression
  gpufleet.inference.throughput_gate:
    baseline: [1012.5, 1003.1, 998.7, 1020.0, 1009.9]
    candidate: [921.4, 930.8, 915.0, 925.2, 934.1]
    threshold: 0.95
    fail_on_regression: true
"""

RETURN = r"""
decision:
  description: V(pass), V(regression) or V(inconclusive).
  returned: always
  type: str
  sample: regression
ratio:
  description: Candidate median / baseline median; null while either side has fewer than O(min_runs) runs.
  returned: always
  type: float
  sample: 0.913
p_value:
  description: One-sided Mann-Whitney U p-value that the candidate is lower than the baseline; null before O(min_runs).
  returned: always
  type: float
  sample: 0.00397
runs_needed:
  description: More candidate runs to measure before asking again (0 unless RV(decision) is V(inconclusive)).
  returned: always
  type: int
  sample: 0
reason:
  description: The answer in words, with the figures it rests on.
  returned: always
  type: str
  sample: "regression: candidate median 925.2 tok/s is 91.6% of the baseline's 1010.0 (threshold 95%), and the drop is
    significant (one-sided Mann-Whitney U p=0.0040 <= 0.01, 5 vs 5 runs)"
gate:
  description: The whole judgement.
  returned: always
  type: dict
  contains:
    decision:
      description: Same as RV(decision).
      type: str
    ratio:
      description: Same as RV(ratio).
      type: float
    p_value:
      description: Same as RV(p_value).
      type: float
    p_value_pass:
      description: One-sided p-value that the candidate is above O(threshold) times the baseline.
      type: float
    method:
      description: C(exact), C(exact-ties) or C(normal), how the p-values were computed.
      type: str
    decided_by:
      description: C(test) (a significant result), C(median-at-cap) (the cap was reached) or C(waiting) (inconclusive).
      type: str
    runs_needed:
      description: Same as RV(runs_needed).
      type: int
    baseline_runs_needed:
      description: Baseline runs missing to reach O(min_runs).
      type: int
    baseline:
      description:
        - C(n), C(median), C(mean), C(min), C(max) and C(cv) (coefficient of variation) of the baseline runs.
        - Once both sides have O(min_runs), C(trend) too, the runs in the order taken (Mann-Kendall), with C(s), C(tau),
          C(p_rising), C(p_falling), C(change) (Theil-Sen slope over the runs as a fraction of their median) and
          C(method). A steady rise or fall by half the margin (1 - O(threshold)) / 2 or more, with p <= 0.05, adds a
          warning, since a server still warming up, or slowing down, gives runs that are not alike.
      type: dict
    candidate:
      description: The same for the candidate runs.
      type: dict
    ci:
      description: Bootstrap interval of the median ratio at C(ci_level), or null.
      type: list
      elements: float
    ci_level:
      description: Confidence level of C(ci).
      type: float
    warnings:
      description:
        - Cautions, such as a run-to-run CV too high for the threshold or runs that drift steadily (also emitted as task
          warnings).
      type: list
      elements: str
    reason:
      description: Same as RV(reason).
      type: str
  sample: {decision: pass, ratio: 0.998, p_value: 0.44, p_value_pass: 0.004, method: exact, decided_by: test,
           runs_needed: 0, baseline_runs_needed: 0, threshold: 0.95, alpha: 0.01, pass_alpha: 0.05, min_runs: 5,
           max_runs: 15, baseline: {n: 5, median: 1009.9, mean: 1008.8, min: 998.7, max: 1020.0, cv: 0.0081},
           candidate: {n: 5, median: 1008.0, mean: 1007.1, min: 995.2, max: 1016.3, cv: 0.0079},
           ci: [0.981, 1.012], ci_level: 0.95, warnings: [], reason: "pass: ..."}
actions:
  description: Always empty; the module changes nothing.
  returned: always
  type: list
  elements: str
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils.throughput_gate import GateError, decide


def main():
    module = AnsibleModule(
        argument_spec=dict(
            baseline=dict(type="list", elements="float", required=True),
            candidate=dict(type="list", elements="float", required=True),
            threshold=dict(type="float", default=0.95),
            alpha=dict(type="float", default=0.01),
            pass_alpha=dict(type="float", default=0.05, no_log=False),
            min_runs=dict(type="int", default=5),
            max_runs=dict(type="int", default=15),
            bootstrap_resamples=dict(type="int", default=2000),
            seed=dict(type="int", default=0),
            unit=dict(type="str", default="tok/s"),
            fail_on_regression=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["bootstrap_resamples"] < 0:
        module.fail_json(msg=f"bootstrap_resamples must be 0 or more, got {p['bootstrap_resamples']}")
    try:
        gate = decide(p["baseline"], p["candidate"], threshold=p["threshold"], alpha=p["alpha"], pass_alpha=p["pass_alpha"],
                      min_runs=p["min_runs"], max_runs=p["max_runs"], bootstrap=p["bootstrap_resamples"], seed=p["seed"],
                      unit=p["unit"])
    except GateError as err:
        module.fail_json(msg=f"Cannot judge the runs: {err}")
    for warning in gate["warnings"]:
        module.warn(warning)
    result = dict(changed=False, actions=[], decision=gate["decision"], ratio=gate["ratio"], p_value=gate["p_value"],
                  runs_needed=gate["runs_needed"], reason=gate["reason"], gate=gate)
    if p["fail_on_regression"] and gate["decision"] == "regression":
        module.fail_json(msg=gate["reason"], **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()

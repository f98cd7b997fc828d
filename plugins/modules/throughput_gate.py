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
    (old kernel, old tuning) and a candidate (new kernel, new tuning); higher is better. One run is one sample.
  - A group-sequential test on log throughput (pooled Student's t), with Lan-DeMets alpha spending over the candidate looks
    at O(candidate_min_runs), then every O(step) runs up to O(max_runs); each look's nominal level is the increment of the
    spending function, so by Bonferroni's inequality the error rates hold over all looks.
  - Answers V(regression) when the candidate is below O(threshold) times the baseline (geometric means) and significantly
    slower than the baseline; at most O(alpha) of unchanged candidates are called a regression.
  - Answers V(pass) when the candidate is at or above 1 - O(pass_floor) x the margin times the baseline and a drop of
    O(detect) or more is ruled out; at most O(pass_alpha) of candidates that lost O(detect) pass.
  - From the second look on, a verdict that a trend shared by both sides' runs could have made is withheld (O(trend_guard)).
  - Answers V(inconclusive) otherwise. With RV(gate.final) false it asks for RV(runs_needed) more candidate runs; at
    O(max_runs), when the runs drift by more than half the margin, or before any change when the host is too noisy, it is
    final, with the measured CV, the smallest detectable drop and what would help (RV(gate.advice)).
  - With no candidate runs it judges the baseline alone (before the reboot); from its own spread, the smallest drop the
    design can detect; above the margin it asks for RV(gate.baseline_runs_needed) more baseline runs, up to
    O(max_baseline_runs), and then stops with RV(gate.too_noisy).
  - One outlier run per side is screened out (leave-one-out prediction test) and reported in RV(gate.screened).
  - A candidate with a larger share of failed requests or short outputs than the baseline (O(candidate_failed) of
    O(candidate_requests), O(baseline_failed) of O(baseline_requests)) cannot pass; it is a V(regression). Failures
    without requests counted, or more failures than requests, are refused.
  - A run at 0 tok/s (the server died in it, or failed every request) is a failure, never an outlier; a dead candidate run
    is a V(regression), a dead baseline run refused (measure the baseline again).
  - Given both sides' workloads (O(baseline_workload), O(candidate_workload)), runs of different workloads (model and its
    identity, engine version and argv, client, prompt and output lengths, concurrency, requests per run, sampling
    settings) are refused, naming each field that differs, except what O(change) is about.
  - The latency part, given each run's TTFT and TPOT (O(baseline_latency), O(candidate_latency)), each of TTFT p50, TTFT
    p90, TPOT p50 and TPOT p90 is judged across runs with the same sequential test, lower is better, against its margin
    (O(latency_margins)) and answers V(pass), V(regression) or V(inconclusive) with its ratio and interval
    (C(metrics) of RV(latency)). The verdict combines both parts. Any V(regression) is a V(regression) naming the metric and
    its figures, any final V(inconclusive) is V(inconclusive), a V(pass) needs every part's V(pass). Without latency the
    answer is throughput's alone and C(status) of RV(latency) is V(not measured).
  - Every setting is checked before anything is judged; run counts are at most 1000 and O(bootstrap_resamples) at most 100000.
  - The exact Mann-Whitney p-value and a seeded bootstrap interval of the median ratio are reported beside the answer; they
    do not change it. The same logic is the P(gpufleet.inference.throughput_gate#filter) filter. Nothing on the host changes.
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
    description: Candidate/baseline ratio below which the gate leans to a regression (V(0.95) is a 5% margin).
    type: float
    default: 0.95
  alpha:
    description: Error rate of V(regression) over all looks when nothing changed.
    type: float
    default: 0.01
  pass_alpha:
    description: Error rate of V(pass) over all looks when the candidate lost O(detect).
    type: float
    default: 0.005
  detect:
    description: The drop the gate must not pass (a fraction); default 1.6 x the margin (0.08 at O(threshold=0.95)).
    type: float
  min_runs:
    description: Baseline runs before any answer, and the candidate's first look unless O(candidate_min_runs) is set.
    type: int
    default: 5
  candidate_min_runs:
    description: Candidate runs at the first look (with V(4) and 5 baseline runs a quiet host is decided after 9 runs in all).
    type: int
    default: 4
  step:
    description: Candidate runs between looks.
    type: int
    default: 2
  max_runs:
    description: Candidate runs at the last look; V(inconclusive) there is final (O(min_runs) to 1000).
    type: int
    default: 15
  max_baseline_runs:
    description: Baseline runs at most, taken before the reboot while the smallest detectable drop is above the margin
      (O(min_runs) to 1000).
    type: int
    default: 15
  baseline_step:
    description: Baseline runs asked for at a time.
    type: int
    default: 1
  power:
    description: Power at which the smallest detectable drop is computed.
    type: float
    default: 0.8
  spending:
    description: Lan-DeMets spending function, V(pocock) (Pocock type, spends most at the first looks, so a quiet host stops
      early) or V(obf) (O'Brien-Fleming type, little spent early).
    type: str
    choices: [obf, pocock]
    default: pocock
  screen_alpha:
    description: Level of the one-outlier screen per side (Bonferroni over the side's runs).
    type: float
    default: 0.001
  drift_alpha:
    description: Level of the test that a side's steady change exceeds half the margin (then V(inconclusive)).
    type: float
    default: 0.001
  trend_guard:
    description:
      - From the second look on, a V(pass) or V(regression) is withheld when the runs of both sides share a trend in the
        direction that favours it (one slope over run order, each side its own level; one-sided p at most this) and, with that
        trend taken out, the ratio is no longer on the verdict's side of the threshold; at O(max_runs) it is V(inconclusive).
    type: float
    default: 0.1
  order:
    description:
      - How the runs were taken. V(sequential) (all baseline runs, then the change, then the candidate's, as in a kernel
        upgrade) or V(interleaved) (baseline and candidate runs in turns, run i of each side one after the other, as with two
        servers side by side or an A/A on one).
      - With V(interleaved) a speed that drifts through the measurement moves both sides alike and cancels from the
        ratio, so the drift check tests the ratio of each pair of runs instead of each side, and O(trend_guard) takes the
        shared trend out over the sides' distance in run order (none for sides of equal length).
    type: str
    choices: [sequential, interleaved]
    default: sequential
  pass_floor:
    description: A V(pass) also needs the ratio at or above 1 - O(pass_floor) x the margin (V(0.75) at O(threshold=0.95) is 0.9625).
    type: float
    default: 0.75
  baseline_failed:
    description: Failed requests plus short outputs of the baseline runs.
    type: int
    default: 0
  baseline_requests:
    description: Requests of the baseline runs (with V(0), O(baseline_failed) must be 0 as well, and no failures are counted).
    type: int
    default: 0
  candidate_failed:
    description: Failed requests plus short outputs of the candidate runs.
    type: int
    default: 0
  candidate_requests:
    description: Requests of the candidate runs.
    type: int
    default: 0
  requests_per_run:
    description: Requests per run, for the advice on how long runs would have to be on a noisy host.
    type: int
  baseline_workload:
    description:
      - The baseline's workload, an M(gpufleet.inference.inference_benchmark) result (its C(benchmark) return value) or a fingerprint,
        a dict of C(model), C(model_root), C(model_config), C(model_tokenizer), C(model_weights), C(max_model_len),
        C(vllm_version), C(server_argv), C(client), C(prompt_tokens), C(output_tokens), C(prompt_mode),
        C(token_id_range), C(ignore_eos), C(temperature), C(max_tokens), C(per_chunk_usage), C(requests), C(concurrency),
        C(profile), C(workload_profile) (the request profile of M(gpufleet.inference.inference_benchmark)'s
        O(gpufleet.inference.inference_benchmark#module:profile), its name and parameters), C(arrivals) (closed or
        open loop, its rate and burstiness). A result stored before profiles counts as unique random prompts in a
        closed loop; a difference inside a profile is named by its parameter, for example
        C(workload_profile.prefix_tokens), with both values.
      - When both workloads are given they must be equal in every field both carry (C(model), C(prompt_tokens),
        C(output_tokens), C(requests) and C(concurrency) on both sides), except the fields O(change) lets differ;
        otherwise the task fails naming each difference with both values.
        When only one is given, or the model identity, the vLLM version, the argv or the client on one side only, a
        warning says what could not be checked.
    type: dict
  change:
    description:
      - What the candidate changed, and so which workload fields may differ between the sides (every other must be equal).
      - V(none), V(kernel), V(host) (sysfs, PCIe, IRQ, hugepages tuning), V(driver) and V(nccl) (NCCL settings) let
        nothing of the workload differ; V(vllm_flags) lets C(server_argv) and C(max_model_len) differ; V(vllm_version) C(vllm_version) and C(server_argv).
      - See docs/benchmark.md, "What the gate compares".
    type: str
    choices: [none, kernel, host, driver, nccl, vllm_flags, vllm_version]
    default: none
  candidate_workload:
    description: The candidate's workload, as O(baseline_workload).
    type: dict
  workload_concurrency:
    description: The concurrency level compared, when the workloads are results that swept several levels.
    type: int
  baseline_latency:
    description:
      - Each baseline run's latency in ms, per metric, C(ttft_p50), C(ttft_p90), C(tpot_p50), C(tpot_p90) (the p50 and p90
        of that run's requests) and C(itl_p99) (the 99th percentile of its inter-token gaps), a list each with one
        figure per O(baseline) run in the same order. The P(gpufleet.inference.latency_samples#filter) filter makes it
        from an M(gpufleet.inference.inference_benchmark) result's C(benchmark.levels), per level.
      - A metric judged needs both sides; without latency the verdict is throughput's alone (C(status) of RV(latency) is V(not measured)).
    type: dict
  candidate_latency:
    description: Each candidate run's latency, as O(baseline_latency).
    type: dict
  latency_margins:
    description:
      - Per latency metric, the largest increase that is still a pass (V(0.10) is +10%; 0.01 to 1.0; null leaves the metric
        unjudged); metrics not given keep the defaults, C(ttft_p50) 0.10, C(ttft_p90) 0.15, C(tpot_p50) 0.075, C(tpot_p90)
        0.10, C(itl_p99) 0.25 (docs/benchmark.md says why and how to calibrate them).
      - C(itl_p99) is judged only where the baseline's own runs can tell its margin, else it is not judged (said in
        RV(latency)); TTFT and TPOT are not judged for a closed loop of fewer than 4 requests per slot (given
        O(baseline_workload)), whose runs fall into two latency regimes.
    type: dict
  latency_alpha:
    description: Each latency metric's false-regression rate over all looks (the five together spend 0.01); in (0, 0.5).
    type: float
    default: 0.002
  between_start_sd:
    description:
      - The noise between server starts, the standard deviation of the log of a start's mean throughput (V(0.008) is
        0.8%), when baseline and candidate runs come from different starts of the server (a kernel, driver or vLLM
        change). It widens the throughput test's variance by 2 x its square and the smallest detectable drop; from 0 to
        0.2.
      - Null (the default) counts the runs' own, within-start noise only, and the result says so (C(noise) of RV(gate)).
        docs/benchmark.md gives the H200's measured figures (0.36-0.79% for a GPU-bound 7B model).
    type: float
    version_added: 0.3.0
  bootstrap_resamples:
    description: Resamples of the bootstrap interval of the median ratio; V(0) skips it (at most 100000).
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
  outputs:
    description:
      - The result of M(gpufleet.inference.output_equivalence) in V(compare) mode against the candidate, the outputs part
        of the serving verdict (RV(verdict)). V(diverged) makes the verdict V(diverged) whatever the throughput.
      - Not given, the outputs part is V(not measured) and the verdict's reason says so.
    type: dict
  baseline_health:
    description:
      - The PCIe audit (the V(pcie) document of M(gpufleet.inference.pcie_facts)) taken before the change. With
        O(candidate_health) it gives the stability part of the serving verdict.
    type: dict
  candidate_health:
    description:
      - The PCIe audit taken with the change in force. A GPU gone from the bus, a link trained lower or whose capability
        fell, AER errors that grew and NVRM Xid events in O(kernel_log) make the verdict V(unstable); so does a candidate
        that failed a larger share of its requests than the baseline (O(baseline_failed) and the other counts).
    type: dict
  candidate_gpu_health:
    description:
      - The M(gpufleet.inference.gpu_health) result read with the change in force. Its uncorrectable ECC errors since the
        driver loaded, pending or failed row remaps or page retirements, hardware throttling, a grown PCIe replay counter
        and a failed or warned DCGM test make the verdict V(unstable).
      - Not given (or with neither NVML nor DCGM read), the GPU part of stability is not measured.
    type: dict
    version_added: 0.3.0
  kernel_log:
    description: The kernel log lines since O(baseline_health) was taken, read for NVRM Xid events.
    type: list
    elements: str
    default: []
  fail_on_regression:
    description:
      - Fail the task when the serving verdict says no for good (V(regression), V(diverged) or V(unstable)), with
        the verdict's reason as the message and the full result.
    type: bool
    default: false
notes:
  - Treat one whole benchmark run as one sample; requests inside a run are correlated by the server's batching.
  - The whole procedure as the kernel_upgrade role runs it is simulated by tests/benchmarks/bench_throughput_gate.py;
    docs/benchmark.md has the design, its boundaries and the figures (at 2% noise, 20 000 trials a case, no unchanged
    candidate called a regression, 0.035% inconclusive, 99.8% of 8% drops caught and 0.125% passed; at 5-20% noise
    at most 0.45% wrong verdicts, the rest V(inconclusive), the honest answer).
seealso:
  - module: gpufleet.inference.inference_benchmark
"""

EXAMPLES = r"""
- name: Judge the baseline alone, before the reboot (more baseline runs, or too noisy for the margin)
  gpufleet.inference.throughput_gate:
    baseline: "{{ baseline_bench.samples['32'] }}"
    candidate: []
    requests_per_run: 128
  register: baseline_check

- name: Judge the new kernel's runs against the old kernel's
  gpufleet.inference.throughput_gate:
    baseline: "{{ baseline_bench.samples['32'] }}"
    candidate: "{{ candidate_bench.samples['32'] }}"
    baseline_failed: "{{ baseline_bench.benchmark.errors + baseline_bench.benchmark.short_outputs }}"
    baseline_requests: "{{ baseline_bench.benchmark.requests }}"
    candidate_failed: "{{ candidate_bench.benchmark.errors + candidate_bench.benchmark.short_outputs }}"
    candidate_requests: "{{ candidate_bench.benchmark.requests }}"
    # refused when the two were not the same workload (model and its files, vLLM version and argv, lengths,
    # concurrency, requests per run): a kernel change lets nothing of it differ
    baseline_workload: "{{ baseline_bench.benchmark }}"
    candidate_workload: "{{ candidate_bench.benchmark }}"
    workload_concurrency: 32
    change: kernel
  register: gate

- name: Run more candidate runs (the gated level only, no warm-up) while the gate asks for them
  gpufleet.inference.inference_benchmark:
    concurrency: [32]
    repetitions: "{{ gate.runs_needed }}"
    measured_only: true
    seed: 1
  register: more_runs
  when: gate.runs_needed > 0

- name: Stop the play on a regression
  gpufleet.inference.throughput_gate:
    baseline: [1012.5, 1003.1, 998.7, 1020.0, 1009.9]
    candidate: [921.4, 930.8, 915.0, 925.2, 934.1]
    threshold: 0.95
    fail_on_regression: true
"""

RETURN = r"""
verdict:
  description:
    - The serving verdict (docs/benchmark.md, "The serving verdict"), the gate's answer with the outputs and the
      stability parts. V(verdict) is the first no of V(unstable), V(diverged), V(regression), V(inconclusive), else
      V(pass); V(keep) is true for V(pass) only; V(parts) holds the throughput, latency, outputs and stability parts,
      each with its own V(answer), what it V(says) (V(yes), V(no), V(wait) or V(not measured)) and its V(reason).
  returned: always
  type: dict
  sample: {verdict: unstable, keep: false, reason: "unstable: GPU 0000:97:00.0 (H200) was in the previous audit but is
           not on the PCI bus now (outputs not measured)", parts: {stability: {answer: unstable, says: "no"}}}
decision:
  description: The gate's own answer (throughput and latency), V(pass), V(regression) or V(inconclusive).
  returned: always
  type: str
  sample: regression
ratio:
  description: Candidate / baseline ratio of the geometric means of the runs kept; null before both sides have runs.
  returned: always
  type: float
  sample: 0.913
p_value:
  description: One-sided p-value (Student's t on logs) that the candidate is slower than the baseline; null before a look.
  returned: always
  type: float
  sample: 0.00001
runs_needed:
  description: More candidate runs to measure before asking again (0 once the answer is final).
  returned: always
  type: int
  sample: 0
reason:
  description: The answer in words, with the figures it rests on.
  returned: always
  type: str
  sample: "regression: candidate/baseline 91.7% (geometric means; threshold 95%, CV 0.8%, look 5/15, 5 vs 5 runs); below
    the threshold and significantly slower than the baseline (p=1.2e-06 <= 0.0016, this look's share of alpha 0.01)"
latency:
  description:
    - The latency part. C(status) V(judged) or V(not measured) (no latency given; the verdict is throughput's alone); the
      C(margins) in force and C(alpha); C(metrics), per metric judged, C(decision), C(final), C(ratio) (candidate/baseline
      of the runs' geometric means), C(interval) (its interval at the look's levels), C(margin), C(baseline_ms),
      C(candidate_ms) (medians of the runs), C(p_value) (that it rose), C(p_value_pass), C(cv), C(look_runs), C(runs_needed)
      and C(reason); C(not_measured), metrics with a margin that one side did not carry; C(not_judged), per metric
      left unjudged, why (a closed loop in waves, an ITL p99 its baseline cannot tell); C(status) V(not judged) when
      every metric given was.
  returned: always
  type: dict
  sample: {status: judged, margins: {ttft_p50: 0.1, ttft_p90: 0.15, tpot_p50: 0.075, tpot_p90: 0.1, itl_p99: 0.25}, alpha: 0.002,
           metrics: {ttft_p50: {decision: regression, final: true, ratio: 2.01, interval: [1.93, 2.09], margin: 0.1,
                                baseline_ms: 50.2, candidate_ms: 100.9, reason: "TTFT p50 regression: candidate/baseline 2.01x"}}}
throughput:
  description: The throughput part's own answer (C(decision), C(final), C(decided_by), C(ratio), C(reason)) when latency was judged.
  returned: when latency was judged
  type: dict
  sample: {decision: pass, final: true, decided_by: test, ratio: 0.993, reason: "pass: candidate/baseline 99.3% ..."}
gate:
  description: The whole judgement.
  returned: always
  type: dict
  contains:
    decision:
      description: Same as RV(decision).
      type: str
    final:
      description: Whether the answer is final (a pass, a regression, or an inconclusive at the cap, on drift or too noisy).
      type: bool
    stage:
      description: C(baseline) (no candidate runs given) or C(candidate).
      type: str
    ratio:
      description: Same as RV(ratio).
      type: float
    p_value:
      description: Same as RV(p_value).
      type: float
    p_value_pass:
      description: One-sided p-value that the candidate lost less than O(detect).
      type: float
    p_value_mwu:
      description: Exact one-sided Mann-Whitney U p-value (candidate lower), reported only.
      type: float
    detect:
      description: The drop the gate must not pass.
      type: float
    method:
      description: The test and spending function used.
      type: str
    decided_by:
      description:
        - C(test), C(failures) (more failed requests than the baseline), C(drift), C(cap) (inconclusive at O(max_runs)),
          C(too-noisy), C(baseline-noisy) (more baseline runs asked for), C(baseline-screened) (one more baseline run in
          place of a screened one), C(baseline-ready) or C(waiting).
      type: str
    cv:
      description: Run-to-run coefficient of variation from the pooled spread of the log throughputs.
      type: float
    smallest_detectable_drop:
      description: The drop this spread lets the design tell from no change (fixed test at O(alpha), power O(power), at the cap).
      type: float
    too_noisy:
      description: True when the baseline, at O(max_baseline_runs), still cannot resolve the margin (stop before any change).
      type: bool
    advice:
      description: What would help an inconclusive answer (longer runs, more runs, a quieter host).
      type: str
    screened:
      description: Runs left out as outliers, each with C(side), C(index), C(value), C(p) and C(reason).
      type: list
      elements: dict
    look:
      description:
        - C(candidate_runs), C(information) (fraction of the last look's), C(nominal_pass), C(nominal_regression) (this
          look's levels), C(spent_pass), C(spent_regression) and C(last).
      type: dict
    interval:
      description: Repeated confidence interval of the ratio at this look's nominal levels, or null.
      type: list
      elements: float
    runs_needed:
      description: Same as RV(runs_needed).
      type: int
    baseline_runs_needed:
      description: Baseline runs to add before the reboot (missing to O(min_runs), or asked for by the noise check).
      type: int
    baseline:
      description:
        - C(n), C(median), C(mean), C(min), C(max) and C(cv) of the baseline runs, C(drift) (C(change), C(t), C(p_rising),
          C(p_falling), C(p_rising_beyond), C(p_falling_beyond), C(df)) and, at a look, C(trend) (Mann-Kendall).
      type: dict
    candidate:
      description: The same for the candidate runs.
      type: dict
    trend:
      description:
        - At a look, the slope over run order shared by both sides (each side its own level) - C(slope) and C(se) (log units per
          run), C(change_per_run), C(t), C(df), C(p_rising), C(p_falling) - and, from the second look, C(adjusted_ratio)
          (the ratio with that trend taken out over the gap between the sides); see O(trend_guard).
      type: dict
    order:
      description: O(order) as judged (from the candidate stage on).
      type: str
    ratio_drift:
      description:
        - With O(order=interleaved), the drift check of the pairs' ratio (C(change) over the pairs, C(t), C(df), C(p_rising),
          C(p_falling) and the one-sided p-values that the change is beyond half the margin).
      type: dict
    ci:
      description: Bootstrap interval of the median ratio at C(ci_level), or null.
      type: list
      elements: float
    ci_level:
      description: Confidence level of C(ci).
      type: float
    warnings:
      description: Cautions (a CV too high for the threshold, screened runs); also emitted as task warnings.
      type: list
      elements: str
    reason:
      description: Same as RV(reason).
      type: str
  sample: {decision: pass, final: true, stage: candidate, ratio: 0.998, p_value: 0.44, p_value_pass: 0.00001,
           method: "log-t, pocock spending", decided_by: test, cv: 0.008, smallest_detectable_drop: 0.018, too_noisy: false,
           runs_needed: 0, baseline_runs_needed: 0, screened: [], threshold: 0.95, alpha: 0.01, pass_alpha: 0.005,
           ci: null, ci_level: 0.95, warnings: [], reason: "pass: ..."}
actions:
  description: Always empty; the module changes nothing (the list of action dicts every module of the collection returns).
  returned: always
  type: list
  elements: dict
  sample: []
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.gate_settings import GATE, ORDERS, SPENDING
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.throughput_gate import execute
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import GateError
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.workload import CHANGES

ARGUMENT_SPEC = dict(
    baseline=dict(type="list", elements="float", required=True),
    candidate=dict(type="list", elements="float", required=True),
    threshold=dict(type="float", default=GATE.threshold),
    alpha=dict(type="float", default=GATE.alpha),
    pass_alpha=dict(type="float", default=GATE.pass_alpha, no_log=False),
    detect=dict(type="float"),
    min_runs=dict(type="int", default=GATE.min_runs),
    candidate_min_runs=dict(type="int", default=GATE.candidate_min_runs),
    step=dict(type="int", default=GATE.step),
    max_runs=dict(type="int", default=GATE.max_runs),
    max_baseline_runs=dict(type="int", default=GATE.max_baseline_runs),
    baseline_step=dict(type="int", default=GATE.baseline_step),
    power=dict(type="float", default=GATE.power),
    spending=dict(type="str", choices=list(SPENDING), default=GATE.spending),
    screen_alpha=dict(type="float", default=GATE.screen_alpha),
    drift_alpha=dict(type="float", default=GATE.drift_alpha),
    trend_guard=dict(type="float", default=GATE.trend_guard),
    order=dict(type="str", choices=list(ORDERS), default=GATE.order),
    pass_floor=dict(type="float", default=GATE.pass_floor, no_log=False),
    baseline_failed=dict(type="int", default=0),
    baseline_requests=dict(type="int", default=0),
    candidate_failed=dict(type="int", default=0),
    candidate_requests=dict(type="int", default=0),
    requests_per_run=dict(type="int"),
    baseline_workload=dict(type="dict"),
    candidate_workload=dict(type="dict"),
    workload_concurrency=dict(type="int"),
    change=dict(type="str", choices=list(CHANGES), default="none"),
    outputs=dict(type="dict"),
    baseline_health=dict(type="dict"),
    candidate_health=dict(type="dict"),
    candidate_gpu_health=dict(type="dict"),
    kernel_log=dict(type="list", elements="str", default=[]),
    baseline_latency=dict(type="dict"),
    candidate_latency=dict(type="dict"),
    latency_margins=dict(type="dict"),
    latency_alpha=dict(type="float", default=GATE.latency_alpha),
    between_start_sd=dict(type="float"),
    bootstrap_resamples=dict(type="int", default=GATE.bootstrap),
    seed=dict(type="int", default=GATE.seed),
    unit=dict(type="str", default=GATE.unit),
    fail_on_regression=dict(type="bool", default=False),
)


def main():
    run_module(ModuleSpec("throughput_gate", ARGUMENT_SPEC, "reads and writes nothing on the host", (GateError,)), execute)


if __name__ == "__main__":
    main()

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The throughput gate: is a candidate (new kernel, new tuning) slower than its baseline? Pure, standard library only.

Each sample is one whole benchmark run (its output tokens/s): requests inside a run are correlated by the
server's batching, so runs, not requests, are the independent observations. Higher is better.

The design (docs/benchmark.md has the long form and the simulated error rates):

* **Scale.** Run-to-run noise is multiplicative, so the test works on log throughput; d = mean(log candidate)
  - mean(log baseline) estimates the log of the ratio, with the pooled standard deviation s of both sides
  (df = n_b + n_c - 2) and SE = s sqrt(1/n_b + 1/n_c); with ``between_start_sd`` (sigma_b, the noise between server
  starts) SE = sqrt(s^2 (1/n_b + 1/n_c) + 2 sigma_b^2), the same df, and every result says which noise it counted.
* **Outliers.** Before anything else, each side's run farthest from its median is screened out when a
  leave-one-out prediction test (Student's t, Bonferroni over the side's runs) gives p <= ``screen_alpha``
  (at most one run per side, only with ``min_runs`` runs or more); what was screened is reported.
* **Baseline first.** decide(baseline, []) judges the baseline alone, before the reboot: the smallest drop
  the whole design could detect, from the baseline's own spread, sdd = 1 - exp(-(t_pass + t_power) SE_cap)
  (SE_cap with ``max_runs`` candidate runs, t quantiles at the last look's nominal level and at ``power``).
  Above the margin (1 - threshold) it asks for more baseline runs (``baseline_step`` at a time, up to
  ``max_baseline_runs``); still above at that cap it stops before any change (``too_noisy``).
* **Sequential test.** Candidate looks at n_c = candidate_min_runs (4), then every ``step`` (2) runs up to
  max_runs (15). Each look spends part of two error rates by the Lan-DeMets spending function (``spending``:
  Pocock type by default, so a quiet host stops at the first look) of the information fraction
  tau = (1/n_b + 1/max_runs) / (1/n_b + 1/n_c); the looks before the last spend (1 - ``reserve``) of it and
  the last look what is left (``reserve`` 0.3: a cap that can still decide). The nominal level of a look is
  the increment of the spent error, so by Bonferroni's inequality the error rates hold over all looks,
  whatever their correlation (Lan and DeMets 1983; Jennison and Turnbull 2000, ch. 7 and 11):

  - **pass** when d >= log(1 - pass_floor x margin) (0.9625 at 0.95) and the t-test of "lost ``detect``
    (8%) or more" has p <= the look's share of ``pass_alpha``: P(pass) <= ``pass_alpha`` whenever the true
    drop is ``detect`` or more; drops between 3.75% and 8% are the indifference zone (either answer is allowed,
    and a rollback is the safe one);
  - **regression** when d < log(threshold) and the t-test of "slower than the baseline" has p <= the look's
    share of ``alpha``: P(regression) <= ``alpha`` with no change (or a faster candidate);
  - otherwise ``runs_needed`` more candidate runs, and at ``max_runs`` a final ``inconclusive``.

* **Drift.** A side whose runs rise or fall steadily (least-squares slope of the logs, one-sided
  p <= ``drift_alpha`` that the change over the side exceeds half the margin) makes the answer ``inconclusive``
  (final). From the second look on, the **trend guard**: one slope over run order shared by both sides (each side
  its own level, analysis of covariance; df = n_b + n_c - 3) whose one-sided p in the direction that favours
  the verdict is <= ``trend_guard`` (0.1), and with that trend taken out over the gap between the sides
  (d - slope x (n_b + n_c) / 2) the ratio is no longer on the verdict's side of its boundary: the verdict is
  withheld (more runs; at the cap a final ``inconclusive``, decided_by drift). A drift that goes on through the
  reboot moves the candidate against the baseline, and every further look moves it more.
* **Run order.** ``order="sequential"`` (the default: all baseline runs, then the change, then the candidate's)
  is the kernel upgrade's. ``order="interleaved"`` says baseline and candidate runs were taken in turns (two
  servers side by side, or an A/A on one), run i of each side one after the other: a speed that drifts
  through the measurement then moves both sides alike and cancels from the ratio. There the drift check
  tests the ratio itself (the slope of log(candidate_i / baseline_i) over the pairs, same rule), and the
  trend guard's gap between the sides is their centroids' distance in run order ((n_c - n_b) / 2, zero for
  equal sides) instead of (n_b + n_c) / 2.
* **Screened baseline run.** When the baseline check screens a run out and fewer than ``min_runs`` are left,
  it asks for one more baseline run in its place, while still before the change.
* **Failures.** A candidate with a larger share of failed requests or short outputs than its baseline
  cannot pass (``regression``, decided by the failures). A share is failures / requests: failures with no
  requests counted, negative or non-integer counts, or more failures than requests are refused (GateError).
* **Dead runs.** A run at 0 tok/s (the server died in it, or failed every request) is a failure, never an
  outlier: a dead candidate run is a ``regression`` (decided by the failures), a dead baseline run a GateError
  (measure the baseline again). The outlier screen never sees either.
* **Workloads.** Runs of different workloads are never compared: given both sides' workload (an
  inference_benchmark result, or its fingerprint, see bench/workload.py ``workload()``), any difference outside
  what the change under test is about (RunFacts ``change``, ``CHANGES``) is a GateError naming each field,
  "field: baseline X, candidate Y" (``workload_mismatch()``; the rule for older results that carry no
  fingerprint is in its docstring and docs/benchmark.md).
* **Latency.** decide() is decide_throughput() plus the latency part: given each run's TTFT and TPOT (p50 and p90)
  and ITL p99 (``baseline_latency``/``candidate_latency``), each metric is judged by decide_throughput() on 1/latency
  at threshold 1/(1 + its margin) (``latency_margins``, DEFAULT_LATENCY_MARGINS) and ``latency_alpha``, each part a
  sequential test of its own (its first final answer over the looks), and the parts combined by _combine(): any
  regression is a regression, any final inconclusive is inconclusive, a pass needs every part's pass. Without latency
  the answer is throughput's alone, ``latency.status`` ``not measured`` (docs/benchmark.md, "The latency part"). A
  metric is ``not judged`` (``latency.not_judged``, with why) where its runs cannot tell: TTFT and TPOT of a closed
  loop of fewer than MIN_REQUESTS_PER_SLOT requests per slot (wave_guard()), a tail metric whose baseline cannot tell
  its margin (_tail_unjudged()).
* **Settings** are checked before any run (``check_all_settings()``), each with its allowed range; run counts
  are at most ``MAX_RUNS`` (1000) and bootstrap resamples at most ``MAX_BOOTSTRAP`` (100000).

``inconclusive`` is an answer: it carries the measured CV, the smallest detectable drop and what would help.
The exact one-sided Mann-Whitney p-value and a seeded bootstrap interval are reported beside it; they do not
change the decision. Statistics live in bench/stats.py (shared with the benchmark client); every setting and its default
in bench/gate_settings.py (``GateSettings``, ``GATE``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Sequence

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.gate_settings import (
    CANDIDATE_MIN_RUNS, GATE, LATENCY_LABELS, LATENCY_METRICS, LATENCY_TAIL_METRICS, MIN_REQUESTS_PER_SLOT, NO_FACTS,
    WAVE_FREE_PROFILES, WAVE_METRICS, GateSettings, RunFacts, gate_inputs,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import (
    GateError, bootstrap_ratio_ci, median, mwu_less, sample_stats, screen_one, slope_test, spent_alpha, t_quantile,
    t_sf, trend,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.verdict import VerdictError, judged_verdict
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.workload import check_workloads, side_workload
from ansible_collections.gpufleet.inference.plugins.module_utils.gpu.checks import unstable


# The statistics (bench/stats.py) and the settings (bench/gate_settings.py) stay importable from here (callers and
# tests used them from this module before the split).
__all__ = [
    "DECISIONS", "check_runs", "common_trend", "decide", "detectable_drop", "drift_check", "look_level", "replay",
    "schedule", "check_all_settings", "check_count", "decide_throughput", "latency_series", "run_latency",
    "latency_part",
]

DECISIONS = ("pass", "regression", "inconclusive")


# ---- input --------------------------------------------------------------------------------------
def check_runs(name: str, values: Any) -> list[float]:
    """The runs of one side as floats; GateError naming the side and the bad value otherwise."""
    if not isinstance(values, (list, tuple)):
        raise GateError(f"{name} must be a list of per-run throughputs (numbers), got {type(values).__name__}")
    out = []
    for i, value in enumerate(values):
        if isinstance(value, bool):
            raise GateError(f"{name}[{i}] is {value!r}, not a number: pass one throughput (tok/s) per run")
        if not isinstance(value, (int, float)):
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise GateError(f"{name}[{i}] is {value!r}, not a number: pass one throughput (tok/s) per run") from None
        value = float(value)
        if math.isnan(value) or math.isinf(value) or value < 0:
            raise GateError(f"{name}[{i}] is {value}: throughputs must be finite and not negative")
        out.append(value)
    return out


def check_count(name: str, value: Any) -> int:
    """A count of requests or failures: a whole number, 0 or more; GateError naming it otherwise."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GateError(f"{name} must be a whole number of requests, 0 or more, got {value!r}")
    return value


def check_all_settings(settings: GateSettings | None = None, **options: Any) -> None:
    """Every setting of decide() checked, before any run is measured: GateError with the allowed range."""
    decide([], [], settings, **options)


def _fmt(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:.1f}"


def _logs(values: Sequence[float]) -> list[float]:
    top = max(values) if values else 1.0
    return [math.log(max(v, 1e-9 * max(top, 1e-9))) for v in values]


def _mean_var(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, sum((v - mean) ** 2 for v in values)


# ---- the design: looks, spent error, smallest detectable drop -------------------------------------
@lru_cache(maxsize=1024)
def schedule(min_runs: int, step: int, max_runs: int) -> tuple[int, ...]:
    """Candidate run counts at which the gate looks: min_runs, min_runs + step, ..., max_runs."""
    looks = list(range(min_runs, max_runs, step)) + [max_runs]
    return tuple(sorted(set(looks)))


@lru_cache(maxsize=8192)
def look_level(n_b: int, n_c: int, min_runs: int, step: int, max_runs: int, alpha: float, kind: str,
               reserve: float = 0.0) -> tuple[float, float, float]:
    """(nominal level of this look, error spent up to it, information fraction) for ``n_c`` candidate runs.

    The nominal level is the increment of the spent error since the previous scheduled look; runs past
    ``max_runs`` are the last look. With ``reserve`` r, the looks before the last spend (1 - r) x the spending
    function and the last look spends what is left (a spending function with a step at tau = 1, still
    non-decreasing and reaching alpha, so the Bonferroni bound over the looks holds as before).
    """
    looks = schedule(min_runs, step, max_runs)
    n_c = min(n_c, max_runs)

    def tau(n: int) -> float:
        return (1.0 / n_b + 1.0 / max_runs) / (1.0 / n_b + 1.0 / n)

    def spent_at(n: int) -> float:
        return alpha if n >= max_runs else (1.0 - reserve) * spent_alpha(alpha, tau(n), kind)

    earlier = [k for k in looks if k < n_c]
    before = spent_at(earlier[-1]) if earlier else 0.0
    spent = spent_at(n_c)
    return max(spent - before, 0.0), spent, tau(n_c)


def detectable_drop(sd_log: float, n_b: int, df: int, settings: GateSettings) -> float:
    """Smallest drop (a fraction) told from no change with the set power, for this spread, at the cap.

    The textbook size of a fixed one-sided test at level ``alpha`` with ``max_runs`` candidate runs:
    1 - exp(-(t_alpha + t_power) x SE_cap), SE_cap = sqrt(s^2 (1/n_b + 1/max_runs) + 2 sigma_b^2) (sigma_b the
    settings' ``between_start_sd``, 0 when None), t quantiles with the cap's degrees of freedom.
    """
    se_cap = _se(sd_log, n_b, settings.max_runs, settings.start_sd())
    df = max(df, 1)
    q = t_quantile(settings.alpha, df) + t_quantile(1.0 - settings.power, df)
    return 1.0 - math.exp(-q * se_cap)


def _se(sd_log: float, n_b: int, n_c: int, start_sd: float) -> float:
    """The standard error of d = mean(log candidate) - mean(log baseline): the runs' pooled spread over both sides'
    runs, plus each side's server start as one draw of the between-start noise (2 sigma_b^2; 0: within-start only)."""
    return math.sqrt(sd_log * sd_log * (1.0 / n_b + 1.0 / n_c) + 2.0 * start_sd * start_sd)


def noise_counted(settings: GateSettings) -> str:
    """Which noise the gate's interval, p-values and smallest detectable drop count (said in every result)."""
    sb = settings.start_sd()
    if not sb:
        return ("within-start noise only (between_start_sd not set: across a server restart the interval leaves out how "
                "much two starts of one server differ)")
    return f"within-start noise and a between-start sd of {sb:.2%} (between_start_sd)"


def _noise_short(settings: GateSettings) -> str:
    sb = settings.start_sd()
    return f"between-start sd {sb:.2%} counted" if sb else "within-start noise only"


def _cv(sd_log: float) -> float:
    return math.sqrt(max(math.exp(sd_log * sd_log) - 1.0, 0.0))


def _advice(sdd: float, margin: float, requests_per_run: int | None) -> str:
    if sdd <= margin:
        return "more runs (raise max_runs) would narrow the interval"
    factor = (sdd / margin) ** 2
    longer = (f"runs of about {int(math.ceil(requests_per_run * factor))} requests (now {requests_per_run})"
              if requests_per_run else f"runs about {factor:.1f} times as long")
    return (f"{longer}, if the noise averages out within a run; more runs (max_runs, max_baseline_runs); or a quieter host")


def _screen(name: str, values: Sequence[float], logs: list[float], alpha: float, min_runs: int,
            unit: str) -> tuple[list[float], list[int], list[dict[str, Any]]]:
    """The logs kept, their run indexes, and what was screened (at most one run)."""
    hit = screen_one(logs, alpha=alpha, min_n=min_runs)
    if hit is None:
        return logs, list(range(len(logs))), []
    i = hit["index"]
    note = {"side": name, "index": i, "value": values[i], "p": hit["p"],
            "reason": (f"{name} run {i + 1} ({_fmt(values[i])} {unit}) stands apart from the side's other runs "
                       f"(median {_fmt(math.exp(hit['median_of_rest']))} {unit}; leave-one-out p={hit['p']:.2g}): "
                       "left out of the test")}
    keep = [j for j in range(len(logs)) if j != i]
    return [logs[j] for j in keep], keep, [note]


def drift_check(sides: dict[str, list[float]], half_margin: float, alpha: float,
                min_df: int = 6) -> tuple[dict[str, dict[str, Any]], str | None]:
    """Steady drift inside each side: the least-squares slope of its logs against run order.

    The slopes are tested with the residual variance pooled over the sides' fits (df = sum(n - 2)), so a side
    of five runs does not flag drift on a lucky small residual; no flag below ``min_df``. A side flags when its
    change over its runs is shown to exceed ``half_margin`` (logs): one-sided t-test of the slope against the
    slope of that change, p <= ``alpha``. ``p_rising``/``p_falling`` test the slope against zero (reported).
    """
    fits = {name: slope_test(logs) for name, logs in sides.items()}
    df = sum(max(len(logs) - 2, 0) for logs in sides.values())
    ss = sum(f.get("resid_ss", 0.0) for f in fits.values())
    info: dict[str, dict[str, Any]] = {}
    flag = None
    for name, fit in fits.items():
        entry = {"change": math.expm1(fit["change"]), "t": None, "p_rising": 1.0, "p_falling": 1.0,
                 "p_rising_beyond": 1.0, "p_falling_beyond": 1.0, "df": df}
        if fit.get("sxx") and df > 0:
            se = math.sqrt(ss / df / fit["sxx"])
            t = fit["slope"] / se if se > 0 else math.copysign(math.inf, fit["slope"]) if fit["slope"] else 0.0
            per_run = half_margin / (len(sides[name]) - 1)  # the slope of a change of half the margin
            # with no residual spread (runs on a line) the slope is exact: beyond half the margin or not at all
            entry.update(t=t, p_rising=t_sf(t, df), p_falling=t_sf(-t, df),
                         p_rising_beyond=t_sf((fit["slope"] - per_run) / se, df) if se > 0 else float(fit["slope"] <= per_run),
                         p_falling_beyond=t_sf((-fit["slope"] - per_run) / se, df) if se > 0 else float(-fit["slope"] <= per_run))
        info[name] = entry
        if flag or df < min_df:
            continue
        for direction, key, sign in (("rose", "p_rising", 1.0), ("fell", "p_falling", -1.0)):
            if entry[key + "_beyond"] <= alpha:
                what = f"the {name}" if name.endswith("ratio") else f"{name} runs"
                flag = (f"{what} {direction} steadily by {entry['change']:+.1%} over {len(sides[name])} runs "
                        f"(p={entry[key + '_beyond']:.2g} that it is beyond half the gate's margin): runs that are not "
                        "alike cannot be compared; " +
                        ("warm the server up longer (settle_runs, warmup)" if sign > 0 else
                         "find what slowed the host (thermal throttling, another job)"))
                break
    return info, flag


def common_trend(b_logs: Sequence[float], c_logs: Sequence[float]) -> dict[str, Any]:
    """One slope over run order shared by both sides, each side with its own level (analysis of covariance)."""
    sxx = sxy = ss = 0.0
    for logs in (b_logs, c_logs):
        n = len(logs)
        xm, ym = (n - 1) / 2.0, sum(logs) / n
        sxx += sum((i - xm) ** 2 for i in range(n))
        sxy += sum((i - xm) * (v - ym) for i, v in enumerate(logs))
        ss += sum((v - ym) ** 2 for v in logs)
    df = len(b_logs) + len(c_logs) - 3
    out = {"change_per_run": 0.0, "slope": 0.0, "se": None, "t": 0.0, "df": df, "p_rising": 1.0, "p_falling": 1.0}
    if sxx <= 0 or df < 1:
        return out
    slope = sxy / sxx
    resid = max(ss - slope * sxy, 0.0)
    se = math.sqrt(resid / df / sxx)
    out.update(change_per_run=math.expm1(slope), slope=slope, se=se)
    if se <= 0:
        out.update(p_rising=0.0 if slope > 0 else 1.0, p_falling=0.0 if slope < 0 else 1.0)
        return out
    t = slope / se
    out.update(t=t, p_rising=t_sf(t, df), p_falling=t_sf(-t, df))
    return out


def _failure_rate(side: str, failed: Any, requests: Any) -> float:
    """failures / requests of one side; 0 with neither counted. GateError for counts that give no rate."""
    failed, requests = check_count(f"{side}_failed", failed), check_count(f"{side}_requests", requests)
    if failed > requests:
        raise GateError(f"{side}_failed ({failed}) is more than {side}_requests ({requests}): pass the requests the "
                        f"{side} runs sent (failed requests and short outputs are among them)")
    return failed / requests if requests else 0.0


@dataclass(frozen=True)
class _Bounds:
    """What the design derives from the settings: the margin, the drop to detect, and the log boundaries (the
    threshold, half the margin, the drop to detect and the pass floor)."""

    margin: float
    detect: float
    log_t: float
    log_r: float
    log_p: float
    log_f: float


@dataclass(frozen=True)
class _Fit:
    """One side's logs kept after the screen, their run indexes, what was screened, and their mean and sum of squares."""

    logs: list
    keep: list
    screened: list
    mean: float
    ss: float


@dataclass(frozen=True)
class _Look:
    """The test at one look: the log ratio ``d``, its standard error and df, both p-values, the look's levels."""

    d: float
    se: float
    df: int
    p_drop: float
    p_pass: float
    nominal_p: float
    nominal_r: float
    sdd: float
    last: bool


def _bounds(s: GateSettings) -> _Bounds:
    margin, detect = s.margin, s.drop_to_detect()
    return _Bounds(margin, detect, math.log(s.threshold), math.log(1.0 - margin / 2.0), math.log(1.0 - detect),
                   math.log(1.0 - s.pass_floor * margin))


def _checked(baseline: Any, candidate: Any, s: GateSettings,
             facts: RunFacts) -> tuple[list[float], list[float], tuple[float, float], str]:
    """Both sides' runs, the settings checked, both failure rates and the workload warning; GateError for bad input."""
    base = check_runs("baseline", baseline)
    cand = check_runs("candidate", candidate)
    s.check()
    fails = (_failure_rate("baseline", facts.baseline_failed, facts.baseline_requests),
             _failure_rate("candidate", facts.candidate_failed, facts.candidate_requests))
    return base, cand, fails, check_workloads(facts.baseline_workload, facts.candidate_workload, facts.change)


def _first_result(base: list[float], cand: list[float], s: GateSettings, unrecorded: str) -> dict[str, Any]:
    """The result before anything is judged: inconclusive, waiting, with the settings and both sides' statistics."""
    return {
        "decision": "inconclusive", "final": False, "stage": "baseline", "ratio": None, "p_value": None,
        "p_value_pass": None, "p_value_mwu": None, "detect": None, "method": f"log-t, {s.spending} spending",
        "threshold": s.threshold, "alpha": s.alpha, "pass_alpha": s.pass_alpha, "min_runs": s.min_runs,
        "max_runs": s.max_runs, "max_baseline_runs": s.max_baseline_runs,
        "baseline": sample_stats(base) if base else {"n": 0}, "candidate": sample_stats(cand) if cand else {"n": 0},
        "cv": None, "smallest_detectable_drop": None, "too_noisy": False, "screened": [], "look": None,
        "interval": None, "ci": None, "ci_level": s.ci_level, "runs_needed": 0, "baseline_runs_needed": 0,
        "decided_by": "waiting", "advice": "", "warnings": [unrecorded] if unrecorded else [], "reason": "",
        "noise": {"between_start_sd": s.start_sd() or None, "counted": noise_counted(s)},
    }


def _baseline_fit(base: list[float], s: GateSettings, b: _Bounds, result: dict[str, Any]) -> tuple[_Fit, str | None]:
    """The baseline's own figures (screen, spread, smallest detectable drop, drift) into ``result``; its fit and its
    drift flag. GateError for a dead baseline run."""
    dead = [str(i + 1) for i, v in enumerate(base) if v <= 0]
    if dead:
        raise GateError(f"baseline run(s) {', '.join(dead)} of {len(base)} produced no tokens (0 {s.unit}): the server died "
                        "or failed every request in them. A dead run is a failure, not an outlier, and a baseline with one "
                        "cannot be compared with anything; fix the baseline server and measure it again")
    b_logs, b_keep, screened = _screen("baseline", base, _logs(base), s.screen_alpha, s.min_runs, s.unit)
    result["screened"] = screened
    b_mean, b_ss = _mean_var(b_logs)
    b_sd = math.sqrt(b_ss / (len(b_logs) - 1))
    sdd_b = detectable_drop(b_sd, len(b_logs), len(b_logs) - 1 + s.max_runs - 1, s)
    result.update(cv=_cv(b_sd), smallest_detectable_drop=sdd_b)
    b_info, b_drift = drift_check({"baseline": b_logs}, -b.log_r, s.drift_alpha)
    result["baseline"]["drift"] = b_info["baseline"]
    return _Fit(b_logs, b_keep, screened, b_mean, b_ss), b_drift


def _baseline_verdict(base: list[float], fit: _Fit, drift: str | None, s: GateSettings, b: _Bounds,
                      result: dict[str, Any]) -> dict[str, Any]:
    """The baseline alone, before any change: drifting, one more run for a screened one, ready, more runs, or too noisy."""
    sdd_b, margin, first, cap = result["smallest_detectable_drop"], b.margin, s.first_look, s.max_baseline_runs
    if drift:
        result.update(final=True, decided_by="drift", advice=drift.split("; ")[-1],
                      reason=f"inconclusive before any change: {drift}")
    elif fit.screened and len(fit.logs) < s.min_runs and len(base) < cap:
        result.update(baseline_runs_needed=1, decided_by="baseline-screened", advice="",
                      reason=(f"inconclusive: {fit.screened[0]['reason']}; run 1 more baseline run in its place before any "
                              "change (the baseline cannot be extended after it)"))
    elif sdd_b <= margin:
        result.update(runs_needed=first, decided_by="baseline-ready", advice="",
                      reason=(f"baseline ready: {len(base)} runs, CV {result['cv']:.1%}, smallest detectable drop "
                              f"{sdd_b:.1%} (margin {margin:.0%}; {_noise_short(s)}): measure {first} candidate runs"))
    elif detectable_drop(0.0, len(fit.logs), len(fit.logs) - 1 + s.max_runs - 1, s) > margin:
        floor = detectable_drop(0.0, len(fit.logs), len(fit.logs) - 1 + s.max_runs - 1, s)
        result.update(final=True, too_noisy=True, decided_by="too-noisy",
                      advice=("a lower threshold, or both sides measured in one server start (the between-start noise "
                              "does not average out over more runs)"))
        result["reason"] = (f"host too noisy for a {margin:.0%} gate across a server restart: the between-start sd of "
                            f"{s.start_sd():.2%} alone makes the smallest detectable drop {floor:.1%} however many runs "
                            f"are taken ({sdd_b:.1%} with the runs' CV of {result['cv']:.1%}); try "
                            f"{result['advice']}. Nothing was changed.")
    elif len(base) < cap:
        result.update(baseline_runs_needed=min(s.baseline_step or 1, cap - len(base)),
                      decided_by="baseline-noisy", advice=_advice(sdd_b, margin, s.requests_per_run))
        result["reason"] = (f"inconclusive: with {len(base)} baseline runs (CV {result['cv']:.1%}; {_noise_short(s)}) "
                            f"the smallest detectable drop is {sdd_b:.1%}, above the {margin:.0%} margin: run "
                            f"{result['baseline_runs_needed']} more baseline runs before any change "
                            f"(cap {cap})")
    else:
        result.update(final=True, too_noisy=True, decided_by="too-noisy", advice=_advice(sdd_b, margin, s.requests_per_run))
        result["reason"] = (f"host too noisy for a {margin:.0%} gate: CV {result['cv']:.1%}, smallest detectable drop "
                            f"{sdd_b:.1%} with {len(base)} baseline and {s.max_runs} candidate runs ({_noise_short(s)}); try "
                            f"{result['advice']}. Nothing was changed.")
    return result


def _candidate_not_ready(cand: list[float], s: GateSettings, result: dict[str, Any]) -> bool:
    """True (``result`` set) when the candidate cannot be tested yet: a dead run (a regression) or too few runs."""
    dead = [str(i + 1) for i, v in enumerate(cand) if v <= 0]
    if dead:
        result.update(decision="regression", final=True, decided_by="failures")
        result["reason"] = (f"regression: candidate run(s) {', '.join(dead)} of {len(cand)} produced no tokens (0 {s.unit}): "
                            "the server died or failed every request in them; a dead run is a failure, never an outlier, "
                            "so the candidate cannot pass, whatever its other runs")
        return True
    if len(cand) < s.first_look:
        result["runs_needed"] = s.first_look - len(cand)
        result["reason"] = (f"inconclusive: {len(cand)} candidate runs, at least {s.first_look} are needed: run "
                            f"{result['runs_needed']} more candidate runs")
        return True
    return False


def _look(base: list[float], cand: list[float], fit: _Fit, s: GateSettings, b: _Bounds,
          result: dict[str, Any]) -> tuple[_Fit, _Look]:
    """The test at this look (pooled t on the logs kept, the look's levels, the interval and the reported figures) into
    ``result``; the candidate's fit and the look."""
    first, step = s.first_look, s.look_step
    c_logs, c_keep, c_screened = _screen("candidate", cand, _logs(cand), s.screen_alpha, max(first, 5), s.unit)
    result["screened"] = fit.screened + c_screened
    c_mean, c_ss = _mean_var(c_logs)
    n_b, n_c = len(fit.logs), len(c_logs)
    df = n_b + n_c - 2
    sd = math.sqrt((fit.ss + c_ss) / df)
    se = _se(sd, n_b, n_c, s.start_sd())  # df stays the runs' (sigma_b is a setting, not estimated from these runs)
    d = c_mean - fit.mean
    nominal_p, spent_p, tau = look_level(len(base), len(cand), first, step, s.max_runs, s.pass_alpha, s.spending, s.reserve)
    nominal_r, spent_r, _tau = look_level(len(base), len(cand), first, step, s.max_runs, s.alpha, s.spending, s.reserve)
    if se > 0:
        p_drop, p_pass = t_sf(-d / se, df), t_sf((d - b.log_p) / se, df)
    else:
        p_drop, p_pass = (0.0 if d < 0 else 1.0), (0.0 if d > b.log_p else 1.0)
    sdd = detectable_drop(sd, n_b, n_b - 1 + s.max_runs - 1, s)
    final_look = len(cand) >= s.max_runs
    result.update(ratio=math.exp(d), p_value=p_drop, p_value_pass=p_pass, detect=b.detect, cv=_cv(sd),
                  smallest_detectable_drop=sdd,
                  p_value_mwu=mwu_less([cand[i] for i in c_keep], [base[i] for i in fit.keep])[0],
                  look={"candidate_runs": len(cand), "information": tau, "nominal_pass": nominal_p,
                        "nominal_regression": nominal_r, "spent_pass": spent_p, "spent_regression": spent_r,
                        "last": final_look},
                  ci=bootstrap_ratio_ci(base, cand, level=s.ci_level, resamples=s.bootstrap, seed=s.seed))
    if nominal_p > 0 and nominal_r > 0 and se > 0:
        result["interval"] = [math.exp(d - t_quantile(nominal_p, df) * se), math.exp(d + t_quantile(nominal_r, df) * se)]
    cfit = _Fit(c_logs, c_keep, c_screened, c_mean, c_ss)
    return cfit, _Look(d, se, df, p_drop, p_pass, nominal_p, nominal_r, sdd, final_look)


def _drift_and_noise(base: list[float], cand: list[float], fits: tuple[_Fit, _Fit], s: GateSettings, b: _Bounds,
                     result: dict[str, Any]) -> str | None:
    """Drift inside each side (or of the pairs' ratio, interleaved), each side's trend, and the warnings (noise,
    screened runs) into ``result``; the drift flag."""
    drift_info, drift = drift_check({"baseline": fits[0].logs, "candidate": fits[1].logs}, -b.log_r, s.drift_alpha)
    result["baseline"]["drift"], result["candidate"]["drift"] = drift_info["baseline"], drift_info["candidate"]
    result["order"] = s.order
    if s.order == "interleaved":
        # a drift both sides share cancels from the ratio; what must not drift is the ratio itself
        pairs = min(len(base), len(cand))
        ratio_logs = [math.log(cand[i]) - math.log(base[i]) for i in range(pairs)]
        ratio_info, drift = drift_check({"candidate/baseline ratio": ratio_logs}, -b.log_r, s.drift_alpha)
        result["ratio_drift"] = ratio_info["candidate/baseline ratio"]
    for side in ("baseline", "candidate"):
        result[side]["trend"] = trend([base, cand][side == "candidate"])
        cv = result[side]["cv"]
        if cv is not None and cv > s.noisy_cv:
            result["warnings"].append(
                f"{side} run-to-run CV is {cv:.1%} (over {s.noisy_cv:.0%}): the runs are too short or the host is busy, "
                f"and a gate at {s.threshold:.0%} needs noise well below the {b.margin:.0%} it must see")
    result["warnings"].extend(x["reason"] for x in result["screened"])
    return drift


def _held_by_trend(fits: tuple[_Fit, _Fit], look: _Look, n_cand: int, s: GateSettings, b: _Bounds,
                   result: dict[str, Any]) -> str | None:
    """The trend guard: the verdict ('regression' or 'pass') that a trend shared by both sides could have made, None."""
    common = common_trend(fits[0].logs, fits[1].logs)
    result["trend"] = common
    looks = schedule(s.first_look, s.look_step, s.max_runs)
    guard_on = len(looks) >= s.guard_from and n_cand >= looks[s.guard_from - 1]
    held = None
    if guard_on and common.get("se") and look.se > 0:
        # the verdict must hold with the shared trend taken out too: the sides' centroids lie this many runs
        # apart in run order (one side after the other; side by side when interleaved)
        n_b, n_c = len(fits[0].logs), len(fits[1].logs)
        gap = ((n_c - n_b) if s.order == "interleaved" else (n_b + n_c)) / 2.0
        d, d_adj = look.d, look.d - common["slope"] * gap
        if d < b.log_t and look.p_drop <= look.nominal_r and common["p_falling"] <= s.trend_guard:
            if not d_adj < b.log_t:
                held = "regression"
        elif d >= b.log_f and look.p_pass <= look.nominal_p and common["p_rising"] <= s.trend_guard:
            if not d_adj >= b.log_t:
                held = "pass"
        result["trend"]["adjusted_ratio"] = math.exp(d_adj)
    return held


def _withheld(held: str, look: _Look, n_cand: int, s: GateSettings, where: str, result: dict[str, Any]) -> dict[str, Any]:
    """The answer when the trend guard withholds ``held``: more runs, or at the cap a final inconclusive (drift)."""
    common = result["trend"]
    msg = (f"the runs of both sides {'fall' if held == 'regression' else 'rise'} steadily "
           f"({common['change_per_run']:+.2%} per run, p={common['p_falling' if held == 'regression' else 'p_rising']:.2g}"
           f" <= {s.trend_guard}) and with that trend taken out the {held} no longer holds")
    if look.last:
        result.update(final=True, decided_by="drift", advice="find what changes the host's speed over time")
        result["reason"] = f"inconclusive: {msg} ({where})"
    else:
        nxt = next((k for k in schedule(s.first_look, s.look_step, s.max_runs) if k > n_cand), s.max_runs)
        result["runs_needed"] = nxt - n_cand
        result["reason"] = f"inconclusive: {msg}; run {result['runs_needed']} more candidate runs ({where})"
    return result


def _test_verdict(look: _Look, n_cand: int, s: GateSettings, b: _Bounds, where: str,
                  result: dict[str, Any]) -> dict[str, Any]:
    """The sequential test's answer at this look: regression, pass, inconclusive at the cap, or more runs."""
    p_drop, p_pass, nominal_p, nominal_r = look.p_drop, look.p_pass, look.nominal_p, look.nominal_r
    if look.d < b.log_t and p_drop <= nominal_r:
        result.update(decision="regression", final=True, decided_by="test")
        result["reason"] = (f"regression: {where}; below the threshold and significantly slower than the baseline "
                            f"(p={p_drop:.2g} <= {nominal_r:.2g}, this look's share of alpha {s.alpha})")
    elif look.d >= b.log_f and p_pass <= nominal_p:
        result.update(decision="pass", final=True, decided_by="test")
        result["reason"] = (f"pass: {where}; above the threshold, and a drop of {b.detect:.0%} or more is ruled out "
                            f"(p={p_pass:.2g} <= {nominal_p:.2g}, this look's share of pass_alpha {s.pass_alpha})")
    elif look.last:
        result.update(final=True, decided_by="cap", advice=_advice(look.sdd, b.margin, s.requests_per_run))
        result["reason"] = (f"inconclusive at the cap of {s.max_runs} candidate runs: {where}; neither a pass "
                            f"(p={p_pass:.2g} > {nominal_p:.2g}) nor a regression (p={p_drop:.2g} > {nominal_r:.2g}); "
                            f"smallest detectable drop {look.sdd:.1%}: try {result['advice']}")
    else:
        nxt = next((k for k in schedule(s.first_look, s.look_step, s.max_runs) if k > n_cand), s.max_runs)
        result["runs_needed"] = nxt - n_cand
        result["reason"] = (f"inconclusive: {where}; neither a pass (p={p_pass:.2g} > {nominal_p:.2g}) nor a regression "
                            f"(p={p_drop:.2g} > {nominal_r:.2g}) yet: run {result['runs_needed']} more candidate runs")
    return result


def _candidate_verdict(base: list[float], cand: list[float], fit: _Fit, fails: tuple[float, float], s: GateSettings,
                       facts: RunFacts, b: _Bounds, result: dict[str, Any]) -> dict[str, Any]:
    """The candidate against the baseline: failures, drift, the trend guard, then the test."""
    result["stage"] = "candidate"
    if _candidate_not_ready(cand, s, result):
        return result
    c_fit, look = _look(base, cand, fit, s, b, result)
    drift = _drift_and_noise(base, cand, (fit, c_fit), s, b, result)
    counts = f"{len(base)} vs {len(cand)} runs" + (f", {len(result['screened'])} screened" if result["screened"] else "")
    where = (f"candidate/baseline {result['ratio']:.1%} (geometric means; threshold {s.threshold:.0%}, CV {result['cv']:.1%}, "
             f"look {len(cand)}/{s.max_runs}, {counts}; {_noise_short(s)})")
    if fails[1] > fails[0]:
        result.update(decision="regression", final=True, decided_by="failures")
        result["reason"] = (f"regression: the candidate failed or cut short {facts.candidate_failed} of "
                            f"{facts.candidate_requests} requests, the baseline {facts.baseline_failed} of "
                            f"{facts.baseline_requests}: a server that fails more cannot pass, whatever its speed ({where})")
        return result
    if drift:
        result.update(final=True, decided_by="drift", advice=drift.split("; ")[-1])
        result["reason"] = f"inconclusive: {drift} ({where})"
        return result
    held = _held_by_trend((fit, c_fit), look, len(cand), s, b, result)
    if held:
        return _withheld(held, look, len(cand), s, where, result)
    return _test_verdict(look, len(cand), s, b, where, result)


def decide_throughput(baseline: Sequence[float], candidate: Sequence[float], settings: GateSettings = GATE,
                      facts: RunFacts = NO_FACTS) -> dict[str, Any]:
    """The throughput part: judge candidate runs against baseline runs (higher is better); with no candidate runs,
    judge the baseline alone. decide() is this plus the latency part.

    See the module docstring for the design and GateSettings for each setting (``order``: "sequential" or
    "interleaved"). ``facts``: both sides' failed and sent requests and their workloads (results or fingerprints,
    see workload(); they must not differ). Raises GateError for bad input or settings.
    """
    s = settings
    base, cand, fails, unrecorded = _checked(baseline, candidate, s, facts)
    b = _bounds(s)
    result = _first_result(base, cand, s, unrecorded)
    if len(base) < s.min_runs:
        result["baseline_runs_needed"] = s.min_runs - len(base)
        result["reason"] = (f"inconclusive: {len(base)} baseline runs, at least {s.min_runs} are needed before anything is "
                            f"judged: run {result['baseline_runs_needed']} more baseline runs")
        return result
    fit, b_drift = _baseline_fit(base, s, b, result)
    if not cand:
        return _baseline_verdict(base, fit, b_drift, s, b, result)
    return _candidate_verdict(base, cand, fit, fails, s, facts, b, result)


# ---- the latency part: TTFT and TPOT, lower is better ----------------------------------------------
# Each metric is one figure per run (that run's p50 or p90 over its requests, in ms), judged with the throughput
# part's machinery on its reciprocal (1/latency: higher is better, and log(1/x) = -log(x), so the same log-t test,
# looks, spending, outlier screen and drift checks apply) against threshold 1/(1 + margin). The defaults and their
# calibration on the stored H200 A/A runs are in docs/benchmark.md ("The latency part").
def run_latency(run: Any) -> dict[str, float | None]:
    """One benchmark run's latency figures (an inference_benchmark run: ``ttft_ms`` and ``tpot_ms`` with ``p50`` and
    ``p90``, ``itl_ms`` with ``p99``), by metric; None where the run does not carry one (a result stored before, or a
    run with no tokens)."""
    run = run if isinstance(run, dict) else {}
    out: dict[str, float | None] = {}
    for key in LATENCY_METRICS:
        quantity, quantile = key.split("_")
        stats = run.get(quantity + "_ms")
        value = stats.get(quantile) if isinstance(stats, dict) else None
        out[key] = value if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None
    return out


def latency_series(runs: Any) -> dict[str, list[float]]:
    """Per metric, the runs' figures in run order (the gate's ``*_latency`` input), from benchmark runs; a metric that
    a run lacks is left out whole (judged on every run or not at all)."""
    per_run = [run_latency(r) for r in runs or []]
    return {k: [r[k] for r in per_run] for k in LATENCY_METRICS  # type: ignore[misc]
            if per_run and all(r[k] is not None for r in per_run)}


def _latency_side(name: str, series: Any, n_runs: int) -> dict[str, list[float]]:
    """One side's latency as {metric: [ms per run]}, each list as long as the side's throughput runs; GateError else."""
    if not series:
        return {}
    if not isinstance(series, dict):
        raise GateError(f"{name}_latency must be a dict of metric: [ms per run] ({', '.join(LATENCY_METRICS)}), got "
                        f"{type(series).__name__}")
    out = {}
    for key, values in series.items():
        if key not in LATENCY_METRICS:
            raise GateError(f"{name}_latency: unknown metric {key!r}; known: {', '.join(LATENCY_METRICS)}")
        if values is None:
            continue
        runs = check_runs(f"{name}_latency.{key}", values)
        if len(runs) != n_runs:
            raise GateError(f"{name}_latency.{key} has {len(runs)} runs but the {name} has {n_runs} throughput runs: give "
                            "one figure per run, in the same order")
        if any(v <= 0 for v in runs):
            raise GateError(f"{name}_latency.{key} has a run at 0 ms: a latency is positive (leave the metric out for a "
                            "run that produced no tokens; its throughput of 0 is already a failure)")
        out[key] = runs
    return out


def _at_looks(base: list[float], cand: list[float], settings: GateSettings, judge: Any) -> dict[str, Any]:
    """A part's answer as a sequential test of its own: the first final answer over the scheduled looks up to the
    candidate runs taken (a part that passed at look 4 stays passed while another part needs more runs), else the
    answer at the runs taken. ``judge(base, cand)`` judges one look."""
    if not cand:
        return judge(base, cand)
    looks = [k for k in schedule(settings.first_look, settings.look_step, settings.max_runs) if k < len(cand)]
    extra = len(base) - len(cand) if settings.order == "interleaved" else None
    result: dict[str, Any] = {}
    for k in looks + [len(cand)]:
        b = base if extra is None else base[:max(extra, 0) + k]
        result = judge(b, cand[:k])
        result["look_runs"] = k
        if result["final"]:
            break
    return result


def _latency_metric(key: str, margin: float, base: list[float], cand: list[float], settings: GateSettings) -> dict[str, Any]:
    """One metric judged like throughput on 1/latency at threshold 1/(1 + margin) and ``latency_alpha``, without the
    throughput part's failures, workloads, ``detect`` and bootstrap, translated back to latency."""
    s = replace(settings, threshold=1.0 / (1.0 + margin), alpha=settings.latency_alpha, bootstrap=0, unit="/s", detect=None,
                between_start_sd=None)
    inv = _at_looks([1000.0 / v for v in base], [1000.0 / v for v in cand], settings,
                    lambda b, c: decide_throughput(b, c, s))
    label = LATENCY_LABELS[key]
    sdd = inv.get("smallest_detectable_drop")
    out = {"metric": key, "margin": margin, "decision": inv["decision"], "final": inv["final"],
           "decided_by": inv["decided_by"], "runs_needed": inv["runs_needed"],
           "baseline_runs_needed": inv["baseline_runs_needed"], "too_noisy": inv["too_noisy"], "cv": inv["cv"],
           "baseline_ms": median(base) if base else None, "candidate_ms": median(cand) if cand else None,
           "ratio": 1.0 / inv["ratio"] if inv.get("ratio") else None, "p_value": inv["p_value"],
           "p_value_pass": inv["p_value_pass"],
           "interval": [1.0 / inv["interval"][1], 1.0 / inv["interval"][0]] if inv.get("interval") else None,
           "smallest_detectable_increase": 1.0 / (1.0 - sdd) - 1.0 if sdd is not None and sdd < 1 else None,
           "look_runs": inv.get("look_runs"), "screened": inv["screened"]}
    out["reason"] = f"{label} " + _latency_reason(out, inv)
    return out


def _latency_reason(m: dict[str, Any], inv: dict[str, Any]) -> str:
    margin = m["margin"]
    if m["ratio"] is None:  # the baseline alone
        sdi = m["smallest_detectable_increase"]
        noise = f"CV {m['cv']:.1%}, smallest detectable increase {sdi:.1%}" if sdi is not None and m["cv"] is not None else ""
        if m["too_noisy"]:
            return (f"too noisy for a +{margin:.0%} margin ({noise}): raise its latency margin, set it to null to leave it "
                    "unjudged, or make the runs longer")
        return {"baseline-ready": f"baseline ready ({noise}, margin +{margin:.0%})",
                "baseline-noisy": f"the baseline is too noisy for +{margin:.0%} yet ({noise})"}.get(
                    m["decided_by"], inv["reason"])
    where = (f"candidate/baseline {m['ratio']:.3g}x (medians {_fmt(m['baseline_ms'])} -> {_fmt(m['candidate_ms'])} ms"
             + (f", interval {m['interval'][0]:.3g}x-{m['interval'][1]:.3g}x" if m["interval"] else "")
             + f", margin +{margin:.0%}, look {m['look_runs']})")
    if m["decision"] == "regression" and m["decided_by"] == "test":
        return f"regression: {where}, above the margin and significantly higher (p={m['p_value']:.2g})"
    if m["decision"] == "regression":
        return f"regression: {where}: {inv['reason']}"
    if m["decision"] == "pass":
        return f"pass: {where}, a larger increase ruled out (p={m['p_value_pass']:.2g})"
    if m["final"]:
        return f"inconclusive ({m['decided_by']}): {where}"
    return f"inconclusive: {where}; {m['runs_needed']} more candidate runs"


# The latency part's reason when every metric's margin is null or 0 (left out on purpose, as the VM lab's kernel e2e does).
NO_MARGIN = ("not measured: no latency margin set (TTFT p50/p90, TPOT p50/p90 and ITL p99 each null or 0), so the verdict "
             "is throughput's alone")


def wave_guard(workload: Any) -> str:
    """Why a closed loop's runs cannot tell TTFT and TPOT (WAVE_METRICS) apart, '' when they can or when the workload is
    not known: with fewer than MIN_REQUESTS_PER_SLOT requests per slot a large share of a run's requests start together
    (in waves), and whole runs fall into one of two latency regimes. Open loops (``arrivals``) and WAVE_FREE_PROFILES are judged."""
    fp = workload if isinstance(workload, dict) else {}
    arrivals = fp.get("arrivals") if isinstance(fp.get("arrivals"), dict) else {"mode": "closed"}
    profile = fp.get("workload_profile") if isinstance(fp.get("workload_profile"), dict) else {}
    requests, level = fp.get("requests"), fp.get("concurrency")
    if arrivals.get("mode", "closed") != "closed" or profile.get("name") in WAVE_FREE_PROFILES:
        return ""
    if isinstance(requests, bool) or isinstance(level, bool) or not isinstance(requests, int) \
            or not isinstance(level, int) or requests <= 0 or level <= 0:
        return ""  # not recorded, or a sweep compared whole: nothing to tell from
    per_slot = requests / level
    if per_slot >= MIN_REQUESTS_PER_SLOT:
        return ""
    return (f"a closed loop of {requests} requests at {level} in flight ({per_slot:.3g} per slot) sends {1 / per_slot:.0%} "
            "of them together at its start, and whole runs then fall into one of two latency regimes (on the H200 at 2 per slot a run's TTFT "
            "p50 was about 730 or about 1,600 ms within one server start), which a few runs a side cannot tell from a "
            f"change: run at least {MIN_REQUESTS_PER_SLOT * level} requests a run ({MIN_REQUESTS_PER_SLOT} per slot, "
            "inference_benchmark_requests) or an open loop (arrivals) to judge it")


def latency_part(baseline_latency: Any, candidate_latency: Any, n_base: int, n_cand: int,
                 settings: GateSettings = GATE, workload: Any = None) -> dict[str, Any]:
    """The latency part: each metric both sides carry (the baseline alone before the change), judged at the settings'
    ``latency_margins`` and ``latency_alpha``; ``status`` ``not measured`` (no latency given: the verdict is
    throughput's alone, never a guess), ``judged``, or ``not judged`` (every metric given was left unjudged, each with
    its reason in ``not_judged``: TTFT and TPOT of a closed loop in waves, wave_guard() of the ``workload``
    fingerprint; a tail metric whose baseline cannot tell its margin)."""
    in_force = settings.latency_in_force()
    alpha = settings.latency_alpha
    base = _latency_side("baseline", baseline_latency, n_base)
    cand = _latency_side("candidate", candidate_latency, n_cand)
    keys = [k for k in LATENCY_METRICS if k in in_force and k in base and (k in cand or not n_cand)]
    part: dict[str, Any] = {"status": "judged" if keys else "not measured", "margins": in_force, "alpha": alpha,
                            "metrics": {}}
    if not keys:
        part["reason"] = NO_MARGIN if not in_force else (
            "not measured: no per-run TTFT/TPOT given for both sides (a result or journal from before the latency part), "
            "so the verdict is throughput's alone")
        return part
    missing = [LATENCY_LABELS[k] for k in in_force if k not in keys]
    if missing:
        part["not_measured"] = missing
    waves = wave_guard(workload)
    not_judged: dict[str, str] = {}
    for key in keys:
        why = waves if key in WAVE_METRICS else _tail_unjudged(key, in_force[key], base[key], settings)
        if why:
            not_judged[key] = why
            continue
        part["metrics"][key] = _latency_metric(key, in_force[key], base[key], cand.get(key, []), settings)
    if not_judged:
        part["not_judged"] = not_judged
    if not part["metrics"]:
        part["status"] = "not judged"
        why = "; ".join(f"{LATENCY_LABELS[k]} not judged: {text}" for k, text in not_judged.items())
        part["reason"] = f"not measured: {why}, so the verdict is throughput's alone"
    return part


def _tail_unjudged(key: str, margin: float, base: list[float], settings: GateSettings) -> str:
    """Why a tail metric (LATENCY_TAIL_METRICS) is not judged: its baseline's runs alone cannot tell its margin (not
    ready, noisy, drifting or screened); '' when they can, and for every other metric. Decided on the baseline only,
    so the same before and after the change."""
    if key not in LATENCY_TAIL_METRICS:
        return ""
    alone = _latency_metric(key, margin, base, [], settings)
    if alone["decided_by"] == "baseline-ready":
        return ""
    sdi = alone["smallest_detectable_increase"]
    figures = (f"CV {alone['cv']:.1%} over {len(base)} baseline runs, smallest detectable increase {sdi:.0%}"
               if sdi is not None and alone["cv"] is not None else f"{len(base)} baseline runs")
    return (f"its baseline cannot tell a +{margin:.0%} increase ({figures}): a run's 99th percentile of inter-token gaps "
            "sits on the edge between decode steps and prefill stalls when about 1% of the gaps are stalls, so it jumps "
            "from run to run; it is reported, never judged, at this workload (longer prompts or runs, or a wider "
            "itl_p99 margin, make it judged)")


def _combine(throughput: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """The verdict of throughput and latency together: any regression is a regression, any final inconclusive (or a
    too noisy baseline) ends inconclusive, a pass needs every part's pass; otherwise more runs for whoever needs them.
    The throughput figures (ratio, interval, p-values) stay at the top level, each latency metric's are in
    ``latency.metrics``, and ``throughput`` keeps the throughput part's own answer."""
    result = dict(throughput)
    result["latency"] = part
    result["throughput"] = {k: throughput.get(k) for k in ("decision", "final", "decided_by", "ratio", "reason")}
    metrics = list(part["metrics"].values())
    if not metrics or (throughput["final"] and throughput["decision"] == "regression"):
        return result
    summary = "; ".join(m["reason"] for m in metrics)
    bad = next((m for m in metrics if m["decision"] == "regression"), None)
    stuck = next((m for m in metrics if m["final"] and m["decision"] == "inconclusive"), None)
    if bad or (stuck and not (throughput["final"] and throughput["decision"] == "inconclusive")):
        m = bad or stuck
        result.update(decision=m["decision"], final=True, decided_by=f"latency: {m['metric']}", runs_needed=0,
                      baseline_runs_needed=0, too_noisy=bool(m["too_noisy"]) or throughput["too_noisy"])
        result["reason"] = f"{m['decision']} on latency: {m['reason']} (throughput: {throughput['reason']}; latency: {summary})"
        if m["too_noisy"]:
            result["reason"] += ". Nothing was changed."
        return result
    if throughput["final"] and throughput["decision"] == "inconclusive":
        result["reason"] = f"{throughput['reason']} (latency: {summary})"
        return result
    if throughput.get("stage") == "baseline":
        waiting = [m for m in metrics if m["decided_by"] != "baseline-ready"]
    else:
        waiting = [m for m in metrics if not m["final"] and m["decision"] != "pass"]
    if not waiting and (throughput["final"] or throughput.get("stage") == "baseline"):
        result["reason"] = f"{throughput['reason']} (latency: {summary})"
        return result
    result.update(decision="inconclusive", final=False,
                  runs_needed=max([throughput["runs_needed"]] + [m["runs_needed"] for m in waiting]),
                  baseline_runs_needed=max([throughput["baseline_runs_needed"]] + [m["baseline_runs_needed"] for m in waiting]))
    if waiting and throughput["decided_by"] in ("baseline-ready", "test"):
        result["decided_by"] = {"baseline-ready": "baseline-noisy", "test": "waiting"}[throughput["decided_by"]]
    result["reason"] = (f"inconclusive: {', '.join(LATENCY_LABELS[m['metric']] for m in waiting) or 'throughput'} not "
                        f"decided yet: run {result['baseline_runs_needed'] or result['runs_needed']} more "
                        f"{'baseline' if result['baseline_runs_needed'] else 'candidate'} runs (throughput: "
                        f"{throughput['reason']}; latency: {summary})")
    return result


def decide(baseline: Sequence[float], candidate: Sequence[float], settings: GateSettings | None = None,
           facts: RunFacts | None = None, *, baseline_latency: Any = None, candidate_latency: Any = None,
           **options: Any) -> dict[str, Any]:
    """The verdict: the throughput part (decide_throughput()) and the latency part.

    ``settings`` (GATE when None) and ``facts`` (failures, workloads; none when None), with keyword ``options`` of
    either's field names over them (``threshold=0.9``, ``candidate_failed=3``, ...; see gate_inputs()).
    ``baseline_latency`` / ``candidate_latency``: {metric: [ms per run]} (``LATENCY_METRICS``, one figure per
    throughput run, in the same order; latency_series() makes it from benchmark runs), each metric judged lower-is-
    better against ``latency_margins`` (DEFAULT_LATENCY_MARGINS overlaid; null leaves a metric out) at
    ``latency_alpha``. Without latency the answer is throughput's alone and ``latency.status`` is ``not measured``.
    With it, each part is a sequential test of its own (its first final answer over the looks) and the parts are
    combined (_combine()). Raises GateError for bad input or settings.
    """
    s, facts = gate_inputs(settings, facts, options)
    sizes = [len(side) if isinstance(side, (list, tuple)) else 0 for side in (baseline, candidate)]
    fingerprint = (side_workload("baseline", facts.baseline_workload)
                   or side_workload("candidate", facts.candidate_workload))
    part = latency_part(baseline_latency, candidate_latency, sizes[0], sizes[1], s, fingerprint)
    if not part["metrics"]:
        result = decide_throughput(baseline, candidate, s, facts)
        result["latency"] = part
        return result
    base, cand = check_runs("baseline", baseline), check_runs("candidate", candidate)
    full = decide_throughput(base, cand, s, facts)
    quick = replace(s, bootstrap=0)
    throughput = _at_looks(base, cand, s, lambda b, c: decide_throughput(b, c, quick, facts))
    if throughput.get("look_runs", len(cand)) == len(cand):
        throughput = dict(full, look_runs=throughput.get("look_runs"))
    return _combine(throughput, part)


def replay(baseline: Sequence[float], candidate: Sequence[float], settings: GateSettings | None = None,
           facts: RunFacts | None = None, *, baseline_latency: Any = None, candidate_latency: Any = None,
           **options: Any) -> dict[str, Any]:
    """Judge stored runs as the sequential gate would have while taking them: decide() at each scheduled look on the
    candidate runs taken so far (in the order taken), stopping at the first final answer. The baseline is whole for
    ``order="sequential"`` (it was complete before the change); for ``order="interleaved"`` a look at k candidate
    runs sees the baseline runs taken by then: the ones stored beyond the candidate's count (taken first) plus k,
    and the first look comes when the baseline has ``min_runs`` as well (as tests/tools/h200_vllm.py's gate takes them).

    The result is decide()'s at that look, with ``candidate_runs_used``; when the stored runs end before a final
    answer it is the last look's (``final`` false, ``runs_needed`` more). Runs past the last look they reach are not
    used. Stored runs taken when the first look was at ``min_runs`` should pass ``candidate_min_runs=min_runs``.
    ``baseline_latency`` / ``candidate_latency`` (per-run, as decide() takes them) are cut to the same runs.
    Settings, facts and options as decide() takes them.
    """
    s, facts = gate_inputs(settings, facts, options, "replay")
    cand = check_runs("candidate", candidate)
    base = check_runs("baseline", baseline)
    first = s.candidate_min_runs or CANDIDATE_MIN_RUNS
    looks = schedule(first, s.look_step, s.max_runs)
    extra = None
    if s.order == "interleaved":
        # in turns, the first look waits until the baseline has its min_runs too (then the schedule goes on)
        extra = max(len(base) - len(cand), 0)
        start = max(first, s.min_runs - extra)
        looks = (start,) + tuple(k for k in looks if k > start)
    used = [k for k in looks if k <= len(cand)] or [len(cand)]
    result: dict[str, Any] = {}
    b_lat, c_lat = baseline_latency or {}, candidate_latency or {}
    for k in used:
        nb = len(base) if extra is None else extra + k
        lat = {"baseline_latency": {m: list(v)[:nb] for m, v in b_lat.items()},
               "candidate_latency": {m: list(v)[:k] for m, v in c_lat.items()}} if b_lat and c_lat else {}
        result = decide(base[:nb], cand[:k], settings=s, facts=facts, **lat)
        result["candidate_runs_used"] = k
        if result["final"]:
            break
    return result


# ---- the module's executor --------------------------------------------------------------------------
# The module's options that are gate settings of another name (the rest have the settings' names).
_OPTION_OF = {"bootstrap": "bootstrap_resamples"}
MODULE_SETTINGS = ("threshold", "alpha", "pass_alpha", "detect", "min_runs", "candidate_min_runs", "step", "max_runs",
                   "max_baseline_runs", "baseline_step", "power", "spending", "screen_alpha", "drift_alpha", "trend_guard",
                   "order", "pass_floor", "requests_per_run", "bootstrap", "seed", "unit", "latency_margins",
                   "latency_alpha", "between_start_sd")


def module_settings(params: dict) -> GateSettings:
    """The gate settings of gpufleet.inference.throughput_gate's options (the rest at GATE's defaults)."""
    return replace(GATE, **{name: params[_OPTION_OF.get(name, name)] for name in MODULE_SETTINGS})


def execute(params: dict, host: Host, check_mode: bool) -> dict[str, Any]:
    """What gpufleet.inference.throughput_gate executes: the gate's verdict over the given runs, its warnings as task
    warnings. Changes nothing (check mode gives the same answer). Raises Failed for runs or settings the gate cannot
    judge ("Cannot judge the runs: ...") and, with ``fail_on_regression``, for a regression (with the result)."""
    del check_mode  # nothing to change
    p = params
    try:
        level = p["workload_concurrency"]
        workloads = {side: side_workload(side, p[f"{side}_workload"], level) for side in ("baseline", "candidate")}
        facts = RunFacts(baseline_failed=p["baseline_failed"], baseline_requests=p["baseline_requests"],
                         candidate_failed=p["candidate_failed"], candidate_requests=p["candidate_requests"],
                         baseline_workload=workloads["baseline"], candidate_workload=workloads["candidate"],
                         change=p.get("change") or "none")
        gate = decide(p["baseline"], p["candidate"], module_settings(p), facts,
                      baseline_latency=p["baseline_latency"], candidate_latency=p["candidate_latency"])
    except GateError as err:
        raise Failed(f"Cannot judge the runs: {err}") from None
    for warning in gate["warnings"]:
        host.warn(warning)
    verdict = module_verdict(p, gate)
    result = dict(changed=False, actions=[], verdict=verdict, decision=gate["decision"], ratio=gate["ratio"],
                  p_value=gate["p_value"], runs_needed=gate["runs_needed"], reason=gate["reason"], latency=gate["latency"],
                  gate=gate)
    if "throughput" in gate:
        result["throughput"] = gate["throughput"]
    if p["fail_on_regression"] and verdict["verdict"] in ("regression", "diverged", "unstable"):
        raise Failed(verdict["reason"], **result)
    return result


def gpu_unstable(result: Any) -> list[dict[str, Any]] | None:
    """The findings of a gpu_health result (``candidate_gpu_health``) that make the change unstable; None when none was
    given or NVML was not read. Failed for a value that is no gpu_health result."""
    if result is None:
        return None
    if not isinstance(result, dict) or not isinstance(result.get("findings"), list):
        raise Failed("candidate_gpu_health must be a gpu_health result (with its findings); nothing was judged.",
                     changed=False)
    if not result.get("available") and not (result.get("dcgm") or {}).get("ran"):
        return None
    return unstable(result["findings"])


def module_verdict(p: dict, gate: dict[str, Any]) -> dict[str, Any]:
    """The serving verdict of the module's options: the gate's answer, the outputs compared (``outputs``) and the
    stability of the host between ``baseline_health`` and ``candidate_health`` (with ``kernel_log`` and each side's
    failed and sent requests). Failed for parts in a shape no part has."""
    sides = {side: {"failed": p[f"{side}_failed"], "requests": p[f"{side}_requests"]} for side in ("baseline", "candidate")}
    counted = all(sides[side]["requests"] for side in sides)
    try:
        return judged_verdict(gate, p.get("outputs"), p.get("baseline_health"), p.get("candidate_health"),
                              p.get("kernel_log") or [], sides if counted else None,
                              gpu_findings=gpu_unstable(p.get("candidate_gpu_health")))
    except (VerdictError, ValueError) as err:
        raise Failed(f"Cannot give the serving verdict: {err}", changed=False) from None

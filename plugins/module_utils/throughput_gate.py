# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure statistics of the throughput gate: is a candidate (new kernel, new tuning) slower than its baseline?

Each sample is one whole benchmark run (its output tokens/s): requests inside a run are correlated
by the server's batching, so runs, not requests, are the independent observations.

decide(baseline, candidate) answers ``pass``, ``regression`` or ``inconclusive``:

* ``regression`` when the candidate's median is below ``threshold`` x the baseline's median AND the
  drop is significant: one-sided Mann-Whitney U (candidate smaller) with p <= ``alpha``. Both are
  needed: the ratio alone rolls back on noise, the test alone rolls back on drops too small to matter.
* ``pass`` when the candidate is significantly above ``threshold`` x baseline: the same one-sided test
  run against the scaled baseline (a non-inferiority test) with p <= ``pass_alpha``.
* ``inconclusive`` otherwise: ``runs_needed`` more candidate runs are asked for, up to ``max_runs``;
  at the cap the median ratio alone decides.

The p-value is exact for small samples (the distribution of U from the Gaussian binomial coefficient
without ties, a dynamic programme over mid-ranks with ties) and a normal approximation with tie and
continuity correction for large ones. A seeded percentile bootstrap interval of the median ratio is
reported as secondary information; it never changes the decision. No I/O, standard library only.
"""

from __future__ import annotations

import math
import random
from functools import lru_cache
from typing import Any, Sequence

DECISIONS = ("pass", "regression", "inconclusive")

# Exact p-values up to these sizes; the normal approximation beyond.
EXACT_MAX_PER_SIDE = 60
EXACT_TIES_MAX_TOTAL = 40


class GateError(ValueError):
    """Input the gate cannot judge; the message says which input and what to do."""


# ---- small descriptive statistics ---------------------------------------------------------------
def median(values: Sequence[float]) -> float:
    """Median (mean of the two middle values for an even count)."""
    if not values:
        raise GateError("median of an empty list")
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2.0


def percentile(ordered: Sequence[float], q: float) -> float:
    """Percentile ``q`` (0-100) of an already sorted list, linear between closest ranks.

    This is Hyndman and Fan's type 7, the default of numpy.percentile (which ``vllm bench serve``
    uses): rank h = (n - 1) * q / 100, value = x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)]).
    """
    if not ordered:
        raise GateError("percentile of an empty list")
    if not 0.0 <= q <= 100.0:
        raise GateError(f"percentile must be between 0 and 100, got {q}")
    h = (len(ordered) - 1) * q / 100.0
    lo = int(math.floor(h))
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (h - lo) * (ordered[hi] - ordered[lo]))


def sample_stats(values: Sequence[float]) -> dict[str, Any]:
    """n, median, mean, min, max and coefficient of variation (sample stdev / mean) of one side."""
    n = len(values)
    mean = sum(values) / n
    cv = None
    if n > 1 and mean > 0:
        var = sum((v - mean) ** 2 for v in values) / (n - 1)
        cv = math.sqrt(var) / mean
    return {"n": n, "median": median(values), "mean": mean, "min": float(min(values)), "max": float(max(values)),
            "cv": cv}


# ---- Mann-Whitney U -------------------------------------------------------------------------------
def u_statistic(x: Sequence[float], y: Sequence[float]) -> float:
    """U of ``x``: the number of pairs (x_i, y_j) with x_i > y_j, ties counting one half.

    U near 0 means x tends to be smaller than y; U near len(x) * len(y) means larger.
    """
    ys = sorted(y)
    u = 0.0
    for a in x:
        below = _count_below(ys, a)
        equal = _count_below(ys, a, inclusive=True) - below
        u += below + 0.5 * equal
    return u


def _count_below(ordered: Sequence[float], value: float, inclusive: bool = False) -> int:
    lo, hi = 0, len(ordered)
    while lo < hi:
        mid = (lo + hi) // 2
        if ordered[mid] < value or (inclusive and ordered[mid] == value):
            lo = mid + 1
        else:
            hi = mid
    return lo


@lru_cache(maxsize=256)
def u_distribution(m: int, n: int) -> tuple[int, ...]:
    """Number of orderings of m x-values and n y-values (no ties) for each U of x, 0..m*n.

    These are the coefficients of the Gaussian binomial coefficient [m+n choose m]_q, built as
    prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i) with exact integer arithmetic. They sum to C(m+n, m).
    """
    if m < 0 or n < 0:
        raise GateError("sample sizes must not be negative")
    poly = [1]
    for i in range(1, m + 1):
        shift = n + i
        grown = poly + [0] * shift
        for k in range(len(grown) - 1, shift - 1, -1):
            grown[k] -= grown[k - shift]
        for k in range(i, len(grown)):
            grown[k] += grown[k - i]
        poly = grown[:i * n + 1]
    return tuple(poly)


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _tie_groups(pooled: Sequence[float]) -> list[tuple[float, int, float]]:
    """(value, count, mid-rank) for each distinct value of the pooled sample, smallest first."""
    ordered = sorted(pooled)
    groups = []
    i = 0
    while i < len(ordered):
        j = i
        while j < len(ordered) and ordered[j] == ordered[i]:
            j += 1
        groups.append((ordered[i], j - i, (i + 1 + j) / 2.0))
        i = j
    return groups


def _exact_ties_p(x: Sequence[float], y: Sequence[float]) -> float:
    """P(rank sum of x <= observed) over all C(N, m) equally likely splits, ties at mid-ranks."""
    m = len(x)
    groups = _tie_groups(list(x) + list(y))
    rank_of = {value: mid for value, _count, mid in groups}
    observed = int(round(2 * sum(rank_of[v] for v in x)))
    # ways[k] maps a doubled rank sum to the number of ways to draw k x-values so far.
    ways: list[dict[int, int]] = [dict() for _i in range(m + 1)]
    ways[0][0] = 1
    for _value, count, mid in groups:
        step = int(round(2 * mid))
        new: list[dict[int, int]] = [dict() for _i in range(m + 1)]
        for k in range(m + 1):
            for total, n_ways in ways[k].items():
                for j in range(0, min(count, m - k) + 1):
                    key = total + j * step
                    new[k + j][key] = new[k + j].get(key, 0) + n_ways * math.comb(count, j)
        ways = new
    favourable = sum(n_ways for total, n_ways in ways[m].items() if total <= observed)
    return favourable / math.comb(len(x) + len(y), m)


def mwu_less(x: Sequence[float], y: Sequence[float]) -> tuple[float, str]:
    """One-sided Mann-Whitney U p-value for "x tends to be smaller than y", and the method used.

    Method ``exact`` (no ties, each side up to 60), ``exact-ties`` (ties, up to 40 values in all) or
    ``normal`` (normal approximation with tie and continuity correction).
    """
    m, n = len(x), len(y)
    if m == 0 or n == 0:
        raise GateError("Mann-Whitney U needs at least one value on each side")
    u = u_statistic(x, y)
    pooled = list(x) + list(y)
    has_ties = len(set(pooled)) < len(pooled)
    if not has_ties and m <= EXACT_MAX_PER_SIDE and n <= EXACT_MAX_PER_SIDE:
        counts = u_distribution(m, n)
        favourable = sum(counts[:int(u) + 1])
        return min(1.0, favourable / math.comb(m + n, m)), "exact"
    if has_ties and m + n <= EXACT_TIES_MAX_TOTAL:
        return min(1.0, _exact_ties_p(x, y)), "exact-ties"
    total = m + n
    tie_term = sum(c ** 3 - c for _v, c, _r in _tie_groups(pooled)) / (total * (total - 1))
    var = m * n / 12.0 * ((total + 1) - tie_term)
    if var <= 0:
        return 1.0, "normal"
    z = (u - m * n / 2.0 + 0.5) / math.sqrt(var)
    return min(1.0, _normal_cdf(z)), "normal"


def min_p_value(m: int, n: int) -> float:
    """The smallest one-sided p-value m vs n runs can give: 1 / C(m+n, m) (0.004 for 5 vs 5)."""
    return 1.0 / math.comb(m + n, m)


# ---- trend across runs (Mann-Kendall) -------------------------------------------------------------
# A gate compares runs as if they were alike. A server still warming up (kernels compiled for new
# batch shapes, caches filling: a cold start after the reboot into a new kernel) gives runs that rise
# one after another; a host that slows down over time (thermal throttling, a job starting) gives runs
# that fall. Mann-Kendall's S counts, over all pairs of runs, later-higher minus later-lower.
EXACT_TREND_MAX = 50


@lru_cache(maxsize=64)
def inversion_distribution(n: int) -> tuple[int, ...]:
    """Permutations of n distinct values with k inversions, k = 0..n(n-1)/2 (the Mahonian numbers).

    The coefficients of the q-factorial prod_{i=1..n} (1 + q + ... + q^(i-1)), built with exact
    integers; they sum to n!.
    """
    if n < 0:
        raise GateError("a sample size must not be negative")
    dist = [1]
    for i in range(2, n + 1):
        grown = [0] * (len(dist) + i - 1)
        running = 0
        for k in range(len(grown)):
            if k < len(dist):
                running += dist[k]
            if 0 <= k - i < len(dist):
                running -= dist[k - i]
            grown[k] = running
        dist = grown
    return tuple(dist)


def theil_sen_slope(values: Sequence[float]) -> float:
    """Median of the pairwise slopes (x_j - x_i) / (j - i): the change per run, robust to one odd run."""
    slopes = [(values[j] - values[i]) / (j - i) for i in range(len(values)) for j in range(i + 1, len(values))]
    return median(slopes) if slopes else 0.0


def trend(values: Sequence[float]) -> dict[str, Any]:
    """Do the runs, in the order they were taken, rise or fall steadily?

    Returns ``s`` (Mann-Kendall S), ``tau`` (S over the number of pairs), ``p_rising`` and
    ``p_falling`` (one-sided p-values; exact from the inversion distribution without ties up to 50
    runs, else the normal approximation with tie and continuity correction), ``change`` (the
    Theil-Sen slope over the runs as a fraction of their median: +0.12 = 12% higher at the end) and
    ``method``. Fewer than 3 runs give p-values of 1.
    """
    vals = [float(v) for v in values]
    n = len(vals)
    pairs = n * (n - 1) // 2
    s = 0
    for i in range(n):
        for j in range(i + 1, n):
            s += (vals[j] > vals[i]) - (vals[j] < vals[i])
    mid = median(vals) if vals else 0.0
    change = theil_sen_slope(vals) * (n - 1) / mid if n > 1 and mid > 0 else 0.0
    out: dict[str, Any] = {"n": n, "s": s, "tau": (s / pairs) if pairs else None, "p_rising": 1.0,
                           "p_falling": 1.0, "change": change, "method": None}
    if n < 3:
        return out
    has_ties = len(set(vals)) < n
    if not has_ties and n <= EXACT_TREND_MAX:
        dist = inversion_distribution(n)
        total = math.factorial(n)
        inversions = (pairs - s) // 2  # S = pairs - 2 * inversions
        out.update(p_rising=sum(dist[:inversions + 1]) / total, p_falling=sum(dist[inversions:]) / total,
                   method="exact")
        return out
    tie_term = sum(c * (c - 1) * (2 * c + 5) for _v, c, _r in _tie_groups(vals))
    var = (n * (n - 1) * (2 * n + 5) - tie_term) / 18.0
    if var <= 0:
        out["method"] = "normal"
        return out
    out.update(p_rising=min(1.0, _normal_cdf(-(s - 1) / math.sqrt(var))),
               p_falling=min(1.0, _normal_cdf((s + 1) / math.sqrt(var))), method="normal")
    return out


def drift_warning(side: str, tr: dict[str, Any], min_change: float, alpha: float = 0.05) -> str | None:
    """A sentence when ``side``'s runs rose or fell steadily (p <= alpha) by at least ``min_change``, else None."""
    if tr["p_rising"] <= alpha and tr["change"] >= min_change:
        return (f"{side} runs rose steadily, one after another (Mann-Kendall p={tr['p_rising']:.4f}, "
                f"{tr['change']:+.1%} over {tr['n']} runs): the server was still warming up, so its runs are not "
                "alike; warm it up longer before measuring (inference_benchmark settle_runs or warmup)")
    if tr["p_falling"] <= alpha and tr["change"] <= -min_change:
        return (f"{side} runs fell steadily, one after another (Mann-Kendall p={tr['p_falling']:.4f}, "
                f"{tr['change']:+.1%} over {tr['n']} runs): something slowed the server down while it was measured "
                "(thermal throttling, another job, memory pressure); find it before trusting these runs")
    return None


# ---- bootstrap ------------------------------------------------------------------------------------
def bootstrap_ratio_ci(baseline: Sequence[float], candidate: Sequence[float], level: float = 0.95,
                       resamples: int = 2000, seed: int = 0) -> list[float] | None:
    """Seeded percentile bootstrap interval of median(candidate) / median(baseline); None if resamples is 0."""
    if resamples <= 0:
        return None
    rng = random.Random(seed)
    ratios = []
    for _i in range(resamples):
        b = median(rng.choices(baseline, k=len(baseline)))
        c = median(rng.choices(candidate, k=len(candidate)))
        if b > 0:
            ratios.append(c / b)
    if not ratios:
        return None
    ratios.sort()
    tail = (1.0 - level) / 2.0 * 100.0
    return [percentile(ratios, tail), percentile(ratios, 100.0 - tail)]


# ---- the decision ---------------------------------------------------------------------------------
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


def check_settings(threshold: float, alpha: float, pass_alpha: float, min_runs: int, max_runs: int) -> None:
    """GateError when the settings cannot give a sound decision (bounds, and a test that can never fire)."""
    if not 0.0 < threshold <= 1.0:
        raise GateError(f"threshold must be in (0, 1] (0.95 = a 5% drop is a regression), got {threshold}")
    for name, value in (("alpha", alpha), ("pass_alpha", pass_alpha)):
        if not 0.0 < value < 0.5:
            raise GateError(f"{name} must be in (0, 0.5), got {value}")
    if min_runs < 2:
        raise GateError(f"min_runs must be at least 2, got {min_runs}")
    if max_runs < min_runs:
        raise GateError(f"max_runs ({max_runs}) must be at least min_runs ({min_runs})")
    smallest = min_p_value(min_runs, min_runs)
    if smallest > alpha:
        raise GateError(
            f"with {min_runs} runs per side the smallest one-sided p-value is {smallest:.4f}, above alpha {alpha}: "
            f"no regression could ever be significant. Raise min_runs (5 runs give {min_p_value(5, 5):.4f}) or alpha.")


def _fmt(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:.1f}"


def decide(baseline: Sequence[float], candidate: Sequence[float], threshold: float = 0.95, alpha: float = 0.01,
           pass_alpha: float = 0.05, min_runs: int = 5, max_runs: int = 15, step: int | None = None,
           bootstrap: int = 2000, seed: int = 0, ci_level: float = 0.95, unit: str = "tok/s",
           noisy_cv: float = 0.05) -> dict[str, Any]:
    """Judge candidate runs against baseline runs (higher is better). See the module docstring.

    ``step`` is how many more candidate runs an inconclusive answer asks for (default ``min_runs``).
    Raises GateError for bad input.
    """
    base = check_runs("baseline", baseline)
    cand = check_runs("candidate", candidate)
    check_settings(threshold, alpha, pass_alpha, min_runs, max_runs)
    step = step or min_runs
    result: dict[str, Any] = {
        "decision": "inconclusive", "ratio": None, "p_value": None, "p_value_pass": None, "method": None,
        "threshold": threshold, "alpha": alpha, "pass_alpha": pass_alpha, "min_runs": min_runs, "max_runs": max_runs,
        "baseline": sample_stats(base) if base else {"n": 0}, "candidate": sample_stats(cand) if cand else {"n": 0},
        "ci": None, "ci_level": ci_level, "runs_needed": 0, "baseline_runs_needed": 0, "decided_by": "waiting",
        "warnings": [], "reason": "",
    }
    if len(base) < min_runs or len(cand) < min_runs:
        result["baseline_runs_needed"] = max(0, min_runs - len(base))
        result["runs_needed"] = max(0, min_runs - len(cand))
        result["reason"] = (f"inconclusive: {len(base)} baseline and {len(cand)} candidate runs, at least {min_runs} "
                            f"per side are needed: run {result['baseline_runs_needed']} more baseline and "
                            f"{result['runs_needed']} more candidate runs")
        return result
    b_med, c_med = result["baseline"]["median"], result["candidate"]["median"]
    if b_med <= 0:
        raise GateError(f"the baseline median is {b_med} {unit}: the baseline server produced no tokens, so nothing "
                        "can be compared; fix the baseline and measure it again")
    ratio = c_med / b_med
    p_drop, method = mwu_less(cand, base)
    p_pass, _m = mwu_less([threshold * v for v in base], cand)
    result.update(ratio=ratio, p_value=p_drop, p_value_pass=p_pass, method=method,
                  ci=bootstrap_ratio_ci(base, cand, level=ci_level, resamples=bootstrap, seed=seed))
    for side in ("baseline", "candidate"):
        cv = result[side]["cv"]
        if cv is not None and cv > noisy_cv:
            result["warnings"].append(
                f"{side} run-to-run CV is {cv:.1%} (over {noisy_cv:.0%}): the runs are too short or the host is busy, "
                f"and a gate at {threshold:.0%} needs noise well below the {1 - threshold:.0%} it must see; "
                "lengthen the runs (more requests) or quiet the host")
    # Runs that drift by half the margin the gate looks for bias it: a rising candidate (a cold
    # server) towards a false rollback, a rising baseline towards a missed regression.
    for side, runs in (("baseline", base), ("candidate", cand)):
        result[side]["trend"] = trend(runs)
        warning = drift_warning(side, result[side]["trend"], min_change=(1.0 - threshold) / 2.0)
        if warning:
            result["warnings"].append(warning)
    counts = f"{len(base)} vs {len(cand)} runs"
    where = (f"candidate median {_fmt(c_med)} {unit} is {ratio:.1%} of the baseline's {_fmt(b_med)} "
             f"(threshold {threshold:.0%})")
    if ratio < threshold and p_drop <= alpha:
        result.update(decision="regression", decided_by="test")
        result["reason"] = (f"regression: {where}, and the drop is significant (one-sided Mann-Whitney U p={p_drop:.4f} "
                            f"<= {alpha}, {counts})")
    elif p_pass <= pass_alpha:
        result.update(decision="pass", decided_by="test")
        result["reason"] = (f"pass: {where}; the candidate is significantly above {threshold:.0%} of the baseline "
                            f"(p={p_pass:.4f} <= {pass_alpha}, {counts})")
    elif len(cand) >= max_runs:
        decision = "regression" if ratio < threshold else "pass"
        result.update(decision=decision, decided_by="median-at-cap")
        result["reason"] = (f"{decision} (decided by the median at the cap of {max_runs} candidate runs): {where}; "
                            f"neither test was conclusive (drop p={p_drop:.4f}, above-threshold p={p_pass:.4f}, {counts})")
    else:
        result["runs_needed"] = min(step, max_runs - len(cand))
        result["reason"] = (f"inconclusive: {where}; neither a significant drop below {threshold:.0%} (p={p_drop:.4f} > "
                            f"{alpha}) nor significantly above it (p={p_pass:.4f} > {pass_alpha}) with {counts}: "
                            f"run {result['runs_needed']} more candidate runs (cap {max_runs})")
    return result

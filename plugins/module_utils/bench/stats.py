# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure statistics shared by the throughput gate and the benchmark client (standard library only).

Descriptive statistics, the exact Mann-Whitney U test, Mann-Kendall trend and Theil-Sen slope, a seeded
bootstrap, Student's t distribution (through the regularised incomplete beta function), the least-squares
slope test, a one-outlier screen and the Lan-DeMets alpha-spending functions of the gate's sequential
design (bench/throughput_gate.py). No I/O.
"""

from __future__ import annotations

import math
import random
from functools import lru_cache
from statistics import NormalDist
from typing import Any, Sequence

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


def median_ci(values: Sequence[float], level: float = 0.95) -> list[float] | None:
    """Distribution-free interval of the median: the order statistics x(k) and x(n+1-k) whose binomial
    coverage is at least ``level`` (the sign test's interval); None with too few values for that level."""
    ordered = sorted(values)
    n = len(ordered)
    tail = (1.0 - level) / 2.0
    below, k = 0.0, 0  # below = P(Binomial(n, 1/2) < k + 1), accumulated term by term
    while k < n:
        below += math.comb(n, k) / 2.0 ** n
        if below > tail:
            break
        k += 1
    if k == 0:
        return None
    return [ordered[k - 1], ordered[n - k]]


# ---- Student's t ----------------------------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise GateError("a t distribution needs at least one degree of freedom")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: int) -> float:
    """The t with P(T > t) = ``p`` (an upper quantile), by bisection on t_sf to 1e-10; cached."""
    if not 0.0 < p < 1.0:
        raise GateError(f"a tail probability must be in (0, 1), got {p}")
    if p > 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > p:
        lo, hi = hi, hi * 2.0
    for _i in range(200):
        mid = (lo + hi) / 2.0
        if t_sf(mid, df) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def f_sf(f: float, d1: float, d2: float) -> float:
    """P(F > f) for Fisher's F with ``d1`` and ``d2`` degrees of freedom."""
    return 1.0 if f <= 0 else betainc(d2 / 2.0, d1 / 2.0, d2 / (d2 + d1 * f))


@lru_cache(maxsize=1024)
def f_quantile(p: float, d1: float, d2: float) -> float:
    """The f with P(F > f) = ``p`` (an upper quantile), by bisection on log f to a relative 1e-10; cached."""
    if not 0.0 < p < 1.0:
        raise GateError(f"a tail probability must be in (0, 1), got {p}")
    lo, hi = -30.0, 30.0
    for _i in range(200):
        mid = (lo + hi) / 2.0
        if f_sf(math.exp(mid), d1, d2) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10:
            break
    return math.exp((lo + hi) / 2.0)


# ---- alpha spending (Lan and DeMets 1983) ----------------------------------------------------------
_NORMAL = NormalDist()


def spent_alpha(alpha: float, tau: float, kind: str = "obf") -> float:
    """Type I error spent by information fraction ``tau`` (0-1) of a one-sided level-``alpha`` test.

    ``obf``: Lan-DeMets O'Brien-Fleming type, 2 - 2 Phi(z_(1 - alpha/2) / sqrt(tau)) (spends little early);
    ``pocock``: Lan-DeMets Pocock type, alpha ln(1 + (e - 1) tau) (spends evenly). Both reach alpha at tau = 1.
    """
    tau = min(1.0, max(0.0, tau))
    if tau <= 0.0:
        return 0.0
    if kind == "obf":
        return min(alpha, 2.0 - 2.0 * _NORMAL.cdf(_NORMAL.inv_cdf(1.0 - alpha / 2.0) / math.sqrt(tau)))
    if kind == "pocock":
        return alpha * math.log(1.0 + (math.e - 1.0) * tau)
    raise GateError(f"spending must be obf or pocock, got {kind!r}")


# ---- least-squares slope and the one-outlier screen -------------------------------------------------
def slope_test(values: Sequence[float]) -> dict[str, Any]:
    """Least-squares slope of ``values`` against their order 0..n-1, its t statistic (n - 2 df) and one-sided p-values.

    ``change`` is the fitted change from the first run to the last (slope x (n - 1)), in the values' own units.
    """
    n = len(values)
    out: dict[str, Any] = {"n": n, "slope": 0.0, "change": 0.0, "t": 0.0, "p_rising": 1.0, "p_falling": 1.0}
    if n < 3:
        return out
    xm = (n - 1) / 2.0
    ym = sum(values) / n
    sxx = sum((i - xm) ** 2 for i in range(n))
    slope = sum((i - xm) * (v - ym) for i, v in enumerate(values)) / sxx
    resid = sum((v - ym - slope * (i - xm)) ** 2 for i, v in enumerate(values))
    out.update(slope=slope, change=slope * (n - 1), sxx=sxx, resid_ss=resid)
    se = math.sqrt(resid / (n - 2) / sxx)
    if se <= 0.0:
        big = math.inf if slope != 0 else 0.0
        out.update(t=math.copysign(big, slope), p_rising=0.0 if slope > 0 else 1.0, p_falling=0.0 if slope < 0 else 1.0)
        return out
    t = slope / se
    out.update(t=t, p_rising=t_sf(t, n - 2), p_falling=t_sf(-t, n - 2))
    return out


def screen_one(values: Sequence[float], alpha: float = 0.001, min_n: int = 5) -> dict[str, Any] | None:
    """The one run that stands apart from the others, or None.

    For the run farthest from the median, t = |x - mean of the others| / (their sd x sqrt(1 + 1/(n - 1))) is Student's t
    with n - 2 df if it is like them (a prediction interval); it is screened when its two-sided p-value times n
    (Bonferroni over which run is farthest) is at most ``alpha``. Needs ``min_n`` runs; at most one run is screened.
    """
    n = len(values)
    if n < max(min_n, 4):
        return None
    mid = median(values)
    far = max(range(n), key=lambda i: (abs(values[i] - mid), -i))
    rest = [v for i, v in enumerate(values) if i != far]
    mean = sum(rest) / len(rest)
    var = sum((v - mean) ** 2 for v in rest) / (len(rest) - 1)
    gap = abs(values[far] - mean)
    if var <= 0.0:
        p = 0.0 if gap > 0 else 1.0
    else:
        p = min(1.0, 2.0 * t_sf(gap / math.sqrt(var * (1.0 + 1.0 / len(rest))), n - 2) * n)
    if p > alpha:
        return None
    return {"index": far, "value": values[far], "p": p, "median_of_rest": median(rest)}


# ---- the noise between server starts ------------------------------------------------------------------
def _n0(sizes: Sequence[int]) -> float:
    """The effective runs per start of a one-way random-effects layout with starts of ``sizes`` runs (their mean for
    equal sizes)."""
    total = sum(sizes)
    return (total - sum(n * n for n in sizes) / total) / (len(sizes) - 1)


def start_noise(starts: Any) -> dict[str, Any]:
    """Within- and between-start noise of log throughput from the runs of several server starts of one configuration
    (one-way random effects, the ANOVA estimator): ``sd_within`` (pooled within a start, about the runs' CV),
    ``sd_between`` (the sd of a start's own level, (MS_between - MS_within) / n0 floored at 0: the gate's
    ``between_start_sd``), the F test of "no between-start variance" (``f``, ``df``, ``p_between``), the starts' and
    runs' counts and the starts' geometric means. GateError, naming the start and run, for input that gives none: at
    least two starts of two or more positive runs each (three or more starts for an estimate worth setting)."""
    if not isinstance(starts, (list, tuple)) or len(starts) < 2:
        raise GateError("give the runs of at least two server starts, a list of lists of tok/s (three or more starts "
                        "for an estimate worth setting as between_start_sd)")
    logs = []
    for i, runs in enumerate(starts):
        if not isinstance(runs, (list, tuple)) or len(runs) < 2:
            raise GateError(f"start {i + 1} must be a list of two or more runs' tok/s, got {runs!r}")
        for j, value in enumerate(runs):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise GateError(f"start {i + 1} run {j + 1} is {value!r}: a throughput must be a positive number")
        logs.append([math.log(v) for v in runs])
    k, n = len(logs), [len(s) for s in logs]
    total = sum(n)
    means = [sum(s) / len(s) for s in logs]
    grand = sum(sum(s) for s in logs) / total
    msw = sum((x - m) ** 2 for s, m in zip(logs, means) for x in s) / (total - k)
    msb = sum(ni * (m - grand) ** 2 for ni, m in zip(n, means)) / (k - 1)
    n0 = _n0(n)
    f = msb / msw if msw > 0 else (math.inf if msb > 0 else 1.0)
    d1, d2 = k - 1, total - k
    p = 0.0 if math.isinf(f) else f_sf(f, d1, d2)
    return {"starts": k, "runs": total, "sd_within": math.sqrt(msw), "sd_between": math.sqrt(max(0.0, (msb - msw) / n0)),
            "f": f, "df": [d1, d2], "p_between": p, "start_means": [math.exp(m) for m in means]}


START_NOISE_MIN_STARTS = 3  # starts whose runs give a between-start sd worth setting (two give one degree of freedom)


def between_start_interval(noise: dict[str, Any], sizes: Sequence[int], level: float = 0.95) -> list[float] | None:
    """A ``level`` confidence interval of ``sd_between`` from start_noise()'s answer over starts of ``sizes`` runs:
    the interval of the variance ratio sigma_b^2 / sigma_w^2 from the F distribution ((F / F_upper - 1) / n0,
    (F / F_lower - 1) / n0), floored at 0 (exact for starts of equal runs, near it otherwise), times ``sd_within``.
    None when the runs vary not at all within a start (no ratio to bound)."""
    if not 0.0 < level < 1.0:
        raise GateError(f"a confidence level must be in (0, 1), got {level}")
    d1, d2 = noise["df"]
    n0 = _n0(sizes)
    f, sd_w = noise["f"], noise["sd_within"]
    if sd_w <= 0 or math.isinf(f):
        return None
    tail = (1.0 - level) / 2.0
    lo = max(0.0, (f / f_quantile(tail, d1, d2) - 1.0) / n0)
    hi = max(0.0, (f / f_quantile(1.0 - tail, d1, d2) - 1.0) / n0)
    return [sd_w * math.sqrt(lo), sd_w * math.sqrt(hi)]

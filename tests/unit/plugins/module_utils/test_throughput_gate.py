# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""throughput_gate: the exact Mann-Whitney U distribution against brute-force enumeration, ties, the
normal approximation, percentiles, the bootstrap, and every branch of decide()."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import throughput_gate as tg


def brute_force_p(x, y) -> float:
    """P(rank sum of x <= observed) over every split of the pooled values (mid-ranks for ties)."""
    pooled = list(x) + list(y)
    ranks = {}
    ordered = sorted(pooled)
    for value in set(pooled):
        first = ordered.index(value) + 1
        last = first + ordered.count(value) - 1
        ranks[value] = (first + last) / 2
    rank_list = [ranks[v] for v in pooled]
    observed = sum(ranks[v] for v in x)
    hits = total = 0
    for combo in itertools.combinations(range(len(pooled)), len(x)):
        total += 1
        hits += sum(rank_list[i] for i in combo) <= observed + 1e-9
    return hits / total


# ---- the U distribution ---------------------------------------------------------------------------
@pytest.mark.parametrize("m, n", [(1, 1), (1, 4), (2, 3), (3, 3), (4, 6), (5, 5), (6, 4)])
def test_u_distribution_matches_enumeration(m, n):
    counts = [0] * (m * n + 1)
    for combo in itertools.combinations(range(m + n), m):
        x = list(combo)
        y = [i for i in range(m + n) if i not in combo]
        counts[int(tg.u_statistic(x, y))] += 1
    assert list(tg.u_distribution(m, n)) == counts
    assert sum(counts) == math.comb(m + n, m)


def test_u_distribution_known_values():
    # 5 vs 5: the one-sided 5% critical value is U <= 4 (12 of 252 orderings), 1% is U <= 1
    counts = tg.u_distribution(5, 5)
    assert counts[:5] == (1, 1, 2, 3, 5)
    assert sum(counts[:5]) / 252 == pytest.approx(0.0476, abs=1e-4)
    assert counts == counts[::-1]  # symmetric
    assert tg.min_p_value(5, 5) == pytest.approx(0.003968, abs=1e-6)
    assert tg.min_p_value(3, 3) == 0.05


def test_u_statistic_with_ties():
    assert tg.u_statistic([1, 2, 3], [4, 5]) == 0
    assert tg.u_statistic([4, 5], [1, 2, 3]) == 6
    assert tg.u_statistic([2, 3], [2, 1]) == 3.5  # 2 vs 2 tie counts 0.5


# ---- p-values -------------------------------------------------------------------------------------
def test_mwu_exact_values():
    p, method = tg.mwu_less([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert method == "exact" and p == pytest.approx(1 / 252)
    p, _m = tg.mwu_less([1, 2, 3, 4, 6], [5, 7, 8, 9, 10])
    assert p == pytest.approx(2 / 252)
    p, _m = tg.mwu_less([6, 7, 8, 9, 10], [1, 2, 3, 4, 5])
    assert p == 1.0


@pytest.mark.parametrize("x, y", [
    ([1, 2, 2, 3, 5], [2, 4, 5, 6, 7]),
    ([10, 10, 10, 11], [10, 12, 12, 13, 14]),
    ([3, 3, 3], [3, 3, 3, 3]),
    ([1.5, 2.5, 2.5], [2.5, 2.5, 0.5, 4.0]),
])
def test_mwu_exact_with_ties_matches_enumeration(x, y):
    p, method = tg.mwu_less(x, y)
    assert method == "exact-ties"
    assert p == pytest.approx(brute_force_p(x, y), abs=1e-12)


def test_mwu_all_tied_is_no_evidence():
    assert tg.mwu_less([5.0] * 5, [5.0] * 5)[0] == 1.0


def test_normal_approximation_is_close_to_exact_for_large_samples():
    rng = random.Random(3)
    x = [rng.gauss(0.97, 0.02) for _i in range(70)]
    y = [rng.gauss(1.00, 0.02) for _i in range(70)]
    p, method = tg.mwu_less(x, y)
    assert method == "normal"
    counts = tg.u_distribution(70, 70)
    exact = sum(counts[:int(tg.u_statistic(x, y)) + 1]) / math.comb(140, 70)
    assert p == pytest.approx(exact, rel=0.05)
    assert p < 0.001


def test_normal_approximation_with_many_ties():
    x = [1, 2, 2, 3] * 12
    y = [2, 3, 3, 4] * 12
    p, method = tg.mwu_less(x, y)
    assert method == "normal" and 0 < p < 0.01


# ---- descriptive statistics -------------------------------------------------------------------------
def test_median_percentile_and_stats():
    assert tg.median([3, 1, 2]) == 2.0 and tg.median([4, 1, 2, 3]) == 2.5
    assert tg.percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert tg.percentile([5.0], 2.5) == 5.0
    stats = tg.sample_stats([98.0, 100.0, 102.0])
    assert stats == {"n": 3, "median": 100.0, "mean": 100.0, "min": 98.0, "max": 102.0, "cv": pytest.approx(0.02)}
    with pytest.raises(tg.GateError):
        tg.median([])
    with pytest.raises(tg.GateError):
        tg.percentile([1.0], 101)


def test_bootstrap_is_seeded_and_brackets_the_ratio():
    base = [1000, 1010, 990, 1005, 995]
    cand = [900, 905, 895, 910, 890]
    a = tg.bootstrap_ratio_ci(base, cand, seed=4)
    assert a == tg.bootstrap_ratio_ci(base, cand, seed=4)
    assert a[0] < 0.9 < a[1] and a[1] < 0.95
    assert tg.bootstrap_ratio_ci(base, cand, resamples=0) is None


# ---- decide ---------------------------------------------------------------------------------------
BASE = [1000.0, 1012.0, 991.0, 1005.0, 997.0]


def test_regression():
    g = tg.decide(BASE, [920.0, 931.0, 915.0, 925.0, 918.0])
    assert g["decision"] == "regression" and g["decided_by"] == "test" and g["runs_needed"] == 0
    assert g["ratio"] == pytest.approx(920.0 / 1000.0)
    assert g["p_value"] == pytest.approx(1 / 252) and g["method"] == "exact"
    assert g["reason"].startswith("regression: candidate median 920 tok/s is 92.0% of the baseline's 1000")
    assert "p=0.0040 <= 0.01, 5 vs 5 runs" in g["reason"]
    assert g["ci"][1] < 0.95


def test_pass():
    g = tg.decide(BASE, [1003.0, 996.0, 1010.0, 999.0, 1001.0])
    assert g["decision"] == "pass" and g["p_value_pass"] == pytest.approx(1 / 252)
    assert "significantly above 95% of the baseline" in g["reason"]


def test_a_small_significant_drop_above_the_threshold_passes():
    """A 3% drop with little noise is significant, but smaller than the 5% the gate is for."""
    g = tg.decide(BASE, [970.0, 981.0, 962.0, 975.0, 968.0])
    assert g["p_value"] < 0.01 and g["ratio"] > 0.95
    assert g["decision"] == "pass"


def test_below_threshold_but_not_significant_asks_for_more_runs():
    noisy = [880.0, 1000.0, 940.0, 1015.0, 930.0]
    g = tg.decide(BASE, noisy)
    assert g["ratio"] < 0.95 and g["p_value"] > 0.01
    assert (g["decision"], g["runs_needed"], g["decided_by"]) == ("inconclusive", 5, "waiting")
    assert "run 5 more candidate runs (cap 15)" in g["reason"]
    g = tg.decide(BASE, noisy + [935.0, 990.0, 900.0, 1010.0, 920.0, 960.0, 930.0, 1005.0], max_runs=15)
    assert g["runs_needed"] == 2  # 13 runs, cap 15


def test_the_cap_decides_by_the_median():
    cand = [880.0, 1000.0, 940.0, 1015.0, 930.0, 935.0, 990.0, 900.0, 1010.0, 920.0]
    g = tg.decide(BASE, cand, max_runs=10)
    assert g["decision"] == "regression" and g["decided_by"] == "median-at-cap"
    assert g["reason"].startswith("regression (decided by the median at the cap of 10 candidate runs)")
    higher = [c + 25.0 for c in cand]
    g = tg.decide(BASE, higher, max_runs=10)
    assert g["ratio"] >= 0.95 and g["decision"] == "pass" and g["decided_by"] in ("median-at-cap", "test")


def test_too_few_runs():
    g = tg.decide(BASE[:3], [990.0, 1000.0])
    assert (g["decision"], g["baseline_runs_needed"], g["runs_needed"], g["ratio"]) == ("inconclusive", 2, 3, None)
    assert "at least 5 per side" in g["reason"]


def test_noisy_runs_are_flagged():
    noisy = [1000.0, 1150.0, 900.0, 1080.0, 940.0]
    g = tg.decide(noisy, BASE)
    assert any("baseline run-to-run CV" in w for w in g["warnings"])
    assert tg.decide(BASE, BASE)["warnings"] == []


def test_exact_ties_path_in_decide():
    g = tg.decide([100, 100, 101, 101, 102], [100, 100, 101, 101, 102])
    assert g["method"] == "exact-ties" and g["ratio"] == 1.0 and g["decision"] == "pass"


@pytest.mark.parametrize("baseline, candidate, fragment", [
    ("1000", BASE, "baseline must be a list"),
    (BASE, [1.0, "fast"], "candidate[1] is 'fast', not a number"),
    (BASE, [1.0, float("nan")], "finite and not negative"),
    (BASE, [1.0, -3.0], "finite and not negative"),
    ([0.0] * 5, BASE, "baseline median is 0.0 tok/s"),
])
def test_bad_runs(baseline, candidate, fragment):
    with pytest.raises(tg.GateError) as err:
        tg.decide(baseline, candidate)
    assert fragment in str(err.value)


def test_numbers_as_strings_and_bools():
    assert tg.check_runs("baseline", ["1000", 999, 1001.5]) == [1000.0, 999.0, 1001.5]
    with pytest.raises(tg.GateError, match=r"baseline\[0\] is True, not a number"):
        tg.check_runs("baseline", [True])


@pytest.mark.parametrize("kwargs, fragment", [
    ({"threshold": 1.2}, "threshold must be in (0, 1]"),
    ({"threshold": 0}, "threshold must be in (0, 1]"),
    ({"alpha": 0.7}, "alpha must be in (0, 0.5)"),
    ({"pass_alpha": 0}, "pass_alpha must be in (0, 0.5)"),
    ({"min_runs": 1}, "min_runs must be at least 2"),
    ({"max_runs": 4}, "max_runs (4) must be at least min_runs (5)"),
    ({"min_runs": 4}, "smallest one-sided p-value is 0.0143, above alpha 0.01"),
])
def test_bad_settings(kwargs, fragment):
    with pytest.raises(tg.GateError) as err:
        tg.decide(BASE, BASE, **kwargs)
    assert fragment in str(err.value)


def test_error_rates_at_two_percent_noise():
    """A short seeded version of tests/benchmarks/bench_throughput_gate.py (the full run has 20000 trials per case)."""
    rng = random.Random(11)

    def gated(drop: float) -> str:
        base = [1000 * (1 + 0.02 * rng.gauss(0, 1)) for _i in range(5)]
        cand = [1000 * (1 - drop) * (1 + 0.02 * rng.gauss(0, 1)) for _i in range(5)]
        while True:
            g = tg.decide(base, cand, bootstrap=0)
            if g["decision"] != "inconclusive":
                return g["decision"]
            cand += [1000 * (1 - drop) * (1 + 0.02 * rng.gauss(0, 1)) for _i in range(g["runs_needed"])]

    trials = 400
    false_rollbacks = sum(gated(0.0) == "regression" for _i in range(trials))
    detections = sum(gated(0.08) == "regression" for _i in range(trials))
    assert false_rollbacks <= 1
    assert detections >= trials - 4


# ---- trend across runs (Mann-Kendall) -------------------------------------------------------------
def inversions(perm) -> int:
    return sum(1 for i in range(len(perm)) for j in range(i + 1, len(perm)) if perm[i] > perm[j])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_inversion_distribution_matches_enumeration(n):
    counts = [0] * (n * (n - 1) // 2 + 1)
    for perm in itertools.permutations(range(n)):
        counts[inversions(perm)] += 1
    assert list(tg.inversion_distribution(n)) == counts
    assert sum(counts) == math.factorial(n)


@pytest.mark.parametrize("runs", [
    [1.0, 2.0, 3.0, 4.0, 5.0], [5.0, 4.0, 3.0, 2.0, 1.0], [3.0, 1.0, 4.0, 1.5, 5.0, 9.0, 2.0],
    [10.0, 12.0, 11.0, 13.0, 9.0, 14.0],
])
def test_trend_p_values_match_enumeration(runs):
    """p_rising = P(S >= observed), p_falling = P(S <= observed) over every order of the same runs."""
    observed = tg.trend(runs)
    every = [tg.trend(list(p))["s"] for p in itertools.permutations(runs)]
    assert observed["method"] == "exact"
    assert observed["p_rising"] == pytest.approx(sum(s >= observed["s"] for s in every) / len(every))
    assert observed["p_falling"] == pytest.approx(sum(s <= observed["s"] for s in every) / len(every))


def test_trend_of_five_runs_hand_computed():
    rising = tg.trend([662.0, 760.0, 845.0, 930.0, 990.0])  # the vLLM baseline that was still warming up
    assert (rising["s"], rising["tau"]) == (10, 1.0)
    assert rising["p_rising"] == pytest.approx(1 / 120) and rising["p_falling"] == 1.0
    # Theil-Sen slope: median of the ten pairwise slopes is 85 tok/s per run; 4 steps over a median of 845
    assert tg.theil_sen_slope([662.0, 760.0, 845.0, 930.0, 990.0]) == 85.0
    assert rising["change"] == pytest.approx(4 * 85.0 / 845.0)
    one_swap = tg.trend([100.0, 102.0, 101.0, 103.0, 104.0])  # one inversion of ten pairs: S = 8, 5 orders of 120
    assert one_swap["s"] == 8 and one_swap["p_rising"] == pytest.approx(5 / 120)
    assert tg.trend([5.0, 6.0]) == {"n": 2, "s": 1, "tau": 1.0, "p_rising": 1.0, "p_falling": 1.0,
                                    "change": pytest.approx(1 / 5.5), "method": None}


def test_trend_normal_approximation_for_ties_and_long_series():
    tied = tg.trend([100.0, 100.0, 101.0, 101.0, 102.0, 102.0])
    assert tied["method"] == "normal" and tied["p_rising"] < 0.05 and tied["p_falling"] > 0.95
    flat = tg.trend([100.0] * 6)
    assert flat["s"] == 0 and flat["p_rising"] == 1.0 and flat["change"] == 0.0
    rng = random.Random(3)
    climbing = [1000.0 + rng.gauss(0, 10) + i for i in range(60)]
    long = tg.trend(climbing)
    assert long["method"] == "normal" and long["p_rising"] < 1e-6 and long["p_falling"] > 0.999
    assert tg.trend(climbing[::-1])["p_falling"] == pytest.approx(long["p_rising"])
    # the approximation against the exact answer at n = 12 (both available there)
    runs = [1000.0 + rng.gauss(0, 10) + 3 * i for i in range(12)]
    exact = tg.trend(runs)["p_rising"]
    saved = tg.EXACT_TREND_MAX
    try:
        tg.EXACT_TREND_MAX = 0
        assert tg.trend(runs)["p_rising"] == pytest.approx(exact, abs=0.01)
    finally:
        tg.EXACT_TREND_MAX = saved


def test_drift_warnings():
    up = tg.trend([662.0, 760.0, 845.0, 930.0, 990.0])
    assert "rose steadily" in tg.drift_warning("baseline", up, 0.025) and "settle_runs" in tg.drift_warning("baseline", up, 0.025)
    assert tg.drift_warning("baseline", up, 0.5) is None  # a rise smaller than asked for
    down = tg.trend([990.0, 930.0, 845.0, 760.0, 662.0])
    assert "fell steadily" in tg.drift_warning("candidate", down, 0.025)
    assert tg.drift_warning("candidate", tg.trend(BASE), 0.025) is None


def test_decide_reports_trends_and_warns_about_a_cold_candidate():
    cold = [930.0, 960.0, 985.0, 1001.0, 1010.0]  # a server just rebooted, warming up run by run
    g = tg.decide(BASE, cold)
    assert g["candidate"]["trend"]["s"] == 10 and g["candidate"]["trend"]["p_rising"] == pytest.approx(1 / 120)
    assert g["baseline"]["trend"]["p_rising"] > 0.05
    assert [w for w in g["warnings"] if "candidate runs rose steadily" in w]
    assert not [w for w in g["warnings"] if w.startswith("baseline runs")]
    assert tg.decide(BASE, BASE)["warnings"] == []

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""throughput_gate: the exact Mann-Whitney U distribution against brute-force enumeration, ties, the
normal approximation, percentiles, the bootstrap, Student's t and the spending functions against tables and
closed forms, the sequential design's boundaries, and every branch of decide() (YAML cases)."""

from __future__ import annotations

import itertools
import math
import os
import random
import sys
from statistics import NormalDist

import pytest
import yaml

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import throughput_gate as tg
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import stats as gate_stats


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
        counts[int(gate_stats.u_statistic(x, y))] += 1
    assert list(gate_stats.u_distribution(m, n)) == counts
    assert sum(counts) == math.comb(m + n, m)


def test_u_distribution_known_values():
    # 5 vs 5: the one-sided 5% critical value is U <= 4 (12 of 252 orderings), 1% is U <= 1
    counts = gate_stats.u_distribution(5, 5)
    assert counts[:5] == (1, 1, 2, 3, 5)
    assert sum(counts[:5]) / 252 == pytest.approx(0.0476, abs=1e-4)
    assert counts == counts[::-1]  # symmetric
    assert gate_stats.min_p_value(5, 5) == pytest.approx(0.003968, abs=1e-6)
    assert gate_stats.min_p_value(3, 3) == 0.05


def test_u_statistic_with_ties():
    assert gate_stats.u_statistic([1, 2, 3], [4, 5]) == 0
    assert gate_stats.u_statistic([4, 5], [1, 2, 3]) == 6
    assert gate_stats.u_statistic([2, 3], [2, 1]) == 3.5  # 2 vs 2 tie counts 0.5


# ---- p-values -------------------------------------------------------------------------------------
def test_mwu_exact_values():
    p, method = gate_stats.mwu_less([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert method == "exact" and p == pytest.approx(1 / 252)
    p, _m = gate_stats.mwu_less([1, 2, 3, 4, 6], [5, 7, 8, 9, 10])
    assert p == pytest.approx(2 / 252)
    p, _m = gate_stats.mwu_less([6, 7, 8, 9, 10], [1, 2, 3, 4, 5])
    assert p == 1.0


@pytest.mark.parametrize("x, y", [
    ([1, 2, 2, 3, 5], [2, 4, 5, 6, 7]),
    ([10, 10, 10, 11], [10, 12, 12, 13, 14]),
    ([3, 3, 3], [3, 3, 3, 3]),
    ([1.5, 2.5, 2.5], [2.5, 2.5, 0.5, 4.0]),
])
def test_mwu_exact_with_ties_matches_enumeration(x, y):
    p, method = gate_stats.mwu_less(x, y)
    assert method == "exact-ties"
    assert p == pytest.approx(brute_force_p(x, y), abs=1e-12)


def test_mwu_all_tied_is_no_evidence():
    assert gate_stats.mwu_less([5.0] * 5, [5.0] * 5)[0] == 1.0


def test_normal_approximation_is_close_to_exact_for_large_samples():
    rng = random.Random(3)
    x = [rng.gauss(0.97, 0.02) for _i in range(70)]
    y = [rng.gauss(1.00, 0.02) for _i in range(70)]
    p, method = gate_stats.mwu_less(x, y)
    assert method == "normal"
    counts = gate_stats.u_distribution(70, 70)
    exact = sum(counts[:int(gate_stats.u_statistic(x, y)) + 1]) / math.comb(140, 70)
    assert p == pytest.approx(exact, rel=0.05)
    assert p < 0.001


def test_normal_approximation_with_many_ties():
    x = [1, 2, 2, 3] * 12
    y = [2, 3, 3, 4] * 12
    p, method = gate_stats.mwu_less(x, y)
    assert method == "normal" and 0 < p < 0.01


# ---- descriptive statistics -------------------------------------------------------------------------
def test_median_percentile_and_stats():
    assert gate_stats.median([3, 1, 2]) == 2.0 and gate_stats.median([4, 1, 2, 3]) == 2.5
    assert gate_stats.percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert gate_stats.percentile([5.0], 2.5) == 5.0
    stats = gate_stats.sample_stats([98.0, 100.0, 102.0])
    assert stats == {"n": 3, "median": 100.0, "mean": 100.0, "min": 98.0, "max": 102.0, "cv": pytest.approx(0.02)}
    with pytest.raises(gate_stats.GateError):
        gate_stats.median([])
    with pytest.raises(gate_stats.GateError):
        gate_stats.percentile([1.0], 101)


def test_bootstrap_is_seeded_and_brackets_the_ratio():
    base = [1000, 1010, 990, 1005, 995]
    cand = [900, 905, 895, 910, 890]
    a = gate_stats.bootstrap_ratio_ci(base, cand, seed=4)
    assert a == gate_stats.bootstrap_ratio_ci(base, cand, seed=4)
    assert a[0] < 0.9 < a[1] and a[1] < 0.95
    assert gate_stats.bootstrap_ratio_ci(base, cand, resamples=0) is None


def test_median_ci_is_the_sign_test_interval():
    """n=10 at 95%: P(Binomial(10, 1/2) <= 1) = 11/1024 <= 2.5% < 56/1024, so x(2)..x(9) (coverage 97.9%);
    the interval's true coverage, simulated, is at least its level; under 6 values there is none at 95%."""
    assert gate_stats.median_ci([float(v) for v in range(10, 0, -1)]) == [2.0, 9.0]
    assert gate_stats.median_ci([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert gate_stats.median_ci([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == [1.0, 6.0]
    assert gate_stats.median_ci([1.0, 2.0, 3.0, 4.0, 5.0], level=0.9) == [1.0, 5.0]
    rng = random.Random(7)
    for n in (6, 10, 31, 100):
        hits = 0
        for _trial in range(2000):
            lo, hi = gate_stats.median_ci([rng.lognormvariate(0.0, 0.3) for _i in range(n)])
            hits += lo <= 1.0 <= hi  # the lognormal's median is exp(0) = 1
        assert hits / 2000 >= 0.93, (n, hits)


# ---- decide: the YAML cases ------------------------------------------------------------------------
BASE = [1000.0, 1012.0, 991.0, 1005.0, 997.0]
CASES = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "test_throughput_gate.yaml"), encoding="utf-8"))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_decide_cases(case):
    g = tg.decide(case["baseline"], case["candidate"], bootstrap=0, **case.get("settings", {}))
    for key, value in case["expect"].items():
        assert g[key] == (pytest.approx(value) if isinstance(value, float) else value), key
    for fragment in case.get("reason", []):
        assert fragment in g["reason"]
    assert [[s["side"], s["index"]] for s in g["screened"]] == case.get("screened", [])
    assert g["decision"] in tg.DECISIONS


# ---- the design's boundaries ------------------------------------------------------------------------
def test_t_distribution_against_tables():
    # upper quantiles from any table of Student's t
    for p, df, t in ((0.025, 8, 2.306), (0.005, 4, 4.604), (0.0005, 3, 12.924), (0.05, 18, 1.734), (0.01, 30, 2.457)):
        assert gate_stats.t_quantile(p, df) == pytest.approx(t, abs=1e-3)
        assert gate_stats.t_sf(gate_stats.t_quantile(p, df), df) == pytest.approx(p, rel=1e-6)
    assert gate_stats.t_sf(0.0, 5) == pytest.approx(0.5) and gate_stats.t_sf(-2.0, 10) == pytest.approx(1 - gate_stats.t_sf(2.0, 10))
    assert gate_stats.t_quantile(0.9, 7) == pytest.approx(-gate_stats.t_quantile(0.1, 7))
    # I_x(1, 1) = x; I_x(a, b) = 1 - I_(1-x)(b, a)
    assert gate_stats.betainc(1.0, 1.0, 0.3) == pytest.approx(0.3)
    assert gate_stats.betainc(2.5, 0.5, 0.7) == pytest.approx(1 - gate_stats.betainc(0.5, 2.5, 0.3))


def test_spending_functions():
    for kind in ("obf", "pocock"):
        assert gate_stats.spent_alpha(0.01, 0.0, kind) == 0.0 and gate_stats.spent_alpha(0.01, 1.0, kind) == pytest.approx(0.01)
        spent = [gate_stats.spent_alpha(0.01, t / 10, kind) for t in range(11)]
        assert spent == sorted(spent)
    # O'Brien-Fleming type at tau = 2/3: 2 - 2 Phi(z_0.995 / sqrt(2/3))
    assert gate_stats.spent_alpha(0.01, 2 / 3) == pytest.approx(2 - 2 * NormalDist().cdf(NormalDist().inv_cdf(0.995) / (2 / 3) ** 0.5))
    assert gate_stats.spent_alpha(0.01, 0.5, "pocock") == pytest.approx(0.01 * math.log(1 + (math.e - 1) * 0.5))
    with pytest.raises(gate_stats.GateError, match="spending must be obf or pocock"):
        gate_stats.spent_alpha(0.01, 0.5, "linear")


@pytest.mark.parametrize("n_b, first, step, cap", [(5, 5, 2, 15), (5, 5, 5, 15), (8, 4, 3, 12), (15, 5, 2, 15)])
def test_looks_spend_exactly_alpha(n_b, first, step, cap):
    """The nominal levels of the scheduled looks add up to alpha: Bonferroni keeps the error over all looks <= alpha."""
    looks = tg.schedule(first, step, cap)
    assert looks[0] == first and looks[-1] == cap and all(b - a <= step for a, b in zip(looks, looks[1:]))
    levels = [tg.look_level(n_b, n, first, step, cap, 0.01, "obf") for n in looks]
    assert sum(level for level, _s, _t in levels) == pytest.approx(0.01)
    assert levels[-1][1] == pytest.approx(0.01) and levels[-1][2] == pytest.approx(1.0)
    assert all(level > 0 for level, _s, _t in levels)


def test_first_look_boundary_by_hand():
    """5 vs 5 runs: tau = (1/5 + 1/15) / (1/5 + 1/5) = 2/3, so the first look may spend 0.00161 of alpha 0.01 (obf)."""
    level, spent, tau = tg.look_level(5, 5, 5, 2, 15, 0.01, "obf")
    assert tau == pytest.approx(2 / 3) and level == spent == pytest.approx(0.0016064, rel=1e-4)
    g = tg.decide(BASE, [920.0, 931.0, 915.0, 925.0, 918.0], bootstrap=0, spending="obf", candidate_min_runs=5,
                  reserve=0.0)
    assert g["look"]["nominal_regression"] == pytest.approx(level)
    assert g["look"]["nominal_pass"] == pytest.approx(tg.look_level(5, 5, 5, 2, 15, 0.005, "obf")[0])
    # with the default reserve of 0.3 for the last look, the first look spends 0.7 of that
    assert tg.decide(BASE, [920.0, 931.0, 915.0, 925.0, 918.0], bootstrap=0, spending="obf", candidate_min_runs=5
                     )["look"]["nominal_regression"] == pytest.approx(0.7 * level)
    # the interval is the repeated confidence interval at this look's levels, around the ratio
    assert g["interval"][0] < g["ratio"] < g["interval"][1] < 0.95


def test_default_first_look_is_pocock_at_four_runs_by_hand():
    """5 vs 4 runs: tau = (1/5 + 1/15) / (1/5 + 1/4) = 0.59259; Pocock spends 0.01 ln(1 + (e - 1) tau) = 0.0070223,
    of which the default design (reserve 0.3 for the last look) spends 0.7 x 0.0070223 = 0.0049156 at this look."""
    level, spent, tau = tg.look_level(5, 4, 4, 2, 15, 0.01, "pocock")
    assert tau == pytest.approx(16 / 27) and level == spent == pytest.approx(0.0070223, rel=1e-4)
    g = tg.decide(BASE, [920.0, 931.0, 915.0, 925.0], bootstrap=0)
    assert g["look"]["nominal_regression"] == pytest.approx(0.0049156, rel=1e-4) and g["decision"] == "regression"
    spent = 0.7 * spent
    # the second look (6 runs) may spend only the increment
    second = tg.look_level(5, 6, 4, 2, 15, 0.01, "pocock", 0.3)
    assert second[0] == pytest.approx(second[1] - spent) and second[0] < level


def test_decision_flips_exactly_at_the_boundary():
    """Scale a candidate until its p-value crosses the look's nominal level: the verdict flips there, not elsewhere."""
    shape = [0.995, 1.006, 0.999, 1.004, 0.996]
    level = tg.look_level(5, 5, 5, 2, 15, 0.01, "obf")[0]
    verdicts = []
    for k in range(60):
        ratio = 0.90 + k * 0.001
        g = tg.decide(BASE, [ratio * 1000 * s for s in shape], bootstrap=0, spending="obf", candidate_min_runs=5)
        verdicts.append((g["ratio"], g["p_value"], g["decision"]))
    for r, p, decision in verdicts:
        assert (decision == "regression") == (r < 0.95 and p <= level)
    assert {d for _r, _p, d in verdicts} >= {"regression", "inconclusive"}


def test_default_design_flips_exactly_at_both_boundaries():
    """Pocock, first look at 4: regression below the threshold with p <= its level; pass from the pass floor (0.9625)
    with p(lost 8%) <= its level; in between (the indifference zone) more runs. Scanned across all three answers."""
    shape = [0.995, 1.006, 0.999, 1.004]
    reg = tg.look_level(5, 4, 4, 2, 15, 0.01, "pocock", 0.3)[0]
    pas = tg.look_level(5, 4, 4, 2, 15, 0.005, "pocock", 0.3)[0]
    seen = set()
    for k in range(120):
        g = tg.decide(BASE, [(0.90 + k * 0.001) * 1000 * s for s in shape], bootstrap=0)
        assert g["look"]["nominal_regression"] == pytest.approx(reg) and g["look"]["nominal_pass"] == pytest.approx(pas)
        want = ("regression" if g["ratio"] < 0.95 and g["p_value"] <= reg else
                "pass" if g["ratio"] >= 1 - 0.75 * 0.05 and g["p_value_pass"] <= pas else "inconclusive")
        assert g["decision"] == want, (g["ratio"], g["reason"])
        seen.add(want)
    assert seen == {"regression", "inconclusive", "pass"}


def test_pass_floor_holds_back_a_quiet_candidate_just_above_the_threshold():
    quiet = [r * 0.955 for r in BASE[:4]]
    g = tg.decide(BASE, quiet, bootstrap=0)
    assert g["p_value_pass"] <= g["look"]["nominal_pass"] and g["ratio"] < 1 - 0.75 * 0.05
    assert g["decision"] == "inconclusive" and g["runs_needed"] == 2
    assert tg.decide(BASE, quiet, bootstrap=0, pass_floor=1.0)["decision"] == "pass"  # the floor at the threshold


@pytest.mark.parametrize("reserve", [0.0, 0.3, 0.6])
def test_the_last_look_spends_the_reserve(reserve):
    """With a reserve r the looks before the last spend (1 - r) x the spending function, the last what is left."""
    looks = tg.schedule(4, 2, 15)
    levels = [tg.look_level(5, n, 4, 2, 15, 0.01, "pocock", reserve) for n in looks]
    assert sum(level for level, _s, _t in levels) == pytest.approx(0.01)
    before_last = (1 - reserve) * gate_stats.spent_alpha(0.01, levels[-2][2], "pocock")
    assert levels[-2][1] == pytest.approx(before_last) and levels[-1][0] == pytest.approx(0.01 - before_last)
    assert all(level > 0 for level, _s, _t in levels)


# A flat baseline and a candidate that rises 1% a run: at the second look (6 runs) the ratio clears the pass floor,
# but one trend shared by both sides explains it; taken out, the candidate is 6% below the baseline.
RISING = [950.0, 961.0, 969.0, 981.0, 990.0, 1000.0]


def test_trend_guard_withholds_a_pass_the_trend_could_make():
    g = tg.decide(BASE, RISING, bootstrap=0)
    assert g["ratio"] > 1 - 0.75 * 0.05 and g["p_value_pass"] <= g["look"]["nominal_pass"]
    assert g["trend"]["p_rising"] <= 0.1 and g["trend"]["adjusted_ratio"] < 0.95
    assert (g["decision"], g["final"], g["runs_needed"]) == ("inconclusive", False, 2)
    assert "rise steadily" in g["reason"] and "the pass no longer holds" in g["reason"]
    # without the guard the same runs pass; at the cap the guard's answer is a final inconclusive
    assert tg.decide(BASE, RISING, bootstrap=0, trend_guard=0.0)["decision"] == "pass"
    capped = tg.decide(BASE, RISING, bootstrap=0, max_runs=6)
    assert (capped["decision"], capped["final"], capped["decided_by"]) == ("inconclusive", True, "drift")


def test_trend_guard_withholds_a_regression_the_trend_could_make():
    falling = [r * 0.91 for r in [1050.0, 1039.0, 1031.0, 1019.0, 1010.0, 1000.0]]  # 1% a run down, 93% on average
    g = tg.decide(BASE, falling, bootstrap=0)
    assert g["ratio"] < 0.95 and g["p_value"] <= g["look"]["nominal_regression"]
    assert g["trend"]["p_falling"] <= 0.1 and g["trend"]["adjusted_ratio"] >= 0.95
    assert g["decision"] == "inconclusive" and "fall steadily" in g["reason"]
    assert tg.decide(BASE, falling, bootstrap=0, trend_guard=0.0)["decision"] == "regression"


def test_trend_guard_is_off_at_the_first_look_and_for_a_single_look():
    g = tg.decide(BASE, RISING[:4], bootstrap=0)
    assert "adjusted_ratio" not in g["trend"] and "steadily" not in g["reason"]
    fixed = tg.decide(BASE, RISING, bootstrap=0, candidate_min_runs=6, max_runs=6)
    assert "adjusted_ratio" not in fixed["trend"] and fixed["decision"] == "pass"


# Interleaved runs (baseline, candidate, baseline, ...): the host speeds up by 0.5% a run through the whole A/A,
# both sides alike, around a noise of about 1%. Taken in turns, the shared rise cancels from the ratio.
_WOBBLE = [0.0, 0.011, -0.009, 0.004, -0.012, 0.008, -0.003, 0.010, -0.007, 0.002, -0.010, 0.006]


def _interleaved_aa(n, rise=0.005, cand_extra=0.0):
    base = [1000.0 * (1 + rise) ** (2 * i) * (1 + _WOBBLE[i % 12]) for i in range(n)]
    cand = [1000.0 * (1 + rise) ** (2 * i + 1) * (1 + _WOBBLE[(i + 5) % 12]) * (1 + cand_extra) ** i for i in range(n)]
    return base, cand


def test_interleaved_runs_pass_an_aa_that_a_shared_rise_would_withhold_in_sequence():
    base, cand = _interleaved_aa(12)
    seq = tg.decide(base, cand, bootstrap=0, max_runs=12)
    assert (seq["decision"], seq["decided_by"]) == ("inconclusive", "drift")  # taken one side after the other
    g = tg.decide(base, cand, bootstrap=0, max_runs=12, order="interleaved")
    assert (g["decision"], g["decided_by"], g["order"]) == ("pass", "test", "interleaved")
    assert g["trend"]["p_rising"] <= 0.1 and g["trend"]["adjusted_ratio"] == pytest.approx(g["ratio"])
    assert abs(g["ratio_drift"]["change"]) < 0.01 and seq["order"] == "sequential"


def test_interleaved_runs_whose_ratio_drifts_are_inconclusive():
    # the candidate loses 0.8% against its partner run at every pair: the ratio falls 8% over 12 pairs
    base, cand = _interleaved_aa(12, rise=0.0, cand_extra=-0.008)
    g = tg.decide(base, cand, bootstrap=0, max_runs=12, order="interleaved")
    assert (g["decision"], g["final"], g["decided_by"]) == ("inconclusive", True, "drift")
    assert "the candidate/baseline ratio fell steadily" in g["reason"] and g["ratio_drift"]["p_falling"] < 0.001


def test_replay_of_interleaved_runs_sees_only_the_baseline_taken_by_each_look():
    # both sides good for 6 runs, then the baseline turns slow: a look taken in turns at 6 had seen only the good ones
    base = [1000.0, 1010.0, 995.0, 1005.0, 990.0, 1002.0] + [700.0, 702.0, 698.0, 701.0, 699.0, 700.0]
    cand = [1001.0, 1008.0, 997.0, 1003.0, 992.0, 1004.0] * 2
    seen = []
    real = tg.decide
    try:
        tg.decide = lambda b, c, **kw: seen.append((len(b), len(c))) or real(b, c, **kw)
        inter = tg.replay(base, cand, bootstrap=0, order="interleaved")
        seen_inter, seen[:] = list(seen), []
        tg.replay(base, cand, bootstrap=0)
        seen_seq, seen[:] = list(seen), []
        # two baseline runs stored beyond the candidate's: taken before the turns began, so the first look is at 6 + 4
        tg.replay(base[:2] + base[:6], cand[:6], bootstrap=0, order="interleaved")
    finally:
        tg.decide = real
    assert seen_inter[0] == (5, 5) and all(b == c for b, c in seen_inter)
    assert (inter["decision"], inter["candidate_runs_used"]) == ("pass", 5) and inter["ratio"] == pytest.approx(1.0, abs=0.005)
    assert seen_seq[0] == (12, 4) and all(b == 12 for b, _c in seen_seq)
    assert seen[0] == (6, 4) and all(b == c + 2 for b, c in seen)


def test_order_is_checked():
    with pytest.raises(gate_stats.GateError, match="order must be one of sequential, interleaved"):
        tg.decide(BASE, RISING, order="paired")


def test_a_screened_baseline_run_is_replaced_before_the_change():
    base = [1000.0, 1012.0, 500.0, 1005.0, 997.0]
    g = tg.decide(base, [], bootstrap=0)
    assert (g["decided_by"], g["baseline_runs_needed"], g["final"]) == ("baseline-screened", 1, False)
    assert g["screened"][0]["index"] == 2 and "in its place" in g["reason"]
    ready = tg.decide(base + [1003.0], [], bootstrap=0)
    assert ready["decided_by"] == "baseline-ready" and len(ready["screened"]) == 1


def test_replay_judges_stored_runs_look_by_look():
    same = [1001.0, 1010.0, 993.0, 1004.0, 999.0, 1006.0, 995.0, 1002.0]
    r = tg.replay(BASE, same, bootstrap=0)
    assert (r["decision"], r["candidate_runs_used"]) == ("pass", 4)  # the first look decided; later runs unused
    noisy = [900.0, 1100.0, 950.0, 1060.0, 980.0, 1020.0, 930.0]
    r = tg.replay(BASE, noisy, bootstrap=0)
    assert (r["decision"], r["final"], r["candidate_runs_used"], r["runs_needed"]) == ("inconclusive", False, 6, 2)


def test_screen_one():
    assert gate_stats.screen_one([1.0, 1.01, 0.99, 1.02]) is None  # too few runs
    hit = gate_stats.screen_one([0.0, 0.01, -0.02, 0.015, -0.69])
    assert hit["index"] == 4 and hit["p"] < 0.001
    assert gate_stats.screen_one([0.0, 0.01, -0.02, 0.015, -0.03]) is None


def test_slope_test_by_hand():
    st = gate_stats.slope_test([0.0, 1.0, 2.0, 3.0, 4.5])
    assert st["slope"] == pytest.approx(1.1) and st["change"] == pytest.approx(4.4)
    assert st["p_rising"] < 0.001 < st["p_falling"]


@pytest.mark.parametrize("baseline, candidate, fragment", [
    ("1000", BASE, "baseline must be a list"),
    (BASE, [1.0, "fast"], "candidate[1] is 'fast', not a number"),
    (BASE, [1.0, float("nan")], "finite and not negative"),
    (BASE, [1.0, -3.0], "finite and not negative"),
    ([0.0] * 5, BASE, "baseline run(s) 1, 2, 3, 4, 5 of 5 produced no tokens (0 tok/s)"),
])
def test_bad_runs(baseline, candidate, fragment):
    with pytest.raises(gate_stats.GateError) as err:
        tg.decide(baseline, candidate)
    assert fragment in str(err.value)


def test_numbers_as_strings_and_bools():
    assert tg.check_runs("baseline", ["1000", 999, 1001.5]) == [1000.0, 999.0, 1001.5]
    with pytest.raises(gate_stats.GateError, match=r"baseline\[0\] is True, not a number"):
        tg.check_runs("baseline", [True])


@pytest.mark.parametrize("kwargs, fragment", [
    ({"threshold": 1.2}, "threshold must be in (0, 1)"),
    ({"threshold": 0}, "threshold must be in (0, 1)"),
    ({"alpha": 0.7}, "alpha must be in (0, 0.5)"),
    ({"pass_alpha": 0}, "pass_alpha must be in (0, 0.5)"),
    ({"min_runs": 2}, "min_runs must be at least 3"),
    ({"max_runs": 4}, "max_runs (4) must be at least min_runs (5)"),
    ({"max_baseline_runs": 4}, "max_baseline_runs (4) must be at least min_runs (5)"),
    ({"spending": "linear"}, "spending must be one of obf, pocock"),
    ({"power": 0.3}, "power must be in [0.5, 1)"),
    ({"detect": 0.03}, "detect must be a drop larger than the margin"),
    ({"candidate_min_runs": 2}, "candidate_min_runs must be between 3 and max_runs"),
    ({"pass_floor": 0}, "pass_floor must be in (0, 1]"),
    ({"reserve": 1.0}, "reserve must be in [0, 1)"),
    ({"trend_guard": 0.5}, "trend_guard must be in [0, 0.5)"),
    ({"guard_from": 0}, "guard_from must be at least 1"),
])
def test_bad_settings(kwargs, fragment):
    with pytest.raises(gate_stats.GateError) as err:
        tg.decide(BASE, BASE, **kwargs)
    assert fragment in str(err.value)


def test_error_rates_at_two_percent_noise():
    """A short seeded version of tests/benchmarks/bench_throughput_gate.py (the whole procedure, 20000 trials per cell)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks"))
    from bench_throughput_gate import procedure  # pylint: disable=import-outside-toplevel

    rng = random.Random(11)
    settings = {"threshold": 0.95}
    trials = 300
    unchanged = [procedure(rng, 0.02, 0.0, settings)[0] for _i in range(trials)]
    dropped = [procedure(rng, 0.02, 0.08, settings)[0] for _i in range(trials)]
    assert unchanged.count("regression") == 0 and unchanged.count("pass") >= trials - 1
    assert dropped.count("pass") == 0 and dropped.count("regression") >= trials - 2


# ---- trend across runs (Mann-Kendall) -------------------------------------------------------------
def inversions(perm) -> int:
    return sum(1 for i in range(len(perm)) for j in range(i + 1, len(perm)) if perm[i] > perm[j])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_inversion_distribution_matches_enumeration(n):
    counts = [0] * (n * (n - 1) // 2 + 1)
    for perm in itertools.permutations(range(n)):
        counts[inversions(perm)] += 1
    assert list(gate_stats.inversion_distribution(n)) == counts
    assert sum(counts) == math.factorial(n)


@pytest.mark.parametrize("runs", [
    [1.0, 2.0, 3.0, 4.0, 5.0], [5.0, 4.0, 3.0, 2.0, 1.0], [3.0, 1.0, 4.0, 1.5, 5.0, 9.0, 2.0],
    [10.0, 12.0, 11.0, 13.0, 9.0, 14.0],
])
def test_trend_p_values_match_enumeration(runs):
    """p_rising = P(S >= observed), p_falling = P(S <= observed) over every order of the same runs."""
    observed = gate_stats.trend(runs)
    every = [gate_stats.trend(list(p))["s"] for p in itertools.permutations(runs)]
    assert observed["method"] == "exact"
    assert observed["p_rising"] == pytest.approx(sum(s >= observed["s"] for s in every) / len(every))
    assert observed["p_falling"] == pytest.approx(sum(s <= observed["s"] for s in every) / len(every))


def test_trend_of_five_runs_hand_computed():
    rising = gate_stats.trend([662.0, 760.0, 845.0, 930.0, 990.0])  # the vLLM baseline that was still warming up
    assert (rising["s"], rising["tau"]) == (10, 1.0)
    assert rising["p_rising"] == pytest.approx(1 / 120) and rising["p_falling"] == 1.0
    # Theil-Sen slope: median of the ten pairwise slopes is 85 tok/s per run; 4 steps over a median of 845
    assert gate_stats.theil_sen_slope([662.0, 760.0, 845.0, 930.0, 990.0]) == 85.0
    assert rising["change"] == pytest.approx(4 * 85.0 / 845.0)
    one_swap = gate_stats.trend([100.0, 102.0, 101.0, 103.0, 104.0])  # one inversion of ten pairs: S = 8, 5 orders of 120
    assert one_swap["s"] == 8 and one_swap["p_rising"] == pytest.approx(5 / 120)
    assert gate_stats.trend([5.0, 6.0]) == {"n": 2, "s": 1, "tau": 1.0, "p_rising": 1.0, "p_falling": 1.0,
                                            "change": pytest.approx(1 / 5.5), "method": None}


def test_trend_normal_approximation_for_ties_and_long_series():
    tied = gate_stats.trend([100.0, 100.0, 101.0, 101.0, 102.0, 102.0])
    assert tied["method"] == "normal" and tied["p_rising"] < 0.05 and tied["p_falling"] > 0.95
    flat = gate_stats.trend([100.0] * 6)
    assert flat["s"] == 0 and flat["p_rising"] == 1.0 and flat["change"] == 0.0
    rng = random.Random(3)
    climbing = [1000.0 + rng.gauss(0, 10) + i for i in range(60)]
    long = gate_stats.trend(climbing)
    assert long["method"] == "normal" and long["p_rising"] < 1e-6 and long["p_falling"] > 0.999
    assert gate_stats.trend(climbing[::-1])["p_falling"] == pytest.approx(long["p_rising"])
    # the approximation against the exact answer at n = 12 (both available there)
    runs = [1000.0 + rng.gauss(0, 10) + 3 * i for i in range(12)]
    exact = gate_stats.trend(runs)["p_rising"]
    saved = gate_stats.EXACT_TREND_MAX
    try:
        gate_stats.EXACT_TREND_MAX = 0
        assert gate_stats.trend(runs)["p_rising"] == pytest.approx(exact, abs=0.01)
    finally:
        gate_stats.EXACT_TREND_MAX = saved


def test_drift_warnings():
    up = gate_stats.trend([662.0, 760.0, 845.0, 930.0, 990.0])
    assert "rose steadily" in gate_stats.drift_warning("baseline", up, 0.025) and "settle_runs" in gate_stats.drift_warning("baseline", up, 0.025)
    assert gate_stats.drift_warning("baseline", up, 0.5) is None  # a rise smaller than asked for
    down = gate_stats.trend([990.0, 930.0, 845.0, 760.0, 662.0])
    assert "fell steadily" in gate_stats.drift_warning("candidate", down, 0.025)
    assert gate_stats.drift_warning("candidate", gate_stats.trend(BASE), 0.025) is None


def test_decide_reports_trends_and_drift():
    cold = [930.0, 960.0, 985.0, 1001.0, 1010.0]  # a server just rebooted, warming up run by run
    g = tg.decide(BASE, cold, bootstrap=0)
    assert g["candidate"]["trend"]["s"] == 10 and g["candidate"]["trend"]["p_rising"] == pytest.approx(1 / 120)
    assert g["baseline"]["trend"]["p_rising"] > 0.05
    assert g["candidate"]["drift"]["p_rising_beyond"] <= 0.001 < g["baseline"]["drift"]["p_rising_beyond"]
    assert g["decided_by"] == "drift" and "candidate runs rose steadily" in g["reason"]
    assert tg.decide(BASE, BASE)["warnings"] == []

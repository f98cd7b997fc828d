# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 34's three defects of the verdict, on synthetic runs: ITL p99 is a latency metric (judged where its baseline
can tell its margin, not judged and said elsewhere), TTFT and TPOT of a closed loop in waves are not judged, and
``between_start_sd`` widens the throughput test by the noise between server starts. The stored H200 runs are replayed
in test_h200_replay.py (``test_verdict_evidence_*``)."""

from __future__ import annotations

import math

import pytest

from ansible_collections.gpufleet.inference.plugins.filter import throughput_gate as gate_filter
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import gate_settings as gs
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import throughput_gate as tg
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import GateError, t_quantile
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.verdict import serving_verdict
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.workload import workload

BASE = [1000.0, 1004.0, 998.0, 1002.0, 1001.0]
SAME = [999.0, 1003.0, 1000.0, 1001.0]


def _lat(n, ttft=500.0, tpot=10.0, itl=180.0, spread=0.004, itl_spread=None):
    """Per-run latency of n runs, each metric wobbling by ``spread`` (ITL p99 by ``itl_spread``) around its level."""
    wob = [1.0 + spread * ((i * 7) % 5 - 2) / 2.0 for i in range(n)]
    iw = wob if itl_spread is None else [1.0 + itl_spread * ((i * 3) % 4 - 1.5) / 1.5 for i in range(n)]
    return {"ttft_p50": [ttft * w for w in wob], "ttft_p90": [ttft * 1.5 * w for w in wob],
            "tpot_p50": [tpot * w for w in wob], "tpot_p90": [tpot * 1.2 * w for w in wob],
            "itl_p99": [itl * w for w in iw]}


def _fp(requests, level, **more):
    return {"model": "m", "prompt_tokens": 2048, "output_tokens": 256, "requests": requests, "concurrency": level, **more}


# ---- ITL p99 -------------------------------------------------------------------------------------------------------
def test_the_five_latency_metrics_spend_the_throughput_parts_alpha():
    """Bonferroni over the family: the five metrics together spend what the four spent, the throughput part's alpha."""
    assert gs.LATENCY_METRICS[-1] == "itl_p99" and len(gs.LATENCY_METRICS) == 5
    assert gs.LATENCY_ALPHA * len(gs.LATENCY_METRICS) == pytest.approx(gs.GATE.alpha)
    assert gs.DEFAULT_LATENCY_MARGINS["itl_p99"] == 0.25 and set(gs.DEFAULT_LATENCY_MARGINS) == set(gs.LATENCY_METRICS)


def test_a_runs_itl_p99_is_read_and_a_result_without_it_leaves_the_metric_out():
    run = {"ttft_ms": {"p50": 700.0, "p90": 900.0}, "tpot_ms": {"p50": 15.0, "p90": 16.0},
           "itl_ms": {"p50": 6.8, "p99": 182.4}}
    assert tg.run_latency(run)["itl_p99"] == 182.4
    assert tg.latency_series([run, run])["itl_p99"] == [182.4, 182.4]
    old = {k: v for k, v in run.items() if k != "itl_ms"}  # a result stored before ITL was judged
    assert "itl_p99" not in tg.latency_series([run, old]) and tg.latency_series([old])["ttft_p50"] == [700.0]


def test_stored_latency_without_itl_still_judges_with_itl_p99_not_measured():
    lat = {k: v for k, v in _lat(9).items() if k != "itl_p99"}
    g = tg.decide(BASE, SAME, baseline_latency={k: v[:5] for k, v in lat.items()},
                  candidate_latency={k: v[5:] for k, v in lat.items()})
    assert g["decision"] == "pass" and g["latency"]["status"] == "judged"
    assert g["latency"]["not_measured"] == ["ITL p99"] and set(g["latency"]["metrics"]) == set(gs.WAVE_METRICS)


def test_doubled_itl_p99_at_equal_throughput_ttft_and_tpot_is_a_regression_naming_it():
    """The H200's max_num_batched_tokens 16384 in synthetic form: the same tok/s, TTFT, TPOT; ITL p99 x1.9."""
    base, cand = _lat(5), _lat(4)
    cand["itl_p99"] = [v * 1.9 for v in cand["itl_p99"]]
    g = tg.decide(BASE, SAME, baseline_latency=base, candidate_latency=cand)
    assert g["decision"] == "regression" and g["decided_by"] == "latency: itl_p99" and g["final"]
    m = g["latency"]["metrics"]["itl_p99"]
    assert m["ratio"] == pytest.approx(1.9, rel=0.01) and m["reason"].startswith("ITL p99 regression")
    assert g["throughput"]["decision"] == "pass"
    assert serving_verdict(g)["parts"]["latency"]["says"] == "no"


def test_itl_p99_whose_baseline_cannot_tell_its_margin_is_not_judged_and_never_stops_the_change():
    """ITL p99 jumping 9-23 ms run to run (512/256, c=64 on the H200): the baseline alone is ready on every other
    part, the metric is reported as not judged with its figures, and a candidate is judged on the rest."""
    jumpy = [9.0, 23.0, 11.0, 19.0, 15.0]
    base = {**_lat(5), "itl_p99": jumpy}
    alone = tg.decide(BASE, [], baseline_latency=base)
    assert alone["decided_by"] == "baseline-ready" and not alone["too_noisy"] and alone["baseline_runs_needed"] == 0
    why = alone["latency"]["not_judged"]["itl_p99"]
    assert "cannot tell a +25% increase" in why and "CV" in why and "itl_p99 margin" in why
    assert "itl_p99" not in alone["latency"]["metrics"]
    cand = {**_lat(4), "itl_p99": [10.0, 22.0, 12.0, 18.0]}
    g = tg.decide(BASE, SAME, baseline_latency=base, candidate_latency=cand)
    assert g["decision"] == "pass" and g["latency"]["not_judged"]["itl_p99"] == why
    assert "(itl_p99 not judged: see latency.not_judged)" in serving_verdict(g)["parts"]["latency"]["reason"]


def test_itl_p99_alone_and_unjudged_makes_the_part_not_judged_and_the_verdict_throughputs():
    margins = {"ttft_p50": None, "ttft_p90": None, "tpot_p50": None, "tpot_p90": None}
    jumpy = {"itl_p99": [9.0, 23.0, 11.0, 19.0, 15.0]}
    g = tg.decide(BASE, SAME, baseline_latency=jumpy, candidate_latency={"itl_p99": [10.0, 22.0, 12.0, 18.0]},
                  latency_margins=margins)
    assert g["latency"]["status"] == "not judged" and g["latency"]["reason"].startswith("not measured: ITL p99 not judged")
    v = serving_verdict(g)
    assert v["verdict"] == "pass" and v["parts"]["latency"]["says"] == "not measured"


# ---- closed loops in waves ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fingerprint,guarded", [
    (_fp(128, 64), True),                                    # 2 per slot, as the H200's ninth session ran
    (_fp(192, 64), True),                                    # 3 per slot
    (_fp(256, 64), False),                                   # 4 per slot: one regime on the H200
    (_fp(128, 64, arrivals={"mode": "poisson", "rate": 5}), False),  # an open loop
    (_fp(64, 32, workload_profile={"name": "mixed_lengths", "preset": "document"}), False),
    (_fp(128, 64, arrivals={"mode": "closed"}, workload_profile={"name": "random"}), True),
    (_fp(128, [8, 64]), False),                              # a sweep compared whole: no one level to tell from
    ({}, False), (None, False),                              # not recorded: nothing to tell from
])
def test_wave_guard_applies_to_closed_loops_under_four_requests_per_slot(fingerprint, guarded):
    why = tg.wave_guard(workload(fingerprint) if fingerprint else fingerprint)
    assert bool(why) == guarded
    if guarded:
        assert "per slot" in why and f"at least {4 * 64} requests a run" in why and "arrivals" in why


def test_ttft_and_tpot_of_a_closed_loop_in_waves_are_not_judged_and_itl_p99_still_is():
    """Runs of one regime on the baseline, of the other on the candidate (TTFT x2.2, TPOT x0.8): with the workload
    known to be 2 requests per slot the gate does not call it; ITL p99 (the same on both) passes, and so does the
    verdict. Without the workload it cannot know, and judges as before."""
    base, cand = _lat(5, ttft=730.0, tpot=15.0), _lat(4, ttft=1600.0, tpot=12.0)
    wl = _fp(128, 64)
    g = tg.decide(BASE, SAME, baseline_latency=base, candidate_latency=cand, baseline_workload=wl, candidate_workload=wl)
    assert g["decision"] == "pass" and list(g["latency"]["metrics"]) == ["itl_p99"]
    assert sorted(g["latency"]["not_judged"]) == sorted(gs.WAVE_METRICS)
    assert "2 per slot" in g["latency"]["not_judged"]["ttft_p50"]
    blind = tg.decide(BASE, SAME, baseline_latency=base, candidate_latency=cand)
    assert blind["decision"] == "regression" and blind["decided_by"] == "latency: ttft_p50"
    four = _fp(256, 64)
    g = tg.decide(BASE, SAME, baseline_latency=base, candidate_latency=cand, baseline_workload=four,
                  candidate_workload=four)
    assert g["decision"] == "regression" and g["decided_by"] == "latency: ttft_p50"


# ---- the noise between server starts --------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [-0.01, 0.21, True, "0.01", float("nan"), float("inf")])
def test_between_start_sd_out_of_range_is_refused_naming_it(value):
    with pytest.raises(GateError, match="between_start_sd must be"):
        tg.decide(BASE, SAME, between_start_sd=value)
    with pytest.raises(GateError, match="between_start_sd must be"):
        tg.check_all_settings(between_start_sd=value)


def test_between_start_sd_widens_the_interval_by_two_sigma_b_squared_with_the_runs_df():
    """SE = sqrt(s^2 (1/n_b + 1/n_c) + 2 sigma_b^2), df = n_b + n_c - 2, recomputed here from the runs."""
    within = tg.decide(BASE, SAME)
    counted = tg.decide(BASE, SAME, between_start_sd=0.008)
    logs_b, logs_c = [math.log(v) for v in BASE], [math.log(v) for v in SAME]
    mb, mc = sum(logs_b) / 5, sum(logs_c) / 4
    ss = sum((v - mb) ** 2 for v in logs_b) + sum((v - mc) ** 2 for v in logs_c)
    s2 = ss / 7
    se = math.sqrt(s2 * (1 / 5 + 1 / 4) + 2 * 0.008 ** 2)
    nominal = counted["look"]["nominal_pass"]
    assert counted["interval"][0] == pytest.approx(math.exp(mc - mb - t_quantile(nominal, 7) * se), rel=1e-9)
    assert counted["ratio"] == within["ratio"] and counted["decision"] == within["decision"] == "pass"
    assert counted["interval"][1] - counted["interval"][0] > 3 * (within["interval"][1] - within["interval"][0])
    assert counted["p_value_pass"] > within["p_value_pass"]
    assert counted["smallest_detectable_drop"] > within["smallest_detectable_drop"]


def test_every_result_says_which_noise_it_counted():
    within, counted = tg.decide(BASE, []), tg.decide(BASE, [], between_start_sd=0.008)
    assert within["noise"] == {"between_start_sd": None, "counted": tg.noise_counted(gs.GATE)}
    assert within["noise"]["counted"].startswith("within-start noise only") and "within-start noise only" in within["reason"]
    assert counted["noise"]["between_start_sd"] == 0.008 and "between-start sd 0.80% counted" in counted["reason"]
    assert "between-start sd 0.80% counted" in tg.decide(BASE, SAME, between_start_sd=0.008)["reason"]
    assert tg.decide(BASE, [], between_start_sd=0)["noise"]["between_start_sd"] is None


def test_a_between_start_noise_that_alone_hides_the_margin_stops_before_any_change():
    """More runs cannot average the starts' noise out: with sigma_b 2% the smallest detectable drop stays above 5% at
    any run count, so the baseline stops (too noisy), saying so, even with identical runs."""
    g = tg.decide([1000.0] * 15, [], between_start_sd=0.02)
    assert g["final"] and g["too_noisy"] and g["decided_by"] == "too-noisy" and g["baseline_runs_needed"] == 0
    assert "the between-start sd of 2.00% alone" in g["reason"] and "one server start" in g["advice"]
    assert tg.decide([1000.0] * 5, [], between_start_sd=0.008)["decided_by"] == "baseline-ready"


def test_between_start_sd_leaves_the_latency_metrics_as_they_were():
    base, cand = _lat(5), _lat(4)
    a = tg.decide(BASE, SAME, baseline_latency=base, candidate_latency=cand)
    b = tg.decide(BASE, SAME, baseline_latency=base, candidate_latency=cand, between_start_sd=0.008)
    assert a["latency"]["metrics"] == b["latency"]["metrics"]


def test_the_module_and_the_filter_take_between_start_sd():
    assert "between_start_sd" in tg.MODULE_SETTINGS
    got = gate_filter.throughput_gate(BASE, SAME, between_start_sd=0.008)
    assert got["noise"]["between_start_sd"] == 0.008
    settings = tg.module_settings({**{tg._OPTION_OF.get(n, n): getattr(gs.GATE, n) for n in tg.MODULE_SETTINGS},
                                   "bootstrap_resamples": gs.GATE.bootstrap, "between_start_sd": 0.004})
    assert settings.between_start_sd == 0.004 and settings.start_sd() == 0.004


def test_identical_runs_are_not_drift():
    """Runs with no spread at all have an exact slope of 0: not a drift beyond half the margin (the drift test's
    p-value of "beyond" was 0 for them, so a perfectly quiet baseline stopped as drifting)."""
    g = tg.decide([1000.0] * 8, [])
    assert g["decided_by"] == "baseline-ready" and g["baseline"]["drift"]["p_rising_beyond"] == 1.0
    info, flag = tg.drift_check({"baseline": [0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07]}, 0.025, 0.001)
    assert flag and info["baseline"]["p_rising_beyond"] < 1e-9  # a line beyond half the margin still is drift


def test_measured_tuning_takes_between_start_sd_checked_before_the_baseline():
    from ansible_collections.gpufleet.inference.plugins.module_utils.tuning import tune_measured as tm
    stages = tm.plan_stages([{"name": "a", "role": "r", "revert": [{"role": "r"}]}])
    profiles = tm.resolve_profiles(["serving"], max_model_len=4096)
    state = tm.new_state("h", stages, profiles, {"between_start_sd": "0.008"})
    assert state["gate"]["between_start_sd"] == 0.008 and tm.GATE_DEFAULTS["between_start_sd"] is None
    with pytest.raises(tm.TuneError, match="between_start_sd must be a standard deviation between 0 and 0.2"):
        tm.new_state("h", stages, profiles, {"between_start_sd": 0.5})
    summary = tm.latency_summary(tg.decide(BASE, SAME, baseline_latency={"itl_p99": [9.0, 23.0, 11.0, 19.0, 15.0]},
                                           candidate_latency={"itl_p99": [10.0, 22.0, 12.0, 18.0]})["latency"])
    assert summary["status"] == "not judged" and "itl_p99" in summary["not_judged"]


def test_start_noise_estimates_the_between_start_sd_and_refuses_what_gives_none():
    """The one-way random-effects estimate: starts whose levels differ by more than their runs explain give a positive
    sd_between and a small F-test p; starts alike give 0; the filter returns the same and names bad input."""
    from ansible.errors import AnsibleFilterError
    from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import start_noise
    wob = [1.0, 1.004, 0.996, 1.002, 0.998, 1.001]
    apart = [[1000.0 * level * w for w in wob] for level in (1.0, 1.02, 0.985, 1.01)]
    got = start_noise(apart)
    assert (got["starts"], got["runs"], got["df"]) == (4, 24, [3, 20]) and got["p_between"] < 1e-6
    assert got["sd_within"] == pytest.approx(0.0029, abs=2e-4) and got["sd_between"] == pytest.approx(0.0147, abs=1e-3)
    alike = start_noise([[1000.0 * w for w in wob], [1000.0 * w for w in reversed(wob)]])
    assert alike["sd_between"] == 0.0 and alike["p_between"] == pytest.approx(1.0)
    assert gate_filter.start_noise(apart) == got
    for bad, match in (([[1000.0, 1001.0]], "at least two server starts"), ([[1000.0], [1000.0, 1001.0]], "start 1"),
                       ([[1000.0, 0.0], [1000.0, 1001.0]], "start 1 run 2 is 0.0")):
        with pytest.raises(GateError, match=match):
            start_noise(bad)
        with pytest.raises(AnsibleFilterError, match="start_noise: .*" + match):
            gate_filter.start_noise(bad)

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gate's latency part (issue 33, item 3): TTFT and TPOT p50/p90 of each run, judged lower-is-better with the
throughput part's sequential test, and the verdict of both parts; the stored H200 runs judged with it; the filters."""

from __future__ import annotations

import json
import math
import os
import random

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.inference.plugins.filter.throughput_gate import latency_samples, throughput_gate
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import throughput_gate as tg
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import gate_settings
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import stats as gate_stats
from tests.tools import vllm_flag_stages as vfs
from tests.helpers import REPO

QUIET_BASE = [1000.0, 1010.0, 995.0, 1005.0, 1002.0]
QUIET_CAND = [1004.0, 1008.0, 999.0, 1006.0]
WIGGLE = [1.0, 1.01, 0.99, 1.005, 0.995, 1.008, 0.992, 1.003, 0.997, 1.006, 0.994, 1.002, 0.998, 1.004, 0.996]


def latency(n, ttft=50.0, tpot=3.0, wiggle=None):
    """Per-run latency of n runs: quiet (under 1% run to run) unless another wiggle is given."""
    wiggle = wiggle or WIGGLE
    w = [wiggle[i % len(wiggle)] for i in range(n)]
    return {"ttft_p50": [ttft * x for x in w], "ttft_p90": [1.2 * ttft * x for x in w],
            "tpot_p50": [tpot * x for x in w], "tpot_p90": [1.1 * tpot * x for x in w]}


def noisy(n, cv, seed):
    rng = random.Random(seed)
    return [math.exp(rng.gauss(0.0, cv)) for _run in range(n)]


def test_equal_throughput_and_doubled_ttft_is_a_regression_naming_the_metric():
    gate = tg.decide(QUIET_BASE, QUIET_CAND, baseline_latency=latency(5), candidate_latency=latency(4, ttft=100.0))
    assert gate["throughput"]["decision"] == "pass"  # the throughput part alone would have kept it
    assert gate["decision"] == "regression" and gate["final"] is True
    assert gate["decided_by"].startswith("latency: ttft_p")
    ttft = gate["latency"]["metrics"]["ttft_p50"]
    assert ttft["decision"] == "regression" and ttft["ratio"] == pytest.approx(2.0, rel=0.02)
    assert ttft["interval"][0] > 1.1 and ttft["baseline_ms"] == pytest.approx(50.0, rel=0.01)
    assert "regression on latency: TTFT p" in gate["reason"] and "2x" in gate["reason"]
    assert gate["latency"]["metrics"]["tpot_p50"]["decision"] == "pass"


def test_all_parts_quiet_and_equal_pass():
    gate = tg.decide(QUIET_BASE, QUIET_CAND, baseline_latency=latency(5), candidate_latency=latency(4))
    assert gate["decision"] == "pass" and gate["final"] and gate["latency"]["status"] == "judged"
    assert {m["decision"] for m in gate["latency"]["metrics"].values()} == {"pass"}
    assert "latency: TTFT p50 pass" in gate["reason"]


def test_no_latency_is_the_throughput_verdict_marked_not_measured():
    for cand in ([], QUIET_CAND, [900.0, 905.0, 910.0, 902.0]):
        plain = tg.decide_throughput(QUIET_BASE, cand, gate_settings.GateSettings(bootstrap=200))
        gate = tg.decide(QUIET_BASE, cand, bootstrap=200)
        assert gate["latency"]["status"] == "not measured" and "throughput's alone" in gate["latency"]["reason"]
        assert {k: v for k, v in gate.items() if k != "latency"} == plain
    # one side only (a baseline journaled before the latency part) is not a guess either
    gate = tg.decide(QUIET_BASE, QUIET_CAND, candidate_latency=latency(4, ttft=500.0))
    assert gate["decision"] == "pass" and gate["latency"]["status"] == "not measured"


def test_noisy_latency_is_inconclusive_never_a_guess():
    base_w, cand_w = noisy(15, 0.25, 1), noisy(15, 0.25, 2)
    gate = tg.decide(QUIET_BASE * 3, (QUIET_CAND * 4)[:15], baseline_latency=latency(15, wiggle=base_w),
                     candidate_latency=latency(15, wiggle=cand_w))
    assert gate["throughput"]["decision"] == "pass"
    assert gate["decision"] == "inconclusive" and gate["final"] is True
    assert gate["decided_by"].startswith("latency: ")
    stuck = gate["latency"]["metrics"][gate["decided_by"].split(": ")[1]]
    assert stuck["decision"] == "inconclusive" and stuck["final"] and stuck["interval"][1] > 1.1
    # before the cap: more candidate runs, not an answer
    early = tg.decide(QUIET_BASE * 3, QUIET_CAND, baseline_latency=latency(15, wiggle=base_w),
                      candidate_latency=latency(4, wiggle=cand_w[:4]))
    assert early["decision"] == "inconclusive" and not early["final"] and early["runs_needed"] == 2


def test_a_noisy_baseline_latency_asks_for_baseline_runs_then_stops_before_any_change():
    w = noisy(15, 0.3, 3)
    first = tg.decide(QUIET_BASE, [], baseline_latency=latency(5, wiggle=w))
    assert first["decided_by"] == "baseline-noisy" and first["baseline_runs_needed"] == 1 and not first["final"]
    last = tg.decide(QUIET_BASE * 3, [], baseline_latency=latency(15, wiggle=w))
    assert last["final"] and last["too_noisy"] and last["decision"] == "inconclusive"
    assert "too noisy for a +" in last["reason"] and last["reason"].endswith("Nothing was changed.")
    # the same baseline with that metric left out (null) is ready
    off = {k: None for k in gate_settings.LATENCY_METRICS}
    assert tg.decide(QUIET_BASE, [], baseline_latency=latency(5, wiggle=w), latency_margins=off)["decided_by"] == "baseline-ready"


def test_a_margin_set_per_metric_is_respected():
    lat = (latency(5), latency(4, ttft=65.0))  # TTFT +30%
    assert tg.decide(QUIET_BASE, QUIET_CAND, baseline_latency=lat[0], candidate_latency=lat[1])["decision"] == "regression"
    wide = {"ttft_p50": 0.6, "ttft_p90": 0.6}
    gate = tg.decide(QUIET_BASE, QUIET_CAND, baseline_latency=lat[0], candidate_latency=lat[1], latency_margins=wide)
    assert gate["decision"] == "pass" and gate["latency"]["margins"]["ttft_p50"] == 0.6
    assert gate["latency"]["margins"]["tpot_p50"] == gate_settings.DEFAULT_LATENCY_MARGINS["tpot_p50"]
    gone = tg.decide(QUIET_BASE, QUIET_CAND, baseline_latency=lat[0], candidate_latency=lat[1],
                     latency_margins={"ttft_p50": None, "ttft_p90": 0})
    assert gone["decision"] == "pass" and set(gone["latency"]["metrics"]) == {"tpot_p50", "tpot_p90"}


def test_a_throughput_regression_stays_one_whatever_the_latency():
    gate = tg.decide(QUIET_BASE, [900.0, 905.0, 910.0, 902.0], baseline_latency=latency(5), candidate_latency=latency(4))
    assert gate["decision"] == "regression" and gate["decided_by"] == "test"


def test_a_part_that_passed_at_an_earlier_look_stays_passed():
    """Each part is a sequential test of its own: throughput passed at look 4 while TTFT needed 6 runs."""
    w = noisy(6, 0.06, 5)
    base = latency(5, wiggle=noisy(5, 0.06, 6))
    at4 = tg.decide(QUIET_BASE, QUIET_CAND, baseline_latency=base, candidate_latency=latency(4, wiggle=w[:4]))
    at6 = tg.decide(QUIET_BASE, QUIET_CAND + [1003.0, 900.0], baseline_latency=base, candidate_latency=latency(6, wiggle=w))
    assert at4["throughput"]["decision"] == "pass"
    assert at6["throughput"]["decision"] == "pass" and at6["look_runs"] == 4  # the run at 900 came after its pass


@pytest.mark.parametrize("kwargs,message", [
    ({"latency_margins": {"ttft_p50": 5}}, "latency_margins.ttft_p50 must be an increase between 0.01 and 1.0"),
    ({"latency_margins": {"ttft_p50": "x"}}, "latency_margins.ttft_p50 must be an increase"),
    ({"latency_margins": {"itl_p50": 0.1}}, "unknown metric(s) itl_p50"),
    ({"latency_margins": [0.1]}, "latency_margins must be a dict"),
    ({"latency_alpha": 0.7}, "latency_alpha must be in (0, 0.5)"),
    ({"baseline_latency": {"ttft_p50": [1.0, 2.0]}}, "baseline_latency.ttft_p50 has 2 runs but the baseline has 5"),
    ({"baseline_latency": {"ttft_p50": [1.0, 2.0, 0.0, 1.0, 1.0]}}, "has a run at 0 ms"),
    ({"baseline_latency": {"ttft_p50": [1.0, 2.0, -1.0, 1.0, 1.0]}}, "must be finite and not negative"),
    ({"baseline_latency": {"e2el_p50": [1.0] * 5}}, "unknown metric 'e2el_p50'"),
])
def test_bad_latency_input_is_refused_naming_it(kwargs, message):
    with pytest.raises(gate_stats.GateError) as err:
        tg.decide(QUIET_BASE, [], **kwargs)
    assert message in str(err.value)
    if "latency_margins" in kwargs or "latency_alpha" in kwargs:  # checked with the settings, before any run
        with pytest.raises(gate_stats.GateError):
            tg.check_all_settings(**kwargs)


def test_latency_series_from_benchmark_runs():
    runs = [{"ttft_ms": {"p50": 10.0, "p90": 12.0}, "tpot_ms": {"p50": 1.0, "p90": 1.5}},
            {"ttft_ms": {"p50": 11.0, "p90": 13.0}, "tpot_ms": {"p50": 1.1}}]
    assert tg.latency_series(runs) == {"ttft_p50": [10.0, 11.0], "ttft_p90": [12.0, 13.0], "tpot_p50": [1.0, 1.1]}
    assert tg.latency_series([]) == {} and tg.latency_series([{"output_throughput": 5.0}]) == {}


def test_the_filters_carry_the_latency_part():
    levels = [{"concurrency": 4, "runs": [{"ttft_ms": {"p50": 50.0 * w, "p90": 60.0 * w},
                                           "tpot_ms": {"p50": 3.0 * w, "p90": 3.3 * w}} for w in WIGGLE[:5]]}]
    lat = latency_samples(levels)
    assert set(lat) == {"4"} and len(lat["4"]["ttft_p50"]) == 5
    gate = throughput_gate(QUIET_BASE, QUIET_CAND, baseline_latency=lat["4"],
                           candidate_latency={k: [2 * v for v in vals[:4]] for k, vals in lat["4"].items()})
    assert gate["decision"] == "regression" and gate["decided_by"].startswith("latency: ")
    with pytest.raises(AnsibleFilterError, match="latency_margins.tpot_p90 must be"):
        throughput_gate(QUIET_BASE, [], latency_margins={"tpot_p90": 3})
    with pytest.raises(AnsibleFilterError, match="expected the benchmark's levels"):
        latency_samples({"4": []})


H200 = os.path.join(REPO, "docs", "examples", "h200-vllm")


def _stored_gate(path, label):
    with open(os.path.join(H200, path), encoding="utf-8") as fh:
        gate = next(g for g in json.load(fh)["gates"] if g["label"] == label)
    st = gate.get("settings") or {}
    kw = dict(threshold=st.get("threshold", 0.95), min_runs=st.get("min_runs", 5), max_runs=st.get("max_runs", 15),
              candidate_min_runs=st.get("candidate_min_runs", st.get("min_runs", 5)), bootstrap=0,
              order=st.get("order", "interleaved"))
    b, c = gate["baseline_runs"], gate["candidate_runs"]
    return ([r["output_throughput"] for r in b], [r["output_throughput"] for r in c], tg.latency_series(b),
            tg.latency_series(c), kw)


@pytest.mark.parametrize("path,label,throughput,combined", [
    ("run6/gate-c16-s2.json", "A/A", "pass", "pass"),  # 60 runs a side: every latency metric passes too
    ("run5/gate-c16-s2-max60.json", "A/A", "pass", "pass"),
    ("run6/gate-c16-s2.json", "hog", "regression", "regression"),
    ("run2/gate.json", "seqs32", "regression", "regression"),  # TTFT p50 3.2x: the latency part decides it first
    ("run5/gate-c16-s2.json", "A/A", "inconclusive", "inconclusive"),
])
def test_the_stored_h200_runs_judged_with_the_latency_part(path, label, throughput, combined):
    b, c, bl, cl, kw = _stored_gate(path, label)
    assert tg.replay(b, c, **kw)["decision"] == throughput  # the stored verdict, latency not given
    gate = tg.replay(b, c, baseline_latency=bl, candidate_latency=cl, **kw)
    assert gate["decision"] == combined and gate["latency"]["status"] == "judged"
    if label == "seqs32":
        assert gate["decided_by"] == "latency: ttft_p50" and gate["latency"]["metrics"]["ttft_p50"]["ratio"] > 3


def test_the_h200_stage_table_keeps_its_verdicts_and_shows_the_latency_part_on_request():
    with open(os.path.join(H200, "run2", "tune.json"), encoding="utf-8") as fh:
        records = json.load(fh)["records"]
    plain, judged = vfs.stage_table(records, 64), vfs.stage_table(records, 64, latency=True)
    gated = [r for r in plain if "latency" in r]
    assert gated and all(r["latency"]["status"] == "not measured" for r in gated)
    assert any(r.get("latency", {}).get("status") == "judged" for r in judged)
    for before, after in zip(plain, judged):  # a pass can only become a no, never the other way
        assert before["verdict"] == after["verdict"] or before["verdict"] == "pass" or after["verdict"] == "regression"

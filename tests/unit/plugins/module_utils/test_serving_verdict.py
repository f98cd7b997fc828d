# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving verdict (issue 33): stability from two audits of fake sysfs trees, and the four parts combined."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import throughput_gate as tg
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.verdict import VerdictError, serving_verdict
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import health as hc
from tests.unit.fakesysfs import two_numa_nodes
from tests.unit.plugins.module_utils.test_health_compare import XID_LOG, audit, degraded_host

BASE = [1000.0, 1004.0, 996.0, 1002.0, 998.0, 1001.0, 999.0, 1003.0]
SAME = [1001.0, 997.0, 1003.0, 999.0, 1002.0, 998.0, 1000.0, 1004.0]
SLOW = [v * 0.85 for v in BASE]


@pytest.fixture
def healthy(tmp_path):
    two_numa_nodes(tmp_path / "before", remote_irqs=False)
    two_numa_nodes(tmp_path / "after", remote_irqs=False)
    return audit(tmp_path / "before"), audit(tmp_path / "after")


def degraded(tmp_path) -> dict:
    """The node-1 GPU gone, the node-0 GPU at Gen4 x8 with new correctable AER errors (IRQs still on its node)."""
    degraded_host(tmp_path / "degraded", irq_cpus="0")
    return audit(tmp_path / "degraded")


# ---- stability ---------------------------------------------------------------------------------------------------
def test_the_same_host_twice_is_stable(healthy):
    got = hc.stability(*healthy, requests={"baseline": {"failed": 0, "requests": 64}, "candidate": {"failed": 0, "requests": 64}})
    assert got["status"] == "stable" and got["findings"] == [] and got["measured"] == ["host", "requests"]


def test_a_lost_gpu_a_downtrained_link_new_aer_and_xids_are_unstable(healthy, tmp_path):
    got = hc.stability(healthy[0], degraded(tmp_path), XID_LOG)
    assert got["status"] == "unstable"
    assert {f["code"] for f in got["findings"]} == {"gpu_missing", "link_degraded", "aer_new", "xid"}
    assert "0000:97:00.0" in got["reason"] and "Gen4 (16GT/s) x8" in got["reason"]


def test_what_a_change_is_expected_to_do_is_not_instability(tmp_path, healthy):
    # IRQs moved off the GPU's node: a finding of the health comparison (the audit reports it), not instability
    two_numa_nodes(tmp_path / "moved", remote_irqs=True)
    moved = audit(tmp_path / "moved")
    assert "irq_off_numa" in {f["code"] for f in hc.compare(healthy[0], moved)}
    got = hc.stability(healthy[0], moved)
    assert got["status"] == "stable" and got["findings"] == [], got


def test_more_failed_requests_are_unstable_and_bad_counts_are_refused():
    got = hc.stability(None, None, requests={"baseline": {"failed": 1, "requests": 100},
                                             "candidate": {"failed": 9, "requests": 100}})
    assert got["status"] == "unstable" and got["measured"] == ["requests"]
    assert got["reason"] == "the candidate failed 9.0% of its requests, the baseline 1.0%"
    for bad in ({"failed": -1, "requests": 10}, {"failed": 11, "requests": 10}, {"failed": 1.5, "requests": 10},
                {"failed": True, "requests": 10}):
        with pytest.raises(ValueError, match="candidate request counts must be whole numbers"):
            hc.stability(None, None, requests={"baseline": {"failed": 0, "requests": 10}, "candidate": bad})


def test_without_audits_or_counts_stability_is_not_measured():
    assert hc.stability(None, None)["status"] == "not measured"
    assert hc.stability({"devices": {}}, None)["status"] == "not measured"


# ---- the verdict -------------------------------------------------------------------------------------------------
def gate(candidate, baseline=None) -> dict:
    return tg.decide(BASE if baseline is None else baseline, candidate)


def test_every_part_yes_is_a_pass_and_keep(healthy):
    v = serving_verdict(gate(SAME), {"verdict": "equivalent", "reason": "within the A/A band"}, hc.stability(*healthy))
    assert (v["verdict"], v["keep"]) == ("pass", True)
    assert {k: p["says"] for k, p in v["parts"].items()} == {
        "throughput": "yes", "latency": "not measured", "outputs": "yes", "stability": "yes"}
    assert v["reason"].endswith("(latency not measured)")


def test_a_faster_change_that_lost_a_gpu_is_unstable(healthy, tmp_path):
    v = serving_verdict(gate(SAME), {"verdict": "equivalent"}, hc.stability(healthy[0], degraded(tmp_path)))
    assert (v["verdict"], v["keep"]) == ("unstable", False)
    assert "was in the previous audit but is not on the PCI bus now" in v["reason"]


def test_diverged_outputs_say_no_at_equal_throughput():
    v = serving_verdict(gate(SAME), {"verdict": "diverged", "reason": "beyond the tolerance: top-1 agreement 0.61"})
    assert (v["verdict"], v["keep"]) == ("diverged", False) and "top-1 agreement 0.61" in v["reason"]
    drifted = serving_verdict(gate(SAME), {"verdict": "drifted", "reason": "beyond the A/A band but within the tolerance"})
    assert drifted["verdict"] == "pass" and drifted["parts"]["outputs"]["answer"] == "drifted"


def test_the_gate_decides_when_outputs_and_stability_say_yes(healthy):
    v = serving_verdict(gate(SLOW), {"verdict": "equivalent"}, hc.stability(*healthy))
    assert (v["verdict"], v["keep"], v["parts"]["throughput"]["says"]) == ("regression", False, "no")


def test_latency_is_a_part_of_its_own():
    lat = {"ttft_p50": [100.0] * 8, "ttft_p90": [120.0] * 8, "tpot_p50": [10.0] * 8, "tpot_p90": [12.0] * 8}
    slow = {k: [x * 1.5 + i * 0.01 for i, x in enumerate(v)] for k, v in lat.items()}
    noisy = {k: [x + i * 0.01 for i, x in enumerate(v)] for k, v in lat.items()}
    g = tg.decide(BASE, SAME, baseline_latency=noisy, candidate_latency=slow)
    v = serving_verdict(g)
    assert v["verdict"] == "regression" and v["parts"]["latency"]["says"] == "no"
    assert v["parts"]["throughput"]["answer"] == "pass"


NO_MARGINS = {"ttft_p50": None, "ttft_p90": None, "tpot_p50": None, "tpot_p90": 0, "itl_p99": None}


def test_latency_left_out_by_null_margins_says_so():
    """Margins set null (the VM lab's kernel e2e does it) leave the latency part out: it says no margin was set, not that
    no latency was given, and the verdict is throughput's with latency named not measured."""
    lat = {"ttft_p50": [100.0] * 8, "ttft_p90": [120.0] * 8, "tpot_p50": [10.0] * 8, "tpot_p90": [12.0] * 8}
    slow = {k: [x * 3 + i * 0.01 for i, x in enumerate(v)] for k, v in lat.items()}  # would be a regression if judged
    g = tg.decide(BASE, SAME, baseline_latency=lat, candidate_latency=slow, latency_margins=NO_MARGINS)
    assert g["latency"]["status"] == "not measured" and g["latency"]["reason"] == tg.NO_MARGIN
    v = serving_verdict(g)
    assert v["verdict"] == "pass" and v["parts"]["latency"]["says"] == "not measured"
    assert v["parts"]["latency"]["reason"].startswith("no latency margin set (TTFT p50/p90, TPOT p50/p90 and ITL p99")
    assert v["reason"].endswith("(latency, outputs, stability not measured)")
    # margins in force but no per-run latency on a side: that reason, as before
    g = tg.decide(BASE, SAME, baseline_latency=lat, candidate_latency=None)
    assert serving_verdict(g)["parts"]["latency"]["reason"].startswith("no per-run TTFT/TPOT given")
    bare = {k: v for k, v in gate(SAME).items() if k != "latency"}  # a gate result without its latency part
    assert serving_verdict(bare)["parts"]["latency"]["reason"] == "no per-run latency was given to the gate"


def test_shapes_no_part_has_are_refused():
    with pytest.raises(VerdictError, match="the gate's result is required"):
        serving_verdict({})
    with pytest.raises(VerdictError, match="outputs has verdict 'same'"):
        serving_verdict(gate(SAME), {"verdict": "same"})
    with pytest.raises(VerdictError, match="stability has status 'ok'"):
        serving_verdict(gate(SAME), None, {"status": "ok"})

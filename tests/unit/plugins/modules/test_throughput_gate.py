# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""throughput_gate module and filter: the answers, fail_on_regression, check mode and bad input."""

from __future__ import annotations

import math

import pytest
from ansible.module_utils import _internal

from ansible_collections.gpufleet.inference.plugins.modules import throughput_gate
from tests.unit.plugins.modules.uthelper import run_module

BASE = [1012.5, 1003.1, 998.7, 1020.0, 1009.9]
SLOWER = [921.4, 930.8, 915.0, 925.2, 934.1]
SAME = [1005.0, 1011.2, 1000.4, 1016.8, 1008.0]


@pytest.fixture(autouse=True)
def module_side():
    """Importing controller code (the filter, ansible.errors) anywhere in the session makes module.warn()
    print instead of returning warnings; run these module tests as a module runs, and put the flag back."""
    saved = _internal.is_controller
    _internal.is_controller = False
    yield
    _internal.is_controller = saved


def run_main(args, capsys):
    return run_module(throughput_gate, args, capsys)


def _geometric_mean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def test_regression(capsys):
    result = run_main({"baseline": BASE, "candidate": SLOWER}, capsys)
    assert result["changed"] is False and result["actions"] == []
    assert result["decision"] == "regression" and result["runs_needed"] == 0
    assert result["ratio"] == pytest.approx(_geometric_mean(SLOWER) / _geometric_mean(BASE))
    assert result["p_value"] < result["gate"]["look"]["nominal_regression"]
    assert result["gate"]["decided_by"] == "test" and result["gate"]["baseline"]["n"] == 5 and result["gate"]["final"]
    assert result["reason"] == result["gate"]["reason"]


def test_pass_and_check_mode_agree(capsys):
    normal = run_main({"baseline": BASE, "candidate": SAME}, capsys)
    check = run_main({"baseline": BASE, "candidate": SAME, "_ansible_check_mode": True}, capsys)
    assert normal["decision"] == "pass"
    for key in ("decision", "ratio", "p_value", "reason", "gate"):
        assert normal[key] == check[key]


def test_inconclusive_asks_for_runs(capsys):
    # the first look is at 4 candidate runs, the next ones every `step` runs
    result = run_main({"baseline": BASE, "candidate": [880.0, 1000.0, 940.0, 1015.0]}, capsys)
    assert result["decision"] == "inconclusive" and result["runs_needed"] == 2 and not result["gate"]["final"]
    result = run_main({"baseline": BASE, "candidate": [880.0, 1000.0, 940.0, 1015.0], "step": 5}, capsys)
    assert result["runs_needed"] == 5
    result = run_main({"baseline": BASE, "candidate": [880.0, 1000.0, 940.0, 1015.0, 930.0]}, capsys)
    assert result["runs_needed"] == 1  # 5 runs is between the looks at 4 and 6


def test_baseline_alone_and_too_noisy(capsys):
    result = run_main({"baseline": BASE, "candidate": []}, capsys)
    assert result["gate"]["decided_by"] == "baseline-ready" and result["runs_needed"] == 4
    noisy = [1000.0, 1150.0, 900.0, 1080.0, 940.0] * 3
    result = run_main({"baseline": noisy, "candidate": [], "requests_per_run": 128}, capsys)
    assert result["decision"] == "inconclusive" and result["gate"]["too_noisy"] and result["gate"]["final"]
    assert result["reason"].startswith("host too noisy for a 5% gate: CV 9.3%, smallest detectable drop 10.6%")


def test_failures_reach_the_gate(capsys):
    result = run_main({"baseline": BASE, "candidate": SAME, "baseline_requests": 640, "candidate_failed": 2,
                       "candidate_requests": 640}, capsys)
    assert result["decision"] == "regression" and result["gate"]["decided_by"] == "failures"


def test_fail_on_regression(capsys):
    result = run_main({"baseline": BASE, "candidate": SLOWER, "fail_on_regression": True}, capsys)
    assert result["failed"] and result["msg"].startswith("regression: candidate/baseline 91.7%")
    assert result["decision"] == "regression"
    assert not run_main({"baseline": BASE, "candidate": SAME, "fail_on_regression": True}, capsys).get("failed")


def test_noisy_runs_warn(capsys):
    result = run_main({"baseline": [1000.0, 1150.0, 900.0, 1080.0, 940.0], "candidate": SAME}, capsys)
    texts = [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]
    assert any("baseline run-to-run CV" in t for t in texts)


@pytest.mark.parametrize("args, fragment", [
    ({"baseline": BASE, "candidate": SAME, "threshold": 1.5}, "Cannot judge the runs: threshold must be in (0, 1)"),
    ({"baseline": BASE, "candidate": SAME, "min_runs": 2}, "min_runs must be at least 3"),
    ({"baseline": BASE, "candidate": SAME, "candidate_failed": -1}, "candidate_failed must be a whole number of requests, 0 or more, got -1"),
    ({"baseline": BASE, "candidate": SAME, "spending": "linear"}, "value of spending must be one of"),
    ({"baseline": [0, 0, 0, 0, 0], "candidate": SAME}, "produced no tokens (0 tok/s)"),
    ({"baseline": BASE, "candidate": SAME, "bootstrap_resamples": -1}, "bootstrap_resamples must be a whole number between 0 (off) and 100000, got -1"),
    ({"baseline": BASE, "candidate": ["fast"]}, "unable to convert to float"),
])
def test_bad_input(capsys, args, fragment):
    result = run_main(args, capsys)
    assert result["failed"] and fragment in result["msg"]


# ---- the filter (imported inside the tests: it is controller code) --------------------------------
def gate_filter():
    from ansible_collections.gpufleet.inference.plugins.filter.throughput_gate import FilterModule

    return FilterModule().filters()["throughput_gate"]


def test_filter_matches_the_module(capsys):
    module = run_main({"baseline": BASE, "candidate": SLOWER}, capsys)
    gate = gate_filter()
    assert gate(BASE, SLOWER) == module["gate"]
    assert gate(tuple(BASE), SAME, threshold="0.95", min_runs="5")["decision"] == "pass"
    assert gate(["1000", "1010", "990", "1005", "995"], SLOWER)["decision"] == "regression"
    assert gate(BASE, [], requests_per_run="128", spending="pocock")["decided_by"] == "baseline-ready"


@pytest.mark.parametrize("baseline, candidate, kwargs, fragment", [
    (BASE, "fast", {}, "candidate must be a list"),
    (BASE, SAME, {"alpha": 0.9}, "alpha must be in (0, 0.5)"),
    (BASE, SAME, {"min_runs": "five"}, "invalid literal"),
    (BASE, SAME, {"stepp": 2}, "unknown option(s) stepp"),
])
def test_filter_errors(baseline, candidate, kwargs, fragment):
    gate = gate_filter()
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError) as err:
        gate(baseline, candidate, **kwargs)
    assert str(err.value).startswith("throughput_gate: ") and fragment in str(err.value)


# ---- workloads (issue 31): the module and the filter refuse runs of different workloads ----------------
def _bench(model="Qwen/Qwen2.5-7B-Instruct", levels=(8, 32)):
    return {"server": {"model": model, "root": f"/models/{model}", "max_model_len": 4096},
            "config": {"prompt_tokens": 1024, "output_tokens": 128, "concurrency": list(levels), "requests": 128,
                       "ignore_eos": True, "prompt_mode": "token_ids", "token_id_range": [1000, 4000]}}


def test_the_module_refuses_runs_of_different_workloads(capsys):
    args = {"baseline": BASE, "candidate": SAME, "baseline_workload": _bench(levels=(4,)),
            "candidate_workload": _bench(levels=(32,))}
    result = run_main(args, capsys)
    assert result["failed"] and result["msg"].startswith("Cannot judge the runs: the runs are of different workloads")
    assert "concurrency: baseline 4, candidate 32" in result["msg"]
    # two sweeps compared at one level of both
    same = run_main({**args, "baseline_workload": _bench(), "candidate_workload": _bench(), "workload_concurrency": 32}, capsys)
    assert same["decision"] == "pass"


def test_the_filter_refuses_runs_of_different_workloads():
    from ansible.errors import AnsibleFilterError

    gate = gate_filter()
    with pytest.raises(AnsibleFilterError, match="model: baseline 'a', candidate 'b'"):
        gate(BASE, SAME, baseline_workload={"model": "a", "concurrency": 32}, candidate_workload={"model": "b", "concurrency": 32})
    assert gate(BASE, SAME, baseline_workload=_bench(), candidate_workload=_bench())["decision"] == "pass"


def test_the_gate_refuses_runs_of_different_profiles(capsys):
    """Issue 35: a shared-prefix baseline is no baseline for unique prompts, nor a Poisson run for a closed loop."""
    def profiled(profile, arrivals=None):
        doc = _bench()
        doc["config"].update(profile=profile, arrivals=arrivals or {"mode": "closed"})
        return doc

    prefix = profiled({"name": "shared_prefix", "prefix_tokens": 1024, "turns": 1})
    args = {"baseline": BASE, "candidate": SAME, "workload_concurrency": 32, "baseline_workload": prefix}
    result = run_main({**args, "candidate_workload": _bench()}, capsys)  # stored before profiles: random, closed
    assert result["failed"] and "workload_profile.name: baseline 'shared_prefix', candidate 'random'" in result["msg"]
    result = run_main({**args, "candidate_workload": profiled({"name": "shared_prefix", "prefix_tokens": 1024, "turns": 4})},
                      capsys)
    assert result["failed"] and "workload_profile.turns: baseline 1, candidate 4" in result["msg"]
    poisson = profiled({"name": "random"}, {"mode": "poisson", "rate": 4.0, "burstiness": 1.0})
    result = run_main({**args, "baseline_workload": _bench(), "candidate_workload": poisson}, capsys)
    assert result["failed"] and "arrivals.mode: baseline 'closed', candidate 'poisson'" in result["msg"]
    assert run_main({**args, "candidate_workload": prefix}, capsys)["decision"] == "pass"


# ---- the serving verdict (issue 33): outputs and stability beside the gate's answer ------------------------------
def _audits(tmp_path):
    from tests.unit.plugins.module_utils.test_health_compare import audit
    from tests.unit.plugins.module_utils.test_serving_verdict import degraded
    from tests.unit.fakesysfs import two_numa_nodes
    two_numa_nodes(tmp_path / "before", remote_irqs=False)
    two_numa_nodes(tmp_path / "same", remote_irqs=False)
    return audit(tmp_path / "before"), audit(tmp_path / "same"), degraded(tmp_path)


def test_the_verdict_keeps_a_change_only_when_every_measured_part_says_yes(capsys, tmp_path):
    before, same, lost = _audits(tmp_path)
    kept = run_main({"baseline": BASE, "candidate": SAME, "baseline_health": before, "candidate_health": same,
                     "outputs": {"verdict": "equivalent", "reason": "within the A/A band"}}, capsys)
    assert (kept["verdict"]["verdict"], kept["verdict"]["keep"], kept["decision"]) == ("pass", True, "pass")
    assert kept["verdict"]["reason"].endswith("(latency not measured)")
    unstable = run_main({"baseline": BASE, "candidate": SAME, "baseline_health": before, "candidate_health": lost}, capsys)
    assert (unstable["verdict"]["verdict"], unstable["decision"]) == ("unstable", "pass")
    assert "was in the previous audit but is not on the PCI bus now" in unstable["verdict"]["reason"]
    diverged = run_main({"baseline": BASE, "candidate": SAME, "outputs": {"verdict": "diverged", "reason": "top-1 0.4"},
                         "fail_on_regression": True}, capsys)
    assert diverged["failed"] and diverged["msg"].startswith("diverged: top-1 0.4")
    assert diverged["verdict"]["parts"]["stability"]["says"] == "not measured"


def test_more_failed_requests_are_unstable_and_a_bad_part_is_refused(capsys):
    result = run_main({"baseline": BASE, "candidate": SAME, "baseline_failed": 0, "baseline_requests": 320,
                       "candidate_failed": 3, "candidate_requests": 320}, capsys)
    assert result["verdict"]["verdict"] == "unstable" and "failed 0.9% of its requests" in result["verdict"]["reason"]
    bad = run_main({"baseline": BASE, "candidate": SAME, "outputs": {"verdict": "same"}}, capsys)
    assert bad["failed"] and bad["changed"] is False
    assert bad["msg"].startswith("Cannot give the serving verdict: outputs has verdict 'same'")

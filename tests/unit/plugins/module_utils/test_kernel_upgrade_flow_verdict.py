# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel upgrade commits only on a passing serving verdict (issue 33, item 5): the output reference is recorded on
the old kernel before the pin, the outputs and the host's health are checked once the gate is final, a diverged or
unstable candidate rolls back as a regression does, each part is journaled with its figures, a part left out is named
"not measured", and a journal from before these parts still resumes. Whole runs on the simulated host of flow_sim.py;
the kill-anywhere runs of test_kernel_upgrade_flow.py cover the diverged and GPU-gone scenarios too."""

from __future__ import annotations

import copy

from ansible_collections.gpufleet.inference.plugins.module_utils.kernel import flow
from tests.unit.plugins.module_utils.flow_sim import NEW, OLD, SETTINGS, Host, drive


class Configured(Host):
    """The simulated host run with other role settings; ``switch_after`` candidate benchmarks (a role updated mid-flow:
    the journal was started without the parts, a new role resumes it with them)."""

    def __init__(self, settings=None, later=None, switch_after=None, **kw):
        super().__init__(**kw)
        self.first, self.later, self.switch_after = settings or SETTINGS, later, switch_after

    def observe(self, event, data, settings=None):
        done = sum(1 for b in self.benchmarks if b["label"] == "candidate")
        late = self.later is not None and self.switch_after is not None and done >= self.switch_after
        return super().observe(event, data, self.later if late else self.first)


def names(result):
    return [a["name"] for a in result["actions"]]


def test_diverged_outputs_roll_back_with_the_reference_recorded_on_the_old_kernel_before_the_pin():
    host = Host(outputs_new="diverged")
    result = drive(host)
    assert result["finish"]["decision"] == "diverged" and result["finish"]["ok"] is False
    assert (host.running, host.default) == (OLD, OLD)  # rolled back: the old kernel runs and is the saved default
    seen = names(result)
    assert seen.index("audit") < seen.index("outputs") < seen.index("pin")  # before any change
    assert seen.index("benchmark", seen.index("verify")) < seen.index("check") < seen.index("rollback")
    assert host.references == [OLD]
    record = host.history[0]
    assert record["outputs_reference"]["kernel"] == OLD and record["health_before"]["gpus"]
    parts = record["verdict"]["parts"]
    assert parts["throughput"]["says"] == "yes" and parts["outputs"]["answer"] == "diverged"
    assert parts["outputs"]["says"] == "no" and parts["outputs"]["figures"] == {"top1_agreement": 0.8}
    assert record["verdict"]["reason"] == "diverged (simulated) (latency not measured)"


def test_a_gpu_gone_after_the_benchmark_is_unstable_and_rolls_back():
    host = Host(gpus_new=1)
    result = drive(host)
    assert result["finish"]["decision"] == "unstable" and (host.running, host.default) == (OLD, OLD)
    parts = host.history[0]["verdict"]["parts"]
    assert parts["stability"]["says"] == "no" and parts["throughput"]["says"] == "yes"
    assert [f["code"] for f in parts["stability"]["findings"]] == ["gpu_missing"]
    assert "0000:41:00.0" in host.history[0]["verdict"]["reason"]


def test_a_candidate_that_serves_the_same_commits_with_every_part_journaled():
    host = Host()
    result = drive(host)
    assert result["finish"]["decision"] == "pass" and (host.running, host.default) == (NEW, NEW)
    verdict = host.history[0]["verdict"]
    assert {k: v["says"] for k, v in verdict["parts"].items()} == {
        "throughput": "yes", "latency": "not measured", "outputs": "yes", "stability": "yes"}
    assert verdict["reason"].endswith("(latency not measured)")  # the simulated benchmarks carry no latency
    assert host.history[0]["checks"]["outputs"]["verdict"] == "equivalent"
    # the history's record of it (bench_history verdicts): the change named, when, each part
    from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history as bh
    record = flow.record_facts(host.history[0], result["finish"])["serving_verdict"]
    assert record["stage"] == f"kernel {OLD} -> {NEW}" and record["verdict"] == "pass" and record["keep"] is True
    assert bh.check_verdict(record) is record and record["decided_at"].endswith("Z")


def test_parts_left_out_are_named_not_measured_and_never_asked_for():
    off = {**copy.deepcopy(SETTINGS), "outputs": False, "stability": False}
    host = Configured(settings=off, outputs_new="diverged", gpus_new=1)
    result = drive(host)
    assert "outputs" not in names(result) and "check" not in names(result)
    assert result["finish"]["decision"] == "pass"  # what was left out cannot say no, and the verdict says so
    verdict = host.history[0]["verdict"]
    assert verdict["parts"]["outputs"] == {"answer": None, "says": "not measured", "reason": "left out (outputs: false)"}
    assert verdict["parts"]["stability"]["reason"].endswith("host health left out (stability: false)")
    assert "outputs not measured" in verdict["reason"]


def test_a_journal_from_before_the_parts_resumes_and_names_them_not_measured():
    """The upgrade started by a role without the parts (no reference, no health document before the change) and
    resumed by one with them: no reference is recorded on the new kernel, the check is not asked for, the verdict says
    why the parts were not measured."""
    old_role = {k: v for k, v in SETTINGS.items() if k not in ("outputs", "stability")}
    host = Configured(settings=old_role, later=SETTINGS, switch_after=1, outputs_new="diverged")
    result = drive(host)
    assert host.references == [] and "check" not in names(result)
    assert result["finish"]["decision"] == "pass"
    parts = host.history[0]["verdict"]["parts"]
    assert parts["outputs"]["says"] == "not measured" and "no output reference was kept" in parts["outputs"]["reason"]


def test_a_controller_lost_before_the_checks_report_checks_again_on_resume():
    host = Host(outputs_new="diverged")
    reference = drive(Host(outputs_new="diverged"))
    at = next(i for i, a in enumerate(reference["actions"], 1) if a["name"] == "check")
    result = drive(host, kill=(at, 2))  # died after the compare and the audit, before the report
    assert result["crashed"] and result["finish"]["decision"] == "diverged"
    assert names(result).count("check") == 2 and (host.running, host.default) == (OLD, OLD)


def test_an_outputs_event_from_the_new_kernel_is_refused():
    host = Host()
    # a journal at the baseline, ready and audited, on the old kernel: an outputs event claiming the new kernel runs
    recorder = Host()
    state = {}

    def keep(j, _orig=recorder.write):
        _orig(j)
        if j and j.get("findings_before") is not None and j["stage"] == "baseline" and "j" not in state:
            state["j"] = copy.deepcopy(j)

    recorder.write = keep
    drive(recorder)
    journal = state["j"]
    obs = host.observe("outputs", {"reference": "/r.json", "band": {}, "aa": {}})
    obs.update(running=NEW)
    try:
        flow.step(journal, obs)
    except flow.FlowError as err:
        assert "the reference belongs to" in str(err)
    else:
        raise AssertionError("an output reference from the new kernel was taken")

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel upgrade's gate refuses what it cannot compare (issue 31): a candidate of another workload, counts
that give no failure rate, and settings that cannot give a verdict, the last before anything is measured. Whole
runs on the simulated host of flow_sim.py."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.inference.plugins.module_utils.kernel import flow
from tests.unit.plugins.module_utils.flow_sim import NEW, OLD, SETTINGS, Host, drive

REPO = Path(__file__).resolve().parents[4]
MODEL = "Qwen/Qwen2.5-7B-Instruct"


def settings(**gate):
    out = copy.deepcopy(SETTINGS)
    out["gate"].update(gate)
    return out


class Configured(Host):
    """The simulated host with the role's settings of one run."""

    def __init__(self, run_settings, **kw):
        super().__init__(**kw)
        self.run_settings = run_settings

    def observe(self, event, data, settings=None):
        return super().observe(event, data, self.run_settings)


def test_a_candidate_at_another_concurrency_is_refused_and_rolled_back():
    # before: the candidate at c=32 was judged against the baseline at c=4 and committed
    host = Host(workloads={"candidate": (MODEL, 32)})
    result = drive(host)
    assert result["finish"]["decision"] == "error", result["finish"]
    assert "concurrency: baseline 4, candidate 32" in result["finish"]["reason"]
    assert (host.running, host.default) == (OLD, OLD)
    record = host.history[0]
    assert record["baseline"]["workload"]["concurrency"] == 4 and record["candidate"]["workload"]["concurrency"] == 32


def test_a_candidate_of_another_model_is_refused():
    host = Host(workloads={"candidate": ("meta-llama/Llama-3.1-8B", 4)})
    result = drive(host)
    assert result["finish"]["decision"] == "error"
    assert f"model: baseline '{MODEL}', candidate 'meta-llama/Llama-3.1-8B'" in result["finish"]["reason"]
    assert host.history[0]["baseline"]["model"] == MODEL and (host.running, host.default) == (OLD, OLD)


def test_the_same_workload_passes_and_is_journaled():
    host = Host()
    assert drive(host)["finish"]["decision"] == "pass" and host.running == host.default == NEW
    record = host.history[0]
    assert record["baseline"]["workload"] == record["candidate"]["workload"]
    assert record["baseline"]["workload"]["model"] == MODEL and record["baseline"]["workload"]["requests"] == 32


def test_results_without_a_workload_still_resume_and_are_judged_with_a_warning():
    """A journal written by the release before fingerprints holds sides without a workload: resumed by this one
    (whose candidate carries one), the gate judges it and says what it could not check."""
    for crash_after in range(1, 20):
        host = Host(workloads={"baseline": None})
        result = drive(host, crash_after=crash_after)
        assert result["finish"]["decision"] == "pass", (crash_after, result["finish"])
        assert (host.running, host.default) == (NEW, NEW)
    record = host.history[0]
    assert "workload" in record["baseline"] and record["baseline"]["workload"] == {}
    assert any("baseline's workload was not recorded" in w for w in record["gate"]["warnings"])
    # and one written with no workload on either side at all (keys absent, as the old release wrote it)
    old = Host(workloads={"baseline": None, "candidate": None})
    assert drive(old)["finish"]["decision"] == "pass"


def test_a_journal_of_the_old_release_at_stage_candidate_resumes():
    host = Host(workloads={"baseline": None, "candidate": None})
    state = {}

    def keep(journal, _orig=host.write):
        _orig(journal)
        if journal is not None and journal["stage"] == "candidate" and "j" not in state:
            state["j"] = copy.deepcopy(journal)

    host.write = keep
    drive(host)
    journal = state["j"]
    for side in ("baseline", "candidate"):
        for key in ("workload", "model"):
            (journal.get(side) or {}).pop(key, None)
    obs = Host().observe("start", {})
    obs.update(running=NEW, default=OLD)
    _journal, action = flow.step(journal, obs)
    assert action["name"] in ("benchmark", "commit"), action


def test_negative_failures_are_refused_not_committed():
    # before: failed -50 gave the candidate a negative failure rate and the upgrade committed. The event's
    # payload is checked before the flow reads it: the step is refused with nothing changed (kernel_rollout_step
    # reports it as refused), and the candidate it came from stays guarded by its boot-health unit.
    host = Host(cand_failed=-50)
    with pytest.raises(flow.FlowError, match="'failed' is -50, not a count: refused, nothing was changed"):
        drive(host)
    assert host.running == NEW and host.default == OLD and host.unit == NEW
    assert host.journal["stage"] == "candidate" and not host.history


def test_a_journal_with_a_negative_failure_count_is_refused_by_the_gate():
    host = Host()
    state = {}

    def keep(journal, _orig=host.write):
        _orig(journal)
        if journal is not None and journal["stage"] == "candidate" and (journal.get("candidate") or {}).get("samples"):
            state.setdefault("j", copy.deepcopy(journal))

    host.write = keep
    drive(host)
    journal = state.get("j")
    if journal is None:  # a quiet host is decided at the first look: build the candidate stage from the verdict
        journal = copy.deepcopy(host.history[0])
        journal.update(stage="candidate", finished=False, verdict=None)
    journal["candidate"]["failed"] = -50
    obs = Host().observe("start", {})
    obs.update(running=NEW, default=OLD)
    _journal, action = flow.step(journal, obs)
    assert action["name"] == "rollback"
    assert "candidate_failed must be a whole number of requests, 0 or more, got -50" in _journal["verdict"]["reason"]


@pytest.mark.parametrize("gate, fragment", [
    ({"min_runs": 20, "max_runs": 30}, "max_baseline_runs (15) must be at least min_runs (20)"),
    ({"max_runs": 2 ** 63}, "max_runs must be a whole number of runs between 1 and 1000"),
    ({"min_runs": "five"}, "a gate setting is not a number"),
    ({"candidate_min_runs": 40}, "candidate_min_runs must be between 3 and max_runs (15)"),
    ({"threshold": 1.5}, "threshold must be in (0, 1)"),
])
def test_settings_are_refused_before_any_benchmark(gate, fragment):
    # before: min_runs 20 measured the whole baseline, then ended in error
    host = Configured(settings(**gate))
    result = drive(host)
    assert result["finish"]["decision"] == "error" and fragment in result["finish"]["reason"], result["finish"]
    assert host.benchmarks == [] and host.held == [] and host.journal is None and host.history == []
    assert "Nothing was measured or changed" in result["finish"]["reason"]


def test_a_larger_baseline_cap_lets_min_runs_above_15_run():
    host = Configured(settings(min_runs=20, max_runs=30, max_baseline_runs=30))
    result = drive(host)
    assert result["finish"]["decision"] == "pass" and len(host.history[0]["baseline"]["samples"]) >= 20


def test_the_baseline_cap_counts_runs_not_rounds():
    """A noisy baseline is measured up to max_baseline_runs runs, never past it."""
    host = Configured(settings(max_baseline_runs=8), base_pattern=[1.0, 0.9, 1.05, 0.95, 1.1, 0.92])
    result = drive(host)
    assert result["finish"]["decision"] == "inconclusive"
    assert len(host.history[0]["baseline"]["samples"]) == 8


def test_the_role_passes_every_cap_of_the_gate():
    step = yaml.safe_load((REPO / "roles/kernel_upgrade/tasks/step.yml").read_text())[0]
    gate = step["gpufleet.inference.kernel_rollout_step"]["gate"]
    assert gate["max_baseline_runs"] == "{{ kernel_upgrade_gate_max_baseline_runs }}"
    assert gate["candidate_min_runs"] == "{{ kernel_upgrade_gate_candidate_min_runs }}"
    defaults = yaml.safe_load((REPO / "roles/kernel_upgrade/defaults/main.yml").read_text())
    specs = yaml.safe_load((REPO / "roles/kernel_upgrade/meta/argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    for name in ("kernel_upgrade_gate_max_baseline_runs", "kernel_upgrade_gate_candidate_min_runs",
                 "kernel_upgrade_gate_latency_margins", "kernel_upgrade_gate_latency_alpha"):
        assert name in defaults and options[name]["default"] == defaults[name]
    action = yaml.safe_load((REPO / "roles/kernel_upgrade/tasks/action_benchmark.yml").read_text())[-1]
    data = action["vars"]["__kernel_upgrade_data"]
    assert "server" in data and "config" in data  # the workload reaches the journal

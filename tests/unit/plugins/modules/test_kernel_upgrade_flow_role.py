# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""roles/kernel_upgrade against the flow it drives: every action the state machine can answer has
its task file, each task file reports the event the flow expects after it, and the tasks hold no
decisions of their own (no set_fact of a decision, no gate call)."""

from __future__ import annotations

import os
import re

import yaml

from ansible_collections.gpufleet.inference.plugins.module_utils.kernel import flow
from tests.helpers import REPO

TASKS = os.path.join(REPO, "roles", "kernel_upgrade", "tasks")
# action -> the event its task file reports
REPORTS = {"lock": "locked", "benchmark": "benchmarked", "audit": "audited", "pin": "pinned", "install": "installed",
           "boot_once": "rebooted", "verify": "verified", "commit": "committed", "rollback": "rolled_back",
           "outputs": "outputs", "check": "checked"}


def actions_in_flow() -> set[str]:
    """The kernel kind's ACTIONS and every action name its steps' code (kernel/flow.py) can answer."""
    with open(flow.__file__, encoding="utf-8") as fh:
        text = fh.read()
    names = set(re.findall(r'\{"name": "([a-z_]+)"', text)) | set(re.findall(r'lock_action\("([a-z_]+)"', text))
    return (names | {a["name"] for a in flow.ACTIONS}) - {"finish"}


def load(name: str):
    with open(os.path.join(TASKS, name), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def test_every_action_of_the_flow_has_its_task_file_and_reports_its_event():
    assert actions_in_flow() == set(REPORTS)
    for action, event in REPORTS.items():
        tasks = load(f"action_{action}.yml")
        reports = [t for t in tasks if (t.get("ansible.builtin.include_tasks") or {}).get("file") == "step.yml"]
        assert len(reports) == 1 and tasks[-1] is reports[0], f"action_{action}.yml must end with one report"
        assert reports[0]["vars"]["__kernel_upgrade_event"] == event
        assert event in flow.EVENTS


def test_the_role_keeps_no_decisions_of_its_own():
    for name in os.listdir(TASKS):
        text = open(os.path.join(TASKS, name), encoding="utf-8").read()
        assert "throughput_gate" not in text, name
        assert "__kernel_upgrade_decision" not in text and "__kernel_upgrade_stage" not in text, name
        for task in load(name) or []:
            facts = task.get("ansible.builtin.set_fact") or {}
            assert not {"decision", "stage", "verdict"} & {k.rsplit("_", 1)[-1] for k in facts}, (name, facts)


def test_the_step_passes_every_setting_the_flow_reads():
    step = load("step.yml")[0]["gpufleet.inference.kernel_rollout_step"]
    assert {"target", "event", "data", "preflight", "run_id", "reboot_ok", "lock", "lock_packages", "verify_pcie",
            "commit_timeout", "lease_run_id", "lease_ttl", "gate", "outputs", "stability"} <= set(step)
    assert set(step["gate"]) == {"threshold", "alpha", "pass_alpha", "min_runs", "max_runs", "max_baseline_runs",
                                 "candidate_min_runs", "requests_per_run", "latency_margins", "latency_alpha",
                                 "between_start_sd"}
    # the per-run latency of each side reaches the journal (the gate's latency part)
    data = load("action_benchmark.yml")[-1]["vars"]["__kernel_upgrade_data"]
    assert "latency_samples" in data["latency"] and "benchmark.levels" in data["latency"]


def test_the_boot_health_unit_comes_before_the_one_shot_entry_and_the_reboot():
    names = [next(k for k in t if k.startswith(("ansible.", "gpufleet."))) for t in load("action_boot_once.yml")]
    # the check's directory first: Debian has no /usr/local/libexec (the lab's re-run failed there, 2026-12-02)
    assert names[:5] == ["ansible.builtin.file", "ansible.builtin.copy", "gpufleet.inference.kernel_boot_health",
                         "gpufleet.inference.kernel_boot_entry", "ansible.builtin.reboot"]
    assert load("action_boot_once.yml")[0]["ansible.builtin.file"]["path"] == "/usr/local/libexec"
    for action in ("commit", "rollback"):
        tasks = load(f"action_{action}.yml")
        assert any(t.get("gpufleet.inference.kernel_boot_health", {}).get("state") == "absent" for t in tasks), action

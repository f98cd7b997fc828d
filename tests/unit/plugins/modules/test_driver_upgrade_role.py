# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""roles/driver_upgrade against the flow its gated mode drives (driver/upgrade.py DRIVER): every action the flow can
answer has its task file ending in the report of the event the flow expects, the tasks hold no decisions of their own,
the step passes every setting the flow reads, and the defaults are the argument specs'."""

from __future__ import annotations

import os

import yaml

from ansible_collections.gpufleet.inference.plugins.module_utils.driver.upgrade import DRIVER
from ansible_collections.gpufleet.inference.plugins.modules.driver_upgrade_step import ARGUMENT_SPEC
from tests.helpers import REPO

ROLE = os.path.join(REPO, "roles", "driver_upgrade")
TASKS = os.path.join(ROLE, "tasks")


def load(name: str):
    with open(os.path.join(TASKS, name), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def test_every_action_of_the_flow_has_its_task_file_and_reports_its_event():
    files = {n[len("action_"):-len(".yml")] for n in os.listdir(TASKS) if n.startswith("action_")}
    assert files == {a["name"] for a in DRIVER.actions}
    for action in DRIVER.actions:
        tasks = load(f"action_{action['name']}.yml")
        reports = [t for t in tasks if (t.get("ansible.builtin.include_tasks") or {}).get("file") == "step.yml"]
        assert len(reports) == 1 and tasks[-1] is reports[0], f"action_{action['name']}.yml must end with one report"
        assert reports[0]["vars"]["__driver_upgrade_event"] == action["reports"]


def test_the_role_keeps_no_decisions_of_its_own():
    for name in os.listdir(TASKS):
        text = open(os.path.join(TASKS, name), encoding="utf-8").read()
        assert "throughput_gate" not in text and "judged_verdict" not in text, name


def test_the_step_passes_every_setting_the_flow_reads_and_failures_reach_the_flow():
    step = load("step.yml")[0]["gpufleet.inference.driver_upgrade_step"]
    assert {"target", "packages", "event", "data", "run_id", "activate", "reboot_ok", "hold_packages", "verify_pcie",
            "outputs", "stability", "version_file", "state", "preflight", "lease_run_id", "lease_ttl",
            "gate"} <= set(step) <= set(ARGUMENT_SPEC)
    data = load("action_benchmark.yml")[-1]["vars"]["__driver_upgrade_data"]
    assert DRIVER.side_key in data and "latency_samples" in data["latency"]
    # an install or an activation that fails is reported to the flow (which rolls back), never raised past it
    install = next(t for t in load("action_install.yml") if t.get("register") == "__driver_upgrade_install")
    assert install["failed_when"] is False
    activate = next(t for t in load("action_activate.yml") if t["name"] == "Activate it")
    assert activate["ansible.builtin.include_tasks"]["file"] == "activate.yml"
    assert activate["vars"]["__driver_upgrade_report_failure"] is True


def test_the_defaults_are_the_argument_specs():
    with open(os.path.join(ROLE, "defaults", "main.yml"), encoding="utf-8") as fh:
        defaults = yaml.safe_load(fh)
    with open(os.path.join(ROLE, "meta", "argument_specs.yml"), encoding="utf-8") as fh:
        options = yaml.safe_load(fh)["argument_specs"]["main"]["options"]
    assert set(options) == set(defaults)
    assert all(options[k].get("default") == v for k, v in defaults.items()), [
        k for k, v in defaults.items() if options[k].get("default") != v]

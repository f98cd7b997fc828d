# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""roles/vllm_upgrade against the flow it drives (vllm/upgrade.py VLLM): every action the flow can answer has its task
file ending in the report of the event the flow expects, the tasks hold no decisions of their own, the step passes
every setting the flow reads, and the switch and the rollback never reboot."""

from __future__ import annotations

import os

import yaml

from ansible_collections.gpufleet.inference.plugins.module_utils.vllm.upgrade import VLLM
from ansible_collections.gpufleet.inference.plugins.modules.vllm_upgrade_step import ARGUMENT_SPEC
from tests.helpers import REPO

ROLE = os.path.join(REPO, "roles", "vllm_upgrade")
TASKS = os.path.join(ROLE, "tasks")


def load(name: str):
    with open(os.path.join(TASKS, name), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def test_every_action_of_the_flow_has_its_task_file_and_reports_its_event():
    files = {n[len("action_"):-len(".yml")] for n in os.listdir(TASKS) if n.startswith("action_")}
    assert files == {a["name"] for a in VLLM.actions}
    for action in VLLM.actions:
        tasks = load(f"action_{action['name']}.yml")
        reports = [t for t in tasks if (t.get("ansible.builtin.include_tasks") or {}).get("file") == "step.yml"]
        assert len(reports) == 1 and tasks[-1] is reports[0], f"action_{action['name']}.yml must end with one report"
        assert reports[0]["vars"]["__vllm_upgrade_event"] == action["reports"]


def test_the_role_keeps_no_decisions_of_its_own():
    for name in os.listdir(TASKS):
        text = open(os.path.join(TASKS, name), encoding="utf-8").read()
        assert "throughput_gate" not in text and "judged_verdict" not in text, name
        for task in load(name) or []:
            facts = task.get("ansible.builtin.set_fact") or {}
            assert not {"decision", "stage", "verdict"} & {k.rsplit("_", 1)[-1] for k in facts}, (name, facts)


def test_the_step_passes_every_setting_the_flow_reads():
    step = load("step.yml")[0]["gpufleet.inference.vllm_upgrade_step"]
    assert {"target", "event", "data", "run_id", "restart_ok", "verify_pcie", "outputs", "stability", "findings",
            "base_dir", "lease_run_id", "lease_ttl", "gate"} <= set(step) <= set(ARGUMENT_SPEC)
    assert set(step["gate"]) == {"threshold", "alpha", "pass_alpha", "min_runs", "max_runs", "max_baseline_runs",
                                 "candidate_min_runs", "requests_per_run", "latency_margins", "latency_alpha",
                                 "between_start_sd"}
    data = load("action_benchmark.yml")[-1]["vars"]["__vllm_upgrade_data"]
    assert VLLM.side_key in data and "latency_samples" in data["latency"]


def test_no_task_file_reboots_and_the_switch_restarts_after_moving_the_link():
    for name in os.listdir(TASKS):
        assert "ansible.builtin.reboot" not in open(os.path.join(TASKS, name), encoding="utf-8").read(), name
    for action in ("switch", "rollback"):
        modules = [next(k for k in t if k.startswith(("ansible.", "gpufleet."))) for t in load(f"action_{action}.yml")]
        assert modules[:2] == ["ansible.builtin.file", "ansible.builtin.systemd_service"], action
        assert load(f"action_{action}.yml")[0]["ansible.builtin.file"]["dest"].endswith("/current")


def test_the_candidate_is_built_without_moving_the_link_and_the_defaults_match_the_specs():
    install = load("action_install.yml")
    block = next(t for t in install if "block" in t)["block"]
    assert block[0]["ansible.builtin.include_role"] == {"name": "gpufleet.inference.vllm_service", "tasks_from": "install.yml"}
    assert block[0]["vars"]["__vllm_service_build_only"] is True
    # no variable of the include defined by itself (Ansible's recursive loop): the choice is made before it
    assert all(f"{{{{ {k}" not in str(v) and f"else {k} " not in str(v) for k, v in block[0]["vars"].items())
    with open(os.path.join(REPO, "roles", "vllm_service", "tasks", "install.yml"), encoding="utf-8") as fh:
        service = yaml.safe_load(fh)
    switching = next(t for t in service if t.get("name") == "Switch the unit to the venv and prune old venvs")
    assert "__vllm_service_build_only" in switching["when"]
    assert any("vllm_upgrade/journal.json" in str(t) for t in switching["block"])
    with open(os.path.join(ROLE, "defaults", "main.yml"), encoding="utf-8") as fh:
        defaults = yaml.safe_load(fh)
    with open(os.path.join(ROLE, "meta", "argument_specs.yml"), encoding="utf-8") as fh:
        options = yaml.safe_load(fh)["argument_specs"]["main"]["options"]
    assert set(options) - {"vllm_upgrade_version"} == set(defaults)
    assert all(options[k].get("default") == v for k, v in defaults.items())

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""roles/nccl_change against the flow it drives (nccl/change.py NCCL): every action the flow can answer has its task
file ending in the report of the event the flow expects, the tasks hold no decisions of their own, the step passes every
setting the flow reads, the restarts go through the collection's restart_units.yml (inside the window), the rollback
puts the recorded bytes back with their mode and owner, and the nccl_env role refuses to write under an open change."""

from __future__ import annotations

import os

import yaml

from ansible_collections.gpufleet.inference.plugins.module_utils.nccl.change import NCCL
from ansible_collections.gpufleet.inference.plugins.modules.nccl_change_step import ARGUMENT_SPEC
from tests.helpers import REPO

ROLE = os.path.join(REPO, "roles", "nccl_change")
TASKS = os.path.join(ROLE, "tasks")


def load(name: str, tasks: str = TASKS):
    with open(os.path.join(tasks, name), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def test_every_action_of_the_flow_has_its_task_file_and_reports_its_event():
    files = {n[len("action_"):-len(".yml")] for n in os.listdir(TASKS) if n.startswith("action_")}
    assert files == {a["name"] for a in NCCL.actions}
    for action in NCCL.actions:
        tasks = load(f"action_{action['name']}.yml")
        reports = [t for t in tasks if (t.get("ansible.builtin.include_tasks") or {}).get("file") == "step.yml"]
        assert len(reports) == 1 and tasks[-1] is reports[0], f"action_{action['name']}.yml must end with one report"
        assert reports[0]["vars"]["__nccl_change_event"] == action["reports"]


def test_the_role_keeps_no_decisions_of_its_own():
    for name in os.listdir(TASKS):
        with open(os.path.join(TASKS, name), encoding="utf-8") as fh:
            text = fh.read()
        assert "throughput_gate" not in text and "judged_verdict" not in text, name
        for task in load(name) or []:
            facts = task.get("ansible.builtin.set_fact") or {}
            assert not {"decision", "stage", "verdict"} & {k.rsplit("_", 1)[-1] for k in facts}, (name, facts)


def test_the_step_passes_every_setting_the_flow_reads():
    step = load("step.yml")[0]["gpufleet.inference.nccl_change_step"]
    assert step["target"] == "{{ __nccl_change.id }}" and step["settings"] == "{{ __nccl_change.settings }}"
    assert {"target", "settings", "allow_unknown", "allow_findings", "unit", "conf_path", "env_file", "event", "data", "run_id",
            "restart_ok", "verify_pcie", "outputs", "stability", "findings", "lease_run_id", "lease_ttl",
            "gate"} <= set(step) <= set(ARGUMENT_SPEC)
    data = load("action_benchmark.yml")[-1]["vars"]["__nccl_change_data"]
    assert NCCL.side_key in data and "latency_samples" in data["latency"]


def test_restarts_go_through_restart_units_inside_the_window_and_nothing_reboots():
    for name in os.listdir(TASKS):
        with open(os.path.join(TASKS, name), encoding="utf-8") as fh:
            text = fh.read()
        assert "ansible.builtin.reboot" not in text and "systemd_service" not in text, name
    block = load("restart.yml")[0]["block"][0]
    assert block["ansible.builtin.include_tasks"]["file"].endswith("/../../playbooks/tasks/restart_units.yml")
    assert block["vars"]["__gpufleet_restart_due"] is True
    for action in ("activate", "rollback"):
        includes = [t["ansible.builtin.include_tasks"]["file"] for t in load(f"action_{action}.yml")
                    if "ansible.builtin.include_tasks" in t]
        assert includes[:2] == ["restart.yml", "ready.yml"], action


def test_the_install_writes_through_nccl_env_files_and_the_rollback_puts_the_recorded_bytes_back():
    install = load("action_install.yml")
    write = next(t for t in install if "gpufleet.inference.nccl_env_files" in t)["gpufleet.inference.nccl_env_files"]
    assert write["conf_content"] == "{{ __nccl_change.nccl_conf }}" and write["env_content"] == "{{ __nccl_change.env_file }}"
    rollback = load("action_rollback.yml")
    copy = rollback[0]["ansible.builtin.copy"]
    assert {copy[k] for k in ("content", "mode", "owner", "group")} == {
        "{{ __nccl_change_file.content }}", "{{ __nccl_change_file.mode }}", "{{ __nccl_change_file.uid }}",
        "{{ __nccl_change_file.gid }}"}
    assert rollback[1]["ansible.builtin.file"]["state"] == "absent"


def test_the_defaults_match_the_specs():
    with open(os.path.join(ROLE, "defaults", "main.yml"), encoding="utf-8") as fh:
        defaults = yaml.safe_load(fh)
    with open(os.path.join(ROLE, "meta", "argument_specs.yml"), encoding="utf-8") as fh:
        options = yaml.safe_load(fh)["argument_specs"]["main"]["options"]
    assert set(options) == set(defaults)
    assert all(options[k].get("default") == v for k, v in defaults.items())


def test_the_nccl_env_role_refuses_to_rewrite_the_files_under_an_open_change():
    tasks = load("main.yml", os.path.join(REPO, "roles", "nccl_env", "tasks"))
    names = [t.get("name") for t in tasks]
    refuse = names.index("Refuse to write the NCCL files under an open NCCL settings change")
    write = names.index("Write the NCCL settings, read them back and look for a per-user override")
    assert refuse < write
    assert tasks[refuse - 2]["ansible.builtin.stat"]["path"] == "/var/lib/gpufleet/nccl_change/journal.json"
    assert tasks[refuse - 1]["check_mode"] is True

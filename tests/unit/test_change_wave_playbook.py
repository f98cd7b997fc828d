# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet skeleton every change kind shares (playbooks/tasks/change_wave.yml, change_step.yml, change_record.yml)
run for real by ansible-playbook on this machine, on a fake root (module_defaults give host_lease its root), with a
kind whose role is a test role: it answers as a step module would (a verdict with its parts) and keeps its record
through change_record.yml. The run id is named once, the role gets its run, lease run id, report directory and history
by the kind's names, it runs while the run holds the host's lease, the lease is released after, the record lands on
the host and the controller, the fleet report (fleet.json, fleet.md) names the kind's rollout and the verdict is in the
history under the kind's source; a failing host still gets its record and releases its lease."""

from __future__ import annotations

import json
import os
import sqlite3
import sys

import pytest
import yaml

from tests.helpers import REPO, run

TASKS = os.path.join(REPO, "playbooks", "tasks")
VERDICT = {"verdict": "pass", "keep": True, "reason": "pass: 1.00x", "stage": "driver_upgrade 1.0 -> 1.1",
           "decided_at": "2026-12-04T20:00:00Z",
           "parts": {"throughput": {"says": "pass", "why": "1.00x"}, "outputs": {"says": "same", "why": "top-1 1.0"}}}

ROLE = [
    {"name": "The lease is this run's while the role runs", "ansible.builtin.slurp": {"src": "{{ lease_root }}/var/lib/gpufleet/lease.json"},
     "register": "__lease_now"},
    {"name": "The role was given its run and where its records go", "ansible.builtin.assert": {"that": [
        "(__lease_now.content | b64decode | from_json).run_id == driver_upgrade_run_id",
        "driver_upgrade_lease_run_id == driver_upgrade_run_id",
        "driver_upgrade_run_id == hostvars['localhost']['driver_upgrade_run_id']",
        "driver_upgrade_report_dir == report_dir",
        "driver_upgrade_history_db == history_db"]}},
    {"name": "Answer as the step module does", "ansible.builtin.set_fact": {
        "__fake_started": "{{ now(utc=true).isoformat() }}", "__fake_t0": "{{ now().timestamp() }}",
        "__fake_step": {"running": "1.1", "record": {"stage": "committed", "old": "1.0", "verdict": {"decision": "pass"},
                                                     "serving_verdict": VERDICT},
                        "next_action": {"name": "finish", "decision": "{{ decision }}", "ok": "{{ decision == 'pass' }}",
                                        "reason": "the serving verdict says {{ decision }}"}}}},
    {"name": "Keep the record", "ansible.builtin.include_tasks": {"file": os.path.join(TASKS, "change_record.yml")},
     "vars": {"__gpufleet_change": "driver_upgrade", "__gpufleet_change_answer": "{{ __fake_step }}",
              "__gpufleet_change_target": "1.1", "__gpufleet_change_old": "1.0",
              "__gpufleet_change_started": "{{ __fake_started }}", "__gpufleet_change_t0": "{{ __fake_t0 }}",
              "__gpufleet_change_failure": "",
              "__gpufleet_change_record_extra": {"format": "gpufleet.driver_upgrade/1", "kind": "driver"},
              "__gpufleet_change_results_dir": "{{ results_dir }}", "__gpufleet_change_record_name": "1.1-x",
              "__gpufleet_change_report_dir": "{{ driver_upgrade_report_dir }}",
              "__gpufleet_change_run_id": "{{ driver_upgrade_run_id }}",
              "__gpufleet_change_history_db": "{{ driver_upgrade_history_db }}",
              "__gpufleet_change_history_password": ""}},
    {"name": "Fail the host when it did not pass", "ansible.builtin.fail": {"msg": "not passed"},
     "when": "not driver_upgrade_record.ok | bool"},
]


def run_wave(tmp_path, decision: str, role: list, extra: dict | None = None):
    """The skeleton's wave of the fake driver kind on localhost, the play's vars with ``extra``; the finished process."""
    root, reports = tmp_path / "root", tmp_path / "reports"
    (tmp_path / "roles" / "fake_driver" / "tasks").mkdir(parents=True)
    (tmp_path / "roles" / "fake_driver" / "tasks" / "main.yml").write_text(yaml.safe_dump(role))
    (tmp_path / "bench").mkdir()
    history = tmp_path / "history.sqlite"
    play = [{
        "name": "A driver wave on the skeleton", "hosts": "localhost", "gather_facts": False,
        "vars_files": [os.path.join(REPO, "playbooks", "vars", "reports.yml")],
        "module_defaults": {"gpufleet.inference.host_lease": {"root": str(root)}},
        "vars": {"lease_root": str(root), "report_dir": str(reports / "driver_upgrade"), "history_db": str(history),
                 "results_dir": str(tmp_path / "records"), "decision": decision, "gpufleet_history_db": str(history),
                 "inference_benchmark_results_dir": str(tmp_path / "bench"), "gpufleet_server_url": "http://127.0.0.1:9",
                 **(extra or {})},
        "tasks": [{"name": "Run this wave", "ansible.builtin.include_tasks": {"file": os.path.join(TASKS, "change_wave.yml")},
                   "vars": {"__gpufleet_change": "driver_upgrade", "__gpufleet_change_role": "fake_driver",
                            "__gpufleet_change_step": "driver upgrade"}}],
    }]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    env = {"ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, ".collections"), "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(tmp_path / "roles"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default", "PWD": str(tmp_path)}
    return run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory),
                str(tmp_path / "play.yml")], env=env, timeout=300, cwd=str(tmp_path))


@pytest.mark.parametrize("decision", ["pass", "regression"])
def test_a_wave_takes_the_lease_runs_the_kind_and_keeps_record_report_and_verdict(tmp_path, decision):
    root, reports, history = tmp_path / "root", tmp_path / "reports", tmp_path / "history.sqlite"
    proc = run_wave(tmp_path, decision, ROLE)
    out = proc.stdout
    assert proc.returncode == (0 if decision == "pass" else 2), out
    assert "fake_driver : The role was given its run" in out and "All assertions passed" in out, out
    assert ("failed=0" if decision == "pass" else "failed=1") in out, out
    assert "TASK [Take the host's lease" in out and not (root / "var/lib/gpufleet/lease.json").exists(), out  # released
    record = json.loads((tmp_path / "records" / "1.1-x.json").read_text())
    assert record["decision"] == decision and record["kind"] == "driver" and record["old"] == "1.0"
    assert record["target"] == "1.1" and record["run_id"] and record["serving_verdict"] == VERDICT
    assert json.loads((reports / "driver_upgrade" / "hosts" / "localhost.json").read_text()) == record
    fleet = json.loads((reports / "driver_upgrade" / "fleet.json").read_text())
    assert fleet["run_id"] == record["run_id"] and [h["decision"] for h in fleet["hosts"]] == [decision], fleet
    assert "Driver rollout" in (reports / "driver_upgrade" / "fleet.md").read_text()
    rows = sqlite3.connect(history).execute("SELECT host, source, verdict FROM verdicts").fetchall()
    assert rows == [("localhost", "driver_upgrade", "pass")]


@pytest.mark.parametrize("stored, level, answer", [
    (8, 64, 0.0139),  # the four H200 DeepSeek-V2-Lite starts at c=64: the documented 1.4%
    (4, 64, "measure 1 more start"),  # two starts: a figure, not one to set
    (0, 64, "no stored series of hosts localhost, concurrency 64"),
    (8, 0, "2 series match ("),  # c=16 and c=64 stored, the highest level gated: which one is not the play's to guess
])
def test_a_between_start_sd_of_history_is_the_hosts_own_figure_or_refused_before_the_lease(
        tmp_path, stored, level, answer):
    """driver_upgrade_gate_between_start_sd: history takes the host's figure from the controller's history (the role is
    given the number); where the history gives none, the host is refused before its lease, saying why."""
    from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history as bh  # pylint: disable=import-outside-toplevel
    from tests.unit.plugins.module_utils.test_start_noise_history import dsv2_documents  # pylint: disable=import-outside-toplevel
    db = bh.connect(str(tmp_path / "history.sqlite"))
    for d in dsv2_documents()[:stored]:
        bh.append(db, d, host="localhost")
        if not level:
            d["levels"][0] = dict(d["levels"][0], concurrency=16)
            bh.append(db, d, host="localhost")
    db.close()
    given = {"name": "The role is given the history's figure", "ansible.builtin.assert": {"that": [
        "driver_upgrade_gate_between_start_sd is number", "(driver_upgrade_gate_between_start_sd - 0.0139) | abs < 0.0001"]}}
    proc = run_wave(tmp_path, "pass", [given] + ROLE,
                    {"driver_upgrade_gate_between_start_sd": "history", "driver_upgrade_gate_concurrency": level})
    out = proc.stdout
    if isinstance(answer, float):
        assert proc.returncode == 0 and "fake_driver : The role is given the history's figure" in out, out
        return
    assert proc.returncode == 2 and "driver_upgrade_gate_between_start_sd is \"history\", but" in out, out
    assert answer in out and "TASK [Take the host's lease" not in out, out
    if not level:
        assert " c=16, " in out and " c=64)" in out and "the one of driver_upgrade_gate_concurrency and" in out, out

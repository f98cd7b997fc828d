# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every restart, reboot and benchmark that a playbook of this collection reaches runs as the step of
playbooks/tasks/disruptive.yml: inside the maintenance window and between the drain and undrain hooks
(tests/unit/disruptive_coverage.py walks the playbooks, roles and task files; a new playbook is walked as it lands).
The walker itself is tried on small trees with one gap each, so that it cannot pass by finding nothing."""

from __future__ import annotations

import os

import pytest
import yaml

from tests.helpers import REPO
from tests.unit.disruptive_coverage import NOT_DISRUPTIVE, uncovered

SHARED = os.path.join(REPO, "playbooks", "tasks")


def test_every_restart_reboot_and_benchmark_of_the_playbooks_runs_between_the_drain_hooks():
    found = uncovered(REPO)
    assert found == [], ("outside the drain hooks and the maintenance window (run it as the step of "
                         "playbooks/tasks/disruptive.yml; docs/drain_and_windows.md):\n" + "\n".join(found))


def test_the_exempt_restarts_are_still_there():
    """An exemption names a task that exists: a renamed one would otherwise be exempt no more, silently."""
    for key in NOT_DISRUPTIVE:
        path, name = key.split(": ", 1)
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            assert f"name: {name}" in f.read(), key


def _tree(tmp_path, playbook: list, tasks: dict | None = None, roles: dict | None = None) -> str:
    """A collection's shape: playbooks/x.yml, playbooks/tasks/ (the real disruptive.yml and its files, plus `tasks`),
    roles/NAME/{tasks,handlers}/FILE.yml."""
    root = tmp_path / "collection"
    (root / "playbooks" / "tasks").mkdir(parents=True)
    for name in ("disruptive.yml", "disruptive_gated.yml", "hook.yml", "restart_units.yml", "restart_units_step.yml"):
        (root / "playbooks" / "tasks" / name).write_text(open(os.path.join(SHARED, name), encoding="utf-8").read())
    (root / "playbooks" / "x.yml").write_text(yaml.safe_dump([{"hosts": "all", **playbook}]))
    for name, content in (tasks or {}).items():
        (root / "playbooks" / "tasks" / name).write_text(yaml.safe_dump(content))
    for role, files in (roles or {}).items():
        for rel, content in files.items():
            path = root / "roles" / role / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(content))
    return str(root)


RESTART = {"name": "Restart vLLM", "ansible.builtin.systemd_service": {"name": "vllm.service", "state": "restarted"}}
REBOOT = {"name": "Reboot", "ansible.builtin.reboot": {}}
BENCH = {"name": "Benchmark", "ansible.builtin.include_role": {"name": "gpufleet.inference.inference_benchmark"}}


def _step(tasks_file: str) -> dict:
    return {"name": "The step", "ansible.builtin.include_tasks": {"file": "tasks/disruptive.yml"},
            "vars": {"__gpufleet_step": "x", "__gpufleet_step_tasks": tasks_file}}


@pytest.mark.parametrize("case, playbook, tasks, roles, expect", [
    ("a restart in a play", {"tasks": [RESTART]}, None, None, ["playbooks/x.yml: Restart vLLM: restart"]),
    ("a reboot in a block", {"tasks": [{"name": "b", "block": [REBOOT]}]}, None, None, ["playbooks/x.yml: Reboot: reboot"]),
    ("the benchmark role", {"tasks": [BENCH]}, None, None, ["playbooks/x.yml: Benchmark: benchmark"]),
    ("a reboot command", {"tasks": [{"name": "Boot", "ansible.builtin.command": {"argv": ["systemctl", "reboot"]}}]},
     None, None, ["playbooks/x.yml: Boot: command"]),
    ("a restart in a role's task file",
     {"roles": ["gpufleet.inference.svc"]}, None,
     {"svc": {"tasks/main.yml": [{"name": "i", "ansible.builtin.include_tasks": "more.yml"}], "tasks/more.yml": [RESTART]}},
     ["roles/svc/tasks/more.yml: Restart vLLM: restart"]),
    ("a handler, even of a role run as a step",
     {"tasks": [_step("s.yml")]}, {"s.yml": [{"name": "r", "ansible.builtin.include_role": {"name": "svc"}}]},
     {"svc": {"tasks/main.yml": [{"name": "n", "ansible.builtin.debug": {}}], "handlers/main.yml": [RESTART]}},
     ["roles/svc/handlers/main.yml: Restart vLLM: restart"]),
    ("a role that cannot be told", {"tasks": [{"name": "Dyn", "ansible.builtin.include_role": {"name": "{{ r }}"}}]},
     None, None, ["playbooks/x.yml: Dyn: includes the role {{ r }}, which cannot be told"]),
    ("another collection's role", {"tasks": [{"name": "Ext", "ansible.builtin.include_role": {"name": "ns.col.r"}}]},
     None, None, ["playbooks/x.yml: Ext: includes the role ns.col.r, which cannot be told"]),
    ("the gate's file directly", {"tasks": [{"name": "G", "ansible.builtin.include_tasks": "tasks/disruptive_gated.yml"}]},
     None, None, ["playbooks/x.yml: G: includes playbooks/tasks/disruptive_gated.yml directly"]),
    ("covered: a step file", {"tasks": [_step("s.yml")]}, {"s.yml": [REBOOT, RESTART, BENCH]}, None, []),
    ("covered: a role's own step, through role_path",
     {"roles": ["svc"]}, None,
     {"svc": {"tasks/main.yml": [{"name": "Through", "ansible.builtin.include_tasks": {
         "file": "{{ role_path }}/../../playbooks/tasks/disruptive.yml"},
         "vars": {"__gpufleet_step": "x", "__gpufleet_step_tasks": "{{ role_path }}/tasks/r.yml"}}],
         "tasks/r.yml": [RESTART]}}, []),
    ("covered: restart_units.yml", {"tasks": [{"name": "U", "ansible.builtin.include_tasks": "tasks/restart_units.yml"}]},
     None, None, []),
    ("covered: a dynamic role inside a step", {"tasks": [_step("s.yml")]},
     {"s.yml": [{"name": "Dyn", "ansible.builtin.include_role": {"name": "{{ r }}"}}]}, None, []),
    ("a role named by a variable an include binds, outside a step",
     {"tasks": [{"name": "W", "ansible.builtin.include_tasks": {"file": "tasks/s.yml"}, "vars": {"r": "svc"}}]},
     {"s.yml": [{"name": "Dyn", "ansible.builtin.include_role": {"name": "{{ r }}"}}]},
     {"svc": {"tasks/main.yml": [RESTART]}}, ["roles/svc/tasks/main.yml: Restart vLLM: restart"]),
    ("a role named by a variable an include binds, inside a step: walked (its handler is found)",
     {"tasks": [{"name": "W", "ansible.builtin.include_tasks": {"file": "tasks/w.yml"}, "vars": {"r": "svc"}}]},
     {"w.yml": [_step("s.yml")], "s.yml": [{"name": "Dyn", "ansible.builtin.include_role": {"name": "{{ r }}"}}]},
     {"svc": {"tasks/main.yml": [RESTART], "handlers/main.yml": [RESTART]}},
     ["roles/svc/handlers/main.yml: Restart vLLM: restart"]),
])
def test_the_walker_finds_each_gap(tmp_path, case, playbook, tasks, roles, expect):
    found = uncovered(_tree(tmp_path, playbook, tasks, roles))
    assert [f.split(" (via ")[0][:len(e)] for f, e in zip(found, expect)] == expect and len(found) == len(expect), \
        (case, found)

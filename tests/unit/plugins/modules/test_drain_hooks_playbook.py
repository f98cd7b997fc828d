# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/tasks/disruptive.yml and hook.yml run for real by ansible-playbook on this machine, one run, five local
hosts, each a scenario: the hooks write to their own log files and the step to its own, so the order is read from what
the hooks themselves wrote.

- ``ok``: drain (a command), drain (an HTTP call to a server here), step, undrain: in that order;
- ``stepfails``: the step fails: the undrain hook still runs after it, and the host is failed;
- ``keepdrained``: the same with gpufleet_undrain_on_failure false: no undrain;
- ``outside``: outside its maintenance window: refused by the gate, no hook and no step ran;
- ``drainfails``: the drain hook fails: the step does not run, the undrain hook does (it puts back what was taken out).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

from tests.helpers import REPO, run

TASKS = os.path.join(REPO, "playbooks", "tasks")


class _Balancer(BaseHTTPRequestHandler):
    """An HTTP load balancer's admin API stand-in: records each call, in the order it came, in a file."""

    log = ""

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        with open(self.log, "a", encoding="utf-8") as f:
            f.write(f"{self.path} {json.loads(body)['state']}\n")
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_step_runs_between_drain_and_undrain_inside_the_window_only(tmp_path):
    _Balancer.log = str(tmp_path / "balancer.log")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Balancer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    step = tmp_path / "step.yml"
    step.write_text(yaml.safe_dump([
        {"name": "The step", "ansible.builtin.shell": "echo step >> {{ __log }}", "changed_when": True},
        {"name": "The step fails where asked", "ansible.builtin.fail": {"msg": "STEP FAILED"}, "when": "__fail | default(false)"},
    ]))

    def hooks(name):
        log = str(tmp_path / f"{name}.log")
        return {"__log": log,
                "gpufleet_drain": [{"name": "mark drain", "command": ["sh", "-c", f'echo "drain $GPUFLEET_HOOK_STEP" >> {log}']},
                                   {"url": f"{url}/servers/{name}", "body": {"state": "drain"}}],
                "gpufleet_undrain": [{"command": ["sh", "-c", f"echo undrain >> {log}"]}]}
    base = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    # a one-minute window three days from today (UTC) is closed now, whatever the time of day
    closed = [{"days": [("mon", "tue", "wed", "thu", "fri", "sat", "sun")[(datetime.now(timezone.utc).weekday() + 3) % 7]],
               "start": "00:00", "end": "00:01"}]
    hosts = {"ok": dict(base, **hooks("ok")),
             "stepfails": dict(base, __fail=True, **hooks("stepfails")),
             "keepdrained": dict(base, __fail=True, gpufleet_undrain_on_failure=False, **hooks("keepdrained")),
             "outside": dict(base, gpufleet_maintenance_windows=closed, gpufleet_maintenance_timezone="UTC",
                             **hooks("outside")),
             "drainfails": dict(base, **dict(hooks("drainfails"), gpufleet_drain=[{"command": ["false"]}]))}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    play = [{"name": "A disruptive step", "hosts": "all", "gather_facts": False, "tasks": [
        {"name": "Restart the service", "ansible.builtin.include_tasks": os.path.join(TASKS, "disruptive.yml"),
         "vars": {"__gpufleet_step": "service restart", "__gpufleet_step_tasks": str(step)}},
        {"name": "After the step", "ansible.builtin.shell": "echo after >> {{ __log }}", "changed_when": True}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = {"ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, ".collections"), "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default",
           "ANSIBLE_FORKS": "5"}
    try:
        proc = run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory),
                    str(tmp_path / "play.yml")], env=env, timeout=300)
    finally:
        server.shutdown()
    out = proc.stdout

    def log(name):
        path = tmp_path / f"{name}.log"
        return path.read_text().split("\n")[:-1] if path.exists() else []
    assert proc.returncode == 2, out
    assert log("ok") == ["drain service restart", "step", "undrain", "after"], out
    assert log("stepfails") == ["drain service restart", "step", "undrain"], out
    assert log("keepdrained") == ["drain service restart", "step"], out
    assert log("outside") == [], out
    assert log("drainfails") == ["undrain"], out
    calls = (tmp_path / "balancer.log").read_text().split("\n")[:-1]
    assert sorted(calls) == sorted(f"/servers/{h} drain" for h in ("ok", "stepfails", "keepdrained")), calls
    assert f"service restart refused: outside the maintenance windows ({closed[0]['days'][0]} 00:00-00:01, time zone UTC)" in out, out
    assert "STEP FAILED" in out and "ok=" in out
    for host, failed in (("ok", 0), ("stepfails", 1), ("keepdrained", 1), ("outside", 1), ("drainfails", 1)):
        line = next(line for line in out.splitlines() if line.startswith(host + " ") and "ok=" in line)
        assert f"failed={failed} " in line, line


def test_a_role_restarts_through_the_shared_file_and_a_step_inside_a_step_drains_once(tmp_path):
    """A role reaches the shared file by its place in the collection (``{{ role_path }}/../../playbooks/tasks/
    disruptive.yml``, as vllm_service does), and its hook.yml resolves from there; included again inside a step that
    holds the drain (tune_measured.yml's loop running vllm_service), it runs its step at once: one drain, one undrain.

    - ``role``: drain, the role's restart, undrain;
    - ``nested``: drain (the outer step), the role's restart, undrain: no second drain;
    - ``outside``: the role's restart outside the window: refused, no hook, no restart."""
    collection = tmp_path / "collection"
    (collection / "playbooks").mkdir(parents=True)
    os.symlink(TASKS, collection / "playbooks" / "tasks")
    role = collection / "roles" / "svc" / "tasks"
    role.mkdir(parents=True)
    (role / "main.yml").write_text(yaml.safe_dump([
        {"name": "Restart through the shared file", "ansible.builtin.include_tasks": {
            "file": "{{ role_path }}/../../playbooks/tasks/disruptive.yml"},
         "vars": {"__gpufleet_step": "svc restart", "__gpufleet_step_tasks": "{{ role_path }}/tasks/restart.yml"}}]))
    # the step runs a script of the role's own files/ (as nccl_env's A/B does): found from the role through the shared file
    (role / "restart.yml").write_text(yaml.safe_dump([
        {"name": "The restart", "ansible.builtin.script": {"cmd": "restart.sh {{ __log }}"}, "changed_when": True}]))
    (collection / "roles" / "svc" / "files").mkdir()
    (collection / "roles" / "svc" / "files" / "restart.sh").write_text('#!/bin/sh\necho restart >> "$1"\n')
    outer = tmp_path / "outer.yml"
    outer.write_text(yaml.safe_dump([{"name": "The role inside the step", "ansible.builtin.include_role": {"name": "svc"}}]))

    def hooks(name):
        log = str(tmp_path / f"{name}.log")
        return {"__log": log, "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                "gpufleet_drain": [{"command": ["sh", "-c", f'echo "drain $GPUFLEET_HOOK_STEP" >> {log}']}],
                "gpufleet_undrain": [{"command": ["sh", "-c", f'echo "undrain $GPUFLEET_HOOK_STEP" >> {log}']}]}
    closed = [{"days": [("mon", "tue", "wed", "thu", "fri", "sat", "sun")[(datetime.now(timezone.utc).weekday() + 3) % 7]],
               "start": "00:00", "end": "00:01"}]
    hosts = {"role": dict(hooks("role"), __nested=False), "nested": dict(hooks("nested"), __nested=True),
             "outside": dict(hooks("outside"), __nested=False, gpufleet_maintenance_windows=closed,
                             gpufleet_maintenance_timezone="UTC")}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    play = [{"name": "Restarts", "hosts": "all", "gather_facts": False, "tasks": [
        {"name": "The role alone", "ansible.builtin.include_role": {"name": "svc"}, "when": "not __nested"},
        {"name": "The role inside a step", "ansible.builtin.include_tasks": os.path.join(TASKS, "disruptive.yml"),
         "vars": {"__gpufleet_step": "outer", "__gpufleet_step_tasks": str(outer)}, "when": "__nested"}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = {"ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, ".collections"), "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(collection / "roles"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default", "ANSIBLE_FORKS": "3"}
    proc = run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory),
                str(tmp_path / "play.yml")], env=env, timeout=300)
    out = proc.stdout

    def log(name):
        path = tmp_path / f"{name}.log"
        return path.read_text().split("\n")[:-1] if path.exists() else []
    assert log("role") == ["drain svc restart", "restart", "undrain svc restart"], out
    assert log("nested") == ["drain outer", "restart", "undrain outer"], out
    assert log("outside") == [], out
    assert "svc restart refused: outside the maintenance windows" in out, out
    assert proc.returncode == 2, out

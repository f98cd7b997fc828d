# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The playbooks' lease tasks run for real by ansible-playbook on this machine, on a fake root
(module_defaults give host_lease its root): a run takes the lease (playbooks/tasks/host_lease.yml), renews
it (playbooks/tasks/host_lease_renew.yml), then another run breaks it; the next renewal fails naming that
run, and the task after it (a device write in tune.yml) never runs."""

from __future__ import annotations

import json
import os
import sys
import time

import yaml

from tests.helpers import REPO, run

LEASE = "var/lib/gpufleet/lease.json"


def test_a_run_that_lost_its_lease_stops_at_the_next_renewal(tmp_path):
    root = tmp_path / "root"
    tasks = os.path.join(REPO, "playbooks", "tasks")
    foreign = {"run_id": "run-2", "operator": "bob", "play": "tune", "taken_at": time.time(), "expires_at": time.time() + 3600}
    play = [{
        "name": "A tune run that loses its lease", "hosts": "localhost", "gather_facts": False,
        "module_defaults": {"gpufleet.inference.host_lease": {"root": str(root)}},
        "vars": {"__gpufleet_lease_run_id": "run-1"},
        "tasks": [
            {"name": "Take", "ansible.builtin.include_tasks": os.path.join(tasks, "host_lease.yml"),
             "vars": {"__gpufleet_lease_action": "take", "__gpufleet_lease_play": "tune"}},
            {"name": "Renew while held", "ansible.builtin.import_tasks": os.path.join(tasks, "host_lease_renew.yml")},
            {"name": "Another run breaks the lease", "ansible.builtin.copy": {"dest": str(root / LEASE), "content": json.dumps(foreign)}},
            {"name": "Renew after the break", "ansible.builtin.import_tasks": os.path.join(tasks, "host_lease_renew.yml")},
            {"name": "Write the devices", "ansible.builtin.debug": {"msg": "DEVICE WRITE"}},
        ]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    env = {"ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, ".collections"), "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default"}
    proc = run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory), str(tmp_path / "play.yml")],
               env=env, timeout=300)
    out = proc.stdout
    assert proc.returncode == 2, out
    assert out.count("TASK [Renew the host's lease") == 2 and "ok=5 " in out and "failed=1 " in out, out
    assert "run run-1 holds no lease on this host any more: it is held by run run-2 of bob (play tune" in out, out
    assert "DEVICE WRITE" not in out, out
    assert json.loads((root / LEASE).read_text())["run_id"] == "run-2"

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/audit.yml run for real by ansible-playbook on this machine under `--limit`: the fleet report is
written although localhost is not in the limit, and the hosts the run left out are shown with the audit the
audit role stored on the controller, marked as stored, instead of being dropped from the report."""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml

from tests.helpers import REPO, assert_ok, first_pci_function, run


@pytest.mark.skipif(first_pci_function() is None, reason="this machine has no PCI bus to audit")
def test_audit_under_limit_writes_the_fleet_report_with_the_stored_audits_of_the_others(tmp_path):
    reports = tmp_path / "reports"
    common = {"ansible_connection": "local", "ansible_become": False, "ansible_python_interpreter": sys.executable,
              "audit_devices": [first_pci_function()], "gpufleet_report_dir": str(reports / "audit")}
    hosts = {name: {**common, "audit_host_dir": str(tmp_path / name)} for name in ("gpu-a", "gpu-b")}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    env = {"ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, ".collections"), "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default"}
    play = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory),
            os.path.join(REPO, "playbooks", "audit.yml")]
    fleet_md = reports / "audit" / "fleet.md"

    assert_ok(run(play + ["--limit", "gpu-a"], env=env, timeout=600), "audit.yml --limit gpu-a")
    first = fleet_md.read_text()
    assert "1 host(s); 1 device(s) audited" in first and "\n## gpu-a\n" in first and "gpu-b" not in first
    assert json.loads((reports / "audit" / "gpu-a.json").read_text())["host"] == "gpu-a"

    proc = run(play + ["--limit", "gpu-b"], env=env, timeout=600)
    assert_ok(proc, "audit.yml --limit gpu-b")
    second = fleet_md.read_text()
    assert "2 host(s); 2 device(s) audited" in second
    assert "| gpu-a (stored) |" in second and "| gpu-b |" in second
    assert "Not audited in this run: the audit last stored on the controller (gpu-a.json)." in second
    html = (reports / "audit" / "fleet.html").read_text()
    assert "Not audited in this run" in html and 'id="gpu-b"' in html

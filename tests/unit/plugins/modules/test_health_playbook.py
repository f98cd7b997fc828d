# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/health.yml run for real by ansible-playbook on this machine (its first PCI function as the
audited device, the lab stand-in on 127.0.0.1 as the server), twice: the second run's previous record is
edited to list a GPU that is not there and another kernel command line, which it must report, with fixes,
in the fleet report; both short benchmarks land in the throughput history. Drain hooks (a command each, writing
to a log) run around each benchmark, and health_drain drains the host on the second run for its missing GPU."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import sys

import pytest
import yaml

from tests.helpers import REPO, assert_ok, first_pci_function, run

CTL = os.path.join(REPO, "tests", "unit", "roles", "standin_vllm", "files", "standin_ctl.py")
SERVER = os.path.join(REPO, "extras", "lab_inference_server.py")


@pytest.mark.skipif(first_pci_function() is None, reason="this machine has no PCI bus to audit")
def test_health_playbook_reports_a_missing_gpu_and_a_changed_cmdline(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    host_dir, reports = tmp_path / "host", tmp_path / "reports"
    host_dir.mkdir()
    hostvars = {"ansible_connection": "local", "ansible_become": False, "ansible_python_interpreter": sys.executable,
                "audit_devices": [first_pci_function()], "health_state_dir": str(host_dir), "health_benchmark": True,
                "health_benchmark_url": f"http://127.0.0.1:{port}", "health_benchmark_prompt_tokens": 16,
                "health_benchmark_output_tokens": 16, "health_benchmark_requests": 16,
                "health_benchmark_concurrency": [4], "gpufleet_report_dir": str(reports),
                "gpufleet_history_dir": str(reports / "history"), "health_drain": True,
                "gpufleet_drain": [{"command": ["sh", "-c", f'echo "drain $GPUFLEET_HOOK_STEP" >> {tmp_path}/hooks.log']}],
                "gpufleet_undrain": [{"command": ["sh", "-c", f'echo "undrain $GPUFLEET_HOOK_STEP" >> {tmp_path}/hooks.log']}]}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": hostvars}}}))
    env = {"ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, ".collections"), "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default"}
    play = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory),
            os.path.join(REPO, "playbooks", "health.yml")]
    assert_ok(run([sys.executable, CTL, "--state", str(model), "--server", SERVER, "--port", str(port),
                   "--work", "16", "--step-work", "256"], timeout=60), "start the stand-in")
    try:
        assert_ok(run(play, env=env, timeout=600), "health.yml, first run")
        first = json.loads((host_dir / "last.json").read_text())
        assert first["findings"] == [] and first["pcie"]["cmdline"]
        first["pcie"]["gpus"].append({"bdf": "0000:7f:00.0", "numa_node": 0, "path": ["0000:7f:00.0"],
                                      "host_bridge": "pci0000:7f", "name": None})
        first["pcie"]["devices"]["0000:7f:00.0"] = {
            "bdf": "0000:7f:00.0", "device_name": "GH100 [H200]", "device_id": "0x2335", "driver": "nvidia"}
        first["pcie"]["cmdline"] += " iommu=pt"
        (host_dir / "last.json").write_text(json.dumps(first))
        proc = run(play, env=env, timeout=600)
        assert_ok(proc, "health.yml, second run")
    finally:
        run([sys.executable, CTL, "--state", str(model), "--server", SERVER, "--port", str(port), "--stop"], timeout=60)
    second = json.loads((host_dir / "last.json").read_text())
    assert {(f["code"], f["severity"]) for f in second["findings"]} == {("gpu_missing", "critical"),
                                                                        ("cmdline_changed", "warning")}
    fleet = (reports / "health" / "fleet.md").read_text()
    assert "GPU 0000:7f:00.0 (GH100 [H200]) was in the previous audit but is not on the PCI bus now" in fleet
    assert "-iommu=pt" in fleet and "reseat the card" in fleet
    assert "<table>" in (reports / "health" / "fleet.html").read_text()
    # the benchmark ran between the hooks both times; the second run drained the host for its missing GPU
    assert (tmp_path / "hooks.log").read_text().splitlines() == [
        "drain health benchmark", "undrain health benchmark", "drain health benchmark", "undrain health benchmark",
        "drain health drain"]
    assert "health.yml drained the host: critical: GPU 0000:7f:00.0 (GH100 [H200]) was in the previous audit" in fleet
    assert "playbooks/undrain.yml --limit localhost" in fleet
    assert second["gpu_health"]["dcgm"]["ran"] in (True, False) and "gpus" in second["gpu_health"]
    rows = sqlite3.connect(str(reports / "history" / "history.sqlite")).execute(
        "SELECT source, profile, vllm_version FROM runs").fetchall()
    assert rows == [("health", "health", "gpufleet-lab-1")] * 2

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cpu_tuning role run by ansible-playbook on the controller against a fake host tree (every module gets ``root``
through module_defaults; the real systemctl enables the boot unit under --root): check mode, converge, idempotence,
verify, a revert of one stage and of all, and the vLLM placement drop-in."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.fakesysfs import FakeHost, cpu_knobs, cpus_online, two_numa_nodes

REPO = Path(__file__).resolve().parents[4]
PLAYBOOK = """\
- name: Tune the CPU side of a fake host
  hosts: localhost
  connection: local
  gather_facts: false
  module_defaults:
    gpufleet.inference.cpu_tuning: {root: "%(root)s"}
    gpufleet.inference.cpu_placement: {root: "%(root)s"}
  roles:
    - role: gpufleet.inference.cpu_tuning
"""
needs_tools = pytest.mark.skipif(not all(shutil.which(t) for t in ("systemctl", "ansible-playbook")),
                                 reason="needs systemctl and ansible-playbook")
KNOBS = ["-e", json.dumps({"cpu_tuning_governor": "performance", "cpu_tuning_cstate_max_latency_us": 99,
                           "cpu_tuning_thp_enabled": "madvise", "cpu_tuning_vllm_placement": "present",
                           "cpu_tuning_vllm_gpus": ["0000:17:00.0"]})]


def play(tmp_path: Path, *extra: str) -> tuple[str, dict]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(REPO / ".collections"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run(["ansible-playbook", "-i", "localhost,", str(tmp_path / "site.yml"), *extra], cwd=str(REPO),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=600, check=False)
    recap = re.search(r"localhost\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout)
    assert recap, proc.stdout[-4000:]
    return proc.stdout, dict(zip(("ok", "changed", "unreachable", "failed"), map(int, recap.groups())))


@needs_tools
def test_role_converges_verifies_is_idempotent_and_reverts(tmp_path):
    root = tmp_path / "host"
    host = two_numa_nodes(root, remote_irqs=False)
    cpus_online(host, "0-15")
    cpu_knobs(FakeHost(root, nodes={0: "0-7", 1: "8-15"}), cpus=16)
    (tmp_path / "site.yml").write_text(PLAYBOOK % {"root": root})
    governor = root / "sys/devices/system/cpu/cpufreq/policy9/scaling_governor"
    dropin = root / "etc/systemd/system/vllm.service.d/50-gpufleet-cpu-placement.conf"

    out, recap = play(tmp_path, "--check", "--diff", *KNOBS)
    assert recap["failed"] == 0 and recap["changed"] == 2, out[-4000:]
    assert governor.read_text().strip() == "powersave" and not dropin.exists()

    out, recap = play(tmp_path, *KNOBS)
    assert recap["failed"] == 0 and recap["changed"] == 2, out[-4000:]
    assert governor.read_text() == "performance" and "CPUAffinity=0-7\n" in dropin.read_text()
    assert (root / "etc/systemd/system/multi-user.target.wants/gpufleet-cpu-tuning.service").is_symlink()
    out, recap = play(tmp_path, *KNOBS)
    assert (recap["failed"], recap["changed"]) == (0, 0), out[-4000:]

    out, recap = play(tmp_path, "-e", '{"cpu_tuning_state": "absent", "cpu_tuning_restore": ["governor"]}')
    assert (recap["failed"], recap["changed"]) == (0, 1), out[-4000:]
    assert governor.read_text() == "powersave" and (root / "sys/kernel/mm/transparent_hugepage/enabled").read_text() == "madvise"
    out, recap = play(tmp_path, "-e", '{"cpu_tuning_state": "absent", "cpu_tuning_vllm_placement": "absent"}')
    assert (recap["failed"], recap["changed"]) == (0, 2), out[-4000:]
    assert not dropin.exists() and not (root / "etc/gpufleet/cpu_tuning.json").exists()
    assert (root / "sys/devices/system/cpu/cpu3/cpuidle/state3/disable").read_text() == "0"


@needs_tools
def test_role_on_a_vm_without_cpufreq_and_cpuidle_sets_thp_and_warns(tmp_path):
    """The knobs' task must not read as skipped in Ansible: a module result with a true ``skipped`` key does (the VM
    lab found it), so the module returns the knobs the host lacks as ``unavailable``."""
    root = tmp_path / "vm"
    cpu_knobs(FakeHost(root), cpus=2, driver=None, idle_driver=None)
    (tmp_path / "site.yml").write_text(PLAYBOOK % {"root": root})
    extra = ["-e", json.dumps({"cpu_tuning_governor": "performance", "cpu_tuning_cstate_max_latency_us": 0,
                               "cpu_tuning_thp_enabled": "never"})]
    out, recap = play(tmp_path, *extra)
    assert (recap["failed"], recap["changed"]) == (0, 1), out[-4000:]
    assert "governor skipped: no cpufreq policy" in out and "cstate skipped: no cpuidle states" in out
    assert (root / "sys/kernel/mm/transparent_hugepage/enabled").read_text() == "never"
    assert json.loads((root / "etc/gpufleet/cpu_tuning.json").read_text())["settings"] == {"thp_enabled": "never"}

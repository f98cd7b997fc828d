# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The change report filters under their names and under the kernel kind's deprecated ones, run by Ansible itself
(meta/runtime.yml's plugin_routing redirects the old names, with a deprecation warning)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

RECORD = {"format": "gpufleet.kernel_upgrade/1", "kind": "driver", "host": "gpu-01", "run_id": "r1", "decision": "pass",
          "old": "1.0", "target": "1.1"}


def _debug(tmp_path, expr: str) -> subprocess.CompletedProcess:
    env = {"ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, ".collections"), "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default",
           "ANSIBLE_DEPRECATION_WARNINGS": "1", "PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible"), "localhost", "-c", "local", "-i", "localhost,",
            "-e", "ansible_python_interpreter=" + sys.executable, "-e", json.dumps({"records": [RECORD]}),
            "-m", "ansible.builtin.debug", "-a", "msg={{ " + expr + " }}"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=str(tmp_path), check=False)


@pytest.mark.parametrize("new,old", [
    ("records | gpufleet.inference.change_report(['gpu-01', 'gpu-02'], 'r1') | to_json",
     "records | gpufleet.inference.kernel_upgrade_report(['gpu-01', 'gpu-02'], 'r1') | to_json"),
])
def test_report_filter_and_its_deprecated_name_give_the_same_report(tmp_path, new, old):
    got_new, got_old = _debug(tmp_path, new), _debug(tmp_path, old)
    assert got_new.returncode == 0 and got_old.returncode == 0, got_new.stdout + got_new.stderr + got_old.stderr
    assert "Driver rollout" not in got_new.stdout  # the report, not its Markdown
    report = json.loads(json.loads(got_new.stdout.split("=>", 1)[1])["msg"])
    assert [(h["host"], h["decision"], h.get("kind")) for h in report["hosts"]] == [
        ("gpu-01", "pass", "driver"), ("gpu-02", "not reached", None)]
    assert got_new.stdout == got_old.stdout
    both = got_old.stdout + got_old.stderr
    assert "kernel_upgrade_report" in both and "deprecated" in both.lower() and "change_report" in both
    assert "deprecated" not in (got_new.stdout + got_new.stderr).lower()


def test_markdown_filter_names_the_kind(tmp_path):
    got = _debug(tmp_path, "records | gpufleet.inference.change_report(['gpu-01']) | gpufleet.inference.change_report_markdown")
    assert got.returncode == 0 and "Driver rollout" in got.stdout, got.stdout + got.stderr

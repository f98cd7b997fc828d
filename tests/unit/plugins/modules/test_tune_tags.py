# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tags site.yml and tune.yml document run what their always-tagged tasks need.

The host lease is taken and released by tasks tagged ``always``, and they read the run's name that an earlier
pre-task sets on localhost. Run with ``--tags pcie_link,reboot`` (the VM lab's e2e test does, to take a kernel
argument away), that pre-task was skipped and the lease failed: "object of type 'HostVarsVars' has no attribute
'gpufleet_run_id'". ansible-playbook --list-tasks shows, for each documented tag, which tasks would run."""

from __future__ import annotations

import os
import re
import sys

import pytest

from tests.helpers import REPO, assert_ok, run

TAGS = ["audit", "pcie_link", "vfio", "irq_affinity", "hugepages", "reboot", "nccl_env", "vllm_service", "benchmark", "verify",
        "pcie_link,reboot"]


def listed(playbook: str, tags: str, tmp_path) -> str:
    env = {"ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, ".collections"), "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_NOCOLOR": "1"}
    proc = run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "--list-tasks",
                "--tags", tags, os.path.join(REPO, "playbooks", playbook)], env=env, timeout=300)
    assert_ok(proc, f"{playbook} --list-tasks --tags {tags}")
    return proc.stdout


@pytest.mark.parametrize("tags", TAGS)
def test_every_documented_tag_that_takes_the_lease_names_the_run_first(tags, tmp_path):
    out = listed("site.yml", tags, tmp_path)
    tasks = re.findall(r"^\s{6}(\S.*?)\tTAGS:", out, re.M)
    assert tasks, out
    take = [i for i, t in enumerate(tasks) if t.startswith("Hold the host for this run")]
    name = [i for i, t in enumerate(tasks) if t.startswith("Name this run once")]
    assert take, f"--tags {tags}: the lease is not taken:\n{out}"
    assert name and name[0] < take[0], f"--tags {tags}: the lease is taken before (or without) the run's name:\n{out}"

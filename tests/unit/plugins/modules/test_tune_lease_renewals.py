# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tune.yml renews the host's lease before each role that writes devices and before the reboot, under
every documented tag (a role's own tags included), so that a run whose lease was broken stops before its
next write. Before issue 31 the play took the lease once and never renewed it.

ansible-playbook --list-tasks shows, for each tag list, the tasks in order: every task of a writing role
must come after a renewal that comes after the tasks of the role before it."""

from __future__ import annotations

import re

import pytest

from tests.unit.plugins.modules.test_tune_tags import listed

WRITERS = ("pcie_link", "vfio", "irq_affinity", "hugepages", "reboot")
RENEW = "Renew the host's lease"
TAGS = ["all", "pcie_link", "vfio", "irq_affinity", "hugepages", "reboot", "pcie_link,reboot", "pcie_link_aspm",
        "pcie_link_cmdline", "vfio_bind", "irq_affinity_pin", "hugepages_sysctl", "hugepages_mount"]


def role_of(task: str) -> str | None:
    """The writing role a listed task belongs to (its argument check excluded: it writes nothing)."""
    found = re.match(r"gpufleet\.inference\.(\w+) : (.*)", task) or re.match(r"Run the (\w+) role again()", task)
    if not found or found.group(1) not in WRITERS or found.group(2).startswith("Validating arguments"):
        return None
    return found.group(1)


@pytest.mark.parametrize("tags", TAGS)
def test_the_lease_is_renewed_before_each_writing_role_and_the_reboot(tags, tmp_path):
    out = listed("tune.yml", tags, tmp_path)
    tasks = re.findall(r"^\s{6}(\S.*?)\tTAGS:", out, re.M)
    take = next(i for i, t in enumerate(tasks) if t.startswith("Hold the host for this run"))
    renewed_for, seen = None, set()
    for task in tasks[take:]:
        if task.startswith(RENEW):
            renewed_for = "next"
            continue
        role = role_of(task)
        if role is None:
            continue
        if renewed_for == "next":
            renewed_for = role
        assert renewed_for == role, f"--tags {tags}: {task!r} runs without a renewal of the lease after the {renewed_for} role:\n{out}"
        seen.add(role)
    assert seen, f"--tags {tags}: no writing role listed:\n{out}"

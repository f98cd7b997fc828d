# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The reboot contract's decision, and the filter plugin that exposes it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.reboot_contract import reboot_plan, truthy

REPO = Path(__file__).resolve().parents[4]


def test_nothing_needed():
    plan = reboot_plan(["pcie_link_reboot_required"], [False], [True])
    assert (plan["reboot"], plan["pending"], plan["needed_by"], plan["message"]) == (False, False, [], "No role needs a reboot.")
    assert reboot_plan([], [], [])["reboot"] is False


def test_reboot_when_every_role_allows():
    plan = reboot_plan(["pcie_link_reboot_required", "vfio_reboot_required", "hugepages_reboot_required"],
                       [True, "true", False], [True, "yes", False])
    assert plan["reboot"] is True and plan["needed_by"] == ["pcie_link", "vfio"] and plan["blocked_by"] == []
    assert plan["flags"] == ["pcie_link_reboot_required", "vfio_reboot_required"]
    assert plan["message"] == "Rebooting once for pcie_link, vfio."


def test_one_role_without_permission_blocks_and_is_named():
    plan = reboot_plan(["pcie_link_reboot_required", "vfio_reboot_required"], [True, True], [True])
    assert (plan["reboot"], plan["pending"], plan["blocked_by"]) == (False, True, ["vfio"])
    assert "A reboot is pending for pcie_link, vfio, but vfio does not allow it" in plan["message"]
    assert "Set vfio_reboot_ok: true" in plan["message"]


def test_internal_and_foreign_names_are_ignored():
    plan = reboot_plan(["__pcie_link_reboot_required", "pcie_link_reboot_ok", "kernel_settings_reboot_required"],
                       [True, True, True], [True, True, True])
    assert plan["needed_by"] == ["kernel_settings"]  # linux-system-roles roles follow the same contract


@pytest.mark.parametrize("value,result", [(True, True), ("True", True), ("yes", True), (1, True), ("1", True),
                                          (False, False), ("false", False), ("", False), (None, False), (0, False)])
def test_truthy(value, result):
    assert truthy(value) is result


@pytest.mark.skipif(shutil.which("ansible") is None, reason="ansible is not installed")
def test_filter_plugins_through_jinja():
    """The filters as a playbook sees them. Run in a subprocess: importing controller code (ansible.errors)
    into this process would switch AnsibleModule.warn of every later in-process module test to the
    controller's display."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(REPO / ".collections"),
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="json")
    expr = ("{{ {'plan': ['pcie_link_reboot_required', 'vfio_reboot_required'] | gpufleet.inference.reboot_plan([true, true], "
            "[true]), 'bad': {'0000:03:00.0': {'mps_after': 256}} | gpufleet.inference.payload_mismatches({'devices': "
            "{'0000:03:00.0': {'config': {'pcie': {'mps': 128, 'mrrs': 512}}}}})} }}")
    proc = subprocess.run(["ansible", "localhost", "-c", "local", "-i", "localhost,", "-m", "ansible.builtin.debug",
                           "-a", json.dumps({"msg": expr})], cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    start = proc.stdout.index("=>") + 2
    msg = json.loads(proc.stdout[start:])["msg"]
    assert msg["plan"]["reboot"] is False and msg["plan"]["blocked_by"] == ["vfio"]
    assert msg["bad"] == ["0000:03:00.0: MaxPayload is 128, expected 256"]
    bad = subprocess.run(["ansible", "localhost", "-c", "local", "-i", "localhost,", "-m", "ansible.builtin.debug",
                          "-a", json.dumps({"msg": "{{ ['a_reboot_required'] | gpufleet.inference.reboot_plan([true, false]) }}"})],
                         cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                         check=False)
    assert bad.returncode != 0 and "reboot_plan: 1 variable names but 2 values" in bad.stdout

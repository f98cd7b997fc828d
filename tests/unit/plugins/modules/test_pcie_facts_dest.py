# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pcie_facts with ``dest``: the audit JSON the audit role kept with a directory task and a copy task,
written by the module itself: byte for byte what ``to_nice_json(sort_keys=true)`` of the registered
result gave, its directory created, changed only when it differs, nothing written in check mode."""

from __future__ import annotations

import json
import os
import stat

import pytest
from ansible.plugins.filter.core import to_nice_json

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import pcie_facts as pcie_audit
from ansible_collections.gpufleet.inference.plugins.modules import pcie_facts
from tests.unit.fakesysfs import eight_gpus, two_gpus_one_switch
from tests.unit.plugins.modules.uthelper import run_module

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the module gives the file to root (chown)")
DEST = "/var/lib/gpufleet/audit/pcie.json"


@pytest.fixture
def switch_root(tmp_path):
    two_gpus_one_switch(tmp_path / "host")
    return str(tmp_path / "host")


@pytest.mark.parametrize("build", [two_gpus_one_switch, eight_gpus])
def test_the_json_is_what_the_role_wrote_with_to_nice_json(tmp_path, build):
    """The role wrote {host, kernel, pcie} of the registered result (the module's JSON as the controller
    parsed it) through to_nice_json(sort_keys=true) and a newline; the module writes the same bytes."""
    build(tmp_path / "host")
    facts, _warnings = pcie_facts.gather(HostFS(str(tmp_path / "host")), {"include_nvml": "never"})
    registered = json.loads(json.dumps(facts))  # what the controller holds after the module's JSON
    expected = to_nice_json({"host": "gpu1", "kernel": "6.1.0-28-amd64", "pcie": registered}, sort_keys=True) + "\n"
    assert pcie_audit.render_report("gpu1", "6.1.0-28-amd64", facts) == expected


@as_root
def test_main_keeps_the_audit_once(switch_root, capsys):
    args = {"root": switch_root, "include_nvml": "never", "dest": DEST, "dest_host": "gpu1", "dest_kernel": "6.1.0",
            "_ansible_diff": True}
    first = run_module(pcie_facts, args, capsys)
    path = switch_root + DEST
    assert first["changed"] is True
    assert first["actions"] == [{"action": "create_directory", "path": "/var/lib/gpufleet/audit", "after": "0755"},
                                {"action": "create", "path": DEST, "after": "0644"}]
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    assert json.loads(text) == {"host": "gpu1", "kernel": "6.1.0", "pcie": first["pcie"]}
    assert text == to_nice_json({"host": "gpu1", "kernel": "6.1.0", "pcie": first["pcie"]}, sort_keys=True) + "\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644 and os.stat(path).st_uid == 0
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o755
    assert first["diff"][-1]["after"] == text and first["diff"][-1]["before"] == ""
    second = run_module(pcie_facts, args, capsys)
    assert second["changed"] is False and second["actions"] == [] and "diff" not in second
    # another kernel: the file is rewritten (and the audit still returned as facts)
    third = run_module(pcie_facts, dict(args, dest_kernel="6.12.0"), capsys)
    assert third["actions"] == [{"action": "write", "path": DEST}] and third["ansible_facts"]["gpufleet_pcie"] == first["pcie"]


def test_check_mode_writes_nothing(switch_root, capsys):
    args = {"root": switch_root, "include_nvml": "never", "dest": DEST, "dest_host": "gpu1", "_ansible_check_mode": True}
    result = run_module(pcie_facts, args, capsys)
    assert result["changed"] is True and [a["action"] for a in result["actions"]] == ["create_directory", "create"]
    assert not os.path.exists(switch_root + "/var/lib/gpufleet")


def test_a_directory_in_the_way_fails_with_the_fix(switch_root, capsys):
    os.makedirs(switch_root + DEST)
    result = run_module(pcie_facts, {"root": switch_root, "include_nvml": "never", "dest": DEST}, capsys)
    assert result["failed"] is True and f"{DEST} exists and is not a regular file" in result["msg"]
    assert "Traceback" not in result["msg"]

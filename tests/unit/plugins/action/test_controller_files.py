# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""controller_files (action plugin) and the audit_controller_files filter: the controller's reports written
in the controller's process: directories and files created, nothing done the second time, check mode, modes,
bad input; and the per-host audit JSON byte for byte what the audit role's to_nice_json copy wrote."""

from __future__ import annotations

import json
import os
import stat

import pytest
from ansible.errors import AnsibleActionFail, AnsibleFilterError
from ansible.plugins.filter.core import to_nice_json

from ansible_collections.gpufleet.inference.plugins.action.controller_files import write
from ansible_collections.gpufleet.inference.plugins.filter.audit_report import FilterModule
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import pcie_facts as pcie_audit

FILES = FilterModule().filters()


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_write_creates_then_changes_nothing(tmp_path):
    reports = str(tmp_path / "reports" / "audit")
    files = [{"path": f"{reports}/fleet.md", "content": "# Fleet\n", "mode": "0644"},
             {"path": f"{reports}/fleet.html", "content": "<html></html>\n", "mode": "0644"}]
    first = write(files, [reports], "0755", check_mode=False)
    assert first["changed"] is True
    assert [a["action"] for a in first["actions"]] == ["create_directory", "create", "create"]
    assert (tmp_path / "reports/audit/fleet.md").read_text() == "# Fleet\n"
    assert _mode(reports) == 0o755 and _mode(f"{reports}/fleet.html") == 0o644
    assert first["diff"][1] == {"before": "", "after": "# Fleet\n", "before_header": f"{reports}/fleet.md",
                                "after_header": f"{reports}/fleet.md"}
    again = write(files, [reports], "0755", check_mode=False)
    assert again == {"changed": False, "actions": [], "diff": []}
    # a changed report is rewritten, and a mode set back
    os.chmod(f"{reports}/fleet.html", 0o600)
    changed = write([dict(files[0], content="# Fleet 2\n"), files[1]], [reports], "0755", check_mode=False)
    assert changed["actions"] == [{"action": "write", "path": f"{reports}/fleet.md"},
                                  {"action": "set_mode", "path": f"{reports}/fleet.html", "before": "0600", "after": "0644"}]
    assert (tmp_path / "reports/audit/fleet.md").read_text() == "# Fleet 2\n" and _mode(f"{reports}/fleet.html") == 0o644


def test_check_mode_writes_nothing(tmp_path):
    reports = str(tmp_path / "reports")
    result = write([{"path": f"{reports}/a.json", "content": "{}\n", "mode": "0644"}], [reports], "0755", check_mode=True)
    assert result["changed"] is True and not os.path.exists(reports)


def test_directories_alone(tmp_path):
    tuning = str(tmp_path / "audit" / "tuning")
    assert write([], [tuning], "0755", check_mode=False)["actions"] == [
        {"action": "create_directory", "path": tuning, "after": "0755"}]
    assert os.path.isdir(tuning) and write([], [tuning], "0755", check_mode=False)["changed"] is False


def test_relative_paths_are_under_the_current_directory(tmp_path, monkeypatch):
    """A relative report directory (an unset PWD gives one) lands where ansible-playbook runs, as the copy did."""
    monkeypatch.chdir(tmp_path)
    result = write([{"path": "reports/audit/a.json", "content": "{}\n", "mode": "0644"}], ["reports/audit"], "0755",
                   check_mode=False)
    assert result["actions"][0]["path"] == str(tmp_path / "reports" / "audit")
    assert (tmp_path / "reports/audit/a.json").read_text() == "{}\n"


def test_bad_mode_and_unwritable_paths_fail_with_what_to_do(tmp_path):
    with pytest.raises(AnsibleActionFail, match="is not an octal mode"):
        write([{"path": str(tmp_path / "a"), "content": "", "mode": "rw-r--r--"}], [], "0755", check_mode=True)
    (tmp_path / "x.json").mkdir()
    with pytest.raises(AnsibleActionFail, match="is not a regular file .* written on the controller"):
        write([{"path": str(tmp_path / "x.json"), "content": "", "mode": "0644"}], [], "0755", check_mode=False)


class HostVars(dict):
    """hostvars as a filter sees it: host name -> that host's variables."""


def test_audit_controller_files_match_the_per_host_copy_and_the_host_json(tmp_path):
    pcie = {"gpus": [{"bdf": "0000:17:00.0", "numa_node": 0}], "findings": [], "irqs": {"41": [0, 1]},
            "findings_summary": {"critical": 0, "warning": 0, "info": 0, "total": 0}}
    hostvars = HostVars({"gpu1": {"__audit_result": {"pcie": pcie}, "ansible_facts": {"kernel": "6.1.0-28-amd64"}},
                         "gpu2": {"__audit_result": {"pcie": pcie}},            # verify.yml alone: no facts
                         "gpu3": {"ansible_facts": {"kernel": "k"}}})           # not audited in this run
    files = FILES["audit_controller_files"](hostvars, ["gpu1", "gpu2", "gpu3"], "/r/audit")
    assert [f["path"] for f in files] == ["/r/audit/gpu1.json", "/r/audit/gpu2.json"]
    # what the role's copy task wrote: {host, kernel | default(''), pcie} | to_nice_json(sort_keys=true) + newline
    assert files[0]["content"] == to_nice_json({"host": "gpu1", "kernel": "6.1.0-28-amd64", "pcie": pcie}, sort_keys=True) + "\n"
    assert json.loads(files[1]["content"])["kernel"] == ""
    # and the same bytes pcie_facts keeps on the host (dest)
    assert files[0]["content"] == pcie_audit.render_report("gpu1", "6.1.0-28-amd64", pcie)
    # a device name beyond ASCII: one text for both copies, as to_nice_json writes it
    named = dict(pcie, gpus=[{"bdf": "0000:17:00.0", "name": "GH100 [H200 NVL] \u00ae"}])
    text = pcie_audit.render_report("gpu1", "k", named)
    assert text == to_nice_json({"host": "gpu1", "kernel": "k", "pcie": named}, sort_keys=True) + "\n" and "\\u00ae" in text
    assert FILES["audit_controller_files"](HostVars({"gpu1": {"__audit_result": {"pcie": named}, "ansible_facts": {"kernel": "k"}}}),
                                           ["gpu1"], "/r")[0]["content"] == text


def test_audit_controller_files_wants_hostvars():
    with pytest.raises(AnsibleFilterError, match="pass hostvars and a list of inventory host names"):
        FILES["audit_controller_files"]({}, ["gpu1"], "/r")

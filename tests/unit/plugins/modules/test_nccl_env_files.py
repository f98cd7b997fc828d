# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nccl_env_files: the nccl_env role's one module run on fake trees: the directory and both files
written (content, mode, owner), nothing done the second time, check mode and diff, the read-back's
checks and their failure message, the per-user override's warning; module_utils/_host/managed_files too."""

from __future__ import annotations

import json
import os
import stat

import pytest

from ansible_collections.gpufleet.inference.plugins.filter.nccl_env import FilterModule
from ansible_collections.gpufleet.inference.plugins.module_utils._host import managed_files as mf
from ansible_collections.gpufleet.inference.plugins.module_utils._host import module as host_module
from ansible_collections.gpufleet.inference.plugins.module_utils.nccl import nccl_env_files as nf
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.modules import nccl_env_files
from tests.unit.plugins.modules.uthelper import run_module

RESOLVED = FilterModule().filters()["nccl_env"]("pcie_safe")
ME = (os.getuid(), os.getgid())
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the module gives its files to root (chown)")


def on(fs, warn=None) -> Host:
    """The Host of the executor: files only; warnings to ``warn`` (dropped by default)."""
    return Host(fs=fs, cmd=None, warn=warn or (lambda msg: None))


def _params(**over) -> dict:
    params = {"conf_path": "/etc/nccl.conf", "conf_content": RESOLVED["nccl_conf"], "env_file": "/etc/gpufleet/nccl.env",
              "env_content": RESOLVED["env_file"], "settings": RESOLVED["settings"], "user_conf": "/root/.nccl.conf"}
    params.update(over)
    return params


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_first_run_creates_the_directory_and_both_files(tmp_path):
    (tmp_path / "etc").mkdir()
    result = nf.execute(_params(), on(HostFS(str(tmp_path))), False, owner=ME)
    assert result["changed"] is True and result["read_back"] is True
    assert result["actions"] == [{"action": "create_directory", "path": "/etc/gpufleet", "after": "0755"},
                                 {"action": "create", "path": "/etc/nccl.conf", "after": "0644"},
                                 {"action": "create", "path": "/etc/gpufleet/nccl.env", "after": "0644"}]
    assert (tmp_path / "etc/nccl.conf").read_text() == RESOLVED["nccl_conf"]
    assert (tmp_path / "etc/gpufleet/nccl.env").read_text() == RESOLVED["env_file"]
    assert _mode(tmp_path / "etc/gpufleet") == 0o755 and _mode(tmp_path / "etc/nccl.conf") == 0o644
    assert _mode(tmp_path / "etc/gpufleet/nccl.env") == 0o644
    assert result["files"] == ["/etc/nccl.conf", "/etc/gpufleet/nccl.env"] and result["user_conf_exists"] is False
    # the diff: the directory's state, each file's text
    assert result["diff"][0]["after"] == {"path": "/etc/gpufleet", "state": "directory"}
    assert result["diff"][1] == {"before": "", "after": RESOLVED["nccl_conf"], "before_header": "/etc/nccl.conf",
                                 "after_header": "/etc/nccl.conf"}
    # the second run changes nothing and still reads back
    again = nf.execute(_params(), on(HostFS(str(tmp_path))), False, owner=ME)
    assert again["changed"] is False and again["actions"] == [] and again["diff"] == [] and again["read_back"] is True


def test_check_mode_reads_and_writes_nothing(tmp_path):
    (tmp_path / "etc").mkdir()
    result = nf.execute(_params(), on(HostFS(str(tmp_path))), True, owner=ME)
    assert result["changed"] is True and len(result["actions"]) == 3 and result["read_back"] is False
    assert os.listdir(tmp_path / "etc") == []


def test_an_edited_file_is_rewritten_and_a_wrong_mode_set(tmp_path):
    fs = HostFS(str(tmp_path))
    nf.execute(_params(), on(fs), False, owner=ME)
    (tmp_path / "etc/nccl.conf").write_text(RESOLVED["nccl_conf"] + "NCCL_P2P_DISABLE=1\n")
    os.chmod(tmp_path / "etc/gpufleet/nccl.env", 0o600)
    os.chmod(tmp_path / "etc/gpufleet", 0o700)
    result = nf.execute(_params(), on(fs), False, owner=ME)
    assert result["actions"] == [
        {"action": "set_mode", "path": "/etc/gpufleet", "before": "0700", "after": "0755"},
        {"action": "write", "path": "/etc/nccl.conf"},
        {"action": "set_mode", "path": "/etc/gpufleet/nccl.env", "before": "0600", "after": "0644"}]
    assert (tmp_path / "etc/nccl.conf").read_text() == RESOLVED["nccl_conf"]
    assert _mode(tmp_path / "etc/gpufleet/nccl.env") == 0o644 and _mode(tmp_path / "etc/gpufleet") == 0o755
    assert result["diff"][1]["before"].endswith("NCCL_P2P_DISABLE=1\n")


@as_root
def test_a_wrong_owner_is_given_back_to_root(tmp_path):
    fs = HostFS(str(tmp_path))
    nf.execute(_params(), on(fs), False)
    os.chown(tmp_path / "etc/nccl.conf", 1000, 1000)
    result = nf.execute(_params(), on(fs), False)
    assert result["actions"] == [{"action": "set_owner", "path": "/etc/nccl.conf", "before": "1000:1000", "after": "0:0"}]
    assert os.stat(tmp_path / "etc/nccl.conf").st_uid == 0


class LossyFS(HostFS):
    """A file system that keeps something else than what is written to one path (a tool rewriting it)."""

    def write_atomic(self, host_path, data, mode=0o644):
        if host_path == "/etc/gpufleet/nccl.env":
            data = data.replace("CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_DEVICE_ORDER=FASTEST_FIRST")
        super().write_atomic(host_path, data, mode)


def test_the_read_back_fails_when_a_file_does_not_hold_what_was_written(tmp_path):
    with pytest.raises(nf.NcclFilesError) as err:
        nf.execute(_params(), on(LossyFS(str(tmp_path))), False, owner=ME)
    msg = str(err.value)
    assert msg.startswith("/etc/nccl.conf or /etc/gpufleet/nccl.env does not hold the settings just written "
                          "(changed by hand or by another tool?)")
    assert "/etc/gpufleet/nccl.env differs from what was written" in msg
    assert "/etc/gpufleet/nccl.env lacks CUDA_DEVICE_ORDER=PCI_BUS_ID" in msg
    assert msg.endswith("Expected: " + json.dumps(RESOLVED["settings"]))


@pytest.mark.parametrize("conf,env,problem", [
    ("NCCL_DEBUG=WARN\n", None, "/etc/nccl.conf lacks NCCL_NVLS_ENABLE=0"),
    (None, "NCCL_NVLS_ENABLE=0\n", "/etc/gpufleet/nccl.env lacks CUDA_DEVICE_ORDER=PCI_BUS_ID"),
])
def test_the_read_back_checks_nvls_and_the_device_order(conf, env, problem):
    """Contents that lack the two settings the role guarantees fail even when written exactly."""
    params = _params(conf_content=conf or RESOLVED["nccl_conf"], env_content=env or RESOLVED["env_file"])
    texts = {"/etc/nccl.conf": params["conf_content"], "/etc/gpufleet/nccl.env": params["env_content"]}
    with pytest.raises(nf.NcclFilesError, match=problem):
        nf.check_read_back(params, texts)


def test_the_per_user_override_warns(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root/.nccl.conf").write_text("NCCL_P2P_DISABLE=1\n")
    warnings = []
    result = nf.execute(dict(_params(), host_name="gpu1"), on(HostFS(str(tmp_path)), warnings.append), True, owner=ME)
    assert result["user_conf_exists"] is True
    assert warnings == ["/root/.nccl.conf exists on gpu1: NCCL reads it instead of /etc/nccl.conf for processes of root. "
                        "Remove it or fold its keys into nccl_env_settings."]


def test_a_directory_where_the_file_belongs_fails_with_the_fix(tmp_path):
    (tmp_path / "etc/nccl.conf").mkdir(parents=True)
    with pytest.raises(nf.NcclFilesError, match="is not a regular file .* move it away"):
        nf.execute(_params(), on(HostFS(str(tmp_path))), True, owner=ME)
    (tmp_path / "etc/nccl.conf").rmdir()
    (tmp_path / "etc/gpufleet").write_text("")
    with pytest.raises(nf.NcclFilesError, match="/etc/gpufleet exists and is not a directory"):
        nf.execute(_params(), on(HostFS(str(tmp_path))), True, owner=ME)


def test_managed_files_read_back_reports_a_missing_file(tmp_path):
    files = [mf.wanted_file("/etc/x", "a\n")]
    assert mf.read_back(HostFS(str(tmp_path)), files) == {"/etc/x": None}


@as_root
def test_main_writes_then_changes_nothing_and_diffs(tmp_path, capsys):
    args = dict(_params(), root=str(tmp_path), _ansible_diff=True)
    first = run_module(nccl_env_files, args, capsys)
    assert first["changed"] is True and [a["action"] for a in first["actions"]] == ["create_directory", "create", "create"]
    assert first["diff"][2]["after"] == RESOLVED["env_file"]
    second = run_module(nccl_env_files, args, capsys)
    assert second["changed"] is False and "diff" not in second and second["read_back"] is True
    checked = run_module(nccl_env_files, dict(args, _ansible_check_mode=True), capsys)
    assert checked["changed"] is False and checked["read_back"] is False


@as_root
def test_main_reports_the_read_back_failure(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(host_module, "HostFS", LossyFS)  # the HostFS run_module() builds
    result = run_module(nccl_env_files, dict(_params(), root=str(tmp_path)), capsys)
    assert result["failed"] is True and "does not hold the settings just written" in result["msg"]


@pytest.mark.parametrize("over,problem", [
    ({"conf_content": "NCCL_DEBUG=WARN\n"}, "/etc/nccl.conf lacks NCCL_NVLS_ENABLE=0"),
    ({"env_content": "NCCL_NVLS_ENABLE=0\n"}, "/etc/gpufleet/nccl.env lacks CUDA_DEVICE_ORDER=PCI_BUS_ID"),
])
def test_contents_without_the_settings_are_refused_before_anything_is_written(tmp_path, capsys, over, problem):
    """Issue 31: a conf lacking NCCL_NVLS_ENABLE=0 used to be written, then the read-back failed with changed: false and
    blamed another tool (a half-applied run). Now the contents are checked first and the tree stays empty."""
    result = run_module(nccl_env_files, dict(_params(**over), root=str(tmp_path)), capsys)
    assert result["failed"] is True and result["changed"] is False
    assert problem in result["msg"] and "Nothing was written" in result["msg"] and "by another tool" not in result["msg"]
    assert not list(tmp_path.iterdir())


def test_a_write_that_fails_halfway_undoes_the_files_written_before(tmp_path, capsys):
    """Issue 31 (the fuzz suite): with the EnvironmentFile's directory immutable, /etc/nccl.conf was written, then the run
    failed saying changed: false. Now what was written before the failure is undone: the tree is as it was."""
    (tmp_path / "etc/gpufleet").mkdir(parents=True)
    (tmp_path / "etc/nccl.conf").write_text("NCCL_DEBUG=WARN\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    class Immutable(HostFS):
        def write_atomic(self, host_path, data, mode=0o644):
            if host_path == "/etc/gpufleet/nccl.env":
                raise HostFSError("write", host_path, OSError(1, "Operation not permitted"))
            super().write_atomic(host_path, data, mode)

    with pytest.raises(HostFSError) as err:
        nf.execute(_params(), on(Immutable(str(tmp_path))), False, owner=ME)
    assert err.value.fields == {"changed": False}
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_service_files: the vllm_service role's one module run on fake trees, with the unit the role's
template renders: the directory, the environment, the secret file (written 0600 or removed, its text
never in a result), the unit with the NCCL file's checksum stamped in, nothing done the second time,
check mode, the read-back, and input refused before any write."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.vllm import vllm_service_files as vsf
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.modules import vllm_service_files
from tests.unit.plugins.modules.test_vllm_unit_security import render
from tests.unit.plugins.modules.uthelper import run_module

ME = (os.getuid(), os.getgid())
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the module gives its files to root (chown)")
SECRET = "VLLM_API_KEY=" + "k" * 32 + "\nHF_TOKEN=hf_never_shown_0001\n"
NCCL = "/etc/gpufleet/nccl.env"


def template() -> str:
    """The role's template rendered as the role renders it, the stamp line left open."""
    text = render()
    return text.replace(f"# NCCL environment {NCCL}: absent\n", f"# NCCL environment {NCCL}:\n")


def _params(**over) -> dict:
    params = {"name": "vllm", "config_dir": "/etc/gpufleet/vllm", "env_content": "HF_HUB_OFFLINE=1\n",
              "secret_content": "", "unit_content": template(), "unit_dir": "/etc/systemd/system", "nccl_env_file": NCCL}
    params.update(over)
    return params


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def on(fs) -> Host:
    """The Host of the executor, which touches files only."""
    return Host(fs=fs, cmd=None, warn=lambda msg: None)


def _tree(tmp_path):
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    return HostFS(str(tmp_path))


def test_first_run_writes_the_directory_environment_and_unit_and_the_second_nothing(tmp_path):
    fs = _tree(tmp_path)
    result = vsf.execute(_params(), on(fs), False, owner=ME)
    assert result["changed"] is True and result["read_back"] is True and result["unit_existed"] is False
    assert result["actions"] == [{"action": "create_directory", "path": "/etc/gpufleet/vllm", "after": "0755"},
                                 {"action": "create", "path": "/etc/gpufleet/vllm/vllm.env", "after": "0644"},
                                 {"action": "create", "path": "/etc/systemd/system/vllm.service", "after": "0644"}]
    unit = (tmp_path / "etc/systemd/system/vllm.service").read_text()
    assert unit.splitlines()[2] == f"# NCCL environment {NCCL}: absent"
    assert unit == template().replace(f"# NCCL environment {NCCL}:\n", f"# NCCL environment {NCCL}: absent\n")
    assert (tmp_path / "etc/gpufleet/vllm/vllm.env").read_text() == "HF_HUB_OFFLINE=1\n"
    assert _mode(tmp_path / "etc/gpufleet/vllm") == 0o755 and _mode(tmp_path / "etc/gpufleet/vllm/vllm.env") == 0o644
    assert not (tmp_path / "etc/gpufleet/vllm/vllm.secret.env").exists()
    assert result["files"] == ["/etc/gpufleet/vllm/vllm.env", "/etc/systemd/system/vllm.service"]
    assert result["nccl_env"] == {"path": NCCL, "exists": False, "sha1": None, "lines": []}
    again = vsf.execute(_params(), on(fs), False, owner=ME)
    assert again["changed"] is False and again["actions"] == [] and again["unit_existed"] is True


def test_the_nccl_checksum_is_stamped_and_a_change_of_it_rewrites_the_unit(tmp_path):
    fs = _tree(tmp_path)
    (tmp_path / "etc/gpufleet").mkdir(parents=True)
    nccl = "# Managed by Ansible\nNCCL_P2P_LEVEL=PHB\n\n  # a note\nCUDA_DEVICE_ORDER=PCI_BUS_ID\n"
    (tmp_path / NCCL.lstrip("/")).write_text(nccl)
    first = vsf.execute(_params(), on(fs), False, owner=ME)
    sha1 = hashlib.sha1(nccl.encode()).hexdigest()  # what Ansible's stat module calls the checksum
    assert first["nccl_env"] == {"path": NCCL, "exists": True, "sha1": sha1,
                                 "lines": ["NCCL_P2P_LEVEL=PHB", "CUDA_DEVICE_ORDER=PCI_BUS_ID"]}
    unit = tmp_path / "etc/systemd/system/vllm.service"
    assert f"# NCCL environment {NCCL}: sha1 {sha1}\n" in unit.read_text()
    (tmp_path / NCCL.lstrip("/")).write_text(nccl.replace("PHB", "SYS"))
    second = vsf.execute(_params(), on(fs), False, owner=ME)
    assert second["actions"] == [{"action": "write", "path": "/etc/systemd/system/vllm.service"}]
    assert second["diff"][0]["before"].count(sha1) == 1 and sha1 not in second["diff"][0]["after"]


def test_the_secret_file_is_root_only_hidden_and_removed_when_unwanted(tmp_path):
    fs = _tree(tmp_path)
    result = vsf.execute(_params(secret_content=SECRET), on(fs), False, owner=ME)
    secret = tmp_path / "etc/gpufleet/vllm/vllm.secret.env"
    assert secret.read_text() == SECRET and _mode(secret) == 0o600 and result["secret_file"] is True
    assert {"action": "create", "path": "/etc/gpufleet/vllm/vllm.secret.env", "after": "0600"} in result["actions"]
    assert "hf_never_shown" not in json.dumps(result) and "k" * 32 not in json.dumps(result)
    assert f"({len(SECRET)} bytes, not shown)\n" in [d["after"] for d in result["diff"]]
    gone = vsf.execute(_params(), on(fs), False, owner=ME)
    assert gone["actions"] == [{"action": "remove", "path": "/etc/gpufleet/vllm/vllm.secret.env"}]
    assert gone["diff"] == [{"before": f"({len(SECRET)} bytes, not shown)\n", "after": "",
                             "before_header": "/etc/gpufleet/vllm/vllm.secret.env",
                             "after_header": "/etc/gpufleet/vllm/vllm.secret.env (removed)"}]
    assert not secret.exists() and gone["secret_file"] is False
    assert vsf.execute(_params(), on(fs), False, owner=ME)["changed"] is False


def test_check_mode_writes_nothing_and_says_what_would_change(tmp_path):
    fs = _tree(tmp_path)
    result = vsf.execute(_params(secret_content=SECRET), on(fs), True, owner=ME)
    assert result["changed"] is True and result["read_back"] is False and len(result["actions"]) == 4
    assert os.listdir(tmp_path / "etc") == ["systemd"] and os.listdir(tmp_path / "etc/systemd/system") == []


@pytest.mark.parametrize("unit,count", [("[Unit]\n", 0), ("# NCCL environment /etc/gpufleet/nccl.env:\n" * 2, 2),
                                        ("# NCCL environment /etc/other.env:\n", 0)])
def test_a_unit_without_its_one_stamp_line_is_refused_before_any_write(tmp_path, unit, count):
    fs = _tree(tmp_path)
    with pytest.raises(vsf.VllmFilesError) as err:
        vsf.execute(_params(unit_content=unit), on(fs), False, owner=ME)
    assert str(err.value).startswith(f"unit_content holds {count} lines '# NCCL environment {NCCL}:' where the module")
    assert "templates/vllm.service.j2" in str(err.value) and not (tmp_path / "etc/gpufleet").exists()


@pytest.mark.parametrize("over,words", [({"name": "vllm.service"}, "is not a service name"),
                                        ({"name": "../x"}, "is not a service name"),
                                        ({"name": "my vllm"}, "is not a service name"),
                                        ({"name": "vllm\nExecStartPre=/bin/sh"}, "is not a service name"),
                                        ({"name": "vllm\u00e9"}, "is not a service name"),
                                        ({"name": "-vllm"}, "is not a service name"),
                                        ({"unit_dir": "systemd"}, "unit_dir='systemd' is not an absolute path"),
                                        ({"config_dir": "etc/vllm"}, "config_dir='etc/vllm' is not an absolute path"),
                                        ({"nccl_env_file": "nccl.env"}, "nccl_env_file='nccl.env' is not an absolute path")])
def test_bad_names_and_paths_are_refused_before_any_write(tmp_path, over, words):
    fs = _tree(tmp_path)
    with pytest.raises(vsf.VllmFilesError, match=words):
        vsf.execute(_params(**over), on(fs), False, owner=ME)
    assert sorted(os.listdir(tmp_path / "etc")) == ["systemd"]


def test_a_directory_where_the_unit_belongs_fails_with_the_fix_and_writes_nothing(tmp_path):
    fs = _tree(tmp_path)
    (tmp_path / "etc/systemd/system/vllm.service").mkdir()
    with pytest.raises(vsf.VllmFilesError, match="is not a regular file .* move it away.*Nothing was written"):
        vsf.execute(_params(), on(fs), False, owner=ME)
    assert not (tmp_path / "etc/gpufleet").exists()


class LossyFS(HostFS):
    """Keeps something else than what is written to the environment file (another tool rewriting it)."""

    def write_atomic(self, host_path, data, mode=0o644):
        super().write_atomic(host_path, data + "EXTRA=1\n" if host_path.endswith("vllm.env") else data, mode)


def test_the_read_back_fails_as_changed_when_a_file_does_not_hold_what_was_written(tmp_path):
    _tree(tmp_path)
    with pytest.raises(Failed) as err:
        vsf.execute(_params(), on(LossyFS(str(tmp_path))), False, owner=ME)
    assert str(err.value) == ("The vLLM service's files do not hold what was just written (changed by another tool meanwhile?): "
                              "/etc/gpufleet/vllm/vllm.env differs from what was written. Run the role again; the service "
                              "was not restarted.")
    assert err.value.fields["changed"] is True


@as_root
def test_main_writes_then_changes_nothing_and_never_shows_the_secret(tmp_path, capsys):
    _tree(tmp_path)
    args = dict(_params(secret_content=SECRET), root=str(tmp_path), _ansible_diff=True)
    first = run_module(vllm_service_files, args, capsys)
    assert first["changed"] is True and [a["action"] for a in first["actions"]] == [
        "create_directory", "create", "create", "create"]
    assert "hf_never_shown" not in json.dumps(first) and os.stat(tmp_path / "etc/gpufleet/vllm/vllm.secret.env").st_uid == 0
    second = run_module(vllm_service_files, args, capsys)
    assert second["changed"] is False and "diff" not in second and second["unit_existed"] is True
    checked = run_module(vllm_service_files, dict(args, secret_content="", _ansible_check_mode=True), capsys)
    assert checked["changed"] is True and checked["actions"] == [{"action": "remove", "path": "/etc/gpufleet/vllm/vllm.secret.env"}]
    assert (tmp_path / "etc/gpufleet/vllm/vllm.secret.env").exists()


@as_root
def test_main_refuses_a_unit_without_its_stamp_line_unchanged(tmp_path, capsys):
    _tree(tmp_path)
    result = run_module(vllm_service_files, dict(_params(unit_content="[Unit]\n"), root=str(tmp_path)), capsys)
    assert result["failed"] is True and result["changed"] is False and "unit_content holds 0 lines" in result["msg"]

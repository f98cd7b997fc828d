# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HostFS keeps every path in its root (issue 31): '..', symlinks that lead out, NUL bytes, relative, empty and
non-string paths are a HostPathError (a HostFSError, so finish() reports it), and finish() gives read-only and
immutable files their own advice."""

from __future__ import annotations

import errno
import os

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host import files as hostfs
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError, HostPathError
from ansible_collections.gpufleet.inference.plugins.modules import nccl_env_files
from tests.unit.plugins.module_utils.test_hostfs_finish import Module, end
from tests.unit.plugins.modules.uthelper import run_module


@pytest.fixture()
def tree(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    return root


@pytest.mark.parametrize("path, why", [
    ("/../../outside/x", "'..' in a host path"), ("/etc/../../x", "'..' in a host path"), ("etc/x", "expected an absolute path"),
    ("", "expected an absolute path"), (None, "expected an absolute path"), (7, "expected an absolute path"),
    ("/etc/x\0y", "NUL byte"),
])
def test_paths_that_are_not_plain_absolute_paths_are_refused(tree, path, why):
    fs = HostFS(str(tree))
    for op in (lambda: fs.write_atomic(path, "x"), lambda: fs.exists(path), lambda: fs.read_text(path, "")):
        with pytest.raises(HostPathError, match=why):
            op()
    assert sorted(os.listdir(tree.parent)) == ["outside", "root"] and not os.listdir(tree.parent / "outside")


def test_a_symlink_that_leads_out_of_root_is_refused_for_reads_and_writes(tree):
    (tree / "etc/link").symlink_to(tree.parent / "outside")
    (tree / "etc/abs").symlink_to("/etc")
    fs = HostFS(str(tree))
    for path in ("/etc/link/x", "/etc/link", "/etc/abs/passwd"):
        with pytest.raises(HostPathError, match="outside root"):
            fs.write_text(path, "x")
        with pytest.raises(HostPathError, match="outside root"):
            fs.read_text(path, "")
    # the link itself (lstat, readlink, exists, remove) is inside the root
    assert fs.exists("/etc/link") and fs.readlink("/etc/link") == str(tree.parent / "outside") and fs.lstat("/etc/link")
    assert fs.remove("/etc/link") and not os.listdir(tree.parent / "outside")


def test_a_symlink_inside_the_root_is_followed(tree):
    (tree / "etc/real").mkdir()
    (tree / "etc/alias").symlink_to("real")
    fs = HostFS(str(tree))
    fs.write_atomic("/etc/alias/f", "x\n")
    assert (tree / "etc/real/f").read_text() == "x\n" and fs.realpath("/etc/alias/f") == "/etc/real/f"


@pytest.mark.parametrize("root", ["", "relative/root", "/tmp/x\0y"])
def test_a_bad_root_is_refused_at_the_first_path_not_at_construction(root):
    fs = HostFS(root)
    with pytest.raises(HostPathError, match="root must be an absolute path"):
        fs.exists("/etc")


def test_main_refuses_a_path_out_of_root_and_writes_nothing(tree, capsys):
    """Issue 31: conf_path=/../../outside/nccl.conf was written outside root."""
    args = {"root": str(tree), "conf_path": "/../../outside/nccl.conf", "conf_content": "NCCL_NVLS_ENABLE=0\n",
            "env_content": "CUDA_DEVICE_ORDER=PCI_BUS_ID\n", "settings": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}
    result = run_module(nccl_env_files, args, capsys)
    assert result["failed"] and result["msg"].startswith("conf_path='/../../outside/nccl.conf' is refused: '..' could lead out")
    assert "exception" not in result
    assert not os.listdir(tree.parent / "outside") and os.listdir(tree) == ["etc"] and not os.listdir(tree / "etc")


def test_a_read_only_file_system_is_not_blamed_on_a_container():
    def run():
        raise HostFSError("write", "/etc/nccl.conf", OSError(errno.EROFS, "Read-only file system"))
    _kind, kw = end(Module(False), run)
    assert "is on a read-only file system: remount it read-write" in kw["msg"] and "container" not in kw["msg"]


def test_eperm_as_root_says_immutable(monkeypatch):
    monkeypatch.setattr(hostfs.os, "geteuid", lambda: 0)

    def run():
        raise HostFSError("write", "/etc/nccl.conf", OSError(errno.EPERM, "Operation not permitted"))
    _kind, kw = end(Module(False), run)
    assert "It runs as root, so /etc/nccl.conf is immutable or append-only (lsattr /etc/nccl.conf; chattr -i" in kw["msg"]

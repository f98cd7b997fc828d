# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HostFS.write_atomic and remove are durable: the data is fsync'd before the rename, the directory
after it (and after an unlink). The real os.fsync runs; a spy records what it was given."""

from __future__ import annotations

import os
import stat

from ansible_collections.gpufleet.inference.plugins.module_utils._host import files as hostfs_mod
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS


def spy_fsync(monkeypatch):
    calls = []
    real = os.fsync

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        calls.append((path, stat.S_ISDIR(os.fstat(fd).st_mode), os.path.exists(path)))
        return real(fd)

    monkeypatch.setattr(hostfs_mod.os, "fsync", fsync)
    return calls


def test_write_atomic_fsyncs_the_file_then_its_directory(tmp_path, monkeypatch):
    calls = spy_fsync(monkeypatch)
    fs = HostFS(str(tmp_path))
    fs.write_atomic("/etc/gpufleet/x.json", "{}\n", 0o600)
    target = tmp_path / "etc/gpufleet/x.json"
    assert target.read_text() == "{}\n" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert len(calls) == 2, calls
    (file_path, file_is_dir, _file_exists), (dir_path, dir_is_dir, _dir_exists) = calls
    # first the temp file (same directory, not yet renamed), then the directory that holds the rename
    assert not file_is_dir and os.path.dirname(file_path) == str(tmp_path / "etc/gpufleet") and file_path != str(target)
    assert dir_is_dir and dir_path == str(tmp_path / "etc/gpufleet")
    assert [p.name for p in (tmp_path / "etc/gpufleet").iterdir()] == ["x.json"]  # no temp file left


def test_remove_fsyncs_the_directory(tmp_path, monkeypatch):
    fs = HostFS(str(tmp_path))
    fs.write_atomic("/var/lib/gpufleet/r.json", "{}\n")
    calls = spy_fsync(monkeypatch)
    assert fs.remove("/var/lib/gpufleet/r.json") is True
    assert calls == [(str(tmp_path / "var/lib/gpufleet"), True, True)]
    assert fs.remove("/var/lib/gpufleet/r.json") is False

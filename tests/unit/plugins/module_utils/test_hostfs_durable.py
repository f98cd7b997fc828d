# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HostFS.write_durable: content and mode, parents created, the old file replaced whole, no temp
file left behind (also when the write fails), errors as HostFSError naming the path; and that the
journal module archives a finished journal and refuses an unreadable one."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.kernel import journal as kj
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.flow import JOURNAL_FORMAT, FlowError


def test_write_durable_replaces_the_file_whole(tmp_path):
    fs = HostFS(str(tmp_path))
    fs.write_durable("/var/lib/x/state.json", "one\n", 0o600)
    fs.write_durable("/var/lib/x/state.json", "two\n", 0o600)
    path = tmp_path / "var/lib/x/state.json"
    assert path.read_text() == "two\n"
    assert (path.stat().st_mode & 0o777) == 0o600
    assert os.listdir(tmp_path / "var/lib/x") == ["state.json"]


def test_write_durable_fails_with_the_path_and_leaves_nothing(tmp_path):
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "file").write_text("a file where a directory should be")
    fs = HostFS(str(tmp_path))
    with pytest.raises(HostFSError) as err:
        fs.write_durable("/ro/file/state.json", "x")
    assert "/ro/file/state.json" in str(err.value)


def journal(**kw):
    base = {"format": JOURNAL_FORMAT, "run_id": "r1", "target": "6.1.0-56-cloud-amd64", "old": "6.1.0-50-cloud-amd64",
            "stage": "pinned", "started_at": 1796000000, "baseline": {"samples": [1.0]}, "finished": False}
    base.update(kw)
    return base


def test_save_load_and_archive(tmp_path):
    fs = HostFS(str(tmp_path))
    assert kj.load_journal(fs) is None
    assert kj.save_journal(fs, journal()) == [{"action": "write_journal", "path": kj.JOURNAL, "stage": "pinned"}]
    assert kj.load_journal(fs)["stage"] == "pinned"
    assert (tmp_path / kj.JOURNAL.lstrip("/")).stat().st_mode & 0o777 == 0o600
    actions = kj.save_journal(fs, journal(stage="committed", finished=True))
    assert [a["action"] for a in actions] == ["archive_journal", "remove_journal"]
    assert kj.load_journal(fs) is None
    archived = tmp_path / kj.HISTORY_DIR.lstrip("/") / "r1-1796000000-6.1.0-56-cloud-amd64.json"
    assert json.loads(archived.read_text())["stage"] == "committed"


def test_an_unreadable_journal_is_refused(tmp_path):
    fs = HostFS(str(tmp_path))
    (tmp_path / kj.JOURNAL.lstrip("/")).parent.mkdir(parents=True)
    (tmp_path / kj.JOURNAL.lstrip("/")).mkdir()  # a directory where the file should be: EISDIR
    with pytest.raises(FlowError, match="cannot be read"):
        kj.load_journal(fs)


def test_installed_packages_from_dpkg_status():
    status = ("Package: a\nStatus: install ok installed\n\nPackage: b\nStatus: deinstall ok config-files\n\n"
              "Package: c\nStatus: install ok half-configured\n")
    assert kj.installed_packages(status) == ["a", "c"]

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hostfs.finish(): how hugepages, irq_affinity and vfio_bind end a run (result, errors, diff)."""

from __future__ import annotations

import errno

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import finish


class Ended(Exception):
    pass


class Module:
    """Records what AnsibleModule's exit_json/fail_json would have been given."""

    def __init__(self, diff: bool, root: str = "/"):
        self.params = {"root": root}
        self._diff = diff
        self.ended = None

    def exit_json(self, **kw):
        self.ended = ("exit", kw)
        raise Ended()

    def fail_json(self, **kw):
        self.ended = ("fail", kw)
        raise Ended()


class KnownError(Exception):
    pass


def end(module, run):
    with pytest.raises(Ended):
        finish(module, "hugepages", "reads and writes sysfs", run, KnownError)
    return module.ended


@pytest.mark.parametrize("diff_mode", [True, False])
def test_result_and_diff_only_in_diff_mode(diff_mode):
    kind, kw = end(Module(diff_mode), lambda: {"changed": True, "actions": ["x"], "diff": {"before": "a", "after": "b"}})
    assert kind == "exit" and kw["changed"] is True and kw["actions"] == ["x"]
    assert ("diff" in kw) is diff_mode


def test_known_error_is_the_message_and_nothing_changed():
    def run():
        raise KnownError("Node 0 would hold 95% of its memory in huge pages")
    kind, kw = end(Module(True), run)
    assert kind == "fail" and kw == {"msg": "Node 0 would hold 95% of its memory in huge pages", "changed": False}


def test_hostfs_error_names_the_module_the_root_and_the_fix():
    def run():
        raise HostFSError("write", "/tree/sys/kernel/mm/hugepages/x", OSError(errno.EACCES, "Permission denied"))
    kind, kw = end(Module(True, root="/tree"), run)
    assert kind == "fail"
    assert kw["msg"].startswith("hugepages under root /tree failed: ")
    assert kw["msg"].endswith("The module reads and writes sysfs: run it as root (become: true) on the host itself, "
                              "not in a container.")

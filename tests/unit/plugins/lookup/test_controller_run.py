# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""lookup controller_run: this process's identity from /proc, and a lease holder that is alive (a
real child process), dead (that child after it exited) or on another controller."""

from __future__ import annotations

import subprocess
import sys

import pytest
from ansible.errors import AnsibleLookupError

from ansible_collections.gpufleet.inference.plugins.lookup import controller_run as cr


def test_identity_names_a_live_process_with_its_start():
    me = cr.identity()
    assert me["pid"] > 0 and me["pid_start"] > 0 and me["controller"]


def test_dead_holder_for_a_live_a_dead_and_a_foreign_holder():
    lookup = cr.LookupModule()
    me = cr.identity()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        start = cr.proc_start(cr._read(f"/proc/{child.pid}/stat"))
        lease = {"run_id": "A", "controller": me["controller"], "pid": child.pid, "pid_start": start}
        assert lookup.run(["dead_holder"], lease=lease) == [""]
        assert lookup.run(["dead_holder"], lease=dict(lease, controller="elsewhere")) == [""]
    finally:
        child.kill()
        child.wait()
    assert lookup.run(["dead_holder"], lease=lease) == ["A"]
    assert lookup.run(["dead_holder"], lease={}) == [""]
    with pytest.raises(AnsibleLookupError, match="unknown term"):
        lookup.run(["who"])

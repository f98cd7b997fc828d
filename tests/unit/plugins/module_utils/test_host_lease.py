# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""host_lease.plan() and holder_status(): held, expired, renewed, broken, taken over; a live, a dead
and a foreign holder of the lease."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import host_lease as hl

NOW = 2_000_000_000.0
HELD = {"run_id": "A", "operator": "alice", "play": "kernel_upgrade", "taken_at": NOW - 100, "expires_at": NOW + 600,
        "controller": "ctl", "pid": 10, "pid_start": 500}
EXPIRED = dict(HELD, expires_at=NOW - 1)


@pytest.mark.parametrize("current,kw,what", [
    (None, {}, "acquired"),
    (HELD, {"run_id": "A"}, "renewed"),
    (EXPIRED, {"break_expired": True}, "broken"),
    (HELD, {"take_over": "A"}, "taken_over"),
    (EXPIRED, {"state": "broken"}, "broken"),
    (HELD, {"run_id": "A", "state": "released"}, "released"),
    (None, {"state": "released"}, "unchanged"),
])
def test_plan(current, kw, what):
    args = {"state": "acquired", "run_id": "B", "now": NOW, "ttl": 600}
    args.update(kw)
    lease, got = hl.plan(current, **args)
    assert got == what
    if what == "released" or what == "unchanged":
        assert lease is None
    else:
        assert lease["run_id"] == args["run_id"] and lease["expires_at"] == NOW + 600


def test_a_renewal_keeps_the_holder_and_the_start():
    lease, _what = hl.plan(HELD, "renewed", "A", NOW, 60)
    assert (lease["taken_at"], lease["pid"], lease["operator"]) == (NOW - 100, 10, "alice")


@pytest.mark.parametrize("current,kw,text", [
    (HELD, {}, "held by run A of alice (play kernel_upgrade"),
    (EXPIRED, {}, "break its lease explicitly"),
    (HELD, {"state": "broken"}, "never broken"),
    (HELD, {"take_over": "Z"}, "held by run A"),
    (HELD, {"state": "released"}, "Only the holder releases it"),
    (None, {"state": "renewed"}, "holds no lease on this host any more"),
    (None, {"run_id": ""}, "run_id is empty"),
    (None, {"ttl": 0}, "ttl must be positive"),
])
def test_refusals_name_the_holder(current, kw, text):
    args = {"state": "acquired", "run_id": "B", "now": NOW, "ttl": 600}
    args.update(kw)
    with pytest.raises(hl.LeaseError) as err:
        hl.plan(current, **args)
    assert text in str(err.value)


def stat(start: int) -> str:
    return f"10 (ansible-playboo) S 1 10 10 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 {start} 100 10"


@pytest.mark.parametrize("lease,me,stats,status", [
    (None, {}, {}, "free"),
    (HELD, {"controller": "ctl", "pid": 10, "pid_start": 500}, {}, "mine"),
    (HELD, {"controller": "ctl", "pid": 11, "pid_start": 7}, {10: stat(500)}, "alive"),
    (HELD, {"controller": "ctl", "pid": 11, "pid_start": 7}, {}, "dead"),
    # the pid was reused by another process since: the holder is dead
    (HELD, {"controller": "ctl", "pid": 11, "pid_start": 7}, {10: stat(900)}, "dead"),
    (HELD, {"controller": "other", "pid": 11, "pid_start": 7}, {}, "elsewhere"),
])
def test_holder_status(lease, me, stats, status):
    assert hl.holder_status(lease, me, stats.get) == status


def test_proc_start_reads_this_process():
    with open(f"/proc/{os.getpid()}/stat", encoding="utf-8") as fh:
        assert hl.proc_start(fh.read()) > 0
    assert hl.proc_start(None) is None and hl.proc_start("garbage") is None


def test_parse_refuses_a_lease_without_expiry():
    with pytest.raises(hl.LeaseError, match="has no run_id or expires_at"):
        hl.parse('{"run_id": "A"}')
    assert hl.parse("") is None

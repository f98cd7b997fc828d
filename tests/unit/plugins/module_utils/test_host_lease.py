# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""host_lease.plan() and holder_status(): held, expired, renewed, broken, taken over; a live, a dead
and a foreign holder of the lease."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.lease import host_lease as hl
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host

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
    (None, {"ttl": 0}, "ttl must be whole seconds from 60 to 604800 (one week), got 0"),
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


# ---- bad values in a lease file and in the request: refused with what to do, never a traceback --------------
@pytest.mark.parametrize("expires", ["NaN", "Infinity", "-Infinity", "-1", "1e999", "10" * 200, '"soon"', "true", "null",
                                     "[1]", "253402300800"])
def test_parse_refuses_an_expiry_that_is_no_time(expires):
    with pytest.raises(hl.LeaseCorrupt) as err:
        hl.parse('{"run_id": "A", "expires_at": %s}' % expires, "/var/lib/gpufleet/lease.json")
    msg = str(err.value)
    assert "has expires_at" in msg and "not a time in seconds since 1970 from 0 to 253402300799" in msg, msg
    assert "nothing was changed" in msg and "state: broken" in msg and "rm /var/lib/gpufleet/lease.json" in msg, msg


@pytest.mark.parametrize("field", ["taken_at", "renewed_at"])
def test_parse_refuses_other_times_that_are_no_time(field):
    with pytest.raises(hl.LeaseCorrupt, match=f"has {field} nan"):
        hl.parse('{"run_id": "A", "expires_at": 5, "%s": NaN}' % field)


@pytest.mark.parametrize("text", ['{"run_id": 7, "expires_at": 5}', '[]', 'null', '{"expires_at": 5}'])
def test_parse_refuses_a_lease_without_a_run(text):
    with pytest.raises(hl.LeaseCorrupt, match="has no run_id or expires_at"):
        hl.parse(text)


@pytest.mark.parametrize("ttl", [59, 604801, 10 ** 30, True, 600.5, "600", None])
def test_plan_bounds_the_ttl_with_the_range_in_the_message(ttl):
    with pytest.raises(hl.LeaseError, match="ttl must be whole seconds from 60 to 604800"):
        hl.plan(None, "acquired", "B", NOW, ttl)


def test_a_renewal_never_takes_another_runs_lease_and_names_its_holder():
    """Renewing is for the holder only: with break_expired it still does not break another run's expired lease."""
    for current in (HELD, EXPIRED):
        with pytest.raises(hl.LeaseError) as err:
            hl.plan(current, "renewed", "B", NOW, 600, break_expired=True)
        assert "run B holds no lease on this host any more: it is held by run A of alice" in str(err.value)
        assert "this run must stop now" in str(err.value)


@pytest.mark.parametrize("pid", ["10", 10.0, None, -3, True])
def test_holder_status_of_a_lease_with_a_pid_that_is_no_process(pid):
    lease = dict(HELD, pid=pid)
    assert hl.holder_status(lease, {"controller": "ctl", "pid": 11, "pid_start": 7}, {}.get) == "elsewhere"


# ---- execute(): exclusive by the kernel's flock, read back after the write, check mode writes nothing ----------
def ask(run_id="B", state="acquired", **kw):
    return dict({"path": hl.LEASE, "state": state, "run_id": run_id, "ttl": 600, "operator": "bob", "play": "tune",
                 "break_expired": False, "holder": None, "take_over": ""}, **kw)


def on(fs):
    """The Host of host_lease's executor, which touches files only."""
    return Host(fs=fs, cmd=None, warn=None)


def lease_file(root):
    return root / hl.LEASE.lstrip("/")


def write_lease(root, lease):
    lease_file(root).parent.mkdir(parents=True, exist_ok=True)
    lease_file(root).write_text(json.dumps(lease))


def after(event, target, *args) -> None:
    """A process that waits for ``event``, then runs target(*args); its exit code says whether it returned."""
    event.wait(20)
    target(*args)


def test_a_take_waits_for_the_lock_that_another_process_holds(tmp_path):
    """While the lock file beside the lease is held, a take in another process writes nothing; it goes on
    once the lock is let go."""
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    child = ctx.Process(target=after, args=(go, hl.execute, ask(), on(HostFS(str(tmp_path))), False))
    child.start()  # before the lock is taken: a process forked while holding it would hold it too
    with HostFS(str(tmp_path)).lock(hl.lock_path(hl.LEASE)):
        go.set()
        time.sleep(0.5)
        assert child.is_alive() and not lease_file(tmp_path).exists()
    child.join(timeout=20)
    assert child.exitcode == 0 and json.loads(lease_file(tmp_path).read_text())["run_id"] == "B"


def hold_briefly(tmp_path, lock, timeout) -> None:
    try:
        with HostFS(str(tmp_path)).lock(lock, timeout=timeout):
            os._exit(1)
    except HostFSError as err:
        os._exit(0 if "cannot lock /var/lib/gpufleet/lease.json.lock: another process has held it for more than 0.2 s" in str(err)
                 else 2)


def test_a_lock_held_too_long_is_a_clear_error(tmp_path):
    lock = hl.lock_path(hl.LEASE)
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    child = ctx.Process(target=after, args=(go, hold_briefly, tmp_path, lock, 0.2))
    child.start()
    with HostFS(str(tmp_path)).lock(lock):
        go.set()
        child.join(timeout=20)
    assert child.exitcode == 0
    assert oct(os.stat(tmp_path / lock.lstrip("/")).st_mode & 0o777) == "0o600"


def test_a_lock_file_that_is_a_symlink_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    lock = tmp_path / hl.lock_path(hl.LEASE).lstrip("/")
    lock.parent.mkdir(parents=True)
    lock.symlink_to(target)
    with pytest.raises(HostFSError, match="cannot lock /var/lib/gpufleet/lease.json.lock"):
        with HostFS(str(tmp_path)).lock(hl.lock_path(hl.LEASE)):
            pass
    assert not target.exists()


class RacingWriter(HostFS):
    """A host where another process without the lock writes its own lease right after ours (an older release)."""

    def write_durable(self, host_path, data, mode=0o644):
        super().write_durable(host_path, data, mode)
        super().write_durable(host_path, hl.render(dict(HELD, run_id="C", expires_at=time.time() + 600)), mode)


def test_the_lease_is_read_back_after_the_write_and_a_foreign_one_stops_the_run(tmp_path):
    with pytest.raises(hl.LeaseError) as err:
        hl.execute(ask(), on(RacingWriter(str(tmp_path))), False)
    assert "names run C of alice" in str(err.value) and "right after run B wrote it" in str(err.value)
    assert "without holding /var/lib/gpufleet/lease.json.lock" in str(err.value)


@pytest.mark.parametrize("request_", [ask(), ask(state="renewed"), ask(run_id="A", state="released")])
def test_check_mode_takes_no_lock_and_writes_nothing(tmp_path, request_):
    if request_["state"] == "released":
        write_lease(tmp_path, dict(HELD, expires_at=time.time() + 600))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = hl.execute(request_, on(HostFS(str(tmp_path))), True)
    assert result["actions"] and sorted(p.name for p in tmp_path.rglob("*")) == before


def test_check_mode_renews_a_lease_its_check_mode_take_only_planned(tmp_path):
    assert hl.execute(ask(state="renewed"), on(HostFS(str(tmp_path))), True)["what"] == "acquired"
    with pytest.raises(hl.LeaseError, match="holds no lease on this host any more"):
        hl.execute(ask(state="renewed"), on(HostFS(str(tmp_path))), False)


def test_a_refusal_creates_no_lock_file(tmp_path):
    write_lease(tmp_path, dict(HELD, expires_at=time.time() + 600))
    with pytest.raises(hl.LeaseError, match="held by run A"):
        hl.execute(ask(), on(HostFS(str(tmp_path))), False)
    assert not (tmp_path / hl.lock_path(hl.LEASE).lstrip("/")).exists()


@pytest.mark.parametrize("request_", [ask(state="broken"), ask(break_expired=True)])
def test_a_corrupt_lease_is_broken_on_request(tmp_path, request_):
    lease_file(tmp_path).parent.mkdir(parents=True)
    lease_file(tmp_path).write_text('{"run_id": "A", "expires_at": NaN}')
    result = hl.execute(request_, on(HostFS(str(tmp_path))), False)
    assert (result["what"], result["previous"]) == ("broken", None)
    assert json.loads(lease_file(tmp_path).read_text())["run_id"] == "B"
    assert result["diff"]["before"] == '{"run_id": "A", "expires_at": NaN}\n'


def test_renew_is_the_locked_renewal_for_other_modules(tmp_path):
    fs = HostFS(str(tmp_path))
    hl.execute(ask(run_id="A"), on(fs), False)
    result = hl.renew(fs, "A", 900, False)
    assert (result["what"], result["lease"]["ttl"]) == ("renewed", 900)
    with pytest.raises(hl.LeaseError, match="run Z holds no lease on this host any more: it is held by run A"):
        hl.renew(fs, "Z", 900, False)


@pytest.mark.parametrize("path", ["", "lease.json", "/var/lib/gpufleet/", "/var/lib/\0lease.json"])
def test_a_lease_path_that_is_no_absolute_file_is_refused_before_any_read(tmp_path, path):
    with pytest.raises(hl.LeaseError, match="path must be an absolute path of a file on the host"):
        hl.execute(ask(path=path), on(HostFS(str(tmp_path))), False)
    assert not list(tmp_path.iterdir())

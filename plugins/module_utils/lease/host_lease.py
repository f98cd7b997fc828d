# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A per-host lease: one run at a time may reboot a host or write its devices.

The lease is a small JSON file on the host (``LEASE``: run id, operator, play, taken and expiry
times), so it holds across reboots and a lost controller, like kured's lock with its TTL. ``plan``
is pure: given the lease on the host (or None), the request and the time, it returns the lease to
write (or None to remove it) and what happened, or raises LeaseError naming the holder; the caller
then changes nothing. ``hold`` (and ``execute``, the module's run over the Host's files) makes it
exclusive: the read, the decision and the write happen under an ``flock`` of the lock file beside the
lease (``lock_path``), and the lease is read back after the write, so of two runs that take, renew or
break it at once exactly one wins.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host

LEASE = "/var/lib/gpufleet/lease.json"
FORMAT = "gpufleet.lease/1"
STATES = ("acquired", "renewed", "released", "broken")
TTL_MIN = 60
TTL_MAX = 7 * 24 * 3600
EPOCH_MAX = 253402300799  # 9999-12-31T23:59:59Z: the last second time.gmtime renders on every platform
TIMES = ("expires_at", "taken_at", "renewed_at")


class LeaseError(ValueError):
    """The lease cannot be taken or changed; the message names the holder and what to do."""


class LeaseCorrupt(LeaseError):
    """The lease file cannot be read as a lease (not JSON, no run id, an expiry that is no time)."""


def lock_path(path: str) -> str:
    """The lock file beside the lease: held across every read-decide-write of it, never removed."""
    return path + ".lock"


def _corrupt(path: str, why: str) -> LeaseCorrupt:
    return LeaseCorrupt(f"the lease {path} {why}: nothing was changed. If no run holds this host, break it "
                        f"(host_lease state: broken, or the playbook's -e host_lease_break_expired=true) or remove it "
                        f"(rm {path}), and run again.")


def valid_time(value: Any) -> bool:
    """A time in seconds since 1970 that a lease may hold: a finite number from 0 to EPOCH_MAX (no bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= EPOCH_MAX  # NaN compares False


def parse(text: str | None, path: str = LEASE) -> dict[str, Any] | None:
    """The lease in ``text`` (None when empty); LeaseCorrupt, saying what to do, when it is not one."""
    if text is None or not text.strip():
        return None
    try:
        data = json.loads(text)
    except ValueError as err:
        raise _corrupt(path, f"is not valid JSON ({err})") from None
    if not isinstance(data, dict) or not data.get("run_id") or not isinstance(data["run_id"], str) or "expires_at" not in data:
        raise _corrupt(path, "has no run_id or expires_at")
    for key in TIMES:
        if key in data and not valid_time(data[key]):
            raise _corrupt(path, f"has {key} {repr(data[key])[:40]}, not a time in seconds since 1970 from 0 to {EPOCH_MAX}")
    return data


def check_ttl(ttl: Any) -> None:
    """LeaseError unless ``ttl`` is whole seconds from TTL_MIN to TTL_MAX."""
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not TTL_MIN <= ttl <= TTL_MAX:
        raise LeaseError(f"ttl must be whole seconds from {TTL_MIN} to {TTL_MAX} (one week), got {ttl!r}: the lease must "
                         "last from one renewal to the next (the longest step between them, a reboot or a benchmark)")


def _utc(ts: Any) -> str:
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(ts)))
    except (TypeError, ValueError, OverflowError):
        return "?"


def describe(lease: dict[str, Any], now: float) -> str:
    left = lease["expires_at"] - now
    when = f"expires in {int(left)} s" if left > 0 else f"expired {int(-left)} s ago"
    where = f" on controller {lease['controller']} pid {lease.get('pid')}" if lease.get("controller") else ""
    return (f"run {lease['run_id']} of {lease.get('operator') or '?'} (play {lease.get('play') or '?'}{where}, "
            f"taken at {_utc(lease.get('taken_at'))}, {when})")


def plan(current: dict[str, Any] | None, state: str, run_id: str, now: float, ttl: int, operator: str = "",
         play: str = "", break_expired: bool = False, holder: dict[str, Any] | None = None,
         take_over: str = "") -> tuple[dict[str, Any] | None, str]:
    """(lease to write or None to remove, what: acquired/renewed/released/broken/taken_over/unchanged).

    ``holder``: the controller process that holds it (controller, pid, pid_start), kept in the lease;
    ``take_over``: the run id of a holder the controller found dead (see holder_status): its lease,
    expired or not, passes to this run."""
    if state not in STATES:
        raise LeaseError(f"state must be one of {', '.join(STATES)}, got {state!r}")
    if not run_id:
        raise LeaseError("run_id is empty: name the run that holds the lease (the playbook's run id)")
    check_ttl(ttl)
    mine = current is not None and current["run_id"] == run_id
    expired = current is not None and current["expires_at"] <= now

    def fresh(taken_at: float) -> dict[str, Any]:
        out = {"format": FORMAT, "run_id": run_id, "operator": operator, "play": play, "taken_at": taken_at,
               "renewed_at": now, "expires_at": now + ttl, "ttl": ttl}
        keep = holder or (current if mine else None) or {}
        for key in ("controller", "pid", "pid_start"):
            if keep.get(key) is not None:
                out[key] = keep[key]
        if mine:
            out["operator"] = operator or current.get("operator", "")
            out["play"] = play or current.get("play", "")
        return out

    if state == "released":
        if current is None:
            return None, "unchanged"
        if not mine:
            raise LeaseError(f"this host's lease is held by {describe(current, now)}, not by run {run_id}: nothing was "
                             "released. Only the holder releases it (or break an expired one).")
        return None, "released"
    if state == "broken":
        if current is None:
            return fresh(now), "acquired"
        if mine:
            return fresh(current.get("taken_at", now)), "renewed"
        if not expired:
            raise LeaseError(f"this host is held by {describe(current, now)}: a lease that has not expired is never "
                             "broken. Wait for that run to end, or stop it and let its lease expire.")
        return fresh(now), "broken"
    # acquired / renewed: a renewal only ever extends this run's own lease
    if state == "renewed" and not mine:
        raise LeaseError(lost(current, run_id, now))
    if current is None:
        return fresh(now), "acquired"
    if mine:
        return fresh(current.get("taken_at", now)), "renewed"
    if take_over and take_over == current["run_id"]:
        return fresh(now), "taken_over"
    if expired and break_expired:
        return fresh(now), "broken"
    if expired:
        raise LeaseError(f"this host is held by {describe(current, now)}: nothing was changed. If that run is dead, "
                         "break its lease explicitly (host_lease break_expired: true, or the playbook's "
                         "-e host_lease_break_expired=true).")
    raise LeaseError(f"this host is held by {describe(current, now)}: nothing was changed. Two runs must not reboot "
                     "or write the same host at once; wait for it to finish.")


def lost(current: dict[str, Any] | None, run_id: str, now: float) -> str:
    """Why run ``run_id`` cannot renew: the lease is gone, or another run holds it (named)."""
    if current is None:
        return (f"run {run_id} holds no lease on this host any more (it was released or broken): nothing was changed; "
                "the run must stop, since another one may have started.")
    return (f"run {run_id} holds no lease on this host any more: it is held by {describe(current, now)}. Nothing was "
            "changed; this run must stop now, since that run may be writing the host's devices or rebooting it.")


def render(lease: dict[str, Any]) -> str:
    return json.dumps(lease, indent=2, sort_keys=True) + "\n"


# ---- the holder's liveness, seen from the controller ------------------------------------------------
def proc_start(stat_text: str | None) -> int | None:
    """Start time (clock ticks since boot, field 22) from /proc/<pid>/stat; None when unreadable."""
    if not stat_text or ")" not in stat_text:
        return None
    fields = stat_text.rsplit(")", 1)[1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def holder_status(lease: dict[str, Any] | None, me: dict[str, Any], stat_of) -> str:
    """``free``, ``mine``, ``alive``, ``dead`` or ``elsewhere`` for the lease's holder, from this controller.

    A holder on this controller (same ``controller`` name) is ``dead`` when its ansible-playbook
    process (``pid`` with its ``pid_start``) no longer exists: a run killed with SIGKILL, whose lease
    a plain re-run from the same controller may take over. ``stat_of(pid)`` returns /proc/<pid>/stat
    text or None."""
    if not lease:
        return "free"
    if lease.get("pid") == me.get("pid") and lease.get("pid_start") == me.get("pid_start") and \
            lease.get("controller") == me.get("controller"):
        return "mine"
    pid = lease.get("pid")
    if not lease.get("controller") or lease.get("controller") != me.get("controller") or \
            isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return "elsewhere"  # no holder process this controller could look at
    start = proc_start(stat_of(pid))
    if start is None or start != lease.get("pid_start"):
        return "dead"
    return "alive"


def _breaks(p: dict) -> bool:
    return p["state"] == "broken" or (p["state"] == "acquired" and bool(p["break_expired"]))


def decide(p: dict, fs, check_mode: bool, now: float | None = None) -> dict:
    """Read the lease under ``fs`` and decide what ``p`` asks (no write): the result with ``actions`` and the
    ``diff``. A corrupt lease is refused, or replaced (``broken``) when ``p`` asks to break. In check mode a
    renewal of a free lease plans a take, as the check-mode take before it wrote nothing. Raises LeaseError."""
    check_ttl(p["ttl"])  # validate first, even for a query: a bad value is refused before any read
    path = p["path"]
    if not path or not path.startswith("/") or path.endswith("/") or "\0" in path:
        raise LeaseError(f"path must be an absolute path of a file on the host, got {path!r}: nothing was changed")
    text = fs.read_text(path, default="")
    try:
        current = parse(text, path)
    except LeaseCorrupt:
        if p["state"] == "query" or not _breaks(p):
            raise
        current = None
    now = time.time() if now is None else now
    if p["state"] == "query":
        return {"changed": False, "lease": current, "previous": current, "what": "unchanged", "actions": [], "diff": {}}
    state = "acquired" if check_mode and p["state"] == "renewed" and current is None else p["state"]
    lease, what = plan(current, state, p["run_id"], now, p["ttl"], p["operator"], p["play"], p["break_expired"],
                       p["holder"], p["take_over"])
    if text.strip() and current is None and lease is not None:
        what = "broken"  # a corrupt lease, replaced on request
    actions = []
    if what == "released":
        actions.append({"action": "remove_lease", "path": path, "what": what})
    elif lease is not None:
        actions.append({"action": "write_lease", "path": path, "what": what})
    return {"changed": bool(actions), "lease": lease, "previous": current, "what": what, "actions": actions,
            "diff": {"before": render(current) if current else (text + "\n" if text.strip() else ""), "after": render(lease) if lease else "",
                     "before_header": path, "after_header": path}}


def _confirm(fs, path: str, lease: dict[str, Any], now: float) -> None:
    """Read the lease back after the write: it must be the one written (the compare after the write)."""
    back = parse(fs.read_text(path, default=""), path)
    if back is None or back.get("run_id") != lease["run_id"] or back.get("renewed_at") != lease["renewed_at"]:
        holder = describe(back, now) if back else "no run (the file is gone)"
        raise LeaseError(f"the lease {path} names {holder} right after run {lease['run_id']} wrote it: another process "
                         f"wrote it at the same time without holding {lock_path(path)} (an older release of this "
                         "collection, or a hand edit). This run does not hold the host: it stops here.")


def execute(params: dict, host: Host, check_mode: bool) -> dict:
    """What gpufleet.inference.host_lease executes: ``hold()`` over the Host's files (``host.fs``)."""
    return hold(params, host.fs, check_mode)


def hold(p: dict, fs, check_mode: bool, now: float | None = None) -> dict:
    """Take, renew, release, break or read the lease file under ``fs`` as ``p`` asks; the result with
    ``actions`` and the ``diff``. Raises LeaseError.

    A change is decided twice: first without the lock (a refusal, a no-op and check mode end there, and
    create no lock file), then again under the exclusive lock (``fs.lock`` on ``lock_path``) that the
    write and the read-back happen under, so that two runs never both win."""
    seen = decide(p, fs, check_mode, now)
    if check_mode or not seen["actions"]:
        return seen
    path = p["path"]
    with fs.lock(lock_path(path)):
        result = decide(p, fs, check_mode, now)
        lease = result["lease"]
        if result["what"] == "released":
            fs.remove(path)
        elif lease is not None:
            fs.write_durable(path, render(lease), 0o644)
            _confirm(fs, path, lease, lease["renewed_at"])
    return result


def renew(fs, run_id: str, ttl: int, check_mode: bool, now: float | None = None, path: str = LEASE) -> dict:
    """Renew run ``run_id``'s lease under the lock, as ``hold`` does (for modules that renew it at every
    step, such as kernel_rollout_step). LeaseError naming the holder when this run no longer holds it."""
    p = {"path": path, "state": "renewed", "run_id": run_id, "ttl": ttl, "operator": "", "play": "",
         "break_expired": False, "holder": None, "take_over": ""}
    return hold(p, fs, check_mode, now)

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A per-host lease: one run at a time may reboot a host or write its devices.

The lease is a small JSON file on the host (``LEASE``: run id, operator, play, taken and expiry
times), so it holds across reboots and a lost controller, like kured's lock with its TTL. ``plan``
is pure: given the lease on the host (or None), the request and the time, it returns the lease to
write (or None to remove it) and what happened, or raises LeaseError naming the holder; the caller
then changes nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any

LEASE = "/var/lib/gpufleet/lease.json"
FORMAT = "gpufleet.lease/1"
STATES = ("acquired", "renewed", "released", "broken")


class LeaseError(ValueError):
    """The lease cannot be taken or changed; the message names the holder and what to do."""


def parse(text: str | None, path: str = LEASE) -> dict[str, Any] | None:
    if text is None or not text.strip():
        return None
    try:
        data = json.loads(text)
    except ValueError as err:
        raise LeaseError(f"the lease {path} is not valid JSON ({err}): nothing was changed. If no run holds this host, "
                         f"remove it (rm {path}) and run again.") from None
    if not isinstance(data, dict) or not data.get("run_id") or not isinstance(data.get("expires_at"), (int, float)):
        raise LeaseError(f"the lease {path} has no run_id or expires_at: nothing was changed. If no run holds this host, "
                         f"remove it (rm {path}) and run again.")
    return data


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
    if ttl <= 0:
        raise LeaseError(f"ttl must be positive seconds, got {ttl}")
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
    # acquired / renewed
    if current is None:
        if state == "renewed":
            raise LeaseError(f"run {run_id} holds no lease on this host any more (it was released or broken): nothing "
                             "was changed; the run must stop, since another one may have started.")
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
    if not lease.get("controller") or lease.get("controller") != me.get("controller") or not lease.get("pid"):
        return "elsewhere"
    start = proc_start(stat_of(int(lease["pid"])))
    if start is None or start != lease.get("pid_start"):
        return "dead"
    return "alive"


def execute(p: dict, fs, check_mode: bool) -> dict:
    """Take, renew, release, break or read the lease file under ``fs`` as ``p`` asks; the result with
    ``actions`` and the ``diff``. Raises LeaseError."""
    path = p["path"]
    current = parse(fs.read_text(path, default=""), path)
    now = time.time()
    if p["state"] == "query":
        return {"changed": False, "lease": current, "previous": current, "what": "unchanged", "actions": [], "diff": {}}
    lease, what = plan(current, p["state"], p["run_id"], now, p["ttl"], p["operator"], p["play"], p["break_expired"],
                       p["holder"], p["take_over"])
    actions = []
    if what == "released":
        actions.append({"action": "remove_lease", "path": path, "what": what})
    elif lease is not None:
        actions.append({"action": "write_lease", "path": path, "what": what})
    if actions and not check_mode:
        if lease is None:
            fs.remove(path)
            fs.fsync_dir(path)
        else:
            fs.write_durable(path, render(lease), 0o644)
    return {"changed": bool(actions), "lease": lease, "previous": current, "what": what, "actions": actions,
            "diff": {"before": render(current) if current else "", "after": render(lease) if lease else "",
                     "before_header": path, "after_header": path}}

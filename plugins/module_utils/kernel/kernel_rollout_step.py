# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.kernel_rollout_step executes: read the host (kernel/journal.py), check
the host's lease (lease/host_lease.py), take one step of the state machine (kernel/flow.py), then renew the
lease and write the journal it returns. A refused step is a result (``next_action`` finish/refused), not an
error, and writes nothing; HostFSError from the reads and writes is raised, never fail_json-ed here.
"""

from __future__ import annotations

import math
import time
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.lease import host_lease as lease_utils
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.upgrade import KernelUpgradeError, validate_version
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.flow import (
    EVENTS as FLOW_EVENTS, FlowError, finish, record_facts, step,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.journal import (
    DPKG_STATUS, boot_id, dump, health_result, installed_packages, load_journal, running_kernel, save_journal,
    saved_default, uptime,
)

EVENTS = list(FLOW_EVENTS)


def read_lease(fs: HostFS) -> dict[str, Any] | None:
    """The host's lease (host_lease's parser), or None; LeaseError when it cannot be trusted (an expiry that
    is not a finite time included, which host_lease's own checks could not compare)."""
    path = lease_utils.LEASE
    current = lease_utils.parse(fs.read_text(path, default=""), path)
    expires = current and current.get("expires_at")
    if current is not None and (isinstance(expires, bool) or not math.isfinite(expires)):
        raise lease_utils.LeaseError(f"the lease {path} has expires_at {expires!r}, not a time: nothing was changed. If "
                                     f"no run holds this host, remove it (rm {path}) and run again.")
    return current


def plan_lease(p: dict, current: dict[str, Any] | None, check_mode: bool, now: float) -> tuple[dict | None, str]:
    """(the lease to write, what happened to it) for this step; (None, '') when nothing is written.

    With ``lease_run_id`` this run's lease is renewed (LeaseError when another run holds it). Without, no
    lease is written, but a live lease of another run (not ``run_id``) still refuses: a step outside the
    playbook must not change a host that a running rollout holds."""
    if not p["lease_run_id"]:
        if current is not None and current["expires_at"] > now and current["run_id"] != p["run_id"]:
            raise lease_utils.LeaseError(
                f"this host is held by {lease_utils.describe(current, now)}, and this step holds no lease "
                "(lease_run_id is empty): nothing was changed. Wait for that run to end, or run the upgrade through "
                "playbooks/kernel_upgrade.yml, which takes the host's lease.")
        return None, ""
    if check_mode and current is None:
        return None, "acquired"  # a check-mode run took its lease only on paper: another run's lease would still refuse it
    return lease_utils.plan(current, "renewed", p["lease_run_id"], now, p["lease_ttl"])


def take_over_reason(p: dict, journal: dict[str, Any] | None, lease_what: str) -> str:
    """Why this run may resume a journal another run started: it holds the host's lease under its own run id,
    or it names that journal's run in ``take_over``; '' when it may not."""
    if journal is None:
        return ""
    if p["lease_run_id"] and p["lease_run_id"] == p["run_id"] and lease_what:
        return f"run {p['run_id']} holds the host's lease ({lease_what})"
    if p.get("take_over") and p["take_over"] == (journal.get("run_id") or ""):
        return f"take_over: {p['take_over']} was asked for"
    return ""


def observe(p: dict, fs: HostFS, check_mode: bool, now: float, running: str, default: str | None) -> dict[str, Any]:
    return {"event": p["event"], "data": p["data"] or {}, "preflight": p["preflight"] or {}, "running": running,
            "default": default, "boot_id": boot_id(fs), "uptime": uptime(fs), "now": now, "target": p["target"],
            "run_id": p["run_id"], "installed_packages": installed_packages(fs.read_optional(DPKG_STATUS)),
            "health": health_result(fs),
            "settings": {"reboot_ok": p["reboot_ok"], "check_mode": check_mode, "lock": p["lock"],
                         "lock_packages": p["lock_packages"], "verify_pcie": p["verify_pcie"], "headers": p["headers"],
                         "outputs": p.get("outputs", True), "stability": p.get("stability", True),
                         "commit_timeout": p["commit_timeout"], "gate": p["gate"] or {}}}


def execute(p: dict, host: Host, check_mode: bool, now: float | None = None) -> dict[str, Any]:
    """One step: observe the host, decide, then (outside check mode, and only when the step is not refused)
    renew the lease and write the journal; the next action. A refused step writes nothing. ``now``: the clock, for tests."""
    fs = host.fs
    now = time.time() if now is None else now
    running = running_kernel(fs)
    default, saved = saved_default(fs)
    base = {"running": running, "default_version": default, "saved_entry": saved}
    try:
        validate_version(p["target"], "target")
        journal = load_journal(fs, p["journal"])
        lease, what = plan_lease(p, read_lease(fs), check_mode, now)
        obs = dict(observe(p, fs, check_mode, now, running, default), take_over=take_over_reason(p, journal, what))
        new, action = step(journal, obs)
    except (FlowError, lease_utils.LeaseError, KernelUpgradeError) as err:
        action = finish("refused", str(err))
        new = journal = None
    if action.get("decision") == "refused":
        return dict(base, changed=False, next_action=action, journal=None, record=record_facts(journal, action),
                    actions=[], diff={})
    if lease and not check_mode:
        try:  # under the lease's lock, decided again and read back (host_lease): a run that lost it writes nothing
            lease_utils.renew(fs, p["lease_run_id"], p["lease_ttl"], False, now)
        except lease_utils.LeaseError as err:
            action = finish("refused", str(err))
            return dict(base, changed=False, next_action=action, journal=None, record=record_facts(journal, action),
                        actions=[], diff={})
    actions = [{"action": "renew_lease", "path": lease_utils.LEASE, "what": what}] if lease else []
    if new and len(new.get("taken_over") or []) > len((journal or {}).get("taken_over") or []):
        actions.append(dict(new["taken_over"][-1], action="take_over_journal"))
    if new is not None and new != journal:
        if check_mode:
            actions.append({"action": "write_journal", "path": p["journal"], "stage": new["stage"]})
        else:
            actions += save_journal(fs, new, p["journal"])
    diff = {"before": dump(journal) if journal else "", "after": dump(new) if new else "",
            "before_header": p["journal"], "after_header": p["journal"]}
    return dict(base, changed=bool(actions), next_action=action, journal=new, record=record_facts(new or journal, action),
                actions=actions, diff=diff)

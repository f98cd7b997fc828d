# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One step of a change, as every kind's step module takes it: check the host's lease (lease/host_lease.py), say why
this run may take over a journal another run started, take one step of the change flow (change/flow.py), then renew
the lease and write the journal it returns (change/journal.py). A refused step is a result (``next_action``
finish/refused), not an error, and writes nothing; HostFSError from the reads and writes is raised, never fail_json-ed
here. The kind's executor reads the host (what runs, its journal) and calls ``take_step``.

``step_argument_spec`` is the argument spec the kinds' step modules share (documented once, by the doc fragment
``gpufleet.inference.change_step``); a module adds its own options to it.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils.change import flow
from ansible_collections.gpufleet.inference.plugins.module_utils.change.journal import dump, save_journal
from ansible_collections.gpufleet.inference.plugins.module_utils.lease import host_lease as lease_utils


def step_argument_spec(events: tuple[str, ...], journal: str, verify_pcie: bool = False,
                       **own: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The argument spec of a kind's step module: the options every kind shares (the doc fragment
    ``gpufleet.inference.change_step`` documents them), its ``events``, its journal's default path, its PCIe audit
    default, and its ``own`` options (which may not redefine a shared one)."""
    spec: dict[str, dict[str, Any]] = dict(
        target=dict(type="str", required=True),
        event=dict(type="str", choices=list(events), default="start"),
        data=dict(type="dict", default={}),
        run_id=dict(type="str", default=""),
        lock=dict(type="bool", default=True),
        verify_pcie=dict(type="bool", default=verify_pcie),
        outputs=dict(type="bool", default=True),
        stability=dict(type="bool", default=True),
        gate=dict(type="dict", default={}),
        journal=dict(type="path", default=journal),
        lease_run_id=dict(type="str", default=""),
        take_over=dict(type="str", default=""),
        lease_ttl=dict(type="int", default=7200),
        preflight=dict(type="dict", default={}),
        root=dict(type="path", default="/"),
    )
    clash = sorted(set(own) & set(spec))
    if clash:
        raise ValueError(f"step_argument_spec: {', '.join(clash)} is a shared option of every step module; "
                         "change it in change/step.py (and the doc fragment change_step), not in one module")
    spec.update(own)
    return spec


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


def plan_lease(p: dict, current: dict[str, Any] | None, check_mode: bool, now: float,
               playbook: str = "kernel_upgrade") -> tuple[dict | None, str]:
    """(the lease to write, what happened to it) for this step; (None, '') when nothing is written.

    With ``lease_run_id`` this run's lease is renewed (LeaseError when another run holds it). Without, no
    lease is written, but a live lease of another run (not ``run_id``) still refuses: a step outside the
    playbook (``playbooks/<playbook>.yml``) must not change a host that a running change holds."""
    if not p["lease_run_id"]:
        if current is not None and current["expires_at"] > now and current["run_id"] != p["run_id"]:
            raise lease_utils.LeaseError(
                f"this host is held by {lease_utils.describe(current, now)}, and this step holds no lease "
                "(lease_run_id is empty): nothing was changed. Wait for that run to end, or run the upgrade through "
                f"playbooks/{playbook}.yml, which takes the host's lease.")
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


def refused(kind: flow.ChangeKind, base: dict, journal: dict | None, msg: str) -> dict[str, Any]:
    action = flow.finish("refused", msg)
    return dict(base, changed=False, next_action=action, journal=None, record=flow.record_facts(kind, journal, action),
                actions=[], diff={})


# pylint: disable-next=too-many-arguments
def take_step(kind: flow.ChangeKind, p: dict, fs: HostFS, check_mode: bool, now: float, base: dict,
              load: Callable[[], dict | None], observe: Callable[[], dict], history_dir: str,
              errors: tuple = ()) -> dict[str, Any]:
    """One step: load the journal, plan the lease, decide (``observe()`` gives the observation), then (outside check
    mode, and only when the step is not refused) renew the lease and write the journal; the module's result.
    ``errors``: the kind's own exceptions that refuse the step like FlowError (a target it cannot accept)."""
    try:
        journal = load()
        lease, what = plan_lease(p, read_lease(fs), check_mode, now, kind.var_prefix)
        obs = dict(observe(), take_over=take_over_reason(p, journal, what))
        new, action = flow.step(kind, journal, obs)
    except (flow.FlowError, lease_utils.LeaseError) + tuple(errors) as err:
        return refused(kind, base, None, str(err))
    if action.get("decision") == "refused":
        return dict(base, changed=False, next_action=action, journal=None,
                    record=flow.record_facts(kind, journal, action), actions=[], diff={})
    if lease and not check_mode:
        try:  # under the lease's lock, decided again and read back (host_lease): a run that lost it writes nothing
            lease_utils.renew(fs, p["lease_run_id"], p["lease_ttl"], False, now)
        except lease_utils.LeaseError as err:
            return refused(kind, base, journal, str(err))
    actions = [{"action": "renew_lease", "path": lease_utils.LEASE, "what": what}] if lease else []
    if new and len(new.get("taken_over") or []) > len((journal or {}).get("taken_over") or []):
        actions.append(dict(new["taken_over"][-1], action="take_over_journal"))
    if new is not None and new != journal:
        if check_mode:
            actions.append({"action": "write_journal", "path": p["journal"], "stage": new["stage"]})
        else:
            actions += save_journal(fs, new, p["journal"], history_dir)
    diff = {"before": dump(journal) if journal else "", "after": dump(new) if new else "",
            "before_header": p["journal"], "after_header": p["journal"]}
    return dict(base, changed=bool(actions), next_action=action, journal=new,
                record=flow.record_facts(kind, new or journal, action), actions=actions, diff=diff)

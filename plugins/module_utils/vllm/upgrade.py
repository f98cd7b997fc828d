# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM upgrade, one kind of change on the shared change flow (change/flow.py): ``VLLM``.

The vllm_service role installs vLLM into versioned venvs under its base directory and points the unit at one of them
through the ``current`` link. An upgrade keeps that shape: the baseline is measured on the version ``current`` points
at (the audit and the output reference too), the candidate is installed into its own venv beside it (``install``;
the old venv is never touched), the vLLM on ``current``'s old target is asked for its kernel path first, then
``current`` is switched to the candidate and the unit restarted (``switch``), and vllm_ready proves it serves and reads
the kernel path vLLM chose from its start log. A start-log finding (a fallback, a warning) that the old version did
not have is a finding of the verification: it fails it (``findings: fail``, the default) or is named in the verdict
(``findings: note``). Then the shared candidate rounds, the checks and the serving verdict; ``pass`` keeps the
candidate, anything else points ``current`` back at the old venv and restarts the unit. No reboot, ever.

Stages of the kind: ``installed`` (the candidate venv is built and checked; ``current`` still points at the old one;
the next action switches) and ``switched`` (``current`` points at the candidate and the unit was restarted: the
verification is next). ``running`` and ``default`` in the observation are both the version of the venv ``current``
points at (``.gpufleet-complete``'s ``version``): the flow compares them with ``old`` and ``target``.
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.change import flow
from ansible_collections.gpufleet.inference.plugins.module_utils.change.flow import (
    SHARED_EVENTS, ChangeKind, FlowError, kind_actions, kind_stages,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.change.shapes import (
    is_dict, is_text, list_of, optional,
)

JOURNAL_FORMAT = "gpufleet.vllm_upgrade_journal/1"
STATE_DIR = "/var/lib/gpufleet/vllm_upgrade"
JOURNAL = STATE_DIR + "/journal.json"
HISTORY_DIR = STATE_DIR + "/history"
STAGES = kind_stages("installed", "switched")
EVENTS = SHARED_EVENTS + ("installed", "switched")
# Every action the flow answers on a vLLM upgrade, and the event its task file (roles/vllm_upgrade/tasks/
# action_<name>.yml) reports.
ACTIONS = kind_actions(("install", "installed"), ("switch", "switched"))
# Start-log findings of these severities count at the verification (info findings only describe the path).
FINDING_SEVERITIES = ("warning", "error")
FINDINGS_MODES = ("fail", "note")
# A version as pip names it (PEP 440 characters); it names a venv and a history file, so no path separator.
VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+!_-]{0,63}$")


class VersionError(ValueError):
    """A vLLM version that cannot name a venv or a history file."""


def validate_version(value: Any, what: str) -> str:
    if not isinstance(value, str) or not VERSION.match(value):
        raise VersionError(f"{what} {value!r} is not a vLLM version (letters, digits and . + ! _ - only, as pip "
                           "prints it, for example 0.33.1): nothing was changed")
    return value


# ---- before any journal ------------------------------------------------------------------------------
def fresh(obs: dict[str, Any]) -> tuple[str, str]:
    """(decision, reason) on a host with no vLLM upgrade in progress; decision '' means: go."""
    pre, target, s, running = obs.get("preflight") or {}, obs["target"], obs["settings"], obs["running"]
    if running is None:
        return "refused", (f"the vLLM unit's venv link {obs.get('current_link')} points at no finished vLLM venv "
                           f"({obs.get('current_venv') or 'no link'}): nothing is changed. Install the current version "
                           "with the vllm_service role (playbooks/serve.yml) first, then upgrade from it.")
    if running == target:
        return "already", f"vLLM {target} is current already ({obs.get('current_venv')})"
    if not pre.get("ok", True):
        return "preflight_failed", pre.get("msg") or "preflight failed"
    if s.get("check_mode") or not s.get("restart_ok"):
        reason = (f"would: benchmark vLLM {running} ({obs.get('current_venv')}), audit the host and record its outputs, "
                  f"install vLLM {target} into a venv beside it, point {obs.get('current_link')} at it and restart the "
                  "unit, prove it ready and compare its kernel path, benchmark, gate, compare outputs and health; keep "
                  "it or point the link back and restart (no reboot)")
        if not s.get("check_mode"):
            reason += ". Set vllm_upgrade_restart_ok: true to do it"
        return "planned", reason
    return "", ""


def journal_extra(obs: dict[str, Any]) -> dict[str, Any]:
    """The vLLM upgrade's fields of a new journal: the old venv (kept until the change is committed), the
    candidate's (once installed), the old version's start-log findings, the verification."""
    return {"old_venv": obs.get("current_venv"), "target_venv": None, "switched": None, "path_before": None,
            "verify": None}


def lock_action(name: str, version: str, obs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The lock, commit and rollback actions. vLLM has no package to hold: what is held is the host (the lease) and
    the unit's venv link, which only this flow moves while a journal is open (the vllm_service role refuses to)."""
    action = {"name": name, "version": version, "lock": bool(obs["settings"].get("lock", True)), "hold": []}
    action.update(extra)
    return action


def install_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    return {"name": "install", "version": journal["target"], "old": journal["old"], "old_venv": journal.get("old_venv")}


def switch_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    return {"name": "switch", "version": journal["target"], "venv": journal["target_venv"], "restart": True}


def commit_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    return lock_action("commit", journal["target"], obs, venv=journal.get("target_venv"),
                       old_venv=journal.get("old_venv"))


def rollback_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    """Point the link back at the old venv and restart the unit: always once the candidate was switched to (a
    rollback lost between the link and the restart leaves the unit on the candidate's binary with the old link)."""
    restart = bool(journal.get("switched")) or obs["running"] != journal["old"]
    return lock_action("rollback", journal["old"], obs, venv=journal.get("old_venv"), restart=restart,
                       candidate_venv=journal.get("target_venv"))


# ---- the kind's steps ----------------------------------------------------------------------------------
def path_findings(kernel_path: Any) -> list[dict[str, str]]:
    """The start-log findings that count (warning, error) of vllm_ready's ``kernel_path``, as {id, severity, message}."""
    findings = (kernel_path or {}).get("findings") if isinstance(kernel_path, dict) else None
    return [{"id": str(f.get("id")), "severity": str(f.get("severity")), "message": str(f.get("message") or "")}
            for f in findings or [] if isinstance(f, dict) and f.get("severity") in FINDING_SEVERITIES]


def new_path_findings(before: list[dict[str, str]] | None, after: list[dict[str, str]]) -> list[dict[str, str]]:
    """Findings of the candidate's start that the old version's start did not have (by id)."""
    seen = {f["id"] for f in before or []}
    return [f for f in after if f["id"] not in seen]


def on_installed(journal, obs):
    """The candidate venv is built beside the old one (or the build failed: nothing was switched, rolled back)."""
    data = obs["data"]
    install = data.get("install") or {}
    if flow.truthy(install.get("failed")) or not data.get("venv"):
        why = install.get("msg") or "the install reported no venv"
        return flow.verdict(VLLM, journal, obs, "preflight_failed", (
            f"the install of vLLM {journal['target']} beside {journal['old']} failed: {why}. Nothing was switched: the "
            f"unit still runs {journal['old']} from {journal.get('old_venv')}"))
    if data.get("version") != journal["target"]:
        return flow.verdict(VLLM, journal, obs, "preflight_failed", (
            f"the venv {data['venv']} holds vLLM {data.get('version')}, not {journal['target']}: look at the wheelhouse "
            "or the index it was installed from. Nothing was switched"))
    if data["venv"] == journal.get("old_venv"):
        raise FlowError(f"the candidate venv {data['venv']} is the old one: the install must build beside it")
    journal["target_venv"] = data["venv"]
    journal["path_before"] = path_findings((data.get("ready_before") or {}).get("kernel_path"))
    flow.stamp(journal, obs, "installed", f"vLLM {journal['target']} installed in {data['venv']}")
    return journal, switch_action(journal, obs)


def on_switched(journal, obs):
    """The unit runs the candidate's venv: its readiness and its kernel path against the old version's."""
    data = obs["data"]
    journal["switched"] = {"at": obs["now"], "venv": journal.get("target_venv")}
    if obs["running"] != journal["target"]:
        return away(journal, obs, "the switch")
    ready = data.get("ready") or {}
    problems, notes = [], []
    if not flow.truthy(ready.get("ok")):
        problems.append(f"the inference server is not ready on vLLM {journal['target']}: {ready.get('msg') or '?'}")
    fresh_findings = new_path_findings(journal.get("path_before"), path_findings(ready.get("kernel_path")))
    if fresh_findings:
        text = "new start-log findings that vLLM " + journal["old"] + " did not have: " + "; ".join(
            f"{f['id']} ({f['severity']}): {f['message']}" for f in fresh_findings)
        (problems if obs["settings"].get("findings", "fail") == "fail" else notes).append(text)
    journal["verify"] = {"problems": problems, "notes": notes, "new_findings": fresh_findings, "at": obs["now"]}
    if problems:
        return flow.verdict(VLLM, journal, obs, "verify_failed",
                            f"vLLM {journal['target']} was switched to but {'; '.join(problems)}")
    return flow.candidate_round(VLLM, journal, obs, "verified")


def away(journal, obs, when: str):
    """The unit's link does not point at the candidate where it must: moved outside this flow."""
    return flow.verdict(VLLM, journal, obs, "reverted", (
        f"during {when} the unit's venv link points at vLLM {obs['running']} ({obs.get('current_venv')}), not at "
        f"{journal['target']} ({journal.get('target_venv')}): it was moved outside this flow (an operator, or a "
        "vllm_service run)"))


def resume(journal, obs):
    """A new run finds the journal at installed (switch again: the link, the restart and the readiness are
    idempotent) or switched (the readiness again, through the switch)."""
    if journal["stage"] == "installed" and obs["running"] not in (journal["old"], journal["target"]):
        return away(journal, obs, "stage installed")
    return journal, switch_action(journal, obs)


def commit_check(journal: dict[str, Any], obs: dict[str, Any]) -> tuple[str, str]:
    if obs["running"] != journal["target"]:
        return (f"the unit's venv link points at vLLM {obs['running']} ({obs.get('current_venv')}), expected "
                f"{journal['target']} ({journal.get('target_venv')})", "")
    return "", f"vLLM {journal['target']} is current ({journal.get('target_venv')})"


def rollback_check(journal: dict[str, Any], obs: dict[str, Any]) -> tuple[str, str]:
    if obs["running"] != journal["old"]:
        return (f"the unit's venv link points at vLLM {obs['running']} ({obs.get('current_venv')}), expected "
                f"{journal['old']} ({journal.get('old_venv')})",
                f"check ls -l {obs.get('current_link')} and systemctl status of the unit")
    return "", ""


def check_findings_mode(settings: dict[str, Any], var_prefix: str) -> None:
    """The ``findings`` setting of a kind that reads the start log (vLLM, NCCL): FlowError naming <var_prefix>_findings."""
    mode = settings.get("findings", "fail")
    if mode not in FINDINGS_MODES:
        raise FlowError(f"findings {mode!r} is not one of {', '.join(FINDINGS_MODES)}: set {var_prefix}_findings to "
                        "fail (a new start-log warning fails the verification) or note (it is named in the verdict); "
                        "nothing was changed")


def check_settings(settings: dict[str, Any]) -> None:
    check_findings_mode(settings, "vllm_upgrade")


def _finding_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(f, dict) and isinstance(f.get("id"), str) for f in value)


JOURNAL_FIELDS = {
    "old_venv": (optional(is_text), "a venv path"), "target_venv": (optional(is_text), "a venv path"),
    "switched": (optional(is_dict), "the switch record"), "verify": (optional(is_dict), "the verification"),
    "path_before": (optional(_finding_list), "a list of start-log findings (id, severity)"),
}
EVENT_FIELDS = {
    "benchmarked": {"version": (optional(is_text), "a vLLM version")},
    "installed": {"venv": (optional(is_text), "the candidate venv's path"), "version": (optional(is_text), "a vLLM "
                  "version"), "install": (optional(is_dict), "the install's answer"),
                  "ready_before": (optional(is_dict), "vllm_ready's answer on the old version")},
    "switched": {"ready": (optional(is_dict), "vllm_ready's answer on the candidate")},
    "committed": {"removed": (optional(list_of(is_text)), "a list of venv paths")},
}
EVENT_NESTED = {"switched": ("ready", {"msg": optional(is_text)}), "installed": ("install", {"msg": optional(is_text)})}
PREFLIGHT_FIELDS = {"msg": (optional(is_text), "text")}

VLLM = ChangeKind(
    name="vllm", journal_format=JOURNAL_FORMAT, var_prefix="vllm_upgrade", gate_change="vllm_version",
    side_key="version", side_what="a vLLM version", stages=STAGES, events=EVENTS,
    handlers={"installed": (("baseline",), on_installed), "switched": (("installed",), on_switched)},
    fresh=fresh, journal_extra=journal_extra, lock=lock_action, commit=commit_action, change=install_action, rollback=rollback_action,
    resume=resume, away=away, commit_check=commit_check, rollback_check=rollback_check,
    serving="the vLLM unit's venv link points at the version that should serve", state_dir=STATE_DIR,
    step_module="vllm_upgrade_step", first_change="the install", actions=ACTIONS, check_settings=check_settings,
    journal_fields=JOURNAL_FIELDS, event_fields=EVENT_FIELDS, event_nested=EVENT_NESTED,
    preflight_fields=PREFLIGHT_FIELDS)


def step(journal: dict[str, Any] | None, obs: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """One transition of the vLLM upgrade (change/flow.py step)."""
    return flow.step(VLLM, journal, obs)


def check_journal(journal: Any, path: str) -> dict[str, Any]:
    journal = flow.check_journal(VLLM, journal, path)
    try:
        validate_version(journal["target"], f"the upgrade journal {path}'s target")
        validate_version(journal["old"], f"the upgrade journal {path}'s old version")
    except VersionError as err:
        raise FlowError(f"{err}. Move the journal away (mv {path} {path}.broken) if no upgrade should be in progress, "
                        "or repair it.") from None
    return journal

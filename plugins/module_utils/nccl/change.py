# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An NCCL settings change (the ``nccl_env`` profile, its settings and the P2P choice), one kind of change on the shared
change flow (change/flow.py): ``NCCL``.

The NCCL settings live in two files (env.py): the file NCCL reads (``/etc/nccl.conf``) and the EnvironmentFile the
vLLM unit loads (``/etc/gpufleet/nccl.env``); the running vLLM holds what the EnvironmentFile said when it started, in
its environment (``/proc/MAINPID/environ``). A change keeps that shape: the baseline is measured on the settings the
service runs (the audit and the output reference too), the original bytes of both files (or that a file did not exist)
are recorded in the journal, the candidate is checked first (nccl_env's validation and the host lint's rules on NCCL
settings: unknown keys, bad values, known-harmful settings are refused before anything changes), written and read back
(``install``, no restart), the unit restarted (``activate``), and the running process's environment must hold exactly
the candidate's values, with vllm_ready proving it serves (a new start-log finding fails it, as in the vLLM kind). Then
the shared candidate rounds, the checks and the serving verdict; ``pass`` keeps the candidate, anything else puts the
original bytes back (or removes a file that did not exist), restarts the unit and checks the original environment.

Names: a set of settings is named by env.py's ``settings_id`` (``nccl-`` and 12 hex digits of its SHA-256, ``nccl-none`` for no
setting at all), over the *managed view*: every ``NCCL_*`` variable and the other variables (CUDA_*, TORCH_*) that the
old or the candidate settings name. ``running`` in the observation is the name of the view of the unit's main process'
environment (None when the unit has no main process or its environment cannot be read), ``default`` the name of the
view of the EnvironmentFile (what a restart brings up); the journal's ``old`` and ``target`` are such names, and its
``old_settings`` and ``target_settings`` the settings themselves.

Stages of the kind: ``installing`` (written before the files are: a run that finds it writes them again), ``installed``
(the candidate's files are written and read back, the old settings still run: the restart is next) and ``activated``
(the restart was asked for: the verification is next; a resumed run does not restart again when the candidate runs).
"""

from __future__ import annotations

import json
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.change import flow
from ansible_collections.gpufleet.inference.plugins.module_utils.change.flow import (
    SHARED_EVENTS, ChangeKind, kind_actions, kind_stages,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.change.shapes import (
    is_dict, is_text, list_of, optional,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.lint.host_lint import Setting, rule_nccl
from ansible_collections.gpufleet.inference.plugins.module_utils.nccl.env import (
    NcclEnvError, is_nccl_key, settings_id, validate,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.vllm.upgrade import (
    check_findings_mode, new_path_findings, path_findings,
)

JOURNAL_FORMAT = "gpufleet.nccl_change_journal/1"
STATE_DIR = "/var/lib/gpufleet/nccl_change"
JOURNAL = STATE_DIR + "/journal.json"
HISTORY_DIR = STATE_DIR + "/history"
STAGES = kind_stages("installing", "installed", "activated")
EVENTS = SHARED_EVENTS + ("installed", "activated")
# Every action the flow answers on an NCCL change, and the event its task file (roles/nccl_change/tasks/
# action_<name>.yml) reports.
ACTIONS = kind_actions(("install", "installed"), ("activate", "activated"))
FILES = ("conf", "env")  # the journal's names of the file NCCL reads and the EnvironmentFile
# The most a settings file may hold to be recorded in the journal and put back byte for byte.
MAX_FILE_BYTES = 65536


# ---- names of settings ---------------------------------------------------------------------------------
def managed_keys(*settings: dict[str, Any] | None) -> set[str]:
    """The variables besides NCCL_* that a view keeps: those the given settings (old, candidate, the files') name."""
    return {k for s in settings for k in (s or {}) if not is_nccl_key(k)}


def view(env: dict[str, Any] | None, keys: set[str]) -> dict[str, str]:
    """The managed view of an environment: every NCCL_* variable and the variables of ``keys``."""
    return {k: str(v) for k, v in sorted((env or {}).items()) if is_nccl_key(k) or k in keys}


def names(candidate: dict[str, str], on_disk: dict[str, str], environ: dict[str, str] | None,
          journal: dict[str, Any] | None) -> dict[str, Any]:
    """What a step sees, named: the managed views of the files' settings (``file_settings``) and of the process's
    environment (``environ``, None when it cannot be read), and the names ``running``, ``default`` and ``target``, over
    the variables the old, the candidate and the files' settings name."""
    j = journal or {}
    keys = managed_keys(candidate, on_disk, j.get("old_settings"), j.get("target_settings"))
    running = view(environ, keys) if environ is not None else None
    return {"file_settings": view(on_disk, keys), "environ": running,
            "running": settings_id(running) if running is not None else None,
            "default": settings_id(view(on_disk, keys)), "target": settings_id(view(candidate, keys))}


def p2p_choice(settings: dict[str, Any] | None) -> str:
    """The P2P choice the settings make: ``p2p_off`` (NCCL_P2P_DISABLE=1), else ``p2p_on`` with its level if set."""
    s = settings or {}
    if str(s.get("NCCL_P2P_DISABLE", "0")) == "1":
        return "p2p_off"
    return f"p2p_on (NCCL_P2P_LEVEL={s['NCCL_P2P_LEVEL']})" if s.get("NCCL_P2P_LEVEL") else "p2p_on"


def differences(want: dict[str, str], have: dict[str, str] | None, where: str) -> list[str]:
    """Each variable where ``have`` (``where``: the process, the file) differs from ``want``, in words."""
    have = have or {}
    out = []
    for key in sorted(set(want) | set(have)):
        if key not in have:
            out.append(f"{key} is not set in {where} (want {want[key]})")
        elif key not in want:
            out.append(f"{key}={have[key]} is set in {where} but not in the settings")
        elif want[key] != have[key]:
            out.append(f"{key} is {have[key]} in {where}, want {want[key]}")
    return out


# ---- check first -------------------------------------------------------------------------------------------
def check_candidate(candidate: Any, settings: dict[str, Any], env_file: str) -> str:
    """Why the candidate settings may not be written ('' when they may): nccl_env's validation (unknown keys, bad
    values, NVLink multicast on), NCCL_NVLS_ENABLE=0 present, and the host lint's NCCL rules (a setting known to harm
    or to do nothing, each with its fix) unless ``allow_findings`` names its code."""
    fix = "Nothing was changed; fix nccl_change_profile / nccl_change_settings and run again."
    try:
        checked = validate(candidate, settings.get("allow_unknown") or ())
    except NcclEnvError as err:
        return f"the candidate NCCL settings are refused: {err}. {fix}"
    if checked != {str(k): v for k, v in candidate.items() if v is not None}:
        return (f"the candidate NCCL settings are not in their normal form ({json.dumps(candidate, sort_keys=True)}): "
                "pass the settings the gpufleet.inference.nccl_env filter resolved. " + fix)
    if checked.get("NCCL_NVLS_ENABLE") != "0":
        return ("the candidate NCCL settings lack NCCL_NVLS_ENABLE=0 (NVLink multicast stays off on these hosts): pass "
                "the settings the gpufleet.inference.nccl_env filter resolved. " + fix)
    allowed = set(settings.get("allow_findings") or ())
    found = [f for f in rule_nccl([Setting("env", k, v, env_file, None, "env_file") for k, v in checked.items()])
             if f["severity"] == "warning" and f["code"] not in allowed]
    if found:
        return ("the candidate NCCL settings hold what is known to harm or to do nothing: " + " ".join(
            f"[{f['code']}] {f['message']} Fix: {f['fix']}" for f in found) + " " + fix +
            " To write them all the same, list the code in nccl_change_allow_findings.")
    return ""


def file_problem(files: dict[str, Any]) -> str:
    """Why the present files cannot be recorded and put back byte for byte ('' when they can)."""
    for name in FILES:
        f = files.get(name) or {}
        if f.get("error"):
            return f"{f.get('path')} cannot be recorded: {f['error']}"
    return ""


# ---- before any journal ------------------------------------------------------------------------------
def fresh(obs: dict[str, Any]) -> tuple[str, str]:
    """(decision, reason) on a host with no NCCL change in progress; decision '' means: go."""
    pre, target, s, running = obs.get("preflight") or {}, obs["target"], obs["settings"], obs["running"]
    unit, env_path = obs.get("unit"), (obs["files"].get("env") or {}).get("path")
    problem = check_candidate(obs.get("candidate") or {}, s, env_path or "the EnvironmentFile")
    if problem:
        return "refused", problem
    if running is None:
        return "refused", (f"the environment of {unit}'s main process cannot be read ({obs.get('environ_error')}): "
                           "nothing is changed. Start the unit (the vllm_service role) and run again; the change "
                           "starts from the settings it runs.")
    problem = file_problem(obs["files"])
    if problem:
        return "refused", problem + ": nothing is changed. Replace it with a plain text file, then run again."
    if running != obs["default"]:
        diff = differences(obs.get("file_settings") or {}, obs.get("environ") or {}, f"{unit}'s process")
        return "refused", (f"{unit} runs other NCCL settings than {env_path} holds ({'; '.join(diff)}): a restart is "
                           "pending, or another EnvironmentFile of the unit sets them (vllm_service_env). Nothing is "
                           "changed; restart the unit (or fold those keys into the NCCL settings) so that the baseline "
                           "is measured on what the files say, then run again.")
    if running == target:
        return "already", f"{unit} runs the candidate NCCL settings already ({target}, {p2p_choice(obs['candidate'])})"
    if not pre.get("ok", True):
        return "preflight_failed", pre.get("msg") or "preflight failed"
    if s.get("check_mode") or not s.get("restart_ok"):
        changed = differences(obs["candidate"], obs.get("environ") or {}, "the running settings")
        reason = (f"would: benchmark {unit} on its NCCL settings {running} ({p2p_choice(obs.get('environ'))}), audit "
                  f"the host and record its outputs, keep the bytes of both files, write the candidate {target} "
                  f"({p2p_choice(obs['candidate'])}; {'; '.join(changed)}) and read it back, restart {unit}, check its "
                  "environment and readiness, benchmark, gate, compare outputs and health; keep it or put the files "
                  "back and restart (no reboot)")
        if not s.get("check_mode"):
            reason += ". Set nccl_change_restart_ok: true to do it"
        return "planned", reason
    return "", ""


def journal_extra(obs: dict[str, Any]) -> dict[str, Any]:
    """The NCCL change's fields of a new journal: the unit, the original files (bytes, mode, owner; or absent), the old
    and the candidate settings with their P2P choice, and the verification's records."""
    original = {name: {k: (obs["files"].get(name) or {}).get(k) for k in ("path", "exists", "text", "sha256", "mode",
                                                                          "uid", "gid")} for name in FILES}
    return {"unit": obs.get("unit"), "original": original, "old_settings": dict(obs.get("environ") or {}),
            "target_settings": dict(obs["candidate"]), "old_p2p": p2p_choice(obs.get("environ")),
            "target_p2p": p2p_choice(obs["candidate"]), "installed": None, "activated": None, "path_before": None,
            "verify": None}


def lock_action(name: str, version: str, obs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The lock, commit and rollback actions. NCCL settings are no package: what is held is the host (the lease) and the
    two files, which only this flow writes while a journal is open (the nccl_env role refuses to)."""
    action = {"name": name, "version": version, "lock": bool(obs["settings"].get("lock", True)), "hold": []}
    action.update(extra)
    return action


def install_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    """The write of the candidate's files, and the journal at ``installing`` before it: the write changes what a restart
    brings up, so a run that finds the journal must know it may have happened."""
    if journal["stage"] != "installing":
        flow.stamp(journal, obs, "installing", f"writing NCCL settings {journal['target']}")
    return {"name": "install", "version": journal["target"], "settings": journal["target_settings"]}


def activate_action(journal: dict[str, Any], obs: dict[str, Any], restart: bool = True) -> dict[str, Any]:
    return {"name": "activate", "version": journal["target"], "restart": restart}


def commit_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    return lock_action("commit", journal["target"], obs)


def rollback_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    """Put the original bytes back (a file that did not exist is removed) and restart the unit when it runs other
    settings than the old ones, or once the candidate was activated (the other units of nccl_change_restart_units read
    it too)."""
    files = [{"path": f["path"], "state": "file" if f.get("exists") else "absent", "content": f.get("text") or "",
              "mode": f.get("mode"), "uid": f.get("uid"), "gid": f.get("gid")}
             for f in (journal["original"][name] for name in FILES)]
    restart = obs["running"] != journal["old"] or journal.get("activated") is not None
    return lock_action("rollback", journal["old"], obs, files=files, restart=restart)


# ---- the kind's steps ----------------------------------------------------------------------------------
def on_installed(journal, obs):
    """The candidate's files are written and read back (nccl_env_files), or the write failed."""
    data = obs["data"]
    install = data.get("install") or {}
    if flow.truthy(install.get("failed")):
        return flow.verdict(NCCL, journal, obs, "preflight_failed", (
            f"the write of NCCL settings {journal['target']} failed: {install.get('msg') or '?'}. {journal['unit']} was "
            "not restarted; the original files are put back"))
    if obs["default"] != journal["target"]:
        diff = differences(journal["target_settings"], obs.get("file_settings"), (obs["files"].get("env") or {}).get("path"))
        return flow.verdict(NCCL, journal, obs, "preflight_failed", (
            f"after the write the EnvironmentFile holds {obs['default']}, not {journal['target']} ({'; '.join(diff)}): "
            "another writer? The original files are put back"))
    journal["installed"] = {"at": obs["now"], "sha256": {n: (obs["files"].get(n) or {}).get("sha256") for n in FILES}}
    journal["path_before"] = path_findings((data.get("ready_before") or {}).get("kernel_path"))
    flow.stamp(journal, obs, "installed", f"NCCL settings {journal['target']} written, {journal['old']} still runs")
    return journal, activate_action(journal, obs)


def on_activated(journal, obs):
    """The unit was restarted: its environment must hold exactly the candidate's settings, and it must serve."""
    data = obs["data"]
    restart, ready = data.get("restart") or {}, data.get("ready") or {}
    journal["activated"] = {"at": obs["now"], "restarted": bool(restart.get("restarted", True))}
    flow.stamp(journal, obs, "activated", f"{journal['unit']} restarted")
    if obs["default"] != journal["target"]:
        return away(journal, obs, "the restart")
    problems, notes = [], []
    if flow.truthy(restart.get("failed")):
        problems.append(f"the restart of {journal['unit']} failed: {restart.get('msg') or '?'}")
    if obs["running"] != journal["target"]:
        diff = differences(journal["target_settings"], obs.get("environ"), f"{journal['unit']}'s process")
        problems.append(f"its main process does not run the candidate's settings ({obs.get('environ_error') or ''}"
                        f"{'; '.join(diff)})")
    if not flow.truthy(ready.get("ok")):
        problems.append(f"the inference server is not ready: {ready.get('msg') or '?'}")
    fresh_findings = new_path_findings(journal.get("path_before"), path_findings(ready.get("kernel_path")))
    if fresh_findings:
        text = "new start-log findings that the old settings did not have: " + "; ".join(
            f"{f['id']} ({f['severity']}): {f['message']}" for f in fresh_findings)
        (problems if obs["settings"].get("findings", "fail") == "fail" else notes).append(text)
    journal["verify"] = {"problems": problems, "notes": notes, "new_findings": fresh_findings,
                         "environ": dict(obs.get("environ") or {}), "at": obs["now"]}
    if problems:
        return flow.verdict(NCCL, journal, obs, "verify_failed",
                            f"NCCL settings {journal['target']} were written and {journal['unit']} restarted, but "
                            + "; ".join(problems))
    return flow.candidate_round(NCCL, journal, obs, "verified")


def away(journal, obs, when: str):
    """The host does not run the candidate where it must: the files or the unit were changed outside this flow."""
    return flow.verdict(NCCL, journal, obs, "reverted", (
        f"during {when} {journal['unit']} runs NCCL settings {obs['running'] or 'unknown'} and the EnvironmentFile holds "
        f"{obs['default']}, not {journal['target']}: they were changed outside this flow (an nccl_env run, an operator, "
        "a restart with other files)"))


def resume(journal, obs):
    """A new run finds the journal at installing (write again: the write converges; a write that took goes on to the
    restart), installed (restart) or activated (restart again, unless the candidate runs already: then only the
    verification)."""
    stage, old, target = journal["stage"], journal["old"], journal["target"]
    if stage == "installing" and obs["running"] == old and obs["default"] in (old, target):
        return journal, install_action(journal, obs)
    if obs["default"] != target:
        return flow.verdict(NCCL, journal, obs, "reverted", (
            f"at stage {stage} the EnvironmentFile holds NCCL settings {obs['default']}, not {target}: it was changed "
            "outside this flow"))
    return journal, activate_action(journal, obs, restart=not (stage == "activated" and obs["running"] == target))


def _files_back(journal: dict[str, Any], obs: dict[str, Any]) -> list[str]:
    """The files that do not hold their original bytes (or exist where they did not)."""
    out = []
    for name in FILES:
        want, have = journal["original"][name], obs["files"].get(name) or {}
        if bool(want.get("exists")) != bool(have.get("exists")) or (want.get("exists") and want.get("sha256") != have.get("sha256")):
            out.append(f"{want.get('path')} {'holds other bytes' if have.get('exists') else 'is missing'}"
                       if want.get("exists") else f"{want.get('path')} exists but did not before")
    return out


def commit_check(journal: dict[str, Any], obs: dict[str, Any]) -> tuple[str, str]:
    if obs["running"] != journal["target"] or obs["default"] != journal["target"]:
        return (f"{journal['unit']} runs NCCL settings {obs['running']} and the EnvironmentFile holds {obs['default']}, "
                f"expected {journal['target']}", "")
    return "", f"NCCL settings {journal['target']} ({journal.get('target_p2p')}) kept"


def rollback_check(journal: dict[str, Any], obs: dict[str, Any]) -> tuple[str, str]:
    problems = _files_back(journal, obs)
    if obs["running"] != journal["old"]:
        diff = differences(journal["old_settings"], obs.get("environ"), f"{journal['unit']}'s process")
        problems.append(f"{journal['unit']} runs NCCL settings {obs['running']}, expected {journal['old']} "
                        f"({obs.get('environ_error') or '; '.join(diff)})")
    if problems:
        return ("; ".join(problems), f"check the files against the journal's original bytes and systemctl status "
                                     f"{journal['unit']}")
    return "", ""


def check_settings(settings: dict[str, Any]) -> None:
    check_findings_mode(settings, "nccl_change")


def _text_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _original(value: Any) -> bool:
    """The original files as the journal keeps them: both, each with its path, whether it existed and its text."""
    return isinstance(value, dict) and all(
        isinstance(value.get(n), dict) and is_text(value[n].get("path")) and isinstance(value[n].get("exists"), bool)
        and (not value[n]["exists"] or (isinstance(value[n].get("text"), str) and is_text(value[n].get("sha256"))))
        for n in FILES)


def _finding_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(f, dict) and isinstance(f.get("id"), str) for f in value)


JOURNAL_FIELDS = {
    "unit": (is_text, "a systemd unit"), "original": (_original, "the original files (path, exists, text, sha256)"),
    "old_settings": (_text_map, "NCCL settings (KEY: value)"), "target_settings": (_text_map, "NCCL settings (KEY: value)"),
    "old_p2p": (is_text, "a P2P choice"), "target_p2p": (is_text, "a P2P choice"),
    "installed": (optional(is_dict), "the write record"), "activated": (optional(is_dict), "the restart record"),
    "verify": (optional(is_dict), "the verification"),
    "path_before": (optional(_finding_list), "a list of start-log findings (id, severity)"),
}
EVENT_FIELDS = {
    "benchmarked": {"nccl": (optional(is_text), "the name of NCCL settings")},
    "installed": {"install": (optional(is_dict), "the write's answer"),
                  "ready_before": (optional(is_dict), "vllm_ready's answer on the old settings")},
    "activated": {"restart": (optional(is_dict), "the restart's answer"),
                  "ready": (optional(is_dict), "vllm_ready's answer on the candidate")},
    "rolled_back": {"files": (optional(list_of(is_text)), "a list of paths")},
}
EVENT_NESTED = {"installed": ("install", {"msg": optional(is_text)}), "activated": ("ready", {"msg": optional(is_text)})}
PREFLIGHT_FIELDS = {"msg": (optional(is_text), "text")}

NCCL = ChangeKind(
    name="nccl", journal_format=JOURNAL_FORMAT, var_prefix="nccl_change", gate_change="nccl",
    side_key="nccl", side_what="the name of NCCL settings", stages=STAGES, events=EVENTS,
    handlers={"installed": (("installing",), on_installed), "activated": (("installed", "activated"), on_activated)},
    fresh=fresh, journal_extra=journal_extra, lock=lock_action, commit=commit_action, change=install_action,
    rollback=rollback_action, resume=resume, away=away, commit_check=commit_check, rollback_check=rollback_check,
    serving="the NCCL files hold the settings that should serve, the unit runs them", state_dir=STATE_DIR, noun="change",
    repair_hint=" (its 'original' holds the files' bytes before the change)", step_module="nccl_change_step",
    first_change="the write of the files", actions=ACTIONS,
    check_settings=check_settings, journal_fields=JOURNAL_FIELDS, event_fields=EVENT_FIELDS, event_nested=EVENT_NESTED,
    preflight_fields=PREFLIGHT_FIELDS)


def step(journal: dict[str, Any] | None, obs: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """One transition of the NCCL change (change/flow.py step)."""
    return flow.step(NCCL, journal, obs)


def check_journal(journal: Any, path: str) -> dict[str, Any]:
    return flow.check_journal(NCCL, journal, path)

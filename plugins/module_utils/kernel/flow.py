# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel upgrade as a pure state machine: ``step(journal, observation) -> (journal, action)``.

Every decision of the rollout lives here: go or no-go, the stage, extra candidate rounds, the
difference of PCIe findings, the verdict and the decision vocabulary. The module
``kernel_rollout_step`` reads the host (running kernel, saved GRUB default, boot id, the journal,
the installed packages), calls ``step`` with what the controller just did (``event`` + ``data``),
writes the journal it gets back (durably, before the controller acts) and returns the action.
The role only executes actions: package installs, reboots and module calls.

The journal (``/var/lib/gpufleet/kernel_upgrade/journal.json``) is the host's memory of one
upgrade. ``None`` means no upgrade is in progress. It is written before every step after which
the controller can be lost, and moved to the history when the upgrade ends. It belongs to the run
that started it (``run_id``); another run resumes it only by a take-over at its start (``take_over``).
``check_journal`` and ``check_event`` check the shape of every field a step reads before any step, so
that a damaged journal or event is refused (FlowError), never half-read. While the candidate may run
uncommitted, every contact records the commit ``deadline`` as this boot's id and seconds since this
boot, which the host's boot-health unit compares with its own uptime (never with the wall clock).

Stages, in order (see docs/roles/kernel_upgrade.md for the diagram):

``baseline``   the old kernel (the saved default, running) was measured; nothing changed yet. The gate
               judges the baseline alone first (``decide(baseline, [])``): while its spread is too wide
               for the margin it asks for more baseline runs (the gated level only, measured only), up to
               its cap; a host still too noisy, or drifting, stops here (``inconclusive``, nothing changed).
``pinned``     the old kernel is pinned as the GRUB default (and panic= is on the command line).
``installed``  the target is installed and passed its post-install checks.
``boot_once``  the boot-health unit is installed and the one-shot boot is about to happen
               (``boot_id`` says from which boot).
``booted``     the host came up on the target; verification is next.
``candidate``  the target is being benchmarked (runs recorded as they come).
``verdict``    a verdict is recorded: ``pass`` is committed, anything else rolled back. It is the serving
               verdict (bench/verdict.py): throughput and latency from the gate (a candidate at the same tok/s
               with a TTFT/TPOT beyond its margin is a ``regression``), the outputs compared with the reference
               recorded on the old kernel (``diverged``) and the host's health before and after (``unstable``),
               each part with its figures in ``verdict.parts``. A part left out (settings ``outputs`` or
               ``stability`` false) or without its "before" (a journal written before the part existed) is named
               ``not measured`` in the reason, never passed silently.

The serving verdict's extra steps: after the baseline is ready, the PCIe audit keeps the host's health document
(``health_before``) and, with ``outputs``, the ``outputs`` action records the output reference on the old kernel
(``outputs_reference``); once the gate's answer on the candidate is final, the ``check`` action compares the outputs
and audits the host again (``checks``), and the verdict is given.
``committed`` / ``rolled_back`` / ``stopped``  terminal: the journal goes to the history.
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.gate_settings import GATE
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.throughput_gate import (
    check_all_settings, check_count, decide,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.gate_settings import LATENCY_METRICS
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import GateError
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.verdict import (
    OUTPUT_ANSWERS, VerdictError, judged_verdict,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.workload import workload, workload_mismatch

JOURNAL_FORMAT = "gpufleet.kernel_upgrade_journal/1"
STAGES = ("baseline", "pinned", "installed", "boot_once", "booted", "candidate", "verdict",
          "committed", "rolled_back", "stopped")
TERMINAL = ("committed", "rolled_back", "stopped")
# Decisions a host can end with; the first three leave the host fine.
OK_DECISIONS = ("pass", "already", "planned")
DECISIONS = OK_DECISIONS + ("preflight_failed", "failed_boot", "reverted", "verify_failed", "unstable", "diverged",
                            "regression", "inconclusive", "error", "refused")
# Every way off the happy path after the pin ends in a rollback.
ROLLBACK_DECISIONS = ("preflight_failed", "failed_boot", "reverted", "verify_failed", "unstable", "diverged", "regression",
                      "inconclusive", "error")
EVENTS = ("start", "locked", "benchmarked", "audited", "outputs", "pinned", "installed", "rebooted", "verified",
          "checked", "committed", "rolled_back", "error")
# Kernel log lines the journal keeps for the stability part (the Xid events; the rest is not read).
KERNEL_LOG_KEEP = 200

# Meta-packages that pull a newer kernel in; held where installed (Debian, Ubuntu).
KERNEL_META = ("linux-image-amd64", "linux-image-cloud-amd64", "linux-image-arm64", "linux-image-cloud-arm64",
               "linux-generic", "linux-image-generic", "linux-headers-generic", "linux-virtual", "linux-image-virtual")
KERNEL_META_PREFIXES = ("linux-generic-hwe-", "linux-image-generic-hwe-", "linux-headers-generic-hwe-")
# GPU driver packages whose upgrade rebuilds or replaces the kernel module.
DRIVER_PREFIXES = ("nvidia-driver", "nvidia-kernel-", "nvidia-dkms-", "nvidia-open", "cuda-drivers",
                   "linux-modules-nvidia-", "linux-objects-nvidia-", "linux-signatures-nvidia-")
DRIVER_SUFFIXES = ("-dkms",)
UU_DROPIN = "/etc/apt/apt.conf.d/51gpufleet-kernel-lock"
# Seconds an uncommitted candidate may go without a contact of the controller before its boot-health
# unit reverts it: long enough for a boot and a health check, short enough to ever come.
COMMIT_TIMEOUT_S = (120, 86400)


class FlowError(ValueError):
    """An observation the flow cannot act on; the message says what and what to do."""


# ---- the lock ------------------------------------------------------------------------------------
def lock_packages(version: str, installed: list[str], extra: list[str] | None = None) -> list[str]:
    """What the lock holds for kernel ``version``: its image package, the kernel meta-packages and the
    GPU driver/DKMS packages, each only where installed (``installed``: dpkg's installed names)."""
    have = set(installed)
    wanted = {f"linux-image-{version}"} | set(KERNEL_META) | set(extra or [])
    out = {p for p in wanted if p in have}
    for name in have:
        if name.startswith(KERNEL_META_PREFIXES + DRIVER_PREFIXES) or name.endswith(DRIVER_SUFFIXES):
            out.add(name)
    return sorted(out)


def render_uu_dropin(packages: list[str]) -> str:
    """An apt.conf drop-in that keeps unattended-upgrades off the held packages (its own blacklist:
    ``apt-mark hold`` alone is not what every unattended-upgrades version honours)."""
    lines = ["// Managed by Ansible (gpufleet.inference.kernel_upgrade): the kernel and GPU driver stay as",
             "// the last gated upgrade left them; unattended-upgrades must not touch them.",
             "Unattended-Upgrade::Package-Blacklist {"]
    lines += [f'    "^{p.replace(".", "[.]").replace("+", "[+]")}$";' for p in packages]
    lines.append("};")
    return "\n".join(lines) + "\n"


def lock_action(name: str, version: str, obs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    hold = lock_packages(version, obs.get("installed_packages") or [], obs["settings"].get("lock_packages"))
    action = {"name": name, "version": version, "lock": bool(obs["settings"].get("lock", True)), "hold": hold,
              "unattended_upgrades": {"path": UU_DROPIN, "content": render_uu_dropin(hold)}}
    action.update(extra)
    return action


# ---- helpers -------------------------------------------------------------------------------------
def truthy(value: Any) -> bool:
    """A flag as the controller templated it: a bool, or its text (``"True"``, ``"false"``, ``"1"``)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "on")
    return bool(value)


def finding_keys(findings: list[dict[str, Any]] | None) -> list[str]:
    return sorted({f"{f.get('code')}@{f.get('device')}" for f in findings or []})


def new_findings(before: list[str] | None, after: list[dict[str, Any]] | None) -> list[str]:
    """PCIe findings after the boot that the old kernel did not have (``code@device``)."""
    return [k for k in finding_keys(after) if k not in set(before or [])]


def finish(decision: str, reason: str) -> dict[str, Any]:
    return {"name": "finish", "decision": decision, "reason": reason.strip(), "ok": decision in OK_DECISIONS}


def _stamp(journal: dict[str, Any], obs: dict[str, Any], stage: str, note: str) -> dict[str, Any]:
    journal["stage"] = stage
    journal["updated_at"] = obs["now"]
    journal.setdefault("history", []).append({"stage": stage, "at": obs["now"], "event": obs["event"], "note": note})
    if stage in TERMINAL:
        journal["finished"] = True
        journal["finished_at"] = obs["now"]
    return journal


def commit_timeout(settings: dict[str, Any]) -> int:
    """The ``commit_timeout`` setting, bounded; FlowError (nothing changed) outside COMMIT_TIMEOUT_S."""
    value, (low, high) = settings.get("commit_timeout", 1800), COMMIT_TIMEOUT_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
            not low <= value <= high:
        raise FlowError(f"commit_timeout {value!r} is not {low} to {high} seconds (a boot and a health check at least, "
                        "a day at most: an uncommitted candidate must revert by itself): set "
                        "kernel_upgrade_commit_timeout in that range; nothing was changed")
    return int(value)


def _deadline(journal: dict[str, Any], obs: dict[str, Any]) -> None:
    """While the host may run the candidate uncommitted, each contact pushes the host-local commit
    deadline: the boot-health unit reboots into the saved default once it passes. The unit reads
    ``deadline`` (this boot's id, seconds since this boot: a wall clock that jumps moves nothing);
    ``commit_deadline`` (epoch seconds) is for people and is not read by the unit."""
    timeout = commit_timeout(obs["settings"])
    journal["commit_deadline"] = obs["now"] + timeout
    journal["deadline"] = {"boot_id": obs["boot_id"], "uptime": float(obs.get("uptime") or 0.0) + timeout,
                           "timeout": timeout}


def _verdict(journal: dict[str, Any], obs: dict[str, Any], decision: str, reason: str,
             parts: dict[str, Any] | None = None) -> tuple[dict, dict]:
    journal["verdict"] = {"decision": decision, "reason": reason.strip(), "at": obs["now"]}
    if parts is not None:
        journal["verdict"]["parts"] = parts
    _stamp(journal, obs, "verdict", decision)
    if decision == "pass":
        _deadline(journal, obs)
        return journal, lock_action("commit", journal["target"], obs)
    return journal, rollback_action(journal, obs)


def rollback_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    return lock_action("rollback", journal["old"], obs, reboot=obs["running"] != journal["old"])


def gated_level(data: dict[str, Any]) -> tuple[int | None, list[float], list[str]]:
    """The gated concurrency level of a benchmark, its throughput samples and its contaminated runs.

    ``samples`` is inference_benchmark's ``{level: [tok/s per run]}`` (or one list); ``concurrency``
    0 picks the highest level; ``contaminated`` is ``{level: [run index]}`` (or one list)."""
    samples, level, dirty = data.get("samples") or [], int(data.get("concurrency") or 0), data.get("contaminated") or []
    if isinstance(samples, dict):
        levels = sorted(int(k) for k in samples)
        if not levels:
            raise FlowError("the benchmark returned no samples: look at its output on the host")
        level = level or levels[-1]
        if level not in levels:
            raise FlowError(f"the gated concurrency {level} was not measured (levels {levels}): set "
                            "kernel_upgrade_gate_concurrency to one of inference_benchmark_concurrency, or 0")
        samples = samples.get(str(level), samples.get(level))
        if isinstance(dirty, dict):
            dirty = dirty.get(str(level), dirty.get(level)) or []
    elif isinstance(dirty, dict):
        dirty = [r for runs in dirty.values() for r in runs]
    return (level or None), [float(v) for v in samples or []], [str(r) for r in dirty]


def _bench_side(data: dict[str, Any]) -> dict[str, Any]:
    """One benchmark round as the journal keeps it: the gated level's runs, its failures and requests (checked
    counts), and the workload fingerprint at that level (from the result's ``server``, ``config`` and ``client``: the
    model and its identity, the engine, the benchmark settings; {} when the role sent none)."""
    level, samples, dirty = gated_level(data)
    try:
        failed, requests = check_count("failed", data.get("failed") or 0), check_count("requests", data.get("requests") or 0)
        fingerprint = workload({k: data[k] for k in ("server", "config", "client") if data.get(k)}, level)
    except GateError as err:
        raise FlowError(f"the benchmark result cannot be used: {err}") from None
    return {"samples": samples, "files": list(data.get("files") or []), "kernel": data.get("kernel"),
            "concurrency": level, "duration_s": data.get("duration_s"), "contaminated": dirty, "rounds": 1,
            "failed": failed, "requests": requests, "model": fingerprint.get("model"), "workload": fingerprint,
            "latency": _level_latency(data.get("latency"), level, len(samples))}


def _level_latency(latency: Any, level: int | None, runs: int) -> dict[str, list[float]]:
    """The gated level's per-run latency ({metric: [ms per run]}, see throughput_gate.latency_series) from the
    benchmark's ``latency`` ({level: {metric: [...]}}, the latency_samples filter, or one level's dict); {} when the
    role sent none (an older role): the verdict is then throughput's alone, marked ``not measured``."""
    if not isinstance(latency, dict) or not latency:
        return {}
    if not set(latency) <= set(LATENCY_METRICS):
        latency = latency.get(str(level), latency.get(level)) if level is not None else None
        if not isinstance(latency, dict):
            return {}
    out = {}
    for key, values in latency.items():
        if key not in LATENCY_METRICS or not isinstance(values, list) or len(values) != runs:
            raise FlowError(f"the benchmark's latency.{key} is not one figure per run of the gated level ({runs} runs): "
                            "pass the latency_samples filter's output of the same benchmark")
        out[key] = [float(v) for v in values]
    return out


def _round_mismatch(side: dict[str, Any], more: dict[str, Any], label: str) -> str:
    """Why another round of ``label`` runs cannot join the side's runs ('' when it can)."""
    diff = workload_mismatch(side.get("workload"), more.get("workload"))
    return (f"the new {label} round was measured on another workload than the {label}'s earlier runs ("
            + "; ".join(diff).replace("baseline ", "earlier ").replace("candidate ", "new ") + ")") if diff else ""


def _add_rounds(side: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """A side with another round's runs, files, contaminated runs and failures added."""
    return {**side, "samples": side["samples"] + more["samples"], "files": side["files"] + more["files"],
            "contaminated": side["contaminated"] + more["contaminated"], "rounds": int(side.get("rounds", 1)) + 1,
            "failed": int(side.get("failed") or 0) + more["failed"],
            "requests": int(side.get("requests") or 0) + more["requests"],
            # a metric is kept only while every round carries it (judged on every run or not at all)
            "latency": {k: v + (more.get("latency") or {})[k] for k, v in (side.get("latency") or {}).items()
                        if k in (more.get("latency") or {})}}


def _failures(journal: dict[str, Any]) -> dict[str, Any]:
    """Failed requests and short outputs of each side, for the gate (a candidate that fails more cannot pass;
    the gate refuses counts that give no rate, such as a negative count in a journal)."""
    base, cand = journal.get("baseline") or {}, journal.get("candidate") or {}
    return {"baseline_failed": base.get("failed") or 0, "baseline_requests": base.get("requests") or 0,
            "candidate_failed": cand.get("failed") or 0, "candidate_requests": cand.get("requests") or 0}


def _gate_settings(obs: dict[str, Any]) -> dict[str, Any]:
    """The role's gate settings (kernel_upgrade_gate_*) as decide() options; one the role does not send is the gate's
    default (GATE)."""
    g = obs["settings"].get("gate") or {}
    try:
        out = {"threshold": float(g.get("threshold", GATE.threshold)), "alpha": float(g.get("alpha", GATE.alpha)),
               "pass_alpha": float(g.get("pass_alpha", GATE.pass_alpha)), "min_runs": int(g.get("min_runs", GATE.min_runs)),
               "max_runs": int(g.get("max_runs", GATE.max_runs)),
               "candidate_min_runs": int(g.get("candidate_min_runs") or GATE.candidate_min_runs)}
        if g.get("max_baseline_runs"):
            out["max_baseline_runs"] = int(g["max_baseline_runs"])
        if g.get("requests_per_run"):
            out["requests_per_run"] = int(g["requests_per_run"])
        if g.get("latency_margins"):
            out["latency_margins"] = dict(g["latency_margins"])
        if g.get("latency_alpha"):
            out["latency_alpha"] = float(g["latency_alpha"])
    except (TypeError, ValueError) as err:
        raise FlowError(f"a gate setting is not a number ({err}): set the kernel_upgrade_gate_* variables to numbers") from None
    return out


def settings_problem(obs: dict[str, Any]) -> str:
    """Why the gate's settings cannot give a verdict ('' when they can), checked before any run is measured."""
    try:
        check_all_settings(**_gate_settings(obs))
    except (GateError, FlowError) as err:
        return (f"the gate's settings cannot be used: {err}. Nothing was measured or changed; fix the "
                "kernel_upgrade_gate_* variables and run again")
    return ""


def _benchmark(label: str, runs: int, seed: int, level: int | None = None, measured_only: bool = False) -> dict[str, Any]:
    """A benchmark action. Extra rounds (``measured_only``) run only the gated ``level``, without warm-up or
    settle runs; ``concurrency`` None means every configured level."""
    return {"name": "benchmark", "label": label, "runs": int(runs), "seed": int(seed), "measured_only": measured_only,
            "concurrency": int(level) if measured_only and level else None}


# ---- before any journal ------------------------------------------------------------------------
def fresh(obs: dict[str, Any]) -> tuple[str, str]:
    """(decision, reason) on a host with no upgrade in progress; decision '' means: go."""
    pre, target, s = obs.get("preflight") or {}, obs["target"], obs["settings"]
    running, default = obs["running"], obs["default"]
    if running == target and default == target:
        return "already", f"{target} runs and is the default already"
    if default is None:
        return "refused", (f"the saved GRUB default of this host names no installed kernel (running {running}): nothing is "
                           "changed. Run grub-editenv /boot/grub/grubenv list, set the default to the kernel that "
                           "should boot (grub-set-default 'submenu>entry'), then run again.")
    if running != default:
        return "refused", (f"this host runs {running} but its saved GRUB default is {default}, and there is no upgrade "
                           f"journal: a one-shot boot was left half-way (by an earlier run that lost its journal, or by "
                           f"hand). A baseline is never measured on a kernel that is not the saved default, so nothing is "
                           f"changed. To go back: reboot (the host boots {default}). To keep {running}: make it the "
                           f"default (grub-set-default) after checking it. Then run again.")
    if not pre.get("ok", False):
        return "preflight_failed", pre.get("msg") or "preflight failed"
    if s.get("check_mode") or not s.get("reboot_ok"):
        reason = (f"would: benchmark {running}, pin it as the default ({pre.get('running_entry')}), install "
                  f"{pre.get('package')}, install the boot-health unit, boot {target} once (grub-reboot), verify, "
                  "benchmark, gate; keep it or roll back")
        if not s.get("check_mode"):
            reason += ". Set kernel_upgrade_reboot_ok: true to do it"
        return "planned", reason
    return "", ""


def start_fresh(obs: dict[str, Any]) -> tuple[None, dict[str, Any]]:
    problem = settings_problem(obs)
    if problem:
        return None, finish("error", problem)
    decision, reason = fresh(obs)
    lockable = obs["running"] == obs["default"] and obs["settings"].get("lock", True) and decision != "refused"
    if obs["event"] == "start" and lockable:
        return None, lock_action("lock", obs["running"], obs)
    if decision:
        return None, finish(decision, reason)
    return None, _benchmark("baseline", _gate_settings(obs)["min_runs"], 0)


def new_journal(obs: dict[str, Any]) -> dict[str, Any]:
    pre = obs.get("preflight") or {}
    return {"format": JOURNAL_FORMAT, "run_id": obs.get("run_id") or "", "target": obs["target"],
            "old": obs["running"], "old_entry": pre.get("running_entry"), "package": pre.get("package"),
            "target_installed_before": bool(pre.get("target_installed")), "started_at": obs["now"],
            "dkms_modules": list(pre.get("dkms_modules") or []),
            "updated_at": obs["now"], "stage": None, "baseline": None, "candidate": None, "findings_before": None,
            "gate": None, "verdict": None, "boot_id": None, "commit_deadline": None, "deadline": None, "health": None,
            "verify": None, "finished": False, "history": []}


# ---- the machine -----------------------------------------------------------------------------------
def step(journal: dict[str, Any] | None, obs: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """One transition. ``obs``: event, data, preflight (this run's kernel_upgrade_preflight result),
    running, default, boot_id, uptime (seconds since this boot), now, target, run_id, take_over (why
    this run may resume another run's journal, or empty), settings, installed_packages, health (the
    boot-health unit's last result, or None).

    Returns the journal to write (``None``: nothing to write) and the next action. Raises FlowError
    for an observation that contradicts the journal (the module refuses, nothing changed).
    """
    event = obs["event"]
    if event not in EVENTS:
        raise FlowError(f"unknown event {event!r}: one of {', '.join(EVENTS)}")
    commit_timeout(obs["settings"])
    check_event(obs)
    if journal is not None:
        journal = copy.deepcopy(journal)
    if journal is None or journal.get("finished"):
        return step_fresh(obs)
    if journal["target"] != obs["target"]:
        return journal, finish("refused", (
            f"an upgrade to {journal['target']} (run {journal.get('run_id') or '?'}) is in progress at stage "
            f"{journal['stage']}, but this run asks for {obs['target']}: nothing is changed. Run again with "
            f"kernel_upgrade_target: {journal['target']} to finish (or roll back) that upgrade first."))
    refusal = take_over(journal, obs)
    if refusal:
        return journal, refusal
    if event == "error":
        return on_error(journal, obs)
    if event == "start" and obs["settings"].get("check_mode"):
        _journal, action = resume(journal, obs)
        return None, finish("planned", f"would resume the upgrade to {journal['target']} (run "
                                       f"{journal.get('run_id') or '?'}) from stage {journal['stage']}: next "
                                       f"{action['name']}{' (' + action['decision'] + ')' if 'decision' in action else ''}")
    if event == "start":
        return resume(journal, obs)
    handler = HANDLERS.get(event)
    if handler is None or journal["stage"] not in EXPECTED_STAGE.get(event, STAGES):
        raise FlowError(f"event {event!r} arrived at stage {journal['stage']}: it belongs to stage "
                        f"{' or '.join(EXPECTED_STAGE.get(event, ('none',)))}; nothing was changed")
    return handler(journal, obs)


def take_over(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any] | None:
    """A journal belongs to the run that started it (``run_id``). Another run resumes it only at its start
    and by an explicit take-over (``obs["take_over"]``: why - it holds the host's lease, or it named this
    journal's run); the journal then names the new run and keeps the take-over. Returns the refusal, or None."""
    owner, run, why = journal.get("run_id") or "", obs.get("run_id") or "", obs.get("take_over") or ""
    if owner == run:
        return None
    if not why or obs["event"] != "start":
        return finish("refused", (
            f"the upgrade to {journal['target']} in progress at stage {journal['stage']} belongs to run "
            f"{owner or '(no run id)'}, not to this run ({run or 'no run id'}): nothing was changed. Resume it from a "
            "run that holds the host's lease (playbooks/kernel_upgrade.yml takes over the lease of a run that died), "
            f"or take it over explicitly (kernel_rollout_step take_over: {owner or '(empty)'}) once that run is gone."))
    journal["run_id"] = run
    journal.setdefault("taken_over", []).append({"from": owner, "by": run, "at": obs["now"], "stage": journal["stage"],
                                                 "why": why})
    return None


def step_fresh(obs: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    event = obs["event"]
    if event in ("start", "locked"):
        return start_fresh(obs)
    if event == "error":
        return None, finish("error", (obs["data"].get("msg") or "error") + " (before any change to the host)")
    if event == "benchmarked" and obs["data"].get("label") == "baseline":
        return on_baseline(obs)
    raise FlowError(f"event {event!r} arrived but no upgrade is in progress on this host (no journal)")


def on_baseline(obs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    data = obs["data"]
    decision, reason = fresh(obs)
    if decision:
        raise FlowError(f"a baseline arrived but the host may not be upgraded: {decision}: {reason}")
    if data.get("kernel") not in (None, obs["running"]):
        raise FlowError(f"the baseline was measured on {data.get('kernel')}, but the host runs {obs['running']}, its "
                        "saved default: measure the baseline again")
    journal = new_journal(obs)
    journal["baseline"] = _bench_side(data)
    return judge_baseline(journal, obs)


def _stop_before_change(journal: dict[str, Any], obs: dict[str, Any], decision: str, reason: str,
                        note: str) -> tuple[dict, dict]:
    """End an upgrade that changed nothing yet (stage baseline): the verdict is kept, nothing to roll back."""
    journal["verdict"] = {"decision": decision, "reason": reason.strip(), "at": obs["now"]}
    _stamp(journal, obs, "stopped", note)
    return journal, finish(decision, reason)


def judge_baseline(journal: dict[str, Any], obs: dict[str, Any]) -> tuple[dict, dict]:
    """Before the pin: the gate judges the baseline alone. More baseline runs while it asks for them (the
    baseline cannot be extended after the reboot), a stop with nothing changed when the host is too noisy
    or drifting, else on to the PCIe audit or the pin."""
    base = journal["baseline"]
    if base["contaminated"]:
        return _stop_before_change(journal, obs, "inconclusive", (
            f"inconclusive: the baseline on {journal['old']} was contaminated by foreign load (runs "
            f"{', '.join(base['contaminated'])}: the server held more requests than the benchmark sent), so no gate "
            "can be trusted; nothing was changed. Drain the host (stop other clients, take it out of the load "
            "balancer) and run again."), "baseline contaminated")
    g = _gate_settings(obs)
    fails = _failures(journal)
    try:
        gate = decide(base["samples"], [], baseline_failed=fails["baseline_failed"],
                      baseline_requests=fails["baseline_requests"], baseline_latency=base.get("latency"), **g)
    except GateError as err:
        return _stop_before_change(journal, obs, "error", f"the gate could not judge the baseline: {err} (before any "
                                   "change to the host)", "baseline not judged")
    journal["baseline_gate"] = gate
    runs, rounds = len(base["samples"]), int(base.get("rounds", 1))
    cap = int(g.get("max_baseline_runs", GATE.max_baseline_runs))  # in runs, as the gate counts them
    if not gate.get("final") and gate.get("baseline_runs_needed", 0) > 0 and runs < cap:
        _stamp(journal, obs, "baseline", f"baseline round {rounds}: {gate['reason']}")
        return journal, _benchmark("baseline", gate["baseline_runs_needed"], 100 + rounds, base.get("concurrency"),
                                   measured_only=True)
    if gate.get("final") or gate.get("decided_by") != "baseline-ready":
        reason = gate.get("reason") or f"the baseline was not ready after {runs} runs"
        if "nothing was changed" not in reason.lower():
            reason += ". Nothing was changed."
        return _stop_before_change(journal, obs, "inconclusive", reason, gate.get("decided_by") or "baseline not ready")
    _stamp(journal, obs, "baseline", f"{runs} runs, {gate['reason']}")
    return journal, after_baseline(journal, obs)


def after_baseline(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    """What comes after a ready baseline, on the old kernel: the PCIe audit (the findings to compare after the boot and
    the health document of the stability part), the output reference (``outputs``), then the pin."""
    s = obs["settings"]
    if (s.get("verify_pcie", True) or truthy(s.get("stability"))) and journal.get("findings_before") is None:
        return {"name": "audit"}
    if truthy(s.get("outputs")) and not journal.get("outputs_reference"):
        return {"name": "outputs", "mode": "record", "version": journal["old"]}
    return pin_action(journal, obs)


def on_baseline_more(journal: dict[str, Any], obs: dict[str, Any]) -> tuple[dict, dict]:
    """More baseline runs the baseline gate asked for, still on the old kernel, its saved default."""
    data = obs["data"]
    if (journal.get("baseline_gate") or {}).get("decided_by") == "baseline-ready" or journal.get("findings_before") is not None:
        raise FlowError("more baseline runs arrived, but the baseline was already judged ready: nothing was changed")
    if obs["running"] != journal["old"] or obs["default"] != journal["old"] or data.get("kernel") not in (None, journal["old"]):
        raise FlowError(f"baseline runs arrived from {data.get('kernel') or obs['running']} (saved default "
                        f"{obs['default']}), but the baseline belongs to {journal['old']}, running as the saved default")
    try:
        more = _bench_side(data)
    except FlowError as err:
        return _stop_before_change(journal, obs, "error", f"{err} (before any change to the host)", "baseline not judged")
    mismatch = _round_mismatch(journal["baseline"], more, "baseline")
    if mismatch:
        return _stop_before_change(journal, obs, "error", f"{mismatch}: runs of different workloads are never compared. "
                                   "Nothing was changed; run again with the same benchmark settings", "baseline not judged")
    journal["baseline"] = _add_rounds(journal["baseline"], more)
    journal["updated_at"] = obs["now"]
    return judge_baseline(journal, obs)


def pin_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    return {"name": "pin", "version": journal["old"]}


def on_audited(journal, obs):
    if (journal.get("baseline_gate") or {}).get("decided_by") != "baseline-ready":
        raise FlowError("a PCIe audit arrived before the baseline was judged ready; nothing was changed")
    if journal["stage"] != "baseline":
        raise FlowError(f"a PCIe audit arrived at stage {journal['stage']}; it belongs after the baseline")
    journal["findings_before"] = finding_keys(obs["data"].get("findings"))
    if truthy(obs["settings"].get("stability")) and obs["data"].get("pcie"):
        journal["health_before"] = obs["data"]["pcie"]
    journal["updated_at"] = obs["now"]
    return journal, after_baseline(journal, obs)


def on_outputs(journal, obs):
    """The output reference, recorded on the old kernel before any change (output_equivalence mode=record): the journal
    keeps where it is and its A/A band; the check after the candidate's benchmark compares the new kernel with it."""
    if (journal.get("baseline_gate") or {}).get("decided_by") != "baseline-ready":
        raise FlowError("an output reference arrived before the baseline was judged ready; nothing was changed")
    if obs["running"] != journal["old"] or obs["default"] != journal["old"]:
        raise FlowError(f"an output reference arrived from {obs['running']} (saved default {obs['default']}), but the "
                        f"reference belongs to {journal['old']}, running as the saved default; nothing was changed")
    data = obs["data"]
    if not data.get("reference"):
        raise FlowError("the outputs event names no reference file: pass output_equivalence's result (reference, band, "
                        "aa); nothing was changed")
    journal["outputs_reference"] = {"path": data["reference"], "model": data.get("model"), "band": data.get("band") or {},
                                    "aa": data.get("aa") or {}, "kernel": journal["old"], "at": obs["now"]}
    journal["updated_at"] = obs["now"]
    _stamp(journal, obs, "baseline", f"output reference recorded on {journal['old']}: {data['reference']}")
    return journal, pin_action(journal, obs)


def install_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    """The target's image package, and its headers where DKMS must build modules for it (DKMS's
    kernel hook builds only for kernels whose headers are installed)."""
    packages = [journal.get("package") or f"linux-image-{journal['target']}"]
    headers = obs["settings"].get("headers", "auto")
    if headers == "always" or (headers == "auto" and journal.get("dkms_modules")):
        packages.append(f"linux-headers-{journal['target']}")
    return {"name": "install", "package": packages[0], "packages": packages, "version": journal["target"]}


def on_pinned(journal, obs):
    if obs["default"] != journal["old"]:
        raise FlowError(f"the pin did not take: the saved default is {obs['default']}, not {journal['old']}")
    _stamp(journal, obs, "pinned", f"{journal['old']} is the default")
    return journal, install_action(journal, obs)


# Lines of a failed apt-get run that say why (DKMS's build error and its log, dpkg's and apt's errors).
INSTALL_ERROR_MARKS = ("Error", "error", "E: ", "make.log", "exited with return code", "failed")


def install_failure(install: dict[str, Any], packages: str, dkms_modules: list[str] | None = None) -> str:
    """Why the package install failed, in a few lines of its own output (a DKMS module that does not build
    for the new kernel makes the kernel's postinst fail: apt-get exits 100 and the package stays
    half-configured)."""
    lines: list[str] = []
    for text in (install.get("stderr"), install.get("stdout"), install.get("msg")):
        for line in str(text or "").splitlines():
            line = line.strip()
            if line and any(mark in line for mark in INSTALL_ERROR_MARKS) and line not in lines:
                lines.append(line)
    shown = " / ".join(lines[-8:]) or str(install.get("msg") or "no output")
    logs = ", ".join(f"/var/lib/dkms/{m}/*/build/make.log" for m in dkms_modules or []) or "the make.log it names"
    return (f"apt-get install {packages} failed (rc {install.get('rc')}): {shown}. The new kernel is not booted. Its "
            f"packages may be left half-configured (dpkg --audit): fix the cause (a DKMS build: {logs}), "
            "then dpkg --configure -a, or purge them")


def on_installed(journal, obs):
    post = obs["data"].get("preflight") or {}
    install = obs["data"].get("install") or {}
    problems = []
    if truthy(install.get("failed")):
        problems.append(install_failure(install, " ".join(install_action(journal, obs)["packages"]), journal.get("dkms_modules")))
    if not post.get("ok", False):
        problems.append(post.get("msg") or "checks failed")
    if problems:
        return _verdict(journal, obs, "preflight_failed", "after the install: " + "; ".join(problems))
    _stamp(journal, obs, "installed", "post-install checks passed")
    return arm_boot(journal, obs)


def arm_boot(journal, obs):
    """Record the one-shot boot before it happens, with the boot it starts from."""
    journal["boot_id"] = obs["boot_id"]
    _deadline(journal, obs)
    _stamp(journal, obs, "boot_once", f"one-shot boot into {journal['target']} from boot {obs['boot_id']}")
    return journal, {"name": "boot_once", "version": journal["target"], "old": journal["old"],
                     "commit_timeout": commit_timeout(obs["settings"])}


def after_boot(journal, obs):
    """The host is up after the one-shot boot (or the controller lost it around the boot)."""
    if obs["boot_id"] == journal["boot_id"] and obs["running"] == journal["old"]:
        return arm_boot(journal, obs)  # the reboot never happened: do it again
    if obs["running"] == journal["target"]:
        _deadline(journal, obs)
        _stamp(journal, obs, "booted", f"{journal['target']} runs")
        return journal, {"name": "verify"}
    return came_back_old(journal, obs, "the one-shot boot")


def came_back_old(journal, obs, when: str):
    health = obs.get("health") or {}
    if health.get("action") == "revert" and health.get("target") == journal["target"]:
        journal["health"] = health
        return _verdict(journal, obs, "reverted", (
            f"after {when} the host returned to {obs['running']} by itself: its boot-health unit rebooted it from "
            f"{journal['target']} ({'; '.join(health.get('reasons') or ['no reason kept'])})"))
    if journal["stage"] == "boot_once":
        return _verdict(journal, obs, "failed_boot", (
            f"the one-shot boot into {journal['target']} did not come up: the host came back on {obs['running']} "
            "(GRUB fell back to the saved default); read the console log of that boot"))
    return _verdict(journal, obs, "reverted", (
        f"during stage {journal['stage']} the host left {journal['target']} and runs {obs['running']} (a reboot the "
        "flow did not ask for: the commit deadline passed, a crash, or an operator)"))


def on_verified(journal, obs):
    if obs["running"] != journal["target"]:
        return came_back_old(journal, obs, "the verification")
    data = obs["data"]
    problems = []
    missing = data.get("cmdline_missing") or []
    if missing:
        problems.append("kernel arguments missing from /proc/cmdline: " + " ".join(missing))
    if data.get("findings_after") is not None:
        new = new_findings(journal.get("findings_before"), data["findings_after"])
        if new:
            problems.append("PCIe findings the old kernel did not have: " + ", ".join(new))
    vllm = data.get("vllm") or {}
    if truthy(vllm.get("checked")) and not truthy(vllm.get("ok")):
        problems.append("inference server not healthy: " + (vllm.get("msg") or "?"))
    journal["verify"] = {"problems": problems, "at": obs["now"]}
    if problems:
        return _verdict(journal, obs, "verify_failed", f"{journal['target']} booted but {'; '.join(problems)}")
    _deadline(journal, obs)
    _stamp(journal, obs, "candidate", "verified")
    return journal, _benchmark("candidate", _gate_settings(obs)["candidate_min_runs"], 0)


def on_candidate(journal, obs):
    data = obs["data"]
    if obs["running"] != journal["target"] or data.get("kernel") not in (None, journal["target"]):
        return came_back_old(journal, obs, "a candidate benchmark")
    try:
        side = _bench_side(data)
    except FlowError as err:
        return _verdict(journal, obs, "error", f"{err}; rolled back")
    cand = journal.get("candidate")
    if cand:
        mismatch = _round_mismatch(cand, side, "candidate")
        if mismatch:
            return _verdict(journal, obs, "error", f"{mismatch}: runs of different workloads are never compared; rolled back")
        side = _add_rounds(cand, side)
    journal["candidate"] = side
    journal["updated_at"] = obs["now"]
    return judge(journal, obs)


def judge(journal, obs):
    """The gate over the recorded baseline and candidate: more rounds, or the verdict."""
    cand = journal.get("candidate") or {}
    if cand.get("contaminated"):
        return _verdict(journal, obs, "inconclusive", (
            f"inconclusive: candidate runs {', '.join(cand['contaminated'])} on {journal['target']} were contaminated by "
            "foreign load (the server held more requests than the benchmark sent), so the gate may neither pass nor "
            "fail; rolled back. Drain the host before its upgrade and run again."))
    g = _gate_settings(obs)
    if not cand.get("samples"):
        _deadline(journal, obs)
        _stamp(journal, obs, "candidate", "no candidate runs yet")
        return journal, _benchmark("candidate", g["candidate_min_runs"], 0)
    try:
        # a journal written before workload fingerprints has none: the gate judges it and warns
        # ... and none of the per-run latency either: the latency part is then "not measured", never guessed
        gate = decide(journal["baseline"]["samples"], cand["samples"], **_failures(journal), **g,
                      baseline_workload=journal["baseline"].get("workload"), candidate_workload=cand.get("workload"),
                      change="kernel", baseline_latency=journal["baseline"].get("latency"), candidate_latency=cand.get("latency"))
    except GateError as err:
        return _verdict(journal, obs, "error", f"the gate could not judge: {err}")
    journal["gate"] = gate
    rounds = int(cand.get("rounds", 1))
    # The gate's contract: more runs while runs_needed > 0; otherwise its answer is final (an
    # `inconclusive` at the cap too: it rolls back, recorded as inconclusive, never as regression).
    # The cap is in runs, as the gate counts them (not in rounds).
    if not gate.get("final") and gate.get("runs_needed", 0) > 0 and len(cand["samples"]) < g["max_runs"]:
        _deadline(journal, obs)
        _stamp(journal, obs, "candidate", f"round {rounds}: {gate['reason']}")
        return journal, _benchmark("candidate", gate["runs_needed"], rounds, cand.get("concurrency"), measured_only=True)
    return after_gate(journal, obs)


def checks_wanted(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, bool]:
    """The parts measured after the gate: the outputs when they are on and a reference was recorded before the change,
    the stability when it is on and the host's health was kept before the change."""
    s = obs["settings"]
    return {"outputs": truthy(s.get("outputs")) and bool(journal.get("outputs_reference")),
            "stability": truthy(s.get("stability")) and bool(journal.get("health_before"))}


def after_gate(journal: dict[str, Any], obs: dict[str, Any]) -> tuple[dict, dict]:
    """The gate's answer is final: the check of the outputs and the host's health (once), then the serving verdict."""
    wanted = checks_wanted(journal, obs)
    if any(wanted.values()) and journal.get("checks") is None:
        _deadline(journal, obs)
        _stamp(journal, obs, "candidate", "gate final; checking " + " and ".join(k for k, v in wanted.items() if v))
        reference = (journal.get("outputs_reference") or {}).get("path")
        return journal, {"name": "check", **wanted, "reference": reference if wanted["outputs"] else None}
    return serving(journal, obs)


def _left_out(journal: dict[str, Any], obs: dict[str, Any], part: str) -> str:
    """Why a part of the verdict is not measured (the verdict names it)."""
    if not truthy(obs["settings"].get(part)):
        return f"left out ({part}: false)"
    what = "no output reference" if part == "outputs" else "no health document (PCIe audit)"
    return f"{what} was kept before the change (a journal from before this part, or the part turned on mid-upgrade)"


def serving(journal: dict[str, Any], obs: dict[str, Any]) -> tuple[dict, dict]:
    """The serving verdict over the gate's final answer and the checks: pass commits, anything else rolls back."""
    checks, gate = journal.get("checks") or {}, journal.get("gate") or {}
    outputs = checks.get("outputs") or {"status": "not measured", "reason": _left_out(journal, obs, "outputs")}
    base, cand = journal.get("baseline") or {}, journal.get("candidate") or {}
    counted = base.get("requests") and cand.get("requests")
    requests = {"baseline": {"failed": int(base.get("failed") or 0), "requests": int(base["requests"])},
                "candidate": {"failed": int(cand.get("failed") or 0), "requests": int(cand["requests"])}} if counted else None
    after = checks.get("health_after")
    try:
        v = judged_verdict(gate, outputs, journal.get("health_before") if after else None, after,
                           checks.get("kernel_log") or [], requests,
                           stability_left_out=None if after else _left_out(journal, obs, "stability"))
    except (VerdictError, ValueError, TypeError, AttributeError, KeyError) as err:
        # a part of a shape no part has, or a health document damaged below what the journal check reads
        return _verdict(journal, obs, "error", f"the serving verdict could not be given: {err!r}; rolled back")
    return _verdict(journal, obs, v["verdict"], v["reason"], v["parts"])


def on_checked(journal, obs):
    """The outputs compared with the reference and the host audited again, on the candidate after its benchmark."""
    if obs["running"] != journal["target"]:
        return came_back_old(journal, obs, "the check of outputs and health")
    data = obs["data"]
    outputs = data.get("outputs")
    journal["checks"] = {
        "outputs": {k: outputs.get(k) for k in ("verdict", "reason", "figures", "band", "tolerance")} if outputs else None,
        "health_after": data.get("pcie") or None,
        "kernel_log": [line for line in data.get("kernel_log") or [] if "xid" in line.lower()][-KERNEL_LOG_KEEP:],
        "at": obs["now"]}
    journal["updated_at"] = obs["now"]
    return serving(journal, obs)


def on_benchmarked(journal, obs):
    label = obs["data"].get("label")
    if label == "candidate" and journal["stage"] == "candidate":
        return on_candidate(journal, obs)
    if label == "baseline" and journal["stage"] == "baseline":
        return on_baseline_more(journal, obs)
    raise FlowError(f"a {label} benchmark arrived at stage {journal['stage']}: a baseline is only measured before an "
                    "upgrade starts, candidates only after the verification")


def on_committed(journal, obs):
    if journal["stage"] != "verdict" or (journal.get("verdict") or {}).get("decision") != "pass":
        raise FlowError(f"a commit arrived at stage {journal['stage']} without a pass verdict")
    if obs["default"] != journal["target"] or obs["running"] != journal["target"]:
        raise FlowError(f"the commit did not take: running {obs['running']}, saved default {obs['default']}, "
                        f"expected {journal['target']} for both")
    journal["locked"] = list(obs["data"].get("locked") or [])
    _stamp(journal, obs, "committed", f"{journal['target']} is the default")
    return journal, finish("pass", journal["verdict"]["reason"])


def on_rolled_back(journal, obs):
    verdict = journal.get("verdict") or {}
    if journal["stage"] != "verdict" or verdict.get("decision") == "pass":
        raise FlowError(f"a rollback arrived at stage {journal['stage']} without a rollback verdict")
    if obs["running"] != journal["old"] or obs["default"] != journal["old"]:
        return journal, finish("error", (
            f"rollback failed on this host: running {obs['running']}, saved default {obs['default']}, expected "
            f"{journal['old']} for both (verdict was {verdict.get('decision')}: {verdict.get('reason')}). The journal "
            "stays: check grub-editenv /boot/grub/grubenv list and the console, then run again to finish the rollback."))
    journal["locked"] = list(obs["data"].get("locked") or [])
    journal["server_after_rollback"] = obs["data"].get("server")
    _stamp(journal, obs, "rolled_back", f"back on {journal['old']}")
    return journal, finish(verdict["decision"], verdict["reason"])


def on_error(journal, obs):
    msg = obs["data"].get("msg") or "error"
    if journal["stage"] == "baseline":
        _stamp(journal, obs, "stopped", "error before the pin")
        journal["verdict"] = {"decision": "error", "reason": msg, "at": obs["now"]}
        return journal, finish("error", msg + " (before any change to the host)")
    if journal["stage"] == "verdict" and (journal.get("verdict") or {}).get("decision") != "pass":
        verdict = journal["verdict"]
        return journal, finish("error", (
            f"the rollback ({verdict['decision']}: {verdict['reason']}) failed: {msg}. The journal stays at stage "
            "verdict: fix the cause and run again to finish the rollback."))
    return _verdict(journal, obs, "error", f"{msg} (at stage {journal['stage']})")


def resume(journal, obs):
    """A new run finds an unfinished journal: continue from the recorded stage with the recorded
    baseline, or execute the recorded verdict."""
    stage, old, target, running = journal["stage"], journal["old"], journal["target"], obs["running"]
    journal.setdefault("resumed", []).append({"at": obs["now"], "stage": stage, "run_id": obs.get("run_id") or ""})
    if stage == "verdict":
        verdict = journal["verdict"]["decision"]
        if verdict != "pass":
            return journal, rollback_action(journal, obs)
        if running != target:
            return came_back_old(journal, obs, "the pass verdict")
        _deadline(journal, obs)
        return journal, lock_action("commit", target, obs)
    if stage in ("baseline", "pinned", "installed"):
        if running != old:
            raise FlowError(f"the journal says stage {stage} with {old} running, but the host runs {running}")
        if stage == "baseline":
            if obs["default"] != old:
                raise FlowError(f"the journal says stage baseline (nothing changed) but the saved default is "
                                f"{obs['default']}, not {old}")
            if (journal.get("baseline_gate") or {}).get("decided_by") == "baseline-ready":
                return journal, after_baseline(journal, obs)
            return judge_baseline(journal, obs)  # more baseline runs, the too-noisy stop, or on
        if stage == "pinned":
            return journal, install_action(journal, obs)
        return arm_boot(journal, obs)
    if stage == "boot_once":
        return after_boot(journal, obs)
    if stage in ("booted", "candidate"):
        if running != target:
            return came_back_old(journal, obs, f"stage {stage}")
        if stage == "booted":
            return journal, {"name": "verify"}
        return judge(journal, obs)
    raise FlowError(f"the journal's stage {stage!r} is not one of {', '.join(STAGES)}")


def on_rebooted(journal, obs):
    if journal["stage"] != "boot_once":
        raise FlowError(f"a reboot arrived at stage {journal['stage']}; only the one-shot boot reboots mid-flow")
    return after_boot(journal, obs)


# The stage an event may arrive at (the action that produces it was issued there).
EXPECTED_STAGE = {"audited": ("baseline",), "outputs": ("baseline",), "checked": ("candidate",), "pinned": ("baseline",), "installed": ("pinned",),
                  "rebooted": ("boot_once",), "verified": ("booted",), "benchmarked": ("baseline", "candidate"),
                  "committed": ("verdict",), "rolled_back": ("verdict",), "locked": ()}
HANDLERS = {"audited": on_audited, "outputs": on_outputs, "checked": on_checked, "pinned": on_pinned, "installed": on_installed, "rebooted": on_rebooted,
            "verified": on_verified, "benchmarked": on_benchmarked, "committed": on_committed,
            "rolled_back": on_rolled_back}


# ---- the shapes the flow reads: journal records and event data, checked before any step ------------------
def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _numlike(value: Any) -> bool:
    """A finite number, or its text (values templated by the controller arrive as text)."""
    if isinstance(value, str):
        try:
            return math.isfinite(float(value))
        except ValueError:
            return False
    return _num(value)


def _count(value: Any) -> bool:
    """A count: an int >= 0, or its digits."""
    if isinstance(value, str):
        return value.strip().isdecimal()
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _list(item=None):
    return lambda value: isinstance(value, list) and (item is None or all(item(v) for v in value))


def _dict(value: Any) -> bool:
    return isinstance(value, dict)


def _opt(pred):
    return lambda value: value is None or pred(value)


def _samples(value: Any) -> bool:
    """Runs of one level (a list), or ``{level: runs}``."""
    if isinstance(value, dict):
        return all(_count(k) and _list(_numlike)(v) for k, v in value.items())
    return _list(_numlike)(value)


def _runs(value: Any) -> bool:
    """Contaminated runs: a list of run indices, or ``{level: [index]}``."""
    if isinstance(value, dict):
        return all(_count(k) and _list(_numlike)(v) for k, v in value.items())
    return _list(_numlike)(value)


def _latency(value: Any) -> bool:
    """Per-run latency: {metric: [numbers]}, or {level: {metric: [numbers]}}."""
    if not isinstance(value, dict):
        return False
    return all(_list(_numlike)(v) if k in LATENCY_METRICS else _count(k) and _latency(v) for k, v in value.items())


# field: (check, what it must be); a field that is absent is not checked (older journals, optional data)
SIDE_FIELDS = {"latency": (_opt(_latency), "per-run latency: {metric: [ms per run]}"),
               "samples": (_list(_num), "a list of finite numbers"), "files": (_list(_str), "a list of paths"),
               "contaminated": (_list(_str), "a list of run indices as text"), "rounds": (_count, "a count"),
               "failed": (_opt(_count), "a count"), "requests": (_opt(_count), "a count"),
               "concurrency": (_opt(_count), "a concurrency level"), "kernel": (_opt(_str), "a kernel release")}
VERDICT_FIELDS = {"decision": (lambda v: v in DECISIONS, f"one of {', '.join(DECISIONS)}"),
                  "reason": (_str, "text"), "at": (_opt(_num), "epoch seconds"),
                  "parts": (_opt(_dict), "the serving verdict's parts")}


def _health(value: Any) -> bool:
    """A pcie_facts document as the stability part reads it: ``devices`` a dict of dicts, ``gpus`` a list of dicts
    with their ``bdf`` (each optional)."""
    if not isinstance(value, dict):
        return False
    devices, gpus = value.get("devices", {}), value.get("gpus", [])
    return isinstance(devices, dict) and all(isinstance(d, dict) for d in devices.values()) and \
        isinstance(gpus, list) and all(isinstance(g, dict) and isinstance(g.get("bdf"), str) for g in gpus)


def _compared(value: Any) -> bool:
    """output_equivalence's compare result: its verdict one of OUTPUT_ANSWERS."""
    return isinstance(value, dict) and isinstance(value.get("verdict"), str) and value["verdict"] in OUTPUT_ANSWERS


def _checks(value: Any) -> bool:
    """The checks after the gate: outputs (a compare result), health_after (a pcie_facts document), kernel_log."""
    return isinstance(value, dict) and _opt(_compared)(value.get("outputs")) \
        and _opt(_health)(value.get("health_after")) and _opt(_list(_str))(value.get("kernel_log"))


def _side(value: Any) -> bool:
    return isinstance(value, dict) and "samples" in value


def _growing(value: Any) -> bool:
    """A side that more rounds are added to (the baseline before the pin, the candidate)."""
    return value is None or all(k in value for k in ("samples", "files", "contaminated"))


JOURNAL_FIELDS = {
    "run_id": (_str, "text"), "old_entry": (_opt(_str), "a GRUB entry id"), "package": (_opt(_str), "a package name"),
    "target_installed_before": (_opt(lambda v: isinstance(v, bool)), "true or false"),
    "started_at": (_opt(_num), "epoch seconds"), "updated_at": (_opt(_num), "epoch seconds"),
    "dkms_modules": (_opt(_list(_str)), "a list of module names"),
    "baseline": (_opt(_side), "a benchmark side (samples)"),
    "candidate": (_opt(lambda v: _side(v) and _growing(v)), "a benchmark side (samples, files, contaminated)"),
    "findings_before": (_opt(_list(_str)), "a list of code@device"), "gate": (_opt(_dict), "the gate's answer"),
    "baseline_gate": (_opt(_dict), "the gate's answer"), "verdict": (_opt(_dict), "a verdict (decision, reason)"),
    "boot_id": (_opt(_str), "a boot id"), "commit_deadline": (_opt(_num), "epoch seconds"),
    "deadline": (_opt(_dict), "a deadline record (boot_id, uptime)"), "health": (_opt(_dict), "the boot-health result"),
    "verify": (_opt(_dict), "the verification"), "finished": (lambda v: isinstance(v, bool), "true or false"),
    "history": (_list(_dict), "a list of records"), "resumed": (_list(_dict), "a list of records"),
    "taken_over": (_list(_dict), "a list of records"), "locked": (_opt(_list(_str)), "a list of package names"),
    "outputs_reference": (_opt(lambda v: _dict(v) and _str(v.get("path"))), "an output reference record (path, band)"),
    "health_before": (_opt(_health), "a pcie_facts document (devices, gpus)"),
    "checks": (_opt(_checks), "the checks after the gate (outputs, health_after, kernel_log)"),
}
# event: {data field: (check, what it must be)}
EVENT_FIELDS = {
    "benchmarked": {"label": (_opt(_str), "baseline or candidate"), "samples": (_opt(_samples), "runs: a list of "
                    "numbers, or {level: [numbers]}"), "contaminated": (_opt(_runs), "run indices, or {level: [index]}"),
                    "concurrency": (_opt(_count), "a concurrency level (0: the highest)"), "kernel": (_opt(_str), "a "
                    "kernel release"), "files": (_opt(_list(_str)), "a list of paths"), "failed": (_opt(_count), "a "
                    "count"), "requests": (_opt(_count), "a count"), "latency": (_opt(_latency), "per-run latency: "
                    "{metric: [ms]}, or {level: {metric: [ms]}}")},
    "audited": {"findings": (_opt(_list(_dict)), "a list of findings"),
                "pcie": (_opt(_health), "a pcie_facts document (devices, gpus)")},
    "outputs": {"reference": (_opt(_str), "the reference file"), "model": (_opt(_str), "the served model"),
                "band": (_opt(_dict), "the A/A band"), "aa": (_opt(_dict), "the A/A figures")},
    "checked": {"outputs": (_opt(_compared),
                            f"output_equivalence's compare result (verdict {', '.join(OUTPUT_ANSWERS)})"),
                "pcie": (_opt(_health), "a pcie_facts document (devices, gpus)"),
                "kernel_log": (_opt(_list(_str)), "a list of lines")},
    "verified": {"cmdline_missing": (_opt(_list(_str)), "a list of kernel arguments"),
                 "findings_after": (_opt(_list(_dict)), "a list of findings"), "vllm": (_opt(_dict), "vllm_ready's answer")},
    "installed": {"preflight": (_opt(_dict), "kernel_upgrade_preflight's answer"), "install": (_opt(_dict), "apt's answer")},
    "committed": {"locked": (_opt(_list(_str)), "a list of package names")},
    "rolled_back": {"locked": (_opt(_list(_str)), "a list of package names")},
    "locked": {"locked": (_opt(_list(_str)), "a list of package names")},
    "error": {"msg": (_opt(_str), "text")},
}
# nested data fields that reach text: {event: (field, {sub-field: check})}
EVENT_NESTED = {"verified": ("vllm", {"msg": _opt(_str)}), "installed": ("preflight", {"msg": _opt(_str)})}
PREFLIGHT_FIELDS = {"msg": (_opt(_str), "text"), "running_entry": (_opt(_str), "a GRUB entry id"),
                    "package": (_opt(_str), "a package name"), "dkms_modules": (_opt(_list(_str)), "a list of module names")}


def bad_field(record: dict[str, Any], fields: dict[str, tuple]) -> tuple[str, str] | None:
    """(field, what it must be) of the first field of ``record`` that is not what ``fields`` says; None when all are."""
    for key, (check, what) in fields.items():
        if key in record and not check(record[key]):
            return key, what
    return None


def check_event(obs: dict[str, Any]) -> None:
    """The event's data and the preflight result, of the shape the flow reads; FlowError naming the field."""
    event, data, pre = obs["event"], obs.get("data"), obs.get("preflight")
    for name, record, fields in (("data", data, EVENT_FIELDS.get(event, {})), ("preflight", pre, PREFLIGHT_FIELDS)):
        if not isinstance(record, dict):
            raise FlowError(f"the {event} event's {name} is {type(record).__name__}, not a dict: nothing was changed")
        bad = bad_field(record, fields)
        if bad:
            raise FlowError(f"the {event} event's {name} field {bad[0]!r} is {record[bad[0]]!r}, not {bad[1]}: refused, "
                            "nothing was changed")
    field, nested = EVENT_NESTED.get(event, ("", {}))
    inner = data.get(field) if field else None
    for key, check in nested.items():
        if isinstance(inner, dict) and key in inner and not check(inner[key]):
            raise FlowError(f"the {event} event's data field '{field}.{key}' is {inner[key]!r}, not text: refused, "
                            "nothing was changed")


def check_journal(journal: Any, path: str) -> dict[str, Any]:
    """A parsed journal, validated against the shape every step reads (JOURNAL_FIELDS, SIDE_FIELDS,
    VERDICT_FIELDS and what each stage needs), so that no step meets a field it cannot use; FlowError
    with the file, the field and the fix when it cannot be trusted."""
    fix = (f"Nothing was changed. Look at {path}: if the host runs its saved default (uname -r; grub-editenv "
           f"/boot/grub/grubenv list) and no upgrade should be in progress, move it away (mv {path} {path}.broken) "
           "and run again; otherwise repair it from the host's records under /var/lib/gpufleet/kernel_upgrade.")
    if not isinstance(journal, dict):
        raise FlowError(f"the upgrade journal {path} is not a JSON object. {fix}")
    if journal.get("format") != JOURNAL_FORMAT:
        raise FlowError(f"the upgrade journal {path} has format {journal.get('format')!r}, not {JOURNAL_FORMAT}. {fix}")
    for key in ("target", "old", "stage"):
        if not isinstance(journal.get(key), str) or not journal[key]:
            raise FlowError(f"the upgrade journal {path} lacks {key!r}. {fix}")
    if journal["stage"] not in STAGES:
        raise FlowError(f"the upgrade journal {path} has stage {journal['stage']!r}, not one of {', '.join(STAGES)}. {fix}")
    for prefix, record, fields in (("", journal, JOURNAL_FIELDS), ("baseline.", journal.get("baseline"), SIDE_FIELDS),
                                   ("candidate.", journal.get("candidate"), SIDE_FIELDS),
                                   ("verdict.", journal.get("verdict"), VERDICT_FIELDS)):
        bad = bad_field(record or {}, fields)
        if bad:
            raise FlowError(f"the upgrade journal {path} has field '{prefix}{bad[0]}' = {(record or {})[bad[0]]!r}, not "
                            f"{bad[1]}. {fix}")
    stage = journal["stage"]
    if stage in TERMINAL and not journal.get("finished"):
        raise FlowError(f"the upgrade journal {path} is at the final stage {stage} but not finished. {fix}")
    if stage != "baseline" and not (journal.get("baseline") or {}).get("samples"):
        raise FlowError(f"the upgrade journal {path} is at stage {stage} but holds no baseline samples. {fix}")
    if stage == "baseline" and not journal.get("finished") and not (journal.get("baseline") and _growing(journal["baseline"])):
        raise FlowError(f"the upgrade journal {path} is at stage baseline but holds no baseline (samples, files, "
                        f"contaminated). {fix}")
    if stage == "verdict" and not all(k in (journal.get("verdict") or {}) for k in ("decision", "reason")):
        raise FlowError(f"the upgrade journal {path} is at stage verdict but holds no verdict (decision, reason). {fix}")
    return journal


def serving_record(journal: dict[str, Any]) -> dict[str, Any] | None:
    """The journal's serving verdict as the history stores it (bench_history ``verdicts``): its answer, reason and
    parts, the change (``kernel OLD -> TARGET``) and when it was decided (UTC); None without parts."""
    verdict = journal.get("verdict") or {}
    if not verdict.get("parts"):
        return None
    at = verdict.get("at")
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)) if _num(at) else "unknown"
    return {"verdict": verdict["decision"], "keep": verdict["decision"] == "pass", "reason": verdict.get("reason", ""),
            "parts": verdict["parts"], "stage": f"kernel {journal.get('old')} -> {journal.get('target')}",
            "decided_at": when}


def record_facts(journal: dict[str, Any] | None, action: dict[str, Any]) -> dict[str, Any]:
    """What the role's record keeps from the journal and the last action."""
    j = journal or {}
    gate = j.get("gate") or j.get("baseline_gate") or {}  # a stop before any change: the baseline's own gate
    return {"stage": j.get("stage") or "start", "old": j.get("old"), "baseline": j.get("baseline") or {},
            "candidate": j.get("candidate") or {}, "gate": gate, "locked": j.get("locked") or [],
            "server_after_rollback": j.get("server_after_rollback"), "journal_run_id": j.get("run_id"),
            "resumed": j.get("resumed") or [], "taken_over": j.get("taken_over") or [], "verdict": j.get("verdict") or {},
            "serving_verdict": serving_record(j) if j else None,
            "decision": action.get("decision", ""),
            "reason": action.get("reason", "")}

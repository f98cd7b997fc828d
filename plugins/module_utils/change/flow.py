# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One change flow for every kind of risky change: ``step(kind, journal, observation) -> (journal, action)``.

What every change shares lives here once: the journal's life (stamps, history, terminal stages), its run ownership
and take-over, the baseline measured on the old state and its gate loop (``judge_baseline``: more baseline runs, or a
stop before any change), the PCIe audit and output reference before the change, the candidate's gate loop
(``judge``), the checks after it and the serving verdict (bench/verdict.py ``judged_verdict``), the commit, the
rollback, errors and resume. A change **kind** (``ChangeKind``) supplies only its own steps: how to lock it, check it
first (``fresh``), change the host (``change``: the kernel pins the old default, vLLM installs the candidate), activate
and verify it (its own events and stages between ``baseline`` and ``candidate``), and go back (``rollback``).
docs/change_flow.md has the state diagram and the interface.

Shared stages: ``baseline`` (the old state measured; nothing changed yet), the kind's own stages, ``candidate`` (the
candidate benchmarked, round after round), ``verdict`` (``pass`` is committed, anything else rolled back), and the
terminal ``committed`` / ``rolled_back`` / ``stopped`` (the journal goes to the history). The observation's
``running`` and ``default`` name what the host runs now and what it would come back to (the kernel: the running
release and the saved GRUB default; vLLM: the version the unit's venv link points at, twice): the flow compares them
with the journal's ``old`` and ``target`` and needs nothing else of the host.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.gate_settings import GATE, LATENCY_METRICS
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import GateError
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.throughput_gate import (
    check_all_settings, check_count, decide,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.verdict import VerdictError, judged_verdict
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.workload import workload, workload_mismatch
from ansible_collections.gpufleet.inference.plugins.module_utils.change.shapes import (
    EVENT_FIELDS, JOURNAL_FIELDS, OK_DECISIONS, SIDE_FIELDS, VERDICT_FIELDS, bad_field, is_growing, is_num,
)

TERMINAL = ("committed", "rolled_back", "stopped")
SHARED_EVENTS = ("start", "locked", "benchmarked", "audited", "outputs", "checked", "committed", "rolled_back", "error")
# The actions the shared flow answers for every kind, and the event each reports back (a kind adds its own).
SHARED_ACTIONS = {"lock": "locked", "benchmark": "benchmarked", "audit": "audited", "outputs": "outputs",
                  "check": "checked", "commit": "committed", "rollback": "rolled_back"}


def kind_actions(*own: tuple[str, str]) -> tuple[dict[str, str], ...]:
    """A kind's ACTIONS in the order the flow takes them: the shared lock, benchmark, audit and outputs, the kind's own
    (name, event it reports) pairs, then the shared check, commit and rollback (each kind's task files
    roles/<kind>/tasks/action_<name>.yml report these events)."""
    def shared(names: tuple[str, ...]) -> tuple[dict[str, str], ...]:
        return tuple({"name": n, "reports": SHARED_ACTIONS[n]} for n in names)
    return (shared(("lock", "benchmark", "audit", "outputs")) + tuple({"name": n, "reports": e} for n, e in own)
            + shared(("check", "commit", "rollback")))


def kind_stages(*own: str) -> tuple[str, ...]:
    """A kind's journal STAGES: the baseline, the kind's own stages between it and the candidate, then the shared
    candidate, verdict and the three ends."""
    return ("baseline",) + own + ("candidate", "verdict") + TERMINAL


# Kernel log lines the journal keeps for the stability part (the Xid events; the rest is not read).
KERNEL_LOG_KEEP = 200


class FlowError(ValueError):
    """An observation the flow cannot act on; the message says what and what to do."""


Handler = Callable[[dict, dict], tuple]


@dataclass(frozen=True)
class ChangeKind:  # pylint: disable=too-many-instance-attributes
    """What one kind of change supplies to the flow (docs/change_flow.md). Every callable is pure."""
    name: str                     # the change: "kernel", "vllm" (the history's and the fleet report's kind)
    journal_format: str           # the journal's format, checked on every load
    var_prefix: str               # the role's variable prefix, named in advice ("kernel_upgrade")
    gate_change: str              # what the gate lets the workloads differ in (bench/workload.py CHANGES)
    side_key: str                 # the benchmark field naming what it ran on ("kernel", "version")
    side_what: str                # what that field holds, for errors ("a kernel release")
    stages: tuple[str, ...]       # every stage, in order: baseline, the kind's own, candidate, verdict, TERMINAL
    events: tuple[str, ...]       # every event the kind's step module accepts (SHARED_EVENTS and its own)
    handlers: dict[str, tuple[tuple[str, ...], Handler]]  # the kind's event -> (stages it may arrive at, handler)
    fresh: Callable[[dict], tuple[str, str]]  # (decision, reason) on a host without a journal; '' means go
    journal_extra: Callable[[dict], dict]     # the kind's fields of a new journal
    lock: Callable[..., dict]     # (name, version, obs) -> the lock action, before any journal
    commit: Callable[[dict, dict], dict]      # the action that keeps the candidate
    change: Callable[[dict, dict], dict]      # the first action that changes the host (after the baseline's checks)
    rollback: Callable[[dict, dict], dict]    # the action that goes back to ``old``
    resume: Callable[[dict, dict], tuple]     # a new run finds the journal at one of the kind's own stages
    away: Callable[[dict, dict, str], tuple]  # the host does not run the candidate where it must: the verdict
    commit_check: Callable[[dict, dict], tuple[str, str]]    # (what is wrong or '', history note) after the commit
    rollback_check: Callable[[dict, dict], tuple[str, str]]  # (what is wrong or '', what to check) after the rollback
    serving: str                  # what the host shows when no change is in progress, for journal_fix()'s advice
    state_dir: str                # the kind's records on the host (its journal's folder)
    step_module: str              # the module that takes the steps ("kernel_rollout_step"), named in advice
    actions: tuple[dict, ...]     # every action the flow can answer, and the event its role's task file reports
    first_change: str             # the first change, named in the history ("the pin", "the install")
    keepalive: Callable[[dict, dict], None] = lambda journal, obs: None  # each contact while uncommitted
    check_settings: Callable[[dict], None] = lambda settings: None       # FlowError for settings no step can use
    journal_fields: dict = field(default_factory=dict)   # the kind's journal fields: name -> (check, what)
    event_fields: dict = field(default_factory=dict)     # event -> {data field: (check, what)}, merged with shared
    event_nested: dict = field(default_factory=dict)     # event -> (field, {sub-field: check}) of text reaching messages
    preflight_fields: dict = field(default_factory=dict)  # the preflight result's fields the kind reads
    noun: str = "upgrade"         # what the kind makes: "upgrade", "change"
    repair_hint: str = ""         # where in the journal the repair starts, for journal_fix()'s advice

    def journal_fix(self, path: str) -> str:
        """What to do with a journal at ``path`` that cannot be trusted: move it away once the host shows it serves
        as it should, else repair it from the kind's records."""
        return (f"Nothing was changed. Look at {path}: if {self.serving} and no {self.noun} should be in progress, move it "
                f"away (mv {path} {path}.broken) and run again; otherwise repair it{self.repair_hint} from the host's "
                f"records under {self.state_dir}.")

    def expected(self) -> dict[str, tuple[str, ...]]:
        """The stage each event may arrive at (the action that produces it was issued there)."""
        shared = {"audited": ("baseline",), "outputs": ("baseline",), "checked": ("candidate",),
                  "benchmarked": ("baseline", "candidate"), "committed": ("verdict",), "rolled_back": ("verdict",),
                  "locked": ()}
        return {**shared, **{event: stages for event, (stages, _h) in self.handlers.items()}}


# ---- helpers -------------------------------------------------------------------------------------
def truthy(value: Any) -> bool:
    """A flag as the controller templated it: a bool, or its text (``"True"``, ``"false"``, ``"1"``)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "on")
    return bool(value)


def finding_keys(findings: list[dict[str, Any]] | None) -> list[str]:
    return sorted({f"{f.get('code')}@{f.get('device')}" for f in findings or []})


def new_findings(before: list[str] | None, after: list[dict[str, Any]] | None) -> list[str]:
    """PCIe findings after the change that the old state did not have (``code@device``)."""
    return [k for k in finding_keys(after) if k not in set(before or [])]


def finish(decision: str, reason: str) -> dict[str, Any]:
    return {"name": "finish", "decision": decision, "reason": reason.strip(), "ok": decision in OK_DECISIONS}


def stamp(journal: dict[str, Any], obs: dict[str, Any], stage: str, note: str) -> dict[str, Any]:
    journal["stage"] = stage
    journal["updated_at"] = obs["now"]
    journal.setdefault("history", []).append({"stage": stage, "at": obs["now"], "event": obs["event"], "note": note})
    if stage in TERMINAL:
        journal["finished"] = True
        journal["finished_at"] = obs["now"]
    return journal


def verdict(kind: ChangeKind, journal: dict[str, Any], obs: dict[str, Any], decision: str, reason: str,
            parts: dict[str, Any] | None = None) -> tuple[dict, dict]:
    """Record the verdict: ``pass`` is committed (the kind's commit action), anything else rolled back."""
    journal["verdict"] = {"decision": decision, "reason": reason.strip(), "at": obs["now"]}
    if parts is not None:
        journal["verdict"]["parts"] = parts
    stamp(journal, obs, "verdict", decision)
    if decision == "pass":
        kind.keepalive(journal, obs)
        return journal, kind.commit(journal, obs)
    return journal, kind.rollback(journal, obs)


def gated_level(data: dict[str, Any], prefix: str) -> tuple[int | None, list[float], list[str]]:
    """The gated concurrency level of a benchmark, its throughput samples and its contaminated runs.

    ``samples`` is inference_benchmark's ``{level: [tok/s per run]}`` (or one list); ``concurrency``
    0 picks the highest level; ``contaminated`` is ``{level: [run index]}`` (or one list). ``prefix``: the role's
    variables, named in the advice."""
    samples, level, dirty = data.get("samples") or [], int(data.get("concurrency") or 0), data.get("contaminated") or []
    if isinstance(samples, dict):
        levels = sorted(int(k) for k in samples)
        if not levels:
            raise FlowError("the benchmark returned no samples: look at its output on the host")
        level = level or levels[-1]
        if level not in levels:
            raise FlowError(f"the gated concurrency {level} was not measured (levels {levels}): set "
                            f"{prefix}_gate_concurrency to one of inference_benchmark_concurrency, or 0")
        samples = samples.get(str(level), samples.get(level))
        if isinstance(dirty, dict):
            dirty = dirty.get(str(level), dirty.get(level)) or []
    elif isinstance(dirty, dict):
        dirty = [r for runs in dirty.values() for r in runs]
    return (level or None), [float(v) for v in samples or []], [str(r) for r in dirty]


def bench_side(kind: ChangeKind, data: dict[str, Any]) -> dict[str, Any]:
    """One benchmark round as the journal keeps it: the gated level's runs, its failures and requests (checked
    counts), what it ran on (the kind's ``side_key``) and the workload fingerprint at that level (from the result's
    ``server``, ``config`` and ``client``: the model and its identity, the engine, the benchmark settings; {} when the
    role sent none)."""
    level, samples, dirty = gated_level(data, kind.var_prefix)
    try:
        failed, requests = check_count("failed", data.get("failed") or 0), check_count("requests", data.get("requests") or 0)
        fingerprint = workload({k: data[k] for k in ("server", "config", "client") if data.get(k)}, level)
    except GateError as err:
        raise FlowError(f"the benchmark result cannot be used: {err}") from None
    return {"samples": samples, "files": list(data.get("files") or []), kind.side_key: data.get(kind.side_key),
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


def gate_settings(kind: ChangeKind, obs: dict[str, Any]) -> dict[str, Any]:
    """The role's gate settings (<prefix>_gate_*) as decide() options; one the role does not send is the gate's
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
        if g.get("between_start_sd") not in (None, ""):
            out["between_start_sd"] = float(g["between_start_sd"])
    except (TypeError, ValueError) as err:
        raise FlowError(f"a gate setting is not a number ({err}): set the {kind.var_prefix}_gate_* variables to "
                        "numbers") from None
    return out


def settings_problem(kind: ChangeKind, obs: dict[str, Any]) -> str:
    """Why the gate's settings cannot give a verdict ('' when they can), checked before any run is measured."""
    try:
        check_all_settings(**gate_settings(kind, obs))
    except (GateError, FlowError) as err:
        return (f"the gate's settings cannot be used: {err}. Nothing was measured or changed; fix the "
                f"{kind.var_prefix}_gate_* variables and run again")
    return ""


def benchmark(label: str, runs: int, seed: int, level: int | None = None, measured_only: bool = False) -> dict[str, Any]:
    """A benchmark action. Extra rounds (``measured_only``) run only the gated ``level``, without warm-up or
    settle runs; ``concurrency`` None means every configured level."""
    return {"name": "benchmark", "label": label, "runs": int(runs), "seed": int(seed), "measured_only": measured_only,
            "concurrency": int(level) if measured_only and level else None}


# ---- before any journal ------------------------------------------------------------------------
def start_fresh(kind: ChangeKind, obs: dict[str, Any]) -> tuple[None, dict[str, Any]]:
    problem = settings_problem(kind, obs)
    if problem:
        return None, finish("error", problem)
    decision, reason = kind.fresh(obs)
    lockable = obs["running"] == obs["default"] and obs["settings"].get("lock", True) and decision != "refused"
    if obs["event"] == "start" and lockable:
        return None, kind.lock("lock", obs["running"], obs)
    if decision:
        return None, finish(decision, reason)
    return None, benchmark("baseline", gate_settings(kind, obs)["min_runs"], 0)


def new_journal(kind: ChangeKind, obs: dict[str, Any]) -> dict[str, Any]:
    return {"format": kind.journal_format, "run_id": obs.get("run_id") or "", "target": obs["target"],
            "old": obs["running"], "started_at": obs["now"], "updated_at": obs["now"], "stage": None, "baseline": None,
            "candidate": None, "findings_before": None, "gate": None, "verdict": None, "finished": False, "history": [],
            **kind.journal_extra(obs)}


# ---- the machine -----------------------------------------------------------------------------------
def step(kind: ChangeKind, journal: dict[str, Any] | None, obs: dict[str, Any]) -> tuple[dict[str, Any] | None, dict]:
    """One transition. ``obs``: event, data, preflight (this run's preflight result), running, default, now, target,
    run_id, take_over (why this run may resume another run's journal, or empty), settings, and what the kind reads.

    Returns the journal to write (``None``: nothing to write) and the next action. Raises FlowError
    for an observation that contradicts the journal (the module refuses, nothing changed).
    """
    event = obs["event"]
    if event not in kind.events:
        raise FlowError(f"unknown event {event!r}: one of {', '.join(kind.events)}")
    kind.check_settings(obs["settings"])
    check_event(kind, obs)
    if journal is not None:
        journal = copy.deepcopy(journal)
    if journal is None or journal.get("finished"):
        return step_fresh(kind, obs)
    if journal["target"] != obs["target"]:
        return journal, finish("refused", (
            f"an upgrade to {journal['target']} (run {journal.get('run_id') or '?'}) is in progress at stage "
            f"{journal['stage']}, but this run asks for {obs['target']}: nothing is changed. Run again with "
            f"{kind.var_prefix}_target: {journal['target']} to finish (or roll back) that upgrade first."))
    refusal = take_over(kind, journal, obs)
    if refusal:
        return journal, refusal
    if event == "error":
        return on_error(kind, journal, obs)
    if event == "start" and obs["settings"].get("check_mode"):
        _journal, action = resume(kind, journal, obs)
        return None, finish("planned", f"would resume the upgrade to {journal['target']} (run "
                                       f"{journal.get('run_id') or '?'}) from stage {journal['stage']}: next "
                                       f"{action['name']}{' (' + action['decision'] + ')' if 'decision' in action else ''}")
    if event == "start":
        return resume(kind, journal, obs)
    expected = kind.expected()
    handler = SHARED_HANDLERS.get(event) or (kind.handlers.get(event) or ((), None))[1]
    if handler is None or journal["stage"] not in expected.get(event, kind.stages):
        raise FlowError(f"event {event!r} arrived at stage {journal['stage']}: it belongs to stage "
                        f"{' or '.join(expected.get(event, ('none',)))}; nothing was changed")
    if event in SHARED_HANDLERS:
        return handler(kind, journal, obs)
    return handler(journal, obs)


def take_over(kind: ChangeKind, journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any] | None:
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
            f"run that holds the host's lease (playbooks/{kind.var_prefix}.yml takes over the lease of a run that "
            f"died), or take it over explicitly ({kind.step_module} take_over: {owner or '(empty)'}) once that run is "
            "gone."))
    journal["run_id"] = run
    journal.setdefault("taken_over", []).append({"from": owner, "by": run, "at": obs["now"], "stage": journal["stage"],
                                                 "why": why})
    return None


def step_fresh(kind: ChangeKind, obs: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    event = obs["event"]
    if event in ("start", "locked"):
        return start_fresh(kind, obs)
    if event == "error":
        return None, finish("error", (obs["data"].get("msg") or "error") + " (before any change to the host)")
    if event == "benchmarked" and obs["data"].get("label") == "baseline":
        return on_baseline(kind, obs)
    raise FlowError(f"event {event!r} arrived but no upgrade is in progress on this host (no journal)")


def on_baseline(kind: ChangeKind, obs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    data = obs["data"]
    decision, reason = kind.fresh(obs)
    if decision:
        raise FlowError(f"a baseline arrived but the host may not be upgraded: {decision}: {reason}")
    if data.get(kind.side_key) not in (None, obs["running"]):
        raise FlowError(f"the baseline was measured on {data.get(kind.side_key)}, but the host runs {obs['running']}, "
                        "its saved default: measure the baseline again")
    journal = new_journal(kind, obs)
    journal["baseline"] = bench_side(kind, data)
    return judge_baseline(kind, journal, obs)


def stop_before_change(journal: dict[str, Any], obs: dict[str, Any], decision: str, reason: str,
                       note: str) -> tuple[dict, dict]:
    """End an upgrade that changed nothing yet (stage baseline): the verdict is kept, nothing to roll back."""
    journal["verdict"] = {"decision": decision, "reason": reason.strip(), "at": obs["now"]}
    stamp(journal, obs, "stopped", note)
    return journal, finish(decision, reason)


def judge_baseline(kind: ChangeKind, journal: dict[str, Any], obs: dict[str, Any]) -> tuple[dict, dict]:
    """Before any change: the gate judges the baseline alone. More baseline runs while it asks for them (the
    baseline cannot be extended after the change), a stop with nothing changed when the host is too noisy
    or drifting, else on to the PCIe audit, the output reference and the kind's first change."""
    base = journal["baseline"]
    if base["contaminated"]:
        return stop_before_change(journal, obs, "inconclusive", (
            f"inconclusive: the baseline on {journal['old']} was contaminated by foreign load (runs "
            f"{', '.join(base['contaminated'])}: the server held more requests than the benchmark sent), so no gate "
            "can be trusted; nothing was changed. Drain the host (stop other clients, take it out of the load "
            "balancer) and run again."), "baseline contaminated")
    g = gate_settings(kind, obs)
    fails = _failures(journal)
    try:
        gate = decide(base["samples"], [], baseline_failed=fails["baseline_failed"],
                      baseline_requests=fails["baseline_requests"], baseline_latency=base.get("latency"),
                      baseline_workload=base.get("workload"), **g)
    except GateError as err:
        return stop_before_change(journal, obs, "error", f"the gate could not judge the baseline: {err} (before any "
                                  "change to the host)", "baseline not judged")
    journal["baseline_gate"] = gate
    runs, rounds = len(base["samples"]), int(base.get("rounds", 1))
    cap = int(g.get("max_baseline_runs", GATE.max_baseline_runs))  # in runs, as the gate counts them
    if not gate.get("final") and gate.get("baseline_runs_needed", 0) > 0 and runs < cap:
        stamp(journal, obs, "baseline", f"baseline round {rounds}: {gate['reason']}")
        return journal, benchmark("baseline", gate["baseline_runs_needed"], 100 + rounds, base.get("concurrency"),
                                  measured_only=True)
    if gate.get("final") or gate.get("decided_by") != "baseline-ready":
        reason = gate.get("reason") or f"the baseline was not ready after {runs} runs"
        if "nothing was changed" not in reason.lower():
            reason += ". Nothing was changed."
        return stop_before_change(journal, obs, "inconclusive", reason, gate.get("decided_by") or "baseline not ready")
    stamp(journal, obs, "baseline", f"{runs} runs, {gate['reason']}")
    return journal, after_baseline(kind, journal, obs)


def after_baseline(kind: ChangeKind, journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    """What comes after a ready baseline, on the old state: the PCIe audit (the findings to compare after the change
    and the health document of the stability part), the output reference (``outputs``), then the kind's change."""
    s = obs["settings"]
    if (s.get("verify_pcie", True) or truthy(s.get("stability"))) and journal.get("findings_before") is None:
        return {"name": "audit"}
    if truthy(s.get("outputs")) and not journal.get("outputs_reference"):
        return {"name": "outputs", "mode": "record", "version": journal["old"]}
    return kind.change(journal, obs)


def on_baseline_more(kind: ChangeKind, journal: dict[str, Any], obs: dict[str, Any]) -> tuple[dict, dict]:
    """More baseline runs the baseline gate asked for, still on the old state, its saved default."""
    data = obs["data"]
    if (journal.get("baseline_gate") or {}).get("decided_by") == "baseline-ready" or journal.get("findings_before") is not None:
        raise FlowError("more baseline runs arrived, but the baseline was already judged ready: nothing was changed")
    measured = data.get(kind.side_key)
    if obs["running"] != journal["old"] or obs["default"] != journal["old"] or measured not in (None, journal["old"]):
        raise FlowError(f"baseline runs arrived from {measured or obs['running']} (saved default "
                        f"{obs['default']}), but the baseline belongs to {journal['old']}, running as the saved default")
    try:
        more = bench_side(kind, data)
    except FlowError as err:
        return stop_before_change(journal, obs, "error", f"{err} (before any change to the host)", "baseline not judged")
    mismatch = _round_mismatch(journal["baseline"], more, "baseline")
    if mismatch:
        return stop_before_change(journal, obs, "error", f"{mismatch}: runs of different workloads are never compared. "
                                  "Nothing was changed; run again with the same benchmark settings", "baseline not judged")
    journal["baseline"] = _add_rounds(journal["baseline"], more)
    journal["updated_at"] = obs["now"]
    return judge_baseline(kind, journal, obs)


def on_audited(kind: ChangeKind, journal, obs):
    if (journal.get("baseline_gate") or {}).get("decided_by") != "baseline-ready":
        raise FlowError("a PCIe audit arrived before the baseline was judged ready; nothing was changed")
    if journal["stage"] != "baseline":
        raise FlowError(f"a PCIe audit arrived at stage {journal['stage']}; it belongs after the baseline")
    journal["findings_before"] = finding_keys(obs["data"].get("findings"))
    if truthy(obs["settings"].get("stability")) and obs["data"].get("pcie"):
        journal["health_before"] = obs["data"]["pcie"]
    journal["updated_at"] = obs["now"]
    return journal, after_baseline(kind, journal, obs)


def on_outputs(kind: ChangeKind, journal, obs):
    """The output reference, recorded on the old state before any change (output_equivalence mode=record): the journal
    keeps where it is and its A/A band; the check after the candidate's benchmark compares the candidate with it."""
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
                                    "aa": data.get("aa") or {}, kind.side_key: journal["old"], "at": obs["now"]}
    journal["updated_at"] = obs["now"]
    stamp(journal, obs, "baseline", f"output reference recorded on {journal['old']}: {data['reference']}")
    return journal, kind.change(journal, obs)


def candidate_round(kind: ChangeKind, journal: dict[str, Any], obs: dict[str, Any], note: str) -> tuple[dict, dict]:
    """The candidate is active and verified: on to its first benchmark round (the kind calls this from its verify)."""
    kind.keepalive(journal, obs)
    stamp(journal, obs, "candidate", note)
    return journal, benchmark("candidate", gate_settings(kind, obs)["candidate_min_runs"], 0)


def on_candidate(kind: ChangeKind, journal, obs):
    data = obs["data"]
    if obs["running"] != journal["target"] or data.get(kind.side_key) not in (None, journal["target"]):
        return kind.away(journal, obs, "a candidate benchmark")
    try:
        side = bench_side(kind, data)
    except FlowError as err:
        return verdict(kind, journal, obs, "error", f"{err}; rolled back")
    cand = journal.get("candidate")
    if cand:
        mismatch = _round_mismatch(cand, side, "candidate")
        if mismatch:
            return verdict(kind, journal, obs, "error",
                           f"{mismatch}: runs of different workloads are never compared; rolled back")
        side = _add_rounds(cand, side)
    journal["candidate"] = side
    journal["updated_at"] = obs["now"]
    return judge(kind, journal, obs)


def judge(kind: ChangeKind, journal, obs):
    """The gate over the recorded baseline and candidate: more rounds, or the verdict."""
    cand = journal.get("candidate") or {}
    if cand.get("contaminated"):
        return verdict(kind, journal, obs, "inconclusive", (
            f"inconclusive: candidate runs {', '.join(cand['contaminated'])} on {journal['target']} were contaminated by "
            "foreign load (the server held more requests than the benchmark sent), so the gate may neither pass nor "
            "fail; rolled back. Drain the host before its upgrade and run again."))
    g = gate_settings(kind, obs)
    if not cand.get("samples"):
        kind.keepalive(journal, obs)
        stamp(journal, obs, "candidate", "no candidate runs yet")
        return journal, benchmark("candidate", g["candidate_min_runs"], 0)
    try:
        # a journal written before workload fingerprints has none: the gate judges it and warns
        # ... and none of the per-run latency either: the latency part is then "not measured", never guessed
        gate = decide(journal["baseline"]["samples"], cand["samples"], **_failures(journal), **g,
                      baseline_workload=journal["baseline"].get("workload"), candidate_workload=cand.get("workload"),
                      change=kind.gate_change, baseline_latency=journal["baseline"].get("latency"),
                      candidate_latency=cand.get("latency"))
    except GateError as err:
        return verdict(kind, journal, obs, "error", f"the gate could not judge: {err}")
    journal["gate"] = gate
    rounds = int(cand.get("rounds", 1))
    # The gate's contract: more runs while runs_needed > 0; otherwise its answer is final (an
    # `inconclusive` at the cap too: it rolls back, recorded as inconclusive, never as regression).
    # The cap is in runs, as the gate counts them (not in rounds).
    if not gate.get("final") and gate.get("runs_needed", 0) > 0 and len(cand["samples"]) < g["max_runs"]:
        kind.keepalive(journal, obs)
        stamp(journal, obs, "candidate", f"round {rounds}: {gate['reason']}")
        return journal, benchmark("candidate", gate["runs_needed"], rounds, cand.get("concurrency"), measured_only=True)
    return after_gate(kind, journal, obs)


def checks_wanted(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, bool]:
    """The parts measured after the gate: the outputs when they are on and a reference was recorded before the change,
    the stability when it is on and the host's health was kept before the change."""
    s = obs["settings"]
    return {"outputs": truthy(s.get("outputs")) and bool(journal.get("outputs_reference")),
            "stability": truthy(s.get("stability")) and bool(journal.get("health_before"))}


def after_gate(kind: ChangeKind, journal: dict[str, Any], obs: dict[str, Any]) -> tuple[dict, dict]:
    """The gate's answer is final: the check of the outputs and the host's health (once), then the serving verdict."""
    wanted = checks_wanted(journal, obs)
    if any(wanted.values()) and journal.get("checks") is None:
        kind.keepalive(journal, obs)
        stamp(journal, obs, "candidate", "gate final; checking " + " and ".join(k for k, v in wanted.items() if v))
        reference = (journal.get("outputs_reference") or {}).get("path")
        return journal, {"name": "check", **wanted, "reference": reference if wanted["outputs"] else None}
    return serving(kind, journal, obs)


def _left_out(journal: dict[str, Any], obs: dict[str, Any], part: str) -> str:
    """Why a part of the verdict is not measured (the verdict names it)."""
    if not truthy(obs["settings"].get(part)):
        return f"left out ({part}: false)"
    what = "no output reference" if part == "outputs" else "no health document (PCIe audit)"
    return f"{what} was kept before the change (a journal from before this part, or the part turned on mid-upgrade)"


def serving(kind: ChangeKind, journal: dict[str, Any], obs: dict[str, Any]) -> tuple[dict, dict]:
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
        return verdict(kind, journal, obs, "error", f"the serving verdict could not be given: {err!r}; rolled back")
    notes = (journal.get("verify") or {}).get("notes") or []
    reason = v["reason"] + (f"; noted at the verification: {'; '.join(notes)}" if notes else "")
    return verdict(kind, journal, obs, v["verdict"], reason, v["parts"])


def on_checked(kind: ChangeKind, journal, obs):
    """The outputs compared with the reference and the host audited again, on the candidate after its benchmark."""
    if obs["running"] != journal["target"]:
        return kind.away(journal, obs, "the check of outputs and health")
    data = obs["data"]
    outputs = data.get("outputs")
    journal["checks"] = {
        "outputs": {k: outputs.get(k) for k in ("verdict", "reason", "figures", "band", "tolerance")} if outputs else None,
        "health_after": data.get("pcie") or None,
        "kernel_log": [line for line in data.get("kernel_log") or [] if "xid" in line.lower()][-KERNEL_LOG_KEEP:],
        "at": obs["now"]}
    journal["updated_at"] = obs["now"]
    return serving(kind, journal, obs)


def on_benchmarked(kind: ChangeKind, journal, obs):
    label = obs["data"].get("label")
    if label == "candidate" and journal["stage"] == "candidate":
        return on_candidate(kind, journal, obs)
    if label == "baseline" and journal["stage"] == "baseline":
        return on_baseline_more(kind, journal, obs)
    raise FlowError(f"a {label} benchmark arrived at stage {journal['stage']}: a baseline is only measured before an "
                    "upgrade starts, candidates only after the verification")


def on_committed(kind: ChangeKind, journal, obs):
    if journal["stage"] != "verdict" or (journal.get("verdict") or {}).get("decision") != "pass":
        raise FlowError(f"a commit arrived at stage {journal['stage']} without a pass verdict")
    problem, note = kind.commit_check(journal, obs)
    if problem:
        raise FlowError(f"the commit did not take: {problem}")
    journal["locked"] = list(obs["data"].get("locked") or [])
    stamp(journal, obs, "committed", note)
    return journal, finish("pass", journal["verdict"]["reason"])


def on_rolled_back(kind: ChangeKind, journal, obs):
    result = journal.get("verdict") or {}
    if journal["stage"] != "verdict" or result.get("decision") == "pass":
        raise FlowError(f"a rollback arrived at stage {journal['stage']} without a rollback verdict")
    problem, note = kind.rollback_check(journal, obs)
    if problem:
        return journal, finish("error", (
            f"rollback failed on this host: {problem} (verdict was {result.get('decision')}: {result.get('reason')}). "
            "The journal stays: " + note + ", then run again to finish the rollback."))
    journal["locked"] = list(obs["data"].get("locked") or [])
    journal["server_after_rollback"] = obs["data"].get("server")
    stamp(journal, obs, "rolled_back", f"back on {journal['old']}")
    return journal, finish(result["decision"], result["reason"])


def on_error(kind: ChangeKind, journal, obs):
    msg = obs["data"].get("msg") or "error"
    if journal["stage"] == "baseline":
        stamp(journal, obs, "stopped", f"error before {kind.first_change}")
        journal["verdict"] = {"decision": "error", "reason": msg, "at": obs["now"]}
        return journal, finish("error", msg + " (before any change to the host)")
    if journal["stage"] == "verdict" and (journal.get("verdict") or {}).get("decision") != "pass":
        result = journal["verdict"]
        return journal, finish("error", (
            f"the rollback ({result['decision']}: {result['reason']}) failed: {msg}. The journal stays at stage "
            "verdict: fix the cause and run again to finish the rollback."))
    return verdict(kind, journal, obs, "error", f"{msg} (at stage {journal['stage']})")


def resume(kind: ChangeKind, journal, obs):
    """A new run finds an unfinished journal: continue from the recorded stage with the recorded
    baseline, or execute the recorded verdict; the kind resumes its own stages."""
    stage, old, target, running = journal["stage"], journal["old"], journal["target"], obs["running"]
    journal.setdefault("resumed", []).append({"at": obs["now"], "stage": stage, "run_id": obs.get("run_id") or ""})
    if stage == "verdict":
        if journal["verdict"]["decision"] != "pass":
            return journal, kind.rollback(journal, obs)
        if running != target:
            return kind.away(journal, obs, "the pass verdict")
        kind.keepalive(journal, obs)
        return journal, kind.commit(journal, obs)
    if stage == "baseline":
        if running != old:
            raise FlowError(f"the journal says stage {stage} with {old} running, but the host runs {running}")
        if obs["default"] != old:
            raise FlowError(f"the journal says stage baseline (nothing changed) but the saved default is "
                            f"{obs['default']}, not {old}")
        if (journal.get("baseline_gate") or {}).get("decided_by") == "baseline-ready":
            return journal, after_baseline(kind, journal, obs)
        return judge_baseline(kind, journal, obs)  # more baseline runs, the too-noisy stop, or on
    if stage == "candidate":
        if running != target:
            return kind.away(journal, obs, f"stage {stage}")
        return judge(kind, journal, obs)
    if stage in kind.stages and stage not in TERMINAL:
        return kind.resume(journal, obs)
    raise FlowError(f"the journal's stage {stage!r} is not one of {', '.join(kind.stages)}")


SHARED_HANDLERS = {"audited": on_audited, "outputs": on_outputs, "checked": on_checked, "benchmarked": on_benchmarked,
                   "committed": on_committed, "rolled_back": on_rolled_back}


# ---- the shapes the flow reads, checked before any step -------------------------------------------------
def check_event(kind: ChangeKind, obs: dict[str, Any]) -> None:
    """The event's data and the preflight result, of the shape the flow reads; FlowError naming the field."""
    event, data, pre = obs["event"], obs.get("data"), obs.get("preflight")
    fields = {**EVENT_FIELDS.get(event, {}), **kind.event_fields.get(event, {})}
    for name, record, wanted in (("data", data, fields), ("preflight", pre, kind.preflight_fields)):
        if not isinstance(record, dict):
            raise FlowError(f"the {event} event's {name} is {type(record).__name__}, not a dict: nothing was changed")
        bad = bad_field(record, wanted)
        if bad:
            raise FlowError(f"the {event} event's {name} field {bad[0]!r} is {record[bad[0]]!r}, not {bad[1]}: refused, "
                            "nothing was changed")
    key, nested = kind.event_nested.get(event, ("", {}))
    inner = data.get(key) if key else None
    for sub, check in nested.items():
        if isinstance(inner, dict) and sub in inner and not check(inner[sub]):
            raise FlowError(f"the {event} event's data field '{key}.{sub}' is {inner[sub]!r}, not text: refused, "
                            "nothing was changed")


def check_journal(kind: ChangeKind, journal: Any, path: str) -> dict[str, Any]:
    """A parsed journal, validated against the shape every step reads (the shared and the kind's fields, the sides,
    the verdict and what each stage needs), so that no step meets a field it cannot use; FlowError with the file,
    the field and the fix when it cannot be trusted."""
    fix = kind.journal_fix(path)
    if not isinstance(journal, dict):
        raise FlowError(f"the upgrade journal {path} is not a JSON object. {fix}")
    if journal.get("format") != kind.journal_format:
        raise FlowError(f"the upgrade journal {path} has format {journal.get('format')!r}, not {kind.journal_format}. {fix}")
    for key in ("target", "old", "stage"):
        if not isinstance(journal.get(key), str) or not journal[key]:
            raise FlowError(f"the upgrade journal {path} lacks {key!r}. {fix}")
    if journal["stage"] not in kind.stages:
        raise FlowError(f"the upgrade journal {path} has stage {journal['stage']!r}, not one of "
                        f"{', '.join(kind.stages)}. {fix}")
    side_fields = {**SIDE_FIELDS, kind.side_key: (lambda v: v is None or isinstance(v, str), kind.side_what)}
    for prefix, record, fields in (("", journal, {**JOURNAL_FIELDS, **kind.journal_fields}),
                                   ("baseline.", journal.get("baseline"), side_fields),
                                   ("candidate.", journal.get("candidate"), side_fields),
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
    if stage == "baseline" and not journal.get("finished") and not (journal.get("baseline") and is_growing(journal["baseline"])):
        raise FlowError(f"the upgrade journal {path} is at stage baseline but holds no baseline (samples, files, "
                        f"contaminated). {fix}")
    if stage == "verdict" and not all(k in (journal.get("verdict") or {}) for k in ("decision", "reason")):
        raise FlowError(f"the upgrade journal {path} is at stage verdict but holds no verdict (decision, reason). {fix}")
    return journal


def serving_record(kind: ChangeKind, journal: dict[str, Any]) -> dict[str, Any] | None:
    """The journal's serving verdict as the history stores it (bench_history ``verdicts``): its answer, reason and
    parts, the change (``<kind> OLD -> TARGET``) and when it was decided (UTC); None without parts."""
    result = journal.get("verdict") or {}
    if not result.get("parts"):
        return None
    at = result.get("at")
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)) if is_num(at) else "unknown"
    return {"verdict": result["decision"], "keep": result["decision"] == "pass", "reason": result.get("reason", ""),
            "parts": result["parts"], "stage": f"{kind.name} {journal.get('old')} -> {journal.get('target')}",
            "decided_at": when}


def record_facts(kind: ChangeKind, journal: dict[str, Any] | None, action: dict[str, Any]) -> dict[str, Any]:
    """What the role's record keeps from the journal and the last action."""
    j = journal or {}
    gate = j.get("gate") or j.get("baseline_gate") or {}  # a stop before any change: the baseline's own gate
    return {"kind": kind.name, "stage": j.get("stage") or "start", "old": j.get("old"), "baseline": j.get("baseline") or {},
            "candidate": j.get("candidate") or {}, "gate": gate, "locked": j.get("locked") or [],
            "server_after_rollback": j.get("server_after_rollback"), "journal_run_id": j.get("run_id"),
            "resumed": j.get("resumed") or [], "taken_over": j.get("taken_over") or [], "verdict": j.get("verdict") or {},
            "serving_verdict": serving_record(kind, j) if j else None,
            "decision": action.get("decision", ""),
            "reason": action.get("reason", "")}

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Measured tuning: baseline first, one change at a time, every step kept only if the numbers say so.

Pure logic over one host's state document (the module keeps it in a JSON file on the host, so a
run that dies resumes where it stopped). The playbook asks ``next_action(state)`` what to do, does
it (apply or revert a stage through its roles, reboot, benchmark every profile) and reports back
with ``complete(state, action_id, ...)``; every decision is made here:

* ``plan_stages`` checks the user's stage list and groups every stage that needs a reboot into one
  ``reboot`` stage, measured as one (placed where the first of them was).
* The baseline is measured before any change. Each stage is applied alone and benchmarked; its
  runs are judged by the throughput gate (bench/throughput_gate.py ``decide()``) per profile and concurrency
  level against the *state before it* (the last kept measurement). Any regression: revert. All
  pass: keep. Otherwise inconclusive: with rounds left, measure more candidate runs (the gate says
  how many); then the user's ``inconclusive`` choice (default ``revert``). Stages named in
  ``force_revert`` are measured and judged like the others, then reverted whatever the gate said (to see
  what a change does without keeping it; the table keeps the verdict).
* The keep-or-revert decision is the serving verdict (bench/verdict.py): the gate's throughput and latency parts over
  every profile and level, the outputs compared with a reference recorded at the baseline (for stages that can change
  them: vLLM flag stages by default, ``outputs: true`` on any stage), and the host's health (the PCIe audit after the
  stage's benchmark against the one after its reference's, with the Xid lines of the kernel log). ``diverged`` and
  ``unstable`` revert like a regression; a part left out (``verdict``: outputs or stability false) or not asked of a
  stage is named ``not measured`` in its reason, never passed silently.
* A revert runs the stage's ``revert`` tasks (each role's ``state: absent`` or the readings recorded
  before the stage, written ``@name``), then the kept stages of the same roles again, so a revert of
  one pcie_link stage does not undo another kept one. vLLM flag stages revert to the kept flags.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from typing import Any, Sequence

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.gate_settings import GATE
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.throughput_gate import (
    check_all_settings, decide, latency_series,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.gate_settings import (
    DEFAULT_LATENCY_MARGINS, check_latency_margins,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.profiles import (
    ProfileError, check_arrivals, check_goodput, check_profile,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import GateError
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.verdict import (
    OUTPUT_ANSWERS, VerdictError, judged_verdict,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.workload import workload, workload_mismatch

FORMAT = "gpufleet.tune_measured/1"
DECISIONS = ("keep", "revert")
RECORDINGS = ("aspm_policy", "hugepages_2m_per_node")

# Named benchmark profiles the guides ask for; users may override fields or add their own.
PROFILES: dict[str, dict[str, Any]] = {
    "serving": {"prompt_tokens": 1024, "output_tokens": 128, "concurrency": [8, 32], "requests": 128,
                "repetitions": 5},
    "latency": {"prompt_tokens": 1024, "output_tokens": 128, "concurrency": [1], "requests": 16, "repetitions": 5},
    "long_context": {"prompt_tokens": "near_max", "output_tokens": 64, "concurrency": [2], "requests": 8,
                     "repetitions": 5},
    # a 2048-token system prompt shared by every request: what prefix caching speeds up
    "shared_prefix": {"prompt_tokens": 256, "output_tokens": 128, "concurrency": [32], "requests": 128, "repetitions": 5,
                      "profile": "shared_prefix", "profile_options": {"prefix_tokens": 2048}},
    # chat-shaped lengths arriving as Poisson traffic (the rate is the site's: arrivals.rate must be given), where a
    # long prompt stalls the decoding batch unless it is chunked; judged on latency as much as on tok/s
    "mixed_open_loop": {"prompt_tokens": 256, "output_tokens": 128, "concurrency": [256], "requests": 256,
                        "repetitions": 5, "profile": "mixed_lengths", "profile_options": {"preset": "chat"},
                        "arrivals": {"mode": "poisson"}, "goodput": {"ttft_ms": 2000, "tpot_ms": 100}},
}
PROFILE_KEYS = ("prompt_tokens", "output_tokens", "concurrency", "requests", "repetitions", "warmup", "settle_runs",
                "seed", "prompt_mode", "ignore_eos", "token_id_range", "latency_margins", "profile", "profile_options",
                "arrivals", "goodput")
# The benchmark profile that can see a vLLM flag's effect (docs/benchmark.md, "A profile per stage"): a flag stage
# setting one is judged on it when it is measured (stage key judged_on overrides; any regression reverts anyway).
# max_num_seqs shows at the concurrency the site serves: the serving profile, whose levels the site sets.
FLAG_PROFILES = {"vllm_service_enable_prefix_caching": "shared_prefix",
                 "vllm_service_enable_chunked_prefill": "mixed_open_loop",
                 "vllm_service_max_num_batched_tokens": "mixed_open_loop",
                 "vllm_service_max_num_seqs": "serving"}
# The gate's settings here: the gate's own defaults (GateSettings), and the automatic threshold's two of its own.
GATE_DEFAULTS = {"threshold": GATE.threshold, "alpha": GATE.alpha, "pass_alpha": GATE.pass_alpha, "min_runs": GATE.min_runs,
                 "max_runs": GATE.max_runs, "auto_k": 3.0, "auto_floor": 0.5, "latency_margins": {},
                 "latency_alpha": GATE.latency_alpha, "between_start_sd": GATE.between_start_sd}
# What a benchmark result must share with its profile to be taken as that profile's measurement (its config);
# repetitions, warm-up, settle runs and the seed differ between rounds by design.
PROFILE_MATCH = ("prompt_tokens", "output_tokens", "requests", "prompt_mode", "ignore_eos", "token_id_range")
# The serving verdict's parts beyond the gate, and where the output reference is kept on the host.
VERDICT_DEFAULTS = {"outputs": True, "stability": True,
                    "reference": "/var/lib/gpufleet/tune_measured/outputs-reference.json"}
KERNEL_LOG_KEEP = 200  # Xid lines of the kernel log kept per stage


class TuneError(ValueError):
    """A stage list, profile or report that cannot be used, saying which and why."""


# ---- plan -----------------------------------------------------------------------------------------
def resolve_profiles(profiles: Sequence[Any], max_model_len: int | None = None) -> list[dict[str, Any]]:
    """Profile names or dicts -> complete profiles; ``near_max`` prompts fill max_model_len less the output."""
    out, seen = [], set()
    for i, p in enumerate(profiles):
        if not isinstance(p, (str, dict)):
            raise TuneError(f"profiles[{i}] is {p!r}: give a profile name ({', '.join(PROFILES)}) or a dict with name")
        spec = {"name": p} if isinstance(p, str) else dict(p)
        name = spec.get("name")
        if not name or not isinstance(name, str):
            raise TuneError(f"profiles[{i}] has no name: give a profile name ({', '.join(PROFILES)}) or a dict with name")
        if name in seen:
            raise TuneError(f"profile {name!r} is listed twice")
        seen.add(name)
        base = dict(PROFILES.get(name, {}))
        if not base and "concurrency" not in spec:
            raise TuneError(f"profile {name!r} is not one of {', '.join(PROFILES)}; a profile of your own needs at "
                            "least concurrency, prompt_tokens and output_tokens")
        unknown = sorted(set(spec) - set(PROFILE_KEYS) - {"name"})
        if unknown:
            raise TuneError(f"profile {name!r} has unknown keys {', '.join(unknown)}; known: {', '.join(PROFILE_KEYS)}")
        for k, v in spec.items():  # the request profile's dicts are merged key by key (arrivals: {rate: 8})
            if k in ("profile_options", "arrivals", "goodput") and isinstance(v, dict):
                base[k] = {**(base.get(k) or {}), **v}
            elif k != "name":
                base[k] = v
        _check_request_profile(name, base)
        if "latency_margins" in base:
            try:  # the profile's own latency margins, over the gate's (a latency profile may be stricter on TTFT)
                check_latency_margins(base["latency_margins"])
            except GateError as err:
                raise TuneError(f"profile {name!r}: {err}") from None
        if base.get("prompt_tokens") == "near_max":
            if not max_model_len:
                raise TuneError(f"profile {name!r} asks for a prompt near max_model_len, but the server's max_model_len "
                                "is not known: pass max_model_len (the playbook reads it from /v1/models)")
            # leave the output and a few tokens of chat template room
            base["prompt_tokens"] = max(1, int(max_model_len) - int(base["output_tokens"]) - 8)
        base["name"] = name
        base["concurrency"] = [int(c) for c in base["concurrency"]]
        out.append(base)
    if not out:
        raise TuneError("no benchmark profile: list at least one (serving, latency, long_context)")
    return out


def _check_request_profile(name: str, profile: dict[str, Any]) -> None:
    """A benchmark profile's request profile, arrivals and goodput targets (bench/profiles.py), or TuneError."""
    try:
        check_profile(profile.get("profile"), profile.get("profile_options"))
        check_goodput(profile.get("goodput"))
        check_arrivals(profile.get("arrivals"))
    except ProfileError as err:
        rate = " (the request rate the site serves, e.g. arrivals: {rate: 8})" if "needs arrivals.rate" in str(err) else ""
        raise TuneError(f"profile {name!r}: {err}{rate}") from None


def _task_list(value: Any, where: str) -> list[dict[str, Any]]:
    tasks = value if isinstance(value, list) else [value]
    for i, t in enumerate(tasks):
        if not isinstance(t, dict) or not (("role" in t) ^ ("restart" in t)):
            raise TuneError(f"{where}[{i}] must be a dict with either role (and vars) or restart (a systemd unit)")
    return [{"role": t["role"], "vars": dict(t.get("vars") or {})} if "role" in t else {"restart": t["restart"]}
            for t in tasks]


def check_stage(stage: Any, i: int) -> dict[str, Any]:
    if not isinstance(stage, dict) or not stage.get("name"):
        raise TuneError(f"stages[{i}] needs a name")
    name = stage["name"]
    if name in ("baseline", "reboot"):
        raise TuneError(f"stage name {name!r} is reserved; call it something else")
    if "role" in stage:
        apply = [{"role": stage["role"], "vars": dict(stage.get("vars") or {})}]
    elif "apply" in stage:
        apply = _task_list(stage["apply"], f"stage {name!r} apply")
    else:
        raise TuneError(f"stage {name!r} needs role (with vars) or apply (a list of tasks)")
    revert = _task_list(stage.get("revert", []), f"stage {name!r} revert") if stage.get("revert") else []
    if not revert and stage.get("kind") != "vllm":
        raise TuneError(f"stage {name!r} has no revert: give the tasks that undo it (the role with state: absent, or "
                        "the recorded originals as @name)")
    record = list(stage.get("record") or [])
    for r in record:
        if r not in RECORDINGS:
            raise TuneError(f"stage {name!r} records {r!r}; known readings: {', '.join(RECORDINGS)}")
    kind = stage.get("kind", "host")
    outputs = stage.get("outputs", kind == "vllm")  # a vLLM flag (a KV-cache dtype) can change what the model answers
    if not isinstance(outputs, bool):
        raise TuneError(f"stage {name!r} has outputs {outputs!r}: true (compare its outputs with the baseline's) or false")
    return {"name": name, "kind": kind, "description": stage.get("description", ""),
            "apply": apply, "revert": revert, "reboot": bool(stage.get("reboot", False)), "record": record,
            "files": list(stage.get("files") or []), "members": [name], "outputs": outputs}


def vllm_stages(profiles: Sequence[Any], role: str = "gpufleet.inference.vllm_service") -> list[dict[str, Any]]:
    """vLLM flag profiles ``[{name, vars: {vllm_service_*: value}, description}]`` -> stages of kind vllm."""
    out = []
    for i, p in enumerate(profiles or []):
        if not isinstance(p, dict) or not p.get("name") or not isinstance(p.get("vars"), dict) or not p["vars"]:
            raise TuneError(f"vllm profile {i} must be a dict with name and vars (vllm_service_* variables), got {p!r}")
        bad = sorted(k for k in p["vars"] if not k.startswith("vllm_service_"))
        if bad:
            raise TuneError(f"vllm profile {p['name']!r} sets {', '.join(bad)}: only vllm_service_* variables are flags")
        out.append({"name": p["name"], "kind": "vllm", "role": role, "vars": dict(p["vars"]),
                    "description": p.get("description", ""), "outputs": p.get("outputs", True)})
    return out


def stage_judging(stage: dict[str, Any], checked: dict[str, Any]) -> dict[str, Any]:
    """A stage's ``judged_on`` (the profiles it names) and ``sees`` (the profile its vLLM flag shows on, FLAG_PROFILES,
    from the variables it applies); TuneError for a judged_on that is not a list of names."""
    judged_on = stage.get("judged_on") or []
    judged_on = [judged_on] if isinstance(judged_on, str) else judged_on
    if not isinstance(judged_on, list) or not all(isinstance(p, str) for p in judged_on):
        raise TuneError(f"stage {checked['name']!r} judged_on must name benchmark profiles, got {stage.get('judged_on')!r}")
    flags = sorted(k for t in checked["apply"] for k in (t.get("vars") or {}) if k in FLAG_PROFILES)
    return {"judged_on": list(judged_on), "sees": FLAG_PROFILES[flags[0]] if flags else ""}


def judging_profiles(stages: list[dict[str, Any]], profiles: list[dict[str, Any]]) -> None:
    """Each stage's ``judged_on``: the profiles it names (each must be measured), else the profile its flag shows on
    (``sees``) when measured, else every profile (``judged_note`` says which profile would have seen it)."""
    names = [p["name"] for p in profiles]
    for s in stages:
        missing = [p for p in s.get("judged_on") or [] if p not in names]
        if missing:
            raise TuneError(f"stage {s['name']!r} is judged on {', '.join(missing)}, which the run does not measure "
                            f"(profiles: {', '.join(names)}): add it to the profiles (tune_measured_profiles)")
        if not s.get("judged_on") and s.get("sees"):
            if s["sees"] in names:
                s["judged_on"] = [s["sees"]]
            else:
                s["judged_note"] = (f"its effect shows on the {s['sees']} profile, which was not measured: judged on "
                                    f"every profile measured; add {s['sees']} to the profiles to see it")


def plan_stages(stages: Sequence[Any], skip: Sequence[str] = (), force_revert: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Checked stages in the user's order, skipped ones dropped, reboot stages grouped into one; stages named in
    ``force_revert`` (or members of the reboot group, which reverts as one) marked to be reverted whatever the gate says."""
    checked = [check_stage(s, i) for i, s in enumerate(stages)]
    for raw, stage in zip(stages, checked):  # the profile that judges it (issue 35)
        stage.update(stage_judging(raw, stage))
    names = [s["name"] for s in checked]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise TuneError(f"stage names must be unique: {', '.join(dupes)}")
    unknown = sorted(set(skip) - set(names))
    if unknown:
        raise TuneError(f"skip names {', '.join(unknown)}, which are not stages ({', '.join(names)})")
    kept = [s for s in checked if s["name"] not in skip]
    out: list[dict[str, Any]] = []
    group = None
    for s in kept:
        if not s["reboot"]:
            out.append(s)
            continue
        if group is None:
            group = {"name": "reboot", "kind": "reboot", "description": "", "apply": [], "revert": [], "reboot": True,
                     "record": [], "files": [], "members": []}
            out.append(group)
        group["apply"] += s["apply"]
        group["revert"] += s["revert"]
        group["record"] += [r for r in s["record"] if r not in group["record"]]
        group["files"] += [f for f in s["files"] if f not in group["files"]]
        group["members"].append(s["name"])
        group["outputs"] = group.get("outputs", False) or s.get("outputs", False)
    if group:
        group["description"] = "one reboot for " + ", ".join(group["members"])
    unknown = sorted(set(force_revert) - set(names) - {"reboot"})
    if unknown:
        raise TuneError(f"force_revert names {', '.join(unknown)}, which are not stages ({', '.join(names)}, or reboot "
                        "for the reboot group)")
    gone = sorted(set(force_revert) & set(skip))
    if gone:
        raise TuneError(f"force_revert names {', '.join(gone)}, which skip leaves out: a stage not run cannot be reverted")
    for s in out:
        if s["name"] in force_revert or set(s["members"]) & set(force_revert):
            s["force_revert"] = True
    return out


def changed_text(stage: dict[str, Any]) -> str:
    """What a stage changes, in one line (for the table)."""
    if stage.get("description"):
        return stage["description"]
    parts = []
    for t in stage["apply"]:
        if "role" in t:
            short = t["role"].rsplit(".", 1)[-1]
            parts.append(short + ": " + ", ".join(f"{k[len(short) + 1:] if k.startswith(short + '_') else k}={v}"
                                                  for k, v in t["vars"].items() if not k.endswith("_reboot_ok")))
        else:
            parts.append(f"restart {t['restart']}")
    return "; ".join(parts)


def _baseline_cap(g: dict[str, Any]) -> int:
    """The gate's baseline cap: measured tuning never extends a reference, so any cap from min_runs on will do (the
    gate's default of 15 refused every min_runs above 15)."""
    return g["min_runs"] if isinstance(g["min_runs"], int) and g["min_runs"] > 15 else 15


def check_verdict(verdict: dict[str, Any] | None) -> dict[str, Any]:
    """The serving verdict's settings (``outputs``, ``stability``: bools; ``reference``: an absolute path), the
    defaults of VERDICT_DEFAULTS for the ones not given."""
    v = {**VERDICT_DEFAULTS, **{k: x for k, x in (verdict or {}).items() if x is not None}}
    unknown = sorted(set(v) - set(VERDICT_DEFAULTS))
    if unknown:
        raise TuneError(f"verdict settings {', '.join(unknown)} are unknown; known: {', '.join(VERDICT_DEFAULTS)}")
    for key in ("outputs", "stability"):
        if not isinstance(v[key], bool):
            raise TuneError(f"verdict {key} must be true or false, got {v[key]!r}")
    if not isinstance(v["reference"], str) or not v["reference"].startswith("/"):
        raise TuneError(f"verdict reference must be an absolute path on the host, got {v['reference']!r}")
    return v


def new_state(host: str, stages: list[dict[str, Any]], profiles: list[dict[str, Any]], gate: dict[str, Any],
              inconclusive: str = "revert", more_rounds: int = 1, vllm_defaults: dict[str, Any] | None = None,
              started_at: str = "", verdict: dict[str, Any] | None = None) -> dict[str, Any]:
    if inconclusive not in DECISIONS:
        raise TuneError(f"inconclusive must be keep or revert, got {inconclusive!r}")
    g = dict(GATE_DEFAULTS)
    g.update({k: v for k, v in (gate or {}).items() if v is not None})
    unknown = sorted(set(g) - set(GATE_DEFAULTS))
    if unknown:
        raise TuneError(f"gate settings {', '.join(unknown)} are unknown; known: {', '.join(GATE_DEFAULTS)}")
    if g["threshold"] == "auto":
        g["threshold_basis"] = "auto"
    else:
        try:
            g["threshold"] = float(g["threshold"])
        except (TypeError, ValueError):
            raise TuneError(f"gate threshold must be a ratio in (0, 1] or auto, got {g['threshold']!r}") from None
        if not 0.0 < g["threshold"] <= 1.0:
            raise TuneError(f"gate threshold must be in (0, 1] or auto, got {g['threshold']}")
        g["threshold_basis"] = "given"
    for key in ("min_runs", "max_runs"):  # templated by the playbook: "5" is 5
        if isinstance(g[key], str) and g[key].strip().isdigit():
            g[key] = int(g[key])
    for key in ("alpha", "pass_alpha", "latency_alpha"):
        try:
            g[key] = float(g[key]) if isinstance(g[key], str) else g[key]
        except ValueError:
            raise TuneError(f"gate {key} must be a number in (0, 0.5), got {g[key]!r}") from None
    if isinstance(g["between_start_sd"], str):  # templated by the playbook: "0.008" is 0.008, "" is null
        try:
            g["between_start_sd"] = float(g["between_start_sd"]) if g["between_start_sd"].strip() else None
        except ValueError:
            raise TuneError(f"gate between_start_sd must be a number from 0 to 0.2 or null, got {g['between_start_sd']!r}") from None
    try:  # every setting the gate will use, before the baseline is measured (auto: the threshold comes later)
        threshold = g["threshold"] if g["threshold_basis"] == "given" and g["threshold"] < 1.0 else GATE.threshold
        check_all_settings(threshold=threshold, alpha=g["alpha"], pass_alpha=g["pass_alpha"], min_runs=g["min_runs"],
                           max_runs=g["max_runs"], max_baseline_runs=_baseline_cap(g), candidate_min_runs=3, bootstrap=1000,
                           latency_margins=g["latency_margins"], latency_alpha=g["latency_alpha"],
                           between_start_sd=g["between_start_sd"])
    except (GateError, TypeError) as err:
        raise TuneError(f"gate settings cannot be used: {err}") from None
    entries = [{"name": "baseline", "kind": "baseline", "description": "as found", "apply": [], "revert": [],
                "reboot": False, "record": [], "files": [], "members": [], "status": "pending"}]
    for s in stages:
        e = copy.deepcopy(s)
        e["status"] = "pending"
        entries.append(e)
    judging_profiles(entries[1:], profiles)
    for e in entries:
        e.update(measurements={}, verdicts={}, verdict=None, decision=None, reference=None, rounds=0, recorded={},
                 snapshots={}, reason="")
    return {"format": FORMAT, "host": host, "started_at": started_at, "finished_at": None, "plan_key": None,
            "profiles": profiles, "gate": g, "inconclusive": inconclusive, "more_rounds": int(more_rounds),
            "vllm_defaults": dict(vllm_defaults or {}), "stages": entries, "seq": 0, "pending": None,
            "verdict": check_verdict(verdict)}


# ---- the loop -------------------------------------------------------------------------------------
def _current(state: dict[str, Any]) -> dict[str, Any] | None:
    for e in state["stages"]:
        if e["status"] not in ("kept", "reverted", "baseline"):
            return e
    return None


def reference_of(state: dict[str, Any], upto: dict[str, Any]) -> dict[str, Any]:
    """The last measured state before ``upto`` that is still in place (the baseline or a kept stage)."""
    ref = state["stages"][0]
    for e in state["stages"]:
        if e is upto:
            break
        if e["status"] in ("kept", "baseline"):
            ref = e
    return ref


def resolve_vars(values: dict[str, Any], recorded: dict[str, Any], stage: str) -> dict[str, Any]:
    out = {}
    for k, v in values.items():
        if isinstance(v, str) and v.startswith("@"):
            if v[1:] not in recorded:
                raise TuneError(f"stage {stage!r} reverts {k} to the recorded {v[1:]}, which was not recorded before "
                                f"it was applied (add {v[1:]!r} to the stage's record list)")
            v = recorded[v[1:]]
        out[k] = v
    return out


def kept_vllm_flags(state: dict[str, Any]) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    for e in state["stages"]:
        if e["kind"] == "vllm" and e["status"] == "kept":
            for t in e["apply"]:
                flags.update(t.get("vars", {}))
    return flags


def revert_tasks(state: dict[str, Any], stage: dict[str, Any]) -> list[dict[str, Any]]:
    """What undoes ``stage``: its revert tasks with recorded values, then the kept stages of the same roles again."""
    if stage["kind"] == "vllm":
        kept = kept_vllm_flags(state)
        tasks = []
        for t in stage["apply"]:
            values = {k: kept.get(k, state["vllm_defaults"].get(k)) for k in t["vars"]}
            missing = [k for k, v in values.items() if v is None and k not in kept and k not in state["vllm_defaults"]]
            if missing:
                raise TuneError(f"stage {stage['name']!r}: no value to revert {', '.join(missing)} to (not kept by an "
                                "earlier stage and not in vllm_defaults); give revert tasks or vllm_defaults")
            tasks.append({"role": t["role"], "vars": {**kept, **values}})
        return tasks + resolve_revert(stage)
    tasks = resolve_revert(stage)
    roles = {t["role"] for t in stage["apply"] if "role" in t}
    for e in state["stages"]:
        if e["status"] == "kept" and e is not stage:
            tasks += [t for t in e["apply"] if t.get("role") in roles]
    return tasks


def resolve_revert(stage: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": t["role"], "vars": resolve_vars(t["vars"], stage["recorded"], stage["name"])} if "role" in t
            else dict(t) for t in stage["revert"]]


def checks_for(state: dict[str, Any], e: dict[str, Any], first_round: bool) -> dict[str, Any]:
    """What the playbook does after a benchmark for the serving verdict: ``audit`` (pcie_facts and the kernel log: the
    stability part, after every benchmark), ``outputs`` (``record`` the reference at the baseline when a stage will
    compare with it, ``compare`` on a stage's first round when it can change outputs and a reference was recorded,
    else None) and the ``reference`` file."""
    v = state.get("verdict") or VERDICT_DEFAULTS  # a state from before the verdict: its defaults
    outputs = None
    if v["outputs"] and e["kind"] == "baseline" and any(s.get("outputs") for s in state["stages"][1:]):
        outputs = "record"
    elif v["outputs"] and first_round and e.get("outputs") and state["stages"][0].get("outputs_reference"):
        outputs = "compare"
    return {"audit": bool(v["stability"]), "outputs": outputs, "reference": v["reference"] if outputs else None}


def _action(state: dict[str, Any], kind: str, stage: dict[str, Any], **extra: Any) -> dict[str, Any]:
    state["seq"] += 1
    act = {"id": state["seq"], "action": kind, "stage": stage["name"], "tasks": [], "reboot": False,
           "record": [], "files": [], "profiles": [], "repetitions": None,
           "checks": {"audit": False, "outputs": None, "reference": None}}
    act.update(extra)
    state["pending"] = act
    return act


def next_action(state: dict[str, Any]) -> dict[str, Any]:
    """What the playbook does next; the same answer until complete() is told it was done."""
    if state.get("pending"):
        return state["pending"]
    e = _current(state)
    if e is None:
        return {"id": state["seq"], "action": "done", "stage": None, "tasks": [], "reboot": False, "record": [],
                "files": [], "profiles": [], "repetitions": None, "checks": {"audit": False, "outputs": None, "reference": None}}
    if e["status"] == "pending" and e["kind"] == "baseline":
        return _action(state, "benchmark", e, profiles=state["profiles"], checks=checks_for(state, e, True))
    if e["status"] == "pending":
        tasks = [dict(t) for t in e["apply"]]
        if e["kind"] == "vllm":
            kept = kept_vllm_flags(state)
            tasks = [{"role": t["role"], "vars": {**kept, **t["vars"]}} for t in e["apply"]]
        return _action(state, "apply", e, tasks=tasks, reboot=e["reboot"], record=e["record"], files=e["files"])
    if e["status"] == "applied":
        return _action(state, "benchmark", e, profiles=state["profiles"], checks=checks_for(state, e, True))
    if e["status"] == "more":
        reps = max(v.get("runs_needed") or 0 for lv in e["verdicts"].values() for v in lv.values()) or \
            state["gate"]["min_runs"]
        return _action(state, "benchmark", e, profiles=state["profiles"], repetitions=reps,
                       checks=checks_for(state, e, False))
    if e["status"] == "reverting":
        return _action(state, "revert", e, tasks=revert_tasks(state, e), reboot=e["reboot"], files=e["files"])
    raise TuneError(f"stage {e['name']!r} is in an unknown status {e['status']!r}: the state file is damaged; "
                    "move it away to start over")


def profile_mismatch(profile: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    """Where a benchmark result was not measured with its profile ("field: profile X, result Y"): the settings of
    PROFILE_MATCH its config carries, and every measured level must be one of the profile's."""
    if not isinstance(doc, dict):
        return [f"the result is {type(doc).__name__}, not a benchmark result"]
    cfg = doc.get("config") or {}
    want = workload({k: profile[k] for k in PROFILE_MATCH if k in profile})
    got = workload({k: cfg[k] for k in PROFILE_MATCH if k in cfg})
    out = [f"{k}: profile {want[k]!r}, result {got[k]!r}" for k in PROFILE_MATCH if k in want and k in got and want[k] != got[k]]
    out += _request_profile_mismatch(profile, cfg)
    levels = [lv.get("concurrency") for lv in doc.get("levels") or [] if isinstance(lv, dict)]
    extra = [c for c in levels if c not in profile["concurrency"]]
    if extra:
        out.append(f"concurrency: profile {profile['concurrency']}, result {levels}")
    return out


def _request_profile_mismatch(profile: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    """The request profile and arrivals a result's config records against the benchmark profile's (a result stored
    before profiles sent random prompts in a closed loop); long_context's fitted length is the server's business."""
    want = {"profile": check_profile(profile.get("profile"), profile.get("profile_options")),
            "arrivals": check_arrivals(profile.get("arrivals"))}
    got = {"profile": cfg.get("profile") if isinstance(cfg.get("profile"), dict) else {"name": "random"},
           "arrivals": cfg.get("arrivals") if isinstance(cfg.get("arrivals"), dict) else {"mode": "closed"}}
    got["profile"] = {k: v for k, v in got["profile"].items() if k != "prompt_tokens" or want["profile"]["name"] != "long_context"}
    return [f"{k}: profile {want[k]!r}, result {got[k]!r}" for k in want if want[k] != got[k]]


def _measurement(doc: dict[str, Any], profile: str = "") -> dict[str, Any]:
    """One profile's result, per level: the runs, latencies, failures (errors and short outputs) of its requests and
    the workload fingerprint at that level."""
    levels = {}
    for lv in doc.get("levels") or []:
        out = lv.get("output_throughput") or {}
        fingerprint = workload({k: doc[k] for k in ("server", "config", "client") if doc.get(k)}, int(lv["concurrency"]))
        if fingerprint:
            fingerprint["profile"] = profile
        levels[str(lv["concurrency"])] = {
            "concurrency": int(lv["concurrency"]), "samples": list(out.get("values") or []),
            "median": out.get("median"), "cv": out.get("cv"),
            "ttft_p50_ms": (lv.get("ttft_ms") or {}).get("p50"), "ttft_p99_ms": (lv.get("ttft_ms") or {}).get("p99"),
            "tpot_p50_ms": (lv.get("tpot_ms") or {}).get("p50"), "tpot_p99_ms": (lv.get("tpot_ms") or {}).get("p99"),
            "errors": lv.get("errors"), "failed": (lv.get("errors") or 0) + (lv.get("short_outputs") or 0),
            "requests": lv.get("requests"), "workload": fingerprint,
            "latency": latency_series(lv.get("runs") or [])}  # per run, for the gate's latency part
    return {"levels": levels, "finished_at": doc.get("finished_at"), "kernel": doc.get("kernel")}


def _failures(side: str, lv: dict[str, Any]) -> dict[str, Any]:
    """A level's failures for the gate; a measurement stored before requests were kept counts none."""
    if lv.get("requests") is None:
        return {f"{side}_failed": 0, f"{side}_requests": 0}
    return {f"{side}_failed": lv.get("failed") or 0, f"{side}_requests": lv["requests"]}


def _merge(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    if not old:
        return new
    merged = copy.deepcopy(old)
    for key, lv in new["levels"].items():
        if key in merged["levels"]:
            diff = workload_mismatch(merged["levels"][key].get("workload"), lv.get("workload"))
            if diff:
                raise TuneError(f"the new round of c={key} was measured on another workload than its earlier runs ("
                                + "; ".join(diff) + "): runs of different workloads are never compared")
            for count in ("failed", "requests"):
                if lv.get(count) is not None and merged["levels"][key].get(count) is not None:
                    merged["levels"][key][count] += lv[count]
            merged["levels"][key]["samples"] += lv["samples"]
            # a latency metric is kept while every round carries it (a state stored before has none: not measured)
            old_lat = merged["levels"][key].get("latency") or {}
            merged["levels"][key]["latency"] = {k: v + lv["latency"][k] for k, v in old_lat.items()
                                                if k in (lv.get("latency") or {})}
            s = sorted(merged["levels"][key]["samples"])
            merged["levels"][key]["median"] = (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2.0
            for k in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "cv", "errors"):
                merged["levels"][key][k] = lv[k]
        else:
            merged["levels"][key] = lv
    merged["finished_at"] = new["finished_at"]
    return merged


def fit_threshold(state: dict[str, Any], baseline: dict[str, Any]) -> None:
    """Say how the threshold fits the baseline's run-to-run CV; with ``threshold: auto`` set it from that CV.

    auto: ``1 - auto_k x (largest CV of any profile and level)``, at least ``auto_floor``, at most 0.95. A
    gate can only see drops several times larger than the run-to-run noise (k = 3 by default).
    """
    g = state["gate"]
    cvs = [(lv.get("cv") or 0.0, f"{name} c={key}") for name, m in baseline["measurements"].items()
           for key, lv in m["levels"].items()]
    cv, where = max(cvs) if cvs else (0.0, "none")
    g["baseline_cv"] = round(cv, 4)
    g["baseline_cv_at"] = where
    if g.get("threshold_basis") == "auto":
        g["threshold"] = round(min(GATE.threshold, max(float(g["auto_floor"]), 1.0 - float(g["auto_k"]) * cv)), 3)
        floor = f", floor {g['auto_floor']}" if g["threshold"] == g["auto_floor"] else ""
        g["threshold_basis"] = (f"auto: 1 - {g['auto_k']:g} x the baseline's largest run-to-run CV {cv:.1%} "
                                f"({where}) = {g['threshold']}{floor}")
        g["latency_auto"] = _auto_latency_margins(baseline, float(g["auto_k"]))
    else:
        fits = 1.0 - g["threshold"] >= 3.0 * cv
        g["threshold_basis"] = (f"given {g['threshold']}; the baseline's largest run-to-run CV is {cv:.1%} ({where}): "
                                + ("the drop it looks for is at least 3 CVs" if fits else
                                   f"a drop of {1 - g['threshold']:.0%} is under 3 CVs, so expect inconclusive "
                                   "answers; lengthen the runs or use threshold: auto"))


def _latency_inputs(g: dict[str, Any], profile: dict[str, Any], ref_lv: dict[str, Any], lv: dict[str, Any]) -> dict[str, Any]:
    """The gate's latency part for one level: the per-run latency of both sides and the margins in force (the
    profile's over the gate's); a measurement stored before per-run latency was kept has none (``not measured``)."""
    auto = {k: max(v, DEFAULT_LATENCY_MARGINS[k]) for k, v in (g.get("latency_auto") or {}).items()}
    margins = {**auto, **(g.get("latency_margins") or {}), **(profile.get("latency_margins") or {})}
    return {"baseline_latency": ref_lv.get("latency") or None, "candidate_latency": lv.get("latency") or None,
            "latency_margins": margins, "latency_alpha": g.get("latency_alpha", GATE.latency_alpha)}


def latency_summary(part: dict[str, Any]) -> dict[str, Any]:
    """What the state and the stage table keep of the gate's latency part: its status and, per metric, the answer,
    the candidate/baseline ratio, its interval and the margin."""
    return {"status": part["status"], **({"reason": part["reason"]} if part.get("reason") else {}),
            **({"not_judged": dict(part["not_judged"])} if part.get("not_judged") else {}),
            "metrics": {k: {f: m[f] for f in ("decision", "ratio", "interval", "margin", "baseline_ms", "candidate_ms",
                                              "reason", "final") if f in m}
                        for k, m in part["metrics"].items()}}


def _worst(flat: list[dict[str, Any]], verdict: str) -> dict[str, Any]:
    """The level that decided the stage: the first with the stage's verdict (a latency regression at an equal tok/s
    is named, not the level with the lowest tok/s ratio), else the lowest tok/s ratio."""
    hits = [v for v in flat if v["decision"] == verdict]
    return hits[0] if hits and verdict != "pass" else min(flat, key=lambda v: v["ratio"] if v["ratio"] is not None else 1.0)


def _auto_latency_margins(baseline: dict[str, Any], k: float) -> dict[str, float]:
    """With ``threshold: auto``, each latency metric's default margin widened as the throughput threshold is: to k x the
    baseline's largest run-to-run CV of that metric (sd of the logs over its runs, any profile and level), at most
    1.0. Margins the user set (gate or profile) are kept as given."""
    out: dict[str, float] = {}
    for m in baseline["measurements"].values():
        for lv in m["levels"].values():
            for key, values in (lv.get("latency") or {}).items():
                if len(values) >= 3 and min(values) > 0:
                    logs = [math.log(v) for v in values]
                    mean = sum(logs) / len(logs)
                    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
                    out[key] = max(out.get(key, 0.0), min(1.0, round(k * sd, 3)))
    return out


def stage_change(e: dict[str, Any]) -> str:
    """The change a stage is about, for the gate's workload check: a vLLM flag stage ``vllm_flags`` (the server's
    argv may differ from its reference's), any other (host stages, the reboot group) ``host`` (nothing may)."""
    return "vllm_flags" if e.get("kind") == "vllm" else "host"


def judge(state: dict[str, Any], e: dict[str, Any]) -> None:
    """Gate every profile and level of ``e`` against its reference; set verdict, decision and status."""
    ref = reference_of(state, e)
    e["reference"] = ref["name"]
    g = state["gate"]
    verdicts: dict[str, dict[str, Any]] = {}
    for prof in state["profiles"]:
        name = prof["name"]
        base, cand = ref["measurements"].get(name), e["measurements"].get(name)
        if not base or not cand:
            raise TuneError(f"stage {e['name']!r} has no {name!r} measurement to judge (or its reference "
                            f"{ref['name']!r} has none)")
        verdicts[name] = {}
        for key, lv in cand["levels"].items():
            if key not in base["levels"]:
                raise TuneError(f"profile {name!r} level c={key} was measured for {e['name']!r} but not for "
                                f"{ref['name']!r}: the profiles changed mid-run; start over")
            # the gate's first look is the first round's run count (the profile's repetitions), so that round
            # spends its share of the error rates; later rounds add the runs the gate asked for
            first = e.setdefault("first_look", {}).setdefault(f"{name}/{key}", len(lv["samples"]))
            try:
                ref_lv = base["levels"][key]
                v = decide(ref_lv["samples"], lv["samples"], threshold=g["threshold"], alpha=g["alpha"],
                           pass_alpha=g["pass_alpha"], min_runs=g["min_runs"], max_runs=g["max_runs"],
                           candidate_min_runs=min(max(first, 3), g["max_runs"]), bootstrap=1000,
                           max_baseline_runs=_baseline_cap(g),
                           **_failures("baseline", ref_lv), **_failures("candidate", lv),
                           baseline_workload=ref_lv.get("workload"), candidate_workload=lv.get("workload"),
                           change=stage_change(e), between_start_sd=g.get("between_start_sd"),
                           **_latency_inputs(g, prof, ref_lv, lv))
            except GateError as err:
                raise TuneError(f"the gate cannot judge {e['name']!r} {name} c={key}: {err}") from err
            verdicts[name][key] = {k: v[k] for k in ("decision", "ratio", "p_value", "p_value_pass", "ci",
                                                     "runs_needed", "reason", "decided_by")}
            verdicts[name][key]["warnings"] = v["warnings"]
            if v.get("throughput"):  # the throughput part alone (the decision above is throughput and latency together)
                verdicts[name][key]["throughput"] = {k: v["throughput"].get(k) for k in ("decision", "ratio", "reason", "final")}
            verdicts[name][key]["latency"] = latency_summary(v["latency"])
    e["verdicts"] = verdicts
    flat = judged_levels(e, verdicts)
    e["gate_verdict"] = _aggregate([v["decision"] for v in flat])
    worst = _worst(flat, e["gate_verdict"])
    judged = {id(v) for v in flat}
    scope = {name: lv for name, lv in verdicts.items() if any(id(v) in judged for v in lv.values())}
    serving = serving_of(state, e, ref, stage_gate(scope, e["gate_verdict"], worst))
    e["serving"] = serving
    e["verdict"] = serving["verdict"]
    if e.get("force_revert"):
        e["decision"], e["status"] = "revert", "reverting"
        e["reason"] = f"reverted as told (force_revert), whatever the verdict said: {serving['reason']}"
        return
    if e["verdict"] == "inconclusive" and e["rounds"] < state["more_rounds"] and any(v["runs_needed"] for v in flat):
        e["status"] = "more"
        e["rounds"] += 1
        e["reason"] = f"inconclusive after round {e['rounds']}: measuring more runs ({worst['reason']})"
        return
    if e["verdict"] == "pass":
        e["decision"], why = "keep", f"every judged profile and level passed: {serving['reason']}"
    elif e["verdict"] in ("regression", "unstable", "diverged"):
        e["decision"], why = "revert", f"a no from the serving verdict: {serving['reason']}"
    else:
        e["decision"] = state["inconclusive"]
        why = f"inconclusive, so the user's choice ({state['inconclusive']}): {serving['reason']}"
    e["reason"] = why + judged_text(e, verdicts)
    e["status"] = "kept" if e["decision"] == "keep" else "reverting"


def judged_levels(e: dict[str, Any], verdicts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The level verdicts that decide stage ``e``: those of its ``judged_on`` profiles (every profile's without one),
    or every profile's when any level of any profile is a regression (a stage that harms another workload is
    reverted all the same). Sets ``judged_by``, the profiles whose verdict decided."""
    everywhere = [v for lv in verdicts.values() for v in lv.values()]
    e["judged_by"] = e.get("judged_on") or list(verdicts)
    if any(v["decision"] == "regression" for v in everywhere):
        return everywhere
    return [v for name, lv in verdicts.items() if name in e["judged_by"] for v in lv.values()]


def judged_text(e: dict[str, Any], verdicts: dict[str, dict[str, Any]]) -> str:
    """What the reason adds of the profiles that judged the stage: those named when not every one, or the profile that
    would have seen the stage when it was not measured (``judged_note``)."""
    if e.get("judged_note"):
        return f"; {e['judged_note']}"
    if e.get("judged_by") and set(e["judged_by"]) != set(verdicts) and e["verdict"] != "regression":
        return f" (judged on {', '.join(e['judged_by'])}; no regression on the other profiles)"
    return ""


def _aggregate(decisions: list[Any]) -> str:
    """regression if any says it, pass if all do, else inconclusive."""
    if "regression" in decisions:
        return "regression"
    return "pass" if decisions and all(d == "pass" for d in decisions) else "inconclusive"


def stage_gate(verdicts: dict[str, dict[str, Any]], verdict: str, worst: dict[str, Any]) -> dict[str, Any]:
    """The gate's answer over every profile and level of a stage, in the shape serving_verdict() reads: the throughput
    part (the first level that regressed, else the lowest ratio) and the latency part (each level's metrics, named
    ``profile c=N metric``)."""
    levels = [(name, key, v) for name, lv in verdicts.items() for key, v in lv.items()]
    tps = [(v.get("throughput") or v) for _n, _k, v in levels]
    tp_verdict = _aggregate([t.get("decision") for t in tps])
    hits = [t for t in tps if t.get("decision") == tp_verdict and tp_verdict != "pass"]
    tp = hits[0] if hits else min(tps, key=lambda t: t["ratio"] if t.get("ratio") is not None else 1.0)
    metrics = {f"{name} c={key} {m}": dict(x) for name, key, v in levels
               for m, x in ((v.get("latency") or {}).get("metrics") or {}).items()}
    # with no metric judged anywhere, why (the first level's reason: no margin set, or no per-run latency)
    why = next((v["latency"]["reason"] for _n, _k, v in levels if (v.get("latency") or {}).get("reason")), None)
    return {"decision": verdict, "final": True, "reason": worst["reason"], "ratio": worst.get("ratio"),
            "throughput": {"decision": tp_verdict, "final": True, "ratio": tp.get("ratio"), "reason": tp.get("reason", "")},
            "latency": {"metrics": metrics, **({"reason": why} if why and not metrics else {})}}


def _part_left_out(state: dict[str, Any], e: dict[str, Any], ref: dict[str, Any], part: str) -> str:
    """Why a part of a stage's verdict is not measured (the verdict names it)."""
    v = state.get("verdict") or VERDICT_DEFAULTS
    if not v[part]:
        return f"left out (verdict {part}: false)"
    if part == "outputs":
        if not e.get("outputs"):
            return "not asked of this stage (it cannot change what the model answers; outputs: true on a stage asks)"
        if not state["stages"][0].get("outputs_reference"):
            return "no output reference was recorded at the baseline"
        return "the playbook sent no output comparison for this stage"
    return (f"no PCIe audit after {ref['name']}'s benchmark to compare with" if not ref.get("health")
            else "the playbook sent no PCIe audit after this stage's benchmark")


def serving_of(state: dict[str, Any], e: dict[str, Any], ref: dict[str, Any], gate: dict[str, Any]) -> dict[str, Any]:
    """The serving verdict of a stage: the gate's parts, the outputs compared with the baseline's reference, the
    host's health after the stage's benchmark against the one after its reference's."""
    outputs = e.get("outputs_compared") or {"status": "not measured", "reason": _part_left_out(state, e, ref, "outputs")}
    before, after = ref.get("health"), e.get("health")
    steady = before and after and (state.get("verdict") or VERDICT_DEFAULTS)["stability"]
    try:
        return judged_verdict(gate, outputs, before if steady else None, after if steady else None,
                              e.get("kernel_log") or [] if steady else [],
                              stability_left_out=None if steady else _part_left_out(state, e, ref, "stability"))
    except (VerdictError, ValueError, TypeError, AttributeError, KeyError) as err:
        raise TuneError(f"the serving verdict of stage {e['name']!r} cannot be given: {err!r}") from None


def take_checks(state: dict[str, Any], e: dict[str, Any], act: dict[str, Any], checks: dict[str, Any] | None) -> None:
    """Keep what the playbook brought after a benchmark for the serving verdict: the PCIe audit (``health``, a
    pcie_facts document) with the Xid lines of the kernel log (``kernel_log``), and output_equivalence's result
    (``outputs``: the reference recorded at the baseline, a stage's comparison). TuneError for a shape no part has."""
    c = checks or {}
    if not isinstance(c, dict):
        raise TuneError(f"checks of {e['name']!r} is {type(c).__name__}: give a dict (health, kernel_log, outputs)")
    health, log, outputs = c.get("health"), c.get("kernel_log") or [], c.get("outputs")
    if health is not None and not (isinstance(health, dict) and isinstance(health.get("devices", {}), dict)
                                   and isinstance(health.get("gpus", []), list)):
        raise TuneError(f"checks.health of {e['name']!r} is not a pcie_facts document (devices, gpus): pass the audit's pcie")
    if not isinstance(log, list) or not all(isinstance(line, str) for line in log):
        raise TuneError(f"checks.kernel_log of {e['name']!r} is not a list of lines")
    if health is not None:
        e["health"] = health
        e["kernel_log"] = [line for line in log if "xid" in line.lower()][-KERNEL_LOG_KEEP:]
    if outputs is None:
        return
    asked = (act.get("checks") or {}).get("outputs")
    if not isinstance(outputs, dict) or asked is None:
        raise TuneError(f"checks.outputs of {e['name']!r} was not asked for (or is not output_equivalence's result)")
    if asked == "record":
        if not outputs.get("reference"):
            raise TuneError("checks.outputs of the baseline names no reference: pass output_equivalence's record result")
        e["outputs_reference"] = {k: outputs.get(k) for k in ("reference", "model", "band", "aa")}
    elif not isinstance(outputs.get("verdict"), str) or outputs["verdict"] not in OUTPUT_ANSWERS:
        raise TuneError(f"checks.outputs of {e['name']!r} has verdict {outputs.get('verdict')!r}: pass "
                        f"output_equivalence's compare result ({', '.join(OUTPUT_ANSWERS)})")
    else:
        e["outputs_compared"] = {k: outputs.get(k) for k in ("verdict", "reason", "figures", "band", "tolerance")}


def complete(state: dict[str, Any], action_id: int, documents: Sequence[dict[str, Any]] = (),
             recorded: dict[str, Any] | None = None, snapshots: dict[str, Any] | None = None,
             checks: dict[str, Any] | None = None) -> dict[str, Any]:
    """The playbook did the pending action: record what it brought and move the loop on."""
    act = state.get("pending")
    if not act:
        raise TuneError(f"action {action_id} completed, but no action is pending: the play and the state file "
                        "disagree (another play on this host?); run the playbook again to resume")
    if act["id"] != action_id:
        raise TuneError(f"action {action_id} completed, but action {act['id']} ({act['action']} {act['stage']}) "
                        "is pending; run the playbook again to resume from the state file")
    e = next(s for s in state["stages"] if s["name"] == act["stage"])
    if act["action"] == "apply":
        e["recorded"].update(recorded or {})
        e["snapshots"].update(snapshots or {})
        e["status"] = "applied"
    elif act["action"] == "revert":
        e["status"] = "reverted"
    elif act["action"] == "benchmark":
        names = [p["name"] for p in state["profiles"]]
        if len(documents) != len(names):
            raise TuneError(f"benchmark of {e['name']!r} brought {len(documents)} result(s) for {len(names)} "
                            f"profile(s) ({', '.join(names)}): give one result per profile, in order")
        for i, (prof, doc) in enumerate(zip(state["profiles"], documents)):
            diff = profile_mismatch(prof, doc)
            if diff:
                raise TuneError(f"benchmark result {i + 1} of {e['name']!r} was not measured with profile "
                                f"{prof['name']!r} (" + "; ".join(diff) + "): give one result per profile, in the "
                                "profiles' order, each measured with its profile's settings")
            e["measurements"][prof["name"]] = _merge(e["measurements"].get(prof["name"]) if e["status"] == "more" else None,
                                                     _measurement(doc, prof["name"]))
        take_checks(state, e, act, checks)
        if e["kind"] == "baseline":
            e["status"] = "baseline"
            e["decision"] = "baseline"
            fit_threshold(state, e)
        else:
            judge(state, e)
    state["pending"] = None
    return state


def summary(state: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per stage: status, verdict, decision and why."""
    return [{"stage": e["name"], "status": e["status"], "verdict": e["verdict"], "decision": e["decision"],
             "reference": e["reference"], "reason": e["reason"],
             "parts": {k: p["says"] for k, p in ((e.get("serving") or {}).get("parts") or {}).items()}}
            for e in state["stages"]]


def verdict_records(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Each decided stage's serving verdict as the history stores it (bench_history ``verdicts``): its answer, reason
    and parts, the stage, when it was decided."""
    return [{"verdict": e["serving"]["verdict"], "keep": e["serving"]["keep"], "reason": e["serving"]["reason"],
             "parts": e["serving"]["parts"], "stage": e["name"], "decided_at": e["decided_at"]}
            for e in state["stages"] if e.get("serving") and e.get("decided_at")]


# ---- what the module reads and restores on the host --------------------------------------------------
def read_aspm_policy(fs: HostFS) -> str:
    text = fs.read_optional("/sys/module/pcie_aspm/parameters/policy")
    if not text:
        raise TuneError("cannot record the ASPM policy: /sys/module/pcie_aspm/parameters/policy is missing (a kernel "
                        "without ASPM support); leave the ASPM stage out (skip: [aspm])")
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    raise TuneError(f"cannot tell the ASPM policy from {text!r} in /sys/module/pcie_aspm/parameters/policy")


def read_hugepages_2m(fs: HostFS) -> dict:
    base = "/sys/devices/system/node"
    out = {}
    for name in sorted(fs.listdir(base)) if fs.isdir(base) else []:
        if not name.startswith("node") or not name[4:].isdigit():
            continue
        value = fs.read_optional(f"{base}/{name}/hugepages/hugepages-2048kB/nr_hugepages")
        if value is not None and value.strip().isdigit():
            out[int(name[4:])] = {"pages_2m": int(value)}
    if not out:
        raise TuneError(f"cannot record the 2 MiB pages: no {base}/node*/hugepages/hugepages-2048kB/nr_hugepages")
    return out


READERS = {"aspm_policy": read_aspm_policy, "hugepages_2m_per_node": read_hugepages_2m}


def plan_key(state: dict) -> str:
    keep = {k: state[k] for k in ("profiles", "gate", "inconclusive", "more_rounds")}
    keep["stages"] = [{k: s[k] for k in ("name", "kind", "apply", "revert", "reboot", "record", "files")}
                      for s in state["stages"]]
    for kept, s in zip(keep["stages"], state["stages"]):
        if s.get("force_revert"):  # only when set: a state made before force_revert keeps its plan key
            kept["force_revert"] = True
    if (state.get("verdict") or VERDICT_DEFAULTS) != VERDICT_DEFAULTS:  # a state made before the verdict keeps its key
        keep["verdict"] = state["verdict"]
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load(fs: HostFS, path: str) -> dict | None:
    if not fs.exists(path):
        return None
    text = fs.read_text(path)
    try:
        state = json.loads(text)
    except ValueError as err:
        raise TuneError(f"the state file {path} is not JSON ({err}): it was damaged; move it away and start over "
                        "(the roles' own state: absent undoes what was applied)") from err
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        what = repr(state.get("format")) if isinstance(state, dict) else f"a JSON {type(state).__name__}"
        raise TuneError(f"{path} holds {what}, not {FORMAT}: not a measured-tuning state; move it away and start over "
                        "(op=reset removes it)")
    bad = [k for k, kind in (("stages", list), ("profiles", list), ("gate", dict)) if not isinstance(state.get(k), kind)]
    if bad or not all(isinstance(s, dict) for s in state["stages"] + state["profiles"]):
        raise TuneError(f"the state file {path} is damaged ({', '.join(bad) or 'stages or profiles'} not as written): move "
                        "it away and start over (the roles' own state: absent undoes what was applied)")
    return state


def read_exact(fs: HostFS, path: str):
    """A file's exact text (trailing newlines kept), or None when it does not exist (strict UTF-8)."""
    return fs.read_exact(path, errors="strict")


def prepare(fs: HostFS, state: dict, act: dict, check: bool, actions: list) -> None:
    """Record what the revert needs before an apply; put files back before a revert."""
    stage = next((s for s in state["stages"] if s["name"] == act["stage"]), None)
    if stage is None:
        return
    if act["action"] == "apply":
        for name in act["record"]:
            stage["recorded"].setdefault(name, READERS[name](fs))
        for path in act["files"]:
            if path not in stage["snapshots"]:
                stage["snapshots"][path] = read_exact(fs, path)
    elif act["action"] == "revert":
        for path, content in stage["snapshots"].items():
            current = read_exact(fs, path)
            if current == content:
                continue
            actions.append({"action": "restore" if content is not None else "remove", "path": path})
            if not check:
                if content is None:
                    fs.remove(path)
                else:
                    fs.write_atomic(path, content, mode=0o644)


def _start(p: dict, state: dict | None, path: str) -> dict:
    """op=start: the state made from the plan, or the stored one when it was made from the same plan."""
    fresh = new_state(p["host"], plan_stages(p["stages"], p["skip"], p.get("force_revert") or ()), resolve_profiles(p["profiles"], p["max_model_len"]),
                      p["gate"], p["inconclusive"], p["more_rounds"], p["vllm_defaults"], p["now"], p.get("verdict"))
    fresh["plan_key"] = plan_key(fresh)
    if state is not None and state.get("plan_key") != fresh["plan_key"]:
        finished = all(s["status"] in ("kept", "reverted", "baseline") for s in state["stages"])
        if not (p["restart"] or finished):
            raise TuneError(
                f"{path} holds an unfinished measured-tuning run made from another stage list, profiles or "
                "gate settings; resume it with the same settings, or set restart: true to discard it (what "
                "it applied stays applied until the roles undo it)")
        state = None
    return state or fresh


def execute(p: dict, host: Host, check_mode: bool) -> dict:
    """One call of the tune_measured module (``op`` start, next, complete or reset) over the state file (under the
    host's root, ``host.fs``): the result with ``next``, ``stages``, ``state`` and ``actions``. Raises Failed with the
    result so far."""
    fs, path = host.fs, p["state_file"]
    result: dict[str, Any] = dict(changed=False, actions=[], state_file=path)
    try:
        if p["op"] == "reset":  # a damaged state file too: reset is how it goes away
            if fs.exists(path):
                result["actions"].append({"action": "remove", "path": path})
                if not check_mode:
                    fs.remove(path)
            result.update(changed=bool(result["actions"]), next={"action": "done"}, stages=[], state={}, diff={},
                          verdicts=[])
            return result
        state = load(fs, path)
        before = json.dumps(state, sort_keys=True) if state is not None else None
        if p["op"] == "start":
            state = _start(p, state, path)
        elif state is None:
            raise TuneError(f"no measured-tuning state at {path}: run op=start first")
        if p["op"] == "complete":
            complete(state, p["action_id"], p["results"], checks=p.get("checks"))
            for e in state["stages"]:  # the stage just judged: when (for the history)
                if e.get("serving") and e.get("status") != "more" and not e.get("decided_at"):
                    e["decided_at"] = p["now"] or "unknown"
        act = next_action(state)
        prepare(fs, state, act, check_mode, result["actions"])
        if act["action"] == "done" and not state.get("finished_at"):
            state["finished_at"] = p["now"] or "unknown"
        after = json.dumps(state, sort_keys=True)
        if after != before:
            result["actions"].append({"action": "write", "path": path})
            if not check_mode:
                # temp file, fsync, rename, fsync of the directory: the state survives a crash or a reboot
                fs.write_atomic(path, json.dumps(state, indent=1, sort_keys=True) + "\n", mode=0o600)
        result.update(next=act, stages=summary(state), state=state, verdicts=verdict_records(state))
    except TuneError as err:
        raise Failed(f"Measured tuning: {err}", **result) from None
    except HostFSError as err:
        raise Failed(f"Measured tuning could not keep its state: {err}. The state file must be on a writable "
                     "local file system (become: true).", **result) from None
    result["changed"] = bool(result["actions"])
    result["diff"] = {}
    return result

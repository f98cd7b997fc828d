# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The workload fingerprint: what two benchmark results must share to be compared, and the change under test.

``workload(result, concurrency)`` makes the fingerprint of an inference_benchmark result (``WORKLOAD_FIELDS``);
``workload_mismatch(baseline, candidate, change)`` lists what differs outside what the change is about
(``CHANGES``); ``check_workloads()`` is the gate's refusal (GateError naming each field with both values).
docs/benchmark.md, "What the gate compares", is the reference. Pure; standard library only.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import GateError

# The workload fingerprint (docs/benchmark.md, "What the gate compares"). The seed is left out on purpose: extra
# rounds draw new prompts of the same lengths (the profile's lengths, mode and token range are compared); so are
# warm-up, settle runs and measured_only, which differ between a first round and the extra rounds by design.
MODEL_FIELDS = ("model", "model_root", "model_config", "model_tokenizer", "model_weights", "max_model_len")
ENGINE_FIELDS = ("vllm_version", "server_argv", "client")
# workload_profile is the request profile (bench/profiles.py: its name and parameters, long_context's prompt length
# as fitted to the server), arrivals the closed or open loop (mode, rate, burstiness); profile is the name a caller
# gives a set of benchmark settings (tune_measured's serving, latency, ...). The goodput targets are not compared:
# they judge the requests afterwards and change none of them.
PROFILE_FIELDS = ("prompt_tokens", "output_tokens", "prompt_mode", "token_id_range", "ignore_eos", "temperature",
                  "max_tokens", "per_chunk_usage", "requests", "concurrency", "profile", "workload_profile", "arrivals")
# What a result stored before profiles sent: unique random prompts, in a closed loop.
LEGACY_PROFILE = {"workload_profile": {"name": "random"}, "arrivals": {"mode": "closed"}}
WORKLOAD_FIELDS = MODEL_FIELDS + ENGINE_FIELDS + PROFILE_FIELDS
# Fields every fingerprint made by this release carries: one side without it is refused, not skipped. The model's
# identity, the engine's version and argv are not among them: a hub model, a server without /version or a call
# without server_argv has none, and a result stored before them neither (one side only: a warning, see
# one_sided()).
WORKLOAD_REQUIRED = ("model", "prompt_tokens", "output_tokens", "requests", "concurrency")
# Compared when both sides carry them; on one side only they are named in a warning (the gate could not check them).
WORKLOAD_WARN_ONE_SIDED = ("model_config", "model_tokenizer", "model_weights", "vllm_version", "server_argv", "client")

# The change under test, and the fingerprint fields it may change (every other field must be equal).
# kernel, host (sysfs, PCIe, IRQ, hugepages tuning) and driver change nothing the fingerprint holds; vllm_flags
# changes the server's argv (and so may --max-model-len); vllm_version the engine's version and its argv (the
# venv's path is argv[0]).
CHANGES: dict[str, tuple[str, ...]] = {
    "none": (),
    "kernel": (),
    "host": (),
    "driver": (),
    "nccl": (),
    "vllm_flags": ("server_argv", "max_model_len"),
    "vllm_version": ("vllm_version", "server_argv"),
}
_IDENTITY = {"model_config": "config", "model_tokenizer": "tokenizer", "model_weights": "weights"}
# compared as given (an argv's "256" stays a string; numbers elsewhere are normalised: "1024" == 1024 == 1024.0)
_TEXT = ("model_config", "model_tokenizer", "model_weights", "vllm_version", "server_argv", "client")


def _norm(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    return value


def check_change(change: Any) -> tuple[str, ...]:
    """The fields ``change`` allows to differ; GateError naming the choices for an unknown one."""
    if change is None:
        change = "none"
    if not isinstance(change, str) or change not in CHANGES:
        raise GateError(f"change must be one of {', '.join(CHANGES)} (what the candidate changed; 'none' lets nothing "
                        f"of the workload differ), got {change!r}")
    return CHANGES[change]


def _client(client: Any) -> str | None:
    if isinstance(client, dict) and client.get("name"):
        return f"{client['name']}/{client.get('version')}"
    return None


def _from_document(result: dict[str, Any], concurrency: Any) -> dict[str, Any]:
    """The fingerprint's fields of a result document (``server``, ``config``, ``client``) at one level."""
    server, cfg = result.get("server") or {}, result.get("config") or {}
    levels = cfg.get("concurrency")
    if concurrency is None and isinstance(levels, list) and levels:
        concurrency = levels[0] if len(levels) == 1 else sorted(levels)  # a sweep compared whole
    identity = server.get("model_identity") if isinstance(server.get("model_identity"), dict) else {}
    argv = server.get("argv")
    out = {"model": server.get("model") or cfg.get("model"), "model_root": server.get("root"),
           "max_model_len": server.get("max_model_len"), "concurrency": concurrency,
           "profile": result.get("profile") if isinstance(result.get("profile"), str) else None,
           "workload_profile": cfg.get("profile") if isinstance(cfg.get("profile"), dict) else None,
           "arrivals": cfg.get("arrivals") if isinstance(cfg.get("arrivals"), dict) else None,
           "vllm_version": server.get("vllm_version"),
           "server_argv": [str(a) for a in argv] if isinstance(argv, (list, tuple)) else None,
           "client": _client(result.get("client"))}
    for field, key in _IDENTITY.items():  # an unreadable identity ({"unreadable": why}) has none: not compared
        out[field] = identity.get(key)
    for key in PROFILE_FIELDS:
        if key not in out:  # concurrency (the level compared) and the profiles are set above
            out[key] = cfg.get(key)
    if cfg.get("prompt_tokens") is not None:  # a result of this client: one stored before profiles sent the legacy one
        for key, legacy in LEGACY_PROFILE.items():
            out[key] = out[key] or legacy
    return out


def workload(result: Any, concurrency: Any = None) -> dict[str, Any]:
    """The workload fingerprint of a benchmark result, at one concurrency level: what must be equal for two results
    to be compared (``WORKLOAD_FIELDS``; absent or None fields are left out).

    ``result`` is an inference_benchmark result document (``server``, ``config`` and ``client``, as stored and as
    returned in the module's ``benchmark``), or a fingerprint already made (a dict of ``WORKLOAD_FIELDS``; other
    keys are refused, so a typo cannot switch the check off). ``concurrency`` is the level compared (a document
    sweeps several); without it a document's single configured level is taken. None or {} gives {} (not recorded).
    """
    if not result:
        return {}
    if not isinstance(result, dict):
        raise GateError(f"a workload must be a benchmark result or its fingerprint (a dict), got {type(result).__name__}")
    if "config" in result or "server" in result:
        out = _from_document(result, concurrency)
    else:
        unknown = sorted(set(result) - set(WORKLOAD_FIELDS))
        if unknown:
            raise GateError(f"workload fields {', '.join(map(str, unknown))} are unknown; known: {', '.join(WORKLOAD_FIELDS)}")
        out = dict(result)
        if concurrency is not None:
            out["concurrency"] = concurrency
    return {k: out[k] if k in _TEXT else _norm(out[k]) for k in WORKLOAD_FIELDS if out.get(k) is not None}


def workload_mismatch(baseline: dict[str, Any] | None, candidate: dict[str, Any] | None,
                      change: Any = "none") -> list[str]:
    """What differs between two fingerprints outside the fields ``change`` allows (CHANGES), one "field: baseline X,
    candidate Y" per field.

    The rule for results that carry less: a side with no fingerprint at all (a result or journal stored before
    fingerprints were recorded) compares nothing (the caller warns); between two fingerprints every field both
    carry must be equal, and a field of ``WORKLOAD_REQUIRED`` carried by one side only is a difference (this
    release records them all, so one side without it is not the same kind of result); other fields on one side
    only (a server that does not say its max_model_len or its version, a model directory not readable here) are
    not compared (one_sided() names those the gate warns of).
    """
    allowed = check_change(change)
    if not baseline or not candidate:
        return []
    out = []
    for key in WORKLOAD_FIELDS:
        if key in allowed:
            continue
        if key in baseline and key in candidate:
            if isinstance(baseline[key], dict) and isinstance(candidate[key], dict):
                out.extend(_dict_mismatch(key, baseline[key], candidate[key]))
            elif baseline[key] != candidate[key]:
                out.append(f"{key}: baseline {baseline[key]!r}, candidate {candidate[key]!r}")
        elif key in WORKLOAD_REQUIRED and (key in baseline or key in candidate):
            out.append(f"{key}: baseline {baseline.get(key, 'not recorded')!r}, candidate "
                       f"{candidate.get(key, 'not recorded')!r}")
    return out


def _dict_mismatch(key: str, baseline: dict[str, Any], candidate: dict[str, Any]) -> list[str]:
    """A profile's differences one parameter each ("workload_profile.prefix_tokens: baseline 512, candidate 1024"),
    the name first: different profiles are named as such, not by every parameter they do not share."""
    if baseline.get("name", baseline.get("mode")) != candidate.get("name", candidate.get("mode")):
        sub = "name" if "name" in baseline or "name" in candidate else "mode"
        return [f"{key}.{sub}: baseline {baseline.get(sub)!r}, candidate {candidate.get(sub)!r}"]
    out = []
    for sub in sorted(set(baseline) | set(candidate)):
        b, c = _norm(baseline.get(sub, "not recorded")), _norm(candidate.get(sub, "not recorded"))
        if b != c:
            out.append(f"{key}.{sub}: baseline {b!r}, candidate {c!r}")
    return out


def one_sided(baseline: dict[str, Any] | None, candidate: dict[str, Any] | None, change: Any = "none") -> list[str]:
    """The fields of WORKLOAD_WARN_ONE_SIDED that one side carries and the other does not (not compared)."""
    allowed = check_change(change)
    if not baseline or not candidate:
        return []
    return [k for k in WORKLOAD_WARN_ONE_SIDED if k not in allowed and (k in baseline) != (k in candidate)]


def side_workload(side: str, value: Any, concurrency: Any = None) -> dict[str, Any]:
    """workload() of one side, its error naming the side's option (``baseline_workload``, ``candidate_workload``)."""
    try:
        return workload(value, concurrency)
    except GateError as err:
        raise GateError(f"{side}_workload: {err}") from err


def check_workloads(baseline: Any, candidate: Any, change: Any = "none") -> str:
    """GateError naming every difference outside ``change`` when both workloads are given and differ; a warning (or
    '') otherwise."""
    b, c = side_workload("baseline", baseline), side_workload("candidate", candidate)
    diff = workload_mismatch(b, c, change)
    if diff:
        raise GateError("the runs are of different workloads and cannot be compared (" + "; ".join(diff) + "): measure "
                        "the baseline and the candidate with the same model, engine and benchmark settings (change "
                        f"{change or 'none'!r} lets " + (", ".join(check_change(change)) or "nothing") + " differ)")
    if bool(b) != bool(c):
        side = "baseline" if not b else "candidate"
        return (f"the {side}'s workload was not recorded (a result stored before workload fingerprints): the gate could "
                "not check that both sides ran the same model and benchmark")
    missing = one_sided(b, c, change)
    if missing:
        return (f"{', '.join(missing)} recorded on one side only (a model directory not readable there, a server "
                "without /version, server_argv not given, or a result stored before they were recorded): the gate "
                "could not check them")
    return ""

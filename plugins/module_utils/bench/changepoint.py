# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Change points in a throughput history series (one host, configuration and concurrency level).

Two rules, both answering with their uncertainty:

* **Consecutive drop** (the flag): each run's per-run output tok/s samples are judged against the
  previous run's by the collection's throughput gate (bench/throughput_gate.py ``decide()``: the ratio of geometric
  means below ``threshold`` *and* a one-sided t-test on log throughput at ``alpha``, with a bootstrap
  interval of the median ratio). Stored runs cannot be extended, so the gate is asked for one look at
  all of them (``candidate_min_runs = max_runs`` = the later run's samples: a fixed test spending the
  whole ``alpha``). A drop is flagged only when the gate says ``regression``; its p-value and interval
  are reported. Runs with fewer samples than the gate can judge (``min_runs``) are not flagged, and say so.
* **E-divisive means** over the series of run medians, as Hunter (MongoDB's and DataStax's
  change-point tool, Matteson & James 2014) does: the split maximising the energy statistic
  ``Q = (m n / (m + n)) (2 E|X-Y| - E|X-X'| - E|Y-Y'|)``, kept when a seeded permutation test gives
  ``p <= alpha`` (p = (1 + permutations with Q at least as large) / (1 + permutations)), then each
  side is searched again (binary segmentation), segments of at least ``min_size`` runs. With n runs
  the smallest p possible is about 1/C(n, m); the result says when a series is too short for any.

The consecutive rule finds a step at the run it happened; E-divisive finds a level shift that
single noisy pairs hide, and a series that drifted down over weeks.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.gate_settings import GATE
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.throughput_gate import decide
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import GateError

CP_ALPHA = 0.05  # the E-divisive permutation test's level (bench_history's cp_alpha)
CHANGE_KEYS = ("kernel", "gpu_driver", "vllm_version", "tuning_key")


def changes_between(prev: dict[str, Any], cur: dict[str, Any]) -> list[str]:
    """What changed from one run to the next: kernel, GPU driver, vLLM version, tuning (the keys that differ)."""
    out = []
    for key in ("kernel", "gpu_driver", "vllm_version"):
        if (prev.get(key) or None) != (cur.get(key) or None):
            out.append(f"{key.replace('_', ' ')} {prev.get(key) or '?'} -> {cur.get(key) or '?'}")
    if prev.get("tuning_key") != cur.get("tuning_key"):
        a, b = prev.get("tuning") or {}, cur.get("tuning") or {}
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        out.append("tuning " + ", ".join(f"{k}: {a.get(k, '-')} -> {b.get(k, '-')}" for k in keys[:6])
                   + (" ..." if len(keys) > 6 else ""))
    return out


def consecutive_drops(runs: Sequence[dict[str, Any]], threshold: float = GATE.threshold, alpha: float = GATE.alpha,
                      min_runs: int = GATE.min_runs) -> list[dict[str, Any]]:
    """For each run after the first, the gate's verdict against the run before it (see module doc)."""
    out = []
    for i in range(1, len(runs)):
        prev, cur = runs[i - 1], runs[i]
        entry: dict[str, Any] = {"index": i, "run_id": cur.get("id"), "previous_run_id": prev.get("id"),
                                 "finished_at": cur.get("finished_at"), "changes": changes_between(prev, cur),
                                 "drop": False, "decision": None, "ratio": None, "p_value": None, "ci": None,
                                 "reason": ""}
        n = min(len(prev.get("samples") or []), len(cur.get("samples") or []))
        if n < min_runs:
            entry["reason"] = (f"not judged: {len(prev.get('samples') or [])} and {len(cur.get('samples') or [])} runs, "
                               f"the gate needs {min_runs} per side")
            if prev.get("median") and cur.get("median"):
                entry["ratio"] = cur["median"] / prev["median"]
            out.append(entry)
            continue
        try:
            # a stored run cannot be extended: one look at all its samples, a fixed test at the whole alpha
            n_cur = len(cur["samples"])
            verdict = decide(prev["samples"], cur["samples"], threshold=threshold, alpha=alpha, min_runs=min_runs,
                             candidate_min_runs=n_cur, max_runs=n_cur, bootstrap=1000)
        except GateError as err:
            entry["reason"] = f"not judged: {err}"
            out.append(entry)
            continue
        entry.update(decision=verdict["decision"], ratio=verdict["ratio"], p_value=verdict["p_value"],
                     ci=verdict["ci"], reason=verdict["reason"], drop=verdict["decision"] == "regression")
        out.append(entry)
    return out


def energy_q(x: Sequence[float], tau: int) -> float:
    """Matteson & James' divergence of x[:tau] and x[tau:], scaled by m n / (m + n) (alpha = 1)."""
    a, b = x[:tau], x[tau:]
    m, n = len(a), len(b)
    between = sum(abs(p - q) for p in a for q in b) * 2.0 / (m * n)
    within_a = sum(abs(p - q) for p in a for q in a) / (m * m)
    within_b = sum(abs(p - q) for p in b for q in b) / (n * n)
    return (m * n / (m + n)) * (between - within_a - within_b)


def best_split(x: Sequence[float], min_size: int) -> tuple[int, float] | None:
    best = None
    for tau in range(min_size, len(x) - min_size + 1):
        q = energy_q(x, tau)
        if best is None or q > best[1]:
            best = (tau, q)
    return best


def e_divisive(values: Sequence[float], alpha: float = CP_ALPHA, min_size: int = 2, permutations: int = 199,
               seed: int = 0, offset: int = 0) -> list[dict[str, Any]]:
    """Change points of ``values`` (binary segmentation, permutation-tested); indexes into the full series."""
    x = [float(v) for v in values]
    if len(x) < 2 * min_size:
        return []
    found = best_split(x, min_size)
    if not found:
        return []
    tau, q_obs = found
    rng = random.Random(seed + offset * 7919 + len(x))
    ge = 0
    for _i in range(permutations):
        perm = list(x)
        rng.shuffle(perm)
        q = best_split(perm, min_size)
        if q and q[1] >= q_obs - 1e-12:
            ge += 1
    p = (1 + ge) / (1 + permutations)
    if p > alpha:
        return []
    before, after = x[:tau], x[tau:]
    mean_b, mean_a = sum(before) / len(before), sum(after) / len(after)
    point = {"index": offset + tau, "p_value": round(p, 4), "q": round(q_obs, 4), "mean_before": mean_b,
             "mean_after": mean_a, "change": (mean_a / mean_b - 1.0) if mean_b else None,
             "permutations": permutations}
    return (e_divisive(before, alpha, min_size, permutations, seed, offset) + [point]
            + e_divisive(after, alpha, min_size, permutations, seed, offset + tau))


def analyse(series: dict[str, Any], threshold: float = GATE.threshold, alpha: float = GATE.alpha,
            min_runs: int = GATE.min_runs, cp_alpha: float = CP_ALPHA, min_size: int = 2,
            permutations: int = 199) -> dict[str, Any]:
    """Both rules over one series (a bench/history.py series() entry); the drops and the change points."""
    runs = series["runs"]
    medians = [r["median"] for r in runs if r.get("median") is not None]
    steps = consecutive_drops(runs, threshold=threshold, alpha=alpha, min_runs=min_runs)
    points = e_divisive(medians, alpha=cp_alpha, min_size=min_size, permutations=permutations) \
        if len(medians) == len(runs) else []
    for p in points:
        p["run_id"] = runs[p["index"]].get("id")
        p["finished_at"] = runs[p["index"]].get("finished_at")
        p["changes"] = changes_between(runs[p["index"] - 1], runs[p["index"]])
    note = ""
    if len(medians) < 2 * min_size:
        note = (f"{len(medians)} run(s): E-divisive needs at least {2 * min_size} runs of this configuration "
                "to test for a change point")
    return {"host": series["host"], "config_key": series["config_key"], "concurrency": series["concurrency"],
            "runs": len(runs), "drops": [s for s in steps if s["drop"]], "steps": steps,
            "change_points": sorted(points, key=lambda p: p["index"]),
            "note": note, "rule": {"threshold": threshold, "alpha": alpha, "min_runs": min_runs, "cp_alpha": cp_alpha,
                                   "min_size": min_size, "permutations": permutations}}

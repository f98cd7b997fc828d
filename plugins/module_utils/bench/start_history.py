# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gate's between-start noise from a host's own history: the stored per-run tok/s of one series (one host,
configuration and concurrency level, bench/history.py series()) grouped by the server start each result measured
(``runs.server_start``, bench/server_start.py), then bench/stats.py start_noise() (one-way random effects) with what a
user needs to trust it: the starts and runs it rests on, the F test's p, a confidence interval of sd_between, and the
``between_start_sd`` to set, given only from START_NOISE_MIN_STARTS starts on (else null, saying how many more starts
to measure).

Left out, and counted: results that name no start (stored before inference_benchmark recorded it, or whose start was
unknown), starts of a single run (no within-start spread), and starts whose runs ran under more than one tuning state
or stage (a tuning change, not noise, may separate them). Starts under different kernels, drivers, vLLM versions or
tuning states all count (the baselines of successive upgrades are such starts): the differences between them count
as between-start noise, so the figure is on the wide side of the truth, and ``stacks`` says how many there were.
Pure functions of series() entries.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import (
    START_NOISE_MIN_STARTS, between_start_interval, start_noise)

LEVEL = 0.95  # the confidence level of sd_between's interval


def _samples(run: dict[str, Any]) -> list[float]:
    return [float(v) for v in run.get("samples") or []
            if not isinstance(v, bool) and isinstance(v, (int, float)) and 0 < v < math.inf]


def group_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A series' runs by server start, in order of first appearance: ``starts`` ({start: {samples, results,
    first_at, last_at, tuning: {(tuning_key, stage)}, stacks}}), and the results and runs without a start."""
    starts: dict[str, dict[str, Any]] = {}
    unknown_results = unknown_runs = 0
    for run in runs:
        values = _samples(run)
        start = run.get("server_start")
        if not start:
            unknown_results += 1
            unknown_runs += len(values)
            continue
        entry = starts.setdefault(start, {"samples": [], "results": 0, "first_at": run.get("finished_at"),
                                          "tuning": set(), "stacks": set()})
        entry["samples"] += values
        entry["results"] += 1
        entry["last_at"] = run.get("finished_at")
        entry["tuning"].add((run.get("tuning_key"), run.get("stage")))
        entry["stacks"].add((run.get("kernel"), run.get("gpu_driver"), run.get("vllm_version"), run.get("tuning_key")))
    return {"starts": starts, "unknown_results": unknown_results, "unknown_runs": unknown_runs}


def _reason(usable: int, out: dict[str, Any], min_starts: int) -> str:
    if usable >= min_starts:
        text = (f"{usable} server starts of {out['runs']} runs: between_start_sd is their sd_between "
                f"({out['sd_between']:.2%}, {LEVEL:.0%} interval {out['sd_between_ci'][0]:.2%}-"
                f"{out['sd_between_ci'][1]:.2%}, F test p={out['p_between']:.3g})"
                if out["sd_between_ci"] else
                f"{usable} server starts of {out['runs']} runs whose tok/s does not vary within a start: "
                f"between_start_sd is their sd_between ({out['sd_between']:.2%})")
    else:
        more = min_starts - usable
        text = (f"{usable} server start{'s' if usable != 1 else ''} with two or more runs of this host, configuration "
                f"and level in the history: measure {more} more start{'s' if more != 1 else ''} (restart the server "
                f"and benchmark this configuration again; each change's baseline adds one) before setting "
                f"between_start_sd (two starts give one degree of freedom)")
    left = []
    if out["unknown_results"]:
        left.append(f"{out['unknown_results']} stored results ({out['unknown_runs']} runs) name no server start (stored "
                    "before inference_benchmark recorded it, or the start was not known) and are left out")
    if out["single_run_starts"]:
        left.append(f"{out['single_run_starts']} starts of one run each are left out (no spread within them)")
    if out["mixed_starts"]:
        left.append(f"{out['mixed_starts']} starts whose runs ran under several tuning states or stages are left out")
    if out["stacks"] > 1:
        left.append(f"the starts ran under {out['stacks']} kernel/driver/vLLM/tuning states: the differences between "
                    "those count as between-start noise (a figure on the wide side)")
    return "; ".join([text] + left)


def estimate(runs: Sequence[dict[str, Any]], min_starts: int = START_NOISE_MIN_STARTS) -> dict[str, Any]:
    """The between-start noise of one series' runs (module doc). Every figure is null where the runs give none."""
    grouped = group_runs(runs)
    used = {k: v for k, v in grouped["starts"].items() if len(v["samples"]) >= 2 and len(v["tuning"]) == 1}
    out: dict[str, Any] = {
        "starts": len(used), "runs": sum(len(v["samples"]) for v in used.values()),
        "results": sum(v["results"] for v in used.values()),
        "unknown_results": grouped["unknown_results"], "unknown_runs": grouped["unknown_runs"],
        "single_run_starts": sum(len(v["samples"]) < 2 for v in grouped["starts"].values()),
        "mixed_starts": sum(len(v["samples"]) >= 2 and len(v["tuning"]) > 1 for v in grouped["starts"].values()),
        "stacks": len(set().union(*(v["stacks"] for v in used.values()))) if used else 0,
        "sd_within": None, "sd_between": None, "sd_between_ci": None, "ci_level": LEVEL, "f": None, "df": None,
        "p_between": None, "min_starts": min_starts, "between_start_sd": None,
        "per_start": [{"start": k, "runs": len(v["samples"]), "results": v["results"],
                       "mean": math.exp(sum(math.log(x) for x in v["samples"]) / len(v["samples"])),
                       "first_at": v["first_at"], "last_at": v["last_at"]} for k, v in used.items()],
    }
    if len(used) >= 2:
        noise = start_noise([v["samples"] for v in used.values()])
        out.update({k: noise[k] for k in ("sd_within", "sd_between", "f", "df", "p_between")})
        out["sd_between_ci"] = between_start_interval(noise, [len(v["samples"]) for v in used.values()], LEVEL)
        if math.isinf(out["f"]):
            out["f"] = None  # no spread within any start: F is unbounded (JSON has no infinity)
    if len(used) >= min_starts:
        out["between_start_sd"] = out["sd_between"]
    out["reason"] = _reason(len(used), out, min_starts)
    return out


def for_series(series_list: Sequence[dict[str, Any]], config_key: str | None = None, concurrency: int | None = None,
               min_starts: int = START_NOISE_MIN_STARTS) -> list[dict[str, Any]]:
    """estimate() for each series (of bench/history.py series()) of ``config_key`` and ``concurrency`` (every one
    when None), with its host, configuration and level."""
    out = []
    for s in series_list:
        if (config_key is not None and s["config_key"] != config_key) or \
                (concurrency is not None and s["concurrency"] != concurrency):
            continue
        out.append({"host": s["host"], "config_key": s["config_key"], "config": s["config"],
                    "concurrency": s["concurrency"], **estimate(s["runs"], min_starts)})
    return out


def answer(estimates: Sequence[dict[str, Any]]) -> tuple[float | None, str]:
    """The one figure a gate can take from for_series()'s answer, and why: the ``between_start_sd`` of the one series
    asked for, else None with what to do (several series match, or the one gives no figure)."""
    if len(estimates) != 1:
        names = ", ".join(f"{e['host']} {e['config_key']} c={e['concurrency']}" for e in estimates[:10])
        return None, (f"{len(estimates)} series match ({names}): give the gated series' config_key and concurrency "
                      "(state=query lists them)")
    return estimates[0]["between_start_sd"], estimates[0]["reason"]


def summary(est: dict[str, Any]) -> str | None:
    """One line for the history report, None where fewer than two starts give no figure."""
    if est["sd_between"] is None:
        return None
    ci = est["sd_between_ci"]
    interval = f", {est['ci_level']:.0%} interval {ci[0]:.2%}-{ci[1]:.2%}" if ci else ""
    p = f", F test p={est['p_between']:.3g}" if est["p_between"] is not None else ""
    settable = ("between_start_sd to set" if est["between_start_sd"] is not None else
                f"too few starts to set as between_start_sd ({est['min_starts']} needed)")
    unknown = f"; {est['unknown_results']} results with no start left out" if est["unknown_results"] else ""
    return (f"Between server starts: sd {est['sd_between']:.2%}{interval}{p} (within a start {est['sd_within']:.2%}; "
            f"{est['starts']} starts, {est['runs']} runs; {settable}{unknown})")

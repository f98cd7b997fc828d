#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Noise between server starts, and the kernel upgrade's gate across a restart (pure; no device needed).

A kernel or vLLM upgrade compares runs of one server start (before) with runs of another (after the reboot):
what it faces is the noise within a start plus whatever moves between starts. ``between_starts`` splits the
two (one-way random-effects analysis of variance on log throughput, unequal runs per start allowed);
``upgrade_gate`` replays the kernel upgrade's gate loop (kernel_upgrade_flow.judge_baseline, then judge)
over stored runs taken in order: baseline runs from min_runs on while decide(baseline, []) asks for more,
then candidate runs from candidate_min_runs on while decide(baseline, candidate) asks for more, at the
role's defaults (roles/kernel_upgrade/defaults: threshold 0.95, alpha 0.01, pass_alpha 0.005, min_runs 5,
max_runs 15; candidate_min_runs 4, order sequential). The device driver (h200_vllm.py restarts) uses the
same replay to know when a start has enough runs; h200_report.py prints both from the stored JSON.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
for _path in (os.path.join(REPO, ".collections"), REPO):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import throughput_gate as tg  # noqa: E402
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import gate_settings
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import start_noise, t_quantile  # noqa: E402

# the kernel upgrade's gate settings at the role's defaults (kernel_upgrade_flow._gate_settings)
UPGRADE_GATE = {"threshold": 0.95, "alpha": 0.01, "pass_alpha": 0.005, "min_runs": 5, "max_runs": 15,
                "candidate_min_runs": gate_settings.CANDIDATE_MIN_RUNS}
KEEP = ("decision", "decided_by", "ratio", "p_value", "p_value_pass", "interval", "ci", "cv", "smallest_detectable_drop",
        "reason", "final", "too_noisy", "warnings")


def _pick(g: dict) -> dict:
    return {k: g[k] for k in KEEP if k in g}


def upgrade_gate(baseline: Sequence[float], candidate: Sequence[float], settings: dict | None = None) -> dict[str, Any]:
    """The kernel upgrade's gate loop over runs taken in order. ``needs`` ({"side", "runs"}) when more runs of a side
    than are stored would be asked for; else the verdict with the runs it used."""
    g = dict(UPGRADE_GATE, **(settings or {}))
    n_b = g["min_runs"]
    looks: list[dict] = []
    while True:
        if n_b > len(baseline):
            return {"needs": {"side": "baseline", "runs": n_b}, "looks": looks}
        bg = tg.decide(baseline[:n_b], [], **g)
        looks.append({"baseline_runs": n_b, "candidate_runs": 0, "decided_by": bg.get("decided_by"),
                      "smallest_detectable_drop": bg.get("smallest_detectable_drop")})
        if not bg.get("final") and bg.get("baseline_runs_needed", 0) > 0:
            n_b += bg["baseline_runs_needed"]
            continue
        break
    out: dict[str, Any] = {"baseline_runs_used": n_b, "baseline_gate": _pick(bg), "looks": looks, "settings": g}
    if bg.get("final") or bg.get("decided_by") != "baseline-ready":
        out.update(decision="inconclusive", stopped_before_change=True, reason=bg.get("reason"))
        return out
    n_c = g["candidate_min_runs"]
    while True:
        if n_c > len(candidate):
            out.update(needs={"side": "candidate", "runs": n_c})
            return out
        cg = tg.decide(baseline[:n_b], candidate[:n_c], **g)
        looks.append({"baseline_runs": n_b, "candidate_runs": n_c, "decision": cg["decision"],
                      "decided_by": cg.get("decided_by"), "ratio": cg.get("ratio")})
        if not cg.get("final") and cg.get("runs_needed", 0) > 0:
            n_c += cg["runs_needed"]
            continue
        break
    out.update(candidate_runs_used=n_c, gate=_pick(cg),
               decision=cg["decision"] if cg["decision"] in ("pass", "regression") else "inconclusive")
    return out


def between_starts(starts: Sequence[Sequence[float]], max_runs: int = 15, alpha: float = 0.005,
                   power: float = 0.8) -> dict[str, Any]:
    """Within- and between-start noise of log throughput: bench/stats.py's start_noise (one-way random effects, the
    ANOVA estimator, as the start_noise filter gives it) over the starts of two or more runs, with what the report
    prints beside it: each start's runs, mean, CV and range, the spread of the starts' means, and the smallest drop a
    fixed one-sided test at ``alpha`` and ``power`` would detect with 5 baseline and ``max_runs`` candidate runs, with
    and without the between-start term (a restart gate's difference of means carries
    sd_within^2 (1/n_b + 1/n_c) + 2 sd_between^2)."""
    starts = [list(s) for s in starts if len(s) >= 2]
    if len(starts) < 2:
        raise ValueError("at least two starts with two runs each")
    noise = start_noise(starts)
    df = noise["df"][1]

    def sdd(extra_var: float) -> float:
        se = math.sqrt(noise["sd_within"] ** 2 * (1.0 / 5 + 1.0 / max_runs) + extra_var)
        return 1.0 - math.exp(-(t_quantile(alpha, df) + t_quantile(1.0 - power, df)) * se)

    per = []
    for raw in starts:
        logs = [math.log(v) for v in raw]
        m = sum(logs) / len(logs)
        sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))
        per.append({"runs": len(raw), "mean": sum(raw) / len(raw), "cv_log": sd, "min": min(raw), "max": max(raw)})
    means = noise["start_means"]
    return {**noise, "per_start": per, "spread_of_means": max(means) / min(means) - 1.0,
            "sdd_within_only": sdd(0.0), "sdd_across_restart": sdd(2.0 * noise["sd_between"] ** 2),
            "settings": {"alpha": alpha, "power": power, "baseline_runs": 5, "candidate_runs": max_runs}}

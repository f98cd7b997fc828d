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
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import betainc, t_quantile  # noqa: E402

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


def _f_sf(f: float, d1: int, d2: int) -> float:
    """P(F > f) for Snedecor's F with (d1, d2) degrees of freedom."""
    if f <= 0:
        return 1.0
    return betainc(d2 / 2.0, d1 / 2.0, d2 / (d2 + d1 * f))


def between_starts(starts: Sequence[Sequence[float]], max_runs: int = 15, alpha: float = 0.005,
                   power: float = 0.8) -> dict[str, Any]:
    """Within- and between-start noise of log throughput (one-way random effects, ANOVA estimator).

    sd_within: pooled within-start sd of the logs (about the CV); sd_between: the sd of a start's own level
    ((MS_between - MS_within) / n0, floored at 0); p_between: the F test of "no start-to-start variance".
    A restart gate's difference of means carries sd_within^2 (1/n_b + 1/n_c) + 2 sd_between^2: the smallest drop a
    fixed one-sided test at ``alpha`` and ``power`` would detect with 5 baseline and ``max_runs`` candidate runs is
    given with and without the between-start term (the gate knows only the first)."""
    logs = [[math.log(v) for v in s] for s in starts if len(s) >= 2]
    k = len(logs)
    if k < 2:
        raise ValueError("at least two starts with two runs each")
    n = [len(s) for s in logs]
    total = sum(n)
    means = [sum(s) / len(s) for s in logs]
    grand = sum(sum(s) for s in logs) / total
    ssw = sum((x - m) ** 2 for s, m in zip(logs, means) for x in s)
    ssb = sum(ni * (m - grand) ** 2 for ni, m in zip(n, means))
    msw, msb = ssw / (total - k), ssb / (k - 1)
    n0 = (total - sum(ni * ni for ni in n) / total) / (k - 1)
    var_b = max(0.0, (msb - msw) / n0)
    f = msb / msw if msw > 0 else float("inf")
    df = total - k

    def sdd(extra_var: float) -> float:
        se = math.sqrt(msw * (1.0 / 5 + 1.0 / max_runs) + extra_var)
        return 1.0 - math.exp(-(t_quantile(alpha, df) + t_quantile(1.0 - power, df)) * se)

    per = []
    for s, raw in zip(logs, starts):
        m = sum(s) / len(s)
        sd = math.sqrt(sum((x - m) ** 2 for x in s) / (len(s) - 1))
        per.append({"runs": len(s), "mean": sum(raw) / len(raw), "cv_log": sd, "min": min(raw), "max": max(raw)})
    start_means = [math.exp(m) for m in means]
    return {"starts": k, "runs": total, "per_start": per, "sd_within": math.sqrt(msw), "sd_between": math.sqrt(var_b),
            "f": f, "df": [k - 1, df], "p_between": _f_sf(f, k - 1, df),
            "start_means": start_means, "spread_of_means": max(start_means) / min(start_means) - 1.0,
            "sdd_within_only": sdd(0.0), "sdd_across_restart": sdd(2.0 * var_b),
            "settings": {"alpha": alpha, "power": power, "baseline_runs": 5, "candidate_runs": max_runs}}

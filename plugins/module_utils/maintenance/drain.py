# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Should health.yml drain a host? Pure: its health findings and its throughput history decide.

A host is drained when one of its findings is critical (a GPU gone, a link trained down, an uncorrectable ECC error,
a pending row remap, hardware throttling, a fatal Xid, a failed DCGM test, ...), or when its tok/s fell against its
own history by more than ``margin``: a drop the history already found (bench/history_report.py's drops: the gate's
verdict between consecutive runs, or an E-divisive change point) that is still there in the series' latest run.
"""

from __future__ import annotations

from statistics import mean
from typing import Any, Sequence

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.history_report import series_name


class DrainError(ValueError):
    """The inputs are not findings and a bench_history query result: the message says which."""


def health_drain(findings: Sequence[dict[str, Any]], history: dict[str, Any] | None, host: str,
                 margin: float = 0.1) -> dict[str, Any]:
    """``{drain, reasons, critical, fell}``: whether to drain ``host``, and why (each critical finding's message, each
    throughput fall with its figures). ``history``: a bench_history ``state=query`` result (its ``series`` and
    ``drops``), or None for no history."""
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin < 1:
        raise DrainError(f"margin={margin!r} must be a share between 0 and 1 (0.1: a fall of more than 10%)")
    if not isinstance(findings, (list, tuple)) or not all(isinstance(f, dict) for f in findings):
        raise DrainError("findings must be a list of findings (health_compare's and gpu_health's)")
    critical = [f for f in findings if f.get("severity") == "critical"]
    fell = _falls(history or {}, host, margin)
    reasons = [f"critical: {f.get('message') or f.get('code')}" for f in critical] + [f["reason"] for f in fell]
    return {"drain": bool(reasons), "reasons": reasons, "critical": critical, "fell": fell}


def _falls(history: dict[str, Any], host: str, margin: float) -> list[dict[str, Any]]:
    if not isinstance(history, dict) or not isinstance(history.get("series", []), list) \
            or not isinstance(history.get("drops", []), list):
        raise DrainError("history must be a bench_history query result (with series and drops)")
    by_name = {series_name(s): s for s in history.get("series") or [] if s.get("host") == host}
    out = []
    for d in history.get("drops") or []:
        s = by_name.get(d.get("series")) if d.get("host") == host else None
        if s is None:
            continue
        medians = [r.get("median") for r in s.get("runs") or []]
        index = d.get("index")
        if not isinstance(index, int) or not 0 < index < len(medians) or None in medians:
            continue
        point = str(d.get("decision") or "").startswith("change point")
        if not point and index != len(medians) - 1:
            continue  # a step drop of an earlier run: the latest run was judged on its own step
        before = mean(medians[:index]) if point else medians[index - 1]
        now = medians[-1]
        if not before or now / before >= 1 - margin:
            continue
        out.append({"series": d["series"], "run_id": d.get("run_id"), "ratio": now / before, "before": before,
                    "now": now, "decision": d.get("decision"),
                    "reason": f"tok/s fell: {d['series']} is at {now:.1f} tok/s, {now / before:.1%} of {before:.1f} "
                              f"before run {d.get('run_id')} ({d.get('decision')}; the margin is {margin:.0%})"})
    return out

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet report of a rollout of any change kind: every host's before/after figures, decision and kind.

Pure functions over the per-host records the kinds' roles write (``gpufleet.kernel_upgrade/1`` of kernel_upgrade,
``gpufleet.vllm_upgrade/1`` of vllm_upgrade, each with its ``kind``; a record without one is a kernel's):
``gate_summary`` trims a throughput_gate result for the record, ``fleet_report`` puts the records of one run together
with the hosts that were not reached, and ``render_markdown`` writes it for people, with a ``kind`` column.
"""

from __future__ import annotations

from typing import Any, Iterable

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.verdict import PARTS, part_cell, part_summary
from ansible_collections.gpufleet.inference.plugins.module_utils.change.shapes import OK_DECISIONS

FORMAT = "gpufleet.kernel_upgrade_fleet/1"
# the title of a rollout of one kind; a rollout of several kinds is a "Change rollout"
TITLES = {"kernel": "Kernel rollout", "vllm": "vLLM rollout", "driver": "Driver rollout", "nccl": "NCCL settings rollout"}
# `inconclusive`: the gate could not tell (too noisy, drifting runs, or undecided at its cap); the host rolled
# back (or was never changed) like a regression, but is counted apart from it.
ORDER = ("unstable", "diverged", "regression", "inconclusive", "reverted", "failed_boot", "verify_failed", "preflight_failed", "refused", "error",
         "pass", "already", "planned", "not reached")


def gate_summary(gate: dict[str, Any] | None) -> dict[str, Any]:
    """The parts of a throughput_gate result a record keeps."""
    if not gate:
        return {}
    keep = ("decision", "final", "stage", "ratio", "p_value", "p_value_pass", "decided_by", "threshold", "alpha", "reason",
            "ci", "interval", "cv", "smallest_detectable_drop", "too_noisy", "advice", "screened", "latency", "throughput")
    out = {k: gate.get(k) for k in keep if k in gate}
    for side in ("baseline", "candidate"):
        stats = gate.get(side) or {}
        out[side] = {k: stats.get(k) for k in ("n", "median", "cv", "min", "max")}
    return out


def verdict_parts(verdict: dict[str, Any] | None) -> dict[str, Any]:
    """Each part of the serving verdict as the report shows it (bench/verdict.py part_summary()); {} for a record
    without parts (a stop before the gate, or a record from before them)."""
    parts = (verdict or {}).get("parts") or {}
    return {name: part_summary(name, parts[name]) for name in PARTS if isinstance(parts.get(name), dict)}


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def host_row(record: dict[str, Any]) -> dict[str, Any]:
    base = (record.get("baseline") or {}).get("samples") or []
    cand = (record.get("candidate") or {}).get("samples") or []
    gate = record.get("gate") or {}
    return {
        "host": record.get("host"),
        "kind": record.get("kind") or "kernel",
        "decision": record.get("decision") or "error",
        "old": record.get("old"),
        "target": record.get("target"),
        # what runs after the change (the kernel release, the vLLM version), and what the host comes back to
        "final_kernel": record.get("final_kernel") or record.get("final_version"),
        "default_kernel": record.get("default_kernel"),
        "locked": record.get("locked") or [],
        "baseline_median": _median([float(v) for v in base]),
        "candidate_median": _median([float(v) for v in cand]),
        "baseline_runs": len(base),
        "candidate_runs": len(cand),
        "ratio": gate.get("ratio"),
        "p_value": gate.get("p_value"),
        "p_value_pass": gate.get("p_value_pass"),
        "decided_by": gate.get("decided_by"),
        "cv": gate.get("cv"),
        "smallest_detectable_drop": gate.get("smallest_detectable_drop"),
        "advice": gate.get("advice") or "",
        "reason": record.get("reason") or "",
        "parts": verdict_parts(record.get("verdict")),
        "timings": record.get("timings") or {},
        "server_after_rollback": record.get("server_after_rollback"),
    }


def fleet_report(records: Iterable[dict[str, Any]], hosts: Iterable[str], run_id: str = "") -> dict[str, Any]:
    """One row per host of the play: its record of this run (``run_id``), or ``not reached``."""
    by_host: dict[str, dict[str, Any]] = {}
    for record in records:
        if not isinstance(record, dict) or "host" not in record:
            continue
        if run_id and record.get("run_id") != run_id:
            continue
        by_host[record["host"]] = record
    rows = []
    for host in hosts:
        if host in by_host:
            rows.append(host_row(by_host[host]))
        else:
            rows.append({"host": host, "decision": "not reached", "locked": [], "timings": {},
                         "reason": "no record of this run: its wave has not run yet, or the rollout stopped before it"})
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["decision"]] = counts.get(row["decision"], 0) + 1
    failed = [r["host"] for r in rows if r["decision"] not in OK_DECISIONS and r["decision"] != "not reached"]
    kinds = sorted({r["kind"] for r in rows if r.get("kind")}) or ["kernel"]
    return {"format": FORMAT, "run_id": run_id, "kinds": kinds, "hosts": rows, "counts": dict(sorted(counts.items())),
            "failed": failed, "inconclusive": [r["host"] for r in rows if r["decision"] == "inconclusive"],
            "ok": not failed}


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render_markdown(report: dict[str, Any]) -> str:
    rows = report.get("hosts") or []
    kinds = report.get("kinds") or ["kernel"]
    title = TITLES.get(kinds[0], f"{kinds[0]} rollout") if len(kinds) == 1 else "Change rollout"
    lines = [f"# {title}{' ' + report['run_id'] if report.get('run_id') else ''}", ""]
    counts = report.get("counts") or {}
    lines.append("Outcome: " + ", ".join(f"{counts[k]} {k}" for k in ORDER if k in counts) +
                 (f"; failed: {', '.join(report['failed'])}" if report.get("failed") else "; no host failed") + ".")
    lines += ["", "| host | decision | old -> target | runs now | default | baseline tok/s (median, runs) | "
                  "candidate tok/s (median, runs) | ratio | p (drop) | p (pass) | decided by | throughput | latency | "
                  "outputs | stability | locked | total s | kind |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| {host} | **{decision}** | {old} -> {target} | {final} | {default} | {bm} ({bn}) | {cm} ({cn}) | "
                     "{ratio} | {p} | {pp} | {by} | {says} | {locked} | {total} | {kind} |".format(
                         host=r["host"], decision=r["decision"], old=_fmt(r.get("old")), target=_fmt(r.get("target")),
                         final=_fmt(r.get("final_kernel")), default=_fmt(r.get("default_kernel")),
                         bm=_fmt(r.get("baseline_median")), bn=r.get("baseline_runs", 0), cm=_fmt(r.get("candidate_median")),
                         cn=r.get("candidate_runs", 0), ratio=_fmt(r.get("ratio"), 3), p=_fmt(r.get("p_value"), 4),
                         pp=_fmt(r.get("p_value_pass"), 4), by=_fmt(r.get("decided_by")),
                         says=" | ".join(part_cell(name, (r.get("parts") or {}).get(name)) for name in PARTS),
                         locked=", ".join(r.get("locked") or []) or "-",
                         total=_fmt((r.get("timings") or {}).get("total_s")), kind=r.get("kind") or "-"))
    lines += ["", "## Why", ""]
    for r in rows:
        extra = f" Server after the rollback: {r['server_after_rollback']}." if r.get("server_after_rollback") else ""
        if r["decision"] == "inconclusive" and r.get("cv") is not None:
            extra += (f" Measured CV {r['cv']:.1%}, smallest detectable drop {r.get('smallest_detectable_drop') or 0:.1%}"
                      + (f"; would help: {r['advice']}" if r.get("advice") else "") + ".")
        lines.append(f"- **{r['host']}** ({r['decision']}): {r.get('reason') or '-'}{extra}")
        for name, part in (r.get("parts") or {}).items():
            if part.get("says") != "yes":  # each part that said no, waited or was not measured, and why
                lines.append(f"  - {name}: {part_cell(name, {**part, 'figures': {}})}: {part.get('reason') or '-'}")
    return "\n".join(lines) + "\n"

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Summaries of measured vLLM runs: client against client, run-to-run noise, and the stage table of
vLLM flag profiles kept or reverted by the throughput gate. Pure functions, standard library only.

Every input is what tests/tools/h200_vllm.py stores (docs/examples/h200-vllm/): a run is a dict with
``output_throughput`` (tok/s), ``duration_s`` and the client's ``ttft_ms``/``tpot_ms`` summaries
(``p50``/``p99``). The stage table follows the measured-tuning format: stage, what changed, tok/s per
concurrency, TTFT and TPOT p50/p99, ratio to the baseline and to the previous stage, the gate's verdict
and p-value, kept or reverted. A stage is kept only on ``pass``; ``inconclusive`` reverts (the default
of measured tuning). The verdicts are recomputed from the stored runs with throughput_gate.decide(),
so a change to the gate changes this table in one place.
"""

from __future__ import annotations

from typing import Any, Sequence

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import throughput_gate as tg
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import stats as gate_stats


def _tput(runs: Sequence[dict]) -> list[float]:
    """The runs' tok/s; a run at 0 stays (it is a result: the server produced nothing), one without a figure is left out."""
    return [float(r["output_throughput"]) for r in runs if r.get("output_throughput") is not None]


def _gate_runs(runs: Sequence[dict]) -> list[float]:
    """The runs the gate judges: a run without tok/s (it failed) is a dead run at 0, a failure the gate counts,
    never left out as an outlier would be."""
    return [float(r.get("output_throughput") or 0.0) for r in runs]


def compare_summary(ours: Sequence[dict], theirs: Sequence[dict], target: float = 0.03) -> dict[str, Any]:
    """Our client against ``vllm bench serve`` on one level: medians, their ratio, and the CPU per request."""
    a, b = _tput(ours), _tput(theirs)
    out: dict[str, Any] = {"ours_median": gate_stats.median(a) if a else None, "vllm_median": gate_stats.median(b) if b else None,
                           "ratio": None, "within_target": None, "ours_lower": None}
    if a and b:
        ratio = out["ours_median"] / out["vllm_median"]
        out.update(ratio=round(ratio, 4), within_target=abs(ratio - 1.0) <= target, ours_lower=ratio < 1.0)
        # the ratio's uncertainty (seeded bootstrap of the medians): whether "within 3%" or "ours lower" is
        # resolved at all by these runs, or only what their medians happened to be
        ci = gate_stats.bootstrap_ratio_ci(b, a)
        if ci:
            out.update(ratio_ci=[round(ci[0], 4), round(ci[1], 4)],
                       within_target_resolved=1.0 - target <= ci[0] and ci[1] <= 1.0 + target,
                       ours_lower_resolved=ci[1] < 1.0)
    paired = paired_ratio(ours, theirs, target)
    if paired:
        out["paired"] = paired
    cpu = [r["client_cpu_s_per_request"] for r in ours if r.get("client_cpu_s_per_request") is not None]
    out["ours_cpu_s_per_request_median"] = gate_stats.median(cpu) if cpu else None
    pcpu = [r["process_cpu_s_per_request"] for r in theirs if r.get("process_cpu_s_per_request") is not None]
    out["vllm_process_cpu_s_per_request_median"] = gate_stats.median(pcpu) if pcpu else None
    return out


def paired_ratio(ours: Sequence[dict], theirs: Sequence[dict], target: float = 0.03) -> dict[str, Any] | None:
    """Our run over theirs of the same ``round`` (back to back, same seed): the median of those ratios and its
    distribution-free 95% interval (gate_stats.median_ci). A slow stretch of the server that spans both runs
    of a round cancels out of its ratio, which the unpaired medians cannot do. None without 6 such pairs."""
    by_round = {r["round"]: float(r["output_throughput"]) for r in theirs
                if r.get("round") is not None and r.get("output_throughput")}
    ratios = [float(r["output_throughput"]) / by_round[r["round"]] for r in ours
              if r.get("round") in by_round and r.get("output_throughput")]
    ci = gate_stats.median_ci(ratios)
    if not ci:
        return None
    return {"pairs": len(ratios), "ratio": round(gate_stats.median(ratios), 4), "ratio_ci": [round(ci[0], 4), round(ci[1], 4)],
            "within_target_resolved": 1.0 - target <= ci[0] and ci[1] <= 1.0 + target,
            "ours_lower_resolved": ci[1] < 1.0, "ours_higher_resolved": ci[0] > 1.0,
            "ours_higher_share": round(sum(1 for x in ratios if x > 1.0) / len(ratios), 4)}


def noise_cell(values: Sequence[float], durations: Sequence[float]) -> dict[str, Any]:
    """Run-to-run spread of whole runs at one level and run length: n, median, CV, mean run length.

    Whether the gate can decide at that CV (pass no change, catch an 8% drop) is the simulation's answer (tests/benchmarks/
    bench_throughput_gate.py simulate(), as tests/tools/h200_report.py tabulates it), not a rule of thumb.
    """
    stats = gate_stats.sample_stats(list(values)) if values else {"n": 0, "cv": None, "median": None}
    return {"n": stats["n"], "median": stats.get("median"), "cv": stats.get("cv"),
            "mean_duration_s": round(sum(durations) / len(durations), 3) if durations else None}


def _pct(runs: Sequence[dict], key: str, q: str) -> float | None:
    vals = [r[key][q] for r in runs if isinstance(r.get(key), dict) and r[key].get(q) is not None]
    return gate_stats.median(vals) if vals else None


def _latency_args(gate: dict[str, Any], b: list[float], c: list[float]) -> dict[str, Any]:
    """The gate's latency inputs from the stored gate runs (their per-run TTFT/TPOT p50 and p90), when both sides carry
    them for every run; {} otherwise (the row's latency part is then ``not measured``)."""
    base, cand = tg.latency_series(gate["baseline_runs"]), tg.latency_series(gate["candidate_runs"])
    if not base or not cand or len(gate["baseline_runs"]) != len(b) or len(gate["candidate_runs"]) != len(c):
        return {}
    return {"baseline_latency": base, "candidate_latency": cand, "latency_margins": gate.get("latency_margins")}


def stage_table(records: Sequence[dict], gate_level: int, threshold: float = 0.95,
                latency: bool = False) -> list[dict[str, Any]]:
    """One row per stage record (the first is the baseline), the gate's verdict recomputed from the stored runs.

    A record: ``stage``, ``changed`` (the role variables it set), ``levels`` ({concurrency: [runs]}) and
    ``gate`` ({baseline_runs, candidate_runs}: the interleaved runs against the configuration before it, and
    optionally baseline_workload/candidate_workload), or None for the baseline. The gate level's figures are the
    candidate's gate runs. A gate run without tok/s is a dead run (a failure); a record the gate cannot judge
    (a dead baseline run, other workloads) is an ``error`` row, reverted. With ``latency`` the verdict has the latency
    part too (the runs' TTFT/TPOT p50 and p90, the record's ``gate.latency_margins`` or the defaults) and the row its
    ``latency`` (status and per-metric answers); without it (the stored sessions' verdicts) the verdict is throughput's
    and the row's latency is ``not measured``.
    """
    rows: list[dict[str, Any]] = []
    if not records:
        return rows
    # the baseline at the gate level: its own runs and the baseline runs the first stage was gated against
    # (the first stage is always measured against the untouched configuration, interleaved with it)
    base_runs = list(records[0]["levels"].get(str(gate_level), []))
    if len(records) > 1 and records[1].get("gate"):
        base_runs += records[1]["gate"].get("baseline_runs", [])
    base_med = gate_stats.median(_tput(base_runs)) if _tput(base_runs) else None
    for rec in records:
        by_level = dict(rec["levels"])
        if rec is records[0]:
            by_level[str(gate_level)] = base_runs
        levels = {c: (gate_stats.median(_tput(runs)) if _tput(runs) else None)
                  for c, runs in sorted(by_level.items(), key=lambda kv: int(kv[0]))}
        gate_runs = by_level.get(str(gate_level), [])
        row: dict[str, Any] = {
            "stage": rec["stage"], "changed": rec.get("changed") or {}, "tok_s": levels,
            "ttft_ms_p50": _pct(gate_runs, "ttft_ms", "p50"), "ttft_ms_p99": _pct(gate_runs, "ttft_ms", "p99"),
            "tpot_ms_p50": _pct(gate_runs, "tpot_ms", "p50"), "tpot_ms_p99": _pct(gate_runs, "tpot_ms", "p99"),
            "ratio_to_baseline": None, "ratio_to_previous": None, "verdict": None, "p_value": None,
            "candidate_runs": 0, "kept": None, "error": rec.get("error")}
        gate = rec.get("gate")
        if gate is None and rec is records[0]:
            row.update(verdict="baseline", kept=True, ratio_to_baseline=1.0)
        elif gate and len(gate.get("baseline_runs", [])) and len(gate.get("candidate_runs", [])):
            b, c = _gate_runs(gate["baseline_runs"]), _gate_runs(gate["candidate_runs"])
            st = gate.get("settings") or {}
            # replayed look by look as the sequential gate takes them; runs stored under a gate whose first
            # look was at min_runs are replayed with that first look
            try:  # the workloads, when the record keeps them, must be the same (the gate refuses otherwise)
                d = tg.replay(b, c, threshold=st.get("threshold", threshold), min_runs=st.get("min_runs", 5),
                              candidate_min_runs=st.get("candidate_min_runs", st.get("min_runs", 5)),
                              max_runs=st.get("max_runs", 15), bootstrap=0, order=st.get("order", "interleaved"),
                              baseline_workload=gate.get("baseline_workload"), candidate_workload=gate.get("candidate_workload"),
                              change="vllm_flags",  # a flag stage: the server's argv is what changed
                              **(_latency_args(gate, b, c) if latency else {}))
            except gate_stats.GateError as err:
                row.update(verdict="error", kept=False, error=str(err))
                rows.append(row)
                continue
            cmed = gate_stats.median(c)
            row.update(verdict=d["decision"], final=d["final"], runs_needed=d["runs_needed"], p_value=d["p_value"],
                       candidate_runs=d["candidate_runs_used"], kept=d["decision"] == "pass",
                       ratio_to_previous=round(d["ratio"], 4) if d["ratio"] else None,
                       ratio_to_baseline=round(cmed / base_med, 4) if base_med else None,
                       latency={"status": d["latency"]["status"],
                                "metrics": {k: {f: m[f] for f in ("decision", "ratio", "interval", "margin")}
                                            for k, m in d["latency"]["metrics"].items()}})
        else:
            row.update(verdict="not measured", kept=False)
        rows.append(row)
    return rows


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def stage_table_markdown(rows: Sequence[dict], levels: Sequence[int]) -> str:
    """The stage table as Markdown (docs/gpu_h200.md)."""
    head = (["stage", "what changed"] + [f"tok/s c={c}" for c in levels] +
            ["TTFT p50/p99 ms", "TPOT p50/p99 ms", "x baseline", "x previous", "verdict", "p", "runs", "kept"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        changed = ", ".join(f"{k.replace('vllm_service_', '')}={v}" for k, v in r["changed"].items()) or "-"
        cells = [r["stage"], changed] + [_fmt(r["tok_s"].get(str(c))) for c in levels] + [
            f"{_fmt(r['ttft_ms_p50'], 1)} / {_fmt(r['ttft_ms_p99'], 1)}",
            f"{_fmt(r['tpot_ms_p50'], 2)} / {_fmt(r['tpot_ms_p99'], 2)}",
            _fmt(r["ratio_to_baseline"], 3), _fmt(r["ratio_to_previous"], 3), _fmt(r["verdict"]),
            "-" if r["p_value"] is None else f"{r['p_value']:.4f}", _fmt(r["candidate_runs"]),
            "kept" if r["kept"] else "reverted"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"

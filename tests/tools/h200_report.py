#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tables of docs/gpu_h200.md, recomputed from the stored runs (docs/examples/h200-vllm/*.json).

Client against ``vllm bench serve``, run-to-run noise with the gate's simulated false-rollback and
5%-drop detection at each measured CV, the gate's verdicts (throughput_gate.decide() on the stored
runs), the measured-tuning stage table (tests/tools/vllm_flag_stages.py) and the PCIe probe. The unit
test tests/unit/plugins/module_utils/test_h200_replay.py checks these against expected.yml.

    . scripts/lib.sh; gpufleet_env
    python tests/tools/h200_report.py [docs/examples/h200-vllm] [--trials 2000]

``--request-shapes`` prints the server's work per request at c=256 for each of our client's request shapes beside
``vllm bench serve`` in the stored comparisons (REQUEST_SHAPE_FILES).

A folder with restarts*.json (h200_vllm.py restarts; docs/examples/h200-vllm-7b/) prints instead, per file, the runs
of each server start, the noise within and between starts (h200_restarts.between_starts) and the kernel upgrade's
gate loop over each stored pair of starts (h200_restarts.upgrade_gate).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
for _path in (os.path.join(REPO, ".collections"), REPO, os.path.join(REPO, "tests", "benchmarks"), HERE):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import throughput_gate as tg  # noqa: E402
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import stats as gate_stats
from tests.tools import vllm_flag_stages as vfs  # noqa: E402

DIR = os.path.join(REPO, "docs", "examples", "h200-vllm")
GATE = {"threshold": 0.95, "min_runs": 5, "max_runs": 15}  # the rest at decide()'s defaults
# A cell can decide when the whole simulated procedure (tests/benchmarks/bench_throughput_gate.py: baseline
# runs while the gate asks for them, candidate looks up to 15 runs, the real decide()) at that CV rolls back
# at most 1% of unchanged servers (any verdict but pass) and calls at least 90% of 8% drops (the drop the
# gate at 0.95 must never pass) a regression. An 8%, not a 5%, drop: at 0.95 a 5% drop is the threshold
# itself, which the gate may answer either way (its indifference zone runs from a 4% to an 8% drop).
DECIDES = {"false_rollback_max": 0.01, "caught_min": 0.90, "drop": 0.08}
# What a site can use at its CV: the smallest of these drops that the simulated gate calls a regression in 90%.
DROPS = (0.06, 0.07, 0.08, 0.10, 0.15, 0.20, 0.30, 0.50)


def min_drop_caught(cv: float, trials: int, seed: int = 1) -> float | None:
    """The smallest drop of DROPS that the simulated procedure calls a regression in 90% of trials at ``cv``."""
    from bench_throughput_gate import simulate
    for drop in DROPS:
        if simulate((f"min-drop/{cv:.4f}/{drop}", cv, drop, 0.0, False, trials, seed, GATE))["regression"] >= DECIDES["caught_min"]:
            return drop
    return None


def load(name: str, folder: str = DIR):
    with open(os.path.join(folder, name), encoding="utf-8") as fh:
        return json.load(fh)


def noise_rows(noise: dict, trials: int = 2000, seed: int = 1, min_drop: bool = True) -> list[dict]:
    from bench_throughput_gate import simulate
    rows = []
    for cell in noise["cells"]:
        values = [r["output_throughput"] for r in cell["runs"]]
        stats = gate_stats.sample_stats(values)
        cv = stats["cv"]
        name = f"c{cell['concurrency']}/r{cell['requests']}"
        fr = simulate((name + "/none", cv, 0.0, 0.0, False, trials, seed, GATE))
        caught = simulate((name + "/drop", cv, DECIDES["drop"], 0.0, False, trials, seed, GATE))
        rows.append({"concurrency": cell["concurrency"], "requests": cell["requests"], "n": stats["n"],
                     "median": stats["median"], "min": stats["min"], "max": stats["max"], "cv": cv,
                     "run_s": sum(r["duration_s"] for r in cell["runs"]) / len(cell["runs"]),
                     "false_rollback": fr["rollback"], "caught": caught["regression"],
                     "decides": fr["rollback"] <= DECIDES["false_rollback_max"]
                     and caught["regression"] >= DECIDES["caught_min"],
                     "min_drop_90": min_drop_caught(cv, trials, seed) if min_drop else None})
    return rows


def gate_rows(gate: dict) -> list[dict]:
    rows = []
    for g in gate["gates"]:
        b = [r["output_throughput"] for r in g.get("baseline_runs", [])]
        c = [r["output_throughput"] for r in g.get("candidate_runs", [])]
        if not b or not c:
            rows.append({"label": g["label"], "decision": "not measured", "why": "deadline" if g.get("deadline_hit") else g.get("error")})
            continue
        st = g.get("settings") or {}
        # the stored runs, judged look by look as they were taken (tg.replay): the first final answer, or the
        # last look's "inconclusive, run N more" (stored runs cannot be extended)
        d = tg.replay(b, c, threshold=st.get("threshold", 0.95), min_runs=st.get("min_runs", 5),
                      candidate_min_runs=st.get("candidate_min_runs", st.get("min_runs", 5)),
                      max_runs=st.get("max_runs", 15), bootstrap=0, order=st.get("order", "interleaved"))
        rows.append({"label": g["label"], "decision": d["decision"], "final": d["final"], "runs_needed": d["runs_needed"],
                     "decided_by": d["decided_by"], "ratio": d["ratio"], "p_value": d["p_value"],
                     "p_value_pass": d["p_value_pass"], "baseline_runs": len(b), "candidate_runs": d["candidate_runs_used"],
                     "stored_candidate_runs": len(c),
                     "baseline_median": d["baseline"]["median"], "candidate_median": d["candidate"]["median"],
                     "baseline_cv": d["baseline"]["cv"], "candidate_cv": d["candidate"]["cv"]})
    return rows


def _med(values):
    values = [v for v in values if v is not None]
    return gate_stats.median(values) if values else None


# Our client's runs beside "ours" in a comparison, as the sessions stored them: "ours_no_usage" (the default request in
# the second to sixth sessions' files), "ours_usage" and "ours_text" (h200_vllm.CLIENTS).
OTHER_OURS = ("ours_no_usage", "ours_usage", "ours_text")


def request_label(runs: list[dict]) -> str:
    """What our client's runs asked, from what each run recorded: the prompt form and whether per-chunk usage
    (``stream_options.continuous_usage_stats``) was on; "not recorded" for runs that predate the field."""
    shapes = {(r.get("prompt_mode", "token_ids"), r.get("per_chunk_usage")) for r in runs}
    labels = []
    for mode, usage in sorted(shapes, key=str):
        form = "text" if mode == "text" else "token IDs"
        labels.append(form + {True: ", per-chunk usage", False: "", None: ", per-chunk usage not recorded"}[usage])
    return " / ".join(labels)


def _client_summary(runs: list[dict], vllm: list[dict]) -> dict:
    s = vfs.compare_summary(runs, vllm)
    s.update(runs=[r["output_throughput"] for r in runs], cpu_pct_max=max(r["client_cpu_pct"] for r in runs),
             itl_exact=[r.get("itl_exact") for r in runs], tokens_per_chunk=_med([r.get("tokens_per_chunk") for r in runs]),
             request=request_label(runs))
    return s


def compare_rows(compare: dict) -> list[dict]:
    """Per level: our client against vllm bench serve, each of our clients named by the request its runs recorded
    (``ours_request``; the other shapes measured beside it under ``others``, keyed as stored)."""
    rows = []
    for level, rec in sorted(compare["levels"].items(), key=lambda kv: int(kv[0])):
        s = vfs.compare_summary(rec["ours"], rec["vllm"])
        s.update(concurrency=int(level), requests=rec["requests"],
                 ours=[r["output_throughput"] for r in rec["ours"]], vllm=[r["output_throughput"] for r in rec["vllm"]],
                 ours_cpu_pct_max=max(r["client_cpu_pct"] for r in rec["ours"]), ours_request=request_label(rec["ours"]))
        others = [k for k in OTHER_OURS if rec.get(k)]
        if others:
            s["others"] = {k: _client_summary(rec[k], rec["vllm"]) for k in others}
            s["ours_itl_exact"] = [r["itl_exact"] for r in rec["ours"]]
            s["ours_tokens_per_chunk"] = _med([r["tokens_per_chunk"] for r in rec["ours"]])
            # the server's CPU (API server + engine core) per request over each client's whole call
            s["server_cpu_ms_per_request"] = {
                who: round(1000 * _med([r["call_load"]["server_cpu_s_per_request"] for r in rec[who]]), 1)
                for who in ("ours", *others, "vllm")}
            s["host_steal_pct_max"] = max(r["call_load"]["host_steal_pct"] for who in ("ours", *others, "vllm")
                                          for r in rec[who])
        rows.append(s)
    return rows


def _runs(values) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)


def _ci(s: dict) -> str:
    ci = s.get("ratio_ci")
    return f"{s['ratio']:.3f} [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else f"{s['ratio']:.3f}"


def _client_name(request: str) -> str:
    """A column's name for our client by its request: "ours" for the default (token IDs), else what differs."""
    return "ours" if request == "token IDs" else "ours, " + request.removeprefix("token IDs, ")


def compare_markdown(rows: list[dict]) -> list[str]:
    if not rows or "others" not in rows[0]:
        out = ["| c | requests/run | our request | ours tok/s (runs) | vllm bench tok/s (runs) | ours / vllm | "
               "ours CPU s/request | ours CPU % of a core (max) | vllm bench process CPU s/request |",
               "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            out.append(f"| {r['concurrency']} | {r['requests']} | {r['ours_request']} | {r['ours_median']:,.0f} "
                       f"({_runs(r['ours'])}) | {r['vllm_median']:,.0f} ({_runs(r['vllm'])}) | {r['ratio']:.3f} | "
                       f"{r['ours_cpu_s_per_request_median'] * 1000:.2f} ms | {r['ours_cpu_pct_max']:.0f} | "
                       f"{r['vllm_process_cpu_s_per_request_median'] * 1000:.1f} ms |")
        return out
    others = list(rows[0]["others"])
    names = [_client_name(rows[0]["ours_request"])] + [_client_name(rows[0]["others"][k]["request"]) for k in others]
    out = ["| c | requests/run | " + " | ".join(f"{n} tok/s (runs)" for n in names) + " | vllm bench tok/s (runs) | "
           + " | ".join(f"{n} / vllm [95% CI]" for n in names) + " | client CPU ms/request ("
           + " / ".join(names + ["vllm bench"]) + ") | ours CPU % of a core (max) | server CPU ms/request ("
           + " / ".join(names + ["vllm bench"]) + ") | tokens/chunk (" + " / ".join(names) + ") |",
           "|" + "---|" * (6 + 2 * len(names) + 1)]
    for r in rows:
        os_ = [r["others"][k] for k in others]
        sc = r["server_cpu_ms_per_request"]
        out.append(f"| {r['concurrency']} | {r['requests']} | {r['ours_median']:,.0f} ({_runs(r['ours'])}) | "
                   + "".join(f"{o['ours_median']:,.0f} ({_runs(o['runs'])}) | " for o in os_)
                   + f"{r['vllm_median']:,.0f} ({_runs(r['vllm'])}) | " + " | ".join([_ci(r)] + [_ci(o) for o in os_])
                   + " | " + " / ".join(f"{x['ours_cpu_s_per_request_median'] * 1000:.1f}" for x in [r] + os_)
                   + f" / {r['vllm_process_cpu_s_per_request_median'] * 1000:.1f} | "
                   + f"{max([r['ours_cpu_pct_max']] + [o['cpu_pct_max'] for o in os_]):.0f} | "
                   + " / ".join(str(sc[w]) for w in ["ours", *others, "vllm"]) + " | "
                   + " / ".join(f"{x:.2f}" for x in [r["ours_tokens_per_chunk"]] + [o["tokens_per_chunk"] for o in os_])
                   + " |")
    return out


def markdown(folder: str = DIR, trials: int = 2000) -> str:
    out = ["### Client against vllm bench serve", ""] + compare_markdown(compare_rows(load("compare.json", folder)))
    out += ["", "### Run-to-run noise", "",
            "| c | requests/run | run length | runs | median tok/s (min-max) | CV | simulated false rollbacks | "
            "8% drop caught | can decide | drops caught in 90% |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(noise_rows(load("noise.json", folder), trials), key=lambda r: (r["concurrency"], r["requests"])):
        out.append(f"| {r['concurrency']} | {r['requests']} | {r['run_s']:.1f} s | {r['n']} | {r['median']:,.0f} "
                   f"({r['min']:,.0f}-{r['max']:,.0f}) | {r['cv']:.1%} | {r['false_rollback']:.1%} | {r['caught']:.1%} | "
                   f"{'yes' if r['decides'] else 'no'} | "
                   f"{'>= ' + format(r['min_drop_90'], '.0%') if r['min_drop_90'] else '> 50%'} |")
    out += ["", "### The gate at 0.95", "",
            "| case | baseline tok/s (runs, CV) | candidate tok/s (runs, CV) | ratio (geometric means) | verdict | p (drop) | p (pass) |",
            "|---|---|---|---|---|---|---|"]
    for r in gate_rows(load("gate.json", folder)):
        if "ratio" not in r:
            out.append(f"| {r['label']} | - | - | - | {r['decision']} ({r['why']}) | - | - |")
            continue
        verdict = r["decision"] if r["final"] else f"{r['decision']} (run {r['runs_needed']} more)"
        out.append(f"| {r['label']} | {r['baseline_median']:,.0f} ({r['baseline_runs']}, {r['baseline_cv']:.1%}) | "
                   f"{r['candidate_median']:,.0f} ({r['candidate_runs']}, {r['candidate_cv']:.1%}) | {r['ratio']:.3f} | "
                   f"{verdict} | {r['p_value']:.4f} | {r['p_value_pass']:.4f} |")
    tune = load("tune.json", folder)
    out += ["", "### Measured-tuning stages (gate level c=64)", "",
            vfs.stage_table_markdown(vfs.stage_table(tune["records"], 64), [16, 64, 256]).rstrip()]
    facts = load("pcie_facts.json", folder)["pcie"]
    bw = facts["bandwidth"]
    run = load("pcie_run.json", folder)["cells"][0]
    out += ["", "### PCIe during the run", "", "| GPU | H2D pinned | D2H pinned | H2D pageable | D2H pageable | link | "
            "tok/s of the c=64 runs beside it |", "|---|---|---|---|---|---|---|"]
    beside = ", ".join(f"{r['output_throughput']:,.0f}" for r in run["runs"])
    for bdf, g in bw["gpus"].items():
        out.append(f"| {bdf} | {g['h2d_pinned_gbps']} GB/s ({g['h2d_pinned_pct']}%) | {g['d2h_pinned_gbps']} GB/s "
                   f"({g['d2h_pinned_pct']}%) | {g['h2d_pageable_gbps']} GB/s | {g['d2h_pageable_gbps']} GB/s | "
                   f"{g['theoretical_gbps']} GB/s | {beside} |")
    return "\n".join(out) + "\n"


# ---- the 7B-distill architecture: noise between server starts and the kernel upgrade's gate across a restart ----------
def _cv_sample(values) -> float:
    m = sum(values) / len(values)
    return (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5 / m if len(values) > 1 else 0.0


def restart_files(folder: str) -> list[str]:
    """The restarts*.json of a folder (h200_vllm.py restarts), one per device machine, in name order."""
    return sorted(f for f in os.listdir(folder) if f.startswith("restarts") and f.endswith(".json"))


def cell_workload(key: str) -> str:
    """The workload of a level key: "" for random prompts, else the profile and its options and arrivals as the cell
    names them (``64x512/256@shared_prefix={"prefix_tokens":1536}``: h200_vllm.py cell_args)."""
    return key.partition("@")[2]


def workload_label(key: str) -> str:
    """A cell's workload in words: the profile, its options and its arrivals (open loop) without JSON punctuation."""
    work = cell_workload(key)
    if not work:
        return "random"
    head, _sep, arrivals = work.partition("~")
    name, _eq, options = head.partition("=")
    parts = [name] + ([_words(json.loads(options))] if options else [])
    if arrivals:
        a = json.loads(arrivals)
        parts.append(f"{a['mode']} {a['rate']}/s" + (f" burstiness {a['burstiness']}" if "burstiness" in a else ""))
    return ", ".join(parts)


def _words(options: dict) -> str:
    return " ".join(f"{k} {_words(v) if isinstance(v, dict) else v}" for k, v in options.items())


def cell_key(key: str, settings: dict) -> tuple[int, int, int]:
    """A start's level key as (concurrency, prompt tokens, output tokens): "64" is the gate level at the settings'
    lengths, "16x2048/256" a --cells cell (h200_vllm.py cell_args; a workload after "@" is cell_workload's)."""
    key = key.partition("@")[0]
    if "x" not in key:
        return int(key), settings["prompt_tokens"], settings["output_tokens"]
    level, lengths = key.split("x", 1)
    prompt, output = lengths.split("/", 1)
    return int(level), int(prompt), int(output)


def _cell_order(item) -> tuple:
    level, prompt, output = item[0]
    return (prompt, output, -level)


def _p(runs: list[dict], metric: str, pct: str):
    """The median over runs of each run's percentile ``pct`` of ``metric`` (ttft_ms, tpot_ms), or None."""
    return _med([(r.get(metric) or {}).get(pct) for r in runs])


def restart_rows(data: dict) -> list[dict]:
    """One row per server start and cell: runs, mean, CV, range, the start's ready time, the workload, the prompt
    tokens a request really had (a long_context prompt is fitted to the server's context) and the latency (the median
    over runs of each run's TTFT p50/p99 and TPOT p50/p99)."""
    rows = []
    for st in data["starts"]:
        cells = sorted(((cell_key(k, data["settings"]), k, v) for k, v in st["levels"].items()),
                       key=lambda c: _cell_order(c) + (c[1],))
        for (level, prompt, output), key, runs in cells:
            values = [r["output_throughput"] for r in runs]
            if not values:
                continue
            sent = [r["prompt_tokens"] / r["requests"] for r in runs if r.get("prompt_tokens")]
            rows.append({"key": key, "workload": workload_label(key), "prompt_sent": _med(sent),
                         "ttft_p50": _p(runs, "ttft_ms", "p50"), "ttft_p99": _p(runs, "ttft_ms", "p99"),
                         "tpot_p50": _p(runs, "tpot_ms", "p50"), "itl_p99": _p(runs, "itl_ms", "p99"),
                         "rate": _med([(r.get("arrivals") or {}).get("achieved_rate") for r in runs]),
                         "start": st["index"], "profile": st["profile"], "level": level, "prompt": prompt, "output": output,
                         "runs": len(values), "requests": runs[0]["requests"],
                         "run_s": sorted(r["duration_s"] for r in runs)[len(runs) // 2],
                         "mean": sum(values) / len(values), "cv": _cv_sample(values), "min": min(values), "max": max(values),
                         "errors": sum(r["errors"] for r in runs),
                         "ready_s": (st.get("ready") or {}).get("since_start_s")})
    return rows


def restart_cells(data: dict) -> list[tuple[str, tuple[int, int, int]]]:
    """Every level key the starts hold, with its cell, in table order."""
    keys = {k for st in data["starts"] for k in st["levels"]}
    return sorted(((k, cell_key(k, data["settings"])) for k in keys), key=lambda kc: _cell_order((kc[1], None)))


def restart_noise(data: dict, level, profile: str) -> dict | None:
    """h200_restarts.between_starts over the starts of ``profile`` at one level key (two or more, two runs each)."""
    import h200_restarts as hr
    starts = [[r["output_throughput"] for r in st["levels"].get(str(level), [])] for st in data["starts"]
              if st["profile"] == profile]
    starts = [s for s in starts if len(s) >= 2]
    return hr.between_starts(starts) if len(starts) >= 2 else None


def restart_gates(data: dict) -> list[dict]:
    """The kernel upgrade's gate loop (h200_restarts.upgrade_gate, the role's defaults) over each --gates pair."""
    import h200_restarts as hr
    level = str(data["settings"]["concurrency"][0])
    by = {st["index"]: st for st in data["starts"]}
    out = []
    # the pairs of the settings, and those the driver gated (a later call may have added pairs to the plan)
    pairs = [tuple(int(x) for x in p.split(":")) for p in data["settings"].get("gates") or []]
    pairs += [(g["baseline_start"], g["candidate_start"]) for g in data.get("gates") or []]
    for b, c in sorted(set(pairs), key=pairs.index):
        if b not in by or c not in by:
            continue
        runs = [[r["output_throughput"] for r in by[i]["levels"].get(level, [])] for i in (b, c)]
        g = hr.upgrade_gate(*runs)
        out.append({"baseline_start": b, "candidate_start": c, "baseline_profile": by[b]["profile"],
                    "candidate_profile": by[c]["profile"], "level": int(level), **g})
    return out


def argv_change(base: list[str], cand: list[str]) -> str:
    """What a candidate start's command line has that the baseline's has not (and the reverse), as flags."""
    def flags(argv):
        out, i = {}, 0
        while i < len(argv):
            if argv[i].startswith("--"):
                has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
                out[argv[i]] = argv[i + 1] if has_value else ""
                i += 2 if has_value else 1
            else:
                i += 1
        return out
    b, c = flags(base), flags(cand)
    parts = [f"{k} {v}".strip() for k, v in c.items() if b.get(k, None) != v]
    parts += [f"without {k}" for k in b if k not in c]
    return ", ".join(parts) or "none"


def stage_rows(data: dict) -> list[dict]:
    """Each --gates pair as a stage: the flags it changed, the gate at the gate level (restart_gates), and on every
    other cell both starts measured the kernel upgrade's gate loop over those runs with the latency of each side."""
    import h200_restarts as hr
    by = {st["index"]: st for st in data["starts"]}
    gate_key = str(data["settings"]["concurrency"][0])
    rows = []
    for g in restart_gates(data):
        b, c = by[g["baseline_start"]], by[g["candidate_start"]]
        cells = []
        for key in [gate_key] + sorted(set(b["levels"]) & set(c["levels"]) - {gate_key}):
            rb, rc = b["levels"].get(key), c["levels"].get(key)
            if not rb or not rc:
                continue
            v = g if key == gate_key else hr.upgrade_gate([r["output_throughput"] for r in rb],
                                                          [r["output_throughput"] for r in rc])
            cells.append({"key": key, "workload": workload_label(key), "level": cell_key(key, data["settings"]),
                          "decision": v.get("decision"), "needs": v.get("needs"), "ratio": (v.get("gate") or {}).get("ratio"),
                          "interval": (v.get("gate") or {}).get("interval"),
                          "runs": (v.get("baseline_runs_used", len(rb)), v.get("candidate_runs_used", len(rc))),
                          "ttft_p50": (_p(rb, "ttft_ms", "p50"), _p(rc, "ttft_ms", "p50")),
                          "tpot_p50": (_p(rb, "tpot_ms", "p50"), _p(rc, "tpot_ms", "p50")),
                          "itl_p99": (_p(rb, "itl_ms", "p99"), _p(rc, "itl_ms", "p99"))})
        rows.append({"baseline_start": b["index"], "candidate_start": c["index"], "candidate_profile": c["profile"],
                     "change": argv_change(b["argv"], c["argv"]), "cells": cells})
    return rows


def _pair(values, fmt: str = ".0f") -> str:
    return " / ".join("-" if v is None else format(v, fmt) for v in values)


def stage_markdown(data: dict) -> list[str]:
    out = ["| stage (start) | changed | cell | workload | runs used | ratio | interval | verdict | TTFT p50 ms | TPOT p50 ms | "
           "ITL p99 ms |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in stage_rows(data):
        for i, cell in enumerate(r["cells"]):
            lv, p, o = cell["level"]
            head = (f"| {r['candidate_profile']} ({r['baseline_start']} -> {r['candidate_start']}) | {r['change']} |"
                    if i == 0 else "| | |")
            verdict = (f"not decided ({cell['needs']['runs']} {cell['needs']['side']} runs needed)" if cell["needs"] else
                       f"**{cell['decision']}**")
            ratio = "-" if cell["ratio"] is None else f"{cell['ratio']:.4f}"
            interval = "-" if not cell["interval"] else f"{cell['interval'][0]:.4f}-{cell['interval'][1]:.4f}"
            size = f"c={lv} {p}/{o}" if cell["workload"] == "random" else f"c={lv}"
            out.append(f"{head} {size} | {cell['workload']} | {cell['runs'][0]} + {cell['runs'][1]} | {ratio} | {interval} | "
                       f"{verdict} | {_pair(cell['ttft_p50'])} | {_pair(cell['tpot_p50'], '.2f')} | "
                       f"{_pair(cell['itl_p99'], '.1f')} |")
    return out


def workload_markdown(data: dict) -> list[str]:
    """The starts' table when cells have workload profiles: the workload, the prompt tokens sent and the latency."""
    out = ["| start | profile | ready after | c | workload | prompt/output tokens (sent) | runs | mean tok/s | CV | "
           "min-max | TTFT p50 / p99 ms | TPOT p50 ms | ITL p99 ms | arrivals/s | errors |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in restart_rows(data):
        sent = f"{r['prompt_sent']:,.0f}" if r["prompt_sent"] is not None else str(r["prompt"])
        out.append(f"| {r['start']} | {r['profile']} | {r['ready_s']:.0f} s | {r['level']} | {r['workload']} | "
                   f"{sent}/{r['output']} | {r['runs']} | {r['mean']:,.0f} | {r['cv']:.2%} | {r['min']:,.0f}-{r['max']:,.0f} | "
                   f"{_pair((r['ttft_p50'], r['ttft_p99']))} | {_pair((r['tpot_p50'],), '.2f')} | {_pair((r['itl_p99'],), '.1f')} | "
                   f"{'-' if r['rate'] is None else format(r['rate'], '.2f')} | {r['errors']} |")
    return out


def restarts_markdown(folder: str) -> str:
    out = []
    for name in restart_files(folder):
        data = load(name, folder)
        s = data["settings"]
        cells = restart_cells(data)
        if any(cell_workload(k) for k, _c in cells):
            out += workload_restarts_markdown(name, data, cells)
            continue
        lengths = sorted({(p, o) for _k, (_c, p, o) in cells})
        head = (f"{s['prompt_tokens']}/{s['output_tokens']} tokens" if len(lengths) == 1 else
                "prompt/output tokens " + ", ".join(f"{p}/{o}" for p, o in lengths))
        out += [f"### {name}: server starts, {head}, {s['requests_per_slot']} requests per slot", ""]
        multi = len(lengths) > 1
        out += ["| start | profile | ready after | " + ("tokens | " if multi else "") +
                "c | requests/run | run length | runs | mean tok/s | CV | min-max | errors |",
                "|---|---|---|" + ("---|" if multi else "") + "---|---|---|---|---|---|---|---|"]
        for r in restart_rows(data):
            tok = f"{r['prompt']}/{r['output']} | " if multi else ""
            out.append(f"| {r['start']} | {r['profile']} | {r['ready_s']:.0f} s | {tok}{r['level']} | {r['requests']} | "
                       f"{r['run_s']:.1f} s | {r['runs']} | {r['mean']:,.0f} | {r['cv']:.2%} | {r['min']:,.0f}-{r['max']:,.0f} | "
                       f"{r['errors']} |")
        out += ["", "| " + ("profile | tokens | " if multi else "") + "c | starts (runs) | sd within a start | "
                "sd between starts | F test p (no between-start variance) | start means (spread) | smallest detectable drop, "
                "within-start noise only | the same with the between-start sd |",
                "|" + ("---|---|" if multi else "") + "---|---|---|---|---|---|---|---|"]
        profiles = list(dict.fromkeys(st["profile"] for st in data["starts"])) if multi else [data["starts"][0]["profile"]]
        for profile in profiles:
            for key, (level, prompt, output) in cells:
                n = restart_noise(data, key, profile)
                if not n:
                    continue
                lead = f"| {profile} | {prompt}/{output} " if multi else ""
                out.append(f"{lead}| {level} | {n['starts']} ({n['runs']}) | {n['sd_within']:.2%} | {n['sd_between']:.2%} | "
                           f"{n['p_between']:.2g} | {', '.join(format(m, ',.0f') for m in n['start_means'])} "
                           f"({n['spread_of_means']:.1%}) | {n['sdd_within_only']:.1%} | {n['sdd_across_restart']:.1%} |")
        out += ["", "| baseline start -> candidate start | verdict | decided_by | ratio | interval | p (drop) | p (pass) | "
                    "runs used (baseline + candidate) | baseline CV, smallest detectable drop |",
                "|---|---|---|---|---|---|---|---|---|"]
        for g in restart_gates(data):
            head = f"| {g['baseline_start']} ({g['baseline_profile']}) -> {g['candidate_start']} ({g['candidate_profile']}) |"
            bg = g.get("baseline_gate") or {}
            base = (f"{bg['cv']:.2%}, {bg['smallest_detectable_drop']:.1%}" if "cv" in bg else "-")
            if g.get("needs"):
                out.append(f"{head} not decided: {g['needs']['runs']} {g['needs']['side']} runs needed, fewer stored | - | - "
                           f"| - | - | - | - | {base} |")
                continue
            gg = g.get("gate") or {}
            if not gg:
                out.append(f"{head} {g['decision']} (stopped before the change) | {bg.get('decided_by')} | - | - | - | - | "
                           f"{g['baseline_runs_used']} + 0 | {base} |")
                continue
            iv = gg.get("interval")
            out.append(f"{head} **{g['decision']}** | {gg.get('decided_by')} | {gg['ratio']:.4f} | "
                       f"{'%.4f-%.4f' % tuple(iv) if iv else '-'} | {gg['p_value']:.2g} | {gg['p_value_pass']:.2g} | "
                       f"{g['baseline_runs_used']} + {g['candidate_runs_used']} | {base} |")
        out.append("")
        out += equivalence_markdown(folder, data)
    prow = pcie_rows(folder)
    if prow:
        out += ["### pcie_facts with the bandwidth probe, at rest and during two c=64 runs", "",
                "| when | GPU | link (NVML) | replays | H2D pinned | D2H pinned | H2D pageable | D2H pageable | tok/s beside |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in prow:
            out.append(f"| {r['when']} | {r['bdf']} | Gen{r['gen']} x{r['width']} (max Gen{r['gen_max']} x{r['width_max']}) | "
                       f"{r['replays']} | {r['h2d_pinned_gbps']} GB/s ({r['h2d_pinned_pct']}%) | {r['d2h_pinned_gbps']} GB/s "
                       f"({r['d2h_pinned_pct']}%) | {r['h2d_pageable_gbps']} GB/s | {r['d2h_pageable_gbps']} GB/s | "
                       f"{', '.join(format(v, ',.0f') for v in r['beside']) or '-'} |")
        out.append("")
    rows = all_starts_noise(folder)
    if rows:
        out += ["### Every start of the first profile, all machines (a start on another machine counted as a start)", "",
                "| c | starts (runs) | sd within a start | sd between starts | F test p | start means (spread) | "
                "smallest detectable drop, within only | with the between-start sd |", "|---|---|---|---|---|---|---|---|"]
        for level, n in rows:
            out.append(f"| {level} | {n['starts']} ({n['runs']}) | {n['sd_within']:.2%} | {n['sd_between']:.2%} | "
                       f"{n['p_between']:.2g} | {', '.join(format(m, ',.0f') for m in n['start_means'])} "
                       f"({n['spread_of_means']:.1%}) | {n['sdd_within_only']:.1%} | {n['sdd_across_restart']:.1%} |")
        out.append("")
    return "\n".join(out)


def workload_restarts_markdown(name: str, data: dict, cells: list) -> list[str]:
    """A restarts file whose cells have workload profiles: the starts, the noise between starts of each profile per
    cell, the stages (each --gates pair) and the client comparison of the starts that ran one."""
    s = data["settings"]
    out = [f"### {name}: server starts; gate level c={s['concurrency'][0]}, {s['prompt_tokens']}/{s['output_tokens']} "
           f"tokens, {s['requests_per_slot']} requests per slot", ""] + workload_markdown(data)
    out += ["", "| profile | c | workload | starts (runs) | sd within a start | sd between starts | F test p | start means "
            "(spread) | smallest detectable drop, within only | with the between-start sd |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for profile in dict.fromkeys(st["profile"] for st in data["starts"]):
        for key, (level, _p_, _o) in cells:
            n = restart_noise(data, key, profile)
            if n:
                out.append(f"| {profile} | {level} | {workload_label(key)} | {n['starts']} ({n['runs']}) | {n['sd_within']:.2%} | "
                           f"{n['sd_between']:.2%} | {n['p_between']:.2g} | "
                           f"{', '.join(format(m, ',.0f') for m in n['start_means'])} ({n['spread_of_means']:.1%}) | "
                           f"{n['sdd_within_only']:.1%} | {n['sdd_across_restart']:.1%} |")
    out += ["", "Stages: each candidate start against its baseline start, the kernel upgrade's gate loop at the role's "
            "defaults on every cell both measured (latency: baseline / candidate).", ""] + stage_markdown(data)
    for st in data["starts"]:
        if st.get("compare"):
            out += ["", f"Our client against `vllm bench serve` at start {st['index']} ({st['profile']}), "
                    f"{data['settings'].get('compare_lengths', '512/256')} tokens, paired rounds:", ""]
            out += compare_markdown(compare_rows(st["compare"]))
    return out + [""]


def equivalence_rows(folder: str, data: dict) -> list[dict]:
    """The output_equivalence module's answer at each start that ran it (equiv-start<i>.json), with the overall top-1
    agreement and mean absolute logprob difference recomputed from its per-prompt figures."""
    rows = []
    for st in data["starts"]:
        path = os.path.join(folder, f"equiv-start{st['index']}.json")
        if not os.path.exists(path):
            continue
        doc = load(os.path.basename(path), folder)
        per = doc["per_prompt"]
        tokens = sum(p["tokens"] for p in per)
        rows.append({"start": st["index"], "profile": st["profile"], "mode": doc["mode"], "verdict": doc.get("verdict"),
                     "reason": doc.get("reason"), "figures": doc["figures"], "band": doc.get("band"),
                     "tolerance": doc.get("tolerance"), "seconds": doc.get("seconds"),
                     "top1": sum(p["top1_agree"] for p in per) / tokens,
                     "mean_abs": sum(p["mean_abs_logprob_diff"] * p["tokens"] for p in per) / tokens,
                     "prompts": len(per), "tokens": tokens,
                     "swapped": next((e.split("swap=", 1)[1] for e in [data["settings"]["plan"][st["index"]]]
                                      if "swap=" in e), None)})
    return rows


def equivalence_markdown(folder: str, data: dict) -> list[str]:
    rows = equivalence_rows(folder, data)
    if not rows:
        return []
    out = ["| start | served | mode | verdict | top-1 agreement (95% CI) | mean abs logprob diff (95% CI) | p99 | max | "
           "prompts forked | seconds |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f = r["figures"]
        t1, mn = f["top1_agreement_ci95"], f["mean_abs_logprob_diff_ci95"]
        served = r["profile"] + (f" ({r['swapped']} at its path)" if r["swapped"] else "")
        out.append(f"| {r['start']} | {served} | {r['mode']} | {('**' + r['verdict'] + '**') if r['verdict'] else 'A/A (the band)'} | "
                   f"{r['top1']:.4f} ({t1[0]:.4f}-{t1[1]:.4f}) | {r['mean_abs']:.4f} ({mn[0]:.4f}-{mn[1]:.4f}) | "
                   f"{f['p99_abs_logprob_diff']:.4f} | {f['max_abs_logprob_diff']:.4f} | {f['prompts_forked']} of {r['prompts']} | "
                   f"{r['seconds']:.0f} |")
    band = next((r["band"] for r in rows if r["mode"] == "record"), None)
    tol = next((r["tolerance"] for r in rows if r["tolerance"]), None)
    if band:
        out += ["", f"The band stored with the reference (the A/A at start {rows[0]['start']}): top-1 agreement at least "
                f"{band['top1_agreement_min']:.4f}, mean abs logprob diff at most {band['mean_abs_logprob_diff_max']:.4f}, "
                f"p99 at most {band['p99_abs_logprob_diff_max']:.4f}" + (
                    f"; the tolerance (drifted, not diverged): top-1 at least {tol['top1_agreement_min']}, mean at most "
                    f"{tol['mean_abs_logprob_diff_max']}, p99 at most {tol['p99_abs_logprob_diff_max']}." if tol else ".")]
    return out + [""]


def pcie_rows(folder: str) -> list[dict]:
    """pcie_facts (bandwidth probe on) at rest and during two c=64 runs (pcie/ of a 7B folder): the link as NVML read it
    in each, the probe's copy rates, and the tok/s of the runs beside the second."""
    sub = os.path.join(folder, "pcie")
    if not os.path.isdir(sub):
        return []
    run = load("pcie_run.json", sub)["cells"][0]["runs"]
    rows = []
    for when in ("rest", "load"):
        facts = load(f"pcie_facts_{when}.json", sub)["pcie"]
        for bdf, g in facts["bandwidth"]["gpus"].items():
            link = facts["nvml"]["gpus"][bdf]
            rows.append({"when": when, "bdf": bdf, "gen": link["link_gen_current"], "gen_max": link["link_gen_max"],
                         "width": link["link_width_current"], "width_max": link["link_width_max"],
                         "replays": link["pcie_replay_counter"], **{k: g[k] for k in (
                             "h2d_pinned_gbps", "d2h_pinned_gbps", "h2d_pageable_gbps", "d2h_pageable_gbps", "theoretical_gbps",
                             "h2d_pinned_pct", "d2h_pinned_pct")},
                         "beside": [r["output_throughput"] for r in run] if when == "load" else [],
                         "findings": facts["findings_summary"]})
    return rows


def all_starts_noise(folder: str) -> list[tuple[int, dict]]:
    """between_starts over the starts of every restarts*.json of a folder that ran the first file's first profile,
    per level with two or more such starts."""
    import h200_restarts as hr
    files = [load(name, folder) for name in restart_files(folder)]
    if len(files) < 2:
        return []
    profile = files[0]["starts"][0]["profile"]
    levels = sorted({int(k) for d in files for st in d["starts"] for k in st["levels"]}, reverse=True)
    out = []
    for level in levels:
        starts = [[r["output_throughput"] for r in st["levels"].get(str(level), [])] for d in files for st in d["starts"]
                  if st["profile"] == profile]
        starts = [s for s in starts if len(s) >= 2]
        if len(starts) >= 2:
            out.append((level, hr.between_starts(starts)))
    return out


# The comparisons at c=256 where our client asked for per-chunk usage beside vllm bench serve (and, in the fourth
# session, also without it), each against one server: (label, file under docs/examples, the compare record's path).
REQUEST_SHAPE_FILES = (
    ("fourth session, 254M model", "h200-vllm/run4/compare-usage.json", ()),
    ("ninth session, 7B architecture", "h200-7b-stages/restarts.json", ("starts", 0, "compare")),
    ("tenth session, 7B architecture", "h200-dsv2-starts/restarts.json", ("starts", 0, "compare")),
)


def server_split(runs: list[dict], requests: int) -> dict:
    """What the server did for one client's runs, medians over the runs: its API server's and engine core's CPU per
    request and in cores over each call (``call_load.server_cpu_by_process``: the engine core is the process named
    VLLM::EngineCore, the API server the rest), TPOT p50 and tok/s."""
    def one(run: dict) -> tuple[float, float, float, float]:
        load_ = run["call_load"]
        engine = sum(v for k, v in load_["server_cpu_by_process"].items() if "EngineCor" in k)
        api = sum(load_["server_cpu_by_process"].values()) - engine
        return api, engine, load_["wall_s"], run["tpot_ms"]["p50"] if "tpot_ms" in run else run["tpot_p50_ms"]
    split = [one(r) for r in runs]
    return {"runs": len(runs), "tok_s": _med([r["output_throughput"] for r in runs]),
            "tpot_p50_ms": _med([x[3] for x in split]),
            "api_ms_per_request": 1000 * _med([x[0] for x in split]) / requests,
            "engine_ms_per_request": 1000 * _med([x[1] for x in split]) / requests,
            "api_cores": _med([x[0] / x[2] for x in split]), "engine_cores": _med([x[1] / x[2] for x in split])}


def request_shape_rows(root: str = os.path.dirname(DIR), level: str = "256") -> list[dict]:
    """Per stored comparison of REQUEST_SHAPE_FILES at ``level``: each client's server_split(), named by its request."""
    rows = []
    for label, name, path in REQUEST_SHAPE_FILES:
        with open(os.path.join(root, name), encoding="utf-8") as fh:
            rec = json.load(fh)
        for key in path:
            rec = rec[key]
        rec = rec["levels"][level]
        for who in ("ours", *OTHER_OURS, "vllm"):
            if rec.get(who):
                client = "vllm bench serve" if who == "vllm" else _client_name(request_label(rec[who]))
                rows.append({"session": label, "client": client, **server_split(rec[who], rec["requests"])})
    return rows


def request_shape_markdown(rows: list[dict]) -> list[str]:
    out = ["| comparison at c=256 | client | runs | tok/s (median) | TPOT p50 ms | API server ms/request | "
           "engine core ms/request | API server cores | engine core cores |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['session']} | {r['client']} | {r['runs']} | {r['tok_s']:,.0f} | {r['tpot_p50_ms']:.1f} | "
                   f"{r['api_ms_per_request']:.1f} | {r['engine_ms_per_request']:.1f} | {r['api_cores']:.2f} | "
                   f"{r['engine_cores']:.2f} |")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument("folder", nargs="?", default=DIR)
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--request-shapes", action="store_true",
                   help="the server's work per request at c=256 for each request shape of the stored comparisons")
    args = p.parse_args()
    if args.request_shapes:
        sys.stdout.write("\n".join(request_shape_markdown(request_shape_rows())) + "\n")
    elif restart_files(args.folder):
        sys.stdout.write(restarts_markdown(args.folder))
    else:
        sys.stdout.write(markdown(args.folder, args.trials))
    return 0


if __name__ == "__main__":
    sys.exit(main())

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The measured-tuning stage table: per host and for the fleet, Markdown and a self-contained HTML page.

From tune_measured state documents: per stage what changed, output tok/s per concurrency level,
TTFT and TPOT p50/p99, the ratio to the baseline and to the previous measured stage, the gate's
verdict and p-value, its latency part (each TTFT/TPOT metric's answer and ratio, or not measured),
and whether it was kept or reverted; per stage the serving verdict with each of its four parts (throughput, latency,
outputs, stability: what it said and its figure) and, under Why, the reason of each part that did not say yes. The HTML page has one inline SVG chart
per host and profile (tok/s per stage, one line per concurrency level). Pure functions.
"""

from __future__ import annotations

import html
from typing import Any, Sequence

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.svg_chart import line_chart
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.gate_settings import LATENCY_LABELS
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.verdict import PARTS, part_cell, part_summary
from ansible_collections.gpufleet.inference.plugins.module_utils.tuning.tune_measured import changed_text

CSS = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#1b1f24;background:#fafbfc}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0 1rem;background:#fff;box-shadow:0 1px 2px #0001}
th,td{border:1px solid #d0d7de;padding:.35rem .6rem;text-align:left;vertical-align:top;font-size:.9rem}
th{background:#f3f5f7}.kept{color:#1a7f37;font-weight:600}.reverted{color:#a40e26;font-weight:600}
.note{color:#57606a}
"""


def rows(state: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measured stage, profile and level."""
    out = []
    stages = [e for e in state["stages"] if e.get("measurements")]
    base = stages[0] if stages else None
    for prof in state["profiles"]:
        name = prof["name"]
        prev = None
        for e in stages:
            m = e["measurements"].get(name)
            if not m:
                continue
            for key in sorted(m["levels"], key=int):
                lv = m["levels"][key]
                b = ((base or {}).get("measurements", {}).get(name) or {}).get("levels", {}).get(key) or {}
                pv = ((prev or {}).get("measurements", {}).get(name) or {}).get("levels", {}).get(key) or {}
                verdict = (e.get("verdicts") or {}).get(name, {}).get(key) or {}
                out.append({
                    "host": state.get("host", ""), "stage": e["name"], "profile": name, "concurrency": int(key),
                    "changed": "as found" if e["kind"] == "baseline" else changed_text(e),
                    "tok_s": lv["median"], "cv": lv.get("cv"), "runs": len(lv.get("samples") or []),
                    "ttft_p50_ms": lv.get("ttft_p50_ms"), "ttft_p99_ms": lv.get("ttft_p99_ms"),
                    "tpot_p50_ms": lv.get("tpot_p50_ms"), "tpot_p99_ms": lv.get("tpot_p99_ms"),
                    "vs_baseline": (lv["median"] / b["median"]) if b.get("median") else None,
                    "vs_previous": (lv["median"] / pv["median"]) if pv.get("median") and prev is not None else None,
                    "reference": e.get("reference"), "verdict": verdict.get("decision"),
                    "gate_ratio": verdict.get("ratio"), "p_value": verdict.get("p_value"),
                    "p_value_pass": verdict.get("p_value_pass"), "latency": verdict.get("latency"),
                    "outcome": {"baseline": "baseline", "kept": "kept", "reverted": "reverted"}.get(
                        e["status"], e["status"]), "judged_by": judged_by(state, e),
                    "reason": e.get("reason", "")})
            prev = e
    return out


def verdict_rows(state: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per judged stage: its serving verdict, each part's summary (bench/verdict.py part_summary()) and its
    outcome; a stage judged before the serving verdict (no ``serving``) has its gate verdict and no parts."""
    out = []
    for e in state["stages"]:
        if e["kind"] == "baseline" or not e.get("verdict"):
            continue
        parts = (e.get("serving") or {}).get("parts") or {}
        out.append({"stage": e["name"], "verdict": e["verdict"], "status": e["status"],
                    "parts": {name: part_summary(name, parts.get(name)) for name in PARTS}})
    return out


def _verdict_table(state: dict[str, Any]) -> list[str]:
    table = verdict_rows(state)
    if not table:
        return []
    out = ["### Serving verdict", "", "| stage | verdict | " + " | ".join(PARTS) + " | outcome |",
           "|---|---|" + "---|" * len(PARTS) + "---|"]
    for r in table:
        cells = (r["stage"], r["verdict"], *[part_cell(n, r["parts"][n]) for n in PARTS], r["status"])
        out.append("| " + " | ".join(_md(c) for c in cells) + " |")
    out.append("")
    for r in table:  # each part that did not say yes, and why
        out += [f"- **{r['stage']}** {name}: {_md(part_cell(name, {**p, 'figures': {}}))}: {_md(p.get('reason') or '-')}"
                for name, p in r["parts"].items() if p and p.get("says") != "yes"]
    return out + [""]


def _n(v: Any, fmt: str = "{:.1f}") -> str:
    return fmt.format(v) if isinstance(v, (int, float)) else "-"


def _x(v: Any) -> str:
    return f"{v:.3f}x" if isinstance(v, (int, float)) else "-"


def _gate(r: dict[str, Any]) -> str:
    if not r["verdict"]:
        return "-"
    p = r["p_value"] if r["verdict"] == "regression" else r["p_value_pass"]
    return f"{r['verdict']} (p={p:.4f})" if isinstance(p, (int, float)) else r["verdict"]


def latency_cell(part: Any) -> str:
    """The gate's latency part in a few words: each metric that did not pass with its answer and ratio (a regression
    first), "pass (4 metrics)" when all passed, "not measured" when no per-run latency was judged, "-" for no verdict."""
    if not isinstance(part, dict):
        return "-"
    metrics = part.get("metrics") or {}
    if part.get("status") != "judged" or not metrics:
        return "not measured"
    order = {"regression": 0, "inconclusive": 1, "pass": 2}
    bad = sorted(((k, m) for k, m in metrics.items() if m.get("decision") != "pass"),
                 key=lambda km: order.get(km[1].get("decision"), 1))
    if not bad:
        return f"pass ({len(metrics)} metrics)"
    return "; ".join(f"{LATENCY_LABELS.get(k, k)} {m.get('decision')} {_x(m.get('ratio'))}" for k, m in bad)


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def gate_line(state: dict[str, Any]) -> str:
    g = state["gate"]
    basis = g.get("threshold_basis") or ""
    return (f"Gate: threshold {g['threshold']}, alpha {g['alpha']} (drop), pass_alpha {g['pass_alpha']}, "
            f"{g['min_runs']}-{g['max_runs']} runs; inconclusive -> {state['inconclusive']}."
            + (f" Threshold {basis}." if basis and basis not in ("given", "auto") else ""))


def render_markdown(states: Sequence[dict[str, Any]], title: str = "Measured tuning", note: str = "") -> str:
    out = [f"# {title}", ""]
    if note:
        out += [note, ""]
    for state in states:
        out += [f"## {state.get('host') or 'host'}", "", gate_line(state), ""]
        table = rows(state)
        for prof in state["profiles"]:
            mine = [r for r in table if r["profile"] == prof["name"]]
            levels = sorted({r["concurrency"] for r in mine})
            out += [f"### {prof['name']} ({profile_text(prof)})", "",
                    "| stage | what changed | " + " | ".join(f"tok/s c={c}" for c in levels)
                    + " | x baseline | outcome |", "|---|---|" + "---|" * len(levels) + "---|---|"]
            for stage in dict.fromkeys(r["stage"] for r in mine):
                rs = {r["concurrency"]: r for r in mine if r["stage"] == stage}
                first = next(iter(rs.values()))
                worst = min((r["vs_baseline"] for r in rs.values() if r["vs_baseline"] is not None), default=None)
                out.append("| " + " | ".join(_md(c) for c in (
                    stage, first["changed"], *[_n(rs[c]["tok_s"]) if c in rs else "-" for c in levels],
                    _x(worst), outcome_text(first))) + " |")
            out += ["", "| stage | c | tok/s | CV | runs | TTFT p50/p99 ms | TPOT p50/p99 ms | x baseline | x previous | "
                    "gate vs state before | latency (gate) | outcome |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for r in mine:
                out.append("| " + " | ".join(_md(c) for c in (
                    r["stage"], r["concurrency"], _n(r["tok_s"]), _n(r["cv"], "{:.3f}"), r["runs"],
                    f"{_n(r['ttft_p50_ms'])}/{_n(r['ttft_p99_ms'])}", f"{_n(r['tpot_p50_ms'], '{:.2f}')}/"
                    f"{_n(r['tpot_p99_ms'], '{:.2f}')}", _x(r["vs_baseline"]), _x(r["vs_previous"]),
                    _gate(r) + (f" vs {r['reference']}" if r["reference"] else ""),
                    latency_cell(r["latency"]) if r["verdict"] else "-", outcome_text(r))) + " |")
            out.append("")
        out += _verdict_table(state)
        reasons = [(e["name"], e["reason"]) for e in state["stages"] if e.get("reason")]
        if reasons:
            out += ["Why:", ""] + [f"- **{n}**: {_md(why)}" for n, why in reasons] + [""]
    return "\n".join(out)


def _chart(state: dict[str, Any], prof: dict[str, Any], table: list[dict[str, Any]]) -> str:
    mine = [r for r in table if r["profile"] == prof["name"]]
    stages = list(dict.fromkeys(r["stage"] for r in mine))
    idx = {s: i for i, s in enumerate(stages)}
    series = []
    for c in sorted({r["concurrency"] for r in mine}):
        series.append({"name": f"c={c}", "points": [(idx[r["stage"]], r["tok_s"]) for r in mine if r["concurrency"] == c]})
    annotations = [{"x": idx[r["stage"]], "text": f"{r['stage']}: reverted"} for r in mine
                   if r["outcome"] == "reverted" and r["concurrency"] == min(x["concurrency"] for x in mine)]
    host = state.get("host") or "host"
    return line_chart(series, title=f"{host} {prof['name']}: output tok/s per stage",
                      x_ticks=[(i, s) for s, i in idx.items()], annotations=annotations,
                      chart_id=f"stages-{host}-{prof['name']}")


def render_html(states: Sequence[dict[str, Any]], title: str = "Measured tuning", note: str = "") -> str:
    e_ = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{e_(title)}</title>",
             f"<style>{CSS}</style></head><body>", f"<h1>{e_(title)}</h1>"]
    if note:
        parts.append(f'<p class="note">{e_(note)}</p>')
    for state in states:
        host = state.get("host") or "host"
        parts += [f'<h2 id="{e_(host)}">{e_(host)}</h2>', f'<p class="note">{e_(gate_line(state))}</p>']
        table = rows(state)
        for prof in state["profiles"]:
            parts.append(f"<h3>{e_(prof['name'])} ({e_(profile_text(prof))})</h3>")
            parts.append(_chart(state, prof, table))
            parts.append("<table><tr><th>stage</th><th>what changed</th><th>c</th><th>tok/s</th><th>TTFT p50/p99 ms</th>"
                         "<th>TPOT p50/p99 ms</th><th>x baseline</th><th>x previous</th><th>gate</th>"
                         "<th>latency (gate)</th><th>outcome</th></tr>")
            for r in (x for x in table if x["profile"] == prof["name"]):
                cls = {"kept": "kept", "reverted": "reverted"}.get(r["outcome"], "")
                cells = (r["stage"], r["changed"], r["concurrency"], _n(r["tok_s"]),
                         f"{_n(r['ttft_p50_ms'])}/{_n(r['ttft_p99_ms'])}",
                         f"{_n(r['tpot_p50_ms'], '{:.2f}')}/{_n(r['tpot_p99_ms'], '{:.2f}')}",
                         _x(r["vs_baseline"]), _x(r["vs_previous"]), _gate(r),
                         latency_cell(r["latency"]) if r["verdict"] else "-")
                parts.append("<tr>" + "".join(f"<td>{e_(str(c))}</td>" for c in cells)
                             + f'<td class="{cls}">{e_(outcome_text(r))}</td></tr>')
            parts.append("</table>")
        verdicts = verdict_rows(state)
        if verdicts:
            parts.append("<h3>Serving verdict</h3><table><tr><th>stage</th><th>verdict</th>"
                         + "".join(f"<th>{e_(n)}</th>" for n in PARTS) + "<th>outcome</th></tr>")
            for r in verdicts:
                cells = [r["stage"], r["verdict"]] + [part_cell(n, r["parts"][n]) for n in PARTS]
                titles = [""] * 2 + [(r["parts"][n] or {}).get("reason") or "" for n in PARTS]
                parts.append("<tr>" + "".join(f'<td title="{e_(t)}">{e_(str(c))}</td>' for c, t in zip(cells, titles))
                             + f"<td>{e_(r['status'])}</td></tr>")
            parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ---- the profile that judged a stage (issue 35) ----------------------------------------------------------------
def judged_by(state: dict[str, Any], e: dict[str, Any]) -> list[str]:
    """The profiles whose verdict decided a stage, when not every profile measured (tune_measured ``judged_on``):
    prefix caching on shared_prefix, say; [] when all of them did (or for the baseline)."""
    judged = e.get("judged_by") or []
    return [] if set(judged) >= {p["name"] for p in state["profiles"]} else list(judged)


def outcome_text(r: dict[str, Any]) -> str:
    """The outcome, and the profiles that judged the stage when not all of them did."""
    return r["outcome"] + (f" (judged on {', '.join(r['judged_by'])})" if r.get("judged_by") else "")


def profile_text(prof: dict[str, Any]) -> str:
    """A benchmark profile's shape in a few words: lengths, the request profile and its parameters, the arrivals."""
    out = f"{prof.get('prompt_tokens')} prompt / {prof.get('output_tokens')} output tokens"
    if prof.get("profile") and prof["profile"] != "random":
        options = ", ".join(f"{k} {v}" for k, v in sorted((prof.get("profile_options") or {}).items())
                            if not isinstance(v, dict))
        out += f"; {prof['profile']}" + (f" ({options})" if options else "")
    arrivals = prof.get("arrivals") or {}
    if arrivals.get("rate"):
        out += f"; {arrivals.get('mode', 'poisson')} arrivals at {arrivals['rate']:g}/s"
    return out

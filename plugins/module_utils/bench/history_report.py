# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The throughput history report: per host, the curves over time, what changed, the flagged drops, and the PCIe
link findings of each run (a link that flapped or stayed down during a measured run) next to that run's tok/s.

Pure functions from bench/history.py series() entries (analysed by bench/changepoint.py analyse()) to a
report model, Markdown and a self-contained HTML page with one inline SVG chart per host.
"""

from __future__ import annotations

import calendar
import html
import time
from typing import Any, Sequence

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.changepoint import analyse
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.start_history import estimate, summary
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.svg_chart import line_chart

CSS = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#1b1f24;background:#fafbfc}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0 1rem;background:#fff;box-shadow:0 1px 2px #0001}
th,td{border:1px solid #d0d7de;padding:.35rem .6rem;text-align:left;vertical-align:top;font-size:.9rem}
th{background:#f3f5f7}.bad{color:#a40e26;font-weight:600}.ok{color:#1a7f37}.note{color:#57606a}
"""


def epoch(iso: str | None) -> float:
    """Seconds since the epoch of a ``YYYY-MM-DDTHH:MM:SSZ`` time (0 when missing or malformed)."""
    try:
        return float(calendar.timegm(time.strptime(str(iso), "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return 0.0


def series_name(s: dict[str, Any]) -> str:
    cfg = s.get("config") or {}
    profile = cfg.get("profile") or (cfg.get("workload_profile") or {}).get("name") or "benchmark"
    arrivals = cfg.get("arrivals") or {}
    if arrivals.get("rate"):
        profile += f" {arrivals['mode']} {arrivals['rate']:g}/s"
    return f"{profile} c={s['concurrency']} ({cfg.get('prompt_tokens')}/{cfg.get('output_tokens')} tok)"


def build(series_list: Sequence[dict[str, Any]], **rule: Any) -> dict[str, Any]:
    """The report model: per host its series, each analysed, and the fleet's flagged drops."""
    hosts: dict[str, list[dict[str, Any]]] = {}
    for s in series_list:
        entry = dict(s)
        entry["name"] = series_name(s)
        entry["analysis"] = analyse(s, **rule)
        entry["start_noise"] = estimate(s["runs"])
        hosts.setdefault(s["host"], []).append(entry)
    drops = []
    for host, entries in hosts.items():
        for e in entries:
            for d in e["analysis"]["drops"]:
                drops.append({"host": host, "series": e["name"], **d})
            for p in e["analysis"]["change_points"]:
                if (p.get("change") or 0) < 0:
                    drops.append({"host": host, "series": e["name"], "index": p["index"], "run_id": p["run_id"],
                                  "finished_at": p["finished_at"], "changes": p["changes"], "drop": True,
                                  "decision": "change point (E-divisive)", "ratio": 1 + p["change"],
                                  "p_value": p["p_value"], "ci": None,
                                  "reason": f"level shift of {p['change']:+.1%} (mean {p['mean_before']:.1f} -> "
                                            f"{p['mean_after']:.1f} tok/s), permutation p={p['p_value']}"})
    links = [{"host": host, "series": e["name"], "finished_at": r["finished_at"], "median": r["median"], **f}
             for host, entries in hosts.items() for e in entries for r in e["runs"] for f in r.get("link_findings") or []]
    for d in drops:  # a drop in a run whose link flapped: the link, not the change, may be what dropped
        d["links"] = [f for f in links if f["host"] == d["host"] and f["series"] == d["series"]
                      and f["finished_at"] == d["finished_at"]]
    return {"hosts": hosts, "drops": drops, "links": links,
            "runs": sum(len(e["runs"]) for v in hosts.values() for e in v)}


def link_text(f: dict[str, Any]) -> str:
    """One link finding: what, where, and the run's tok/s (``link_flapping 0000:01:00.0 in run 2: 812.3 tok/s``)."""
    tps = f"{f['output_tps']:.1f} tok/s" if isinstance(f.get("output_tps"), (int, float)) else "tok/s unknown"
    top = (f" (top {f['top_speed_gts']:g} GT/s x{f['top_width']})"
           if isinstance(f.get("top_speed_gts"), (int, float)) and f.get("top_width") else "")
    return f"{f['severity']}: {f['code']} {f['device']}{top} in run {f['repetition']}: {tps}"


def links_cell(r: dict[str, Any]) -> str:
    """The PCIe links column of one run at one level: its findings, ``stable``, or ``not sampled``."""
    if r.get("link_findings"):
        return "; ".join(link_text(f) for f in r["link_findings"])
    return "stable" if r.get("links_sampled") else "not sampled"


def _host_chart(host: str, entries: Sequence[dict[str, Any]]) -> str:
    chart_series, annotations, markers, seen = [], [], [], set()
    for e in entries:
        pts = [(epoch(r["finished_at"]), r["median"]) for r in e["runs"]]
        chart_series.append({"name": e["name"], "points": pts})
        for step in e["analysis"]["steps"]:
            x = epoch(step["finished_at"])
            if step["changes"] and (x, tuple(step["changes"])) not in seen:
                seen.add((x, tuple(step["changes"])))
                annotations.append({"x": x, "text": "; ".join(step["changes"])})
            if step["drop"]:
                markers.append({"x": x, "y": e["runs"][step["index"]]["median"],
                                "text": f"drop: {step['reason']}"})
    xs = sorted({p[0] for s in chart_series for p in s["points"]})
    ticks = [(x, time.strftime("%m-%d %H:%M", time.gmtime(x))) for x in xs]
    return line_chart(chart_series, title=f"{host}: median output tok/s per run", x_ticks=ticks,
                      annotations=annotations, markers=markers, chart_id=f"history-{host}")


def _ratio(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else "-"


def _p(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, (int, float)) else "-"


def _tps(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, (int, float)) else "-"


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(model: dict[str, Any], title: str = "GPU fleet throughput history") -> str:
    out = [f"# {title}", "", f"{len(model['hosts'])} host(s), {model['runs']} stored run-levels; "
           f"{len(model['drops'])} flagged drop(s); {len(model['links'])} PCIe link finding(s).", ""]
    if model["drops"]:
        out += ["| host | series | at | ratio | p | rule | changed with it | PCIe links in that run |",
                "|---|---|---|---|---|---|---|---|"]
        for d in model["drops"]:
            out.append("| " + " | ".join(_md(c) for c in (
                d["host"], d["series"], d["finished_at"], _ratio(d["ratio"]), _p(d["p_value"]), d["decision"],
                "; ".join(d["changes"]) or "nothing recorded", "; ".join(link_text(f) for f in d["links"]) or "-")) + " |")
        out.append("")
    if model["links"]:
        out += ["PCIe link findings during measured runs: the run's tok/s is not the host's while its link retrains.", "",
                "| host | series | at | run | device | finding | run tok/s | level median |", "|---|---|---|---|---|---|---|---|"]
        for f in model["links"]:
            out.append("| " + " | ".join(_md(c) for c in (
                f["host"], f["series"], f["finished_at"], f["repetition"], f["device"],
                f"**{f['severity']}** {f['code']}" if f["severity"] == "critical" else f"{f['severity']} {f['code']}",
                _tps(f["output_tps"]), _tps(f["median"]))) + " |")
        out.append("")
    for host, entries in model["hosts"].items():
        out += [f"## {host}", ""]
        for e in entries:
            out += [f"### {e['name']}", "", "| time | source | stage | kernel | driver | vLLM | median tok/s | CV | "
                    "TTFT p50/p99 ms | TPOT p50/p99 ms | vs previous | changed | PCIe links |",
                    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            steps = {s["index"]: s for s in e["analysis"]["steps"]}
            for i, r in enumerate(e["runs"]):
                st = steps.get(i)
                vs = "-" if st is None else (f"{_ratio(st['ratio'])} ({st['decision'] or 'not judged'}"
                                             + (f", p={_p(st['p_value'])}" if st["p_value"] is not None else "") + ")")
                if st and st["drop"]:
                    vs = "**DROP** " + vs
                out.append("| " + " | ".join(_md(c) for c in (
                    r["finished_at"], r["source"], r["stage"] or "-", r["kernel"] or "?", r["gpu_driver"] or "-",
                    r["vllm_version"] or "-", f"{r['median']:.1f}" if r["median"] is not None else "-",
                    f"{r['cv']:.3f}" if r["cv"] is not None else "-",
                    f"{r['ttft_p50_ms']}/{r['ttft_p99_ms']}", f"{r['tpot_p50_ms']}/{r['tpot_p99_ms']}", vs,
                    "; ".join(st["changes"]) if st else "", links_cell(r))) + " |")
            if e["analysis"]["note"]:
                out += ["", e["analysis"]["note"] + "."]
            if summary(e["start_noise"]):
                out += ["", summary(e["start_noise"]) + "."]
            out.append("")
    out += ["Rule: a run is flagged when the throughput gate finds it a regression against the previous run of the "
            "same configuration (median ratio below the threshold and one-sided Mann-Whitney U p <= alpha over the "
            "per-run samples), or when E-divisive means finds a downward level shift in the series of run medians "
            "(permutation p <= cp_alpha). See docs/measured_tuning.md. Between server starts: the runs grouped by the "
            "server start they measured (one-way random effects; bench_history state=start_noise gives every figure). "
            "PCIe links: the GPUs' and their bridges' links sampled during each measured run (inference_benchmark "
            "monitor_links); docs/audit.md has the link findings.", ""]
    return "\n".join(out)


def render_html(model: dict[str, Any], title: str = "GPU fleet throughput history") -> str:
    e_ = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{e_(title)}</title>",
             f"<style>{CSS}</style></head><body>", f"<h1>{e_(title)}</h1>",
             f"<p>{len(model['hosts'])} host(s), {model['runs']} stored run-levels, "
             f'<span class="{"bad" if model["drops"] else "ok"}">{len(model["drops"])} flagged drop(s)</span>, '
             f'<span class="{"bad" if model["links"] else "ok"}">{len(model["links"])} PCIe link finding(s)</span>.</p>']
    if model["drops"]:
        parts.append('<table id="drops"><tr><th>host</th><th>series</th><th>at</th><th>ratio</th><th>p</th>'
                     "<th>rule</th><th>changed with it</th><th>PCIe links in that run</th></tr>")
        for d in model["drops"]:
            parts.append("<tr>" + "".join(f"<td>{e_(str(c))}</td>" for c in (
                d["host"], d["series"], d["finished_at"], _ratio(d["ratio"]), _p(d["p_value"]), d["decision"],
                "; ".join(d["changes"]) or "nothing recorded", "; ".join(link_text(f) for f in d["links"]) or "-")) + "</tr>")
        parts.append("</table>")
    if model["links"]:
        parts.append('<table id="link-findings"><tr><th>host</th><th>series</th><th>at</th><th>run</th><th>device</th>'
                     "<th>finding</th><th>run tok/s</th><th>level median</th></tr>")
        for f in model["links"]:
            cls = ' class="bad"' if f["severity"] == "critical" else ""
            parts.append(f"<tr{cls}>" + "".join(f"<td>{e_(str(c))}</td>" for c in (
                f["host"], f["series"], f["finished_at"], f["repetition"], f["device"], f"{f['severity']} {f['code']}",
                _tps(f["output_tps"]), _tps(f["median"]))) + "</tr>")
        parts.append("</table>")
    for host, entries in model["hosts"].items():
        parts.append(f'<h2 id="{e_(host)}">{e_(host)}</h2>')
        parts.append(_host_chart(host, entries))
        for e in entries:
            parts.append(f"<h3>{e_(e['name'])}</h3><table><tr><th>time</th><th>source</th><th>stage</th>"
                         "<th>kernel</th><th>median tok/s</th><th>vs previous</th><th>changed</th><th>PCIe links</th></tr>")
            steps = {s["index"]: s for s in e["analysis"]["steps"]}
            for i, r in enumerate(e["runs"]):
                st = steps.get(i)
                vs = "-" if st is None else f"{_ratio(st['ratio'])} {st['decision'] or 'not judged'}"
                critical = any(f["severity"] == "critical" for f in r.get("link_findings") or [])
                cls = ' class="bad"' if (st and st["drop"]) or critical else ""
                parts.append(f"<tr{cls}>" + "".join(f"<td>{e_(str(c))}</td>" for c in (
                    r["finished_at"], r["source"], r["stage"] or "-", r["kernel"] or "?",
                    f"{r['median']:.1f}" if r["median"] is not None else "-", vs,
                    "; ".join(st["changes"]) if st else "", links_cell(r))) + "</tr>")
            parts.append("</table>")
            if e["analysis"]["note"]:
                parts.append(f'<p class="note">{e_(e["analysis"]["note"])}.</p>')
            if summary(e["start_noise"]):
                parts.append(f'<p class="note">{e_(summary(e["start_noise"]))}.</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"

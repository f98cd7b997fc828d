# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fleet audit report: pure functions from per-host pcie_facts results to Markdown and HTML.

Beside each host's audit the report shows the latest benchmark the controller holds for it and the
tuning changes the roles last made (both read by `controller_extras` from the controller's report
directories). Each report carries a digest of its content and the time it was generated; rendering
the same content again keeps the earlier time, so a run that changes nothing rewrites nothing."""

from __future__ import annotations

import datetime
import glob
import hashlib
import html
import json
import os
import re
from typing import Any

SEVERITIES = ("critical", "warning", "info")


def _link(dev: dict[str, Any]) -> dict[str, Any] | None:
    """Current and capable link of one device, from config space (sysfs attributes as fallback)."""
    pcie = ((dev.get("config") or {}).get("pcie")) or {}
    cap, sta = pcie.get("link_cap") or {}, pcie.get("link_sta") or {}
    if cap.get("speed_gts") or sta.get("speed_gts"):
        return {"cur_gts": sta.get("speed_gts"), "cur_width": sta.get("width"),
                "max_gts": cap.get("speed_gts"), "max_width": cap.get("width")}

    sysfs = dev.get("link_sysfs") or {}
    if sysfs:
        return {"cur_gts": sysfs.get("current_speed_gts"), "cur_width": sysfs.get("current_width"),
                "max_gts": sysfs.get("max_speed_gts"), "max_width": sysfs.get("max_width")}
    return None


GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def _fmt_gts(gts: float | None) -> str:
    """'Gen5 (32GT/s)', the way GPU tools (nvidia-smi) and the guides speak of links."""
    if not gts:
        return "?"
    gen = GEN_BY_GTS.get(float(gts))
    return f"Gen{gen} ({gts:g}GT/s)" if gen else f"{gts:g}GT/s"


def link_text(link: dict[str, Any] | None) -> str:
    """'Gen3 (8GT/s) x8 of Gen4 (16GT/s) x16', or one reading when the link runs at capability."""
    if not link:
        return "n/a"
    cur = f"{_fmt_gts(link['cur_gts'])} x{link['cur_width'] or '?'}"
    cap = f"{_fmt_gts(link['max_gts'])} x{link['max_width'] or '?'}"
    return cur if cur == cap else f"{cur} of {cap}"


def link_degraded(link: dict[str, Any] | None) -> bool:
    if not link:
        return False
    slow = (link["cur_gts"] or 0) < (link["max_gts"] or 0)
    narrow = (link["cur_width"] or 0) < (link["max_width"] or 0)
    return bool(slow or narrow)


def read_json_dict(path: str) -> dict[str, Any] | None:
    """A controller file of the reports (stored audit, benchmark result, tuning changes) as a dict, or None when
    it is missing, unreadable or not a JSON object (a report is no place to fail on an old file)."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def stored_audit(audit_dir: str, host: str) -> dict[str, Any] | None:
    """The audit the audit role last copied to the controller (<audit_dir>/<host>.json), or None when there is
    none or it does not parse as one."""
    path = os.path.join(audit_dir, f"{host}.json")
    doc = read_json_dict(path)
    if doc is None or not isinstance(doc.get("pcie"), dict):
        return None
    return {"host": host, "kernel": str(doc.get("kernel") or ""), "pcie": doc["pcie"], "stored": os.path.basename(path)}


def fleet_audits(hostvars: Any, hosts: list[str], key: str = "__audit_result", benchmark_dir: str | None = None,
                 tuning_dir: str | None = None, audit_dir: str | None = None) -> list[dict[str, Any]]:
    """One entry per host that holds an audit result, in inventory order, with the controller's
    latest benchmark and tuning changes for it where those directories are given.

    With ``audit_dir`` (the audit role's controller directory), a host this run did not audit (left out by
    ``--limit``, unreachable, failed before its audit) is shown with the audit last stored there, marked
    ``stored`` (the file's name), so that a run over part of the fleet does not drop the rest from its report."""
    fleet = []
    for host in hosts:
        hv = hostvars[host]  # a name outside the inventory is bad input: KeyError, made clear by the filter
        result = hv.get(key) if hasattr(hv, "get") else None
        if not result or "pcie" not in result:
            entry = stored_audit(audit_dir, host) if audit_dir else None
            if entry is None:
                continue
        else:
            facts = hv.get("ansible_facts") or {}
            entry = {"host": host, "kernel": facts.get("kernel", ""), "pcie": result["pcie"]}
        if benchmark_dir or tuning_dir:
            entry.update(controller_extras(host, benchmark_dir, tuning_dir))
        fleet.append(entry)
    return fleet


def benchmark_summary(doc: dict[str, Any], path: str = "") -> dict[str, Any]:
    """The report's view of one stored benchmark document (inference_benchmark's results JSON)."""
    levels = []
    for lv in doc.get("levels") or []:
        thr = lv.get("output_throughput") or {}
        levels.append({"concurrency": lv.get("concurrency"), "output_throughput": thr.get("median"),
                       "cv": thr.get("cv"), "runs": len(thr.get("values") or []),
                       "ttft_p50_ms": (lv.get("ttft_ms") or {}).get("p50"),
                       "tpot_p50_ms": (lv.get("tpot_ms") or {}).get("p50"), "errors": lv.get("errors", 0)})
    return {"label": doc.get("label", ""), "kernel": doc.get("kernel", ""), "finished_at": doc.get("finished_at", ""),
            "file": os.path.basename(path), "levels": levels}


def controller_extras(host: str, benchmark_dir: str | None, tuning_dir: str | None) -> dict[str, Any]:
    """{'benchmark': latest stored benchmark of the host or None, 'tuning': its last tuning changes or None}.

    Benchmarks: the newest (by finished_at) of <benchmark_dir>/<host>/*.json that parses as one.
    Tuning: <tuning_dir>/<host>.json as written by playbooks/verify.yml. Unreadable files are skipped."""
    extras: dict[str, Any] = {"benchmark": None, "tuning": None}
    if benchmark_dir:
        best: tuple[str, dict[str, Any]] | None = None
        for path in glob.glob(os.path.join(benchmark_dir, host, "*.json")):
            doc = read_json_dict(path)
            if doc is None:
                continue
            finished = str(doc.get("finished_at", ""))
            if doc.get("levels") and (best is None or finished > best[0]):
                best = (finished, benchmark_summary(doc, path))
        extras["benchmark"] = best[1] if best else None
    if tuning_dir:
        extras["tuning"] = read_json_dict(os.path.join(tuning_dir, f"{host}.json"))
    return extras


# The registered results of the tuning roles that carry `changed` and `actions` (module results).
TUNING_RESULTS = (
    ("pcie_link", "kernel command line", "__pcie_link_cmdline"),
    ("pcie_link", "ASPM policy", "__pcie_link_aspm"),
    ("pcie_link", "MaxPayload/MaxReadReq", "__pcie_link_payload"),
    ("vfio", "kernel command line", "__vfio_cmdline"),
    ("vfio", "driver binding", "__vfio_result"),
    ("irq_affinity", "IRQ affinity", "__irq_affinity_result"),
    ("hugepages", "huge pages", "__hugepages_state"),
    ("hugepages", "kernel command line", "__hugepages_cmdline"),
)


def _action_text(action: Any) -> str:
    if isinstance(action, dict):
        what = action.get("action") or action.get("what") or action.get("op") or ""
        rest = ", ".join(f"{k} {v}" for k, v in sorted(action.items()) if k not in ("action", "what", "op"))
        return f"{what} ({rest})" if what and rest else str(what or rest)
    return str(action)


def tuning_changes(hostvars_of_host: Any) -> list[dict[str, Any]]:
    """What the tuning roles changed on one host in this run: [{'role', 'what', 'actions': [str]}]."""
    out = []
    for role, what, var in TUNING_RESULTS:
        res = hostvars_of_host.get(var) if hasattr(hostvars_of_host, "get") else None
        if not isinstance(res, dict) or not res.get("changed") or res.get("skipped"):
            continue
        actions = [_action_text(a) for a in res.get("actions") or []]
        out.append({"role": role, "what": what, "actions": actions or ["changed"]})
    return out


def host_summary(entry: dict[str, Any]) -> dict[str, Any]:
    pcie = entry["pcie"]
    devices = pcie.get("devices") or {}
    findings = pcie.get("findings") or []
    counts = {s: sum(1 for f in findings if f.get("severity") == s) for s in SEVERITIES}
    nvml_gpus = ((pcie.get("nvml") or {}).get("gpus")) or {}
    gpus = []
    for gpu in pcie.get("gpus") or []:
        dev = devices.get(gpu["bdf"], {})
        link = _link(dev)
        name = ((nvml_gpus.get(gpu["bdf"]) or {}).get("name") or gpu.get("name") or dev.get("device_name")
                or " ".join(filter(None, (dev.get("vendor_id"), dev.get("device_id")))) or "?")
        gpus.append({"bdf": gpu["bdf"], "name": name,
                     "link": link_text(link), "degraded": link_degraded(link),
                     "numa_node": gpu.get("numa_node"), "driver": dev.get("driver")})
    levels = sorted({p.get("level") for p in pcie.get("pairs") or [] if p.get("level")})
    order = {s: i for i, s in enumerate(SEVERITIES)}
    ranked = sorted(findings, key=lambda f: order.get(f.get("severity"), len(order)))
    return {"host": entry["host"], "kernel": entry.get("kernel", ""), "gpus": gpus, "counts": counts,
            "pair_levels": levels, "findings": ranked, "benchmark": entry.get("benchmark"),
            "tuning": entry.get("tuning"), "stored": entry.get("stored")}


def _stored_note(r: dict[str, Any]) -> str:
    return (f"Not audited in this run: the audit last stored on the controller ({r['stored']})."
            if r.get("stored") else "")


STAMP_RE = re.compile(r"gpufleet-report digest ([0-9a-f]{16}) generated (\S+)")


def generated_at(body: str, previous: str | None, now: str | None = None) -> tuple[str, str]:
    """(digest of the body, generation time): the previous report's time when it holds the same digest
    (nothing changed), else now (UTC, ISO 8601)."""
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]
    m = STAMP_RE.search(previous or "")
    if m and m.group(1) == digest:
        return digest, m.group(2)
    return digest, now or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pct(cv: Any) -> str:
    return f"{cv * 100:.1f}%" if isinstance(cv, (int, float)) else "n/a (one run)"


def _num(v: Any, fmt: str = "{:.1f}") -> str:
    return fmt.format(v) if isinstance(v, (int, float)) else "-"


def benchmark_rows(bench: dict[str, Any]) -> list[list[str]]:
    return [[str(lv["concurrency"]), _num(lv["output_throughput"]), _pct(lv["cv"]), str(lv["runs"]),
             _num(lv["ttft_p50_ms"]), _num(lv["tpot_p50_ms"]), str(lv["errors"])] for lv in bench["levels"]]


BENCH_HEAD = ["concurrency", "output tok/s (median)", "CV", "runs", "TTFT p50 ms", "TPOT p50 ms", "errors"]


def finding_where(f: dict[str, Any]) -> str:
    """Where a finding is: its device, or the file and line that set it (the host lint's findings), or '-'."""
    if f.get("device"):
        return f["device"]
    if f.get("file"):
        return f"{f['file']}:{f['line']}" if f.get("line") else f["file"]
    return "-"


def _md_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(fleet: list[dict[str, Any]], previous: str | None = None, now: str | None = None) -> str:
    body = _markdown_body(fleet)
    digest, when = generated_at(body, previous, now)
    return f"# GPU fleet PCIe audit\n\nGenerated {when}.\n\n{body}<!-- gpufleet-report digest {digest} generated {when} -->\n"


def _markdown_body(fleet: list[dict[str, Any]]) -> str:
    rows = [host_summary(e) for e in fleet]
    out = [f"{len(rows)} host(s); {sum(len(r['gpus']) for r in rows)} device(s) audited; "
           f"{sum(r['counts']['critical'] for r in rows)} critical and "
           f"{sum(r['counts']['warning'] for r in rows)} warning finding(s).", "",
           "| host | kernel | devices | slowest link | pair levels | critical | warning | info | first finding |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        degraded = [g for g in r["gpus"] if g["degraded"]]
        slowest = degraded[0]["link"] if degraded else (r["gpus"][0]["link"] if r["gpus"] else "n/a")
        first = r["findings"][0]["message"] if r["findings"] else "none"
        out.append("| " + " | ".join(_md_cell(c) for c in (
            r["host"] + (" (stored)" if r["stored"] else ""), r["kernel"] or "?", len(r["gpus"]), slowest, ", ".join(r["pair_levels"]) or "-",
            r["counts"]["critical"], r["counts"]["warning"], r["counts"]["info"], first)) + " |")
    for r in rows:
        out += ["", f"## {r['host']}", ""] + ([_stored_note(r), ""] if r["stored"] else [])
        out += ["| device | name | link | NUMA | driver |", "|---|---|---|---|---|"]
        for g in r["gpus"]:
            out.append("| " + " | ".join(_md_cell(c) for c in (
                g["bdf"], g["name"], g["link"] + (" (below capability)" if g["degraded"] else ""),
                g["numa_node"] if g["numa_node"] is not None else "-", g["driver"] or "none")) + " |")
        if r["findings"]:
            out += ["", "| severity | device or file:line | finding | fix |", "|---|---|---|---|"]
            for f in r["findings"]:
                out.append("| " + " | ".join(_md_cell(c) for c in (
                    f.get("severity", "?"), finding_where(f), f.get("message", ""), f.get("fix", ""))) + " |")
        else:
            out += ["", "No findings."]
        if r["benchmark"]:
            b = r["benchmark"]
            out += ["", f"Latest benchmark: `{b['label']}` on {b['kernel'] or '?'}, {b['finished_at'] or '?'} "
                        f"({b['file']}).", "", "| " + " | ".join(BENCH_HEAD) + " |", "|" + "---|" * len(BENCH_HEAD)]
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in benchmark_rows(b)]
        if r["tuning"]:
            t = r["tuning"]
            out += ["", f"Last tuning changes ({t.get('time', '?')}):", ""]
            out += [f"- {_md_cell(c['role'])}, {_md_cell(c['what'])}: {_md_cell('; '.join(c['actions']))}"
                    for c in t.get("changes") or []]
    return "\n".join(out) + "\n"


_CSS = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#1b1f24;background:#fafbfc}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0 1rem;background:#fff;box-shadow:0 1px 2px #0001}
th,td{border:1px solid #d0d7de;padding:.35rem .6rem;text-align:left;vertical-align:top;font-size:.9rem}
th{background:#f3f5f7}.critical{background:#ffebe9;color:#a40e26;font-weight:600}
.warning{background:#fff8c5;color:#7d4e00}.info{color:#57606a}.ok{color:#1a7f37}
.bad{color:#a40e26;font-weight:600}code{font-size:.85rem}
"""


def _td(text: Any, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<td{attr}>{html.escape(str(text))}</td>"


def render_html(fleet: list[dict[str, Any]], previous: str | None = None, now: str | None = None) -> str:
    body = _html_body(fleet)
    digest, when = generated_at(body, previous, now)
    return ("<!DOCTYPE html>\n" '<html lang="en"><head><meta charset="utf-8">\n'
            f"<title>GPU fleet PCIe audit</title>\n<style>{_CSS}</style></head><body>\n"
            f'<h1>GPU fleet PCIe audit</h1>\n<p class="info">Generated <time datetime="{when}">{when}</time>.</p>\n'
            f"{body}<!-- gpufleet-report digest {digest} generated {when} -->\n</body></html>\n")


def _html_body(fleet: list[dict[str, Any]]) -> str:
    rows = [host_summary(e) for e in fleet]
    parts = [f"<p>{len(rows)} host(s), {sum(len(r['gpus']) for r in rows)} device(s) audited.</p>",
             "<table><tr><th>host</th><th>kernel</th><th>devices</th><th>pair levels</th>"
             "<th>critical</th><th>warning</th><th>info</th></tr>"]
    for r in rows:
        c = r["counts"]
        parts.append("<tr>" + f'<td><a href="#{html.escape(r["host"])}">{html.escape(r["host"])}</a></td>'
                     + _td(r["kernel"] or "?") + _td(len(r["gpus"])) + _td(", ".join(r["pair_levels"]) or "-")
                     + _td(c["critical"], "critical" if c["critical"] else "ok")
                     + _td(c["warning"], "warning" if c["warning"] else "ok") + _td(c["info"], "info") + "</tr>")
    parts.append("</table>")
    for r in rows:
        parts.append(f'<h2 id="{html.escape(r["host"])}">{html.escape(r["host"])}</h2>')
        if r["stored"]:
            parts.append(f'<p class="info">{html.escape(_stored_note(r))}</p>')
        parts.append("<table><tr><th>device</th><th>name</th><th>link</th><th>NUMA</th><th>driver</th></tr>")
        for g in r["gpus"]:
            parts.append("<tr>" + _td(g["bdf"]) + _td(g["name"]) + _td(g["link"], "bad" if g["degraded"] else "ok")
                         + _td(g["numa_node"] if g["numa_node"] is not None else "-") + _td(g["driver"] or "none") + "</tr>")
        parts.append("</table>")
        if r["findings"]:
            parts.append("<table><tr><th>severity</th><th>device or file:line</th><th>finding</th><th>fix</th></tr>")
            for f in r["findings"]:
                sev = f.get("severity", "info")
                parts.append("<tr>" + _td(sev, sev) + _td(finding_where(f)) + _td(f.get("message", ""))
                             + _td(f.get("fix", "")) + "</tr>")
            parts.append("</table>")
        else:
            parts.append('<p class="ok">No findings.</p>')
        if r["benchmark"]:
            b = r["benchmark"]
            parts.append(f"<p>Latest benchmark: <code>{html.escape(b['label'])}</code> on {html.escape(b['kernel'] or '?')}, "
                         f"{html.escape(b['finished_at'] or '?')} ({html.escape(b['file'])}).</p>")
            parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in BENCH_HEAD) + "</tr>")
            parts += ["<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in benchmark_rows(b)]
            parts.append("</table>")
        if r["tuning"]:
            t = r["tuning"]
            parts.append(f"<p>Last tuning changes ({html.escape(str(t.get('time', '?')))}):</p><ul>")
            parts += [f"<li>{html.escape(c['role'])}, {html.escape(c['what'])}: {html.escape('; '.join(c['actions']))}</li>"
                      for c in t.get("changes") or []]
            parts.append("</ul>")
    return "\n".join(parts) + "\n"

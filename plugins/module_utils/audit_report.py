# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fleet audit report: pure functions from per-host pcie_facts results to Markdown and HTML."""

from __future__ import annotations

import html
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


def fleet_audits(hostvars: Any, hosts: list[str], key: str = "__audit_result") -> list[dict[str, Any]]:
    """One entry per host that holds an audit result, in inventory order."""
    fleet = []
    for host in hosts:
        hv = hostvars[host]
        result = hv.get(key) if hasattr(hv, "get") else None
        if not result or "pcie" not in result:
            continue
        facts = hv.get("ansible_facts") or {}
        fleet.append({"host": host, "kernel": facts.get("kernel", ""), "pcie": result["pcie"]})
    return fleet


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
            "pair_levels": levels, "findings": ranked}


def _md_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(fleet: list[dict[str, Any]]) -> str:
    rows = [host_summary(e) for e in fleet]
    out = ["# GPU fleet PCIe audit", "",
           f"{len(rows)} host(s); {sum(len(r['gpus']) for r in rows)} device(s) audited; "
           f"{sum(r['counts']['critical'] for r in rows)} critical and "
           f"{sum(r['counts']['warning'] for r in rows)} warning finding(s).", "",
           "| host | kernel | devices | slowest link | pair levels | critical | warning | info | first finding |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        degraded = [g for g in r["gpus"] if g["degraded"]]
        slowest = degraded[0]["link"] if degraded else (r["gpus"][0]["link"] if r["gpus"] else "n/a")
        first = r["findings"][0]["message"] if r["findings"] else "none"
        out.append("| " + " | ".join(_md_cell(c) for c in (
            r["host"], r["kernel"] or "?", len(r["gpus"]), slowest, ", ".join(r["pair_levels"]) or "-",
            r["counts"]["critical"], r["counts"]["warning"], r["counts"]["info"], first)) + " |")
    for r in rows:
        out += ["", f"## {r['host']}", "", "| device | name | link | NUMA | driver |", "|---|---|---|---|---|"]
        for g in r["gpus"]:
            out.append("| " + " | ".join(_md_cell(c) for c in (
                g["bdf"], g["name"], g["link"] + (" (below capability)" if g["degraded"] else ""),
                g["numa_node"] if g["numa_node"] is not None else "-", g["driver"] or "none")) + " |")
        if r["findings"]:
            out += ["", "| severity | device | finding | fix |", "|---|---|---|---|"]
            for f in r["findings"]:
                out.append("| " + " | ".join(_md_cell(c) for c in (
                    f.get("severity", "?"), f.get("device") or "-", f.get("message", ""), f.get("fix", ""))) + " |")
        else:
            out += ["", "No findings."]
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


def render_html(fleet: list[dict[str, Any]]) -> str:
    rows = [host_summary(e) for e in fleet]
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>GPU fleet PCIe audit</title>", f"<style>{_CSS}</style></head><body>",
             "<h1>GPU fleet PCIe audit</h1>",
             f"<p>{len(rows)} host(s), {sum(len(r['gpus']) for r in rows)} device(s) audited.</p>",
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
        parts.append("<table><tr><th>device</th><th>name</th><th>link</th><th>NUMA</th><th>driver</th></tr>")
        for g in r["gpus"]:
            parts.append("<tr>" + _td(g["bdf"]) + _td(g["name"]) + _td(g["link"], "bad" if g["degraded"] else "ok")
                         + _td(g["numa_node"] if g["numa_node"] is not None else "-") + _td(g["driver"] or "none") + "</tr>")
        parts.append("</table>")
        if r["findings"]:
            parts.append("<table><tr><th>severity</th><th>device</th><th>finding</th><th>fix</th></tr>")
            for f in r["findings"]:
                sev = f.get("severity", "info")
                parts.append("<tr>" + _td(sev, sev) + _td(f.get("device") or "-") + _td(f.get("message", ""))
                             + _td(f.get("fix", "")) + "</tr>")
            parts.append("</table>")
        else:
            parts.append('<p class="ok">No findings.</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"

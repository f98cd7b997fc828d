# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Grafana dashboard shipped in the collection (extras/grafana/gpufleet-fleet.json) queries only metrics that
metrics_textfile writes, with labels those metrics have, and shows every metric of the catalogue; and the fleet
operations page lists every metric with its type and labels."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ansible_collections.gpufleet.inference.plugins.module_utils.metrics import textfile as tf
from tests.unit.plugins.module_utils.test_metrics_textfile import all_outputs

REPO = Path(__file__).resolve().parents[4]
DASHBOARD = REPO / "extras" / "grafana" / "gpufleet-fleet.json"

FUNCTIONS = {"sum", "count", "max", "min", "avg", "rate", "increase", "time", "vector", "topk", "bottomk", "label_values",
             "abs", "clamp_min", "clamp_max", "delta", "deriv", "changes", "resets", "max_over_time", "min_over_time"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}
TOKEN = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def queries(dashboard: dict) -> list[str]:
    """Every PromQL expression of the dashboard: the panels' targets and the template variables' queries."""
    out = [t["expr"] for p in dashboard["panels"] for t in p.get("targets") or []]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            out.append(var["query"]["query"] if isinstance(var["query"], dict) else var["query"])
    return out


def parse_query(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression uses; AssertionError on an identifier that is neither a function,
    a keyword, a label nor a metric of the collection."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)          # label values and strings
    text = re.sub(r"\[[0-9smhdwy]+\]", "", text)               # range selectors
    labels: set[str] = set()
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", text):
        labels |= {x.strip() for x in group.split(",") if x.strip()}
    for group in re.findall(r"\{([^}]*)\}", text):
        labels |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", group))
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", "", text)
    metrics = set()
    for m in TOKEN.finditer(text):
        word, rest = m.group(), text[m.end():].lstrip()
        if word in KEYWORDS or (word in FUNCTIONS and rest.startswith("(")):
            continue
        if expr.startswith("label_values(") and word in labels | {"host"}:
            labels.add(word)
            continue
        assert word.startswith("gpufleet_"), f"{word!r} in {expr!r} is neither a function, a keyword nor a gpufleet metric"
        metrics.add(word)
    return metrics, labels


def test_the_dashboard_queries_only_what_the_writer_emits_and_shows_all_of_it(tmp_path, capsys):
    dashboard = json.loads(DASHBOARD.read_text())
    written = all_outputs(tmp_path, capsys)  # the parsed files the module wrote, every source
    labels_of = {name: {k for key in entry["samples"] for k, _v in key} for name, entry in written.items()}
    shown = set()
    for expr in queries(dashboard):
        metrics, labels = parse_query(expr)
        assert metrics, expr
        for name in metrics:
            assert name in written, f"the dashboard queries {name}, which metrics_textfile does not write ({expr})"
        allowed = set().union(*(labels_of[n] for n in metrics))
        assert labels <= allowed, f"{expr}: labels {sorted(labels - allowed)} are not labels of {sorted(metrics)}"
        shown |= metrics
    assert shown == {m.name for m in tf.CATALOGUE}, f"not on the dashboard: {sorted({m.name for m in tf.CATALOGUE} - shown)}"


def test_the_dashboard_is_a_grafana_dashboard():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "gpufleet-fleet" and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and p["targets"], p["title"]
            assert all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names == ["datasource", "host"]


def test_a_query_with_a_foreign_metric_or_label_is_caught():
    assert parse_query('sum by (host, link) (rate(gpufleet_pcie_aer_errors_total{host=~"$host"}[1h]))') == (
        {"gpufleet_pcie_aer_errors_total"}, {"host", "link"})
    try:
        parse_query("node_textfile_mtime_seconds")
    except AssertionError as err:
        assert "node_textfile_mtime_seconds" in str(err)
    else:
        raise AssertionError("a metric of another exporter went through")


def test_the_fleet_operations_page_lists_every_metric():
    page = (REPO / "docs" / "fleet_operations.md").read_text()
    for m in tf.CATALOGUE:
        row = f"| `{m.name}` | {m.type} | {', '.join(f'`{x}`' for x in m.labels)} |"
        assert row in page, f"docs/fleet_operations.md has no row {row}"

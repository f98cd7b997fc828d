# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The PCIe link findings in the throughput history: stored with each run (schema 3, and backfilled when an older
file is migrated), returned with the series, and shown in the report next to the run's tok/s."""

from __future__ import annotations

import json
import sqlite3

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history as bh
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history_report as hr
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.history_db import render
from tests.unit.plugins.module_utils.test_bench_history import STEADY, doc

GPU, PORT = "0000:01:00.0", "0000:00:01.0"
CAP = {"speed_gts": 32.0, "width": 16}


def verdict(state, top, changes=0):
    return {"state": state, "top": top, "changes": changes, "cap": CAP}


def monitored(finished_at, per_run, values=STEADY):
    """A result whose measured runs carry link verdicts: ``per_run[i]`` is {device: verdict} of run i."""
    out = doc(finished_at, values)
    out["levels"][0]["runs"] = [{"repetition": i, "output_throughput": values[i],
                                 "server_load": {"links": {"devices": devices}}} for i, devices in enumerate(per_run)]
    return out


STABLE = {PORT: verdict("at_capability", [32.0, 16]), GPU: verdict("at_capability", [32.0, 16])}
FLAPPED = {PORT: verdict("at_capability", [32.0, 16]), GPU: verdict("flapping", [32.0, 16], changes=4)}


def test_flapping_run_is_stored_with_its_tok_s(tmp_path):
    conn = bh.connect(str(tmp_path / "h.sqlite"))
    values = [1000.0, 1004.0, 812.0, 1002.0, 1001.0]
    run_id, _count = bh.append(conn, monitored("2026-12-01T00:00:00Z", [STABLE, STABLE, FLAPPED, STABLE, STABLE], values))
    rows = conn.query("SELECT run_id, concurrency, repetition, device, code, severity, top_speed_gts, top_width, "
                      "changes, output_tps FROM link_findings")
    assert [tuple(r.values()) for r in rows] == [(run_id, 8, 2, GPU, "link_flapping", "critical", 32.0, 16, 4, 812.0)]
    run = bh.series(conn)[0]["runs"][0]
    assert run["links_sampled"] is True
    assert [(f["repetition"], f["code"], f["output_tps"]) for f in run["link_findings"]] == [(2, "link_flapping", 812.0)]


def test_runs_without_sampling_and_stable_links_differ(tmp_path):
    conn = bh.connect(str(tmp_path / "h.sqlite"))
    bh.append(conn, doc("2026-12-01T00:00:00Z", STEADY))
    bh.append(conn, monitored("2026-12-02T00:00:00Z", [STABLE] * 5))
    runs = bh.series(conn)[0]["runs"]
    assert [(r["links_sampled"], r["link_findings"]) for r in runs] == [(False, []), (True, [])]
    assert [hr.links_cell(r) for r in runs] == ["not sampled", "stable"]


def test_a_link_that_stays_down_is_critical_only_when_narrow():
    narrow = monitored("t", [{GPU: verdict("stays_down", [32.0, 8])}, {GPU: verdict("stays_down", [16.0, 16])}])
    sampled, found = bh.link_findings(narrow)
    assert sampled is True
    assert [(f["repetition"], f["code"], f["severity"]) for f in found] == [
        (0, "link_below_capability", "critical"), (1, "link_below_capability", "warning")]
    assert bh.link_findings(doc("t", STEADY)) == (False, [])


def _version_2_file(path, stored):
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT)")
    for version, statements in bh.MIGRATIONS[:2]:
        for sql in statements:
            conn.execute(render(sql, "sqlite"))
        conn.execute("INSERT INTO schema_version VALUES (?, 'then')", (version,))
    for i, d in enumerate(stored):
        conn.execute("INSERT INTO runs (digest, host, finished_at, source, tuning_json, tuning_key, config_json, "
                     "config_key, result_json) VALUES (?, 'old-host', ?, 'site', '{}', 't', '{}', 'c', ?)",
                     (f"d{i}", d["finished_at"], json.dumps(d)))
        conn.execute("INSERT INTO levels (run_id, concurrency, output_tps_median, samples_json) VALUES (?, 8, 1000, '[]')",
                     (i + 1,))
    conn.commit()
    conn.close()


def test_an_old_file_is_migrated_and_its_monitored_runs_backfilled(tmp_path):
    path = str(tmp_path / "old.sqlite")
    _version_2_file(path, [doc("2026-11-01T00:00:00Z", STEADY), monitored("2026-11-02T00:00:00Z", [STABLE, FLAPPED])])
    conn = bh.connect(path)
    assert bh.schema_version(conn) == bh.SCHEMA_VERSION
    assert [tuple(r.values()) for r in conn.query("SELECT id, links_sampled FROM runs ORDER BY id")] == [(1, 0), (2, 1)]
    assert [tuple(r.values()) for r in conn.query("SELECT run_id, repetition, device, code, output_tps FROM link_findings")] == [
        (2, 1, GPU, "link_flapping", 1004.0)]
    assert bh.migrate(conn) == []


def test_the_report_shows_the_finding_next_to_the_run(tmp_path):
    conn = bh.connect(str(tmp_path / "h.sqlite"))
    bh.append(conn, monitored("2026-12-01T00:00:00Z", [STABLE] * 5))
    bh.append(conn, monitored("2026-12-02T00:00:00Z", [STABLE, FLAPPED, STABLE, STABLE, STABLE],
                              [1001.0, 640.5, 999.0, 1003.0, 1000.0]))
    model = hr.build(bh.series(conn))
    assert [(f["host"], f["finished_at"], f["device"], f["output_tps"], f["median"]) for f in model["links"]] == [
        ("gpu-01", "2026-12-02T00:00:00Z", GPU, 640.5, 1000.0)]
    md = hr.render_markdown(model)
    assert "1 PCIe link finding(s)" in md
    assert f"| gpu-01 | benchmark c=8 (1024/128 tok) | 2026-12-02T00:00:00Z | 1 | {GPU} | **critical** link_flapping | 640.5 | 1000.0 |" in md
    assert f"critical: link_flapping {GPU} (top 32 GT/s x16) in run 1: 640.5 tok/s |" in md
    assert md.count("| stable |") == 1
    page = hr.render_html(model)
    assert 'id="link-findings"' in page and page.count('<tr class="bad">') == 2


def test_a_drop_in_a_run_whose_link_flapped_says_so(tmp_path):
    conn = bh.connect(str(tmp_path / "h.sqlite"))
    bh.append(conn, monitored("2026-12-01T00:00:00Z", [STABLE] * 5))
    slow = [900.0, 850.5, 902.0, 899.0, 901.0]
    bh.append(conn, monitored("2026-12-02T00:00:00Z", [STABLE, FLAPPED, STABLE, STABLE, STABLE], slow))
    bh.append(conn, monitored("2026-12-03T00:00:00Z", [STABLE] * 5, [899.0, 902.0, 901.0, 900.0, 898.0]))
    model = hr.build(bh.series(conn))
    flagged = [(d["finished_at"], [f["output_tps"] for f in d["links"]]) for d in model["drops"]
               if d["decision"] != "change point (E-divisive)"]
    assert flagged == [("2026-12-02T00:00:00Z", [850.5])]
    md = hr.render_markdown(model)
    assert f"| critical: link_flapping {GPU} (top 32 GT/s x16) in run 1: 850.5 tok/s |" in md.split("## gpu-01", maxsplit=1)[0]
    assert "PCIe links in that run" in hr.render_html(model)

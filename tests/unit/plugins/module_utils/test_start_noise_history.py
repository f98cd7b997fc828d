# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gate's between-start noise from the history (bench/start_history.py, bench_history state=start_noise): the
stored runs of each result keep the server start it measured (migration 5 backfills it from the stored documents),
the H200 DeepSeek-V2-Lite starts give the documented 1.4% at c=64, too few starts give no figure to set and say how
many more to measure, runs of no known start are counted and left out, and the report shows the figure per series."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history as bh
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import start_history
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.history_db import render
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import start_noise
from ansible_collections.gpufleet.inference.plugins.modules import bench_history
from tests.unit.plugins.module_utils.test_bench_history import doc
from tests.unit.plugins.modules.uthelper import run_module

RESTARTS = Path(__file__).resolve().parents[4] / "docs/examples/h200-dsv2-starts/restarts.json"
BOOT = "5d0c7a4e-2f7b-4c1e-9a3b-8e6f1d2c3b4a"


def started(d: dict, start: str | None) -> dict:
    d["server"]["start"] = {"id": start, "source": "proc" if start else None, "reason": None if start else "unknown"}
    return d


def dsv2_documents() -> list[dict]:
    """The four DeepSeek-V2-Lite starts of the H200 restarts session at c=64 (512/256 tokens), each stored as two
    results of four runs, with the start each measured (its pid and start time as the session recorded them)."""
    data = json.loads(RESTARTS.read_text())
    docs = []
    for st in data["starts"]:
        runs = [r["output_throughput"] for r in st["levels"].get("64", [])]
        if st["profile"] != "dsv2lite" or len(runs) < 2:
            continue
        for half in (0, 1):
            at = f"2026-12-04T2{st['index']}:{half}0:00Z"
            d = doc(at, runs[4 * half:4 * half + 4], host="h200-1", concurrency=64, prompt=512)
            docs.append(started(d, f"{BOOT}/{st['pid']}/{int(st['started'] * 100)}"))
    return docs


def store(path: str, docs: list[dict], capsys) -> dict:
    stored = run_module(bench_history, {"path": path, "documents": docs, "source": "site"}, capsys)
    assert stored["changed"] and len(stored["added"]) == len(docs), stored
    return stored


def test_the_h200_dsv2_starts_give_the_documented_between_start_sd(tmp_path, capsys):
    path = str(tmp_path / "h.sqlite")
    store(path, dsv2_documents() + [doc("2026-12-03T10:00:00Z", [9500.0, 9600.0, 9550.0], host="h200-1",
                                        concurrency=64, prompt=512)], capsys)  # stored before results had a start
    got = run_module(bench_history, {"path": path, "state": "start_noise", "hosts": ["h200-1"], "concurrency": 64},
                     capsys)
    assert not got["changed"] and got["schema_version"] == bh.SCHEMA_VERSION
    [est] = got["start_noise"]
    assert (est["host"], est["concurrency"], est["starts"], est["runs"], est["results"]) == ("h200-1", 64, 4, 32, 8)
    assert round(est["sd_between"], 4) == 0.0139 and round(est["sd_within"], 4) == 0.0300  # docs/benchmark.md: 1.4%
    assert est["between_start_sd"] == est["sd_between"] and est["df"] == [3, 28] and round(est["p_between"], 3) == 0.064
    lo, hi = est["sd_between_ci"]
    assert lo == 0.0 and 0.06 < hi < 0.07  # four starts bound it loosely: the F test is not significant at 5%
    assert (est["unknown_results"], est["unknown_runs"]) == (1, 3) and est["stacks"] == 1
    assert "4 server starts of 32 runs" in est["reason"] and "1 stored results (3 runs) name no server start" in est["reason"]
    assert [s["runs"] for s in est["per_start"]] == [8, 8, 8, 8]
    # the one figure asked for, at the top: the one series' own
    assert (got["between_start_sd"], got["reason"]) == (est["between_start_sd"], est["reason"])
    # the same figures as the start_noise filter on the session's runs grouped by hand
    data = json.loads(RESTARTS.read_text())
    by_hand = start_noise([[r["output_throughput"] for r in st["levels"]["64"]] for st in data["starts"]
                           if st["profile"] == "dsv2lite"])
    assert math.isclose(est["sd_between"], by_hand["sd_between"], rel_tol=1e-12)


def test_too_few_starts_give_no_figure_to_set_and_say_how_many_more(tmp_path, capsys):
    docs = dsv2_documents()
    path = str(tmp_path / "h.sqlite")
    store(path, docs[:2], capsys)  # one start
    [one] = run_module(bench_history, {"path": path, "state": "start_noise"}, capsys)["start_noise"]
    assert one["starts"] == 1 and one["sd_between"] is None and one["between_start_sd"] is None
    assert "measure 2 more starts" in one["reason"]
    store(path, docs[2:4], capsys)  # two starts: a figure, one degree of freedom, not one to set
    [two] = run_module(bench_history, {"path": path, "state": "start_noise"}, capsys)["start_noise"]
    assert two["starts"] == 2 and two["sd_between"] is not None and two["between_start_sd"] is None
    assert two["df"][0] == 1 and "measure 1 more start " in two["reason"]


def test_runs_of_no_known_start_are_counted_and_left_out(tmp_path, capsys):
    docs = [started(doc(f"2026-12-0{i}T10:00:00Z", [1000.0 + i, 1002.0 + i]), None) for i in range(1, 4)]
    docs.append(started(doc("2026-12-05T10:00:00Z", [1000.0]), f"{BOOT}/1/1"))  # one run: no spread within it
    path = str(tmp_path / "h.sqlite")
    store(path, docs, capsys)
    [est] = run_module(bench_history, {"path": path, "state": "start_noise"}, capsys)["start_noise"]
    assert (est["starts"], est["unknown_results"], est["unknown_runs"], est["single_run_starts"]) == (0, 3, 6, 1)
    assert est["sd_within"] is None and est["between_start_sd"] is None
    assert "3 stored results (6 runs) name no server start" in est["reason"] and "1 starts of one run" in est["reason"]


def test_a_start_measured_under_two_tuning_states_is_left_out():
    run = {"samples": [1000.0, 1001.0], "server_start": "a", "tuning_key": "t1", "stage": ""}
    runs = [run, dict(run, tuning_key="t2"), dict(run, server_start="b"), dict(run, server_start="c", samples=[990.0, 995.0]),
            dict(run, server_start="d", samples=[1010.0, 1005.0])]
    est = start_history.estimate(runs)
    assert est["starts"] == 3 and est["mixed_starts"] == 1 and est["between_start_sd"] is not None
    assert "1 starts whose runs ran under several tuning states" in est["reason"]
    flat = start_history.estimate([dict(run, server_start=s, samples=[v, v]) for s, v in zip("xyz", (990.0, 1e3, 1010.0))])
    # no spread within any start: no F, no interval
    assert flat["sd_within"] == 0.0 and flat["sd_between_ci"] is None and flat["f"] is None
    json.dumps(flat, allow_nan=False)


def test_a_series_not_stored_is_refused_naming_those_that_are(tmp_path, capsys):
    path = str(tmp_path / "h.sqlite")
    store(path, dsv2_documents()[:1], capsys)
    got = run_module(bench_history, {"path": path, "state": "start_noise", "concurrency": 32}, capsys)
    assert got["failed"] and "no stored series of any host, concurrency 32" in got["msg"] and "h200-1" in got["msg"]
    assert "c=64" in got["msg"]


def test_the_report_shows_the_figure_under_its_series(tmp_path, capsys):
    path = str(tmp_path / "h.sqlite")
    store(path, dsv2_documents(), capsys)
    run_module(bench_history, {"path": path, "state": "report", "dest": str(tmp_path / "r")}, capsys)
    md = (tmp_path / "r/history.md").read_text()
    assert "Between server starts: sd 1.39%, 95% interval 0.00%-6.48%, F test p=0.064 (within a start 3.00%; 4 starts, " \
           "32 runs; between_start_sd to set)." in md
    assert "Between server starts: sd 1.39%" in (tmp_path / "r/history.html").read_text()


def schema_4_file(path: str, rows: list[tuple[str, dict]]) -> None:
    """A history as the previous release wrote it (schema 4), with ``rows`` (digest, document) in runs and levels."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT)")
    for version, steps in bh.MIGRATIONS[:4]:
        for step in steps:
            if not callable(step):  # the callable steps backfill rows: the file has none yet
                conn.execute(render(step, "sqlite"))
        conn.execute("INSERT INTO schema_version VALUES (?, 'then')", (version,))
    for digest, d in rows:
        cur = conn.execute("INSERT INTO runs (digest, host, finished_at, source, tuning_json, tuning_key, config_json, "
                           "config_key, result_json) VALUES (?, 'old-host', ?, 'site', '{}', 't', '{}', 'c', ?)",
                           (digest, d["finished_at"], json.dumps(d)))
        conn.execute("INSERT INTO levels (run_id, concurrency, samples_json) VALUES (?, 8, ?)",
                     (cur.lastrowid, json.dumps(d["levels"][0]["output_throughput"]["values"])))
    conn.commit()
    conn.close()


@pytest.mark.parametrize("extra", [[], [("junk", "not json")]])
def test_a_schema_4_file_keeps_its_rows_and_gets_the_starts_its_documents_name(tmp_path, extra):
    path = str(tmp_path / "old.sqlite")
    rows = [("d1", started(doc("2026-11-01T00:00:00Z", [1000.0, 1001.0]), f"{BOOT}/7/70")),
            ("d2", started(doc("2026-11-02T00:00:00Z", [1000.0, 1001.0]), None)),
            ("d3", doc("2026-11-03T00:00:00Z", [1000.0, 1001.0]))]  # stored before results had a start
    schema_4_file(path, rows)
    if extra:  # a row whose stored JSON does not parse is left as it is
        conn = sqlite3.connect(path)
        conn.execute("INSERT INTO runs (digest, host, finished_at, source, tuning_json, tuning_key, config_json, "
                     "config_key, result_json) VALUES ('junk', 'old-host', 'x', 'site', '{}', 't', '{}', 'c', 'not json')")
        conn.commit()
        conn.close()
    db = bh.connect(path)
    try:
        assert bh.schema_version(db) == bh.SCHEMA_VERSION == 5 and bh.migrate(db) == []
        got = [(r["digest"], r["server_start"]) for r in db.query("SELECT digest, server_start FROM runs ORDER BY id")]
        assert got == [("d1", f"{BOOT}/7/70"), ("d2", None), ("d3", None)] + [("junk", None)] * len(extra)
        [s] = bh.series(db)
        assert [r["server_start"] for r in s["runs"]] == [f"{BOOT}/7/70", None, None]
    finally:
        db.close()


def test_the_f_quantiles_and_the_interval_of_sd_between_cover_what_they_say():
    """F quantiles against the printed tables; the 95% interval of sd_between covers the true figure in about 95% of
    seeded draws of four starts of eight runs (sd within 3%, between 1.4%: the H200 DeepSeek-V2-Lite figures)."""
    import random  # pylint: disable=import-outside-toplevel
    from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import (  # pylint: disable=import-outside-toplevel
        between_start_interval, f_quantile)
    assert round(f_quantile(0.05, 1, 10), 3) == 4.965 and round(f_quantile(0.01, 3, 28), 2) == 4.57
    assert round(f_quantile(0.975, 3, 28), 4) == 0.0710 and round(f_quantile(0.025, 3, 28), 3) == 3.626
    rng, covered, draws = random.Random(7), 0, 400
    for _i in range(draws):
        starts = []
        for _s in range(4):
            level = rng.gauss(0.0, 0.014)
            starts.append([1000.0 * math.exp(level + rng.gauss(0.0, 0.03)) for _r in range(8)])
        lo, hi = between_start_interval(start_noise(starts), [8] * 4)
        covered += lo <= 0.014 <= hi
    assert 0.92 <= covered / draws <= 0.98, covered


def test_the_top_level_figure_needs_one_series():
    """Several series matched: no figure at the top, and the reason names them and says how to pick one."""
    est = {"host": "h", "config_key": "k", "concurrency": 64, "between_start_sd": 0.01, "reason": "4 server starts"}
    assert start_history.answer([est]) == (0.01, "4 server starts")
    value, reason = start_history.answer([est, dict(est, concurrency=16)])
    assert value is None and reason.startswith("2 series match (h k c=64, h k c=16)") and "config_key and concurrency" in reason
    assert start_history.answer([dict(est, between_start_sd=None, reason="measure 2 more starts")]) == (
        None, "measure 2 more starts")

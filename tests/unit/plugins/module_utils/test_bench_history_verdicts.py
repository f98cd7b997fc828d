# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The history keeps each change's serving verdict with its parts (issue 33, item 5): stored once, each part's word in
its column and the whole verdict with its figures and reasons; verdicts of a shape no verdict has are refused naming
the field; a file of schema 3 is migrated; query returns them. Through the module's main()."""

from __future__ import annotations

import sqlite3

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history as bh
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.history_db import render
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.verdict import serving_verdict
from ansible_collections.gpufleet.inference.plugins.modules import bench_history
from tests.unit.plugins.modules.uthelper import run_module


def diverged(stage="kv_fp8"):
    v = serving_verdict({"decision": "pass", "reason": "pass: 1.01x", "ratio": 1.01},
                        {"verdict": "diverged", "reason": "diverged: top-1 0.61", "figures": {"top1_agreement": 0.61}},
                        {"status": "stable", "reason": "nothing got worse", "findings": []})
    return {**v, "stage": stage, "decided_at": "2026-12-04T14:00:00Z"}


def test_a_verdict_is_stored_once_with_each_parts_word_and_queried(tmp_path, capsys):
    db = str(tmp_path / "h.sqlite")
    stored = run_module(bench_history, {"path": db, "verdicts": [diverged()], "host": "gpu-01", "source": "tune_measured"},
                        capsys)
    assert stored["changed"] and stored["verdicts_added"] == [1] and stored["schema_version"] == bh.SCHEMA_VERSION
    assert stored["actions"] == [{"action": "store_verdict", "path": db, "host": "gpu-01", "source": "tune_measured",
                                  "stage": "kv_fp8", "verdict": "diverged", "verdict_id": 1}]
    again = run_module(bench_history, {"path": db, "verdicts": [diverged()], "host": "gpu-01", "source": "tune_measured"},
                       capsys)
    assert not again["changed"] and again["verdicts_added"] == []
    row = sqlite3.connect(db).execute("SELECT verdict, keep, throughput, latency, outputs, stability FROM verdicts").fetchone()
    assert row == ("diverged", 0, "yes", "not measured", "no", "yes")
    query = run_module(bench_history, {"path": db, "state": "query"}, capsys)
    [back] = query["verdicts"]
    assert back["host"] == "gpu-01" and back["parts"]["outputs"]["figures"] == {"top1_agreement": 0.61}
    assert back["reason"].startswith("diverged: top-1 0.61")


@pytest.mark.parametrize("bad, fragment", [
    ("x", "unable to convert to dict"),
    ({**diverged(), "verdict": None}, "has verdict None"),
    ({**diverged(), "parts": {"speed": {}}}, "has parts speed"),
    ({**diverged(), "decided_at": ""}, "has decided_at ''"),
])
def test_verdicts_of_a_shape_no_verdict_has_are_refused(tmp_path, capsys, bad, fragment):
    result = run_module(bench_history, {"path": str(tmp_path / "h.sqlite"), "verdicts": [bad], "host": "h"}, capsys)
    assert result["failed"] and fragment in result["msg"]
    assert not (tmp_path / "h.sqlite").exists() or not result["changed"]


def test_verdicts_need_a_host(tmp_path, capsys):
    result = run_module(bench_history, {"path": str(tmp_path / "h.sqlite"), "verdicts": [diverged()]}, capsys)
    assert result["failed"] and "verdicts need host" in result["msg"]


def test_a_schema_3_file_gets_the_verdicts_table(tmp_path):
    path = str(tmp_path / "old.sqlite")
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT)")
    for version, steps in bh.MIGRATIONS[:3]:
        for step in steps:
            if not callable(step):  # the callable steps backfill rows: the file has none
                conn.execute(render(step, "sqlite"))
        conn.execute("INSERT INTO schema_version VALUES (?, 'then')", (version,))
    conn.commit()
    conn.close()
    conn = bh.connect(path)
    assert bh.schema_version(conn) == bh.SCHEMA_VERSION and bh.append_verdict(conn, diverged(), "gpu-01", "kernel_upgrade") == (1, True)
    assert [v["stage"] for v in bh.verdicts(conn, "gpu-01")] == ["kv_fp8"] and bh.verdicts(conn, "gpu-02") == []
    conn.close()

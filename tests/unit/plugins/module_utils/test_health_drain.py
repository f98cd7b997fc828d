# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""health.yml's drain decision (maintenance/drain.py): critical findings, and tok/s that fell against the host's own
history, with the drops found by the real history analysis (bench/history_report.py build(): the gate between
consecutive runs and E-divisive change points)."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.history_report import build
from ansible_collections.gpufleet.inference.plugins.module_utils.maintenance.drain import DrainError, health_drain

NOISE = (-3.0, 2.0, -1.0, 3.0, 0.0, 1.0, -2.0, 2.5)


def series(host, levels):
    """One series of ``host``: a run per level, eight samples each around it."""
    runs = [{"id": i + 1, "finished_at": f"2026-12-{i + 1:02d}T03:00:00Z", "median": level,
             "samples": [level + n for n in NOISE], "kernel": "6.1", "gpu_driver": "580", "vllm_version": "0.11",
             "model": "m", "tuning": {}, "tuning_key": "t", "profile": "health", "stage": None, "link_findings": []}
            for i, level in enumerate(levels)]
    return {"host": host, "config_key": "k", "config": {"profile": "health", "prompt_tokens": 512, "output_tokens": 64},
            "concurrency": 8, "runs": runs}


def history(*series_list):
    model = build(list(series_list))
    return {"series": list(series_list), "drops": model["drops"]}


def test_a_critical_finding_drains_a_warning_does_not():
    found = [{"code": "row_remap_pending", "severity": "critical", "message": "GPU 0000:18:00.0 has a row remap pending"},
             {"code": "persistence_off", "severity": "warning", "message": "no persistence"}]
    got = health_drain(found, None, "gpu07")
    assert got["drain"] and got["reasons"] == ["critical: GPU 0000:18:00.0 has a row remap pending"]
    assert health_drain(found[1:], None, "gpu07")["drain"] is False


def test_the_latest_run_that_fell_by_more_than_the_margin_drains():
    h = history(series("gpu07", [1000.0] * 6 + [800.0]))
    got = health_drain([], h, "gpu07", margin=0.1)
    assert got["drain"] and [round(f["ratio"], 3) for f in got["fell"]] == [0.8]
    assert got["reasons"][0].startswith("tok/s fell: health c=8 (512/64 tok) is at 800.0 tok/s, 80.0% of 1000.0 before run 7")
    assert health_drain([], h, "gpu07", margin=0.25)["drain"] is False   # 20% is within a 25% margin
    assert health_drain([], h, "gpu08", margin=0.1)["drain"] is False    # another host's history


def test_a_level_shift_that_lasts_drains_one_that_recovered_does_not():
    down = history(series("gpu07", [1000.0] * 6 + [850.0] * 6))
    got = health_drain([], down, "gpu07", margin=0.1)
    assert got["drain"] and any(str(f["decision"]).startswith("change point") for f in got["fell"])
    back = history(series("gpu07", [1000.0] * 6 + [850.0] * 6 + [1000.0] * 6))
    assert [d for d in back["drops"] if d["host"] == "gpu07"]  # the history still shows the old drop
    assert health_drain([], back, "gpu07", margin=0.1)["drain"] is False


@pytest.mark.parametrize("args, message", [
    (([], None, "h", 0), "margin=0 must be a share between 0 and 1"),
    (([], None, "h", True), "margin=True"),
    (("critical", None, "h"), "findings must be a list"),
    (([], {"series": "x"}, "h"), "history must be a bench_history query result"),
])
def test_bad_inputs_are_refused(args, message):
    with pytest.raises(DrainError, match=message):
        health_drain(*args)

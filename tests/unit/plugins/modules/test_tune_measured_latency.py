# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tune_measured and the gate's latency part (issue 33, item 3): a stage that keeps the throughput but doubles TTFT is
reverted naming the metric, a profile's own latency margin is used for its levels, a state from before per-run
latency is judged on throughput (not measured), bad margins are refused at start; the stage table shows the part.
Driven through main() over a fake root."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.tuning import stage_table
from ansible_collections.gpufleet.inference.plugins.modules import tune_measured
from tests.unit.plugins.modules.uthelper import run_module

PROFILE = {"name": "serving", "concurrency": [32], "prompt_tokens": 1024, "output_tokens": 128, "requests": 128}
STAGE = {"name": "seqs", "kind": "vllm", "role": "gpufleet.inference.vllm_service", "vars": {"vllm_service_max_num_seqs": 64}}
BASE = [1000.0, 1010.0, 995.0, 1005.0, 1002.0]
SAME = [1004.0, 1008.0, 999.0, 1006.0, 1001.0]
WIGGLE = [1.0, 1.01, 0.99, 1.005, 0.995]


def document(values, ttft=50.0, tpot=3.0, runs=True, wiggle=None):
    """An inference_benchmark result document with per-run tok/s and, with ``runs``, each run's TTFT/TPOT."""
    s = sorted(values)
    level = {"concurrency": 32, "errors": 0, "short_outputs": 0, "requests": 128 * len(values),
             "output_throughput": {"values": list(values), "median": s[len(s) // 2], "cv": 0.01},
             "ttft_ms": {"p50": ttft, "p99": 2 * ttft}, "tpot_ms": {"p50": tpot, "p99": 2 * tpot}}
    if runs:
        level["runs"] = [{"output_throughput": v, "ttft_ms": {"p50": ttft * w, "p90": 1.2 * ttft * w},
                          "tpot_ms": {"p50": tpot * w, "p90": 1.1 * tpot * w}} for v, w in zip(values, wiggle or WIGGLE)]
    return {"format": "gpufleet.inference_benchmark/1", "finished_at": "2026-12-04T04:00:00Z", "kernel": "k",
            "server": {"url": "http://127.0.0.1:8000", "model": "m", "root": "/models/m", "max_model_len": 4096},
            "config": {"model": None, "prompt_tokens": 1024, "output_tokens": 128, "concurrency": [32], "requests": 128,
                       "seed": 0, "ignore_eos": True, "prompt_mode": "token_ids", "token_id_range": [1000, 4000]},
            "levels": [level]}


def through_the_stage(tmp_path, capsys, base_doc, stage_doc, profile=None, **start):
    common = {"root": str(tmp_path), "state_file": "/state.json"}
    args = {**common, "op": "start", "profiles": [profile or PROFILE], "stages": [STAGE],
            "vllm_defaults": {"vllm_service_max_num_seqs": 0}, **start}
    result = run_module(tune_measured, args, capsys)
    for docs in ([base_doc], [], [stage_doc]):
        if result.get("failed"):
            return result
        act = result["next"]
        result = run_module(tune_measured, {**common, "op": "complete", "action_id": act["id"], "results": docs}, capsys)
    return result


def stage(result):
    return next(s for s in result["state"]["stages"] if s["name"] == "seqs")


def test_a_stage_that_keeps_throughput_but_doubles_ttft_is_reverted(tmp_path, capsys):
    result = through_the_stage(tmp_path, capsys, document(BASE), document(SAME, ttft=100.0))
    s = stage(result)
    assert s["verdict"] == "regression" and s["status"] == "reverting", s["reason"]
    assert "regression on latency: TTFT p" in s["reason"]
    part = s["verdicts"]["serving"]["32"]["latency"]
    assert part["status"] == "judged" and part["metrics"]["ttft_p50"]["decision"] == "regression"
    assert part["metrics"]["ttft_p50"]["ratio"] > 1.9 and part["metrics"]["tpot_p50"]["decision"] == "pass"
    table = stage_table.render_markdown([result["state"]])
    assert "latency (gate)" in table and "TTFT p50 regression 2.0" in table


def test_equal_latency_is_kept_and_the_table_says_so(tmp_path, capsys):
    result = through_the_stage(tmp_path, capsys, document(BASE), document(SAME))
    assert stage(result)["status"] == "kept", stage(result)["reason"]
    assert "pass (4 metrics)" in stage_table.render_markdown([result["state"]])
    assert "pass (4 metrics)" in stage_table.render_html([result["state"]])


def test_a_profile_margin_is_used_for_its_levels(tmp_path, capsys):
    wide = dict(PROFILE, latency_margins={"ttft_p50": 1.0, "ttft_p90": 1.0})
    result = through_the_stage(tmp_path, capsys, document(BASE), document(SAME, ttft=65.0), profile=wide)
    assert stage(result)["status"] == "kept", stage(result)["reason"]
    # the same +30% TTFT under the gate's defaults (+10%, +15%) is reverted
    strict = through_the_stage(tmp_path / "strict", capsys, document(BASE), document(SAME, ttft=65.0))
    assert stage(strict)["status"] == "reverting"


def test_a_gate_wide_margin_and_a_profile_over_it(tmp_path, capsys):
    gate = {"latency_margins": {"ttft_p50": 1.0, "ttft_p90": 1.0}}
    kept = through_the_stage(tmp_path, capsys, document(BASE), document(SAME, ttft=65.0), gate=gate)
    assert stage(kept)["status"] == "kept"
    tight = dict(PROFILE, latency_margins={"ttft_p50": 0.1})
    reverted = through_the_stage(tmp_path / "p", capsys, document(BASE), document(SAME, ttft=65.0), gate=gate, profile=tight)
    assert stage(reverted)["status"] == "reverting" and "TTFT p50" in stage(reverted)["reason"]


def test_results_without_per_run_latency_are_judged_on_throughput_marked(tmp_path, capsys):
    result = through_the_stage(tmp_path, capsys, document(BASE, runs=False), document(SAME, ttft=100.0))
    s = stage(result)
    assert s["status"] == "kept" and s["verdicts"]["serving"]["32"]["latency"]["status"] == "not measured"
    assert "not measured" in stage_table.render_markdown([result["state"]])


def test_bad_latency_margins_are_refused_at_start(tmp_path, capsys):
    common = {"root": str(tmp_path), "state_file": "/state.json", "op": "start", "stages": [STAGE],
              "vllm_defaults": {"vllm_service_max_num_seqs": 0}}
    bad_gate = run_module(tune_measured, {**common, "profiles": [PROFILE], "gate": {"latency_margins": {"ttft_p50": 2}}},
                          capsys)
    assert bad_gate["failed"] and "latency_margins.ttft_p50 must be an increase between 0.01 and 1.0" in bad_gate["msg"]
    bad_profile = run_module(tune_measured, {**common, "profiles": [dict(PROFILE, latency_margins={"itl": 0.1})]}, capsys)
    assert bad_profile["failed"] and "profile 'serving'" in bad_profile["msg"] and "itl" in bad_profile["msg"]


def test_threshold_auto_widens_the_default_latency_margins_from_the_baseline_cv(tmp_path, capsys):
    wide = [1.0, 1.2, 0.8, 1.1, 0.9]  # TTFT and TPOT runs about 16% apart (sd of the logs)
    result = through_the_stage(tmp_path, capsys, document(BASE, wiggle=wide), document(SAME, wiggle=wide),
                               gate={"threshold": "auto", "latency_margins": {"tpot_p90": 0.2}})
    auto = result["state"]["gate"]["latency_auto"]
    assert auto["ttft_p50"] == pytest.approx(3 * 0.158, abs=0.01)
    margins = {k: m["margin"] for k, m in stage(result)["verdicts"]["serving"]["32"]["latency"]["metrics"].items()}
    assert margins["ttft_p50"] == auto["ttft_p50"] and margins["tpot_p90"] == 0.2  # a margin set by hand is kept

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tune_measured and the gate (issue 31): a result of another workload is never matched to the profile or
compared with the reference, request failures and dead runs reach the gate, settings are checked before the
baseline, and a damaged state file is refused with what to do. Driven through main() over a fake root."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpufleet.inference.plugins.modules import tune_measured
from tests.unit.plugins.modules.uthelper import run_module

PROFILE = {"name": "serving", "concurrency": [32], "prompt_tokens": 1024, "output_tokens": 128, "requests": 128}
STAGE = {"name": "seqs", "kind": "vllm", "role": "gpufleet.inference.vllm_service", "vars": {"vllm_service_max_num_seqs": 64}}
BASE = [1000.0, 1010.0, 995.0, 1005.0, 1002.0]
SAME = [1004.0, 1008.0, 999.0, 1006.0, 1001.0]


def document(values, model="Qwen/Qwen2.5-7B-Instruct", prompt=1024, errors=0, level=32, requests=128):
    """An inference_benchmark result document (server, config, one level) with the given per-run tok/s."""
    s = sorted(values)
    return {"format": "gpufleet.inference_benchmark/1", "finished_at": "2026-12-04T04:00:00Z", "kernel": "k",
            "server": {"url": "http://127.0.0.1:8000", "model": model, "root": f"/models/{model}", "max_model_len": 4096},
            "config": {"model": None, "prompt_tokens": prompt, "output_tokens": 128, "concurrency": [level],
                       "requests": requests, "seed": 0, "ignore_eos": True, "prompt_mode": "token_ids",
                       "token_id_range": [1000, 4000]},
            "levels": [{"concurrency": level, "errors": errors, "short_outputs": 0, "requests": requests * len(values),
                        "output_throughput": {"values": list(values), "median": s[len(s) // 2], "cv": 0.01},
                        "ttft_ms": {"p50": 10.0, "p99": 20.0}, "tpot_ms": {"p50": 1.0, "p99": 2.0}}]}


@pytest.fixture()
def common(tmp_path):
    return {"root": str(tmp_path), "state_file": "/state.json"}


def through_the_stage(common, capsys, stage_doc, **start):
    """Start, benchmark the baseline, apply the stage and bring ``stage_doc``: the module's last answer."""
    args = {**common, "op": "start", "profiles": [PROFILE], "stages": [STAGE],
            "vllm_defaults": {"vllm_service_max_num_seqs": 0}, **start}
    result = run_module(tune_measured, args, capsys)
    for docs in ([document(BASE)], [], [stage_doc]):
        act = result["next"]
        result = run_module(tune_measured, {**common, "op": "complete", "action_id": act["id"], "results": docs}, capsys)
        if result.get("failed"):
            return result
    return result


def stage(result):
    return next(s for s in result["state"]["stages"] if s["name"] == "seqs")


def test_a_same_workload_stage_is_kept(common, capsys):
    result = through_the_stage(common, capsys, document(SAME))
    assert stage(result)["status"] == "kept", stage(result)["reason"]


def test_a_result_of_another_prompt_length_is_not_the_profile(common, capsys):
    # before: a result of another model with 16-token prompts was taken as the profile's and the stage was kept
    result = through_the_stage(common, capsys, document(SAME, model="tiny", prompt=16))
    assert result["failed"] and "was not measured with profile 'serving' (prompt_tokens: profile 1024, result 16)" in result["msg"]
    state = json.load(open(os.path.join(common["root"], "state.json"), encoding="utf-8"))
    assert next(s for s in state["stages"] if s["name"] == "seqs")["status"] == "applied"  # nothing judged, nothing kept


def test_a_result_of_another_model_is_refused_by_the_gate(common, capsys):
    result = through_the_stage(common, capsys, document(SAME, model="meta-llama/Llama-3.1-8B"))
    assert result["failed"] and "different workloads" in result["msg"]
    assert "model: baseline 'Qwen/Qwen2.5-7B-Instruct', candidate 'meta-llama/Llama-3.1-8B'" in result["msg"]


def test_a_result_at_a_level_the_profile_does_not_have_is_refused(common, capsys):
    result = through_the_stage(common, capsys, document(SAME, level=4))
    assert result["failed"] and "concurrency: profile [32], result [4]" in result["msg"]


def test_request_failures_reach_the_gate(common, capsys):
    # before: 60 of 128 requests of every run failed at the same tok/s and the stage was kept
    result = through_the_stage(common, capsys, document(SAME, errors=60 * 5))
    st = stage(result)
    assert st["verdict"] == "regression" and st["status"] == "reverting"
    assert st["verdicts"]["serving"]["32"]["decided_by"] == "failures"
    assert "failed or cut short 300 of 640" in st["reason"]


def test_a_dead_run_of_the_stage_is_a_failure(common, capsys):
    result = through_the_stage(common, capsys, document(SAME[:4] + [0.0]))
    st = stage(result)
    assert st["verdict"] == "regression" and st["verdicts"]["serving"]["32"]["decided_by"] == "failures"


@pytest.mark.parametrize("gate, fragment", [
    ({"max_runs": 2 ** 40}, "max_runs must be a whole number of runs between 1 and 1000"),
    ({"min_runs": 2}, "min_runs must be at least 3"),
    ({"alpha": 0.9}, "alpha must be in (0, 0.5)"),
])
def test_gate_settings_are_refused_before_the_baseline(common, capsys, gate, fragment):
    result = run_module(tune_measured, {**common, "op": "start", "profiles": [PROFILE], "stages": [STAGE],
                                        "vllm_defaults": {"vllm_service_max_num_seqs": 0}, "gate": gate}, capsys)
    assert result["failed"] and fragment in result["msg"]
    assert not os.path.exists(os.path.join(common["root"], "state.json"))


@pytest.mark.parametrize("text", ["[]", "null", "3", '{"format": "gpufleet.tune_measured/1", "stages": null}'])
def test_a_damaged_state_file_is_refused_and_reset_removes_it(common, capsys, text):
    path = os.path.join(common["root"], "state.json")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    result = run_module(tune_measured, {**common, "op": "next"}, capsys)
    assert result["failed"] and "Measured tuning:" in result["msg"] and "start over" in result["msg"]
    reset = run_module(tune_measured, {**common, "op": "reset"}, capsys)
    assert reset["changed"] and not os.path.exists(path)


def test_a_profile_that_is_not_a_name_or_a_dict_is_refused(common, capsys):
    result = run_module(tune_measured, {**common, "op": "start", "profiles": [["serving"]], "stages": [STAGE]}, capsys)
    assert result["failed"] and "profiles[0] is ['serving']" in result["msg"]


def test_min_runs_above_15_can_be_used(common, capsys):
    # before: the gate's default baseline cap (15) refused every judgement with min_runs above 15
    many = [1000.0 + (i % 5) for i in range(20)]
    args = {**common, "op": "start", "profiles": [PROFILE], "stages": [STAGE], "vllm_defaults": {"vllm_service_max_num_seqs": 0},
            "gate": {"min_runs": 20, "max_runs": 30}}
    result = run_module(tune_measured, args, capsys)
    for docs in ([document(many)], [], [document(many)]):
        result = run_module(tune_measured, {**common, "op": "complete", "action_id": result["next"]["id"], "results": docs}, capsys)
        assert not result.get("failed"), result["msg"]
    assert stage(result)["status"] == "kept"

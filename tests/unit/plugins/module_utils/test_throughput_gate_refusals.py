# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the gate refuses (issue 31): runs of different workloads, failure counts that give no rate, dead runs
screened as outliers, settings out of range. Each case was answered (pass, or a hang) before."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import throughput_gate as tg
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import stats as gate_stats
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import workload as workload_fp

BASE = [1012.5, 1003.1, 998.7, 1020.0, 1009.9]
SAME = [1005.0, 1011.2, 1000.4, 1016.8, 1008.0]


def result_doc(model="Qwen/Qwen2.5-7B-Instruct", prompt=1024, output=128, levels=(4,), requests=128):
    """An inference_benchmark result document as the module stores it (the fields the fingerprint reads)."""
    return {"format": "gpufleet.inference_benchmark/1", "label": "baseline", "kernel": "6.8.0-60-generic",
            "server": {"url": "http://127.0.0.1:8000", "model": model, "models": [model], "max_model_len": 4096,
                       "root": f"/models/{model}", "owned_by": "vllm"},
            "config": {"url": "http://127.0.0.1:8000", "model": None, "prompt_tokens": prompt, "output_tokens": output,
                       "concurrency": list(levels), "requests": requests, "warmup": 32, "repetitions": 5, "seed": 0,
                       "ignore_eos": True, "timeout": 300.0, "prompt_mode": "token_ids",
                       "token_id_range": [1000, 4000], "per_chunk_usage": False, "settle_runs": 3},
            "levels": [], "samples": {}}


# ---- workloads ------------------------------------------------------------------------------------
def test_a_candidate_at_another_concurrency_is_refused():
    with pytest.raises(gate_stats.GateError) as err:
        tg.decide(BASE, SAME, baseline_workload=result_doc(levels=(4,)), candidate_workload=result_doc(levels=(32,)))
    assert "concurrency: baseline 4, candidate 32" in str(err.value)


def test_another_model_and_prompt_length_are_named_each():
    with pytest.raises(gate_stats.GateError) as err:
        tg.decide(BASE, SAME, baseline_workload=result_doc(prompt=1024),
                  candidate_workload=result_doc(model="meta-llama/Llama-3.1-8B", prompt=16))
    msg = str(err.value)
    assert "model: baseline 'Qwen/Qwen2.5-7B-Instruct', candidate 'meta-llama/Llama-3.1-8B'" in msg
    assert "prompt_tokens: baseline 1024, candidate 16" in msg and "model_root:" in msg


def test_same_workload_other_seed_and_rounds_compare():
    # extra rounds draw other prompts (seed), skip the warm-up and measure the gated level only: still comparable
    more = result_doc(levels=(4,))
    more["config"].update(seed=3, warmup=0, settle_runs=0, repetitions=2, measured_only=True)
    assert workload_fp.workload_mismatch(workload_fp.workload(result_doc()), workload_fp.workload(more)) == []
    assert tg.decide(BASE, SAME, baseline_workload=result_doc(), candidate_workload=more)["decision"] == "pass"


def test_a_sweep_is_compared_at_the_level_given():
    base, cand = workload_fp.workload(result_doc(levels=(8, 32)), 32), workload_fp.workload(result_doc(levels=(32,)))
    assert base["concurrency"] == cand["concurrency"] == 32 and workload_fp.workload_mismatch(base, cand) == []


def test_a_side_without_fingerprint_is_judged_with_a_warning():
    gate = tg.decide(BASE, SAME, baseline_workload=None, candidate_workload=result_doc())
    assert gate["decision"] == "pass"
    assert any("baseline's workload was not recorded" in w for w in gate["warnings"])


def test_a_required_field_on_one_side_only_is_a_difference():
    fp = workload_fp.workload(result_doc())
    partial = {k: v for k, v in fp.items() if k != "output_tokens"}
    assert workload_fp.workload_mismatch(fp, partial) == ["output_tokens: baseline 128, candidate 'not recorded'"]
    # a field a server may not report (max_model_len) on one side only is not compared
    assert workload_fp.workload_mismatch(fp, {k: v for k, v in fp.items() if k != "max_model_len"}) == []


def test_a_fingerprint_with_unknown_fields_is_refused():
    with pytest.raises(gate_stats.GateError, match="workload fields modle are unknown"):
        workload_fp.workload({"modle": "x", "concurrency": 4})


def test_fingerprints_from_templated_values_compare_equal():
    doc = copy.deepcopy(result_doc())
    doc["config"].update(prompt_tokens="1024", requests="128")
    assert workload_fp.workload_mismatch(workload_fp.workload(result_doc()), workload_fp.workload(doc)) == []


# ---- failures -------------------------------------------------------------------------------------
def test_baseline_failures_without_requests_are_refused_not_a_rate():
    # before: the baseline "rate" was its count (1.0), so a candidate failing 50 of 100 passed
    with pytest.raises(gate_stats.GateError, match=r"baseline_failed \(1\) is more than baseline_requests \(0\)"):
        tg.decide(BASE, SAME, baseline_failed=1, baseline_requests=0, candidate_failed=50, candidate_requests=100)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"candidate_failed": -50, "candidate_requests": 640}, "candidate_failed must be a whole number of requests, 0 or more, got -50"),
    ({"baseline_requests": -1}, "baseline_requests must be a whole number"),
    ({"candidate_failed": 1.5, "candidate_requests": 640}, "got 1.5"),
    ({"candidate_failed": True, "candidate_requests": 640}, "got True"),
    ({"candidate_failed": 700, "candidate_requests": 640}, "candidate_failed (700) is more than candidate_requests (640)"),
])
def test_bad_failure_counts_are_refused(kwargs, fragment):
    with pytest.raises(gate_stats.GateError) as err:
        tg.decide(BASE, SAME, **kwargs)
    assert fragment in str(err.value)


def test_failures_are_a_share_of_requests():
    gate = tg.decide(BASE, SAME, baseline_failed=0, baseline_requests=640, candidate_failed=60, candidate_requests=640)
    assert gate["decision"] == "regression" and gate["decided_by"] == "failures"
    assert tg.decide(BASE, SAME, baseline_failed=6, baseline_requests=640, candidate_failed=3,
                     candidate_requests=640)["decision"] == "pass"


# ---- dead runs ------------------------------------------------------------------------------------
def test_a_dead_candidate_run_is_a_failure_not_an_outlier():
    # before: the 0 tok/s run was screened out as an outlier and the other six passed
    cand = SAME + [1010.0, 0.0]
    gate = tg.decide(BASE, cand, candidate_min_runs=4)
    assert gate["decision"] == "regression" and gate["final"] and gate["decided_by"] == "failures"
    assert "candidate run(s) 7 of 7 produced no tokens" in gate["reason"] and gate["screened"] == []


def test_a_dead_baseline_run_is_refused():
    with pytest.raises(gate_stats.GateError, match=r"baseline run\(s\) 3 of 6 produced no tokens"):
        tg.decide(BASE[:2] + [0.0] + BASE[2:], [])


# ---- settings -------------------------------------------------------------------------------------
@pytest.mark.parametrize("settings, fragment", [
    ({"max_runs": 2 ** 63}, "max_runs must be a whole number of runs between 1 and 1000"),
    ({"max_baseline_runs": 5000}, "max_baseline_runs must be a whole number of runs between 1 and 1000"),
    ({"bootstrap": 10 ** 9}, "bootstrap_resamples must be a whole number between 0 (off) and 100000"),
    ({"min_runs": 20, "max_runs": 30}, "max_baseline_runs (15) must be at least min_runs (20): allowed 20..1000"),
    ({"candidate_min_runs": 40}, "candidate_min_runs must be between 3 and max_runs (15)"),
    ({"threshold": 1.2}, "threshold must be in (0, 1)"),
    ({"alpha": 0.7}, "alpha must be in (0, 0.5)"),
    ({"step": 1.5}, "step must be a whole number of runs"),
])
def test_settings_are_checked_before_any_run(settings, fragment):
    with pytest.raises(gate_stats.GateError) as err:
        tg.check_all_settings(**settings)
    assert fragment in str(err.value)


def test_good_settings_pass_the_check():
    tg.check_all_settings(min_runs=20, max_baseline_runs=40, max_runs=1000, bootstrap=100000)


# ---- the vLLM flag stages' table (its own path to the gate) ----------------------------------------
def _records(candidate_runs, baseline_runs=None, **gate):
    from tests.tools import vllm_flag_stages as vfs

    runs = [{"output_throughput": v} for v in BASE]
    cand = [{"output_throughput": v} for v in candidate_runs]
    records = [{"stage": "baseline", "levels": {"32": runs}, "gate": None},
               {"stage": "seqs", "changed": {"vllm_service_max_num_seqs": 64}, "levels": {"32": cand},
                "gate": {"baseline_runs": baseline_runs or runs, "candidate_runs": cand, **gate}}]
    return vfs.stage_table(records, 32)[1]


def test_a_dead_run_of_a_flag_stage_is_a_failure_not_dropped():
    # before: the 0 tok/s run was left out of the stage's runs and the stage was kept
    row = _records(SAME[:4] + [0.0, 1003.0])
    assert row["verdict"] == "regression" and row["kept"] is False


def test_a_flag_stage_of_another_workload_is_an_error_row():
    row = _records(SAME, baseline_workload={"model": "a", "concurrency": 32}, candidate_workload={"model": "b", "concurrency": 32})
    assert row["verdict"] == "error" and row["kept"] is False and "model: baseline 'a', candidate 'b'" in row["error"]
    assert _records(SAME)["verdict"] == "pass"

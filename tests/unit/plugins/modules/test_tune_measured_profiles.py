# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tune_measured and the benchmark profiles (issue 35): a stage is judged on the profile that can see its effect
(prefix caching on shared_prefix), a regression on any other profile still reverts it, the stage table says which
profile judged it, and a result of another request profile is not the profile's. Driven through main() over a
fake root."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.tuning import stage_table as st
from ansible_collections.gpufleet.inference.plugins.module_utils.tuning import tune_measured as tm
from ansible_collections.gpufleet.inference.plugins.modules import tune_measured
from tests.unit.plugins.modules.uthelper import run_module

SERVING = {"name": "serving", "concurrency": [32], "prompt_tokens": 1024, "output_tokens": 128, "requests": 128}
PREFIX = {"name": "shared_prefix", "concurrency": [32], "prompt_tokens": 256, "output_tokens": 128, "requests": 128}
PREFIX_SPEC = {"name": "shared_prefix", "prefix_tokens": 2048, "turns": 1}
CACHING = tm.vllm_stages([{"name": "prefix_caching", "vars": {"vllm_service_enable_prefix_caching": True}}])
BASE = [1000.0, 1010.0, 995.0, 1005.0, 1002.0]
SAME = [1004.0, 1008.0, 999.0, 1006.0, 1001.0]
FASTER = [1400.0, 1410.0, 1395.0, 1405.0, 1402.0]
SLOWER = [800.0, 805.0, 798.0, 803.0, 801.0]
NOISY = [900.0, 1100.0, 1000.0, 950.0, 1050.0]


def document(values, prompt=1024, profile=None, arrivals=None):
    """An inference_benchmark result document (server, config, one level at 32) with the given per-run tok/s."""
    s = sorted(values)
    config = {"model": None, "prompt_tokens": prompt, "output_tokens": 128, "concurrency": [32], "requests": 128,
              "seed": 0, "ignore_eos": True, "prompt_mode": "token_ids", "token_id_range": [1000, 4000]}
    if profile:
        config.update(profile=profile, arrivals=arrivals or {"mode": "closed"})
    return {"format": "gpufleet.inference_benchmark/1", "finished_at": "2026-12-04T04:00:00Z", "kernel": "k",
            "server": {"url": "http://127.0.0.1:8000", "model": "qwen", "root": "/models/qwen", "max_model_len": 4096},
            "config": config,
            "levels": [{"concurrency": 32, "errors": 0, "short_outputs": 0, "requests": 128 * len(values),
                        "output_throughput": {"values": list(values), "median": s[len(s) // 2], "cv": 0.01},
                        "ttft_ms": {"p50": 10.0, "p99": 20.0}, "tpot_ms": {"p50": 1.0, "p99": 2.0}}]}


def through(tmp_path, capsys, serving, prefix, stages=None, profiles=None, **start):
    """Start, benchmark the baseline (BASE on both profiles), apply the stage and bring ``serving`` and ``prefix``
    tok/s: the module's last answer."""
    common = {"root": str(tmp_path), "state_file": "/state.json"}
    args = {**common, "op": "start", "profiles": profiles or ["serving", "shared_prefix"], "stages": stages or CACHING,
            "vllm_defaults": {"vllm_service_enable_prefix_caching": False}, **start}
    result = run_module(tune_measured, args, capsys)
    if result.get("failed"):
        return result
    rounds = ([document(BASE), document(BASE, 256, PREFIX_SPEC)], [], [document(serving), document(prefix, 256, PREFIX_SPEC)])
    for docs in rounds:
        act = result["next"]
        result = run_module(tune_measured, {**common, "op": "complete", "action_id": act["id"], "results": docs}, capsys)
        if result.get("failed"):
            return result
    return result


def stage_of(result):
    return next(s for s in result["state"]["stages"] if s["name"] == "prefix_caching")


def test_prefix_caching_is_judged_on_shared_prefix_and_the_table_says_so(tmp_path, capsys):
    result = through(tmp_path, capsys, serving=NOISY, prefix=FASTER, more_rounds=0)
    stage = stage_of(result)
    assert stage["status"] == "kept", stage["reason"]
    assert stage["judged_on"] == stage["judged_by"] == ["shared_prefix"]
    assert stage["verdicts"]["shared_prefix"]["32"]["decision"] == "pass"
    assert stage["verdicts"]["serving"]["32"]["decision"] != "pass"  # unique prompts: no hit, no answer
    assert stage["reason"].startswith("every judged profile and level passed: pass: ")
    assert stage["reason"].endswith(" (judged on shared_prefix; no regression on the other profiles)")
    md = st.render_markdown([result["state"]])
    assert "kept (judged on shared_prefix)" in md
    assert "### shared_prefix (256 prompt / 128 output tokens; shared_prefix (prefix_tokens 2048))" in md
    assert "kept (judged on shared_prefix)" in st.render_html([result["state"]])


def test_a_stage_whose_latency_margins_are_null_says_latency_was_not_measured_for_that(tmp_path, capsys):
    off = {"ttft_p50": None, "ttft_p90": None, "tpot_p50": None, "tpot_p90": None, "itl_p99": None}
    profiles = [{"name": "serving", "latency_margins": off}, {"name": "shared_prefix", "latency_margins": off}]
    stage = stage_of(through(tmp_path, capsys, SAME, FASTER, profiles=profiles))
    latency = stage["serving"]["parts"]["latency"]
    assert stage["status"] == "kept" and latency["says"] == "not measured"
    assert latency["reason"].startswith("no latency margin set"), latency  # shown as "latency: not measured: no ..."
    assert stage["verdicts"]["shared_prefix"]["32"]["latency"]["reason"] == "not measured: " + latency["reason"]


def test_a_regression_on_another_profile_still_reverts(tmp_path, capsys):
    stage = stage_of(through(tmp_path, capsys, serving=SLOWER, prefix=FASTER))
    assert stage["status"] == "reverting" and stage["verdict"] == "regression"
    assert stage["reason"].startswith("a no from the serving verdict: regression: ")


def test_without_its_profile_a_stage_is_judged_on_every_profile_and_says_which_would_see_it(tmp_path, capsys):
    other = {**PREFIX, "name": "other", "profile": "shared_prefix", "profile_options": {"prefix_tokens": 2048}}
    result = through(tmp_path, capsys, serving=SAME, prefix=SAME, profiles=["serving", other])
    stage = stage_of(result)
    assert stage["status"] == "kept" and stage["judged_on"] == [] and stage["judged_by"] == ["serving", "other"]
    assert stage["reason"].startswith("every judged profile and level passed: pass: ")
    assert stage["reason"].endswith("; its effect shows on the shared_prefix profile, which was not measured: judged on "
                                    "every profile measured; add shared_prefix to the profiles to see it")
    assert "(judged on" not in st.render_markdown([result["state"]])


def test_a_stage_judged_on_a_profile_not_measured_is_refused(tmp_path, capsys):
    stages = [{**CACHING[0], "judged_on": ["long_context"]}]
    result = through(tmp_path, capsys, SAME, SAME, stages=stages)
    assert result["failed"] and ("stage 'prefix_caching' is judged on long_context, which the run does not measure "
                                 "(profiles: serving, shared_prefix)") in result["msg"]


def test_the_flag_stages_name_the_profile_that_sees_them():
    stages = tm.vllm_stages([{"name": "a", "vars": {"vllm_service_enable_prefix_caching": True}},
                             {"name": "b", "vars": {"vllm_service_enable_chunked_prefill": True}},
                             {"name": "c", "vars": {"vllm_service_max_num_seqs": 64}},
                             {"name": "d", "vars": {"vllm_service_gpu_memory_utilization": 0.9}}])
    plan = tm.plan_stages(stages)
    assert [s["sees"] for s in plan] == ["shared_prefix", "mixed_open_loop", "serving", ""]
    profiles = tm.resolve_profiles(["serving", "shared_prefix"])
    tm.judging_profiles(plan, profiles)
    assert [s["judged_on"] for s in plan] == [["shared_prefix"], [], ["serving"], []]
    assert "mixed_open_loop profile, which was not measured" in plan[1]["judged_note"]


def test_the_request_profiles_resolve_and_a_result_of_another_is_not_the_profile():
    resolved = tm.resolve_profiles(["shared_prefix", {"name": "mixed_open_loop", "arrivals": {"rate": 8}}])
    assert resolved[0]["profile"] == "shared_prefix" and resolved[0]["profile_options"] == {"prefix_tokens": 2048}
    assert resolved[1]["arrivals"] == {"mode": "poisson", "rate": 8}  # merged key by key over the built-in
    with pytest.raises(tm.TuneError, match=r"profile 'mixed_open_loop': arrivals.mode poisson needs arrivals.rate.*"
                                           r"the request rate the site serves"):
        tm.resolve_profiles(["mixed_open_loop"])
    with pytest.raises(tm.TuneError, match="profile 'x': profile_options prefix_tokens do not apply"):
        tm.resolve_profiles([{"name": "x", "concurrency": [1], "profile_options": {"prefix_tokens": 3}}])
    prefix = tm.resolve_profiles(["shared_prefix"])[0]
    assert tm.profile_mismatch(prefix, document(BASE, 256, {**PREFIX_SPEC, "prefix_tokens": 2048})) == []
    assert tm.profile_mismatch(prefix, document(BASE, 256)) == [
        "profile: profile {'name': 'shared_prefix', 'prefix_tokens': 2048, 'turns': 1}, result {'name': 'random'}"]
    poisson = document(BASE, 256, PREFIX_SPEC, {"mode": "poisson", "rate": 8.0, "burstiness": 1.0})
    assert tm.profile_mismatch(prefix, poisson)[0].startswith("arrivals: profile {'mode': 'closed'}")

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tune_measured: the measured-tuning loop driven through main() as the playbook drives it, from the
YAML cases in test_tune_measured.yaml (each step: the action the module must ask for, and the
per-run tok/s the benchmark brings), over a fake host root and a real state file."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from ansible_collections.gpufleet.inference.plugins.module_utils.tuning import tune_measured as tm
from ansible_collections.gpufleet.inference.plugins.modules import tune_measured
from tests.unit.plugins.modules.uthelper import assert_subset, run_module

CASES = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "test_tune_measured.yaml"), encoding="utf-8"))


def document(levels: dict) -> dict:
    """A result document in inference_benchmark's layout with the given per-run tok/s per level."""
    out = []
    for c, values in levels.items():
        s = sorted(values)
        out.append({"concurrency": int(c), "errors": 0,
                    "output_throughput": {"values": list(values), "median": s[len(s) // 2], "cv": 0.01},
                    "ttft_ms": {"p50": 10.0, "p99": 20.0}, "tpot_ms": {"p50": 1.0, "p99": 2.0}})
    return {"format": "gpufleet.inference_benchmark/1", "finished_at": "2026-12-01T20:00:00Z", "kernel": "k",
            "levels": out}


def write_tree(root, files: dict) -> None:
    for path, content in (files or {}).items():
        real = os.path.join(root, path.lstrip("/"))
        os.makedirs(os.path.dirname(real), exist_ok=True)
        with open(real, "w", encoding="utf-8") as fh:
            fh.write(content)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case(case, tmp_path, capsys):
    root = str(tmp_path / "root")
    os.makedirs(root)
    write_tree(root, case.get("tree"))
    common = {"root": root, "state_file": "/var/lib/gpufleet/tune_measured/state.json"}
    result = run_module(tune_measured, {**common, "op": "start", **case["start"]}, capsys)
    state_path = os.path.join(root, "var/lib/gpufleet/tune_measured/state.json")
    for i, step in enumerate(case["steps"]):
        act = result["next"]
        assert_subset(step["expect"], act, where=f"step {i}")
        for want in step.get("actions_include", []):
            assert want in result["actions"], (i, result["actions"])
        if act["action"] == "done":
            break
        # the state on disk is what the module returned (a dead controller resumes from it)
        with open(state_path, encoding="utf-8") as fh:
            assert json.load(fh)["pending"]["id"] == act["id"]
        again = run_module(tune_measured, {**common, "op": "next"}, capsys)
        assert again["next"] == act and again["changed"] is False
        write_tree(root, step.get("write"))
        names = [p["name"] for p in result["state"]["profiles"]]
        docs = [document(step["results"][n]) for n in names] if "results" in step else []
        result = run_module(tune_measured, {**common, "op": "complete", "action_id": act["id"], "results": docs}, capsys)
    else:
        pytest.fail(f"the case's steps ended before the module said done: {result['next']}")
    stages = {s["name"]: s for s in result["state"]["stages"]}
    assert {n: stages[n]["status"] for n in case["final"]} == case["final"]
    for name, verdict in (case.get("verdicts") or {}).items():
        assert stages[name]["verdict"] == verdict, stages[name]["reason"]
    for name, ref in (case.get("references") or {}).items():
        assert stages[name]["reference"] == ref
    for name, rec in (case.get("recorded") or {}).items():
        assert stages[name]["recorded"] == rec
    for path, content in (case.get("files") or {}).items():
        real = os.path.join(root, path.lstrip("/"))
        assert (open(real, encoding="utf-8").read() if os.path.exists(real) else None) == content
    # a second start with the same plan resumes the finished state and changes nothing
    final = run_module(tune_measured, {**common, "op": "start", **case["start"]}, capsys)
    assert final["next"]["action"] == "done" and final["changed"] is False


def test_another_plan_is_refused_while_one_is_unfinished(tmp_path, capsys):
    common = {"root": str(tmp_path), "state_file": "/state.json",
              "profiles": [{"name": "p", "concurrency": [1], "prompt_tokens": 8, "output_tokens": 8}]}
    stage = {"name": "a", "kind": "vllm", "role": "r", "vars": {"x": 1}}
    run_module(tune_measured, {**common, "op": "start", "stages": [stage], "vllm_defaults": {"x": 0}}, capsys)
    other = run_module(tune_measured, {**common, "op": "start", "stages": [dict(stage, vars={"x": 2})], "vllm_defaults": {"x": 0}}, capsys)
    assert other["failed"] and "unfinished measured-tuning run made from another" in other["msg"]
    fresh = run_module(tune_measured, {**common, "op": "start", "stages": [dict(stage, vars={"x": 2})], "vllm_defaults": {"x": 0},
                                       "restart": True}, capsys)
    assert fresh["next"]["action"] == "benchmark" and fresh["next"]["stage"] == "baseline"


def test_check_mode_writes_nothing(tmp_path, capsys):
    args = {"root": str(tmp_path), "state_file": "/state.json", "op": "start", "_ansible_check_mode": True,
            "profiles": ["latency"], "stages": [{"name": "a", "kind": "vllm", "role": "r", "vars": {"x": 1}}]}
    result = run_module(tune_measured, args, capsys)
    assert result["changed"] is True and result["actions"] == [{"action": "write", "path": "/state.json"}]
    assert not os.path.exists(tmp_path / "state.json")


def test_complete_of_a_stale_action_is_refused(tmp_path, capsys):
    common = {"root": str(tmp_path), "state_file": "/state.json"}
    run_module(tune_measured, {**common, "op": "start", "profiles": ["latency"],
                               "stages": [{"name": "a", "kind": "vllm", "role": "r", "vars": {"x": 1}}], "vllm_defaults": {"x": 0}},
               capsys)
    bad = run_module(tune_measured, {**common, "op": "complete", "action_id": 7}, capsys)
    assert bad["failed"] and "action 1 (benchmark baseline) is pending" in bad["msg"]


@pytest.mark.parametrize("stages, match", [
    ([{"name": "a", "role": "r", "vars": {}}], "has no revert"),
    ([{"name": "baseline", "role": "r", "revert": [{"role": "r"}]}], "reserved"),
    ([{"name": "a", "role": "r", "revert": [{"role": "r"}], "record": ["cpu_freq"]}], "known readings"),
    ([{"name": "a", "role": "r", "revert": [{"role": "r"}]}, {"name": "a", "role": "r", "revert": [{"role": "r"}]}],
     "unique"),
    ([{"name": "a", "revert": [{"role": "r"}]}], "needs role"),
])
def test_bad_stage_lists(stages, match):
    with pytest.raises(tm.TuneError, match=match):
        tm.plan_stages(stages)


def test_profiles_resolve_near_max_and_refuse_unknown():
    p = tm.resolve_profiles(["serving", "latency", "long_context"], max_model_len=512)
    assert [x["name"] for x in p] == ["serving", "latency", "long_context"]
    assert p[1]["concurrency"] == [1] and p[2]["prompt_tokens"] == 512 - 64 - 8
    with pytest.raises(tm.TuneError, match="max_model_len is not known"):
        tm.resolve_profiles(["long_context"])
    with pytest.raises(tm.TuneError, match="not one of serving"):
        tm.resolve_profiles(["bogus"])
    with pytest.raises(tm.TuneError, match="unknown keys"):
        tm.resolve_profiles([{"name": "latency", "qps": 3}])


def test_missing_recorded_reading_says_which(tmp_path):
    stage = tm.plan_stages([{"name": "a", "role": "r", "revert": [{"role": "r", "vars": {"p": "@aspm_policy"}}]}])[0]
    stage["recorded"] = {}
    with pytest.raises(tm.TuneError, match="add 'aspm_policy' to the stage's record list"):
        tm.resolve_revert(stage)


def test_force_revert_names_stages_or_the_reboot_group():
    stages = [{"name": "a", "role": "r", "revert": [{"role": "r"}]},
              {"name": "b", "role": "r", "reboot": True, "revert": [{"role": "r"}]},
              {"name": "c", "role": "r", "reboot": True, "revert": [{"role": "r"}]}]
    plan = {s["name"]: s.get("force_revert", False) for s in tm.plan_stages(stages, force_revert=["c"])}
    assert plan == {"a": False, "reboot": True}  # a member named: the group reverts as one
    assert tm.plan_stages(stages, force_revert=["reboot"])[1]["force_revert"] is True
    with pytest.raises(tm.TuneError, match="force_revert names z, which are not stages"):
        tm.plan_stages(stages, force_revert=["z"])
    with pytest.raises(tm.TuneError, match="which skip leaves out"):
        tm.plan_stages(stages, skip=["a"], force_revert=["a"])


def test_force_revert_is_part_of_the_plan_only_when_set(tmp_path):
    stages = tm.plan_stages([{"name": "a", "role": "r", "revert": [{"role": "r"}]}])
    plain = tm.new_state("h", stages, tm.resolve_profiles(["latency"]), {})
    forced = tm.new_state("h", tm.plan_stages([{"name": "a", "role": "r", "revert": [{"role": "r"}]}], force_revert=["a"]),
                          tm.resolve_profiles(["latency"]), {})
    assert tm.plan_key(plain) != tm.plan_key(forced)
    # a state made before force_revert existed has no such key: its plan key is unchanged
    assert "force_revert" not in plain["stages"][1]

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every caller of the gate refuses results whose fingerprints differ in anything but the change under test (issue 33,
item 1): the throughput_gate module and filter (option ``change``), the kernel upgrade flow (``kernel``: nothing may
differ), measured tuning (host stages ``host``, vLLM flag stages ``vllm_flags``); and inference_benchmark records the
model's identity, the engine's version and the server's argv, run against the lab server."""

from __future__ import annotations

import copy

import pytest
from ansible.module_utils import _internal

from ansible_collections.gpufleet.inference.plugins.modules import inference_benchmark, throughput_gate, tune_measured
from tests.unit.plugins.module_utils.flow_sim import NEW, OLD, Host, drive
from tests.unit.plugins.module_utils.test_workload_identity import make_model
from tests.unit.plugins.modules.uthelper import run_module
from tests.unit.test_lab_inference_server import LabServer

BASE = [1012.5, 1003.1, 998.7, 1020.0, 1009.9]
SAME = [1005.0, 1011.2, 1000.4, 1016.8, 1008.0]
ARGV = ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--max-num-seqs", "256"]
IDENTITY = {"config": "c" * 64, "tokenizer": "t" * 64, "weights": "w" * 64, "files": 4, "bytes": 10}


@pytest.fixture(autouse=True)
def module_side():
    """Run the module tests as a module runs (module.warn() returns warnings), and put the flag back."""
    saved = _internal.is_controller
    _internal.is_controller = False
    yield
    _internal.is_controller = saved


def document(values=None, **server):
    """An inference_benchmark result document with identity, version, argv and client (``values``: SAME)."""
    values = SAME if values is None else values
    s = sorted(values)
    return {"format": "gpufleet.inference_benchmark/1", "finished_at": "2026-12-04T04:00:00Z", "kernel": "k",
            "client": {"name": "gpufleet.inference_client", "version": "1"},
            "server": {"url": "http://127.0.0.1:8000", "model": "Qwen/Qwen2.5-7B-Instruct", "root": "/models/qwen",
                       "max_model_len": 4096, "vllm_version": "0.26.0", "argv": ARGV, "model_identity": IDENTITY,
                       **server},
            "config": {"model": None, "prompt_tokens": 1024, "output_tokens": 128, "concurrency": [32],
                       "requests": 128, "seed": 0, "ignore_eos": True, "prompt_mode": "token_ids",
                       "token_id_range": [1000, 4000]},
            "levels": [{"concurrency": 32, "errors": 0, "short_outputs": 0, "requests": 128 * len(values),
                        "output_throughput": {"values": list(values), "median": s[len(s) // 2], "cv": 0.01},
                        "ttft_ms": {"p50": 10.0, "p99": 20.0}, "tpot_ms": {"p50": 1.0, "p99": 2.0}}]}


OTHER_WEIGHTS = {"model_identity": {**IDENTITY, "weights": "v" * 64}}
OTHER_VERSION = {"vllm_version": "0.27.0"}
OTHER_ARGV = {"argv": ARGV[:-1] + ["64"]}


# ---- the throughput_gate module and filter -------------------------------------------------------
@pytest.mark.parametrize("change, server, allowed", [
    ("none", OTHER_WEIGHTS, False), ("kernel", OTHER_WEIGHTS, False), ("vllm_flags", OTHER_WEIGHTS, False),
    ("none", OTHER_ARGV, False), ("host", OTHER_ARGV, False), ("vllm_flags", OTHER_ARGV, True),
    ("vllm_version", OTHER_ARGV, True), ("vllm_flags", OTHER_VERSION, False), ("vllm_version", OTHER_VERSION, True),
    ("driver", OTHER_VERSION, False),
])
def test_the_module_refuses_what_the_change_is_not_about(capsys, change, server, allowed):
    args = {"baseline": BASE, "candidate": SAME, "baseline_workload": document(),
            "candidate_workload": document(**server), "change": change}
    result = run_module(throughput_gate, args, capsys)
    if allowed:
        assert result["decision"] == "pass", result
    else:
        assert result["failed"] and result["msg"].startswith("Cannot judge the runs: the runs are of different workloads")
        field = {"model_identity": "model_weights", "vllm_version": "vllm_version", "argv": "server_argv"}[next(iter(server))]
        assert f"{field}: baseline " in result["msg"] and f"change {change!r} lets" in result["msg"]


def test_the_module_refuses_an_unknown_change(capsys):
    result = run_module(throughput_gate, {"baseline": BASE, "candidate": SAME, "change": "everything"}, capsys)
    assert result["failed"] and "change" in result["msg"] and "vllm_flags" in result["msg"]


def test_the_module_warns_of_an_identity_on_one_side_only(capsys):
    result = run_module(throughput_gate, {"baseline": BASE, "candidate": SAME, "baseline_workload": document(),
                                          "candidate_workload": document(model_identity={"unreadable": "hub name"})},
                        capsys)
    assert result["decision"] == "pass"
    assert any("model_weights recorded on one side only" in str(w) for w in result.get("warnings", []))


def test_the_filter_refuses_what_the_change_is_not_about():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.gpufleet.inference.plugins.filter.throughput_gate import FilterModule

    gate = FilterModule().filters()["throughput_gate"]
    with pytest.raises(AnsibleFilterError, match="vllm_version: baseline '0.26.0', candidate '0.27.0'"):
        gate(BASE, SAME, baseline_workload=document(), candidate_workload=document(**OTHER_VERSION), change="kernel")
    with pytest.raises(AnsibleFilterError, match="server_argv: baseline"):
        gate(BASE, SAME, baseline_workload=document(), candidate_workload=document(**OTHER_ARGV))
    assert gate(BASE, SAME, baseline_workload=document(), candidate_workload=document(**OTHER_ARGV),
                change="vllm_flags")["decision"] == "pass"
    with pytest.raises(AnsibleFilterError, match="change must be one of"):
        gate(BASE, SAME, change="all")


# ---- the kernel upgrade flow: change "kernel", nothing of the workload may differ --------------------
class Engines(Host):
    """The simulated host whose benchmarks also carry the model identity, the engine and the client, per label."""

    def __init__(self, engines: dict, **kw):
        super().__init__(**kw)
        self.engines = engines

    def benchmark(self, action: dict) -> dict:
        data = super().benchmark(action)
        extra = copy.deepcopy(self.engines.get(action["label"]) or {})
        data["client"] = extra.pop("client", {"name": "gpufleet.inference_client", "version": "1"})
        data["server"] = {**data["server"], "vllm_version": "0.26.0", "argv": ARGV, "model_identity": IDENTITY, **extra}
        return data


@pytest.mark.parametrize("candidate, fragment", [
    (OTHER_WEIGHTS, f"model_weights: baseline '{'w' * 64}', candidate '{'v' * 64}'"),
    (OTHER_VERSION, "vllm_version: baseline '0.26.0', candidate '0.27.0'"),
    (OTHER_ARGV, "server_argv: baseline"),
    ({"client": {"name": "gpufleet.inference_client", "version": "2"}},
     "client: baseline 'gpufleet.inference_client/1', candidate 'gpufleet.inference_client/2'"),
])
def test_the_kernel_flow_refuses_a_candidate_of_another_model_engine_or_client(candidate, fragment):
    host = Engines({"candidate": candidate})
    result = drive(host)
    assert result["finish"]["decision"] == "error", result["finish"]
    assert fragment in result["finish"]["reason"] and "change 'kernel' lets nothing differ" in result["finish"]["reason"]
    assert (host.running, host.default) == (OLD, OLD)


def test_the_kernel_flow_passes_the_same_model_engine_and_client():
    host = Engines({})
    assert drive(host)["finish"]["decision"] == "pass" and host.running == host.default == NEW
    record = host.history[0]
    assert record["baseline"]["workload"]["model_weights"] == "w" * 64
    assert record["baseline"]["workload"] == record["candidate"]["workload"]


# ---- measured tuning: host stages "host", vLLM flag stages "vllm_flags" --------------------------------
PROFILE = {"name": "serving", "concurrency": [32], "prompt_tokens": 1024, "output_tokens": 128, "requests": 128}
STAGES = {
    "vllm": {"name": "seqs", "kind": "vllm", "role": "gpufleet.inference.vllm_service",
             "vars": {"vllm_service_max_num_seqs": 64}},
    "host": {"name": "irq", "role": "gpufleet.inference.irq_affinity", "vars": {"irq_affinity_policy": "local"},
             "revert": [{"role": "gpufleet.inference.irq_affinity", "vars": {"irq_affinity_state": "absent"}}]},
}


def through_the_stage(tmp_path, capsys, kind, stage_doc):
    """Start, benchmark the baseline, apply the stage and bring ``stage_doc``: the module's last answer."""
    common = {"root": str(tmp_path), "state_file": "/state.json"}
    result = run_module(tune_measured, {**common, "op": "start", "profiles": [PROFILE], "stages": [STAGES[kind]],
                                        "vllm_defaults": {"vllm_service_max_num_seqs": 0}}, capsys)
    for docs in ([document(BASE)], [], [stage_doc]):
        act = result["next"]
        result = run_module(tune_measured, {**common, "op": "complete", "action_id": act["id"], "results": docs}, capsys)
        if result.get("failed"):
            return result
    return result


def stage_of(result, kind):
    return next(s for s in result["state"]["stages"] if s["name"] == STAGES[kind]["name"])


@pytest.mark.parametrize("kind, server, refused", [
    ("vllm", OTHER_ARGV, None),  # the flags are the change under test
    ("vllm", OTHER_VERSION, "vllm_version: baseline '0.26.0', candidate '0.27.0'"),
    ("vllm", OTHER_WEIGHTS, "model_weights: baseline"),
    ("host", OTHER_ARGV, "server_argv: baseline"),
    ("host", OTHER_WEIGHTS, "model_weights: baseline"),
    ("host", {}, None),
])
def test_measured_tuning_refuses_what_the_stage_is_not_about(tmp_path, capsys, kind, server, refused):
    result = through_the_stage(tmp_path, capsys, kind, document(SAME, **server))
    if refused:
        assert result["failed"] and "different workloads" in result["msg"] and refused in result["msg"], result
        change = "vllm_flags" if kind == "vllm" else "host"
        assert f"change {change!r} lets" in result["msg"]
    else:
        assert stage_of(result, kind)["status"] == "kept", stage_of(result, kind)["reason"]


# ---- inference_benchmark against the lab server: identity, version, argv --------------------------
def test_the_benchmark_records_identity_version_and_argv(tmp_path, capsys):
    model = make_model(tmp_path / "host", where="/models/lab")
    with LabServer(model, "--work", "8", "--step-work", "32", "--max-model-len", "1024") as lab:
        args = {"url": lab.url, "prompt_tokens": 16, "output_tokens": 4, "concurrency": [1], "requests": 2, "warmup": 0,
                "repetitions": 1, "settle_runs": 0, "monitor_links": False, "server_argv": ARGV}
        result = run_module(inference_benchmark, args, capsys)
        server = result["benchmark"]["server"]
        assert server["model_identity"]["files"] == 3 and len(server["model_identity"]["weights"]) == 64
        assert server["argv"] == ARGV and isinstance(server["vllm_version"], str) and server["vllm_version"]
        assert result["server"]["model_identity"] == server["model_identity"]
        # the same directory seen under another root: not there, so unreadable, with a warning
        elsewhere = run_module(inference_benchmark, {**args, "root": str(tmp_path / "empty")}, capsys)
        assert "unreadable" in elsewhere["server"]["model_identity"]
        assert any("identity (config, tokenizer and weight files) was not read" in str(w)
                   for w in elsewhere.get("warnings", []))
        # check mode probes the same (no load)
        probe = run_module(inference_benchmark, {**args, "_ansible_check_mode": True}, capsys)
        assert probe["server"]["model_identity"] == server["model_identity"] and probe["server"]["argv"] == ARGV


def test_a_bad_server_argv_is_refused_before_any_request(capsys):
    from ansible_collections.gpufleet.inference.plugins.module_utils.bench.inference_benchmark import check_argv

    result = run_module(inference_benchmark, {"url": "http://127.0.0.1:9", "server_argv": []}, capsys)
    assert result["failed"] and result["msg"].startswith("Invalid benchmark settings: server_argv must be the vLLM "
                                                         "server's command line as a non-empty list of strings")
    for bad in ("vllm serve", ["--x", 3], [None]):
        with pytest.raises(ValueError, match="server_argv must be"):
            check_argv(bad)
    assert check_argv(None) is None and check_argv(("a", "b")) == ["a", "b"]


# ---- the vLLM flag stages' table (tests/tools/vllm_flag_stages.py, its own path to the gate): vllm_flags ------------
def flag_stage_row(candidate_server):
    from tests.tools import vllm_flag_stages as vfs

    runs = [{"output_throughput": v} for v in BASE]
    cand = [{"output_throughput": v} for v in SAME]
    records = [{"stage": "baseline", "levels": {"32": runs}, "gate": None},
               {"stage": "seqs", "changed": {"vllm_service_max_num_seqs": 64}, "levels": {"32": cand},
                "gate": {"baseline_runs": runs, "candidate_runs": cand, "baseline_workload": document(),
                         "candidate_workload": document(**candidate_server)}}]
    return vfs.stage_table(records, 32)[1]


def test_the_flag_stage_table_lets_the_argv_differ_and_nothing_else():
    assert flag_stage_row(OTHER_ARGV)["verdict"] == "pass"
    row = flag_stage_row(OTHER_VERSION)
    assert row["verdict"] == "error" and "vllm_version: baseline '0.26.0', candidate '0.27.0'" in row["error"]

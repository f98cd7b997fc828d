# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM's kernel path, read from the server's own start log. Pure functions, no I/O.

parse(text) takes what vLLM printed while starting (a log file, or the unit's journal in
``journalctl -o cat`` or ``short-iso`` form; several starts in one text are split and the last one is
read) and returns what the engine chose: platform, vLLM version, the attention backend (and the ones
it could have used), whether CUDA graphs were captured, in which modes and for which batch sizes,
torch.compile, the quantization and its kernels, the KV cache, and findings: every fallback,
emulation or failure vLLM reported, with what to do about it.

The patterns are vLLM's own messages (0.26 on CUDA, 0.32 on the CPU build, as captured in
tests/unit/plugins/module_utils/fixtures/vllm_startlog/); a message vLLM rewords is missed, not
misread: a field it would have set stays None.
"""

from __future__ import annotations

import ast
import re
from typing import Any

# "(EngineCore pid=1255) INFO 12-01 20:21:54 [cuda.py:482] message", with any journal prefix before it
_LINE = re.compile(r"(?:\((?P<proc>[A-Za-z_]+)(?:[ _]pid=\d+)?\)\s+)?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
                   r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[(?P<src>[^\]]+)\]\s(?P<msg>.*)")
_START = re.compile(r"non-default args: ")
_VERSION = re.compile(r"(?:vLLM API server version |version |LLM engine \(v)(?P<v>\d+\.\d+\.\d+[\w.+-]*)")
_BACKEND = re.compile(r"Using (?P<b>[A-Z][A-Z0-9_]+) attention backend(?: out of potential backends: (?P<pot>\[[^\]]*\]))?")
_BACKEND_PLAIN = re.compile(r"^Using (?P<b>[A-Z][A-Z0-9_]+) backend\.$")  # the CPU platform's MLA choice
_FA_VERSION = re.compile(r"Using FlashAttention version (?P<v>\d)")
_CAPTURE_SIZES = re.compile(r"'cudagraph_capture_sizes': (?P<s>\[[\d, ]*\])")
_CG_MODE = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(?P<m>[A-Z_]+)")
_CAPTURING = re.compile(r"Capturing CUDA graphs? \((?:mixed prefill-decode, |decode, )?(?P<m>[A-Z_]+)")
_CAPTURED = re.compile(r"Graph capturing finished in (?P<s>[\d.]+) secs?, took (?P<g>-?[\d.]+) GiB")
_COMPILE = re.compile(r"torch\.compile took (?P<s>[\d.]+) s in total")
_QUANT = re.compile(r"quantization=(?P<q>[\w-]+)")
_KV_DTYPE = re.compile(r"kv_cache_dtype=(?P<d>[\w-]+)")
_DEVICE = re.compile(r"device_config=(?P<d>\w+)")
_ENFORCE = re.compile(r"enforce_eager=(?P<e>True|False)")
_KERNEL = re.compile(r"(?:Using|Selected) (?P<k>\w*(?:Kernel|GEMM|Gemm|MoE|Marlin|Machete|Cutlass|CUTLASS)\w*)"
                     r"(?: (?:kernel )?for (?P<for>[\w .-]+))?")
_KV_TOKENS = re.compile(r"(?P<dev>GPU|CPU) KV cache size: (?P<t>[\d,]+) tokens")
_KV_MEM = re.compile(r"Available KV cache memory: (?P<g>[\d.]+) GiB|Explicitly set \((?P<c>[\d.]+)/[\d.]+\) GiB for KV cache")
_MAX_CONC = re.compile(r"Maximum concurrency for (?P<t>[\d,]+) tokens per request: (?P<x>[\d.]+)x")
_PLATFORM = re.compile(r"Automatically detected platform (?P<p>\w+)")
_NO_MODULE = re.compile(r"No module named '(?P<m>[\w.]+)'")
_PRELOAD = re.compile(r"(?P<lib>lib\w+) is not found in LD_PRELOAD")
_ULIMIT = re.compile(r"Found ulimit of (?P<n>\d+) and failed to automatically increase")
_MLA_PREFILL = re.compile(r"Using (?P<b>[\w ]+?) MLA prefill backend")
_MOE_BACKEND = re.compile(r"Using (?P<b>[\w ]+?) (?P<q>\w+) MoE backend out of potential backends: (?P<pot>\[[^\]]*\])")
_MOE_EXPERTS = re.compile(r"^Using (?P<e>\w+) MoE backend$")
_MOE_DEFAULT_CONFIG = re.compile(r"Using default MoE config\. .*Config file not found at (?P<path>\S+)")
_CHUNKED_OFF = re.compile(r"does not officially support disabling chunked prefill")
_JIT = re.compile(r"Triton kernel JIT compilation during inference: (?P<k>\w+)")
_FP8_KV = re.compile(r"Using fp8 data type to store kv cache")

# messages that are a fallback, an emulation or a disabled fast path, even at INFO
_SOFT = re.compile(r"fall(?:ing)? ?back|emulat|instead|not (?:available|supported)|unsupported|disabl|slow|will be ignored|"
                   r"Weight-only|does not have native support", re.IGNORECASE)


def _lines(text: str) -> list[dict[str, Any]]:
    out = []
    for raw in text.splitlines():
        raw = raw.replace("\r", "")
        m = _LINE.search(raw)
        if m:
            out.append({"proc": m["proc"], "level": m["level"], "src": m["src"], "msg": m["msg"].rstrip(), "raw": raw})
        else:
            out.append({"proc": None, "level": None, "src": None, "msg": raw.rstrip(), "raw": raw})
    return out


def split_starts(text: str) -> list[str]:
    """The text of each server start (a start begins at vLLM's ``non-default args:`` line)."""
    lines = text.splitlines()
    marks = [i for i, ln in enumerate(lines) if _START.search(ln)]
    if not marks:
        return [text] if text.strip() else []
    # the banner lines just before the first mark belong to that start
    starts = [0] + marks[1:]
    return ["\n".join(lines[a:b]) for a, b in zip(starts, starts[1:] + [len(lines)])]


def _finding(fid: str, severity: str, message: str, fix: str, line: str | None = None) -> dict[str, Any]:
    return {"id": fid, "severity": severity, "message": message, "fix": fix, "line": line}


def _empty(starts: int) -> dict[str, Any]:
    """The kernel path before any line is read (``starts``: how many starts the text held)."""
    return {
        "starts": starts, "version": None, "platform": None, "attention_backend": None,
        "attention_candidates": None, "flash_attention_version": None, "enforce_eager": None,
        "cuda_graphs": {"mode": None, "captured": False, "capture_modes": [], "capture_sizes": None, "seconds": None,
                        "memory_gib": None},
        "torch_compile_s": None, "quantization": None, "kv_cache_dtype": None, "kernels": [],
        "mla_prefill_backend": None,
        "moe": {"backend": None, "candidates": None, "quantization": None, "experts": None, "config": None,
                "config_missing": None, "jit_kernels": []},
        "kv_cache": {"tokens": None, "memory_gib": None, "max_concurrency": None, "for_tokens": None},
        "started": False, "failed": False, "error": None, "findings": []}


def _config_line(msg: str, res: dict[str, Any]) -> None:
    """What the engine's ``with config:`` line says: device, quantization, KV cache dtype, eager mode, CUDA graphs."""
    if (m := _DEVICE.search(msg)):
        res["platform"] = res["platform"] or m["d"]
    if (m := _QUANT.search(msg)):
        res["quantization"] = None if m["q"] == "None" else m["q"]
    if (m := _KV_DTYPE.search(msg)):
        res["kv_cache_dtype"] = m["d"]
    if (m := _ENFORCE.search(msg)):
        res["enforce_eager"] = m["e"] == "True"
    if (m := _CAPTURE_SIZES.search(msg)):
        res["cuda_graphs"]["capture_sizes"] = ast.literal_eval(m["s"])
    if (m := _CG_MODE.search(msg)):
        res["cuda_graphs"]["mode"] = m["m"]


def _path_line(ln: dict[str, Any], res: dict[str, Any], errors: list[str]) -> None:
    """What one other line says of the kernel path (backend, CUDA graphs, compile, kernels, KV cache), of the start's
    outcome, and the exception it names (added to ``errors``)."""
    msg, raw, cg = ln["msg"], ln["raw"], res["cuda_graphs"]
    if (m := _BACKEND.search(msg)):
        res["attention_backend"] = m["b"]
        if m["pot"]:
            res["attention_candidates"] = ast.literal_eval(m["pot"])
    elif (m := _BACKEND_PLAIN.search(msg)):
        res["attention_backend"] = m["b"]
    if (m := _FA_VERSION.search(msg)):
        res["flash_attention_version"] = int(m["v"])
    _moe_line(msg, res)
    for m in _CAPTURING.finditer(raw):
        if m["m"] not in cg["capture_modes"]:
            cg["capture_modes"].append(m["m"])
    if (m := _CAPTURED.search(msg)):
        cg.update(captured=True, seconds=float(m["s"]), memory_gib=float(m["g"]))
    if (m := _COMPILE.search(msg)):
        res["torch_compile_s"] = float(m["s"])
    if (m := _KERNEL.search(msg)) and "attention backend" not in msg:
        entry = {"kernel": m["k"], "for": (m["for"] or "").strip() or None}
        if entry not in res["kernels"]:
            res["kernels"].append(entry)
    if (m := _KV_TOKENS.search(msg)):
        res["kv_cache"]["tokens"] = int(m["t"].replace(",", ""))
    if (m := _KV_MEM.search(msg)):
        res["kv_cache"]["memory_gib"] = float(m["g"] or m["c"])
    if (m := _MAX_CONC.search(msg)):
        res["kv_cache"].update(max_concurrency=float(m["x"]), for_tokens=int(m["t"].replace(",", "")))
    if "Application startup complete" in msg or "Starting vLLM API server" in msg or "Starting vLLM server on" in msg:
        res["started"] = True
    if "EngineCore failed to start" in msg or "Engine core initialization failed" in msg:
        res["failed"] = True
    if re.match(r"[\w.]*(Error|Exception): ", msg.strip()) and not msg.startswith("Traceback"):
        errors.append(msg.strip())


def _moe_line(msg: str, res: dict[str, Any]) -> None:
    """The MLA prefill backend and the fused-MoE path: backend and its candidates, the experts' kernel, whether a
    tuned config for this GPU was found, and Triton kernels compiled while serving."""
    moe = res["moe"]
    if (m := _MLA_PREFILL.search(msg)):
        res["mla_prefill_backend"] = m["b"].strip()
    if (m := _MOE_BACKEND.search(msg)):
        moe.update(backend=m["b"].strip(), quantization=m["q"].lower(), candidates=ast.literal_eval(m["pot"]))
    if (m := _MOE_EXPERTS.search(msg.strip())):
        moe["experts"] = m["e"]
    if (m := _MOE_DEFAULT_CONFIG.search(msg)):
        moe.update(config="default", config_missing=m["path"])
    if (m := _JIT.search(msg)) and m["k"] not in moe["jit_kernels"]:
        moe["jit_kernels"].append(m["k"])
    if moe["backend"] and moe["config"] is None and "Using configuration from" in msg and "fused_moe" in msg:
        moe["config"] = "tuned"


def parse(text: str) -> dict[str, Any]:
    """The kernel path of the last start in ``text``; see the module docstring."""
    starts = split_starts(text or "")
    res = _empty(len(starts))
    findings = res["findings"]
    seen: set[tuple[str, str]] = set()

    def add(f: dict[str, Any]) -> None:
        key = (f["id"], f["message"])
        if key not in seen:
            seen.add(key)
            findings.append(f)

    errors: list[str] = []
    for ln in _lines(starts[-1] if starts else ""):
        msg = ln["msg"]
        if res["version"] is None and (m := _VERSION.search(msg)):
            res["version"] = m["v"]
        if (m := _PLATFORM.search(msg)):
            res["platform"] = m["p"]
        if "with config:" in msg:
            _config_line(msg, res)
            continue
        _path_line(ln, res, errors)
        _line_findings(ln, add)
    if res["failed"] or (errors and not res["started"]):
        res["failed"] = True
        res["error"] = errors[-1] if errors else "the engine did not start (no exception line in the log)"
        add(_error_finding(res["error"]))
    if res["platform"] == "cpu" and res["attention_backend"] is None and res["started"]:
        res["attention_backend"] = "CPU_ATTN"  # vllm/platforms/cpu.py: the only non-MLA backend, chosen silently
    _config_findings(res, add)
    return res


def _error_finding(error: str) -> dict[str, Any]:
    m = _NO_MODULE.search(error)
    if m and m["m"].split(".")[0] == "flashinfer":
        return _finding("missing_flashinfer", "error", f"the engine failed to start: {error}",
                        "install flashinfer in vLLM's venv (vllm_service_pip_extra_args / the wheelhouse), or set "
                        "vllm_service_env: {VLLM_USE_FLASHINFER_SAMPLER: '0'} so the sampler does not import it")
    if m:
        return _finding("missing_module", "error", f"the engine failed to start: {error}",
                        f"install {m['m'].split('.')[0]} in vLLM's venv (the wheelhouse lacks it)")
    return _finding("engine_failed", "error", f"the engine failed to start: {error}",
                    "read the traceback above this line in the server's log; fix what it names and restart")


def _line_findings(ln: dict[str, Any], add) -> None:
    msg, level = ln["msg"], ln["level"]
    if (m := _ULIMIT.search(msg)):
        add(_finding("nofile_limit", "warning", f"vLLM could not raise its open-file limit above {m['n']}",
                     "raise the hard limit the service starts under (vllm_service_limit_nofile, LimitNOFILE=, and the "
                     "host's or container's hard limit): many concurrent clients need one descriptor each", ln["raw"]))
        return
    if (m := _PRELOAD.search(msg)):
        add(_finding(f"cpu_preload_{m['lib']}", "warning", f"vLLM's CPU build runs without {m['lib']} preloaded",
                     f"preload it through vllm_service_env (LD_PRELOAD: the path of {m['lib']}, e.g. from the "
                     "libtcmalloc-minimal4 / libomp packages), as vLLM's CPU install guide asks", ln["raw"]))
        return
    if _moe_finding(ln, add) or _kv_finding(ln, add):
        return
    if _CHUNKED_OFF.search(msg):
        add(_finding("chunked_prefill_off_unsupported", "warning",
                     "chunked prefill is off and vLLM warns that this model does not support that: the engine may "
                     "crash or give wrong outputs",
                     "remove vllm_service_enable_chunked_prefill: false (vLLM's scheduler is built around chunked "
                     "prefill; lower vllm_service_max_num_batched_tokens instead to bound the decode stalls of long "
                     "prompts); if it must stay, judge the outputs with gpufleet.inference.output_equivalence first",
                     ln["raw"]))
        return
    if "FlashInfer top-p/top-k sampling disabled" in msg:
        add(_finding("sampler_flashinfer_off", "info", "top-p/top-k sampling runs in PyTorch, not FlashInfer",
                     "install flashinfer and unset VLLM_USE_FLASHINFER_SAMPLER for the faster sampler (only matters "
                     "for requests with top_p/top_k)", ln["raw"]))
        return
    if "Enforce eager set" in msg or "Cudagraph is disabled under eager mode" in msg:
        return  # reported once from the configuration (cuda_graphs_off)
    soft = bool(_SOFT.search(msg))
    if level != "WARNING" and not (level == "INFO" and soft):
        return  # ERROR lines are the traceback of a failed start: one engine_failed finding covers them
    fid = "emulation" if re.search(r"emulat|Weight-only|does not have native support", msg, re.IGNORECASE) else \
        ("fallback" if soft else "warning")
    fix = {"emulation": "use a quantization the GPU runs natively (FP8 needs compute capability 8.9 or newer), or a "
                        "GPU that has it",
           "fallback": "read the line: vLLM names the faster path it did not take and why",
           "warning": "read the line in the server's log"}[fid]
    add(_finding(fid, "warning" if level == "WARNING" and soft else "info", f"{ln['src']}: {msg}", fix, ln["raw"]))


def _moe_finding(ln: dict[str, Any], add) -> bool:
    """A fused-MoE layer without a tuned config for this GPU, or a Triton kernel compiled while serving."""
    msg = ln["msg"]
    if (m := _MOE_DEFAULT_CONFIG.search(msg)):
        name = m["path"].rsplit("/", 1)[-1]
        add(_finding("moe_config_missing", "warning",
                     f"the fused-MoE layers run on vLLM's default Triton config: no tuned {name} for this GPU and expert "
                     "shape (sub-optimal, vLLM says)",
                     f"tune it on this GPU with vLLM's benchmarks/kernels/benchmark_moe.py --tune (from the source tree of "
                     f"the installed vLLM version), then put {name} in a folder and set vllm_service_env "
                     "{VLLM_TUNED_CONFIG_FOLDER: that folder}; re-run the benchmark to keep it only if it helps", ln["raw"]))
        return True
    if (m := _JIT.search(msg)):
        add(_finding("jit_while_serving", "info",
                     f"Triton compiled {m['k']} while serving: the first requests of a new shape wait for it (a latency "
                     "spike, and a slow first benchmark run)",
                     "warm the server up on the shapes it will serve before measuring (inference_benchmark's warm-up "
                     "requests; the gate's first runs), and tune the MoE config for this GPU", ln["raw"]))
        return True
    return False


def _kv_finding(ln: dict[str, Any], add) -> bool:
    """An FP8 KV cache without calibrated scales: outputs can move; judge them before keeping it."""
    if not _FP8_KV.search(ln["msg"]):
        return False
    add(_finding("kv_cache_fp8", "info",
                 "the KV cache is stored in FP8; vLLM warns it may cost accuracy without a proper scaling factor",
                 "judge the outputs with gpufleet.inference.output_equivalence against a reference recorded with the "
                 "KV cache at auto (a checkpoint with calibrated k/v scales moves them least); keep it only within "
                 "the tolerance you accept", ln["raw"]))
    return True


def _config_findings(res: dict[str, Any], add) -> None:
    cg = res["cuda_graphs"]
    gpu = res["platform"] == "cuda"
    if gpu and (res["enforce_eager"] or cg["mode"] == "NONE"):
        add(_finding("cuda_graphs_off", "warning",
                     "CUDA graphs are off (--enforce-eager or cudagraph_mode NONE): every decode step launches its "
                     "kernels one by one (0.28x the throughput on the H200 at c=64, docs/gpu_h200.md)",
                     "remove --enforce-eager from vllm_service_extra_args unless a model needs it"))
    elif gpu and res["started"] and not cg["captured"]:
        add(_finding("cuda_graphs_not_captured", "warning", "the engine started but no CUDA graph capture was logged",
                     "check the compilation config in the log (cudagraph_mode) and that the GPU had memory left"))
    cands = res["attention_candidates"] or []
    if gpu and res["attention_backend"] and cands and res["attention_backend"] != cands[0]:
        add(_finding("attention_fallback", "warning",
                     f"attention runs on {res['attention_backend']}, not {cands[0]} (the first of {cands})",
                     f"check why {cands[0]} was skipped (the lines before the choice); install its kernels"))
    moe = res["moe"]
    if gpu and moe["backend"] and moe["candidates"] and moe["backend"] != moe["candidates"][0]:
        add(_finding("moe_backend_fallback", "warning",
                     f"the fused-MoE layers run on {moe['backend']}, not {moe['candidates'][0]} (the first of "
                     f"{moe['candidates']})", f"check why {moe['candidates'][0]} was skipped (the lines before the choice)"))
    if gpu and res["attention_backend"] in ("TRITON_ATTN", "FLEX_ATTENTION", "TORCH_SDPA"):
        add(_finding("attention_slow_backend", "warning", f"attention runs on {res['attention_backend']} on a GPU",
                     "install vLLM's FlashAttention build for this GPU (vllm_flash_attn) or FlashInfer"))
    if gpu and res["attention_backend"] == "FLASH_ATTN" and res["flash_attention_version"] == 2:
        add(_finding("flash_attention_2", "info", "FlashAttention 2 is in use (Hopper runs version 3 where built)",
                     "on H100/H200 use a vLLM build with FlashAttention 3"))

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_ready
short_description: Prove that a vLLM (OpenAI-compatible) service serves
version_added: 0.1.0
description:
  - Waits for C(/health) to answer 200, then checks that C(/v1/models) lists O(served_model_name), sends one real
    completion and checks that tokens come back, and that C(/metrics) exports vLLM's metrics.
  - While waiting it watches the systemd O(unit) and fails at once when the unit fails or restarts (a crash loop does
    not wait out O(timeout)).
  - Every failure message ends with the unit's last O(journal_lines) journal lines, so the cause (a missing library,
    a bad flag, out of memory) shows in the Ansible output.
  - With O(start_log) or O(start_log_journal) it also reads vLLM's kernel path from the server's own start log (the
    attention backend, whether CUDA graphs were captured and for which batch sizes, torch.compile, quantization and
    its kernels, the KV cache) and reports every fallback, emulation or start failure as a finding with its fix, on
    every host, the CPU build included. Findings of severity warning or error are also Ansible warnings; they never
    fail the module.
  - Never changes the host.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common.attributes_readonly
options:
  url:
    description: Base URL of the service, as seen from the host.
    type: str
    default: http://127.0.0.1:8000
  served_model_name:
    description: The name C(/v1/models) must list; the completion is sent to it.
    type: str
    required: true
  api_key:
    description: The service's API key, sent as a Bearer token. Never logged.
    type: str
  unit:
    description: The systemd unit, watched while waiting and read for the journal.
    type: str
  timeout:
    description: Seconds to wait for C(/health), from 1 to 86400.
    type: int
    default: 600
  interval:
    description: Seconds between C(/health) attempts, from 0.01 to 300.
    type: float
    default: 2.0
  request_timeout:
    description: Seconds for each HTTP request (the completion may be the first one through the engine), from 1 to 3600.
    type: int
    default: 120
  checks:
    description: What to prove. V(health) is always done first.
    type: list
    elements: str
    choices: [health, models, completion, metrics]
    default: [health, models, completion, metrics]
  prompt:
    description: The completion's prompt.
    type: str
    default: "The capital of France is"
  max_tokens:
    description: Tokens to ask for, from 1 to 4096.
    type: int
    default: 4
  journal_lines:
    description: Journal lines shown on failure, from 0 to 100000.
    type: int
    default: 50
  start_log:
    description:
      - A file vLLM's output goes to (a unit's C(StandardOutput=append:) file, a container's log); its last start is
        read for RV(kernel_path).
    type: path
  start_log_journal:
    description:
      - Read RV(kernel_path) from the journal of O(unit) (C(journalctl -u UNIT -o cat)); its last start is read.
    type: bool
    default: false
  start_log_lines:
    description: How many journal lines O(start_log_journal) reads (the start must lie within them), from 1 to 1000000.
    type: int
    default: 20000
"""

EXAMPLES = r"""
- name: Prove the service serves
  gpufleet.inference.vllm_ready:
    url: http://127.0.0.1:8000
    served_model_name: deepseek-v3
    api_key: "{{ vllm_service_api_key }}"
    unit: vllm.service
    timeout: 1800
  register: ready

- name: Readiness of a stand-in server that has no /metrics
  gpufleet.inference.vllm_ready:
    served_model_name: tiny
    unit: vllm.service
    checks: [health, models, completion]

- name: Readiness, and the kernel path vLLM chose, from its journal
  gpufleet.inference.vllm_ready:
    served_model_name: tiny
    unit: vllm.service
    start_log_journal: true
  register: ready

- name: Show the attention backend and the CUDA graph sizes
  ansible.builtin.debug:
    msg: "{{ ready.kernel_path.attention_backend }} {{ ready.kernel_path.cuda_graphs.capture_sizes }}"
"""

RETURN = r"""
actions:
  description: Always empty; the module changes nothing.
  returned: always
  type: list
  elements: dict
  sample: []
seconds_to_healthy:
  description: Seconds until C(/health) answered 200.
  returned: success
  type: float
  sample: 41.3
models:
  description: The ids C(/v1/models) lists.
  returned: success
  type: list
  elements: str
  sample: [tiny-llama]
completion:
  description: The completion's text, finish reason and token count.
  returned: success
  type: dict
  sample: {text: " editor provisionally", finish_reason: length, completion_tokens: 4, seconds: 0.21}
metrics:
  description: How many C(vllm:) metric samples C(/metrics) exported, or null when not checked.
  returned: success
  type: int
  sample: 212
kernel_path:
  description:
    - What vLLM's last start in the log chose, or null without O(start_log) and O(start_log_journal). Fields the log
      does not show are null.
  returned: always
  type: dict
  contains:
    version:
      description: "vLLM's version."
      type: str
    platform:
      description: "The platform vLLM ran on (C(cuda), C(cpu), ...)."
      type: str
    starts:
      description: "How many starts the text held (the last is read)."
      type: int
    attention_backend:
      description: "The attention backend chosen (C(FLASH_ATTN), C(TRITON_ATTN), C(CPU_ATTN), ...)."
      type: str
    attention_candidates:
      description: "The backends vLLM chose from, in its order of preference."
      type: list
      elements: str
    flash_attention_version:
      description: "FlashAttention's version when FLASH_ATTN is used."
      type: int
    enforce_eager:
      description: "Whether --enforce-eager was set."
      type: bool
    cuda_graphs:
      description: "C(mode) (CUDAGraphMode), C(captured), C(capture_modes), C(capture_sizes) (batch sizes), C(seconds), C(memory_gib)."
      type: dict
    torch_compile_s:
      description: "Seconds torch.compile took."
      type: float
    quantization:
      description: "The quantization method, null for none."
      type: str
    kv_cache_dtype:
      description: "The KV cache's data type."
      type: str
    kernels:
      description: "Linear, MoE and quantization kernels the log names (C(kernel), C(for))."
      type: list
      elements: dict
    mla_prefill_backend:
      description: "The prefill backend of MLA attention (DeepSeek-V2/V3-class models), e.g. C(FLASH_ATTN); null otherwise."
      type: str
    moe:
      description:
        - "The fused-MoE path (MoE models): C(backend) and C(candidates) (vLLM's order of preference), C(quantization),
          C(experts) (the experts' kernel, e.g. C(TritonExperts)), C(config) (V(default) when no tuned config for this GPU
          and expert shape was found, with its expected path in C(config_missing)), C(jit_kernels) (Triton kernels compiled
          while serving). All null or empty for a dense model."
      type: dict
    kv_cache:
      description: "C(tokens), C(memory_gib), C(max_concurrency) at C(for_tokens) tokens per request."
      type: dict
    started:
      description: "Whether the log shows the server started."
      type: bool
    failed:
      description: "Whether the log shows the engine failed to start."
      type: bool
    error:
      description: "The exception that stopped the start, or null."
      type: str
    findings:
      description:
        - "Fallbacks, emulations and failures, each with C(id), C(severity) (info, warning, error), C(message), C(fix), C(line)."
        - "Among the ids: C(moe_config_missing) (no tuned fused-MoE config for this GPU; the fix names vLLM's
          benchmark_moe.py --tune and VLLM_TUNED_CONFIG_FOLDER), C(moe_backend_fallback), C(jit_while_serving),
          C(kv_cache_fp8) (judge the outputs with output_equivalence), C(attention_fallback), C(cuda_graphs_off)."
      type: list
      elements: dict
  sample:
    version: 0.26.0
    platform: cuda
    attention_backend: FLASH_ATTN
    attention_candidates: [FLASH_ATTN, TRITON_ATTN, FLEX_ATTENTION]
    flash_attention_version: 3
    cuda_graphs: {mode: FULL_AND_PIECEWISE, captured: true, capture_modes: [PIECEWISE, FULL], capture_sizes: [1, 2, 4, 8], seconds: 3.0, memory_gib: 0.33}
    findings:
      - {id: nofile_limit, severity: warning, message: vLLM could not raise its open-file limit above 20000, fix: raise the hard limit}
unit:
  description: The unit's state when the checks passed.
  returned: success
  type: dict
  sample: {ActiveState: active, SubState: running, MainPID: "4242", NRestarts: "0"}
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.vllm.vllm_ready import NotReady, execute

ARGUMENT_SPEC = dict(
    url=dict(type="str", default="http://127.0.0.1:8000"),
    served_model_name=dict(type="str", required=True),
    api_key=dict(type="str", no_log=True),
    unit=dict(type="str"),
    timeout=dict(type="int", default=600),
    interval=dict(type="float", default=2.0),
    request_timeout=dict(type="int", default=120),
    checks=dict(type="list", elements="str", choices=["health", "models", "completion", "metrics"],
                default=["health", "models", "completion", "metrics"]),
    prompt=dict(type="str", default="The capital of France is"),
    max_tokens=dict(type="int", default=4, no_log=False),
    journal_lines=dict(type="int", default=50),
    start_log=dict(type="path"),
    start_log_journal=dict(type="bool", default=False),
    start_log_lines=dict(type="int", default=20000),
)


def main():
    run_module(ModuleSpec("vllm_ready", ARGUMENT_SPEC, "reads the unit's state and journal and the start log", (NotReady,)),
               execute)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: output_equivalence
short_description: Record what a vLLM server answers on a fixed prompt set, and judge a later server against it
version_added: 0.2.0
description:
  - O(mode=record) sends the collection's fixed prompt set (64 prompts, short, medium and 2-3k words long, completion
    and chat-shaped) to a running OpenAI-compatible server one at a time, greedy (temperature 0, a fixed O(seed),
    O(max_tokens) tokens, C(ignore_eos)), and stores the generated token IDs and their logprobs in the O(reference) file
    on the host, written atomically. It then runs the comparison against the same server (an A/A) and stores that
    band with the reference.
  - O(mode=compare) scores the reference continuation under the server now running (teacher-forced, vLLM's
    C(prompt_logprobs)) and generates greedily again; it returns per prompt and overall the top-1 agreement on the
    reference tokens, the mean and p99 absolute logprob difference and the first divergence of the greedy text, and
    the RV(verdict) V(equivalent) (within the A/A band), V(drifted) (beyond it, within the tolerance) or V(diverged).
  - Bad or missing logprobs, a server that refuses a prompt, a reference recorded for another model (another served
    name, model path or tokenizer) or with another prompt set fail the task with the reason.
  - The prompt set ships inside the collection (module_utils C(bench/prompts.py), generated from a seeded word list);
    docs/benchmark.md explains the scoring, the A/A band and how to set the tolerance.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: >-
      O(mode=record) asks the server for its model list only and writes nothing, RV(actions) saying what it would
      write; O(mode=compare) writes nothing in any mode and runs in full.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
options:
  url:
    description: Base URL of the server (C(http) or C(https), host and port).
    type: str
    default: http://127.0.0.1:8000
  model:
    description: The served model name (vLLM's C(--served-model-name)).
    type: str
    required: true
  api_key:
    description: The server's API key (C(VLLM_API_KEY)), sent as a bearer token.
    type: str
  mode:
    description: V(record) a reference, or V(compare) the server with one.
    type: str
    choices: [record, compare]
    default: compare
  reference:
    description: The reference file on the host (JSON), under O(root); absolute path.
    type: path
    required: true
  overwrite:
    description: In O(mode=record), replace an existing reference; when false an existing one is kept and nothing is recorded.
    type: bool
    default: false
  max_tokens:
    description: Tokens generated per prompt in O(mode=record), 1-1024 (O(mode=compare) uses the reference's).
    type: int
    default: 32
  seed:
    description: The sampling seed sent with every request, 0-2147483647 (greedy decoding does not use it; it is fixed anyway).
    type: int
    default: 0
  prompt_lengths:
    description:
      - Which length classes of the prompt set to record. The long prompts need a context of about 4.5k tokens with a
        BPE tokenizer; leave V(long) out for a model with a shorter C(--max-model-len). O(mode=compare) uses the reference's.
    type: list
    elements: str
    choices: [short, medium, long]
    default: [short, medium, long]
  timeout:
    description: Seconds one request may take, 1-3600.
    type: float
    default: 300
  validate_certs:
    description: Verify the server's TLS certificate for an C(https) O(url).
    type: bool
    default: true
  tolerance_top1:
    description: The lowest top-1 agreement, 0-1, that is V(drifted) rather than V(diverged).
    type: float
    default: 0.9
  tolerance_mean_logprob:
    description: The highest mean absolute logprob difference (nats), 0-100, that is V(drifted) rather than V(diverged).
    type: float
    default: 0.1
  tolerance_p99_logprob:
    description: The highest p99 absolute logprob difference (nats), 0-100, that is V(drifted) rather than V(diverged).
    type: float
    default: 1.0
  aa_margin_top1:
    description:
      - In O(mode=record), how far below the A/A top-1 agreement the band reaches at least, 0-1 (the A/A figure's own
        95% interval when it is wider).
    type: float
    default: 0.005
  aa_margin_logprob:
    description:
      - In O(mode=record), nats added at least to the A/A mean and p99 absolute logprob differences for the band,
        0-100 (the mean's own 95% interval when it is wider).
    type: float
    default: 0.01
notes:
  - Requests go one at a time so that every prompt runs at batch 1 in both modes; record takes three requests per prompt
    and compare two.
  - vLLM 0.10.2 or later (C(return_token_ids) and C(prompt_logprobs) on C(/v1/completions)); the lab stand-in
    C(extras/lab_inference_server.py) answers the same.
seealso:
  - module: gpufleet.inference.inference_benchmark
  - module: gpufleet.inference.throughput_gate
"""

EXAMPLES = r"""
- name: Record the reference before the kernel upgrade
  gpufleet.inference.output_equivalence:
    url: http://127.0.0.1:8000
    model: llama-3.1-8b
    api_key: "{{ vllm_api_key }}"
    mode: record
    reference: /var/lib/gpufleet/output-reference.json

- name: Judge the server after the upgrade
  gpufleet.inference.output_equivalence:
    url: http://127.0.0.1:8000
    model: llama-3.1-8b
    api_key: "{{ vllm_api_key }}"
    reference: /var/lib/gpufleet/output-reference.json
    tolerance_top1: 0.95
  register: outputs

- name: Stop on diverged outputs
  ansible.builtin.fail:
    msg: "outputs {{ outputs.verdict }}: {{ outputs.reason }}"
  when: outputs.verdict == 'diverged'
"""

RETURN = r"""
verdict:
  description:
    - V(equivalent), V(drifted) or V(diverged) in O(mode=compare); null in O(mode=record) (the A/A it measured is RV(aa)).
  returned: always
  type: str
  sample: equivalent
reason:
  description: Why, with the figures beyond a limit.
  returned: always
  type: str
figures:
  description:
    - Overall figures (in O(mode=record), the A/A's), C(top1_agreement) with C(top1_agreement_ci95) (Wilson, over tokens), C(mean_abs_logprob_diff)
      with C(mean_abs_logprob_diff_ci95) (t interval over prompts), C(p99_abs_logprob_diff), C(max_abs_logprob_diff),
      C(prompts), C(tokens), C(prompts_forked) and C(first_divergence_min) of the greedy text.
  returned: when a comparison ran
  type: dict
per_prompt:
  description:
    - Per prompt C(id), C(tokens), C(top1_agree), C(top1_agreement), C(mean_abs_logprob_diff), C(max_abs_logprob_diff),
      C(first_divergence) (null when the greedy text did not fork).
  returned: when a comparison ran
  type: list
  elements: dict
band:
  description: The A/A band of the reference (C(top1_agreement_min), C(mean_abs_logprob_diff_max), C(p99_abs_logprob_diff_max)).
  returned: when a comparison ran
  type: dict
aa:
  description: The A/A figures measured when the reference was recorded.
  returned: when a comparison ran
  type: dict
tolerance:
  description: The limits of V(drifted), from the tolerance options.
  returned: in O(mode=compare)
  type: dict
actions:
  description: What was or would be written; each C(action=write) with the C(path) and C(model).
  returned: always
  type: list
  elements: dict
mode:
  description: The mode that ran.
  returned: always
  type: str
reference:
  description: The reference file.
  returned: always
  type: str
model:
  description: The served model name.
  returned: always
  type: str
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.equivalence import EquivalenceError
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.output_equivalence import execute

ARGUMENT_SPEC = dict(
    url=dict(type="str", default="http://127.0.0.1:8000"),
    model=dict(type="str", required=True),
    api_key=dict(type="str", no_log=True),
    mode=dict(type="str", choices=["record", "compare"], default="compare"),
    reference=dict(type="path", required=True),
    overwrite=dict(type="bool", default=False),
    max_tokens=dict(type="int", default=32, no_log=False),
    seed=dict(type="int", default=0),
    prompt_lengths=dict(type="list", elements="str", choices=["short", "medium", "long"],
                        default=["short", "medium", "long"]),
    timeout=dict(type="float", default=300.0),
    validate_certs=dict(type="bool", default=True),
    tolerance_top1=dict(type="float", default=0.9),
    tolerance_mean_logprob=dict(type="float", default=0.1),
    tolerance_p99_logprob=dict(type="float", default=1.0),
    aa_margin_top1=dict(type="float", default=0.005),
    aa_margin_logprob=dict(type="float", default=0.01),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("output_equivalence", ARGUMENT_SPEC,
                          "asks the server for completions and reads or writes the reference file", (EquivalenceError,)),
               execute)


if __name__ == "__main__":
    main()

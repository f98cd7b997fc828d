#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: inference_benchmark
short_description: Benchmark an OpenAI-compatible inference server (vLLM) with a streaming concurrency sweep
version_added: 0.1.0
description:
  - Runs a closed-loop benchmark against the C(/v1/completions) endpoint of an OpenAI-compatible server such as vLLM, from
    the target host, with a client written on the Python standard library (asyncio, raw HTTP/1.1 with keep-alive).
  - Every request streams (C(stream=true)) a fixed-seed prompt of exactly O(prompt_tokens) token IDs (or words, see
    O(prompt_mode)) and asks for exactly O(output_tokens) tokens (C(ignore_eos)), with greedy sampling and usage in the stream.
  - O(profile) sends other workloads, each seeded (the same profile and seed send the same requests) - a shared system
    prompt (and multi-turn conversations), lengths drawn from chat-like or document-like distributions, long-context
    prompts capped by the server's C(max_model_len) - O(arrivals) an open loop of Poisson or gamma arrivals at a rate,
    and O(goodput) the share and tok/s of the requests that met TTFT and TPOT targets.
  - For each level of O(concurrency) it sends O(warmup) requests that are not counted, then O(repetitions) runs of
    O(requests) requests each, keeping that many requests in flight (a closed loop).
  - Reports per run output tokens/s, requests/s, TTFT, TPOT, inter-token latency (ITL) and end-to-end latency as mean,
    p50, p90 and p99, and the errors by reason; per level the spread of the runs' output tokens/s (the samples the
    M(gpufleet.inference.throughput_gate) module and filter judge).
  - The request is the one C(vllm bench serve) and real clients send (usage in the final chunk only), so the server does
    no extra work for the benchmark; O(per_chunk_usage) asks for per-chunk counts, for exact ITL when one streamed chunk
    carries several tokens (see the notes).
  - With O(results_dir) it stores the results as JSON on the host, with the kernel release (C(uname -r)) and the O(tuning)
    the caller says the host was in.
  - Fails with a clear message before sending load when the server cannot be reached, refuses the API key, does not serve
    O(model), cannot fit O(prompt_tokens) + O(output_tokens), or rejects the request format.
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - Python 3.8 or later on the target (standard library only).
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: partial
    details:
      - In check mode the module validates every option and asks the server for its models (C(GET /v1/models)), but sends
        no benchmark load and writes no file. A benchmark saturates the server, and C(--check) must not degrade a
        production fleet. Set C(check_mode=false) on the task to benchmark during a check run.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
options:
  url:
    description:
      - Base URL of the server, C(http://HOST:PORT) or C(https://HOST:PORT). A trailing C(/v1) is accepted and dropped.
    type: str
    default: http://127.0.0.1:8000
  model:
    description: Model name to request. Defaults to the first model the server lists in C(/v1/models).
    type: str
  api_key:
    description: Bearer token for the server (vLLM C(--api-key) or C(VLLM_API_KEY)).
    type: str
  prompt_tokens:
    description: Prompt length in tokens.
    type: int
    default: 1024
  output_tokens:
    description: Tokens to generate per request (C(max_tokens)). With O(ignore_eos) every request generates exactly this many.
    type: int
    default: 128
  concurrency:
    description: Concurrency levels of the sweep; at each, this many requests are kept in flight.
    type: list
    elements: int
    default: [8, 32]
  requests:
    description:
      - Requests in each measured run. Must be at least the largest concurrency level; several times that gives a steady
        state. Runs of a few seconds are too noisy for a 5% gate (see docs/benchmark.md).
    type: int
    default: 128
  warmup:
    description: Requests sent at each level before its measured runs and not counted.
    type: int
    default: 32
  repetitions:
    description: Measured runs per concurrency level. The throughput gate needs at least 5 per side by default.
    type: int
    default: 5
  settle_runs:
    description:
      - After the O(warmup) requests, at most this many whole runs of O(requests) requests that are not counted, until
        two in a row agree within O(settle_tolerance). A server that was just started (the reboot into a new kernel) is
        slower until it has seen every batch shape, and runs measured then rise one after the other and make a
        throughput gate see a regression that is not there.
      - The result holds each level's warm-up runs (C(settle)); a level that never settled is warned about. V(0) turns
        this off; V(1) is refused (one run cannot be compared).
    type: int
    default: 3
  settle_tolerance:
    description: Largest difference between two warm-up runs in a row, as a fraction of the larger, that counts as settled.
    type: float
    default: 0.05
  monitor_load:
    description:
      - During every measured run, read the server's own in-flight count from C(/metrics) (vLLM's
        C(vllm:num_requests_running) + C(vllm:num_requests_waiting)) about five times a second, on a connection of its
        own. A run in which the server held more requests than this client sent is marked contaminated (foreign load);
        its run has C(server_load), RV(contaminated) lists it, and the kernel upgrade's gate answers C(inconclusive).
    type: bool
    default: true
  monitor_links:
    description:
      - During every measured run, read the PCIe link (speed and width, sysfs) of every GPU (class C(03xx), BMC display
        functions left out) and of the bridges above it twice a second. A link that changed speed after training up, or
        changed width, during a run is flapping (a marginal slot, riser or cable). The run's C(server_load.links) says
        so, RV(link_flapping) lists it with its tokens/s, and the module warns; M(gpufleet.inference.bench_history)
        stores it with the run. A link that only trains up as the load starts (NVIDIA GPUs slow an idle link) is no
        finding.
      - Read-only sysfs reads (two small files per device per sample). A host without a GPU under C(/sys/bus/pci) is
        benchmarked without sampling; RV(links_monitored) lists the devices sampled.
    type: bool
    default: true
  profile:
    version_added: 0.3.0
    description:
      - The workload profile, which requests each run sends (docs/benchmark.md, "Workload profiles", says when to use
        which). Every profile is seeded by O(seed), so the same profile and seed always send the same requests.
      - V(random), unique prompts of O(prompt_tokens) and outputs of O(output_tokens), for raw throughput (a prefix
        cache can never hit).
      - V(shared_prefix), a system prompt of C(prefix_tokens) shared by every request, then a unique part of
        O(prompt_tokens); with C(turns) above 1, multi-turn conversations whose every turn resends the conversation so
        far (the earlier turns and stand-in answers of O(output_tokens)) plus a new user turn. What prefix caching speeds up.
      - V(mixed_lengths), prompt and output lengths drawn per request from seeded log-normal distributions, preset
        C(chat) (prompts median 256, 16-2048; outputs median 192, 16-1024) or C(document) (prompts median 3072,
        512-8192; outputs median 256, 32-1024). O(prompt_tokens) and O(output_tokens) are then used by the preflight
        only. What chunked prefill is for, best with open-loop O(arrivals).
      - V(long_context), prompts of C(context_tokens) (16384 or 32768, say). When C(context_tokens) + O(output_tokens)
        exceed the C(max_model_len) the server reports in C(/v1/models), the prompts are capped to max_model_len -
        output_tokens and the module warns, naming the C(--max-model-len) that would fit; the result records the length
        sent.
    type: str
    choices: [random, shared_prefix, mixed_lengths, long_context]
    default: random
  profile_options:
    version_added: 0.3.0
    description:
      - The O(profile)'s parameters; an option another profile takes is refused.
      - V(shared_prefix) takes C(prefix_tokens) (default 1024) and C(turns) (default 1, at most 64).
      - V(mixed_lengths) takes C(preset) (V(chat), the default, or V(document)) and C(prompt) and C(output), each a dict
        of C(median), C(sigma) (of the length's logarithm), C(min) and C(max) that overrides the preset's.
      - V(long_context) takes C(context_tokens) (default 32768).
    type: dict
    default: {}
  arrivals:
    version_added: 0.3.0
    description:
      - When requests are sent. By default (an empty dict, or C(mode=closed)) a closed loop, in which each of
        O(concurrency) workers sends its next request as soon as its last one finished.
      - C(mode=poisson) or C(mode=gamma) with C(rate) (mean requests per second) make an open loop, as real traffic
        arrives, seeded like the prompts (C(mode=constant) sends one every 1/C(rate) seconds). O(concurrency) then
        caps the requests in flight (a request whose time comes while the cap is full is sent late; each run's
        C(arrivals) reports the achieved rate and the lag, and the module warns when a run sent below 90% of C(rate)).
      - C(burstiness) (V(gamma) only, 0.05 to 100, default 1) is the shape of the gamma distribution of the gaps, whose
        mean stays 1/C(rate); V(1) is Poisson, below 1 burstier, above 1 more regular.
      - Other keys are refused.
    type: dict
    default: {}
  goodput:
    version_added: 0.3.0
    description:
      - Latency targets that make a request good, C(ttft_ms) (most milliseconds to the first token) and C(tpot_ms)
        (most milliseconds per output token after the first); at least one. Other keys are refused.
      - Each run then reports its C(goodput) (the good requests, their share of every request sent, their output tokens/s
        and requests/s) and each level their spread; the summary adds C(goodput_tps) and C(good_share). A failed request
        is not good; a one-token answer has no TPOT and meets that target. The targets judge requests after the fact, so
        the workload fingerprint does not compare them.
    type: dict
    default: {}
  seed:
    description:
      - Seed of the prompts. The same seed gives the same prompts on every host, so baseline and candidate runs see the
        same work. A server that was not restarted may serve repeated prompts from its prefix cache; use another seed for
        an A/B on a running server.
    type: int
    default: 0
  ignore_eos:
    description: Send C(ignore_eos=true) so every request generates O(output_tokens) tokens. Set false for servers that reject it.
    type: bool
    default: true
  prompt_mode:
    description:
      - V(token_ids) sends the prompt as a list of token IDs drawn from O(token_id_range) (exact length; vLLM accepts it).
      - V(text) sends O(prompt_tokens) common words instead, for servers that take text only (the length is then about
        that many tokens; the results hold the server's own count).
    type: str
    choices: [token_ids, text]
    default: token_ids
  token_id_range:
    description:
      - Half-open range C([low, high)) of the token IDs in prompts. The default holds ordinary tokens in every common
        vocabulary; lower C(high) for models whose vocabulary is smaller.
    type: list
    elements: int
    default: [1000, 4000]
  per_chunk_usage:
    description:
      - Ask for C(stream_options.continuous_usage_stats) (cumulative token counts in every chunk, supported by vLLM), so
        ITL is exact when chunks carry several tokens (each run's C(itl_exact) says whether it was).
      - Off by default, because it costs the server. On an H200, where vLLM's API process was the bottleneck at
        concurrency 256, it cost 19% of the output tokens/s (0.808 [0.773-0.950] in 9 of 9 paired rounds,
        docs/gpu_h200.md). At c=16 and c=64 it cost nothing that could be measured. Output tokens/s, TTFT and TPOT
        are exact either way, as they come from the final usage.
    type: bool
    default: false
  timeout:
    description: Seconds one request may take, from connect to the end of its stream, before it counts as an error.
    type: float
    default: 300
  validate_certs:
    description: Verify the server's TLS certificate for C(https) URLs.
    type: bool
    default: true
  ca_path:
    description: CA bundle to verify the server's certificate with, for C(https) URLs.
    type: path
  max_error_rate:
    description:
      - Fraction of failed requests (0 to 1) above which the module fails, with the results in its output.
      - A run (warm-up, settle or measured) stops as soon as more than this share of its requests failed, cancelling the
        requests in flight, and the module fails saying where; a server that errors cannot give a valid run, so the
        rest of the sweep would only cost time.
      - A request whose C(usage.completion_tokens) exceeds O(output_tokens), or contradicts the tokens its chunks
        streamed, is a protocol error, not a throughput.
    type: float
    default: 0.0
  deadline:
    description:
      - Seconds the whole call may take, preflight included; past it the module fails, saying where the sweep stood. A
        server that answers the preflight and then hangs fails within O(timeout) (the first timed-out request is past
        O(max_error_rate) 0) and at the latest at this deadline. V(0) sets no deadline.
    type: float
    default: 3600
  measured_only:
    description:
      - Measured runs only, without the O(warmup) requests and the settle runs; more runs of a server that was just
        benchmarked (the throughput gate's extra rounds), at the levels of O(concurrency) (give the gated one).
    type: bool
    default: false
  results_dir:
    description:
      - Directory on the host for the results JSON (created if missing). The file is
        C(<label>-<kernel release>-<UTC time>.json) and holds the results, the kernel release and O(tuning).
      - When not set, nothing is written.
    type: path
  label:
    description: Name of this benchmark in the results and the file name (letters, digits, C(.), C(_), C(-)).
    type: str
    default: benchmark
  tuning:
    description: What the host's tuning was during the benchmark, stored with the results as given (for example the tuning roles' settings).
    type: dict
    default: {}
  server_argv:
    description:
      - The vLLM server's command line as a list (the C(gpufleet.inference.vllm_service) role's rendered argv), stored as
        C(server.argv) and compared by the gate's workload fingerprint (C(server_argv)); two results of servers started
        with other flags are not compared unless the change under test is C(vllm_flags) or C(vllm_version).
      - Not given, the fingerprint carries no argv (the gate warns when one side has it and the other not).
    type: list
    elements: str
  root:
    description:
      - Directory that stands for C(/) when the module reads the model directory the server reports (for the model's
        identity, C(server.model_identity)), reads C(/proc) (for the server's start, C(server.start)) and writes
        O(results_dir).
      - Leave it at C(/) on real hosts. Tests point it at a synthetic tree.
    type: path
    default: /
notes:
  - TTFT runs from writing the request to the first streamed chunk that carries a token. TPOT is (latency - TTFT) /
    (output tokens - 1) with the server's C(usage.completion_tokens), as C(vllm bench serve) computes it. ITL is the gap
    between token-bearing chunks spread over the tokens of the later chunk (k tokens give k values of gap/k), the per-chunk
    count coming from C(continuous_usage_stats); without it each gap is divided by the mean tokens per chunk.
  - Percentiles interpolate linearly between closest ranks (numpy's default), so they compare with C(vllm bench serve).
  - Output tokens/s of a run is the output tokens of its successful requests over the window from the first request
    written to the last one finished. Each run's figure is one sample for the throughput gate.
  - The client measures its own CPU use per run (C(client_cpu_pct)) and warns when it nears a whole core.
  - Each level also reports the trend of its measured runs in the order they were taken (C(trend), Mann-Kendall with the
    Theil-Sen change), and warns when they rose or fell steadily by 5% or more.
seealso:
  - module: gpufleet.inference.throughput_gate
  - name: docs/benchmark.md
    description: How the client measures and how the gate decides.
    link: https://github.com/gpufleet/inference/blob/main/docs/benchmark.md
"""

EXAMPLES = r"""
- name: Benchmark the local vLLM server at two concurrency levels
  gpufleet.inference.inference_benchmark:
    url: http://127.0.0.1:8000
    prompt_tokens: 1024
    output_tokens: 128
    concurrency: [8, 32]
    requests: 256
    repetitions: 5
  register: bench

- name: Show the median output tokens/s per level
  ansible.builtin.debug:
    msg: "c={{ item.concurrency }}: {{ item.output_throughput }} tok/s (CV {{ item.output_throughput_cv }})"
  loop: "{{ bench.summary }}"

- name: Keep a baseline on the host, tagged with the kernel and tuning it was taken under
  gpufleet.inference.inference_benchmark:
    url: http://127.0.0.1:8000
    api_key: "{{ vllm_api_key }}"
    concurrency: [32]
    results_dir: /var/lib/gpufleet/benchmarks
    label: baseline
    tuning:
      mps: 256
      mrrs: 4096
      irq_pinning: true
    # the server's flags, compared by the gate (the vllm_service role renders them as __vllm_service.argv)
    server_argv: "{{ __vllm_service.argv }}"
  register: baseline

- name: Benchmark a server that takes text prompts only and does not know vLLM's extensions
  gpufleet.inference.inference_benchmark:
    url: https://llm.example.com
    model: my-model
    prompt_mode: text
    ignore_eos: false
    per_chunk_usage: false
    concurrency: [4]
    requests: 32

- name: See prefix caching work, on a 2048-token system prompt shared by every request
  gpufleet.inference.inference_benchmark:
    profile: shared_prefix
    profile_options: {prefix_tokens: 2048}
    prompt_tokens: 256
    concurrency: [32]

- name: Chat-shaped lengths arriving as Poisson traffic at 8 requests/s, with goodput under latency targets
  gpufleet.inference.inference_benchmark:
    profile: mixed_lengths
    profile_options: {preset: chat}
    arrivals: {mode: poisson, rate: 8}
    goodput: {ttft_ms: 500, tpot_ms: 50}
    concurrency: [256]
    requests: 400

- name: 32k-token prompts, capped with a warning where the server's max_model_len is shorter
  gpufleet.inference.inference_benchmark:
    profile: long_context
    profile_options: {context_tokens: 32768}
    output_tokens: 64
    concurrency: [2]
    requests: 8

- name: Benchmark even in a --check run (the module only probes the server in check mode by default)
  gpufleet.inference.inference_benchmark:
    concurrency: [16]
  check_mode: false
"""

RETURN = r"""
actions:
  description:
    - What the module changed or would change on the host, C(action=write) with the C(path) of the results file (in check
      mode the file name ends in C(<UTC time>.json), the time the run would finish); empty without O(results_dir).
  returned: always
  type: list
  elements: dict
  sample: [{action: write, path: /var/lib/gpufleet/benchmarks/baseline-6.1.0-50-cloud-amd64-20260101T120000Z.json}]
benchmarked:
  description: Whether load was sent (false in check mode).
  returned: always
  type: bool
kernel:
  description: Kernel release of the host (C(uname -r)) during the benchmark.
  returned: always
  type: str
  sample: 6.1.0-50-cloud-amd64
plan:
  description:
    - Levels and the number of requests and output tokens the sweep sends at most (with the preflight request and every
      settle run; a level that settles early sends fewer).
  returned: always
  type: dict
  sample: {levels: [8, 32], requests_per_level: 1056, requests_total: 2113, output_tokens_total: 270336}
server:
  description:
    - What the server said about itself (C(GET /v1/models); C(vllm_version) from C(GET /version), null when the server
      does not serve it), the preflight request's result, C(argv) (O(server_argv), when given) and C(model_identity).
    - C(model_identity) is read from the model directory C(root) on the host (docs/benchmark.md, "What the gate
      compares"), C(config), C(tokenizer) (sha256 of those files), C(weights) (sha256 over each weight file's name, size
      and its first and last MiB), C(files), C(bytes) and, for a Hugging Face cache snapshot, C(revision); or
      C(unreadable) (why) when the directory cannot be read here (a hub name, a server on another host), with a warning.
    - C(start) is which start of the server process the runs measured, so that M(gpufleet.inference.bench_history) can
      group runs by server start (its O(gpufleet.inference.bench_history#module:state=start_noise)); it is not part of
      the workload fingerprint (a restart is not another workload). C(id) is C(BOOT_ID/PID/TICKS) (C(source=proc)) when
      the process listening on the URL's port runs on this host (found from C(/proc/net/tcp) and C(/proc/PID/fd), as
      C(ss -ltnp) finds it; other users' processes need C(become=true)), that is the boot id and the process's start in
      clock ticks after boot (C(/proc/PID/stat) field 22), with C(pid), C(process) (its name) and C(started_at). Otherwise it
      is C(metrics/SECONDS) (C(source=metrics)) from vLLM's C(process_start_time_seconds) in C(/metrics) (one API
      server; several export no process metrics), with C(started_at) and C(proc_reason), why C(/proc) did not give it.
      Read before and after the benchmark; when they differ (the server restarted during it) or neither source gives
      it, C(id) is null and C(reason) says why.
  returned: always
  type: dict
  sample: {url: "http://127.0.0.1:8000", model: lab, models: [lab], max_model_len: 4096, root: /srv/models/lab,
           owned_by: vllm, vllm_version: 0.26.0, preflight: {ttft_ms: 3.1, output_tokens: 4, per_chunk_usage_seen: true},
           model_identity: {config: 4f1c..., tokenizer: 9a0b..., weights: 77de..., files: 3, bytes: 16060522496},
           start: {id: 0b9d2e6c-3f7a-4a57-9d8e-5c2f1a0e4b11/842/41117, source: proc, reason: null, pid: 842,
                   boot_id: 0b9d2e6c-3f7a-4a57-9d8e-5c2f1a0e4b11, start_ticks: 41117, process: python3,
                   started_at: "2026-12-04T20:01:57Z"}}
results_file:
  description: Path of the results JSON on the host; null when O(results_dir) is not set or in check mode.
  returned: always
  type: str
  sample: /var/lib/gpufleet/benchmarks/baseline-6.1.0-50-cloud-amd64-20260101T120000Z.json
contaminated:
  description:
    - Per concurrency level (a string key), the repetitions whose runs were loaded by another client (the server held more
      requests than this client sent); empty lists when clean or when O(monitor_load) is off or the server exports no
      in-flight gauges (then each run's C(server_load.available) is false).
  returned: when benchmarked
  type: dict
  sample: {"8": [], "32": [2, 3]}
links_monitored:
  description:
    - The PCI functions whose links were sampled during every measured run (GPUs and the bridges above them, top
      first); empty without O(monitor_links) or without a GPU.
  returned: when benchmarked
  type: list
  elements: str
  sample: ["0000:00:01.0", "0000:01:00.0"]
link_flapping:
  description:
    - When links were sampled (RV(links_monitored)), the measured runs during which a PCIe link changed speed or
      width, each with its C(concurrency), C(repetition), C(devices) and C(output_throughput) (that run's output tokens/s).
  returned: when benchmarked with links sampled
  type: list
  elements: dict
  sample: [{concurrency: 32, repetition: 1, devices: ["0000:17:00.0"], output_throughput: 2210.4}]
samples:
  description: Output tokens/s of every measured run, per concurrency level (a string key); the input of the throughput gate.
  returned: when benchmarked
  type: dict
  sample: {"8": [2210.4, 2198.7, 2231.0, 2205.9, 2219.3], "32": [6650.2, 6702.8, 6588.1, 6671.4, 6640.0]}
summary:
  description:
    - One line per level with the median output and request throughput, the output CV, latency medians and errors, the
      warm-up runs it took to settle (C(settle_runs), C(settled)) and the measured runs' drift (C(drift), the Theil-Sen
      change over the runs as a fraction of their median).
  returned: when benchmarked
  type: list
  elements: dict
  sample: [{concurrency: 8, output_throughput: 2210.4, output_throughput_cv: 0.0054, request_throughput: 17.27,
            ttft_p50_ms: 41.2, ttft_p99_ms: 88.0, tpot_p50_ms: 3.3, itl_p50_ms: 3.2, itl_p99_ms: 9.8, errors: 0,
            settle_runs: 2, settled: true, drift: 0.0031}]
  contains:
    goodput_tps:
      description: With O(goodput), the median over the runs of the good requests' output tokens/s.
      type: float
      returned: with O(goodput)
    good_share:
      description: With O(goodput), the median over the runs of the share of requests that met every target.
      type: float
      returned: with O(goodput)
    target_rate:
      description: With an open loop (O(arrivals)), the requests/s asked for.
      type: float
      returned: with an open loop
    achieved_rate:
      description: With an open loop, the median over the runs of the requests/s sent.
      type: float
      returned: with an open loop
benchmark:
  description:
    - The whole result, as stored in RV(results_file). C(levels) holds per level C(output_throughput) and
      C(request_throughput) across runs (C(median), C(mean), C(min), C(max), C(cv), C(values)), C(ttft_ms), C(tpot_ms),
      C(itl_ms) and C(e2el_ms) over all measured requests (C(count), C(mean), C(std), C(min), C(p50), C(p90), C(p99),
      C(max)), and C(runs), each with the same latency statistics, C(duration_s), C(output_tokens), C(prompt_tokens),
      C(output_throughput), C(request_throughput), C(total_token_throughput), C(errors), C(error_reasons),
      C(short_outputs), C(tokens_per_chunk), C(itl_exact), C(tokens_source) and C(client_cpu_pct). Each level also has
      C(settle) (C(max_runs), C(runs) with each warm-up run's output tokens/s, C(settled), C(tolerance), C(errors)) and
      C(trend) of its measured runs (C(n), C(s), C(tau), C(p_rising), C(p_falling), C(change), C(method)).
  returned: when benchmarked
  type: dict
  contains:
    format:
      description: Version of this layout.
      type: str
      sample: gpufleet.inference_benchmark/1
    label:
      description: O(label).
      type: str
    host:
      description: Host name of the target.
      type: str
    kernel:
      description: Kernel release during the benchmark.
      type: str
    tuning:
      description: O(tuning) as given.
      type: dict
    config:
      description:
        - The benchmark settings (never the API key; C(api_key_set) says whether one was used). C(profile) is the
          profile's spec (C(name) and its parameters with their defaults; for V(long_context) also C(prompt_tokens),
          the length sent after the cap), C(arrivals) the loop (C(mode), C(rate), C(burstiness)), C(goodput) the
          targets; the workload fingerprint compares C(profile) and C(arrivals).
      type: dict
    server:
      description: Same as RV(server).
      type: dict
    levels:
      description: Per concurrency level, as described above.
      type: list
      elements: dict
    samples:
      description: Same as RV(samples).
      type: dict
    requests:
      description: Measured requests in all.
      type: int
    errors:
      description: Failed measured requests in all.
      type: int
    short_outputs:
      description: Successful requests that generated fewer than O(output_tokens) tokens although C(ignore_eos) was sent.
      type: int
    started_at:
      description: UTC start time.
      type: str
    finished_at:
      description: UTC end time.
      type: str
    duration_s:
      description: Seconds the whole sweep took.
      type: float
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.inference_benchmark import BenchmarkError, execute

ARGUMENT_SPEC = dict(
    url=dict(type="str", default="http://127.0.0.1:8000"),
    model=dict(type="str"),
    api_key=dict(type="str", no_log=True),
    prompt_tokens=dict(type="int", default=1024, no_log=False),
    output_tokens=dict(type="int", default=128, no_log=False),
    concurrency=dict(type="list", elements="int", default=[8, 32]),
    requests=dict(type="int", default=128),
    warmup=dict(type="int", default=32),
    repetitions=dict(type="int", default=5),
    settle_runs=dict(type="int", default=3),
    settle_tolerance=dict(type="float", default=0.05),
    monitor_load=dict(type="bool", default=True),
    monitor_links=dict(type="bool", default=True),
    profile=dict(type="str", choices=["random", "shared_prefix", "mixed_lengths", "long_context"], default="random"),
    profile_options=dict(type="dict", default={}),
    arrivals=dict(type="dict", default={}),
    goodput=dict(type="dict", default={}),
    seed=dict(type="int", default=0),
    ignore_eos=dict(type="bool", default=True),
    prompt_mode=dict(type="str", choices=["token_ids", "text"], default="token_ids"),
    token_id_range=dict(type="list", elements="int", default=[1000, 4000], no_log=False),
    per_chunk_usage=dict(type="bool", default=False),
    timeout=dict(type="float", default=300.0),
    validate_certs=dict(type="bool", default=True),
    ca_path=dict(type="path"),
    max_error_rate=dict(type="float", default=0.0),
    deadline=dict(type="float", default=3600.0),
    measured_only=dict(type="bool", default=False),
    results_dir=dict(type="path"),
    label=dict(type="str", default="benchmark"),
    tuning=dict(type="dict", default={}),
    server_argv=dict(type="list", elements="str"),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("inference_benchmark", ARGUMENT_SPEC, "writes its results under results_dir", (BenchmarkError,)),
               execute)


if __name__ == "__main__":
    main()

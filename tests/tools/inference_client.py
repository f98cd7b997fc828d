# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark client for OpenAI-compatible streaming completion servers (vLLM first), standard library only:
the one import for scripts and tests (``inference_client as ic``). The code lives in three modules:

* inference_transport: HTTP/1.1 over asyncio streams (keep-alive pool, TLS), chunked and SSE decoding,
  the /v1/completions body and the fold of its streamed events into a RequestRecord;
* inference_metrics: TTFT, TPOT, ITL of one request, run and level summaries (percentiles, CV and trend
  from gate_stats, the statistics the throughput gate uses);
* inference_sweep: the workload, BenchmarkConfig, discovery and preflight, the closed-loop runs, settle
  runs, the sweep over concurrency levels and the results document.

Modules import what they use from those three; this file defines nothing of its own.
"""

from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import drift_warning, percentile, trend
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.metrics import (
    RequestMetrics, check_protocol, describe, error_key, level_summary, request_metrics, run_summary, spread,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.sweep import (
    DEFAULT_TOKEN_ID_RANGE, LABEL_CHARS, MAX_CONCURRENCY, RESULT_FORMAT, BenchmarkConfig, BenchmarkError,
    RunStopped, _body, auth_headers, benchmark, check_config, check_label, compact_summary, config_from_params,
    discover, error_failure, level_run, make_prompt, make_ssl_context, measured_run, plan, preflight, preflight_hint,
    probe, result_warnings, results_document, results_filename, run, run_batch, settle, steady,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.profiles import WORDS
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.transport import (
    CLIENT_NAME, CLIENT_VERSION, ERROR_BODY_LIMIT, HEADER_LIMIT, READ_SIZE, USER_AGENT, ChunkedDecoder,
    ConnectionPool, Endpoint, HttpConnection, ProtocolError, RequestRecord, SSEParser, completion_payload,
    connect_error_text, http_json, parse_endpoint, process_event, stream_completion, timed_request,
)

__all__ = [
    # gate_stats
    "drift_warning", "percentile", "trend",
    # inference_transport
    "CLIENT_NAME", "CLIENT_VERSION", "ERROR_BODY_LIMIT", "HEADER_LIMIT", "READ_SIZE", "USER_AGENT", "ChunkedDecoder",
    "ConnectionPool", "Endpoint", "HttpConnection", "ProtocolError", "RequestRecord", "SSEParser", "completion_payload",
    "connect_error_text", "http_json", "parse_endpoint", "process_event", "stream_completion", "timed_request",
    # inference_metrics
    "RequestMetrics", "check_protocol", "describe", "error_key", "level_summary", "request_metrics", "run_summary",
    "spread",
    # inference_sweep
    "DEFAULT_TOKEN_ID_RANGE", "LABEL_CHARS", "MAX_CONCURRENCY", "RESULT_FORMAT", "WORDS", "BenchmarkConfig",
    "BenchmarkError", "RunStopped", "_body", "auth_headers", "benchmark", "check_config", "check_label",
    "compact_summary", "config_from_params", "discover", "error_failure", "level_run", "make_prompt",
    "make_ssl_context", "measured_run", "plan", "preflight", "preflight_hint", "probe", "result_warnings",
    "results_document", "results_filename", "run", "run_batch", "settle", "steady",
]

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Per-request metrics of the benchmark client and their aggregates over runs and levels; pure.

request_metrics() gives TTFT, TPOT, ITL and the output token count of one streamed request (an
bench/transport.py RequestRecord), check_protocol() marks a request whose token counts contradict
each other, run_summary() and level_summary() aggregate runs and levels. Percentiles, the coefficient
of variation and the trend of a level's runs come from bench/stats.py, the statistics the throughput gate
uses too; percentiles are numpy's default (linear) so the figures compare with ``vllm bench serve``.

Definitions (docs/benchmark.md has the long form):

* TTFT: from writing the request to the first streamed chunk that carries a token.
* ITL: the gap between consecutive token-bearing chunks, spread over the tokens in the later chunk
  (a chunk with k tokens gives k values of gap/k), so multi-token chunks do not inflate it; tokens
  that came in the first chunk with the first token count 0. Every token after the first has one
  value, so a request's mean ITL equals its TPOT. The
  per-chunk token count comes from ``stream_options.continuous_usage_stats`` (cumulative
  ``usage.completion_tokens`` in every chunk, which vLLM supports); servers that do not send it get
  each gap divided by the mean tokens per chunk (``itl_exact`` false).
* TPOT: (latency - TTFT) / (output tokens - 1), output tokens from the server's ``usage``.
* output tokens/s: the output tokens of the successful requests of a run divided by the run's
  window, from the first request written to the last response finished.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.profiles import goodput
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import percentile, sample_stats, trend
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.transport import RequestRecord


def describe(values: Sequence[float], scale: float = 1.0, digits: int = 3) -> dict[str, Any]:
    """count, mean, std (population, as numpy), min, p50, p90, p99, max; values times ``scale``."""
    if not values:
        return {"count": 0, "mean": None, "std": None, "min": None, "p50": None, "p90": None, "p99": None, "max": None}
    ordered = sorted(v * scale for v in values)
    n = len(ordered)
    mean = sum(ordered) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in ordered) / n)
    out: dict[str, Any] = {"count": n, "mean": mean, "std": std, "min": ordered[0], "p50": percentile(ordered, 50),
                           "p90": percentile(ordered, 90), "p99": percentile(ordered, 99), "max": ordered[-1]}
    return {k: (round(v, digits) if isinstance(v, float) else v) for k, v in out.items()}


@dataclass
class RequestMetrics:
    ok: bool
    error: str | None
    output_tokens: int
    prompt_tokens: int | None
    ttft: float | None
    latency: float | None
    tpot: float | None
    itl: list[float]
    tokens_source: str  # usage | chunk_usage | chunks
    itl_exact: bool
    chunks: int


def request_metrics(rec: RequestRecord) -> RequestMetrics:
    """TTFT, latency, TPOT and the per-token ITL values of one finished request (see module docstring)."""
    def failed(error: str) -> RequestMetrics:
        return RequestMetrics(False, error, 0, rec.usage_prompt, None, None, None, [], "none", False, len(rec.chunk_times))

    if rec.error:
        return failed(rec.error)
    if not rec.done:
        return failed(f"stream ended without data: [DONE] after {len(rec.chunk_times)} chunks")
    times = rec.chunk_times
    per_chunk = bool(times) and all(u is not None for u in rec.chunk_usage)
    if per_chunk:
        counts = []
        previous = 0
        for cumulative in rec.chunk_usage:
            counts.append(max(0, int(cumulative) - previous))
            previous = max(previous, int(cumulative))
        token_chunks = [(t, k) for t, k in zip(times, counts) if k > 0]
    else:
        token_chunks = [(t, 1) for t in times]
    if not token_chunks:
        return failed("the response carried no token")
    if rec.usage_completion is not None:
        n_out, source = rec.usage_completion, "usage"
    elif per_chunk:
        n_out, source = sum(k for _t, k in token_chunks), "chunk_usage"
    else:
        n_out, source = len(token_chunks), "chunks"
    ttft = token_chunks[0][0] - rec.start
    latency = token_chunks[-1][0] - rec.start
    tpot = (latency - ttft) / (n_out - 1) if n_out > 1 else None
    itl: list[float] = []
    exact = per_chunk or n_out == len(token_chunks)
    if per_chunk:
        # Tokens that came with the first one arrived with no gap; later chunks spread their gap.
        itl.extend([0.0] * (token_chunks[0][1] - 1))
        for (t_prev, _k), (t_cur, k) in zip(token_chunks, token_chunks[1:]):
            itl.extend([(t_cur - t_prev) / k] * k)
    elif len(token_chunks) > 1:
        # Unknown tokens per chunk: spread evenly, assuming the first chunk held one token.
        mean_k = max(1.0, (n_out - 1) / (len(token_chunks) - 1))
        itl = [(t_cur - t_prev) / mean_k for (t_prev, _a), (t_cur, _b) in zip(token_chunks, token_chunks[1:])]
    return RequestMetrics(True, None, n_out, rec.usage_prompt, ttft, latency, tpot, itl, source, exact, len(times))


def check_protocol(rec: RequestRecord, max_tokens: int | None) -> None:
    """Mark a finished request whose token counts contradict each other as a protocol error (it is no throughput).

    ``usage.completion_tokens`` above the ``max_tokens`` asked for, a cumulative per-chunk count that goes down, or
    chunks that streamed more tokens than the final usage reports.
    """
    if rec.error or not rec.done:
        return
    if max_tokens and rec.usage_completion is not None and rec.usage_completion > max_tokens:
        rec.error = (f"protocol error: usage.completion_tokens {rec.usage_completion} exceeds the max_tokens "
                     f"{max_tokens} asked for")
        return
    seen = [u for u in rec.chunk_usage if u is not None]
    if any(b < a for a, b in zip(seen, seen[1:])):
        rec.error = "protocol error: the streamed cumulative usage.completion_tokens went down between chunks"
    elif seen and rec.usage_completion is not None and seen[-1] > rec.usage_completion:
        rec.error = (f"protocol error: the chunks streamed {seen[-1]} tokens but the final usage.completion_tokens "
                     f"says {rec.usage_completion}")


def error_key(error: str) -> str:
    return error if len(error) <= 160 else error[:157] + "..."


def run_summary(records: Sequence[RequestRecord], window: float, max_tokens: int | Sequence[int] | None = None,
                goodput_targets: dict[str, float] | None = None) -> dict[str, Any]:
    """One run: throughputs over ``window`` seconds, latency statistics in ms, errors by reason; ``max_tokens`` is
    every request's (an int) or each one's (a list, in request order), for the short outputs; with
    ``goodput_targets`` (ttft_ms, tpot_ms) the run's goodput (bench/profiles.py goodput())."""
    metrics = [request_metrics(r) for r in records]
    limits = list(max_tokens) if isinstance(max_tokens, (list, tuple)) else [max_tokens] * len(metrics)
    ok = [m for m in metrics if m.ok]
    reasons: dict[str, int] = {}
    for m in metrics:
        if not m.ok:
            key = error_key(m.error or "unknown error")
            reasons[key] = reasons.get(key, 0) + 1
    out_tokens = sum(m.output_tokens for m in ok)
    prompt_tokens = sum(m.prompt_tokens or 0 for m in ok)
    window = max(window, 1e-9)
    chunks = sum(m.chunks for m in ok)
    return {
        "requests": len(records), "ok": len(ok), "errors": len(records) - len(ok),
        "error_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:10]),
        "duration_s": round(window, 4), "output_tokens": out_tokens, "prompt_tokens": prompt_tokens,
        "output_throughput": round(out_tokens / window, 3), "request_throughput": round(len(ok) / window, 4),
        "total_token_throughput": round((out_tokens + prompt_tokens) / window, 3),
        "ttft_ms": describe([m.ttft for m in ok if m.ttft is not None], 1000.0),
        "tpot_ms": describe([m.tpot for m in ok if m.tpot is not None], 1000.0),
        "itl_ms": describe([v for m in ok for v in m.itl], 1000.0),
        "e2el_ms": describe([m.latency for m in ok if m.latency is not None], 1000.0),
        "short_outputs": sum(1 for m, limit in zip(metrics, limits) if m.ok and limit and m.output_tokens < limit),
        "tokens_per_chunk": round(out_tokens / chunks, 3) if chunks else None,
        "itl_exact": all(m.itl_exact for m in ok) if ok else None,
        "tokens_source": sorted({m.tokens_source for m in ok}),
        **({"goodput": goodput([(m.ok, m.output_tokens, m.ttft, m.tpot) for m in metrics], goodput_targets, window)}
           if goodput_targets else {}),
    }


def spread(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """median, mean, min, max, coefficient of variation and the values of one metric across runs."""
    if not values:
        return {"median": None, "mean": None, "min": None, "max": None, "cv": None, "values": []}
    ordered = sorted(values)
    stats = sample_stats(ordered)
    cv = round(stats["cv"], 5) if stats["cv"] is not None else None
    return {"median": round(percentile(ordered, 50), digits), "mean": round(stats["mean"], digits), "min": ordered[0],
            "max": ordered[-1], "cv": cv, "values": list(values)}


def level_summary(concurrency: int, runs: Sequence[dict], records: Sequence[RequestRecord],
                  settle: dict[str, Any] | None = None) -> dict[str, Any]:
    """A concurrency level: throughputs across its runs and their trend, latencies over all its measured requests."""
    metrics = [request_metrics(r) for r in records]
    ok = [m for m in metrics if m.ok]
    throughputs = [r["output_throughput"] for r in runs]
    return {
        "concurrency": concurrency, "repetitions": len(runs),
        "settle": settle or {"max_runs": 0, "runs": [], "settled": None, "tolerance": None},
        "trend": trend(throughputs),
        "output_throughput": spread(throughputs),
        "request_throughput": spread([r["request_throughput"] for r in runs], 4),
        "ttft_ms": describe([m.ttft for m in ok if m.ttft is not None], 1000.0),
        "tpot_ms": describe([m.tpot for m in ok if m.tpot is not None], 1000.0),
        "itl_ms": describe([v for m in ok for v in m.itl], 1000.0),
        "e2el_ms": describe([m.latency for m in ok if m.latency is not None], 1000.0),
        "requests": sum(r["requests"] for r in runs), "errors": sum(r["errors"] for r in runs),
        "short_outputs": sum(r["short_outputs"] for r in runs),
        **profile_spread(runs),
        "runs": list(runs),
    }


def profile_spread(runs: Sequence[dict]) -> dict[str, Any]:
    """Across a level's runs: the goodput (tok/s and the share of good requests) and, for an open loop, the achieved
    send rate and the worst lag behind the schedule; {} for runs without them."""
    out: dict[str, Any] = {}
    good = [r["goodput"] for r in runs if r.get("goodput")]
    if good:
        out["goodput"] = {"targets": good[0]["targets"], "goodput_tps": spread([g["goodput_tps"] for g in good]),
                          "good_share": spread([g["good_share"] for g in good if g["good_share"] is not None], 5)}
    sent = [r["arrivals"] for r in runs if r.get("arrivals")]
    if sent:
        rates = [a["achieved_rate"] for a in sent if a["achieved_rate"] is not None]
        lags = [a["lag_max_ms"] for a in sent if a["lag_max_ms"] is not None]
        out["arrivals"] = {"mode": sent[0]["mode"], "target_rate": sent[0]["target_rate"],
                           "burstiness": sent[0].get("burstiness"), "achieved_rate": spread(rates, 4),
                           "lag_max_ms": max(lags) if lags else None}
    return out

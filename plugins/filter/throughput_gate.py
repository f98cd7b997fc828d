# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The throughput gate as a filter: ``baseline | gpufleet.inference.throughput_gate(candidate)`` (logic in module_utils)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.gate_settings import GATE
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.throughput_gate import decide, latency_series
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import GateError
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import start_noise as _start_noise

FLOATS = ("threshold", "alpha", "pass_alpha", "detect", "power", "screen_alpha", "drift_alpha", "trend_guard", "pass_floor",
          "between_start_sd")
INTS = ("min_runs", "candidate_min_runs", "max_runs", "step", "max_baseline_runs", "baseline_step", "bootstrap", "seed",
        "baseline_failed", "baseline_requests", "candidate_failed", "candidate_requests", "requests_per_run")


def throughput_gate(baseline, candidate, threshold=GATE.threshold, alpha=GATE.alpha, pass_alpha=GATE.pass_alpha,
                    min_runs=GATE.min_runs, max_runs=GATE.max_runs, bootstrap=GATE.bootstrap, seed=GATE.seed, unit=GATE.unit,
                    **options):
    """Judge candidate runs against baseline runs; see gpufleet.inference.throughput_gate (defaults: GateSettings)."""
    known = set(FLOATS) | set(INTS) | {"spending", "order", "change", "baseline_workload", "candidate_workload", "baseline_latency",
                                       "candidate_latency", "latency_margins", "latency_alpha"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise AnsibleFilterError(f"throughput_gate: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    try:
        extra = {}
        for name, value in options.items():
            if value is None:
                continue
            if name.endswith(("_workload", "_latency", "_margins")):
                extra[name] = value  # a benchmark result or its fingerprint, per-run latency, margins: checked by the gate
            elif name == "latency_alpha":
                extra[name] = float(value)
            else:
                extra[name] = float(value) if name in FLOATS else int(value) if name in INTS else str(value)
        return decide(list(baseline) if isinstance(baseline, tuple) else baseline,
                      list(candidate) if isinstance(candidate, tuple) else candidate,
                      threshold=float(threshold), alpha=float(alpha), pass_alpha=float(pass_alpha),
                      min_runs=int(min_runs), max_runs=int(max_runs), bootstrap=int(bootstrap), seed=int(seed),
                      unit=str(unit), **extra)
    except (GateError, TypeError, ValueError) as err:
        raise AnsibleFilterError(f"throughput_gate: {err}") from err


def latency_samples(levels):
    """``inference_benchmark_result.benchmark.levels | gpufleet.inference.latency_samples``: per concurrency level (a
    string key), the gate's per-run latency, {metric: [ms per run]} (TTFT and TPOT, p50 and p90 of each run; ITL p99)."""
    if not isinstance(levels, (list, tuple)):
        raise AnsibleFilterError(f"latency_samples: expected the benchmark's levels (a list), got {type(levels).__name__}")
    out = {}
    for level in levels:
        if isinstance(level, dict) and "concurrency" in level:
            out[str(level["concurrency"])] = latency_series(level.get("runs") or [])
    return out


def start_noise(starts):
    """``[[tok/s of start 1's runs], [start 2's], ...] | gpufleet.inference.start_noise``: the noise within and between
    server starts of one configuration; its ``sd_between`` is the gate's ``between_start_sd``."""
    try:
        return _start_noise([list(s) if isinstance(s, tuple) else s for s in starts]
                            if isinstance(starts, (list, tuple)) else starts)
    except GateError as err:
        raise AnsibleFilterError(f"start_noise: {err}") from err


class FilterModule:
    """Throughput gate filters."""

    def filters(self):
        return {"throughput_gate": throughput_gate, "latency_samples": latency_samples, "start_noise": start_noise}

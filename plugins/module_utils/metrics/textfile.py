# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's Prometheus metrics: every name, type, help text and label set, defined here once (``CATALOGUE``),
and the one renderer of the text exposition format that node_exporter's textfile collector reads.

Names follow Prometheus' rules: the ``gpufleet_`` prefix, base units in the name (``_seconds``, ``_transfers_per_second``,
``_ratio``), ``_total`` for counters and for nothing else, ``_info`` for a series whose labels carry the state (value 1).
Every series of a metric carries exactly the metric's labels, always ``host`` first (the inventory name, not the
scraped ``instance``, so that a dashboard joins hosts across exporters). ``render()`` refuses a sample of an unknown
metric, with other labels, or with a value that is not a finite number: what the file holds is what the catalogue
(and so docs/fleet_operations.md and the Grafana dashboard) says. Pure: writing the file is metrics_textfile.py's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

NAME_RE = re.compile(r"^gpufleet_[a-z][a-z0-9_]*[a-z0-9]$")
LABEL_RE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Metric:
    name: str
    type: str  # gauge or counter
    help: str
    labels: tuple[str, ...]
    source: str  # the module option whose data it comes from


def _m(name: str, typ: str, labels: str, source: str, text: str) -> Metric:
    return Metric(name, typ, text, ("host",) + tuple(labels.split()), source)


CATALOGUE: tuple[Metric, ...] = (
    # audit: pcie_facts' pcie document
    _m("gpufleet_audit_findings", "gauge", "code severity", "audit",
       "PCIe audit findings of the last audit, per finding code and severity (critical, warning, info)."),
    _m("gpufleet_audit_gpus", "gauge", "", "audit", "GPUs (audited PCI functions) found by the last audit."),
    _m("gpufleet_audit_timestamp_seconds", "gauge", "", "audit", "When the last audit ran, in seconds since the epoch."),
    _m("gpufleet_pcie_link_current_speed_transfers_per_second", "gauge", "gpu link", "audit",
       "Negotiated PCIe link speed of a function on a GPU's path (link: that function's address), in transfers per second."),
    _m("gpufleet_pcie_link_max_speed_transfers_per_second", "gauge", "gpu link", "audit",
       "Highest PCIe link speed the function can do, in transfers per second."),
    _m("gpufleet_pcie_link_current_width_lanes", "gauge", "gpu link", "audit", "Negotiated PCIe link width, in lanes."),
    _m("gpufleet_pcie_link_max_width_lanes", "gauge", "gpu link", "audit", "Widest PCIe link the function can do, in lanes."),
    _m("gpufleet_pcie_link_degraded", "gauge", "gpu link", "audit",
       "1 when the link runs below its own capability (speed or width), else 0."),
    _m("gpufleet_pcie_aer_errors_total", "counter", "gpu link severity", "audit",
       "PCIe AER errors the kernel counted on the function since boot (severity: correctable, nonfatal, fatal)."),
    _m("gpufleet_gpu_pcie_replay_total", "counter", "gpu", "audit",
       "PCIe replays NVML counted on the GPU (a rising count means a marginal link)."),
    # health: health_compare's findings (playbooks/health.yml)
    _m("gpufleet_health_findings", "gauge", "code severity", "health",
       "Health check findings against the previous check, per finding code and severity."),
    _m("gpufleet_health_timestamp_seconds", "gauge", "", "health", "When the last health check ran, in seconds since the epoch."),
    # benchmark: inference_benchmark's result document
    _m("gpufleet_benchmark_output_tokens_per_second", "gauge", "profile concurrency", "benchmark",
       "Median output tokens per second of the last benchmark's measured runs at a concurrency level."),
    _m("gpufleet_benchmark_output_throughput_cv_ratio", "gauge", "profile concurrency", "benchmark",
       "Coefficient of variation of the measured runs' output tokens per second."),
    _m("gpufleet_benchmark_time_to_first_token_seconds", "gauge", "profile concurrency quantile", "benchmark",
       "Time to first token of the last benchmark's requests at a quantile (0.5, 0.99)."),
    _m("gpufleet_benchmark_time_per_output_token_seconds", "gauge", "profile concurrency quantile", "benchmark",
       "Time per output token of the last benchmark's requests at a quantile (0.5, 0.99)."),
    _m("gpufleet_benchmark_failed_requests", "gauge", "profile concurrency", "benchmark",
       "Requests of the last benchmark that failed at a concurrency level."),
    _m("gpufleet_benchmark_link_findings", "gauge", "profile concurrency link code severity", "benchmark",
       "Measured runs of the last benchmark during which a PCIe link flapped or stayed below capability."),
    _m("gpufleet_benchmark_timestamp_seconds", "gauge", "profile", "benchmark",
       "When the last benchmark of the profile finished, in seconds since the epoch."),
    # verdict: throughput_gate's result (the serving verdict)
    _m("gpufleet_verdict", "gauge", "stage change verdict", "verdict",
       "The serving verdict of a change (stage; change: what the candidate changed, none, kernel, host, driver, "
       "nccl, vllm_flags, vllm_version): 1 for the verdict given (pass, unstable, diverged, regression, inconclusive), 0 for "
       "the others."),
    _m("gpufleet_verdict_throughput_ratio", "gauge", "stage change", "verdict",
       "Candidate over baseline output tokens per second (geometric means of the runs) of the verdict."),
    _m("gpufleet_verdict_p_value", "gauge", "stage change", "verdict",
       "One-sided p-value that the candidate is slower than the baseline."),
    _m("gpufleet_verdict_runs_needed", "gauge", "stage change", "verdict",
       "More candidate runs the gate asks for (0 once final)."),
    # tuning: tune_measured's state, and the changes the tuning roles made (the audit report's tuning_changes)
    _m("gpufleet_tuning_stage_info", "gauge", "stage kind status verdict decision", "tuning",
       "A measured-tuning stage (kind: baseline, host, vllm, reboot) with its status, gate verdict and decision; value 1."),
    _m("gpufleet_tuning_stages", "gauge", "status", "tuning", "Measured-tuning stages per status."),
    _m("gpufleet_tuning_changes", "gauge", "role kind", "changes",
       "Settings a tuning role changed in the last run, per role and kind of change (kernel command line, ASPM policy, ...)."),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in CATALOGUE}
SOURCES = ("audit", "health", "benchmark", "verdict", "tuning", "changes")


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def sample(name: str, value: Any, **labels: Any) -> Sample | None:
    """One series, or None when the value is missing (a metric that was not measured is left out, never written as 0)."""
    if value is None:
        return None
    metric = BY_NAME.get(name)
    if metric is None:
        raise ValueError(f"{name} is not a metric of the catalogue")
    if set(labels) != set(metric.labels):
        raise ValueError(f"{name} takes the labels {', '.join(metric.labels)}, not {', '.join(sorted(labels))}")
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: {value!r} is not a finite number")
    return Sample(name, tuple((k, "" if labels[k] is None else str(labels[k])) for k in metric.labels), value)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return repr(float(value)) if value != int(value) or abs(value) >= 1e15 else str(int(value))


def render(samples: Iterable[Sample | None]) -> str:
    """The text exposition format: per metric of the catalogue that has samples, in catalogue order, its HELP and TYPE
    lines and its series sorted by labels. The same samples give the same bytes (a file rewritten only on a change).
    Two samples of one series are an error."""
    by_metric: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for s in samples:
        if s is None:
            continue
        series = by_metric.setdefault(s.name, {})
        if s.labels in series:
            raise ValueError(f"{s.name}{dict(s.labels)} is given twice")
        series[s.labels] = s.value
    out = []
    for metric in CATALOGUE:
        if metric.name not in by_metric:
            continue
        out += [f"# HELP {metric.name} {_escape_help(metric.help)}", f"# TYPE {metric.name} {metric.type}"]
        for labels, value in sorted(by_metric[metric.name].items()):
            text = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
            out.append(f"{metric.name}{{{text}}} {_value(value)}")
    return "\n".join(out) + "\n" if out else ""


def catalogue_problems(catalogue: Sequence[Metric] = CATALOGUE) -> list[str]:
    """What breaks Prometheus' naming rules in the catalogue (tests/unit checks it is empty)."""
    problems = []
    for m in catalogue:
        if not NAME_RE.match(m.name):
            problems.append(f"{m.name}: not gpufleet_ and lower-case words")
        if (m.type == "counter") != m.name.endswith("_total"):
            problems.append(f"{m.name}: _total is for counters, and every counter ends in it")
        if m.type not in ("gauge", "counter"):
            problems.append(f"{m.name}: type {m.type}")
        if m.labels[:1] != ("host",) or len(set(m.labels)) != len(m.labels) or not all(LABEL_RE.match(x) for x in m.labels):
            problems.append(f"{m.name}: labels {m.labels} (host first, lower-case, each once)")
        if m.source not in SOURCES:
            problems.append(f"{m.name}: source {m.source}")
        if any(word in m.name for word in ("_milliseconds", "_gts", "_ms_", "_percent")):
            problems.append(f"{m.name}: not in base units")
    if len({m.name for m in catalogue}) != len(catalogue):
        problems.append("a metric is defined twice")
    return problems


def metrics_of(source: str) -> list[Metric]:
    return [m for m in CATALOGUE if m.source == source]

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What each result of the collection says as metrics (metrics/textfile.py's catalogue): pure functions from the
documents the modules return to samples.

- ``audit_samples``: pcie_facts' ``pcie`` (findings per code and severity; every link on each GPU's path, current and
  capable, from config space as the audit report reads it; AER totals; NVML's PCIe replay counter);
- ``health_samples``: health_compare's findings;
- ``benchmark_samples``: inference_benchmark's result document (per level: median tok/s, CV, TTFT and TPOT p50/p99,
  failed requests, and the link findings of its measured runs as the history stores them);
- ``verdict_samples``: throughput_gate's result (the serving verdict, one series per possible verdict);
- ``tuning_samples``: tune_measured's state (one info series per stage, and stages per status);
- ``change_samples``: the tuning roles' changes of a run (the audit report's ``tuning_changes``).

A value the document does not hold is left out (never written as 0): a dashboard shows a gap, not a false reading.
"""

from __future__ import annotations

import calendar
import time
from typing import Any, Iterator, Sequence

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.history import link_findings
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.verdict import VERDICTS
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.workload import CHANGES
from ansible_collections.gpufleet.inference.plugins.module_utils.metrics.textfile import Sample, sample
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.audit_report import _link, link_degraded

GIGA = 1e9
SEVERITIES = ("critical", "warning", "info")
AER_TOTALS = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}


def epoch(iso: Any) -> float | None:
    """Seconds since the epoch of a ``YYYY-MM-DDTHH:MM:SSZ`` time; None when missing or malformed."""
    try:
        return float(calendar.timegm(time.strptime(str(iso), "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return None


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _per_code(name: str, host: str, findings: Sequence[Any]) -> list[Sample | None]:
    counts: dict[tuple[str, str], int] = {}
    for f in findings or []:
        if isinstance(f, dict) and f.get("code"):
            key = (str(f["code"]), str(f.get("severity") or "info"))
            counts[key] = counts.get(key, 0) + 1
    return [sample(name, n, host=host, code=code, severity=sev) for (code, sev), n in sorted(counts.items())]


def _seconds(ms: Any) -> float | None:
    value = _number(ms)
    return None if value is None else value / 1000.0


def _gpu_links(pcie: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(GPU address, link address, device record) for every function on each GPU's path, the GPU's own last."""
    devices = pcie.get("devices") or {}
    for gpu in pcie.get("gpus") or []:
        if not isinstance(gpu, dict) or not gpu.get("bdf"):
            continue
        path = [b for b in (gpu.get("path") or []) if isinstance(b, str)]
        for bdf in path + ([gpu["bdf"]] if gpu["bdf"] not in path else []):
            dev = devices.get(bdf)
            if isinstance(dev, dict):
                yield gpu["bdf"], bdf, dev


def audit_samples(pcie: dict[str, Any], host: str, timestamp: float | None = None) -> list[Sample | None]:
    out = _per_code("gpufleet_audit_findings", host, pcie.get("findings") or [])
    out.append(sample("gpufleet_audit_gpus", len(pcie.get("gpus") or []), host=host))
    out.append(sample("gpufleet_audit_timestamp_seconds", timestamp, host=host))
    for gpu, bdf, dev in _gpu_links(pcie):
        link = _link(dev)
        if link:
            labels = {"host": host, "gpu": gpu, "link": bdf}
            for name, key, scale in (("current_speed_transfers_per_second", "cur_gts", GIGA),
                                     ("max_speed_transfers_per_second", "max_gts", GIGA),
                                     ("current_width_lanes", "cur_width", 1), ("max_width_lanes", "max_width", 1)):
                value = _number(link.get(key))
                out.append(sample(f"gpufleet_pcie_link_{name}", None if value is None else value * scale, **labels))
            out.append(sample("gpufleet_pcie_link_degraded", int(link_degraded(link)), **labels))
        for severity, total in AER_TOTALS.items():
            counters = (dev.get("aer_counters") or {}).get(severity) or {}
            out.append(sample("gpufleet_pcie_aer_errors_total", _number(counters.get(total)), host=host, gpu=gpu,
                              link=bdf, severity=severity))
    for gpu, info in sorted(((pcie.get("nvml") or {}).get("gpus") or {}).items()):
        if isinstance(info, dict):
            out.append(sample("gpufleet_gpu_pcie_replay_total", _number(info.get("pcie_replay_counter")), host=host, gpu=gpu))
    return out


def health_samples(findings: Sequence[Any], host: str, timestamp: float | None = None) -> list[Sample | None]:
    out = _per_code("gpufleet_health_findings", host, findings)
    out.append(sample("gpufleet_health_timestamp_seconds", timestamp, host=host))
    return out


def benchmark_samples(doc: dict[str, Any], host: str, profile: str) -> list[Sample | None]:
    out: list[Sample | None] = [sample("gpufleet_benchmark_timestamp_seconds", epoch(doc.get("finished_at")), host=host,
                                       profile=profile)]
    for lv in doc.get("levels") or []:
        if not isinstance(lv, dict) or _number(lv.get("concurrency")) is None:
            continue
        labels = {"host": host, "profile": profile, "concurrency": int(lv["concurrency"])}
        tps = lv.get("output_throughput") or {}
        out.append(sample("gpufleet_benchmark_output_tokens_per_second", _number(tps.get("median")), **labels))
        out.append(sample("gpufleet_benchmark_output_throughput_cv_ratio", _number(tps.get("cv")), **labels))
        out.append(sample("gpufleet_benchmark_failed_requests", _number(lv.get("errors")), **labels))
        for key, name in (("ttft_ms", "time_to_first_token_seconds"), ("tpot_ms", "time_per_output_token_seconds")):
            quantiles = lv.get(key) or {}
            for q, field in (("0.5", "p50"), ("0.99", "p99")):
                out.append(sample(f"gpufleet_benchmark_{name}", _seconds(quantiles.get(field)), quantile=q, **labels))
    counts: dict[tuple[int, str, str, str], int] = {}
    for f in link_findings(doc)[1]:
        key = (f["concurrency"], f["device"], f["code"], f["severity"])
        counts[key] = counts.get(key, 0) + 1
    for (concurrency, link, code, severity), n in sorted(counts.items()):
        out.append(sample("gpufleet_benchmark_link_findings", n, host=host, profile=profile, concurrency=concurrency,
                          link=link, code=code, severity=severity))
    return out


def verdict_samples(result: dict[str, Any], host: str, stage: str, change: str) -> list[Sample | None]:
    """throughput_gate's result: its serving verdict (``verdict.verdict``; the gate's own ``decision`` when the
    result holds no serving verdict), the ratio, the p-value and the runs it still needs; ``change`` is what the
    candidate changed (the gate's ``change`` option, bench/workload.py CHANGES)."""
    if change not in CHANGES:
        raise ValueError(f"change {change!r} is not one of {', '.join(CHANGES)}")
    given = (result.get("verdict") or {}).get("verdict") if isinstance(result.get("verdict"), dict) else result.get("verdict")
    given = given or result.get("decision")
    if given not in VERDICTS:
        raise ValueError(f"the verdict {given!r} is not one of {', '.join(VERDICTS)}: give throughput_gate's result")
    labels = {"host": host, "stage": stage, "change": change}
    out = [sample("gpufleet_verdict", int(v == given), verdict=v, **labels) for v in VERDICTS]
    out.append(sample("gpufleet_verdict_throughput_ratio", _number(result.get("ratio")), **labels))
    out.append(sample("gpufleet_verdict_p_value", _number(result.get("p_value")), **labels))
    out.append(sample("gpufleet_verdict_runs_needed", _number(result.get("runs_needed")), **labels))
    return out


def tuning_samples(state: dict[str, Any], host: str) -> list[Sample | None]:
    """tune_measured's ``state`` (its ``stages`` entries with name, kind, status, verdict, decision)."""
    out: list[Sample | None] = []
    per_status: dict[str, int] = {}
    for e in state.get("stages") or []:
        if not isinstance(e, dict) or not (e.get("name") or e.get("stage")):
            continue
        status = str(e.get("status") or "pending")
        per_status[status] = per_status.get(status, 0) + 1
        out.append(sample("gpufleet_tuning_stage_info", 1, host=host, stage=e.get("name") or e.get("stage"),
                          kind=e.get("kind") or "", status=status, verdict=e.get("verdict") or "",
                          decision=e.get("decision") or ""))
    out += [sample("gpufleet_tuning_stages", n, host=host, status=s) for s, n in sorted(per_status.items())]
    return out


def change_samples(changes: Sequence[Any], host: str) -> list[Sample | None]:
    """The audit report's ``tuning_changes`` ([{role, what, actions}]): settings changed per role and kind."""
    counts: dict[tuple[str, str], int] = {}
    for c in changes or []:
        if isinstance(c, dict) and c.get("role"):
            key = (str(c["role"]), str(c.get("what") or ""))
            counts[key] = counts.get(key, 0) + max(1, len(c.get("actions") or []))
    return [sample("gpufleet_tuning_changes", n, host=host, role=role, kind=kind) for (role, kind), n in sorted(counts.items())]

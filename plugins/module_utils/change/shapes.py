# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The shapes the change flow reads (change/flow.py): predicates over journal records and event data, the fields
every change kind shares, and ``bad_field``, which names the first field that is not what it must be. A kind adds
its own fields (ChangeKind ``journal_fields``, ``event_fields``); the flow checks both before any step, so that a
damaged journal or event is refused (FlowError), never half-read.
"""

from __future__ import annotations

import math
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.gate_settings import LATENCY_METRICS
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.verdict import OUTPUT_ANSWERS

# Decisions a host can end with; the first three leave the host fine.
OK_DECISIONS = ("pass", "already", "planned")
DECISIONS = OK_DECISIONS + ("preflight_failed", "failed_boot", "reverted", "verify_failed", "unstable", "diverged",
                            "regression", "inconclusive", "error", "refused")
# Every way off the happy path after the first change ends in a rollback.
ROLLBACK_DECISIONS = ("preflight_failed", "failed_boot", "reverted", "verify_failed", "unstable", "diverged", "regression",
                      "inconclusive", "error")


def is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_numlike(value: Any) -> bool:
    """A finite number, or its text (values templated by the controller arrive as text)."""
    if isinstance(value, str):
        try:
            return math.isfinite(float(value))
        except ValueError:
            return False
    return is_num(value)


def is_count(value: Any) -> bool:
    """A count: an int >= 0, or its digits."""
    if isinstance(value, str):
        return value.strip().isdecimal()
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_text(value: Any) -> bool:
    return isinstance(value, str)


def list_of(item=None):
    return lambda value: isinstance(value, list) and (item is None or all(item(v) for v in value))


def is_dict(value: Any) -> bool:
    return isinstance(value, dict)


def optional(pred):
    return lambda value: value is None or pred(value)


def is_samples(value: Any) -> bool:
    """Runs of one level (a list), or ``{level: runs}``."""
    if isinstance(value, dict):
        return all(is_count(k) and list_of(is_numlike)(v) for k, v in value.items())
    return list_of(is_numlike)(value)


def is_runs(value: Any) -> bool:
    """Contaminated runs: a list of run indices, or ``{level: [index]}``."""
    if isinstance(value, dict):
        return all(is_count(k) and list_of(is_numlike)(v) for k, v in value.items())
    return list_of(is_numlike)(value)


def is_latency(value: Any) -> bool:
    """Per-run latency: {metric: [numbers]}, or {level: {metric: [numbers]}}."""
    if not isinstance(value, dict):
        return False
    return all(list_of(is_numlike)(v) if k in LATENCY_METRICS else is_count(k) and is_latency(v) for k, v in value.items())


def is_health(value: Any) -> bool:
    """A pcie_facts document as the stability part reads it: ``devices`` a dict of dicts, ``gpus`` a list of dicts
    with their ``bdf`` (each optional)."""
    if not isinstance(value, dict):
        return False
    devices, gpus = value.get("devices", {}), value.get("gpus", [])
    return isinstance(devices, dict) and all(isinstance(d, dict) for d in devices.values()) and \
        isinstance(gpus, list) and all(isinstance(g, dict) and isinstance(g.get("bdf"), str) for g in gpus)


def is_compared(value: Any) -> bool:
    """output_equivalence's compare result: its verdict one of OUTPUT_ANSWERS."""
    return isinstance(value, dict) and isinstance(value.get("verdict"), str) and value["verdict"] in OUTPUT_ANSWERS


def is_checks(value: Any) -> bool:
    """The checks after the gate: outputs (a compare result), health_after (a pcie_facts document), kernel_log."""
    return isinstance(value, dict) and optional(is_compared)(value.get("outputs")) \
        and optional(is_health)(value.get("health_after")) and optional(list_of(is_text))(value.get("kernel_log"))


def is_side(value: Any) -> bool:
    return isinstance(value, dict) and "samples" in value


def is_growing(value: Any) -> bool:
    """A side that more rounds are added to (the baseline before the pin, the candidate)."""
    return value is None or all(k in value for k in ("samples", "files", "contaminated"))


# field: (check, what it must be); a field that is absent is not checked (older journals, optional data)
VERDICT_FIELDS = {"decision": (lambda v: v in DECISIONS, f"one of {', '.join(DECISIONS)}"),
                  "reason": (is_text, "text"), "at": (optional(is_num), "epoch seconds"),
                  "parts": (optional(is_dict), "the serving verdict's parts")}
# a benchmark side's fields; a kind adds the one naming what was measured (ChangeKind side_key)
SIDE_FIELDS = {"latency": (optional(is_latency), "per-run latency: {metric: [ms per run]}"),
               "samples": (list_of(is_num), "a list of finite numbers"), "files": (list_of(is_text), "a list of paths"),
               "contaminated": (list_of(is_text), "a list of run indices as text"), "rounds": (is_count, "a count"),
               "failed": (optional(is_count), "a count"), "requests": (optional(is_count), "a count"),
               "concurrency": (optional(is_count), "a concurrency level")}
# the journal fields every kind has
JOURNAL_FIELDS = {
    "run_id": (is_text, "text"), "started_at": (optional(is_num), "epoch seconds"), "updated_at": (optional(is_num), "epoch seconds"),
    "baseline": (optional(is_side), "a benchmark side (samples)"),
    "candidate": (optional(lambda v: is_side(v) and is_growing(v)), "a benchmark side (samples, files, contaminated)"),
    "findings_before": (optional(list_of(is_text)), "a list of code@device"), "gate": (optional(is_dict), "the gate's answer"),
    "baseline_gate": (optional(is_dict), "the gate's answer"), "verdict": (optional(is_dict), "a verdict (decision, reason)"),
    "finished": (lambda v: isinstance(v, bool), "true or false"),
    "history": (list_of(is_dict), "a list of records"), "resumed": (list_of(is_dict), "a list of records"),
    "taken_over": (list_of(is_dict), "a list of records"), "locked": (optional(list_of(is_text)), "a list of package names"),
    "outputs_reference": (optional(lambda v: is_dict(v) and is_text(v.get("path"))), "an output reference record (path, band)"),
    "health_before": (optional(is_health), "a pcie_facts document (devices, gpus)"),
    "checks": (optional(is_checks), "the checks after the gate (outputs, health_after, kernel_log)"),
}
# event: {data field: (check, what it must be)}, for the events every kind has; a kind adds its own, and may add
# fields to these (the benchmark's side_key)
EVENT_FIELDS = {
    "benchmarked": {"label": (optional(is_text), "baseline or candidate"), "samples": (optional(is_samples), "runs: a list of "
                    "numbers, or {level: [numbers]}"), "contaminated": (optional(is_runs), "run indices, or {level: [index]}"),
                    "concurrency": (optional(is_count), "a concurrency level (0: the highest)"),
                    "files": (optional(list_of(is_text)), "a list of paths"), "failed": (optional(is_count), "a "
                    "count"), "requests": (optional(is_count), "a count"), "latency": (optional(is_latency), "per-run latency: "
                    "{metric: [ms]}, or {level: {metric: [ms]}}")},
    "audited": {"findings": (optional(list_of(is_dict)), "a list of findings"),
                "pcie": (optional(is_health), "a pcie_facts document (devices, gpus)")},
    "outputs": {"reference": (optional(is_text), "the reference file"), "model": (optional(is_text), "the served model"),
                "band": (optional(is_dict), "the A/A band"), "aa": (optional(is_dict), "the A/A figures")},
    "checked": {"outputs": (optional(is_compared),
                            f"output_equivalence's compare result (verdict {', '.join(OUTPUT_ANSWERS)})"),
                "pcie": (optional(is_health), "a pcie_facts document (devices, gpus)"),
                "kernel_log": (optional(list_of(is_text)), "a list of lines")},
    "committed": {"locked": (optional(list_of(is_text)), "a list of package names")},
    "rolled_back": {"locked": (optional(list_of(is_text)), "a list of package names")},
    "locked": {"locked": (optional(list_of(is_text)), "a list of package names")},
    "error": {"msg": (optional(is_text), "text")},
}


def bad_field(record: dict[str, Any], fields: dict[str, tuple]) -> tuple[str, str] | None:
    """(field, what it must be) of the first field of ``record`` that is not what ``fields`` says; None when all are."""
    for key, (check, what) in fields.items():
        if key in record and not check(record[key]):
            return key, what
    return None

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving verdict: a change is kept only when the host serves as fast, as quickly, as correctly and as stably.

Four parts, each answered by its own machinery and reported with its figures:

* ``throughput`` and ``latency``: the gate's decide() (bench/throughput_gate.py): ``pass``, ``regression`` or
  ``inconclusive`` (the latency part's own answer is in the gate result's ``latency``);
* ``outputs``: output_equivalence's compare (bench/equivalence.py): ``equivalent``, ``drifted`` (beyond the A/A band,
  within the user's tolerance: a yes, said) or ``diverged``;
* ``stability``: pcie/health.py's stability(): ``stable`` or ``unstable`` (a GPU gone, a link trained down, new AER
  errors, Xid events, more failed requests, and from gpu_health: uncorrectable ECC errors, a pending or failed row remap,
  hardware throttling, a grown PCIe replay counter, a failed DCGM test).

A part that was not measured does not say no, and the verdict says it was not measured. The verdict is the first
no in the order ``unstable``, ``diverged``, ``regression``, ``inconclusive`` (a host that lost a GPU is unstable
whatever its tok/s), else ``pass``; ``keep`` is true for ``pass`` only. A part left out on purpose is given as
``{"status": "not measured", "reason": why}`` and named so. ``judged_verdict()`` is the one entry of every caller
(the throughput_gate module, the kernel upgrade, measured tuning): it takes the health documents before and after
and asks pcie/health.py for the stability part. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Sequence

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.health import stability

PARTS = ("throughput", "latency", "outputs", "stability")
VERDICTS = ("pass", "unstable", "diverged", "regression", "inconclusive")
OUTPUT_ANSWERS = {"equivalent": "yes", "drifted": "yes", "diverged": "no"}
NOT_MEASURED = "not measured: "  # how the gate's reason for a part it left out starts (the part says it already)


class VerdictError(ValueError):
    """A part given in a shape no part has: the message names the part and what it should be."""


def serving_verdict(gate: dict[str, Any], outputs: dict[str, Any] | None = None,
                    stability: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{verdict, keep, reason, parts}`` of a change from the gate's result and, where measured, the output
    comparison's and the stability check's. ``parts`` holds each part's ``answer`` (its own word), ``says``
    (``yes``, ``no``, ``wait`` or ``not measured``) and ``reason``."""
    parts = {"throughput": _throughput_part(gate), "latency": _latency_part(gate),
             "outputs": _outputs_part(outputs), "stability": _stability_part(stability)}
    if parts["stability"]["says"] == "no":
        verdict, why = "unstable", parts["stability"]["reason"]
    elif parts["outputs"]["says"] == "no":
        verdict, why = "diverged", parts["outputs"]["reason"]
    else:
        verdict, why = _gate_verdict(gate)
    unmeasured = [name for name in PARTS if parts[name]["says"] == "not measured"]
    head = why if why.startswith(f"{verdict}") else f"{verdict}: {why}"  # the gate's reasons start with their answer
    reason = head + (f" ({', '.join(unmeasured)} not measured)" if unmeasured else "")
    return {"verdict": verdict, "keep": verdict == "pass", "reason": reason, "parts": parts}


def judged_verdict(gate: dict[str, Any], outputs: dict[str, Any] | None = None, before: dict[str, Any] | None = None,
                   after: dict[str, Any] | None = None, kernel_log: Sequence[str] | str = (),
                   requests: dict[str, Any] | None = None, stability_left_out: str | None = None,
                   gpu_findings: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """serving_verdict() with the stability part computed here: pcie/health.py stability() over the audits ``before``
    and ``after`` the change, the kernel log since, each side's failed and sent requests (``requests``) and the GPUs'
    health findings that make a change unstable (``gpu_findings``, gpu/checks.py; None: not read).
    ``stability_left_out`` says why the host's health was not compared (it is named in the part's reason).
    VerdictError or ValueError for parts in a shape no part has."""
    steady = stability(before, after, kernel_log, requests=requests, gpu_findings=gpu_findings)
    if stability_left_out and "host" not in (steady.get("measured") or []):
        if steady["status"] == "not measured":
            steady = {**steady, "reason": f"host health {stability_left_out}"}
        else:
            steady = {**steady, "reason": f"{steady['reason']}; host health {stability_left_out}"}
    return serving_verdict(gate, outputs, steady)


def _gate_verdict(gate: dict[str, Any]) -> tuple[str, str]:
    decision = gate.get("decision")
    if decision not in ("pass", "regression", "inconclusive"):
        raise VerdictError(f"the gate's result has decision {decision!r}: give the result of throughput_gate "
                           "(pass, regression or inconclusive)")
    if decision == "pass" and not gate.get("final", True):
        return "inconclusive", "the gate wants more runs before it can pass: " + str(gate.get("reason", ""))
    return decision, str(gate.get("reason", ""))


def _throughput_part(gate: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(gate, dict) or "decision" not in gate:
        raise VerdictError("the gate's result is required (a throughput_gate result with its decision)")
    own = gate.get("throughput") or gate
    decision = own.get("decision")
    return {"answer": decision, "says": _says(decision, own.get("final", True)), "ratio": own.get("ratio"),
            "reason": str(own.get("reason", ""))}


def _latency_part(gate: dict[str, Any]) -> dict[str, Any]:
    part = gate.get("latency") or {}
    metrics = part.get("metrics") or {}
    if not metrics:  # the gate's own reason when it gives one (no margin set, no per-run latency on a side)
        why = str(part.get("reason") or "no per-run latency was given to the gate")
        return {"answer": None, "says": "not measured", "reason": why[len(NOT_MEASURED):] if why.startswith(NOT_MEASURED) else why}
    bad = [m for m in metrics.values() if m.get("decision") == "regression"]
    open_ = [m for m in metrics.values() if m.get("decision") != "pass"]
    decision = "regression" if bad else ("pass" if not open_ else "inconclusive")
    final = bool(bad) or all(m.get("final", True) for m in metrics.values())
    reason = "; ".join(str(m.get("reason", "")) for m in (bad or open_ or metrics.values()))
    unjudged = part.get("not_judged") or {}
    if isinstance(unjudged, dict) and unjudged:  # said, so that a pass never reads as if they were judged
        reason += f" ({', '.join(str(k) for k in unjudged)} not judged: see latency.not_judged)"
    return {"answer": decision, "says": _says(decision, final), "reason": reason}


def _outputs_part(outputs: dict[str, Any] | None) -> dict[str, Any]:
    if not outputs or (outputs.get("status") == "not measured" and outputs.get("verdict") is None):
        return {"answer": None, "says": "not measured",
                "reason": (outputs or {}).get("reason") or "the outputs were not compared with a reference"}
    answer = outputs.get("verdict")
    if answer not in OUTPUT_ANSWERS:
        raise VerdictError(f"outputs has verdict {answer!r}: give output_equivalence's compare result "
                           f"({', '.join(OUTPUT_ANSWERS)})")
    return {"answer": answer, "says": OUTPUT_ANSWERS[answer], "reason": str(outputs.get("reason", "")),
            "figures": outputs.get("figures")}


def _stability_part(stability: dict[str, Any] | None) -> dict[str, Any]:
    if not stability or stability.get("status") == "not measured":
        return {"answer": None, "says": "not measured",
                "reason": (stability or {}).get("reason") or "no audit before and after the change"}
    answer = stability.get("status")
    if answer not in ("stable", "unstable"):
        raise VerdictError(f"stability has status {answer!r}: give pcie/health.py stability()'s result "
                           "(stable, unstable or not measured)")
    return {"answer": answer, "says": "yes" if answer == "stable" else "no", "reason": str(stability.get("reason", "")),
            "findings": list(stability.get("findings") or [])}


def _says(decision: Any, final: bool) -> str:
    if decision == "pass":
        return "yes" if final else "wait"
    if decision == "regression":
        return "no"
    return "no" if final else "wait"


def part_summary(name: str, part: dict[str, Any] | None) -> dict[str, Any]:
    """What a report shows of one part: its answer, what it says, why, and its main figures (the throughput ratio, the
    outputs' top-1 agreement and logprob differences, the stability findings as ``code@device``); {} for no part."""
    if not isinstance(part, dict):
        return {}
    out = {"answer": part.get("answer"), "says": part.get("says"), "reason": part.get("reason") or ""}
    if name == "throughput" and part.get("ratio") is not None:
        out["figures"] = {"ratio": part["ratio"]}
    elif name == "outputs" and isinstance(part.get("figures"), dict):
        out["figures"] = {k: part["figures"][k] for k in ("top1_agreement", "mean_abs_logprob_diff", "p99_abs_logprob_diff")
                          if k in part["figures"]}
    elif name == "stability" and part.get("findings"):
        out["figures"] = {"findings": [f"{f.get('code')}@{f.get('device')}" for f in part["findings"] if isinstance(f, dict)]}
    return out


def part_cell(name: str, summary: dict[str, Any] | None) -> str:
    """One part in a table cell: what it says (and its answer where that is more than yes), with its main figure."""
    if not summary:
        return "-"
    figures = summary.get("figures") or {}
    says = str(summary.get("says"))
    if summary.get("says") == "no" and summary.get("answer"):
        says += f" ({summary['answer']})"
    if name == "throughput" and isinstance(figures.get("ratio"), (int, float)):
        return f"{says} {figures['ratio']:.3f}"
    if name == "outputs" and isinstance(figures.get("top1_agreement"), (int, float)):
        return f"{says} top-1 {figures['top1_agreement']:.3f}"
    if name == "stability" and figures.get("findings"):
        return f"{says} " + ", ".join(figures["findings"])
    return says

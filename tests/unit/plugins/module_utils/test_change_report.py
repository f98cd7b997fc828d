# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet report of every change kind (change/report.py): a kind column, the title of a one-kind rollout, and a
record without a kind read as the kernel's (records written before the kinds)."""

from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils.change import report


def record(host: str, kind: str | None, decision: str, **extra) -> dict:
    rec = {"host": host, "run_id": "r1", "decision": decision, "reason": f"{decision} (test)", "old": "a", "target": "b",
           "baseline": {"samples": [100.0, 101.0, 99.0]}, "candidate": {"samples": [98.0, 100.0, 99.0]}, **extra}
    if kind:
        rec["kind"] = kind
    return rec


def test_a_vllm_rollout_has_its_title_and_kind_and_what_runs_after():
    rep = report.fleet_report([record("gpu1", "vllm", "pass", final_version="0.33.1"),
                               record("gpu2", "vllm", "diverged", final_version="0.32.0")], ["gpu1", "gpu2"], "r1")
    assert rep["kinds"] == ["vllm"] and rep["failed"] == ["gpu2"]
    assert [h["final_kernel"] for h in rep["hosts"]] == ["0.33.1", "0.32.0"]
    md = report.render_markdown(rep)
    assert md.startswith("# vLLM rollout r1\n\nOutcome: 1 diverged, 1 pass; failed: gpu2.")
    assert "| total s | kind |" in md and md.count(" | vllm |") == 2


def test_a_record_without_a_kind_is_the_kernels_and_mixed_kinds_are_a_change_rollout():
    rep = report.fleet_report([record("gpu1", None, "pass"), record("gpu2", "vllm", "pass")], ["gpu1", "gpu2", "gpu3"])
    assert rep["kinds"] == ["kernel", "vllm"] and [h["kind"] for h in rep["hosts"][:2]] == ["kernel", "vllm"]
    md = report.render_markdown(rep)
    assert md.startswith("# Change rollout\n") and "| gpu3 | **not reached** |" in md
    assert report.render_markdown(report.fleet_report([record("gpu1", None, "pass")], ["gpu1"])).startswith("# Kernel rollout")

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""DCGM's quick diagnostic (``dcgmi diag -r 1 -j``): its JSON read into test results and findings.

parse() is pure; it reads the JSON of DCGM 3 (``"DCGM GPU Diagnostic"``) and DCGM 4 (``"DCGM Diagnostic"``): the
categories' tests and each result's status (Pass, Fail, Warn, Skip) with its warnings. findings() turns failed and
warned tests into gpu_health findings; outcome() judges one run of the command (its exit status and output).
"""

from __future__ import annotations

import json
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.gpu.checks import finding

DIAG_ARGV = ("diag", "-r", "1", "-j")
TIMED_OUT_RC = 124  # coreutils timeout(1)


def parse(text: str) -> list[dict[str, Any]]:
    """[{category, test, status, gpu, messages}] of a ``dcgmi diag -j`` output; ValueError when it holds no
    diagnostic (not JSON, or JSON without test categories)."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise ValueError("dcgmi diag printed no JSON") from None
    body = next((v for v in (doc.values() if isinstance(doc, dict) else []) if isinstance(v, dict)
                 and "test_categories" in v), None)
    if body is None:
        raise ValueError("dcgmi diag's JSON has no test_categories")
    out = []
    for category in body.get("test_categories") or []:
        for test in category.get("tests") or []:
            for result in test.get("results") or [{}]:
                out.append({"category": str(category.get("category", "")), "test": str(test.get("name", "")),
                            "status": str(result.get("status", "unknown")).lower(),
                            "gpu": result.get("gpu_id", result.get("entity_id", result.get("gpu_ids"))),
                            "messages": _messages(result)})
    return out


def _messages(result: dict[str, Any]) -> list[str]:
    out = []
    for key in ("warnings", "errors", "info"):
        for item in result.get(key) or []:
            text = item.get("warning") or item.get("error") or item.get("message") if isinstance(item, dict) else item
            if text:
                out.append(str(text))
    return out


def findings(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A finding for each failed (critical) or warned (warning) test result."""
    out = []
    for r in results:
        if r["status"] not in ("fail", "warn", "warning"):
            continue
        failed = r["status"] == "fail"
        gpu = f" on GPU {r['gpu']}" if r["gpu"] not in (None, "", []) else ""
        out.append(finding(
            "dcgm_diag", "critical" if failed else "warning", None,
            f"dcgmi diag -r 1: {r['category']} test {r['test']} {'failed' if failed else 'warned'}{gpu}"
            + (": " + "; ".join(r["messages"]) if r["messages"] else ""),
            "Read the test's message: a Deployment failure names the setting or driver piece at fault (persistence, "
            "permissions, a denylisted page, an environment variable); a hardware test failure wants dcgmi diag -r 3 "
            "in a drain and, if it repeats, an RMA."))
    return out


def outcome(rc: int, out: str, err: str, timeout: int) -> dict[str, Any]:
    """The ``dcgm`` part of gpu_health's result from one run: ``{ran, rc, results, note}`` and its findings."""
    if rc == TIMED_OUT_RC:
        note = f"dcgmi diag -r 1 did not finish in {timeout} s: stopped"
        return {"ran": True, "rc": rc, "results": [], "note": note, "findings": [finding(
            "dcgm_diag", "warning", None, note, "Run dcgmi diag -r 1 by hand to see where it hangs; a hung GPU shows "
            "in the kernel log (Xid) and nvidia-smi.")]}
    try:
        results = parse(out)
    except ValueError as reason:
        text = (err or out).strip().splitlines()
        note = f"dcgmi diag -r 1 exited {rc} with no diagnostic ({reason}): {text[-1] if text else 'no output'}"
        return {"ran": True, "rc": rc, "results": [], "note": note, "findings": [finding(
            "dcgm_unavailable", "info", None, note, "Start DCGM's host engine (systemctl enable --now nvidia-dcgm, or "
            "nv-hostengine) and check that dcgmi discovery -l lists the GPUs.")]}
    return {"ran": True, "rc": rc, "results": results, "note": None, "findings": findings(results)}

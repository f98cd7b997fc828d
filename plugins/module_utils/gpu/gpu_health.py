# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The executor of gpu_health: read every GPU's health through NVML (readings.py), run DCGM's quick diagnostic where
dcgmi is installed (dcgm.py), and judge both (checks.py). Read-only: nothing is ever written to a GPU or the host."""

from __future__ import annotations

from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed, bounded
from ansible_collections.gpufleet.inference.plugins.module_utils.gpu.checks import SEVERITY_ORDER, Limits, evaluate, unstable
from ansible_collections.gpufleet.inference.plugins.module_utils.gpu.dcgm import DIAG_ARGV, outcome
from ansible_collections.gpufleet.inference.plugins.module_utils.gpu.readings import read
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.nvml import HAS_PYNVML, NvmlUnavailable, session

DEFAULTS = {"include_nvml": "auto", "dcgm_diag": "auto", "dcgm_timeout": 300, "previous": None, "clock_ratio": 0.9,
            "corrected_warn": 1000}


def execute(params: dict, host: Host, check_mode: bool, nvml_lib=None) -> dict[str, Any]:
    """gpu_health's result: ``gpus`` (readings by BDF), ``dcgm``, ``findings`` (most severe first), ``summary``."""
    p = dict(DEFAULTS, **{k: v for k, v in params.items() if v is not None})
    limits = Limits(clock_ratio=bounded("clock_ratio", p["clock_ratio"], 0.1, 1.0),
                    corrected_warn=bounded("corrected_warn", p["corrected_warn"], 0, 10 ** 12))
    bounded("dcgm_timeout", p["dcgm_timeout"], 10, 7200, "seconds")
    previous = _previous_gpus(p["previous"])
    nvml = _read_nvml(p["include_nvml"], nvml_lib, host.fs.root)
    found = evaluate(nvml["gpus"], previous, limits) if nvml["available"] else []
    diag = run_dcgm(host, p["dcgm_diag"], int(p["dcgm_timeout"]))
    found = sorted(found + diag.pop("findings"), key=lambda f: SEVERITY_ORDER.get(f["severity"], 3))
    summary = {sev: sum(1 for f in found if f["severity"] == sev) for sev in ("critical", "warning", "info")}
    return {"changed": False, "actions": [], "available": nvml["available"], "error": nvml["error"],
            "gpus": nvml["gpus"], "dcgm": diag, "findings": found, "summary": summary,
            "unstable": unstable(found)}


def _previous_gpus(previous: Any) -> dict[str, dict[str, Any]]:
    """The ``gpus`` of a previous gpu_health result (the whole result or its ``gpus``); {} for none."""
    if not previous:
        return {}
    if not isinstance(previous, dict):
        raise Failed(f"previous must be a mapping (an earlier gpu_health result), got {type(previous).__name__}. "
                     "Nothing was read.", changed=False)
    gpus = previous.get("gpus", previous)
    if not isinstance(gpus, dict) or not all(isinstance(g, dict) for g in gpus.values()):
        raise Failed("previous.gpus must map each GPU address to its readings (an earlier gpu_health result). "
                     "Nothing was read.", changed=False)
    return gpus


def _read_nvml(mode: str, nvml_lib, root: str) -> dict[str, Any]:
    empty = {"available": False, "error": None, "gpus": {}}
    if mode == "never":
        return dict(empty, error="include_nvml is never")
    if nvml_lib is None and root != "/":
        return dict(empty, error=f"NVML describes the live host, not the tree under root {root}")
    if nvml_lib is None and not HAS_PYNVML and mode == "auto":
        return dict(empty, error="nvidia-ml-py (pynvml) is not installed for this interpreter")
    try:
        return {"available": True, "error": None, "gpus": session(nvml_lib, read)}
    except NvmlUnavailable as err:
        if mode == "always":
            raise Failed(f"NVML could not be read on this host (include_nvml=always): {err}. Install the NVIDIA driver "
                         "and nvidia-ml-py for the interpreter that runs the module, or set include_nvml: auto.",
                         changed=False) from None
        return dict(empty, error=str(err))


def run_dcgm(host: Host, mode: str, timeout: int) -> dict[str, Any]:
    """``dcgmi diag -r 1 -j`` under timeout(1) where dcgmi is installed (``auto``), always (``always``: Failed without
    it) or never; ``{ran, rc, results, note, findings}``."""
    if mode == "never":
        return {"ran": False, "rc": None, "results": [], "note": "dcgm_diag is never: not run", "findings": []}
    dcgmi = host.cmd.find("dcgmi")
    if dcgmi is None:
        if mode == "always":
            raise Failed("dcgm_diag=always but dcgmi is not installed on this host: install DCGM (datacenter-gpu-"
                         "manager) or set dcgm_diag: auto. Nothing was run.", changed=False)
        return {"ran": False, "rc": None, "results": [], "note": "dcgmi is not installed: DCGM's diagnostic skipped",
                "findings": []}
    timeout_bin = host.cmd.find("timeout", required=True, hint="install coreutils")
    rc, out, err = host.cmd.run(host.cmd.argv([timeout_bin, str(timeout), dcgmi, *DIAG_ARGV]))
    return outcome(rc, out, err, timeout)

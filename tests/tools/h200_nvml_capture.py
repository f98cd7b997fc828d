#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A raw, read-only dump of what NVML says about each GPU's health (issue 37's fields), for fixtures.

Every call is a query (nvmlDeviceGet*): nothing is set, reset or cleared. Each field is stored as NVML returned it
(numbers, strings, lists) or as the NVML error's name when the call is not supported; the fake NVML of the unit
tests replays this file. Usage (device): python3 h200_nvml_capture.py OUT.json
"""

from __future__ import annotations

import json
import sys
import time

import pynvml as nv

CONST = {name: getattr(nv, name) for name in dir(nv) if name.startswith(("NVML_", "nvmlClocksThrottleReason", "nvmlClocksEvent"))}


def plain(value):
    """An NVML answer as JSON: ctypes structures by their fields, bytes as text."""
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    fields = getattr(value, "_fields_", None)
    if fields:
        return {f[0]: plain(getattr(value, f[0])) for f in fields}
    return repr(value)


def call(fn: str, *args):
    try:
        return {"value": plain(getattr(nv, fn)(*args))}
    except nv.NVMLError as err:
        return {"error": type(err).__name__, "text": str(err)}
    except (AttributeError, TypeError) as err:  # a binding this nvidia-ml-py lacks
        return {"error": type(err).__name__, "text": str(err)}


def ecc(handle) -> dict:
    out = {}
    for etype in ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"):
        for counter in ("NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC"):
            out[f"{etype}/{counter}"] = call("nvmlDeviceGetTotalEccErrors", handle, CONST[etype], CONST[counter])
    return out


def gpu(index: int) -> dict:
    h = nv.nvmlDeviceGetHandleByIndex(index)
    single = ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo", "nvmlDeviceGetEccMode",
              "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRowRemapperHistogram",
              "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetCurrentClocksEventReasons",
              "nvmlDeviceGetSupportedClocksThrottleReasons", "nvmlDeviceGetSupportedClocksEventReasons",
              "nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetPowerManagementDefaultLimit",
              "nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerUsage",
              "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetPerformanceState",
              "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
              "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetComputeMode", "nvmlDeviceGetMemoryInfo",
              "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetInforomVersion", "nvmlDeviceGetVbiosVersion")
    out = {fn: call(fn, h) for fn in single}
    out["ecc"] = ecc(h)
    for cause in ("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"):
        out[f"nvmlDeviceGetRetiredPages/{cause}"] = call("nvmlDeviceGetRetiredPages", h, CONST[cause])
    for clock in ("NVML_CLOCK_GRAPHICS", "NVML_CLOCK_SM", "NVML_CLOCK_MEM"):
        out[f"nvmlDeviceGetClockInfo/{clock}"] = call("nvmlDeviceGetClockInfo", h, CONST[clock])
        out[f"nvmlDeviceGetMaxClockInfo/{clock}"] = call("nvmlDeviceGetMaxClockInfo", h, CONST[clock])
        out[f"nvmlDeviceGetApplicationsClock/{clock}"] = call("nvmlDeviceGetApplicationsClock", h, CONST[clock])
    out["nvmlDeviceGetTemperature/NVML_TEMPERATURE_GPU"] = call("nvmlDeviceGetTemperature", h, CONST["NVML_TEMPERATURE_GPU"])
    return out


def main() -> int:
    nv.nvmlInit()
    try:
        doc = {"taken": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "driver": call("nvmlSystemGetDriverVersion"),
               "nvml": call("nvmlSystemGetNVMLVersion"), "cuda_driver": call("nvmlSystemGetCudaDriverVersion"),
               "pynvml": getattr(nv, "__version__", None),
               "constants": {k: v for k, v in CONST.items() if isinstance(v, int) and ("THROTTLE" in k.upper()
                                                                                       or "EVENT" in k.upper())},
               "gpus": [gpu(i) for i in range(nv.nvmlDeviceGetCount())]}
    finally:
        nv.nvmlShutdown()
    with open(sys.argv[1], "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
    print("nvml capture:", len(doc["gpus"]), "GPU(s),", sum(1 for g in doc["gpus"] for v in g.values() if "error" in v), "unsupported")
    return 0


if __name__ == "__main__":
    sys.exit(main())

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What NVML (nvidia-ml-py's ``pynvml``) says about each GPU's health, read-only, keyed by BDF.

read() is a thin reader: one NVML call per field, and a call the GPU or driver does not answer
(``NVMLError_NotSupported`` on a VM, retired pages on a GPU that remaps rows, ...) leaves the field
None and its name in the GPU's ``unsupported`` list instead of failing the read. The values keep
NVML's units (clocks in MHz, power in milliwatts); checks.py judges them. Nothing here writes to a GPU.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import normalize_bdf

# NVML's enums, literal (the values of nvml.h; older nvidia-ml-py releases lack some names).
ECC_ERROR_TYPES = (("corrected", 0), ("uncorrected", 1))          # nvmlMemoryErrorType_t
ECC_COUNTERS = (("volatile", 0), ("aggregate", 1))                # nvmlEccCounterType_t
CLOCK_TYPES = (("graphics", 0), ("sm", 1), ("memory", 2))         # nvmlClockType_t
RETIREMENT_CAUSES = (("single_bit", 0), ("double_bit", 1))         # nvmlPageRetirementCause_t
# nvmlClocksEventReasons (formerly ThrottleReasons), bit -> name.
THROTTLE_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}
THROTTLE_CALLS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")

SCALAR_FIELDS = (
    ("persistence_mode", "nvmlDeviceGetPersistenceMode"),
    ("power_limit_mw", "nvmlDeviceGetPowerManagementLimit"),
    ("power_default_limit_mw", "nvmlDeviceGetPowerManagementDefaultLimit"),
    ("power_enforced_limit_mw", "nvmlDeviceGetEnforcedPowerLimit"),
    ("power_usage_mw", "nvmlDeviceGetPowerUsage"),
    ("temperature_c", "nvmlDeviceGetTemperature", 0),                # NVML_TEMPERATURE_GPU
    ("pcie_replay_counter", "nvmlDeviceGetPcieReplayCounter"),
    ("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus"),
)


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _call(nv, unsupported: list, field: str, fn: str, *args):
    try:
        return getattr(nv, fn)(*args)
    except Exception:  # pylint: disable=broad-except  # NVMLError_NotSupported, a missing function, and friends
        unsupported.append(field)
        return None


def read(nv) -> dict[str, dict[str, Any]]:
    """Every GPU's health readings, by BDF, from an initialised NVML (pcie/nvml.py's collect() opens and closes it)."""
    out = {}
    for index in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        bdf = normalize_bdf(_text(nv.nvmlDeviceGetPciInfo(handle).busId))
        out[bdf] = read_gpu(nv, handle, index)
    return out


def read_gpu(nv, handle, index: int) -> dict[str, Any]:
    """One GPU's readings: ECC, retired pages, remapped rows, throttle reasons, clocks, power, persistence, replays."""
    unsupported: list[str] = []
    gpu: dict[str, Any] = {"index": index, "unsupported": unsupported}
    name = _call(nv, unsupported, "name", "nvmlDeviceGetName", handle)
    gpu["name"] = _text(name) if name is not None else None
    for field, fn, *args in SCALAR_FIELDS:
        gpu[field] = _call(nv, unsupported, field, fn, handle, *args)
    mode = _call(nv, unsupported, "ecc_mode", "nvmlDeviceGetEccMode", handle)
    gpu["ecc_mode"] = {"current": int(mode[0]), "pending": int(mode[1])} if mode is not None else None
    gpu["ecc"] = _ecc(nv, handle, unsupported) if gpu["ecc_mode"] and gpu["ecc_mode"]["current"] else None
    gpu["retired_pages"] = _retired_pages(nv, handle, unsupported)
    rows = _call(nv, unsupported, "remapped_rows", "nvmlDeviceGetRemappedRows", handle)
    gpu["remapped_rows"] = None if rows is None else {
        "correctable": int(rows[0]), "uncorrectable": int(rows[1]), "pending": bool(rows[2]), "failure": bool(rows[3])}
    gpu["throttle_reasons"] = _throttle(nv, handle, unsupported)
    gpu["clocks_mhz"] = {}
    gpu["max_clocks_mhz"] = {}
    for clock, code in CLOCK_TYPES:
        gpu["clocks_mhz"][clock] = _call(nv, unsupported, f"clock_{clock}", "nvmlDeviceGetClockInfo", handle, code)
        gpu["max_clocks_mhz"][clock] = _call(nv, unsupported, f"max_clock_{clock}", "nvmlDeviceGetMaxClockInfo", handle,
                                             code)
    return gpu


def _ecc(nv, handle, unsupported: list) -> dict[str, dict[str, int | None]]:
    """{volatile|aggregate: {corrected, uncorrected}}: the volatile counters since the driver loaded, the aggregate
    ones over the GPU's life."""
    out: dict[str, dict[str, int | None]] = {}
    for counter, ccode in ECC_COUNTERS:
        out[counter] = {}
        for kind, kcode in ECC_ERROR_TYPES:
            out[counter][kind] = _call(nv, unsupported, f"ecc_{counter}_{kind}", "nvmlDeviceGetTotalEccErrors", handle,
                                       kcode, ccode)
    return out


def _retired_pages(nv, handle, unsupported: list) -> dict[str, int] | None:
    """{single_bit, double_bit}: how many pages were retired for each cause (GPUs before Ampere; A100 and later
    remap rows instead and do not answer)."""
    out = {}
    for cause, code in RETIREMENT_CAUSES:
        pages = _call(nv, unsupported, f"retired_pages_{cause}", "nvmlDeviceGetRetiredPages", handle, code)
        if pages is None:
            return None
        out[cause] = len(pages)
    return out


def _throttle(nv, handle, unsupported: list) -> list[str] | None:
    """The names of the active clock event (throttle) reasons, from the newer or the older NVML call."""
    for fn in THROTTLE_CALLS:
        try:
            mask = int(getattr(nv, fn)(handle))
        except Exception:  # pylint: disable=broad-except  # an older library lacks the new name, or not supported
            continue
        return [name for bit, name in sorted(THROTTLE_REASONS.items()) if mask & bit] + \
            ([f"unknown_0x{mask & ~sum(THROTTLE_REASONS):x}"] if mask & ~sum(THROTTLE_REASONS) else [])
    unsupported.append("throttle_reasons")
    return None

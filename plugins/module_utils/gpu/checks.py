# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU health findings from NVML readings (readings.py) and a DCGM diagnostic (dcgm.py). Pure: no I/O.

Each finding has the audit's shape (``code``, ``severity``, ``device``, ``devices``, ``message``, ``fix``,
``source: gpu_health``), so it joins health.yml's fleet report beside the PCIe findings:

* ``ecc_uncorrected`` (critical: since the driver loaded; warning: only in the GPU's lifetime count),
  ``ecc_corrected`` (info; warning above ``corrected_warn`` since the driver loaded), ``ecc_disabled`` (warning),
  ``ecc_mode_pending`` (warning: a mode change waits for a reset);
* ``row_remap_failure`` (critical), ``row_remap_pending`` (critical: the GPU needs a reset before the rows are
  remapped), ``retired_pages_pending`` (critical), ``retired_pages`` (warning; critical at RETIRED_PAGES_RMA);
* ``throttle_hw`` (critical: hardware slowdown, hardware thermal slowdown, power brake), ``throttle_thermal``
  (warning: software thermal slowdown), ``throttle_sync_boost`` (warning);
* ``clocks_below_max`` (warning): the SM clock below ``clock_ratio`` of its maximum while a reason other than idle
  holds it there;
* ``power_limit_lowered`` (warning): the power limit below its default;
* ``persistence_off`` (warning);
* ``pcie_replays_grown`` (warning): the PCIe replay counter grew since the previous check (the audit's own
  ``pcie_replays`` reports a count above zero, pcie/findings.py);
* ``dcgm_diag`` (critical for a failed test, warning for a warning).

UNSTABLE_CODES are the codes that make a change unstable in the serving verdict (pcie/health.py's stability()).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# NVIDIA's RMA threshold for retired pages (the driver retires at most 64 pages; 60 or more: replace the board).
RETIRED_PAGES_RMA = 60
HW_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
NOT_THROTTLING = ("gpu_idle", "applications_clocks_setting", "display_clock_setting", "sw_power_cap")
UNSTABLE_CODES = ("ecc_uncorrected", "row_remap_failure", "row_remap_pending", "retired_pages_pending", "throttle_hw",
                  "pcie_replays_grown", "dcgm_diag")
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}

RESET_FIX = ("drain the host, then reset the GPU (stop its users, nvidia-smi -r -i INDEX) or reboot it, and run "
             "health.yml again")


@dataclass(frozen=True)
class Limits:
    """The thresholds of the checks: the SM clock's least share of its maximum under a throttling reason, and the
    corrected ECC errors since the driver loaded above which they are a warning."""

    clock_ratio: float = 0.9
    corrected_warn: int = 1000


def finding(code: str, severity: str, device: str | None, message: str, fix: str) -> dict[str, Any]:
    return {"code": code, "severity": severity, "device": device, "devices": [device] if device else [],
            "message": message, "fix": fix, "source": "gpu_health"}


def evaluate(gpus: dict[str, dict[str, Any]], previous: dict[str, dict[str, Any]] | None = None,
             limits: Limits = Limits()) -> list[dict[str, Any]]:
    """The findings of every GPU's readings (``previous``: the readings of the previous check, by BDF, for the
    counters that only matter when they grow), the most severe first."""
    out: list[dict[str, Any]] = []
    for bdf in sorted(gpus):
        gpu, before = gpus[bdf], (previous or {}).get(bdf) or {}
        for check in (_ecc, _memory_repair, _throttle, _clocks, _power, _persistence):
            out += check(bdf, gpu, limits)
        out += _replays(bdf, gpu, before)
    return sorted(out, key=lambda f: SEVERITY_ORDER.get(f["severity"], 3))


def _ecc(bdf: str, gpu: dict[str, Any], limits: Limits) -> list[dict[str, Any]]:
    out = []
    mode = gpu.get("ecc_mode")
    if mode and not mode["current"]:
        out.append(finding("ecc_disabled", "warning", bdf, f"GPU {bdf} runs with ECC off: memory errors go unseen",
                           "Turn ECC on (nvidia-smi -e 1 -i INDEX) and reset the GPU or reboot, in a drain."))
    if mode and mode["pending"] != mode["current"]:
        out.append(finding("ecc_mode_pending", "warning", bdf, f"GPU {bdf} has an ECC mode change pending "
                           f"({'on' if mode['pending'] else 'off'}) that takes effect at the next reset",
                           "Reset the GPU or reboot in a drain, or undo the change (nvidia-smi -e)."))
    ecc = gpu.get("ecc") or {}
    vol, agg = ecc.get("volatile") or {}, ecc.get("aggregate") or {}
    if vol.get("uncorrected"):
        out.append(finding(
            "ecc_uncorrected", "critical", bdf, f"GPU {bdf} had {vol['uncorrected']} uncorrectable ECC error(s) since "
            "the driver loaded", "Drain the host; " + RESET_FIX + "; run dcgmi diag -r 3 and read nvidia-smi -q -d "
            "ECC,ROW_REMAPPER. Repeats after a reset mean an RMA."))
    elif agg.get("uncorrected"):
        out.append(finding(
            "ecc_uncorrected", "warning", bdf, f"GPU {bdf} had {agg['uncorrected']} uncorrectable ECC error(s) in its "
            "lifetime (none since the driver loaded)", "Check that its rows were remapped (nvidia-smi -q -d "
            "ROW_REMAPPER) and watch for new ones; nothing to do while none recur."))
    corrected = vol.get("corrected") or 0
    if corrected:
        warn = corrected > limits.corrected_warn
        out.append(finding(
            "ecc_corrected", "warning" if warn else "info", bdf, f"GPU {bdf} corrected {corrected} ECC error(s) since "
            "the driver loaded", "A rate that keeps climbing precedes uncorrectable errors: run dcgmi diag -r 3 in a "
            "drain and compare with the GPU's lifetime count (nvidia-smi -q -d ECC)." if warn else
            "Nothing to do for a few; health.yml warns above the threshold (gpu_health_corrected_warn)."))
    return out


def _memory_repair(bdf: str, gpu: dict[str, Any], limits: Limits) -> list[dict[str, Any]]:
    out = []
    rows = gpu.get("remapped_rows")
    if rows and rows["failure"]:
        out.append(finding("row_remap_failure", "critical", bdf, f"GPU {bdf} failed to remap a row: memory with an "
                           "uncorrectable error is still in use", "Drain the host and replace the GPU (RMA): a remap "
                           "failure does not heal."))
    if rows and rows["pending"]:
        out.append(finding("row_remap_pending", "critical", bdf, f"GPU {bdf} has a row remap pending "
                           f"({rows['uncorrectable']} row(s) remapped for uncorrectable errors so far)",
                           "The remap takes effect at the next GPU reset: " + RESET_FIX + "."))
    if gpu.get("retired_pages_pending"):
        out.append(finding("retired_pages_pending", "critical", bdf, f"GPU {bdf} has pages waiting to be retired",
                           "Retirement takes effect at the next GPU reset: " + RESET_FIX + "."))
    pages = gpu.get("retired_pages") or {}
    total = sum(pages.values())
    if total:
        rma = total >= RETIRED_PAGES_RMA
        out.append(finding(
            "retired_pages", "critical" if rma else "warning", bdf, f"GPU {bdf} retired {total} memory page(s) "
            f"({pages.get('double_bit', 0)} for double-bit errors, {pages.get('single_bit', 0)} for repeated "
            "single-bit errors)", "Replace the GPU (RMA): it is at NVIDIA's retired-page limit." if rma else
            "Watch the count; NVIDIA's RMA threshold is 60 retired pages."))
    return out


def _throttle(bdf: str, gpu: dict[str, Any], limits: Limits) -> list[dict[str, Any]]:
    out = []
    reasons = gpu.get("throttle_reasons") or []
    hw = [r for r in reasons if r in HW_REASONS]
    temp = f" at {gpu['temperature_c']} C" if gpu.get("temperature_c") is not None else ""
    if hw:
        out.append(finding(
            "throttle_hw", "critical", bdf, f"GPU {bdf} clocks are held down by {', '.join(hw)}{temp}",
            "Hardware slowdown comes from the board: an over-temperature (check the fans, airflow and the chassis "
            "inlet), a power supply or cable that asserts power brake, or a failing sensor. Drain the host, check "
            "nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER and the BMC's event log."))
    if "sw_thermal_slowdown" in reasons:
        out.append(finding("throttle_thermal", "warning", bdf, f"GPU {bdf} is slowed by the driver for "
                           f"temperature{temp}", "Improve the cooling (fan curve, airflow, inlet temperature); the "
                           "GPU runs below its clocks until it cools."))
    if "sync_boost" in reasons:
        out.append(finding("throttle_sync_boost", "warning", bdf, f"GPU {bdf} is held at a sync boost group's "
                           "clocks (the slowest GPU of its group)", "Look for the throttled GPU of the group "
                           "(nvidia-smi -q -d PERFORMANCE) or remove the group (nvidia-smi --sync-boost)."))
    return out


def _clocks(bdf: str, gpu: dict[str, Any], limits: Limits) -> list[dict[str, Any]]:
    cur, top = (gpu.get("clocks_mhz") or {}).get("sm"), (gpu.get("max_clocks_mhz") or {}).get("sm")
    reasons = gpu.get("throttle_reasons")
    holding = [r for r in reasons or [] if r not in NOT_THROTTLING]
    if not cur or not top or cur >= limits.clock_ratio * top or reasons is None or not holding:
        return []
    return [finding("clocks_below_max", "warning", bdf, f"GPU {bdf} SM clock is {cur} MHz of {top} MHz "
                    f"({cur / top:.0%}), held by {', '.join(holding)}",
                    "The throttle findings say why; an application clock set below the maximum "
                    "(nvidia-smi -q -d CLOCK, Applications Clocks) is reset with nvidia-smi -rac.")]


def _power(bdf: str, gpu: dict[str, Any], limits: Limits) -> list[dict[str, Any]]:
    limit, default = gpu.get("power_limit_mw"), gpu.get("power_default_limit_mw")
    if not limit or not default or limit >= default:
        return []
    return [finding("power_limit_lowered", "warning", bdf, f"GPU {bdf} power limit is {limit / 1000:.0f} W, below "
                    f"its default {default / 1000:.0f} W: it throttles sooner under load",
                    "If nobody meant it, restore the default (nvidia-smi -pl DEFAULT_WATTS -i INDEX, or remove the "
                    "nvidia-smi -pl line from the boot scripts) and re-benchmark.")]


def _persistence(bdf: str, gpu: dict[str, Any], limits: Limits) -> list[dict[str, Any]]:
    if gpu.get("persistence_mode") != 0:
        return []
    return [finding("persistence_off", "warning", bdf, f"GPU {bdf} runs without persistence mode: the driver "
                    "tears it down whenever no process holds it, and the next start pays the initialisation",
                    "Enable nvidia-persistenced (systemctl enable --now nvidia-persistenced), or nvidia-smi -pm 1.")]


def _replays(bdf: str, gpu: dict[str, Any], before: dict[str, Any]) -> list[dict[str, Any]]:
    now, then = gpu.get("pcie_replay_counter"), before.get("pcie_replay_counter")
    if now is not None and then is not None and now > then:
        return [finding("pcie_replays_grown", "warning", bdf, f"GPU {bdf} PCIe replay counter grew by {now - then} since "
                        f"the previous check (now {now})", "Replays are link-level retries of corrupt packets: a "
                        "marginal riser, cable or slot. Reseat the card, compare the audit's AER counters, and try "
                        "the slot one PCIe generation lower in the BIOS to confirm.")]
    return []


def unstable(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPU health findings that make a change unstable: UNSTABLE_CODES at warning or above (a lifetime ECC count
    that did not grow is a warning of ecc_uncorrected but not a change's doing, so only critical ones count there)."""
    return [f for f in findings if f.get("code") in UNSTABLE_CODES and f.get("severity") in ("critical", "warning")
            and not (f["code"] == "ecc_uncorrected" and f["severity"] != "critical")]

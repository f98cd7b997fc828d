# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host's CPU-side knobs that gpufleet.inference.cpu_tuning sets, as sysfs files: read, decide, apply with
read-back, restore.

- the cpufreq governor and the energy-performance preference (EPP) of every cpufreq policy,
  ``/sys/devices/system/cpu/cpufreq/policyN/{scaling_governor,energy_performance_preference}``, each checked
  against the policy's ``scaling_available_governors`` / ``energy_performance_available_preferences``;
- a C-state limit through cpuidle: every idle state whose exit latency (``latency``, in µs) is above the limit
  is disabled on every online CPU (``/sys/devices/system/cpu/cpuN/cpuidle/stateK/disable``); states within it
  are left as they are, or put back to their recorded original when an earlier, tighter limit disabled them;
- the transparent-hugepage policy, ``/sys/kernel/mm/transparent_hugepage/{enabled,defrag}`` (the bracketed word
  is the one in force).

A knob the host lacks (no cpufreq driver, no EPP, no cpuidle driver under QEMU TCG, no THP) is skipped with the
reason, never faked. Every value the run would change is checked before the first write, so a bad value changes
nothing. The original of every file is recorded before its first change (the first value ever seen is kept),
and a restore writes exactly those back. Standard library only and no I/O but through the HostFS: the boot-time
applier (cpu/reapply.py) runs this file on the host.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.device_apply import (
    IGNORE, STOP, apply_steps, merge_originals, parse_originals,
)
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import parse_cpulist

CPU = "/sys/devices/system/cpu"
CPUFREQ = CPU + "/cpufreq"
CPUIDLE_DRIVER = CPU + "/cpuidle/current_driver"
THP = "/sys/kernel/mm/transparent_hugepage"
# The knobs, in the order their writes run (the governor before the EPP: intel_pstate ties the EPP to it).
KNOBS = ("governor", "energy_performance_preference", "cstate", "thp_enabled", "thp_defrag")
# The settings a caller gives (None: leave the knob alone), and the knob each one drives.
SETTINGS = {"governor": "governor", "energy_performance_preference": "energy_performance_preference",
            "cstate_max_latency_us": "cstate", "thp_enabled": "thp_enabled", "thp_defrag": "thp_defrag"}
MAX_LATENCY_US = 10_000_000  # 10 s: no idle state's exit latency comes near it
ORIGINALS_FORMAT = "gpufleet-cpu-tuning-originals/1"
THP_FILES = {"thp_enabled": THP + "/enabled", "thp_defrag": THP + "/defrag"}
WORD = re.compile(r"^[a-z0-9_+-]{1,64}$")


class CpuTuningError(Exception):
    """A value that cannot be set, or a record that cannot be used; the message says which, where and what to do."""


# ---- pure parsers --------------------------------------------------------------------------------
def parse_bracketed(text: str | None) -> tuple[str | None, list[str]]:
    """``always [madvise] never`` -> (``madvise``, [always, madvise, never]); a lone word is the one in force."""
    words = (text or "").split()
    available = [w.strip("[]") for w in words if w.strip("[]")]
    current = next((w[1:-1] for w in words if w.startswith("[") and w.endswith("]")), None)
    if current is None and len(words) == 1:
        current = words[0]
    return current, available


def knob_of(path: str) -> str | None:
    """The knob a recorded sysfs path belongs to (None for a path this module does not write)."""
    if path.startswith(CPUFREQ + "/policy"):
        return {"scaling_governor": "governor", "energy_performance_preference": "energy_performance_preference"}.get(
            path.rsplit("/", 1)[-1])
    if re.match(r"^" + re.escape(CPU) + r"/cpu\d+/cpuidle/state\d+/disable$", path):
        return "cstate"
    return next((k for k, p in THP_FILES.items() if p == path), None)


def value_of(path: str, text: str | None) -> str | None:
    """The value in force that a knob file shows: the bracketed word of a THP file, else the stripped text."""
    if text is None:
        return None
    if path in THP_FILES.values():
        return parse_bracketed(text)[0]
    return text.strip()


def _number(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


# ---- reading the host ----------------------------------------------------------------------------
def read_tree(fs: HostFS) -> dict[str, Any]:
    """Everything the plans need: the cpufreq policies, the cpuidle states of the online CPUs, the THP files."""
    policies = {}
    for name in sorted((n for n in fs.listdir(CPUFREQ) if re.match(r"^policy\d+$", n)), key=lambda n: int(n[6:])):
        base = f"{CPUFREQ}/{name}"
        policies[name] = {
            "cpus": (fs.read_optional(base + "/affected_cpus") or fs.read_optional(base + "/related_cpus") or "").strip(),
            "driver": (fs.read_optional(base + "/scaling_driver") or "").strip() or None,
            "governor": value_of(base + "/scaling_governor", fs.read_optional(base + "/scaling_governor")),
            "governors": (fs.read_optional(base + "/scaling_available_governors") or "").split(),
            "epp": value_of(base + "/energy_performance_preference", fs.read_optional(base + "/energy_performance_preference")),
            "epps": (fs.read_optional(base + "/energy_performance_available_preferences") or "").split(),
        }
    online = fs.read_optional(CPU + "/online")
    cpus = parse_cpulist(online) if online is not None else sorted(
        int(n[3:]) for n in fs.listdir(CPU) if re.match(r"^cpu\d+$", n))
    idle = {}
    for cpu in cpus:
        base = f"{CPU}/cpu{cpu}/cpuidle"
        states = {}
        for name in sorted((n for n in fs.listdir(base) if re.match(r"^state\d+$", n)), key=lambda n: int(n[5:])):
            states[name] = {"name": (fs.read_optional(f"{base}/{name}/name") or "").strip(),
                            "latency": _number(fs.read_optional(f"{base}/{name}/latency")),
                            "disable": (fs.read_optional(f"{base}/{name}/disable") or "").strip() or None}
        if states:
            idle[cpu] = states
    thp = {knob: parse_bracketed(fs.read_optional(path)) if fs.exists(path) else None for knob, path in THP_FILES.items()}
    return {"policies": policies, "cpuidle_driver": (fs.read_optional(CPUIDLE_DRIVER) or "").strip() or None,
            "cpus": cpus, "idle": idle, "thp": thp}


# ---- deciding ------------------------------------------------------------------------------------
def _step(knob: str, path: str, before, after) -> dict:
    return {"action": "set_value", "knob": knob, "path": path, "before": before, "after": after}


def _governor(tree: dict, wanted: str) -> tuple[list[dict], str | None]:
    """(steps, skip reason); CpuTuningError for a governor some policy does not offer."""
    if not tree["policies"]:
        return [], (f"no cpufreq policy under {CPUFREQ}: this host has no cpufreq driver (a VM, or the firmware "
                    "keeps frequency control: enable OS/HWP control in the BIOS), so there is no governor to set")
    steps = []
    for name, pol in tree["policies"].items():
        if wanted not in pol["governors"]:
            raise CpuTuningError(f"governor={wanted!r}: cpufreq {name} (driver {pol['driver']}) offers the governors "
                                 f"{', '.join(pol['governors']) or 'none'}, not {wanted} ({CPUFREQ}/{name}/"
                                 "scaling_available_governors). Pick one of those; nothing was changed.")
        if pol["governor"] != wanted:
            steps.append(_step("governor", f"{CPUFREQ}/{name}/scaling_governor", pol["governor"], wanted))
    return steps, None


def _epp(tree: dict, wanted: str, governor: str | None) -> tuple[list[dict], str | None]:
    if not tree["policies"]:
        return [], f"no cpufreq policy under {CPUFREQ}, so no energy-performance preference"
    without = [n for n, p in tree["policies"].items() if p["epp"] is None]
    if without:
        driver = tree["policies"][without[0]]["driver"]
        return [], (f"cpufreq {', '.join(without)} (driver {driver}) has no energy_performance_preference: only "
                    "intel_pstate and amd_pstate in active mode with HWP/CPPC offer one")
    steps = []
    for name, pol in tree["policies"].items():
        if wanted not in pol["epps"]:
            raise CpuTuningError(
                f"energy_performance_preference={wanted!r}: cpufreq {name} offers the energy-performance preferences "
                f"{', '.join(pol['epps']) or 'none'}, not {wanted} ({CPUFREQ}/{name}/energy_performance_available_preferences). "
                "Pick one of those; nothing was changed.")
        final_governor = governor or pol["governor"]
        if pol["driver"] == "intel_pstate" and final_governor == "performance" and wanted != "performance":
            raise CpuTuningError(
                f"energy_performance_preference={wanted!r}: cpufreq {name}: intel_pstate holds the energy-performance "
                f"preference at performance under the performance governor and refuses {wanted} (EBUSY). Use the "
                f"powersave governor with the preference {wanted}, or leave the preference unset; nothing was changed.")
        if pol["epp"] != wanted:
            steps.append(_step("energy_performance_preference", f"{CPUFREQ}/{name}/energy_performance_preference",
                               pol["epp"], wanted))
    return steps, None


def _cstate(tree: dict, limit: int, record: dict) -> tuple[list[dict], str | None]:
    """Disable the idle states whose exit latency is above ``limit`` µs; put back the recorded original of the others."""
    if not tree["idle"] or tree["cpuidle_driver"] in (None, "none"):
        return [], (f"no cpuidle states under {CPU}/cpu*/cpuidle (cpuidle driver: {tree['cpuidle_driver'] or 'none'}): "
                    "the kernel does not manage idle states here (a VM without haltpoll, idle=poll, or cpuidle off), so "
                    "there is no C-state to limit")
    steps = []
    for cpu, states in tree["idle"].items():
        for name, st in states.items():
            path = f"{CPU}/cpu{cpu}/cpuidle/{name}/disable"
            if st["latency"] is None or st["disable"] is None:
                raise CpuTuningError(f"{CPU}/cpu{cpu}/cpuidle/{name} has no readable latency or disable file: this kernel's "
                                     "cpuidle sysfs is not the usual one. Nothing was changed.")
            if st["latency"] > limit and st["disable"] != "1":
                steps.append(_step("cstate", path, st["disable"], "1"))
            elif st["latency"] <= limit and path in record and st["disable"] != record[path]:
                steps.append(_step("cstate", path, st["disable"], record[path]))
    return steps, None


def _thp(tree: dict, knob: str, wanted: str) -> tuple[list[dict], str | None]:
    found = tree["thp"][knob]
    if found is None:
        return [], (f"{THP_FILES[knob]} does not exist: this kernel has no transparent hugepages "
                    "(CONFIG_TRANSPARENT_HUGEPAGE off)")
    current, available = found
    if wanted not in available:
        raise CpuTuningError(f"{knob}={wanted!r}: {THP_FILES[knob]} offers {', '.join(available) or 'nothing'}, not {wanted}. Pick one of "
                             "those; nothing was changed.")
    return ([_step(knob, THP_FILES[knob], current, wanted)] if current != wanted else []), None


def check_settings(settings: dict) -> dict:
    """The settings given (None dropped), each a word or a bounded latency; CpuTuningError otherwise."""
    out = {}
    for key, value in settings.items():
        if key not in SETTINGS:
            raise CpuTuningError(f"{key} is not a CPU setting ({', '.join(SETTINGS)}).")
        if value is None or value == "":
            continue
        if key == "cstate_max_latency_us":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LATENCY_US:
                raise CpuTuningError(f"cstate_max_latency_us={value!r} is out of range: give a whole number of µs from 0 "
                                     f"to {MAX_LATENCY_US}. Nothing was changed.")
        elif not isinstance(value, str) or not WORD.match(value):
            raise CpuTuningError(f"{key}={value!r} is not a sysfs word (lower-case letters, digits, _ + -). Nothing was changed.")
        out[key] = value
    return out


def plan(tree: dict, settings: dict, record: dict) -> tuple[list[dict], dict[str, str]]:
    """(steps in write order, {knob: why it is skipped}) for ``settings`` (check_settings' output) on ``tree``;
    ``record`` is {path: original} (a relaxed C-state limit puts originals back). Raises CpuTuningError first."""
    steps: list[dict] = []
    skips: dict[str, str] = {}
    found = {}
    if "governor" in settings:
        found["governor"] = _governor(tree, settings["governor"])
    if "energy_performance_preference" in settings:
        found["energy_performance_preference"] = _epp(tree, settings["energy_performance_preference"], settings.get("governor"))
    if "cstate_max_latency_us" in settings:
        found["cstate"] = _cstate(tree, settings["cstate_max_latency_us"], record)
    for knob in ("thp_enabled", "thp_defrag"):
        if knob in settings:
            found[knob] = _thp(tree, knob, settings[knob])
    for knob in KNOBS:
        if knob in found:
            more, skip = found[knob]
            steps += more
            if skip:
                skips[knob] = skip
    return steps, skips


def restore_plan(fs: HostFS, record: dict, knobs) -> tuple[list[dict], list[str]]:
    """(steps that write the recorded originals of ``knobs`` back, in write order; the recorded paths that are gone)."""
    steps, gone = [], []
    for path, original in sorted(record.items(), key=lambda kv: (KNOBS.index(knob_of(kv[0]) or "cstate"), kv[0])):
        knob = knob_of(path)
        if knob not in knobs:
            continue
        now = value_of(path, fs.read_optional(path))
        if now is None:
            gone.append(path)
        elif now != original:
            steps.append(_step(knob, path, now, original))
    return steps, gone


# ---- applying ------------------------------------------------------------------------------------
def apply(fs: HostFS, steps: list[dict], keep_going: bool = False) -> dict:
    """Write every step, read each back; on a failure undo what took (device_apply's STOP), or with ``keep_going``
    (the boot) report it and go on. Returns device_apply.apply_steps' outcome."""
    def write(step, value):
        try:
            fs.write_text(step["path"], value)
        except HostFSError as err:
            return 1, err.strerror, None
        return 0, "", None

    def read(step):
        value = value_of(step["path"], fs.read_optional(step["path"]))
        return (value, None) if value is not None else (None, f"{step['path']} cannot be read")

    return apply_steps(steps, write, read, lambda step, reads, value: reads == value,
                       on_failure=lambda attempt: IGNORE if keep_going else STOP)


def failure_text(outcome: dict) -> str:
    """One phrase per failed write of an apply outcome (what, where, why)."""
    out = []
    for attempt in outcome["failures"] + outcome["ignored"]:
        step = attempt["step"]
        why = attempt["stderr"] or f"it reads back {attempt['reads']}"
        out.append(f"{step['path']}: {step['before']} -> {attempt['value']} failed ({why})")
    return "; ".join(out)


# ---- the record of originals ---------------------------------------------------------------------
def load_record(text: str | None, where: str) -> dict[str, str]:
    """{path: original value} from the record file (absent: empty); CpuTuningError for a damaged one."""
    data = parse_originals(text, where, ORIGINALS_FORMAT, "cpu_tuning", "CPU settings", CpuTuningError)
    bad = [p for p, v in data["devices"].items() if knob_of(p) is None or not isinstance(v, str)]
    if bad:
        raise CpuTuningError(f"{where} records {bad[0]!r}, which is not a CPU setting this module writes: it is not a "
                             "gpufleet.inference.cpu_tuning record. Move it away and run again.")
    return dict(data["devices"])


def record_after(record: dict[str, str], steps: list[dict]) -> dict[str, str]:
    """The record with the originals of ``steps`` added (the first value ever seen stays)."""
    def first_seen(devices, step):
        devices.setdefault(step["path"], step["before"])
    return merge_originals({"format": ORIGINALS_FORMAT, "devices": dict(record)}, steps, first_seen)["devices"]


def render_record(record: dict[str, str]) -> str:
    """The record file's text."""
    return json.dumps({"format": ORIGINALS_FORMAT, "devices": record}, indent=2, sort_keys=True) + "\n"


def summary(tree: dict) -> dict[str, Any]:
    """What is in force, per knob: governor and EPP per policy, the disabled idle states per CPU, the THP words."""
    return {
        "governor": {n: p["governor"] for n, p in tree["policies"].items()},
        "energy_performance_preference": {n: p["epp"] for n, p in tree["policies"].items() if p["epp"] is not None},
        "cstates_disabled": {f"cpu{c}": [f"{n} ({s['name']}, {s['latency']} us)" for n, s in states.items() if s["disable"] == "1"]
                             for c, states in tree["idle"].items()},
        "cpuidle_driver": tree["cpuidle_driver"],
        "thp_enabled": (tree["thp"]["thp_enabled"] or (None,))[0],
        "thp_defrag": (tree["thp"]["thp_defrag"] or (None,))[0],
    }


def simulate(tree: dict, steps: list[dict]) -> dict:
    """The tree as it would read after ``steps`` (check mode's ``after``)."""
    out = {"policies": {n: dict(p) for n, p in tree["policies"].items()}, "cpuidle_driver": tree["cpuidle_driver"],
           "cpus": list(tree["cpus"]), "idle": {c: {n: dict(s) for n, s in st.items()} for c, st in tree["idle"].items()},
           "thp": dict(tree["thp"])}
    for step in steps:
        parts = step["path"].split("/")
        if step["knob"] in ("governor", "energy_performance_preference"):
            out["policies"][parts[-2]]["governor" if step["knob"] == "governor" else "epp"] = step["after"]
        elif step["knob"] == "cstate":
            out["idle"][int(parts[-4][3:])][parts[-2]]["disable"] = step["after"]
        else:
            out["thp"][step["knob"]] = (step["after"], tree["thp"][step["knob"]][1] if tree["thp"][step["knob"]] else [])
    return out

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.cpu_tuning executes (``execute``): the CPU governor, energy-performance preference,
C-state limit and transparent-hugepage policy (cpu/knobs.py), their record of originals and their boot unit
(cpu/boot.py, applier cpu/reapply.py).

``state: present``: the knobs given are checked (every one, before any write), the originals of the files the
run changes are added to the record (``state_dir/cpu_tuning.json``, written before the first sysfs write), the
values written and read back (a write that does not take undoes the others and puts the record back), and the
settings kept for the boot unit. Knobs not given are left alone, in sysfs and in the boot file.
``state: absent``: the recorded originals of the knobs in ``restore`` (default all) are written back and read
back, and those knobs leave the record and the boot file; the unit and its files go when nothing is left.

The C-state limit has two methods (``cstate_method``): ``cpuidle`` disables the deeper idle states in sysfs (above);
``pm_qos`` installs the holder of /dev/cpu_dma_latency (cpu/pm_qos.py) as its own service instead, started, read
back (the unit active, the device's value in force) and enabled for the boot, and puts back the cpuidle states an
earlier ``cpuidle`` run disabled. Either method removes the other's; restoring ``cstate`` removes the holder.
"""

from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils._host import managed_files
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.managed_files import wanted_absent, wanted_file
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils._host.bundle import entry_renderer
from ansible_collections.gpufleet.inference.plugins.module_utils.cpu import boot, knobs, pm_qos
from ansible_collections.gpufleet.inference.plugins.module_utils.cpu.knobs import CpuTuningError
from ansible_collections.gpufleet.inference.plugins.module_utils.cpu.reapply import render_script

RECORD_FILE = "cpu_tuning.json"
KEEP = "keep"  # the holder left as it is: the run does not touch the C-state limit
render_holder = entry_renderer(pm_qos.ENTRY, pm_qos.HEADER, pm_qos.REINSTALL, pm_qos.PYTHON_HINT)


def _record_files(path: str, record: dict) -> list[dict]:
    if not record:
        return [wanted_absent(path)]
    return [wanted_file(path, knobs.render_record(record), 0o644, owner=None)]


def _decide(params: dict, fs, tree: dict, record: dict, persisted: dict) -> dict:
    """What the run does: sysfs steps, the record after, the settings the boot file keeps, skips, gone paths and the
    latency the PM QoS holder holds (None: no holder; KEEP: left as it is)."""
    if params["state"] == "present":
        settings = knobs.check_settings({k: params.get(k) for k in knobs.SETTINGS})
        holder, cpuidle = _holder_wanted(params, fs, settings)
        steps, skips = knobs.plan(tree, cpuidle, record)
        if holder not in (None, KEEP) and not fs.exists(pm_qos.DEVICE):
            skips["cstate"] = (f"{pm_qos.DEVICE} does not exist: this kernel has no CPU latency QoS device (or /dev is "
                               "not mounted under the root), so there is nothing to hold; use cstate_method cpuidle")
            holder = KEEP
        gone: list[str] = []
        if holder not in (None, KEEP):  # the holder replaces the cpuidle method: its disabled states are put back
            back, gone = knobs.restore_plan(fs, record, ["cstate"])
            steps += back
        kept = dict(persisted)
        for key, value in settings.items():
            if knobs.SETTINGS[key] in skips or (key == "cstate_max_latency_us" and holder is not None):
                kept.pop(key, None)
            else:
                kept[key] = value
        after = knobs.record_after(record, steps)
        if holder not in (None, KEEP):
            after = {p: v for p, v in after.items() if knobs.knob_of(p) != "cstate" or p in gone}
        return {"steps": steps, "skips": skips, "gone": gone, "kept": kept, "record": after, "holder": holder}
    restore = list(params.get("restore") or knobs.KNOBS)
    steps, gone = knobs.restore_plan(fs, record, restore)
    return {"steps": steps, "skips": {}, "gone": gone,
            "kept": {k: v for k, v in persisted.items() if knobs.SETTINGS.get(k) not in restore},
            "record": {p: v for p, v in record.items() if knobs.knob_of(p) not in restore or p in gone},
            "holder": None if "cstate" in restore else KEEP}


def _holder_wanted(params: dict, fs, settings: dict) -> tuple:
    """(the latency the holder holds, None for no holder or KEEP; the settings the sysfs plan gets): with
    cstate_method pm_qos the limit goes to the holder and not to cpuidle; a cpuidle limit removes a holder."""
    if "cstate_max_latency_us" not in settings:
        return KEEP, settings
    if params.get("cstate_method") == "pm_qos":
        return settings["cstate_max_latency_us"], {k: v for k, v in settings.items() if k != "cstate_max_latency_us"}
    return None, settings


def _apply_sysfs(fs, steps: list[dict], record_files: list[dict], old_record_files: list[dict], present: bool) -> list:
    """Record first (present) or last (absent), the writes in between; a failure undoes them and puts the record back."""
    actions: list[dict] = []
    if present:
        actions += managed_files.converge(fs, [], record_files, False)[0]
    outcome = knobs.apply(fs, steps)
    if outcome["failures"]:
        managed_files.converge(fs, [], old_record_files, False)
        undone = not outcome["rollback_failed"]
        raise Failed(f"Setting the CPU knobs failed: {knobs.failure_text(outcome)}. "
                     + ("The values written before it were put back; nothing changed." if undone else
                        f"Putting back failed too ({knobs.failure_text({'failures': outcome['rollback_failed'], 'ignored': []})}): "
                        "fix those by hand.") + " A value the kernel refuses is often held by another tool (tuned, "
                     "power-profiles-daemon, a BIOS setting): find it and stop it.",
                     changed=not undone, actions=[a["step"] for a in outcome["rollback_failed"]])
    if not present:
        actions += managed_files.converge(fs, [], record_files, False)[0]
    return actions


def _unit_steps(host: Host, want: bool, unit_changed: bool) -> list[dict]:
    """systemctl enable/disable/daemon-reload that make the boot unit follow ``want``."""
    enabled = host.fs.exists(boot.UNIT_WANTS)
    steps = []
    if want and not enabled:
        steps.append({"action": "enable_unit", "unit": boot.UNIT_NAME, "argv": host.cmd.systemctl("enable", boot.UNIT_NAME)})
    if not want and enabled:
        steps.append({"action": "disable_unit", "unit": boot.UNIT_NAME, "argv": host.cmd.systemctl("disable", boot.UNIT_NAME)})
    if unit_changed and not host.cmd.chrooted:
        steps.append({"action": "daemon_reload", "argv": host.cmd.systemctl("daemon-reload")})
    return steps


def _persist(host: Host, kept: dict, persist: bool, check_mode: bool) -> tuple[list[dict], list[dict]]:
    """The boot files and unit: (actions, diff). Disable runs before the files go, enable after they are written."""
    want = bool(persist and kept)
    script = render_script(host.cmd.script_python()) if want else ""
    files = [wanted_file(p, c, m) if c is not None else wanted_absent(p) for p, c, m in boot.wanted_files(script, kept, persist)]
    file_actions, diff = managed_files.plan(host.fs, [], files)
    units = _unit_steps(host, want, any(a["path"] == boot.UNIT_PATH for a in file_actions))
    if check_mode:
        return file_actions + units, diff
    ordered = [u for u in units if u["action"] == "disable_unit"] + ["files"] + [u for u in units if u["action"] != "disable_unit"]
    _run_steps(host, ordered, files, file_actions, boot.UNIT_WANTS, "The CPU settings are set; only their boot persistence "
               "failed", "Check that systemd manages this host, or set persist: false.")
    return file_actions + units, diff


def _run_steps(host: Host, ordered: list, files: list[dict], file_actions: list[dict], wants: str, in_place: str,
               fix: str) -> None:
    """Run systemctl steps in their order, the file changes where the ``files`` marker is; Failed at the first step
    that fails (``in_place``: what is in place all the same, ``fix``: what to do; ``wants``: the enable link)."""
    for step in ordered:
        if step == "files":
            if file_actions:
                managed_files.apply(host.fs, [], files, file_actions)
            continue
        problem = host.cmd.unit_step(step["argv"], in_place, fix, wants=wants if step["action"] == "enable_unit" else None)
        if problem:
            raise Failed(problem.pop("msg"), changed=True, **problem)


def holder_state(host: Host) -> dict:
    """The PM QoS holder as it is: its unit installed and enabled, the latency it holds, ``active`` (systemctl
    is-active; None under a tree, where nothing runs) and the value the device gives in force (None without one)."""
    fs = host.fs
    installed = fs.exists(pm_qos.UNIT_PATH)
    active = None
    if not host.cmd.chrooted:
        active = host.cmd.run(host.cmd.systemctl("is-active", pm_qos.UNIT_NAME))[1].strip() or "unknown"
    in_force = None
    if fs.exists(pm_qos.DEVICE):
        try:
            in_force = pm_qos.decode(fs.read_bytes(pm_qos.DEVICE, 4))
        except HostFSError:
            in_force = None
    return {"installed": installed, "enabled": fs.exists(pm_qos.UNIT_WANTS), "active": active,
            "holds_us": pm_qos.held_of(fs.read_optional(pm_qos.UNIT_PATH)) if installed else None,
            "in_force_us": in_force}


def _holder_steps(host: Host, now: dict, want, persist: bool, files_changed: bool) -> list[dict]:
    """The systemctl steps that bring the holder to ``want`` (a latency, or None for no holder), in their order; the
    file writes go where the ``files`` marker is."""
    unit = pm_qos.UNIT_NAME
    live = not host.cmd.chrooted

    def step(action, *args):
        return {"action": action, "unit": unit, "argv": host.cmd.systemctl(*args)}
    if want is None:
        steps = [step("stop_unit", "stop", unit)] if live and now["active"] in ("active", "activating") else []
        steps += [step("disable_unit", "disable", unit)] if now["enabled"] else []
        return steps + ["files"] + ([step("daemon_reload", "daemon-reload")] if live and files_changed else [])
    steps = ["files"] + ([step("daemon_reload", "daemon-reload")] if live and files_changed else [])
    if persist and not now["enabled"]:
        steps.append(step("enable_unit", "enable", unit))
    elif not persist and now["enabled"]:
        steps.append(step("disable_unit", "disable", unit))
    if live and (files_changed or now["active"] != "active"):
        steps.append(step("restart_unit", "restart", unit))
    return steps


def _holder(host: Host, now: dict, want, persist: bool, check_mode: bool) -> tuple[list[dict], list[dict], dict]:
    """Install, start and read back the PM QoS holder of ``want`` µs, or stop and remove it (None); KEEP leaves it.
    ``now`` is holder_state(). (actions, diff, its state after). A holder that does not take is removed again."""
    if want == KEEP or (want is None and not (now["installed"] or now["enabled"] or host.fs.exists(pm_qos.HOLD_SCRIPT))):
        return [], [], now
    script = render_holder(host.cmd.script_python()) if want is not None else ""
    files = [wanted_file(p, c, m) if c is not None else wanted_absent(p) for p, c, m in pm_qos.wanted_files(script, want)]
    file_actions, diff = managed_files.plan(host.fs, [], files)
    ordered = _holder_steps(host, now, want, persist, any(a["path"] == pm_qos.UNIT_PATH for a in file_actions))
    actions = [a for s in ordered for a in (file_actions if s == "files" else [s])]
    if check_mode:
        after = dict(now, installed=want is not None, enabled=want is not None and persist, holds_us=want)
        return actions, diff, after
    _run_steps(host, ordered, files, file_actions, pm_qos.UNIT_WANTS, "The other CPU settings are set; the PM QoS "
               "holder is not in force", f"See systemctl status {pm_qos.UNIT_NAME} and journalctl -u {pm_qos.UNIT_NAME}.")
    after = holder_state(host)
    # under a tree nothing runs: the files and the enable link are the read-back there
    live = want is not None and not host.cmd.chrooted
    why = pm_qos.readback_problem(want, after["active"], after["in_force_us"]) if live else None
    if why:
        _holder(host, after, None, persist, False)
        raise Failed(f"The PM QoS holder of {want} us did not take: {why}. It was stopped and removed again; its log: "
                     f"journalctl -u {pm_qos.UNIT_NAME}. Use cstate_method cpuidle, or find what holds the device.",
                     changed=True, actions=actions)
    return actions, diff, after


def _value_diff(steps: list[dict]) -> list[dict]:
    if not steps:
        return []
    return [{"before": "".join(f"{s['path']}: {s['before']}\n" for s in steps),
             "after": "".join(f"{s['path']}: {s['after']}\n" for s in steps),
             "before_header": "CPU settings (sysfs)", "after_header": "CPU settings (sysfs)"}]


def execute(params: dict, host: Host, check_mode: bool) -> dict:
    """The cpu_tuning module's run (see the file's docstring). Raises CpuTuningError (nothing changed) or Failed."""
    fs = host.fs
    record_path = params["state_dir"].rstrip("/") + "/" + RECORD_FILE
    record = knobs.load_record(fs.read_exact(record_path), fs.path(record_path))
    persisted = boot.load_persist(fs.read_exact(boot.PERSIST_CONFIG))
    if persisted is None:
        raise CpuTuningError(f"{fs.path(boot.PERSIST_CONFIG)} is not a {boot.PERSIST_FORMAT} file: move it away and run again.")
    tree = knobs.read_tree(fs)
    plan = _decide(params, fs, tree, record, persisted)
    for knob, why in plan["skips"].items():
        host.warn(f"cpu_tuning: {knob} skipped: {why}.")
    for path in plan["gone"]:
        host.warn(f"cpu_tuning: {path} was recorded but is gone (CPU offline, driver changed): its original stays recorded.")
    record_files = _record_files(record_path, plan["record"]) if plan["record"] != record else []
    actions: list[dict] = [dict(s) for s in plan["steps"]]
    diff = _value_diff(plan["steps"])
    if record_files:
        rec_actions, rec_diff = managed_files.plan(fs, [], record_files)
        diff += rec_diff
        if check_mode:
            actions += rec_actions
    if not check_mode:
        actions += _apply_sysfs(fs, plan["steps"], record_files, _record_files(record_path, record),
                                params["state"] == "present")
    persist_actions, persist_diff = _persist(host, plan["kept"], params["persist"], check_mode)
    holder_before = holder_state(host)
    holder_actions, holder_diff, holder_after = _holder(host, holder_before, plan["holder"], params["persist"], check_mode)
    persist_actions += holder_actions
    persist_diff += holder_diff
    after = knobs.simulate(tree, plan["steps"]) if check_mode else knobs.read_tree(fs)
    return {"changed": bool(actions + persist_actions), "actions": actions + persist_actions,
            "unavailable": plan["skips"], "before": dict(knobs.summary(tree), pm_qos=holder_before),
            "after": dict(knobs.summary(after), pm_qos=holder_after),
            "persisted": plan["kept"] if params["persist"] else {},
            "originals": dict(plan["record"]), "diff": diff + persist_diff}

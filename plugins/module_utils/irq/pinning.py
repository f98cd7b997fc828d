# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pinning gpufleet.inference.irq_affinity does (``pin``, which irq/irq_affinity.py's execute() calls first):
resolve the devices and CPUs, plan the pinning, write ``/proc/irq/*/smp_affinity_list`` (read back), keep irqbalance
away from the pinned vectors, and write the pinned list, the policy script and the re-apply configuration.
``irq/affinity.py`` holds the planning it builds on (and is what the re-apply script, irq/reapply.py, imports);
nothing here imports AnsibleModule.
"""

from __future__ import annotations

import json

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils.irq.affinity import (
    CONFIG_FILE, DEFAULTS, MANAGED_CACHE, PINNED_FILE, POLICY_SCRIPT, IrqError, apply, irqbalance_config_text,
    irqbalance_state, load_json, managed_cache_after, merge_config, parse_pinned, plan, render_pinned,
    render_policy_script, report, resolve_cpus,
)
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import PciWalker, format_cpulist
from ansible_collections.gpufleet.inference.plugins.module_utils.vfio.binding import VfioError, resolve


def _file_action(fs: HostFS, path: str, after: str | None, mode: int = 0o644) -> list[dict]:
    before = fs.read_optional(path)  # trailing newlines stripped
    before_text = before + "\n" if before is not None else None
    if after is not None and not after.endswith("\n"):
        after += "\n"
    if (after is None and before is None) or (after is not None and before is not None and after.rstrip("\n") == before):
        return []
    if after is None:
        return [{"op": "remove", "path": path, "before": before_text, "after": ""}]
    return [{"op": "write", "path": path, "before": before_text or "", "after": after, "mode": mode}]


def pin(params: dict, fs: HostFS, check_mode: bool, warn=None) -> dict:
    """Select, plan, check, apply, read back. Raises IrqError with the reason; nothing is written before all checks pass."""
    warn = warn or (lambda msg: None)
    walker = PciWalker(fs)
    bdfs = _targets(walker, params)
    state, persist, exclusive = params["state"], params["persist"], params["exclusive"]
    settings = {k: params.get(k, v) for k, v in DEFAULTS.items()}
    config_before = load_json(fs, CONFIG_FILE)
    config_after = merge_config(config_before, {b: settings for b in bdfs}, state, exclusive) if persist else config_before
    if state == "present":
        population = dict(config_after.get("devices") or {}) if persist else {}
        population.update({b: settings for b in bdfs})
    else:
        population = {b: dict(DEFAULTS) for b in bdfs}
    resolved, warnings = resolve_cpus(walker, population, strict=set(bdfs))
    cache = load_json(fs, MANAGED_CACHE)
    entries, plan_warnings = plan(walker, resolved, bdfs, state, cache, params["allow_no_irqs"])
    warnings += plan_warnings
    pinned = _pinned_after(fs, bdfs, resolved, state, exclusive)
    files, ib = _irqbalance_files(fs, params, pinned)
    if persist and config_after != config_before:
        text = json.dumps(config_after, indent=2, sort_keys=True) + "\n" if config_after["devices"] else None
        files += _file_action(fs, CONFIG_FILE, text)
    if not check_mode:
        _apply(fs, walker, entries, files, cache, warnings)
    for msg in warnings:
        warn(msg)
    return _result(state, entries, files, resolved, bdfs, ib,
                   sorted((config_after.get("devices") or {}).keys()) if persist else [])


def _targets(walker: PciWalker, params: dict) -> list[str]:
    """The PCI addresses of the functions the task names (by address or vendor:device ID); IrqError when it names
    none without exclusive, or names what is not there."""
    if not params["devices"] and not params["exclusive"]:
        raise IrqError("devices is empty: name the PCI functions by address (0000:3b:00.0) or vendor:device ID (10de:2335). "
                       "With exclusive: true an empty list unpins every function pinned earlier.")
    try:
        return [t["bdf"] for t in resolve(walker, params["devices"], companions=False)] if params["devices"] else []
    except VfioError as err:
        raise IrqError(str(err)) from None


def _pinned_after(fs: HostFS, bdfs: list[str], resolved: dict, state: str, exclusive: bool) -> dict[str, str]:
    """The pinned list (PINNED_FILE) after this task: each function's CPU list, the task's functions added (present)
    or taken out (absent), with exclusive only the task's."""
    pinned_before = parse_pinned(fs.read_optional(PINNED_FILE))
    pinned = {} if exclusive else dict(pinned_before)
    for bdf in bdfs:
        if state == "present":
            pinned[bdf] = format_cpulist(resolved[bdf]["cpus"])
        else:
            pinned.pop(bdf, None)
    return pinned


def _irqbalance_files(fs: HostFS, params: dict, pinned: dict[str, str]) -> tuple[list[dict], dict]:
    """The file steps of the pinned list and of irqbalance's configuration and policy script, and the irqbalance
    report (``restart_required`` when any of them changes what irqbalance reads)."""
    mode = params["irqbalance"]
    ib = irqbalance_state(fs, params.get("irqbalance_config"))
    ib.update(mode=mode, restart_required=False, note=None)
    files = _file_action(fs, PINNED_FILE, render_pinned(pinned) if pinned else None)
    pinned_changed = bool(files)
    if not ib["present"]:
        ib["note"] = ("irqbalance is not installed: nothing else moves these interrupts, so no ban is needed; if it is "
                      "installed later, run this again so it leaves them alone.")
    elif mode != "none" or fs.exists(ib["config"]):
        old = fs.read_optional(ib["config"])
        new = irqbalance_config_text(old, mode, pinned)
        conf_actions = _file_action(fs, ib["config"], new if (new or old is not None) else None)
        script_actions = _file_action(fs, POLICY_SCRIPT, render_policy_script(), 0o755) if mode == "policyscript" and pinned else []
        files += script_actions + conf_actions
        ib["restart_required"] = bool(conf_actions or script_actions or (pinned_changed and mode != "none"))
    return files, ib


def _apply(fs: HostFS, walker: PciWalker, entries: list[dict], files: list[dict], cache: dict, warnings: list[str]) -> None:
    """Pin (read back), write or remove the files, and remember the kernel-managed vectors (a warning when that
    cannot be written: check mode will not predict them)."""
    apply(fs, entries)
    for a in files:
        if a["op"] == "write":
            fs.write_atomic(a["path"], a["after"], mode=a["mode"])
        else:
            fs.remove(a["path"])
    new_cache = managed_cache_after(cache, walker, entries)
    if new_cache != cache:
        try:
            fs.write_atomic(MANAGED_CACHE, json.dumps(new_cache, sort_keys=True) + "\n")
        except HostFSError as err:
            warnings.append(f"Could not remember the managed vectors in {MANAGED_CACHE}: {err}; check mode will not predict them.")


def _result(state: str, entries: list[dict], files: list[dict], resolved: dict, bdfs: list[str], ib: dict,
            persisted: list[str]) -> dict:
    """The module's result of the pinning: actions (each vector pinned or reset, each file), the IRQs, the devices,
    irqbalance, what is persisted and the diff."""
    verb = "pin" if state == "present" else "reset"
    changing = [e for e in entries if e["status"] in ("change", "changed")]
    actions = [{"action": verb, "path": f"/proc/irq/{e['irq']}/smp_affinity_list", "irq": e["irq"], "device": e["bdf"],
                "before": e["before"], "after": e["wanted"]} for e in changing]
    actions += [{"action": a["op"], "path": a["path"]} for a in files]  # the contents are in the diff
    devices = []
    for bdf in bdfs:
        mine = [e for e in entries if e["bdf"] == bdf]
        info = resolved[bdf]
        devices.append({"bdf": bdf, "numa_node": info["numa_node"], "local_cpus": format_cpulist(info["local_cpus"]),
                        "cpus": format_cpulist(info["cpus"]), "vectors": len(mine),
                        "managed_vectors": sum(1 for e in mine if e["status"] == "managed"), "remote": info["remote"]})
    diff = []
    if changing:
        diff.append({"before_header": "smp_affinity_list", "after_header": "smp_affinity_list",
                     "before": "".join(f"IRQ {e['irq']} ({e['bdf']}): {e['before']}\n" for e in changing),
                     "after": "".join(f"IRQ {e['irq']} ({e['bdf']}): {e['wanted']}\n" for e in changing)})
    for a in files:
        diff.append({"before_header": a["path"], "after_header": a["path"], "before": a["before"] or "", "after": a["after"]})
    return {"changed": bool(actions), "actions": actions, "irqs": report(entries, resolved), "devices": devices,
            "irqbalance": ib, "persisted": persisted, "diff": diff}

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.driver_reload executes: activate an installed driver without a reboot, by unloading and
loading its kernel modules, only where no process holds the GPU.

Read: the loaded modules (/sys/module), the loaded driver's version (its /proc file) and every process with a device
file of the driver open (/proc/<pid>/fd). Decide: a holder outside ``stop_services`` refuses the reload, naming each
process (pid, command, unit, device) and what to do; nothing is stopped, signalled or killed. Apply (outside check
mode): stop ``stop_services`` (nvidia-persistenced holds the devices by design), ``modprobe -r`` the loaded modules in
reverse order, ``modprobe`` them again, start the services. Read back: the driver's version file must say
``expected_version`` (when given)."""

from __future__ import annotations

from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.parse import upstream
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.reads import (
    MODULE_RE, UNIT_RE, VERSION_RE, checked, device_holders, loaded_version,
)

DEFAULTS = {"modules": ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"], "device_prefix": "/dev/nvidia",
            "stop_services": ["nvidia-persistenced.service"], "version_file": "/proc/driver/nvidia/version",
            "expected_version": None}


def execute(params: dict, host: Host, check_mode: bool) -> dict[str, Any]:
    """driver_reload's result: ``before``/``after`` (the loaded version), ``holders``, ``reloaded`` (modules),
    ``actions``; Failed (nothing changed) while a process holds the GPU."""
    p = dict(DEFAULTS, **{k: v for k, v in params.items() if v is not None})
    modules = [checked("modules[]", m, MODULE_RE, "a kernel module name") for m in p["modules"]]
    if not modules:
        raise Failed("modules is empty: name the driver's kernel modules in load order (nvidia first). Nothing was "
                     "done.", changed=False)
    services = [checked("stop_services[]", s, UNIT_RE, "a systemd unit name")
                for s in p["stop_services"]]
    prefix = p["device_prefix"]
    if not isinstance(prefix, str) or not prefix.startswith("/dev/") or ".." in prefix:
        raise Failed(f"device_prefix={prefix!r} must be a path under /dev (/dev/nvidia). Nothing was done.", changed=False)
    expected = p["expected_version"]
    if expected is not None:
        expected = upstream(checked("expected_version", expected, VERSION_RE, "a driver version (550.54.15)"))
    before = loaded_version(host, p["version_file"])
    loaded = [m for m in modules if host.fs.isdir(f"/sys/module/{m}")]
    holders = device_holders(host, prefix)
    if expected is not None and before == expected:  # the loaded driver is the one wanted: nothing to unload
        return {"changed": False, "actions": [], "before": before, "after": before, "holders": holders, "reloaded": []}
    blocking = [h for h in holders if h["unit"] not in services]
    if blocking:
        raise Failed(refusal(blocking, prefix), changed=False, holders=holders, before=before, actions=[])
    units = sorted({h["unit"] for h in holders if h["unit"] in services})
    actions = plan(modules, loaded, units)
    if check_mode:
        return {"changed": True, "actions": actions, "before": before, "after": expected, "holders": holders,
                "reloaded": []}
    apply(host, actions)
    after = loaded_version(host, p["version_file"])
    if expected is not None and after != expected:
        raise Failed(f"the driver was reloaded but {p['version_file']} says {after or 'nothing (not loaded)'}, not "
                     f"{expected}: the installed module is not the expected one (modinfo {modules[0]}; dkms status). "
                     "Reinstall the old driver (driver_upgrade's rollback) or reboot.", changed=True, actions=actions,
                     before=before, after=after)
    return {"changed": True, "actions": actions, "before": before, "after": after, "holders": holders,
            "reloaded": [a["module"] for a in actions if a["action"] == "load"]}


def refusal(blocking: list[dict[str, Any]], prefix: str) -> str:
    who = "; ".join(f"pid {h['pid']} ({h['comm']}{', ' + h['unit'] if h['unit'] else ''}) has {h['device']} open"
                    for h in blocking[:10]) + (f"; and {len(blocking) - 10} more" if len(blocking) > 10 else "")
    units = sorted({h["unit"] for h in blocking if h["unit"]})
    return (f"Refusing to reload the driver: {len(blocking)} process(es) hold the GPU ({prefix}*): {who}. Nothing was "
            f"stopped or changed. Drain the host and stop them ({'systemctl stop ' + ' '.join(units) if units else 'end them'}"
            "), or activate with a reboot; a driver is never unloaded under a running process.")


def plan(modules: list[str], loaded: list[str], units: list[str]) -> list[dict[str, Any]]:
    """Stop the holding services, unload the loaded modules last-first, load them (at least the first) first-last,
    start the services again."""
    load = [m for m in modules if m in loaded] or modules[:1]
    return ([{"action": "stop", "unit": u} for u in units]
            + [{"action": "unload", "module": m} for m in reversed(loaded)]
            + [{"action": "load", "module": m} for m in load]
            + [{"action": "start", "unit": u} for u in units])


def apply(host: Host, actions: list[dict[str, Any]]) -> None:
    modprobe = host.cmd.find("modprobe", required=True, hint="install kmod")
    done: list[dict[str, Any]] = []
    for a in actions:
        if a["action"] in ("stop", "start"):
            argv = host.cmd.systemctl(a["action"], a["unit"])
        else:
            argv = host.cmd.argv([modprobe] + (["-r"] if a["action"] == "unload" else []) + [a["module"]])
        rc, out, err = host.cmd.run(argv)
        if rc != 0:
            first = next((x["module"] for x in actions if x["action"] == "load"), "")
            state = (f"the driver is unloaded: the GPUs have no driver until modprobe {first} succeeds or the host "
                     "reboots" if any(d["action"] == "unload" for d in done) else "nothing was unloaded")
            raise Failed(f"'{' '.join(argv)}' failed (rc {rc}): {(err or out).strip()}; {state}.", changed=bool(done),
                         actions=actions, done=done)
        done.append(a)

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The boot-health unit of a candidate kernel: what kernel_boot_health writes on the host, and
``execute``, which writes it (through the Host's HostFS) and runs systemctl (through its HostCmd).

A oneshot service that runs the check script (roles/kernel_upgrade/files/gpufleet-boot-health.py,
copied to ``SCRIPT``) only under the candidate kernel (``ConditionKernelVersion``), a timer that
starts it 60 s after boot and every 30 s after, and the script's JSON configuration. The script
reboots an uncommitted or unhealthy candidate into the saved default (see its docstring).
"""

from __future__ import annotations

import json
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.upgrade import KernelUpgradeError, validate_version
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.flow import COMMIT_TIMEOUT_S
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.journal import (
    HEALTH_RESULT, JOURNAL, saved_default,
)

SCRIPT = "/usr/local/libexec/gpufleet-boot-health"
CONFIG = "/etc/gpufleet/boot-health.json"
SERVICE = "/etc/systemd/system/gpufleet-boot-health.service"
TIMER = "/etc/systemd/system/gpufleet-boot-health.timer"
TIMER_NAME = "gpufleet-boot-health.timer"
FILES = (CONFIG, SERVICE, TIMER)


def render_config(target: str, old: str, commit_timeout: int, driver_modules: list[str], gpu_required: bool,
                  vllm_unit: str, vllm_grace: int, journal: str, result: str) -> str:
    low, high = COMMIT_TIMEOUT_S
    if not low <= commit_timeout <= high:
        raise ValueError(f"commit_timeout {commit_timeout} s is not {low} to {high} s: at least a boot and a health check, "
                         "at most a day (an uncommitted candidate must revert by itself)")
    cfg: dict[str, Any] = {"target": target, "old": old, "commit_timeout": int(commit_timeout),
                           "driver_modules": list(driver_modules), "gpu_required": bool(gpu_required),
                           "vllm_unit": vllm_unit, "vllm_grace": int(vllm_grace), "journal": journal, "result": result,
                           "grubenv": "/boot/grub/grubenv", "nvidia_smi": "nvidia-smi"}
    return json.dumps(cfg, indent=2, sort_keys=True) + "\n"


def render_service(target: str) -> str:
    return f"""\
# Managed by Ansible (gpufleet.inference.kernel_upgrade): commit or revert of kernel {target}.
[Unit]
Description=gpufleet boot health of candidate kernel {target} (reboots into the saved default unless committed)
ConditionKernelVersion={target}
After=network-online.target

[Service]
Type=oneshot
ExecStart=/usr/bin/python3 {SCRIPT} {CONFIG}
"""


def render_timer(target: str) -> str:
    return f"""\
# Managed by Ansible (gpufleet.inference.kernel_upgrade): commit or revert of kernel {target}.
[Unit]
Description=gpufleet boot health checks of candidate kernel {target}
ConditionKernelVersion={target}

[Timer]
OnBootSec=60
OnUnitActiveSec=30
AccuracySec=5

[Install]
WantedBy=timers.target
"""


def render_all(target: str, **cfg: Any) -> dict[str, str]:
    return {CONFIG: render_config(target, **cfg), SERVICE: render_service(target), TIMER: render_timer(target)}


WANTS = "/etc/systemd/system/timers.target.wants/" + TIMER_NAME


class BootHealthError(Exception):
    pass


UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system",
             "/lib/systemd/system")


def unit_exists(fs: HostFS, unit: str) -> bool:
    return any(fs.exists(f"{d}/{unit}") for d in UNIT_DIRS)


def systemctl(cmds, *args: str) -> list[str]:
    """systemctl on the host; under another root the tree's own, through chroot (HostCmd)."""
    return cmds.argv([cmds.find("systemctl", required=True) if not cmds.chrooted else "systemctl", *args])


def guarded_target(config_text: str | None) -> str:
    """The candidate the installed unit guards (its configuration's target), or ''."""
    try:
        cfg = json.loads(config_text or "")
    except ValueError:
        return ""
    target = cfg.get("target") if isinstance(cfg, dict) else None
    return target if isinstance(target, str) else ""


def check_removal(fs, config_text: str | None) -> None:
    """The unit may go only once its candidate no longer runs uncommitted: BootHealthError while the host
    runs the guarded candidate and the saved default does not boot it (a rollback reboots first)."""
    target = guarded_target(config_text)
    running = (fs.read_optional("/proc/sys/kernel/osrelease") or "").strip()
    if target and running == target and saved_default(fs)[0] != target:
        raise BootHealthError(f"the host runs the candidate kernel {target} uncommitted (the saved GRUB default does not "
                              "boot it): removing its boot-health unit would leave nothing to revert it. Nothing was "
                              "changed. Reboot into the saved default first (the role's rollback does), or commit it.")


def execute(p: dict, host: Host, check_mode: bool) -> dict:
    """Write (or remove) the boot-health unit and its configuration, enable (or disable) the timer; the
    result with ``actions`` and the ``diff``. Raises BootHealthError."""
    fs, cmds, warn = host.fs, host.cmd, host.warn
    actions: list[dict] = []
    before = {path: fs.read_optional(path) for path in FILES}
    if p["state"] == "present":
        if not p["target"]:
            raise BootHealthError("target is required with state=present: the candidate kernel release")
        try:
            validate_version(p["target"], "target")
            if p["old"]:
                validate_version(p["old"], "old")
        except KernelUpgradeError as err:
            raise BootHealthError(f"{err} It is written into the boot-health unit (ConditionKernelVersion=); "
                                  "nothing was changed.") from None
        if not fs.exists(SCRIPT):
            raise BootHealthError(f"the check script {SCRIPT} is not on the host: copy "
                                  "roles/kernel_upgrade/files/gpufleet-boot-health.py there first (the role does)")
        vllm_unit = p["vllm_unit"]
        if vllm_unit and not unit_exists(fs, vllm_unit):
            # a server that is not this unit (a container, another name) must not make the candidate revert
            warn(f"{vllm_unit} is not a systemd unit on this host ({', '.join(UNIT_DIRS)}): the boot-health check "
                 "leaves the inference server out; set kernel_upgrade_vllm_unit to the server's unit to include it")
            vllm_unit = ""
        try:
            wanted = render_all(p["target"], old=p["old"], commit_timeout=p["commit_timeout"],
                                driver_modules=p["driver_modules"], gpu_required=p["gpu_required"],
                                vllm_unit=vllm_unit, vllm_grace=p["vllm_grace"], journal=JOURNAL,
                                result=HEALTH_RESULT)
        except ValueError as err:
            raise BootHealthError(str(err)) from None
        writes = [path for path, text in wanted.items() if before[path] != text.rstrip("\n")]
        actions += [{"action": "write", "path": path} for path in writes]
        if fs.exists(HEALTH_RESULT):
            actions.append({"action": "remove", "path": HEALTH_RESULT})
        commands = []
        if writes:
            commands.append(systemctl(cmds, "daemon-reload"))
        if writes or not fs.exists(WANTS):
            commands.append(systemctl(cmds, "enable", TIMER_NAME))
        actions += [{"action": "run", "argv": argv} for argv in commands]
        after = {path: wanted[path].rstrip("\n") for path in FILES}
    else:
        check_removal(fs, before[CONFIG])
        present = [path for path in FILES if before[path] is not None]
        commands = []
        if fs.exists(WANTS):
            commands.append(systemctl(cmds, "disable", TIMER_NAME))
        actions += [{"action": "run", "argv": argv} for argv in commands]
        actions += [{"action": "remove", "path": path} for path in present]
        if present:
            actions.append({"action": "run", "argv": systemctl(cmds, "daemon-reload")})
        after = {path: None for path in FILES}
    if actions and not check_mode:
        for action in actions:
            if action["action"] == "write":
                fs.write_durable(action["path"], wanted[action["path"]], 0o644)
            elif action["action"] == "remove":
                fs.remove(action["path"])
            else:
                rc, out, err = cmds.run(action["argv"])
                if rc != 0:
                    raise BootHealthError(f"'{' '.join(action['argv'])}' exited {rc}: {(err or out).strip()[-400:]}; the "
                                          "boot-health unit is not in place as asked: fix systemd on the host and run again")
    return {"changed": bool(actions), "files": list(FILES), "actions": actions,
            "diff": {"before": "".join(f"# {k}\n{v}\n" for k, v in before.items() if v is not None),
                     "after": "".join(f"# {k}\n{v}\n" for k, v in after.items() if v is not None),
                     "before_header": CONFIG, "after_header": CONFIG}}

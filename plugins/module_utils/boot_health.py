# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The boot-health unit of a candidate kernel: what kernel_boot_health writes on the host.

A oneshot service that runs the check script (roles/kernel_upgrade/files/gpufleet-boot-health.py,
copied to ``SCRIPT``) only under the candidate kernel (``ConditionKernelVersion``), a timer that
starts it 60 s after boot and every 30 s after, and the script's JSON configuration. The script
reboots an uncommitted or unhealthy candidate into the saved default (see its docstring).
"""

from __future__ import annotations

import json
from typing import Any

SCRIPT = "/usr/local/libexec/gpufleet-boot-health"
CONFIG = "/etc/gpufleet/boot-health.json"
SERVICE = "/etc/systemd/system/gpufleet-boot-health.service"
TIMER = "/etc/systemd/system/gpufleet-boot-health.timer"
TIMER_NAME = "gpufleet-boot-health.timer"
FILES = (CONFIG, SERVICE, TIMER)


def render_config(target: str, old: str, commit_timeout: int, driver_modules: list[str], gpu_required: bool,
                  vllm_unit: str, vllm_grace: int, journal: str, result: str) -> str:
    if commit_timeout < 120:
        raise ValueError(f"commit_timeout {commit_timeout} s is shorter than a boot and a health check (at least 120 s)")
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

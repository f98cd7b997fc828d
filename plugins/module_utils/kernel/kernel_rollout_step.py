# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.kernel_rollout_step executes: read the host (kernel/journal.py), then take one step of
the kernel's change flow the way every kind does (change/step.py: check the host's lease, step, renew the lease and
write the journal it returns). A refused step is a result (``next_action`` finish/refused), not an error, and writes
nothing; HostFSError from the reads and writes is raised, never fail_json-ed here.
"""

from __future__ import annotations

import time
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils.change.step import take_step
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.upgrade import KernelUpgradeError, validate_version
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.flow import EVENTS as FLOW_EVENTS, KERNEL
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.journal import (
    DPKG_STATUS, HISTORY_DIR, boot_id, health_result, installed_packages, load_journal, running_kernel, saved_default,
    uptime,
)

EVENTS = list(FLOW_EVENTS)


def observe(p: dict, fs: HostFS, check_mode: bool, now: float, running: str, default: str | None) -> dict[str, Any]:
    return {"event": p["event"], "data": p["data"] or {}, "preflight": p["preflight"] or {}, "running": running,
            "default": default, "boot_id": boot_id(fs), "uptime": uptime(fs), "now": now, "target": p["target"],
            "run_id": p["run_id"], "installed_packages": installed_packages(fs.read_optional(DPKG_STATUS)),
            "health": health_result(fs),
            "settings": {"reboot_ok": p["reboot_ok"], "check_mode": check_mode, "lock": p["lock"],
                         "lock_packages": p["lock_packages"], "verify_pcie": p["verify_pcie"], "headers": p["headers"],
                         "outputs": p.get("outputs", True), "stability": p.get("stability", True),
                         "commit_timeout": p["commit_timeout"], "gate": p["gate"] or {}}}


def execute(p: dict, host: Host, check_mode: bool, now: float | None = None) -> dict[str, Any]:
    """One step: observe the host, decide, then (outside check mode, and only when the step is not refused)
    renew the lease and write the journal (change/step.py); the next action. A refused step writes nothing.
    ``now``: the clock, for tests."""
    fs = host.fs
    now = time.time() if now is None else now
    running = running_kernel(fs)
    default, saved = saved_default(fs)
    base = {"running": running, "default_version": default, "saved_entry": saved}

    def load() -> dict[str, Any] | None:
        validate_version(p["target"], "target")
        return load_journal(fs, p["journal"])

    return take_step(KERNEL, p, fs, check_mode, now, base, load,
                     lambda: observe(p, fs, check_mode, now, running, default), HISTORY_DIR, (KernelUpgradeError,))

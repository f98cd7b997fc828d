# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.kernel_rollout_step executes: read the host (kernel_upgrade_journal.py), renew
the host's lease (host_lease.py), take one step of the state machine (kernel_upgrade_flow.py) and write the
journal it returns. A refused step is a result (``next_action`` finish/refused), not an error; FlowError and
HostFSError from the reads and writes are raised, never fail_json-ed here.
"""

from __future__ import annotations

import time
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils import host_lease as lease_utils
from ansible_collections.gpufleet.inference.plugins.module_utils.hostfs import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel_upgrade import KernelUpgradeError, validate_version
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel_upgrade_flow import (
    FlowError, finish, record_facts, step,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel_upgrade_journal import (
    DPKG_STATUS, boot_id, dump, health_result, installed_packages, load_journal, running_kernel, save_journal,
    saved_default, uptime,
)

EVENTS = ["start", "locked", "benchmarked", "audited", "pinned", "installed", "rebooted", "verified", "committed",
          "rolled_back", "error"]


def renew_lease(p: dict, fs: HostFS, check_mode: bool, now: float) -> list[dict[str, Any]]:
    """Renew this run's lease (``lease_run_id``) at every step; LeaseError when another run holds it."""
    if not p["lease_run_id"]:
        return []
    path = lease_utils.LEASE
    current = lease_utils.parse(fs.read_text(path, default=""), path)
    if check_mode and current is None:
        return []  # a check-mode run took its lease only on paper: another run's lease would still refuse it
    lease, what = lease_utils.plan(current, "renewed", p["lease_run_id"], now, p["lease_ttl"])
    if not check_mode:
        fs.write_durable(path, lease_utils.render(lease), 0o644)
    return [{"action": "renew_lease", "path": path, "what": what}]


def execute(p: dict, fs: HostFS, check_mode: bool, now: float | None = None) -> dict[str, Any]:
    """One step: observe the host, decide, write the journal (outside check mode), return the next action."""
    now = time.time() if now is None else now
    running = running_kernel(fs)
    default, saved = saved_default(fs)
    base = {"running": running, "default_version": default, "saved_entry": saved}
    try:
        validate_version(p["target"], "target")
        journal = load_journal(fs, p["journal"])
        lease_actions = renew_lease(p, fs, check_mode, now)
        obs = {"event": p["event"], "data": p["data"] or {}, "preflight": p["preflight"] or {}, "running": running, "default": default,
               "boot_id": boot_id(fs), "uptime": uptime(fs), "now": now, "target": p["target"], "run_id": p["run_id"],
               "installed_packages": installed_packages(fs.read_optional(DPKG_STATUS)), "health": health_result(fs),
               "settings": {"reboot_ok": p["reboot_ok"], "check_mode": check_mode, "lock": p["lock"],
                            "lock_packages": p["lock_packages"], "verify_pcie": p["verify_pcie"],
                            "headers": p["headers"],
                            "commit_timeout": p["commit_timeout"], "gate": p["gate"] or {}}}
        new, action = step(journal, obs)
    except (FlowError, lease_utils.LeaseError, KernelUpgradeError) as err:
        action = finish("refused", str(err))
        return dict(base, changed=False, next_action=action, journal=None, record=record_facts(None, action),
                    actions=[], diff={})
    actions = list(lease_actions)
    if new is not None and new != journal:
        if check_mode:
            actions.append({"action": "write_journal", "path": p["journal"], "stage": new["stage"]})
        else:
            actions += save_journal(fs, new, p["journal"])
    diff = {"before": dump(journal) if journal else "", "after": dump(new) if new else "",
            "before_header": p["journal"], "after_header": p["journal"]}
    return dict(base, changed=bool(actions), next_action=action, journal=new, record=record_facts(new or journal, action),
                actions=actions, diff=diff)

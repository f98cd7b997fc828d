# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.vllm_upgrade_step executes: read which vLLM the unit's venv link points at (the version
its venv's ``.gpufleet-complete`` records) and the journal, then take one step of the vLLM upgrade's change flow the
way every kind does (change/step.py: the lease, the take-over, the step, the durable journal write). A refused step is
a result (``next_action`` finish/refused), not an error, and writes nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils.change.journal import load_journal
from ansible_collections.gpufleet.inference.plugins.module_utils.change.step import take_step
from ansible_collections.gpufleet.inference.plugins.module_utils.vllm.upgrade import (
    EVENTS as FLOW_EVENTS, HISTORY_DIR, VLLM, VersionError, check_journal, validate_version,
)

EVENTS = list(FLOW_EVENTS)
MARKER = ".gpufleet-complete"


def current_venv(fs: HostFS, base_dir: str) -> tuple[str, str | None, str | None]:
    """(the link, the venv it points at or None, that venv's vLLM version or None): the version is the one the
    vllm_service role recorded when it finished the venv (``.gpufleet-complete``), None for a venv it never finished."""
    link = base_dir.rstrip("/") + "/current"
    target = fs.readlink(link)
    if not target:
        return link, None, None
    venv = target if target.startswith("/") else f"{base_dir.rstrip('/')}/{target}"
    try:
        marker = json.loads(fs.read_optional(f"{venv.rstrip('/')}/{MARKER}") or "null")
    except ValueError:
        marker = None
    version = marker.get("version") if isinstance(marker, dict) else None
    return link, venv, version if isinstance(version, str) and version else None


def observe(p: dict, check_mode: bool, now: float, link: str, venv: str | None, version: str | None) -> dict[str, Any]:
    return {"event": p["event"], "data": p["data"] or {}, "preflight": p["preflight"] or {}, "running": version,
            "default": version, "current_link": link, "current_venv": venv, "now": now, "target": p["target"],
            "run_id": p["run_id"],
            "settings": {"restart_ok": p["restart_ok"], "check_mode": check_mode, "lock": p["lock"],
                         "verify_pcie": p["verify_pcie"], "outputs": p["outputs"], "stability": p["stability"],
                         "findings": p["findings"], "gate": p["gate"] or {}}}


def execute(p: dict, host: Host, check_mode: bool, now: float | None = None) -> dict[str, Any]:
    """One step of the vLLM upgrade; ``now``: the clock, for tests."""
    fs = host.fs
    now = time.time() if now is None else now
    link, venv, version = current_venv(fs, p["base_dir"])
    base = {"running": version, "current_venv": venv, "current_link": link}

    def load() -> dict[str, Any] | None:
        validate_version(p["target"], "target")
        journal = load_journal(fs, p["journal"], VLLM)
        return check_journal(journal, p["journal"]) if journal is not None else None

    return take_step(VLLM, p, fs, check_mode, now, base, load, lambda: observe(p, check_mode, now, link, venv, version),
                     HISTORY_DIR, (VersionError,))

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.driver_upgrade_step executes: read which driver is loaded (its /proc file) and which is
installed (dpkg-query, the driver's packages), and the journal; then take one step of the driver upgrade's change flow
the way every kind does (change/step.py: the lease, the take-over, the step, the durable journal write). A refused
step is a result (``next_action`` finish/refused), not an error, and writes nothing.
"""

from __future__ import annotations

import time
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.change.journal import load_journal
from ansible_collections.gpufleet.inference.plugins.module_utils.change.step import take_step
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.parse import upstream
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.reads import (
    PACKAGE_RE, VERSION_RE, checked, installed_packages, loaded_version,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.upgrade import DRIVER, EVENTS as FLOW_EVENTS, HISTORY_DIR

EVENTS = list(FLOW_EVENTS)


def observe(p: dict, check_mode: bool, now: float, loaded: str | None, installed: dict[str, str]) -> dict[str, Any]:
    first = installed.get(p["packages"][0])
    return {"event": p["event"], "data": p["data"] or {}, "preflight": p["preflight"] or {}, "running": loaded,
            "default": upstream(first), "installed": installed, "packages": list(p["packages"]),
            "package_version": p["target"], "version_file": p["version_file"], "state": p["state"], "now": now,
            "target": upstream(p["target"]), "run_id": p["run_id"],
            "settings": {"activate": p["activate"], "reboot_ok": p["reboot_ok"], "check_mode": check_mode,
                         "lock": p["lock"], "verify_pcie": p["verify_pcie"], "outputs": p["outputs"],
                         "stability": p["stability"], "hold_packages": p["hold_packages"], "gate": p["gate"] or {}}}


def execute(p: dict, host: Host, check_mode: bool, now: float | None = None) -> dict[str, Any]:
    """One step of the driver upgrade; ``now``: the clock, for tests."""
    fs = host.fs
    now = time.time() if now is None else now
    packages = [checked("packages[]", n, PACKAGE_RE, "a Debian package name") for n in p.get("packages") or []]
    if not packages:
        raise Failed("packages is empty: name the driver's packages (the first one's version is the driver's). Nothing "
                     "was done.", changed=False)
    checked("target", p["target"], VERSION_RE, "a Debian package version (550.54.15-1)")
    loaded = loaded_version(host, p["version_file"])
    installed = installed_packages(host)
    base = {"running": loaded, "installed": {n: installed.get(n) for n in packages}}

    return take_step(DRIVER, dict(p, packages=packages), fs, check_mode, now, base,
                     lambda: load_journal(fs, p["journal"], DRIVER),
                     lambda: observe(dict(p, packages=packages), check_mode, now, loaded, installed), HISTORY_DIR)

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel upgrade's host-side state, read and written through HostFS.

* the journal (``JOURNAL``): the change flow's (change/journal.py), loaded and validated as the kernel's (a
  corrupt one is refused with the fix, its releases checked), written durably (temp file, fsync, rename, fsync of
  the directory), moved to ``HISTORY_DIR`` when the upgrade ends;
* what the flow observes on the host: the running kernel, the boot id, the saved GRUB default (the
  kernel its entry boots), the installed packages (dpkg's status file), the boot-health unit's last
  result.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils.change import journal as change_journal
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.grub import GRUB_CFG, parse_grub_cfg, read_grubenv, resolve_saved
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.upgrade import KernelUpgradeError, validate_version
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.flow import KERNEL, FlowError

STATE_DIR = "/var/lib/gpufleet/kernel_upgrade"
JOURNAL = STATE_DIR + "/journal.json"
HISTORY_DIR = STATE_DIR + "/history"
HEALTH_RESULT = STATE_DIR + "/boot-health.json"
DPKG_STATUS = "/var/lib/dpkg/status"


def load_journal(fs: HostFS, path: str = JOURNAL) -> dict[str, Any] | None:
    """The journal, or None when there is none; FlowError (nothing changed) when it cannot be trusted."""
    journal = change_journal.load_journal(fs, path, KERNEL)
    if journal is None:
        return None
    try:  # its releases reach GRUB and the boot-health unit
        validate_version(journal["target"], f"the upgrade journal {path}'s target")
        validate_version(journal["old"], f"the upgrade journal {path}'s old kernel")
    except KernelUpgradeError as err:
        raise FlowError(f"{err} Nothing was changed: move the journal away (mv {path} {path}.broken) if no upgrade "
                        "should be in progress, or repair it.") from None
    return journal


def history_path(journal: dict[str, Any]) -> str:
    """``history/<run id>-<start, epoch s>-<target>.json``: one file per upgrade, even for one run id."""
    return change_journal.history_path(journal, HISTORY_DIR)


def save_journal(fs: HostFS, journal: dict[str, Any], path: str = JOURNAL) -> list[dict[str, Any]]:
    """Write the journal durably; a finished one goes to the history and the live journal is removed.
    Returns the actions taken."""
    return change_journal.save_journal(fs, journal, path, HISTORY_DIR)


def running_kernel(fs: HostFS) -> str:
    text = fs.read_optional("/proc/sys/kernel/osrelease")
    if not text:
        raise FlowError(f"cannot read /proc/sys/kernel/osrelease under {fs.root}: the running kernel is unknown")
    return text.strip()


def boot_id(fs: HostFS) -> str:
    return (fs.read_optional("/proc/sys/kernel/random/boot_id") or "").strip()


def uptime(fs: HostFS) -> float | None:
    """Seconds since this boot (/proc/uptime), for the boot-relative commit deadline; None when unreadable."""
    try:
        value = float((fs.read_optional("/proc/uptime") or "").split()[0])
    except (IndexError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def saved_default(fs: HostFS) -> tuple[str | None, str | None]:
    """(kernel version, entry) the saved GRUB default boots; (None, saved) when it names no entry."""
    env = read_grubenv(fs)
    saved = env["vars"].get("saved_entry")
    entry = resolve_saved(parse_grub_cfg(fs.read_optional(GRUB_CFG)), saved)
    return (entry["version"] if entry else None), saved


def installed_packages(status_text: str | None) -> list[str]:
    """Names dpkg has installed (``Status: ... installed``), from /var/lib/dpkg/status."""
    out, name = set(), None
    for line in (status_text or "").splitlines():
        if line.startswith("Package: "):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("Status: ") and name and line.split()[-1] in ("installed", "half-configured"):
            out.add(name)
        elif not line.strip():
            name = None
    return sorted(out)


def health_result(fs: HostFS) -> dict[str, Any] | None:
    text = fs.read_optional(HEALTH_RESULT)
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The boot persistence of the CPU settings of gpufleet.inference.cpu_tuning: one JSON file of the settings in
force (``/etc/gpufleet/cpu_tuning.json``), the applier (cpu/reapply.py, bundled into one script by
_host/bundle.py) and one systemd oneshot unit that runs it once per boot.

The kernel forgets every one of these knobs at reboot (the governor and the THP policy go back to the kernel's
defaults, every idle state is enabled again). The unit runs after the modules are loaded and udev has seen the
devices (the cpufreq and cpuidle drivers are there) and after the services that set a governor of their own
(Ubuntu's ondemand.service, tuned, power-profiles-daemon), so its values are the last ones written. It stays
enabled while the file holds a setting; the module's ``state: absent`` removes all of it.
"""

from __future__ import annotations

import json

from ansible_collections.gpufleet.inference.plugins.module_utils._host import units

PERSIST_CONFIG = "/etc/gpufleet/cpu_tuning.json"
PERSIST_FORMAT = "gpufleet-cpu-tuning/1"
APPLY_SCRIPT = "/usr/local/libexec/gpufleet-cpu-tuning-apply"
UNIT_NAME = "gpufleet-cpu-tuning.service"
UNIT_PATH = "/etc/systemd/system/" + UNIT_NAME
UNIT_WANTS = "/etc/systemd/system/multi-user.target.wants/" + UNIT_NAME


def load_persist(text: str | None) -> dict | None:
    """The persisted settings ({} when there is no file), None when the text is not a PERSIST_FORMAT file."""
    if text is None:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format") != PERSIST_FORMAT or not isinstance(data.get("settings"), dict):
        return None
    return dict(data["settings"])


def render_persist(settings: dict) -> str:
    return json.dumps({"format": PERSIST_FORMAT, "generated_by": "gpufleet.inference.cpu_tuning", "settings": settings},
                      indent=2, sort_keys=True) + "\n"


def render_unit(script: str = APPLY_SCRIPT, config: str = PERSIST_CONFIG) -> str:
    return units.render_unit(
        ["Installed by Ansible (gpufleet.inference.cpu_tuning); removed by its state=absent.",
         "Re-applies the CPU governor, energy-performance preference, C-state limit and transparent-hugepage",
         f"policy in {config} once per boot, each write read back. Its log: journalctl -u {UNIT_NAME}"],
        ["Description=Re-apply the CPU settings tuned by gpufleet.inference",
         "After=systemd-modules-load.service systemd-udev-trigger.service ondemand.service tuned.service "
         "power-profiles-daemon.service", f"ConditionPathExists={config}"],
        units.oneshot(f"{script} {config}"), "multi-user.target")


def wanted_files(script: str, settings: dict, persist: bool) -> list[tuple[str, str | None, int]]:
    """(path, content or None for absent, mode) of the three files: there while ``persist`` and a setting is kept."""
    want = bool(persist and settings)
    return [(APPLY_SCRIPT, script if want else None, 0o755),
            (PERSIST_CONFIG, render_persist(settings) if want else None, 0o644),
            (UNIT_PATH, render_unit() if want else None, 0o644)]

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's one boot-time re-apply mechanism for PCIe config-space settings.

pcie_payload (MaxPayload/MaxReadReq, the ``devices`` list) and pcie_acs (ACS Control bits
cleared, the ``acs`` list) share one JSON file, one applier script and one systemd oneshot unit.
Each module owns its list and keeps the other's as it found it; the unit stays enabled while
either list holds an entry. The unit runs early in boot, before udev coldplug loads the GPU
drivers (``Before=systemd-udev-trigger.service``) and before the services that use the GPUs, so
no DMA is in flight when a register changes.

The applier (``APPLY_SCRIPT``) is ``pcie/reapply.py``: the module_utils of the modules, shipped in
one script by ``_host/bundle.py``, so that the boot applies, reads back and rolls back with the
modules' own code (``_host/device_apply.py``, ``_pci/config.py``'s capability walk). This file holds the paths,
the JSON file, the unit and the file and unit steps.

Also here: the setpci argv every module uses, always ``-A linux-sysfs`` against the given root,
so a missing tree is an error and never a silent fallback to the real bus.
"""

from __future__ import annotations

import json

from ansible_collections.gpufleet.inference.plugins.module_utils._host import units

PERSIST_CONFIG = "/etc/gpufleet/pcie_payload.json"
PERSIST_FORMAT = "gpufleet-pcie-payload/1"
APPLY_SCRIPT = "/usr/local/libexec/gpufleet-pcie-payload-apply"
UNIT_NAME = "gpufleet-pcie-payload.service"
UNIT_PATH = "/etc/systemd/system/" + UNIT_NAME
UNIT_WANTS = "/etc/systemd/system/sysinit.target.wants/" + UNIT_NAME


def sysfs_bus(root: str) -> str:
    """The PCI bus directory setpci reads under ``root`` (``/sys/bus/pci`` on a real host)."""
    return (root.rstrip("/") or "") + "/sys/bus/pci"


def setpci_base(setpci: str, root: str) -> list[str]:
    """``setpci -A linux-sysfs -O sysfs.path=ROOT/sys/bus/pci``: only the sysfs access method, only this tree.

    Without ``-A``, setpci tries its other access methods (``/proc/bus/pci``, direct port I/O) when the
    sysfs tree is missing, which on a test tree means writing the real bus.
    """
    return [setpci, "-A", "linux-sysfs", "-O", f"sysfs.path={sysfs_bus(root)}"]


def render_json(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def load_persist(text: str | None) -> dict | None:
    """The persisted configuration, None when the text is not JSON of PERSIST_FORMAT."""
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format") != PERSIST_FORMAT:
        return None
    return data


def _load(text: str | None) -> dict:
    return load_persist(text) or {}


def parse_persist(text: str | None, key: str = "devices") -> dict[str, dict]:
    """Entries of one list of the persisted configuration by BDF ({} when absent or foreign)."""
    return {e["bdf"]: e for e in _load(text).get(key, []) if isinstance(e, dict) and "bdf" in e}


def render_persist(entries: list[dict], acs: list[dict] | None = None) -> str:
    """The shared file: ``devices`` (payload entries) and, when any, ``acs`` (ACS entries)."""
    data = {"format": PERSIST_FORMAT, "generated_by": "gpufleet.inference.pcie_payload", "devices": entries}
    if acs:
        data["acs"] = acs
    return render_json(data)


def render_unit(script: str = APPLY_SCRIPT, config: str = PERSIST_CONFIG) -> str:
    return units.render_unit(
        ["Installed by Ansible (gpufleet.inference.pcie_payload, pcie_acs); removed by their state=default.",
         f"Re-applies the PCIe MaxPayload/MaxReadReq values and the ACS Control bits in {config} once per",
         "boot, before udev coldplug loads the GPU drivers and before the services that use the GPUs start:",
         f"no DMA is in flight while a register changes. Its log: journalctl -u {UNIT_NAME}"],
        ["Description=Re-apply PCIe MaxPayload/MaxReadReq and ACS settings tuned by gpufleet.inference",
         "DefaultDependencies=no", "After=systemd-remount-fs.service",
         "Before=systemd-udev-trigger.service sysinit.target shutdown.target nvidia-persistenced.service",
         "Conflicts=shutdown.target", f"ConditionPathExists={config}"],
        units.oneshot(f"{script} {config}"), "sysinit.target")


def persistence_plan(read, exists, script: str, systemctl_argv, devices: list[dict], acs: list[dict],
                     persist: bool, real_root: bool) -> list[dict]:
    """File and unit steps that make the boot unit match both lists (or remove it when both are empty).

    ``read(path) -> str | None`` and ``exists(path)`` read the host; ``script`` is the applier as
    ``pcie/reapply.py``'s ``render_script()`` renders it; ``systemctl_argv(*args)`` builds a systemctl
    command. Returns actions ``write_file``/``remove_file`` (with ``content``/``mode``),
    ``daemon_reload``, ``enable_unit``, ``disable_unit``.
    """
    want = bool(persist and (devices or acs))
    files = [(APPLY_SCRIPT, script, "0755", "apply script"),
             (PERSIST_CONFIG, render_persist(devices, acs), "0644", "persisted values"),
             (UNIT_PATH, render_unit(), "0644", "systemd unit")]
    actions = []
    enabled = exists(UNIT_WANTS)
    if not want and enabled:
        actions.append({"action": "disable_unit", "unit": UNIT_NAME, "argv": systemctl_argv("disable", UNIT_NAME)})
    unit_changed = False
    for path, text, mode, what in files:
        current = read(path)
        if want and current != text:
            actions.append({"action": "write_file", "path": path, "what": what, "content": text, "mode": mode})
            unit_changed = unit_changed or path == UNIT_PATH
        elif not want and current is not None:
            actions.append({"action": "remove_file", "path": path, "what": what})
            unit_changed = unit_changed or path == UNIT_PATH
    if unit_changed and real_root:
        actions.append({"action": "daemon_reload", "argv": systemctl_argv("daemon-reload")})
    if want and not enabled:
        actions.append({"action": "enable_unit", "unit": UNIT_NAME, "argv": systemctl_argv("enable", UNIT_NAME)})
    return actions

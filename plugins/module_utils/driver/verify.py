# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is the driver the host runs after activation the one it should run, with every GPU it had? Pure: the executor
(driver_verify.py) gathers the state through NVML (gpu/readings.py, pcie/nvml.py's session), the driver's /proc file,
the package database and the kernel log, before the change and after it; this file compares the two.

A state is ``{loaded, nvml_version, packages: {name: version}, gpus: {bdf: {persistence_mode, name}}, gpu_source,
xids: [kernel log lines]}``. The checks:

* ``driver_version``: the loaded module, NVML (where it answers) and the user-space packages all say the expected
  version (their upstream part);
* ``gpus_present``: every GPU present before is present after (a GPU the new driver does not bind is lost);
* ``persistence``: a GPU in persistence mode before is in it after (NVML only);
* ``xid``: no Xid line in the kernel log that was not there before (pcie/health.py's parser and its critical Xids).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.driver.checks import check
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.parse import upstream
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.health import XID_CRITICAL, parse_xids


def check_version(expected: str, state: dict[str, Any]) -> dict[str, Any]:
    want = upstream(expected)
    said = {"the loaded module": state.get("loaded")}
    if state.get("nvml_version") is not None:
        said["NVML"] = state["nvml_version"]
    for name, version in sorted((state.get("packages") or {}).items()):
        said[f"{name} (of packages)"] = upstream(version)
    off = {k: v for k, v in said.items() if v != want}
    if off:
        return check("driver_version", False, f"expected_version is {want}, but " + ", ".join(
            f"{k} says {v or 'nothing (not loaded or not installed)'}" for k, v in off.items()),
            "The activation did not bring the candidate up: read dkms status and the kernel log; go back to the held "
            "version (driver_upgrade's rollback).")
    return check("driver_version", True, f"{', '.join(said)} all say {want}")


def check_gpus(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    old, new = set(before.get("gpus") or {}), set(after.get("gpus") or {})
    lost = sorted(old - new)
    source = after.get("gpu_source") or "?"
    if lost:
        return check("gpus_present", False, f"{len(lost)} GPU(s) present before are gone after ({source}): "
                     + ", ".join(lost), "Read the kernel log (NVRM lines, Xid 79) and lspci; go back to the held version "
                     "if the new driver does not bind them.")
    return check("gpus_present", True, f"all {len(old)} GPU(s) present before are present ({source}: {len(new)})")


def check_persistence(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    if before.get("gpu_source") != "nvml" or after.get("gpu_source") != "nvml":
        return check("persistence", True, "not measured: NVML was not read before and after")
    lost = sorted(b for b, g in (before.get("gpus") or {}).items()  # a GPU gone is gpus_present's failure
                  if g.get("persistence_mode") == 1 and b in after["gpus"] and after["gpus"][b].get("persistence_mode") != 1)
    if lost:
        return check("persistence", False, f"persistence mode was on and is off on {', '.join(lost)}",
                     "Start nvidia-persistenced (systemctl start nvidia-persistenced) and check that it runs with the new "
                     "driver's version.")
    on = sum(1 for g in after["gpus"].values() if g.get("persistence_mode") == 1)
    return check("persistence", True, f"persistence mode as before ({on} GPU(s) on)")


def new_xids(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """The Xid events in ``after``'s kernel log lines that ``before``'s lines did not have."""
    seen = set(before.get("xids") or [])
    return parse_xids([line for line in after.get("xids") or [] if line not in seen])


def check_xids(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    found = new_xids(before, after)
    if found:
        words = ", ".join(f"Xid {x['xid']} on {x['bdf']}" + (f" ({XID_CRITICAL[x['xid']]})" if x["xid"] in XID_CRITICAL else "")
                          for x in found[:8])
        return check("xid", False, f"{len(found)} new Xid event(s) since the change: {words}",
                     "Look each up in NVIDIA's Xid catalogue; a driver that raises Xids is rolled back.")
    return check("xid", True, "no new Xid in the kernel log")


def verify(expected: str, before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    return [check_version(expected, after), check_gpus(before, after), check_persistence(before, after),
            check_xids(before, after)]

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver upgrade's decisions, pure: may this host take candidate driver packages, and is the driver it runs after
activation the one it should run? Each check has ``name``, ``ok``, ``reason`` and, when it fails, ``fix``.

Why each preflight check exists (docs/driver_upgrade.md):

* ``candidate``: apt can install every driver package at the candidate version (its own words when it cannot), and
  removes nothing else.
* ``build_<kernel>``: the candidate's DKMS module builds for the running kernel and for every pending kernel
  (installed, newer than the running one, which the next reboot may boot): a driver that does not build leaves the
  host without its GPUs after the next reboot (NVIDIA/ansible-role-nvidia-driver#6, gpu-operator#910). It is tried in
  a private DKMS tree (``dkms --dkmstree --sourcetree``) before anything changes, and refused with DKMS's and the
  compiler's lines.
* ``versions``: the user-space packages and the kernel module the candidate builds carry one upstream version, so that
  CUDA and NVML will not answer "Driver/library version mismatch" after activation.
* ``boot_space``: the initramfs of each kernel the module is built for may be rebuilt; /boot must hold a new one
  beside the old.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.driver.parse import upstream
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.upgrade import BOOT_SPACE_FACTOR, BOOT_SPACE_SLACK

MIB = 1024 * 1024


def check(name: str, ok: bool, reason: str, fix: str = "") -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "reason": reason, "fix": "" if ok else fix}


def check_candidate(packages: list[str], version: str, sim: dict[str, Any]) -> dict[str, Any]:
    """apt's simulated install of ``packages`` at ``version`` (kernel/upgrade.py's parse_apt_simulation)."""
    spec = " ".join(f"{p}={version}" for p in packages)
    if not sim["available"]:
        return check("candidate", False, f"apt-get install -s {spec} fails: {sim['error']}",
                     f"Check the version against what the repositories offer (apt-cache policy {packages[0]}; "
                     "apt-get update). Nothing was changed.")
    if sim["removes"]:
        return check("candidate", False, f"installing {spec} would remove {', '.join(sim['removes'])}",
                     "Resolve the conflict by hand first (apt-get install -s shows why); the upgrade never removes "
                     "packages. Nothing was changed.")
    planned = dict(sim["installs"])
    wrong = [f"{p} {planned[p]}" for p in packages if p in planned and upstream(planned[p]) != upstream(version)]
    if wrong:
        return check("candidate", False, f"apt would install {', '.join(wrong)}, not {version}",
                     "Name the exact version apt-cache policy shows. Nothing was changed.")
    return check("candidate", True, f"apt can install {spec}" + (
        f" ({len(planned)} package(s): {', '.join(sorted(planned))})" if planned else " (already installed)"))


def check_build(kernel: str, build: dict[str, Any], role: str) -> dict[str, Any]:
    """One trial build's outcome: ``build`` = {ok, headers, lines, make_log, module, version}."""
    name = f"build_{kernel}"
    what = f"{build['module']}/{build['version']}"
    if not build["headers"]:
        return check(name, False, f"the {role} kernel {kernel} has no headers (/lib/modules/{kernel}/build): DKMS cannot "
                     f"build {what} for it, so the host would come up on it without its GPU driver",
                     f"Install linux-headers-{kernel} (or remove that kernel), then run again. Nothing was changed.")
    if build["ok"]:
        return check(name, True, f"{what} builds for the {role} kernel {kernel}")
    lines = " / ".join(build["lines"]) or "no error line was printed"
    return check(name, False, f"{what} does not build for the {role} kernel {kernel}: {lines}",
                 f"Choose a driver release that supports {kernel} (DKMS's make.log: the last lines are in this result's "
                 "builds[].log). Nothing was changed: the trial build ran in a private DKMS tree, removed after.")


def check_versions(user_space: dict[str, str], module_versions: dict[str, str | None]) -> dict[str, Any]:
    """``user_space``: {package: version} the candidate installs; ``module_versions``: {kernel: the built module's
    modinfo version (None when it was not built)}."""
    wanted = {upstream(v) for v in user_space.values()}
    built = {k: v for k, v in module_versions.items() if v is not None}
    if len(wanted) != 1:
        return check("versions", False, "the candidate's packages carry different versions: " +
                     ", ".join(f"{p} {v}" for p, v in sorted(user_space.items())),
                     "Install the driver's packages at one version (the user space must match the kernel module).")
    want = wanted.pop()
    off = {k: v for k, v in built.items() if v != want}
    if off:
        return check("versions", False, f"the user space would be {want} but the module built for "
                     + ", ".join(f"{k} says {v}" for k, v in sorted(off.items())),
                     "The DKMS package and the user-space packages must be one release; CUDA and NVML refuse a "
                     "mismatch (Driver/library version mismatch).")
    return check("versions", True, f"user space and kernel module are both {want}" +
                 ("" if built else " (from the packages; no module was built to read)"))


def boot_space_needed(initrd_sizes: dict[str, int]) -> int:
    """Bytes /boot needs while the initramfs of the kernels in ``initrd_sizes`` is rebuilt one at a time (the new one
    is written beside the old): the largest x the kernel upgrade's factor, plus its slack."""
    return int(max(initrd_sizes.values(), default=0) * BOOT_SPACE_FACTOR) + BOOT_SPACE_SLACK


def check_boot_space(free: int, needed: int) -> dict[str, Any]:
    if free >= needed:
        return check("boot_space", True, f"{free // MIB} MiB free in /boot, {needed // MIB} MiB needed for a new initramfs")
    return check("boot_space", False, f"{free // MIB} MiB free in /boot but a rebuilt initramfs needs about "
                 f"{needed // MIB} MiB", "Remove kernels that are neither running nor pending (apt-get purge "
                 "linux-image-<old version>) and run again. Nothing was changed.")


def decide(checks: list[dict[str, Any]], what: str = "preflight", failed_means: str = "nothing was changed"
           ) -> tuple[bool, str]:
    """(ok, msg): every check passed, or the failed ones in words (``what`` failed, ``failed_means``)."""
    failed = [c for c in checks if not c["ok"]]
    if not failed:
        return True, f"{what} passed: " + "; ".join(c["reason"] for c in checks)
    return False, (f"{what} failed, {failed_means}: " +
                   "; ".join(f"{c['name']}: {c['reason']}. {c['fix']}" for c in failed))

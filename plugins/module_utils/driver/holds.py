# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which packages the driver lock holds, pure. The GPU driver's kernel-side packages (DRIVER_PREFIXES, DRIVER_SUFFIXES)
and the unattended-upgrades blacklist (render_uu_dropin) are the package kinds' shared ones (change/packages.py, the
kernel lock holds them too); the driver lock adds the user space, which must stay at the kernel
module's version (a libnvidia-compute or nvidia-utils upgrade alone breaks CUDA with a version mismatch)."""

from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils.change.packages import (
    DRIVER_PREFIXES, DRIVER_SUFFIXES, render_uu_dropin,
)

# The NVIDIA user space and its services, as Debian, Ubuntu and NVIDIA's CUDA repository name them.
USERSPACE_PREFIXES = ("libnvidia-", "nvidia-utils", "nvidia-compute-utils-", "nvidia-persistenced", "nvidia-fabricmanager",
                      "libcuda1", "nvidia-smi", "nvidia-kernel-common", "nvidia-kernel-support", "nvidia-modprobe",
                      "nvidia-alternative", "firmware-nvidia-gsp", "libnvidia-ml1", "nvidia-firmware-")
UU_DROPIN = "/etc/apt/apt.conf.d/51gpufleet-driver-lock"


def hold_packages(installed: list[str], extra: list[str] | None = None) -> list[str]:
    """The driver's installed packages (kernel side and user space), plus ``extra`` where installed."""
    have = set(installed)
    out = {p for p in extra or [] if p in have}
    for name in have:
        if name.startswith(DRIVER_PREFIXES + USERSPACE_PREFIXES) or name.endswith(DRIVER_SUFFIXES):
            out.add(name)
    return sorted(out)


def dropin(packages: list[str]) -> str:
    """The unattended-upgrades blacklist of the held driver packages (the kernel lock's own renderer)."""
    return render_uu_dropin(packages, owner="driver_upgrade", what="the GPU driver and its user space")

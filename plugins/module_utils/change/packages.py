# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the package-based change kinds (the kernel, the GPU driver) share about apt, pure: the GPU driver's kernel-side
package names (both locks hold them), the unattended-upgrades blacklist a lock writes, where the kernel lock writes
it (the driver lock warns about it), and the lines of a failed apt-get or DKMS run that say why."""

from __future__ import annotations

# GPU driver packages whose upgrade rebuilds or replaces the kernel module: the kernel lock holds them (a new kernel
# must not come with a driver that was not built for it), the driver lock holds them with the user space.
DRIVER_PREFIXES = ("nvidia-driver", "nvidia-kernel-", "nvidia-dkms-", "nvidia-open", "cuda-drivers",
                   "linux-modules-nvidia-", "linux-objects-nvidia-", "linux-signatures-nvidia-")
DRIVER_SUFFIXES = ("-dkms",)
# The kernel lock's unattended-upgrades blacklist (it names the driver's kernel-side packages too).
KERNEL_LOCK_DROPIN = "/etc/apt/apt.conf.d/51gpufleet-kernel-lock"
# Lines of a failed apt-get or DKMS run that say why (DKMS's build error and its log, dpkg's and apt's errors).
INSTALL_ERROR_MARKS = ("Error", "error", "E: ", "make.log", "exited with return code", "failed")


def render_uu_dropin(packages: list[str], owner: str = "kernel_upgrade", what: str = "the kernel and GPU driver") -> str:
    """An apt.conf drop-in that keeps unattended-upgrades off the held packages (its own blacklist:
    ``apt-mark hold`` alone is not what every unattended-upgrades version honours); ``owner`` is the role that
    manages it and ``what`` the packages in words, for the header."""
    lines = [f"// Managed by Ansible (gpufleet.inference.{owner}): {what} stay as",
             "// the last gated upgrade left them; unattended-upgrades must not touch them.",
             "Unattended-Upgrade::Package-Blacklist {"]
    lines += [f'    "^{p.replace(".", "[.]").replace("+", "[+]")}$";' for p in packages]
    lines.append("};")
    return "\n".join(lines) + "\n"


def error_lines(*texts: object) -> list[str]:
    """The lines of ``texts`` (a run's stderr, stdout, message, a build log) that say why it failed, stripped, each
    once, in order."""
    lines: list[str] = []
    for text in texts:
        for line in str(text or "").splitlines():
            line = line.strip()
            if line and any(mark in line for mark in INSTALL_ERROR_MARKS) and line not in lines:
                lines.append(line)
    return lines

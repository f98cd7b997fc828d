# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""driver_hold and driver_reload through their real main() on fake trees (test_driver_hold.yaml and test_driver_reload.yaml list every
command: dpkg-query, apt-mark, modprobe, systemctl, and the files left behind). The processes that hold the GPU are
real /proc/<pid>/fd symlinks in the tree, as the kernel shows them."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.gpufleet.inference.plugins.modules import driver_hold, driver_reload
from tests.unit.plugins.modules.uthelper import UTHelper

TOOLS = ("usr/bin/dpkg-query", "usr/bin/apt-mark", "usr/sbin/modprobe", "usr/bin/apt-get", "usr/bin/dkms")


def debian(root: Path, driver: str | None = "550.54.15", module: str = "nvidia") -> None:
    """A Debian host's tools, and the driver loaded at ``driver`` (None: not loaded)."""
    for rel in TOOLS:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    if driver:
        (root / f"sys/module/{module}").mkdir(parents=True, exist_ok=True)
        (root / "proc/driver/nvidia").mkdir(parents=True, exist_ok=True)
        (root / "proc/driver/nvidia/version").write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Tue Mar  5 19:29:34 UTC 2024\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")


def holder(root: Path, pid: int, comm: str, unit: str, devices=("/dev/nvidia0",)) -> None:
    """A process with the driver's device files open: /proc/PID/fd/N -> DEVICE, its comm and cgroup."""
    proc = root / f"proc/{pid}"
    (proc / "fd").mkdir(parents=True, exist_ok=True)
    (proc / "comm").write_text(comm + "\n")
    (proc / "cgroup").write_text(f"0::/system.slice/{unit}\n")
    (proc / "fd/0").symlink_to("/dev/null")
    for n, device in enumerate(devices, start=3):
        (proc / f"fd/{n}").symlink_to(device)


BUILDERS = {"debian": debian, "holder": holder}
HERE = Path(__file__).resolve().parent
test_driver_hold_case = UTHelper(driver_hold, str(HERE / "test_driver_hold.py"), builders=BUILDERS).test_function()
test_driver_reload_case = UTHelper(driver_reload, str(HERE / "test_driver_reload.py"), builders=BUILDERS).test_function()

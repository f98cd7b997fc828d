# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kernel_upgrade_preflight and kernel_boot_entry through their real main() on fake trees: the YAML
cases list every command (apt-get -s, apt-mark, update-grub, grub-set-default, grub-reboot,
grub-editenv) and the files left behind. grub.cfg is the real one captured in the lab VMs."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.grub import GRUBENV_HEADER, GRUBENV_SIZE
from ansible_collections.gpufleet.inference.plugins.modules import kernel_boot_entry, kernel_upgrade_preflight
from tests.unit.plugins.modules.uthelper import UTHelper

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "grub"


def grubenv(root: Path, **env) -> None:
    body = GRUBENV_HEADER + "\n" + "".join(f"{k}={v}\n" for k, v in env.items())
    path = root / "boot/grub/grubenv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body + "#" * (GRUBENV_SIZE - len(body)))


def grub_cfg(root: Path, name: str) -> None:
    path = root / "boot/grub/grub.cfg"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((FIXTURES / f"debian12-lab-{name}.cfg").read_text())


def debian_host(root: Path, kernels=("6.1.0-50-cloud-amd64",), running="6.1.0-50-cloud-amd64", grub_default="saved") -> None:
    """A Debian 12 host as the lab VMs have it: GRUB files, tools, /boot and /lib/modules of each kernel."""
    files = {
        "proc/sys/kernel/osrelease": running + "\n",
        "proc/mounts": "/dev/vda1 / ext4 rw,relatime 0 0\nproc /proc proc rw 0 0\n",
        "etc/default/grub": f"GRUB_DEFAULT={grub_default}\nGRUB_SAVEDEFAULT=false\nGRUB_TIMEOUT=1\n",
        "usr/sbin/update-grub": "", "usr/sbin/grub-set-default": "", "usr/sbin/grub-reboot": "",
        "usr/bin/grub-editenv": "", "usr/bin/apt-get": "", "usr/bin/apt-mark": "",
    }
    for version in kernels:
        files[f"boot/vmlinuz-{version}"] = "k" * 8192
        files[f"boot/initrd.img-{version}"] = "i" * 32768
        files[f"lib/modules/{version}/modules.dep"] = ""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "sys/module/virtio_net").mkdir(parents=True, exist_ok=True)


def nvidia(root: Path, version: str, loaded: bool = True) -> None:
    if loaded:
        (root / "sys/module/nvidia").mkdir(parents=True, exist_ok=True)
    if version:
        path = root / f"lib/modules/{version}/updates/dkms/nvidia.ko.xz"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


BUILDERS = {"grubenv": grubenv, "grub_cfg": grub_cfg, "debian_host": debian_host, "nvidia": nvidia}


def _pad_grubenv_writes(helper: UTHelper) -> UTHelper:
    """The YAML lists grubenv contents without the '#' padding of a real 1024-byte environment block."""
    for case in helper.cases:
        for cmd in case.get("run_command") or []:
            writes = cmd.get("writes") or {}
            if "/boot/grub/grubenv" in writes:
                text = writes["/boot/grub/grubenv"]
                writes["/boot/grub/grubenv"] = text + "#" * (GRUBENV_SIZE - len(text.encode()))
    return helper


HERE = Path(__file__).resolve().parent
test_preflight_case = _pad_grubenv_writes(UTHelper(kernel_upgrade_preflight, str(HERE / "test_kernel_upgrade_preflight.py"),
                                                   builders=BUILDERS)).test_function()
test_boot_entry_case = _pad_grubenv_writes(UTHelper(kernel_boot_entry, str(HERE / "test_kernel_boot_entry.py"),
                                                    builders=BUILDERS)).test_function()

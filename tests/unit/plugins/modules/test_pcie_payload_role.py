# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pcie_link and reboot roles run by ansible-playbook on the controller against a fake host tree.

Every module of the roles gets ``root`` through module_defaults, so nothing touches this machine's
kernel: the real setpci writes the fake config space, the real systemctl enables the unit under
--root. Two stand-ins on PATH keep the rest inside the tree: ``chroot`` runs the tree's
``update-grub`` (a shell script that sources /etc/default/grub and grub.d/*.cfg as grub-mkconfig
does and writes grub.cfg), and ``systemctl is-enabled`` answers from the tree's wants/ link.
Proves the roles' wiring: converge, idempotence (changed=0), check mode, verify, the reboot
contract's pending report, and state=absent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.fakesysfs import payload_switch

REPO = Path(__file__).resolve().parents[4]
PLAYBOOK = """\
- name: Tune the PCIe links of a fake host
  hosts: localhost
  connection: local
  gather_facts: false
  module_defaults:
    gpufleet.inference.kernel_cmdline: {root: "%(root)s"}
    gpufleet.inference.kernel_cmdline_info: {root: "%(root)s"}
    gpufleet.inference.pcie_aspm: {root: "%(root)s"}
    gpufleet.inference.pcie_payload: {root: "%(root)s"}
    gpufleet.inference.pcie_acs: {root: "%(root)s"}
    gpufleet.inference.pcie_facts: {root: "%(root)s"}
  roles:
    - role: gpufleet.inference.pcie_link
    - role: gpufleet.inference.reboot
"""
UPDATE_GRUB = """#!/bin/sh
# stand-in for update-grub inside the fake tree: $GPUFLEET_FAKE_ROOT is the tree
set -e
r="$GPUFLEET_FAKE_ROOT"
. "$r/etc/default/grub"
for x in "$r"/etc/default/grub.d/*.cfg; do if [ -e "$x" ]; then . "$x"; fi; done
mkdir -p "$r/boot/grub"
printf "menuentry 'Debian GNU/Linux' {\\n\\tlinux /boot/vmlinuz ro %s %s\\n}\\n" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT" > "$r/boot/grub/grub.cfg"
echo "Generating grub configuration file ... done"
"""
FAKE_CHROOT = """#!/bin/sh
root="$1"; shift
prog="$1"; shift
GPUFLEET_FAKE_ROOT="$root" exec /bin/sh "$root$prog" "$@"
"""
FAKE_SYSTEMCTL = """#!/bin/sh
if [ "$1" = is-enabled ]; then
  if [ -L "$GPUFLEET_FAKE_ROOT/etc/systemd/system/sysinit.target.wants/$2" ]; then echo enabled; exit 0; fi
  echo disabled; exit 1
fi
exec %(real)s "$@"
"""

needs_tools = pytest.mark.skipif(not all(shutil.which(t) for t in ("setpci", "systemctl", "ansible-playbook")),
                                 reason="needs setpci, systemctl and ansible-playbook")


@pytest.fixture
def host(tmp_path):
    root = tmp_path / "host"
    payload_switch(root, cmdline="BOOT_IMAGE=/boot/vmlinuz ro quiet")
    files = {"etc/default/grub": 'GRUB_DEFAULT=saved\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n',
             "usr/sbin/update-grub": UPDATE_GRUB}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "chroot").write_text(FAKE_CHROOT)
    (bin_dir / "systemctl").write_text(FAKE_SYSTEMCTL % {"real": shutil.which("systemctl")})
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (tmp_path / "site.yml").write_text(PLAYBOOK % {"root": root})
    return root


def play(host: Path, *extra: str) -> tuple[str, dict]:
    env = dict(os.environ, PATH=f"{host.parent / 'bin'}:{os.environ['PATH']}", GPUFLEET_FAKE_ROOT=str(host),
               ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(REPO / ".collections"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run(["ansible-playbook", "-i", "localhost,", str(host.parent / "site.yml"), *extra], cwd=str(REPO),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=600, check=False)
    recap = re.search(r"localhost\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout)
    assert recap, proc.stdout[-4000:]
    return proc.stdout, dict(zip(("ok", "changed", "unreachable", "failed"), map(int, recap.groups())))


def payload(host: Path, bdf: str) -> tuple[int, int]:
    cfg = (host / f"sys/bus/pci/devices/{bdf}/config").read_bytes()
    devctl = cfg[0x68] | cfg[0x69] << 8
    return 128 << (devctl >> 5 & 7), 128 << (devctl >> 12 & 7)


@needs_tools
def test_role_converges_is_idempotent_and_reverts(host):
    firmware = {b: (host / f"sys/bus/pci/devices/{b}/config").read_bytes()
                for b in os.listdir(host / "sys/bus/pci/devices")}

    out, recap = play(host, "--check", "--diff")
    assert recap["failed"] == 0 and recap["changed"] > 0, out[-4000:]
    assert {b: (host / f"sys/bus/pci/devices/{b}/config").read_bytes() for b in firmware} == firmware
    assert not (host / "etc/default/grub.d/99-gpufleet.cfg").exists()

    out, recap = play(host)
    assert recap["failed"] == 0 and recap["changed"] >= 3, out[-4000:]
    assert payload(host, "0000:00:01.0") == (256, 512) and payload(host, "0000:03:00.0") == (256, 4096)
    assert "pcie_aspm.policy=performance" in (host / "boot/grub/grub.cfg").read_text()
    assert (host / "sys/module/pcie_aspm/parameters/policy").read_text().strip() == "performance"
    assert (host / "etc/systemd/system/sysinit.target.wants/gpufleet-pcie-payload.service").is_symlink()
    assert "6 device(s) hold the payload sizes set" in out
    assert "A reboot is pending for pcie_link, but pcie_link does not allow it" in out
    assert "The kernel arguments of pcie_link wait for a reboot" in out

    out, recap = play(host)
    assert (recap["failed"], recap["changed"]) == (0, 0), out[-4000:]

    # After the reboot the kernel has the argument: nothing pending any more.
    (host / "proc/cmdline").write_text("BOOT_IMAGE=/boot/vmlinuz ro quiet pcie_aspm.policy=performance\n")
    out, recap = play(host)
    assert (recap["failed"], recap["changed"]) == (0, 0), out[-4000:]
    assert "The kernel arguments of pcie_link are live." in out and "reboot is pending" not in out

    out, recap = play(host, "-e", "pcie_link_state=absent")
    assert recap["failed"] == 0 and recap["changed"] >= 3, out[-4000:]
    assert {b: (host / f"sys/bus/pci/devices/{b}/config").read_bytes() for b in firmware} == firmware
    assert not (host / "etc/default/grub.d/99-gpufleet.cfg").exists()
    assert not (host / "etc/systemd/system/gpufleet-pcie-payload.service").exists()
    assert (host / "sys/module/pcie_aspm/parameters/policy").read_text().strip() == "default"


@needs_tools
def test_role_on_a_readonly_device_fails_cleanly(host):
    """What the lab's QEMU devices do: setpci succeeds, the field keeps its value."""
    bin_dir = host.parent / "bin"
    (bin_dir / "setpci").write_text("#!/bin/sh\nexit 0\n")  # takes every write, changes nothing
    (bin_dir / "setpci").chmod(0o755)
    out, recap = play(host, "-e", "pcie_link_aspm_policy=''")
    assert recap["failed"] == 1, out[-4000:]
    assert "did not take MaxPayload 256" in out and "QEMU does" in out
    assert payload(host, "0000:00:01.0") == (128, 512)
    assert not (host / "var/lib/gpufleet/pcie_payload/originals.json").exists()


def acsctl(host: Path, bdf: str) -> int:
    cfg = (host / f"sys/bus/pci/devices/{bdf}/config").read_bytes()
    return cfg[0x14E] | cfg[0x14F] << 8


@needs_tools
def test_role_clears_acs_between_the_group_persists_it_and_puts_it_on_the_command_line(host):
    acs = ("-e", "pcie_link_acs=true", "-e", "pcie_link_aspm_policy=''", "-e", "pcie_link_mrrs=0")
    (host / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (host / "proc/sys/kernel/osrelease").write_text("6.1.0-56-amd64\n")
    before = {b: acsctl(host, b) for b in ("0000:00:01.0", "0000:02:00.0", "0000:02:01.0")}
    out, recap = play(host, *acs)
    assert recap["failed"] == 0 and recap["changed"] > 0, out[-4000:]
    # exactly the two switch ports between the GPUs; the root port above keeps its redirect
    assert (acsctl(host, "0000:02:00.0"), acsctl(host, "0000:02:01.0"), acsctl(host, "0000:00:01.0")) == (
        before["0000:02:00.0"] & ~0x2C, before["0000:02:01.0"] & ~0x2C, before["0000:00:01.0"])
    assert "pci=disable_acs_redir=0000:02:00.0\\;0000:02:01.0" in (host / "etc/default/grub.d/99-gpufleet.cfg").read_text()
    assert "ACS Control read back: 0000:02:00.0, 0000:02:01.0 clear of ReqRedir/CmpltRedir/EgressCtrl" in out
    assert "A reboot is pending for pcie_link" in out
    out, recap = play(host, *acs)
    assert (recap["failed"], recap["changed"]) == (0, 0), out[-4000:]
    # the reboot: the kernel got the argument (GRUB unescapes '\;'), firmware ACS again; the boot unit clears it
    (host / "proc/cmdline").write_text("BOOT_IMAGE=/boot/vmlinuz ro quiet pcie_aspm.policy=performance "
                                       "pci=disable_acs_redir=0000:02:00.0;0000:02:01.0\n")
    out, recap = play(host, *acs)
    assert (recap["failed"], recap["changed"]) == (0, 0) and "reboot is pending" not in out, out[-4000:]
    # turned off: the originals come back, byte for byte, and the argument goes
    out, recap = play(host, "-e", "pcie_link_acs=false", "-e", "pcie_link_aspm_policy=''", "-e", "pcie_link_mrrs=0")
    assert recap["failed"] == 0, out[-4000:]
    assert {b: acsctl(host, b) for b in before} == before
    assert not (host / "etc/default/grub.d/99-gpufleet.cfg").exists()  # no owner has arguments left
    assert "disable_acs_redir" not in (host / "boot/grub/grub.cfg").read_text()

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pcie_acs end to end with the real setpci and systemctl on fake trees: the exact bridges cleared
byte by byte, the shared boot unit re-applying it after a simulated reboot (next to pcie_payload's
entries), state=default restoring the original config space byte for byte, and the refusals
(vfio host, a path in use) with their ways out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import boot as pcie_boot
from ansible_collections.gpufleet.inference.plugins.modules import pcie_acs, pcie_payload
from tests.unit.fakesysfs import hold, nvidia_proc, payload_switch, two_gpus_one_switch
from tests.unit.plugins.module_utils.test_pcie_acs import two_root_ports
from tests.unit.plugins.modules.test_pcie_payload import restore, snapshot, unit_command
from tests.unit.plugins.modules.uthelper import needs_tools, target_side

SETPCI = shutil.which("setpci")
SYSTEMCTL = shutil.which("systemctl")
pytestmark = needs_tools("setpci", "systemctl")
GROUP = ["0000:03:00.0", "0000:04:00.0"]


@pytest.fixture(autouse=True)
def _target_side(monkeypatch):
    target_side(monkeypatch)


def run_acs(args, capsys):
    with patch_module_args(args), pytest.raises(SystemExit):
        pcie_acs.main()
    return json.loads(capsys.readouterr().out)


def run_payload(args, capsys):
    with patch_module_args(args), pytest.raises(SystemExit):
        pcie_payload.main()
    return json.loads(capsys.readouterr().out)


def changed_bytes(before, after):
    return {b: [(i, before[b][i], after[b][i]) for i in range(len(before[b])) if before[b][i] != after[b][i]]
            for b in before if before[b] != after[b]}


def test_switch_cycle_clear_persist_reboot_restore(tmp_path, capsys):
    root = tmp_path / "host"
    two_gpus_one_switch(root)
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text("6.8.0-45-generic\n")
    firmware = snapshot(root)

    check = run_acs({"root": str(root), "_ansible_check_mode": True}, capsys)
    assert check["changed"] is True and snapshot(root) == firmware and not (root / "var/lib/gpufleet").exists()

    first = run_acs({"root": str(root)}, capsys)
    assert first["changed"] is True, first
    assert sorted(first["bridges"]) == ["0000:02:00.0", "0000:02:01.0"]
    assert first["bridges"]["0000:02:00.0"] == {"ctrl_before": 0x1D, "ctrl_after": 0x11, "cleared": ["RR", "CR"], "pairs": [GROUP]}
    assert first["kernel_args"] == ["pci=disable_acs_redir=0000:02:00.0;0000:02:01.0"]
    assert [a["action"] for a in first["actions"]][:3] == ["record_originals", "set_acs", "set_acs"]
    cleared = snapshot(root)
    # ACSCtl of the two downstream ports only (ACS at 0x148, control at +6); the root port keeps its redirect
    assert changed_bytes(firmware, cleared) == {"0000:02:00.0": [(0x14E, 0x1D, 0x11)], "0000:02:01.0": [(0x14E, 0x1D, 0x11)]}
    persisted = json.loads((root / "etc/gpufleet/pcie_payload.json").read_text())
    assert persisted["devices"] == [] and [e["bdf"] for e in persisted["acs"]] == ["0000:02:00.0", "0000:02:01.0"]
    assert all(e["clear"] == 0x0C for e in persisted["acs"])
    assert (root / pcie_boot.UNIT_WANTS.lstrip("/")).is_symlink()

    again = run_acs({"root": str(root)}, capsys)
    assert (again["changed"], again["actions"]) == (False, []), again
    assert again["bridges"]["0000:02:00.0"]["ctrl_after"] == 0x11  # still managed and reported once cleared

    # a reboot: the kernel sets the redirect again; the unit's own command clears it before the drivers load
    restore(root, firmware)
    proc = subprocess.run(unit_command(root), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 0, proc.stdout
    assert "0000:02:00.0: ACS Control 0x001d -> 0x0011" in proc.stdout
    assert "ACS on 2 bridge(s), 0 failed" in proc.stdout
    assert snapshot(root) == cleared

    back = run_acs({"root": str(root), "state": "default"}, capsys)
    assert back["changed"] is True, back
    assert snapshot(root) == firmware
    for path in (pcie_boot.PERSIST_CONFIG, pcie_boot.UNIT_PATH, pcie_boot.UNIT_WANTS, "/var/lib/gpufleet/pcie_acs/originals.json"):
        assert not (root / path.lstrip("/")).exists(), path
    assert run_acs({"root": str(root), "state": "default"}, capsys)["changed"] is False


def test_acs_and_payload_share_one_boot_file_and_keep_each_other(tmp_path, capsys):
    root = tmp_path / "host"
    payload_switch(root)
    firmware = snapshot(root)
    assert run_payload({"root": str(root), "mps": "max_safe", "mrrs": 4096}, capsys)["changed"] is True
    assert run_acs({"root": str(root)}, capsys)["changed"] is True
    both = json.loads((root / "etc/gpufleet/pcie_payload.json").read_text())
    assert len(both["devices"]) == 6 and [e["bdf"] for e in both["acs"]] == ["0000:02:00.0", "0000:02:01.0"]
    # payload run again: keeps the ACS list
    assert run_payload({"root": str(root), "mps": "max_safe", "mrrs": 4096}, capsys)["changed"] is False
    tuned = snapshot(root)
    restore(root, firmware)
    proc = subprocess.run(unit_command(root), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 0 and "6 device(s), 0 failed" in proc.stdout and "ACS on 2 bridge(s)" in proc.stdout, proc.stdout
    assert snapshot(root) == tuned
    # payload restored: the unit stays for ACS
    assert run_payload({"root": str(root), "state": "default"}, capsys)["changed"] is True
    left = json.loads((root / "etc/gpufleet/pcie_payload.json").read_text())
    assert left["devices"] == [] and len(left["acs"]) == 2
    assert (root / pcie_boot.UNIT_WANTS.lstrip("/")).is_symlink()
    assert run_acs({"root": str(root), "state": "default"}, capsys)["changed"] is True
    assert snapshot(root) == firmware and not (root / "etc/gpufleet/pcie_payload.json").exists()


def test_phb_pair_clears_both_root_ports_with_egress_control(tmp_path, capsys):
    root = tmp_path / "host"
    two_root_ports(root)
    firmware = snapshot(root)
    out = run_acs({"root": str(root), "persist": False}, capsys)
    assert sorted(out["bridges"]) == ["0000:00:01.0", "0000:00:02.0"], out
    assert out["bridges"]["0000:00:01.0"]["cleared"] == ["RR", "CR", "EC"]
    assert changed_bytes(firmware, snapshot(root)) == {"0000:00:01.0": [(0x14E, 0x3D, 0x11)], "0000:00:02.0": [(0x14E, 0x3D, 0x11)]}
    assert not (root / "etc/gpufleet/pcie_payload.json").exists()


def test_refused_on_a_vfio_host_unless_forced(tmp_path, capsys):
    root = tmp_path / "host"
    host = two_gpus_one_switch(root)
    host.write("/etc/modprobe.d/gpufleet-vfio.conf", "options vfio-pci ids=10de:2330")
    firmware = snapshot(root)
    out = run_acs({"root": str(root)}, capsys)
    assert out.get("failed") is True and out["changed"] is False
    assert "passes devices to VMs" in out["msg"] and "gpufleet-vfio.conf" in out["msg"] and "force_on_vfio_host" in out["msg"]
    assert snapshot(root) == firmware
    forced = run_acs({"root": str(root), "force_on_vfio_host": True, "persist": False}, capsys)
    assert forced["changed"] is True and forced["vfio_reasons"]


def test_refused_while_a_gpu_below_is_held_defer_to_boot_instead(tmp_path, capsys):
    root = tmp_path / "host"
    host = two_gpus_one_switch(root)
    nvidia_proc(host, "0000:03:00.0", 0)
    nvidia_proc(host, "0000:04:00.0", 1)
    hold(host, 31337, "vllm", "/dev/nvidia0")
    firmware = snapshot(root)
    out = run_acs({"root": str(root)}, capsys)
    assert out.get("failed") is True and "process 31337 (vllm) holds /dev/nvidia0 of 0000:03:00.0" in out["msg"]
    assert snapshot(root) == firmware and not (root / "var/lib/gpufleet/pcie_acs").exists()
    deferred = run_acs({"root": str(root), "defer_to_boot": True}, capsys)
    assert deferred["changed"] is True and deferred["reboot_required"] is True
    assert [a["action"] for a in deferred["actions"]].count("set_at_boot") == 2
    assert snapshot(root) == firmware
    proc = subprocess.run(unit_command(root), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 0 and "0000:02:01.0: ACS Control 0x001d -> 0x0011" in proc.stdout, proc.stdout
    # state=default is refused too while held
    back = run_acs({"root": str(root), "state": "default"}, capsys)
    assert back.get("failed") is True and "Refusing to restore ACS Control" in back["msg"]
    for fd in (root / "proc/31337/fd").iterdir():
        fd.unlink()
    assert run_acs({"root": str(root), "state": "default"}, capsys)["changed"] is True
    assert snapshot(root) == firmware


def test_readonly_bit_fails_rolled_back_and_the_record_is_not_left_claiming_a_change(tmp_path, capsys):
    root = tmp_path / "host"
    two_gpus_one_switch(root)
    firmware = snapshot(root)
    wrapper = tmp_path / "setpci-ro"
    cfg = root / "sys/bus/pci/devices/0000:02:01.0/config"
    wrapper.write_text(f"#!/bin/sh\n{SETPCI} \"$@\" || exit $?\ncase \"$*\" in *0000:02:01.0*) cp {tmp_path}/ro.bin {cfg};; esac\n")
    (tmp_path / "ro.bin").write_bytes(cfg.read_bytes())
    wrapper.chmod(0o755)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "setpci").symlink_to(wrapper)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{bindir}:{old}"
    try:
        out = run_acs({"root": str(root)}, capsys)
    finally:
        os.environ["PATH"] = old
    assert out.get("failed") is True and "still reads 0x001d" in out["msg"] and "Rolled back: 0000:02:00.0" in out["msg"], out
    assert snapshot(root) == firmware
    assert not Path(root / "var/lib/gpufleet/pcie_acs/originals.json").exists()


def test_a_single_gpu_is_refused(tmp_path, capsys):
    root = tmp_path / "host"
    two_gpus_one_switch(root)
    out = run_acs({"root": str(root), "devices": ["03:00.0"]}, capsys)
    assert out.get("failed") is True and "two or more" in out["msg"]


def test_boot_unit_clears_the_bridges_that_take_it_and_reports_the_one_that_does_not(tmp_path, capsys):
    root = tmp_path / "host"
    two_gpus_one_switch(root)
    firmware = snapshot(root)
    assert run_acs({"root": str(root)}, capsys)["changed"] is True
    cleared = snapshot(root)
    restore(root, firmware)
    wrapper = tmp_path / "setpci-ro"
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" 0000:02:01.0 "*) exit 0;; esac\nexec {SETPCI} "$@"\n')
    wrapper.chmod(0o755)
    argv = unit_command(root)
    proc = subprocess.run(argv[:2] + ["--setpci", str(wrapper)] + argv[2:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)
    assert proc.returncode == 1, proc.stdout
    assert "error: 0000:02:01.0 ACS ACS Control still reads 0x001d after setpci (read-only bits?)" in proc.stdout
    assert "0000:02:00.0: ACS Control 0x001d -> 0x0011" in proc.stdout and "ACS on 2 bridge(s), 1 failed" in proc.stdout
    after = snapshot(root)
    assert after["0000:02:00.0"] == cleared["0000:02:00.0"] and after["0000:02:01.0"] == firmware["0000:02:01.0"]

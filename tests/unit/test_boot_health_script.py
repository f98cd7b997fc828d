# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""roles/kernel_upgrade/files/gpufleet-boot-health.py: every rule of assess(), and main() on a fake
host tree (GPUFLEET_BOOT_HEALTH_ROOT: it writes its result there and does not reboot)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.helpers import REPO

SCRIPT = Path(REPO) / "roles" / "kernel_upgrade" / "files" / "gpufleet-boot-health.py"
spec = importlib.util.spec_from_file_location("gpufleet_boot_health", SCRIPT)
bh = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bh)

NEW = "6.1.0-56-cloud-amd64"
OLD = "6.1.0-50-cloud-amd64"
OLD_ENTRY = f"gnulinux-advanced-e5dd>gnulinux-{OLD}-advanced-e5dd"
NEW_ENTRY = f"gnulinux-advanced-e5dd>gnulinux-{NEW}-advanced-e5dd"
CFG = {"target": NEW, "old": OLD, "commit_timeout": 900, "driver_modules": ["nvidia"], "gpu_required": True,
       "vllm_unit": "vllm.service", "vllm_grace": 600}
NOW = 1_796_000_000.0


def state(**kw):
    base = {"running": NEW, "uptime": 120.0, "now": NOW, "saved_entry": OLD_ENTRY,
            "journal": {"commit_deadline": NOW + 600}, "loaded": ["nvidia"], "nvidia_smi_rc": 0,
            "vllm_state": "active"}
    base.update(kw)
    return base


@pytest.mark.parametrize("kw,action,text", [
    ({}, "wait", "healthy, uncommitted"),
    ({"running": OLD}, "none", "not the candidate"),
    ({"saved_entry": NEW_ENTRY}, "committed", "committed"),
    ({"saved_entry": NEW_ENTRY, "loaded": []}, "committed", "committed"),
    ({"journal": {"commit_deadline": NOW - 5}, "uptime": 1000.0}, "revert", "not committed by the controller within 900 s"),
    # a stale deadline from before this boot never cuts a fresh boot short: boot + timeout counts
    ({"journal": {"commit_deadline": NOW - 5}, "uptime": 100.0}, "wait", "healthy"),
    ({"journal": None, "uptime": 901.0}, "revert", "deadline passed 1 s ago"),
    ({"loaded": []}, "revert", "GPU driver module nvidia is not loaded under 6.1.0-56-cloud-amd64"),
    ({"nvidia_smi_rc": 9}, "revert", "nvidia-smi exited 9"),
    ({"nvidia_smi_rc": None}, "wait", "healthy"),
    ({"vllm_state": "failed"}, "revert", "vllm.service failed"),
    ({"vllm_state": "activating", "uptime": 300.0}, "wait", "healthy"),
    ({"vllm_state": "activating", "uptime": 700.0}, "revert", "vllm.service is activating, not active, 700 s after boot"),
])
def test_assess(kw, action, text):
    verdict = bh.assess(state(**kw), CFG)
    assert verdict["action"] == action, verdict
    assert text in "; ".join(verdict["reasons"])


def test_no_gpu_no_driver_check():
    cfg = dict(CFG, gpu_required=False)
    assert bh.assess(state(loaded=[], nvidia_smi_rc=None), cfg)["action"] == "wait"


@pytest.mark.parametrize("entry,version,boots", [
    (NEW_ENTRY, NEW, True), (OLD_ENTRY, NEW, False), (None, NEW, False), ("", NEW, False),
    ("Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux 6.1.0-56-cloud-amd64", NEW, True),
    (f"gnulinux-advanced-e5dd>gnulinux-{NEW}-recovery-e5dd", "6.1.0-5", False),
])
def test_entry_boots(entry, version, boots):
    assert bh.entry_boots(entry, version) is boots


def write(root: Path, path: str, text: str) -> None:
    real = root / path.lstrip("/")
    real.parent.mkdir(parents=True, exist_ok=True)
    real.write_text(text)


def test_main_on_a_fake_host_records_why_it_reverts(tmp_path, monkeypatch, capsys):
    cfg = dict(CFG, vllm_unit="", gpu_required=True, nvidia_smi="/nonexistent/nvidia-smi")
    write(tmp_path, "/etc/gpufleet/boot-health.json", json.dumps(cfg))
    write(tmp_path, "/proc/sys/kernel/osrelease", NEW + "\n")
    write(tmp_path, "/proc/sys/kernel/random/boot_id", "boot-b\n")
    write(tmp_path, "/proc/uptime", "2000.5 100.0\n")
    write(tmp_path, "/boot/grub/grubenv", f"# GRUB Environment Block\nsaved_entry={OLD_ENTRY}\n")
    write(tmp_path, "/var/lib/gpufleet/kernel_upgrade/journal.json", json.dumps({"commit_deadline": 1.0}))
    monkeypatch.setenv("GPUFLEET_BOOT_HEALTH_ROOT", str(tmp_path))
    assert bh.main(["gpufleet-boot-health", "/etc/gpufleet/boot-health.json"]) == 0
    out = capsys.readouterr().out
    assert "revert" in out
    result = json.loads((tmp_path / "var/lib/gpufleet/kernel_upgrade/boot-health.json").read_text())
    assert result["action"] == "revert" and result["target"] == NEW and result["boot_id"] == "boot-b"
    assert any("not committed" in r for r in result["reasons"])
    assert any("nvidia is not loaded" in r for r in result["reasons"])


def test_main_under_the_old_kernel_does_nothing(tmp_path, monkeypatch):
    write(tmp_path, "/etc/gpufleet/boot-health.json", json.dumps(dict(CFG, vllm_unit="", gpu_required=False)))
    write(tmp_path, "/proc/sys/kernel/osrelease", OLD + "\n")
    write(tmp_path, "/proc/uptime", "99999.0 1.0\n")
    monkeypatch.setenv("GPUFLEET_BOOT_HEALTH_ROOT", str(tmp_path))
    assert bh.main(["x", "/etc/gpufleet/boot-health.json"]) == 0
    assert not (tmp_path / "var/lib/gpufleet/kernel_upgrade/boot-health.json").exists()


def test_main_without_config_does_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_BOOT_HEALTH_ROOT", str(tmp_path))
    assert bh.main(["x", "/etc/gpufleet/boot-health.json"]) == 1

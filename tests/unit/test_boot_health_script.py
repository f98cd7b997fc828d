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
    base = {"running": NEW, "uptime": 120.0, "now": NOW, "boot_id": "boot-b", "saved_entry": OLD_ENTRY,
            "journal": {"deadline": {"boot_id": "boot-b", "uptime": 1100.0}}, "loaded": ["nvidia"], "nvidia_smi_rc": 0,
            "vllm_state": "active"}
    base.update(kw)
    return base


@pytest.mark.parametrize("kw,action,text", [
    ({}, "wait", "healthy, uncommitted"),
    ({"running": OLD}, "none", "not the candidate"),
    ({"saved_entry": NEW_ENTRY}, "committed", "committed"),
    ({"saved_entry": NEW_ENTRY, "loaded": []}, "committed", "committed"),
    ({"uptime": 1101.0}, "revert", "not committed by the controller within 1100 s after boot"),
    ({"uptime": 1100.0}, "wait", "reverting 1100 s after boot (the controller's last contact"),
    # a record from another boot (the arming on the old kernel) says nothing of this boot's clock:
    # commit_timeout after this boot counts
    ({"journal": {"deadline": {"boot_id": "boot-a", "uptime": 99999.0}}, "uptime": 901.0}, "revert",
     "deadline passed 1 s ago"),
    ({"journal": {"deadline": {"boot_id": "boot-a", "uptime": 5.0}}, "uptime": 899.0}, "wait",
     "900 s after this boot (the journal's record is from boot boot-a)"),
    # a deadline of this boot earlier than boot + timeout never cuts a fresh boot short
    ({"journal": {"deadline": {"boot_id": "boot-b", "uptime": 10.0}}, "uptime": 100.0}, "wait", "healthy"),
    # the wall clock is never read: a clock 30 days ahead (or behind) changes nothing
    ({"now": NOW + 30 * 86400}, "wait", "healthy"),
    ({"now": NOW + 30 * 86400, "uptime": 1200.0}, "revert", "deadline passed 100 s ago"),
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


# The safety net fails closed: a deadline it cannot read reverts as a passed one does (defect of issue 31:
# a commit_deadline that was not a finite number crashed every timer run, and the candidate stayed).
@pytest.mark.parametrize("journal,cfg,text", [
    (None, {}, "the upgrade journal is missing"),
    ({}, {}, "holds no deadline record"),
    ({"commit_deadline": NOW + 600}, {}, "holds no deadline record"),  # an older release's wall-clock deadline
    ({"deadline": "soon"}, {}, "holds no deadline record"),
    ({"deadline": {"boot_id": "boot-b", "uptime": float("nan")}}, {}, "is not a boot id with seconds"),
    ({"deadline": {"boot_id": "boot-b", "uptime": float("inf")}}, {}, "is not a boot id with seconds"),
    ({"deadline": {"boot_id": "boot-b", "uptime": "1100"}}, {}, "is not a boot id with seconds"),
    ({"deadline": {"boot_id": "boot-b", "uptime": True}}, {}, "is not a boot id with seconds"),
    ({"deadline": {"boot_id": None, "uptime": 1100.0}}, {}, "is not a boot id with seconds"),
    ({"deadline": {"boot_id": "boot-b", "uptime": 1e9}}, {}, "more than 86400 s ahead"),
    ({"deadline": {"boot_id": "boot-b", "uptime": 1100.0}}, {"commit_timeout": 1e9}, "not 120 to 86400 s"),
    ({"deadline": {"boot_id": "boot-b", "uptime": 1100.0}}, {"commit_timeout": float("nan")}, "not 120 to 86400 s"),
    ({"deadline": {"boot_id": "boot-b", "uptime": 1100.0}}, {"commit_timeout": "900"}, "not 120 to 86400 s"),
])
def test_a_deadline_that_cannot_be_read_reverts_after_the_health_checks(journal, cfg, text):
    verdict = bh.assess(state(journal=journal, loaded=[]), dict(CFG, **cfg))
    assert verdict["action"] == "revert", verdict
    assert any(text in r and "failing closed" in r for r in verdict["reasons"]), verdict
    assert any("nvidia is not loaded" in r for r in verdict["reasons"]), "the health checks still ran"


def test_unreadable_uptime_fails_closed():
    verdict = bh.assess(state(uptime=None), CFG)
    assert verdict["action"] == "revert" and "/proc/uptime cannot be read" in verdict["reasons"][0]


def test_the_scripts_commit_timeout_range_is_the_flows():
    from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.flow import COMMIT_TIMEOUT_S
    assert bh.COMMIT_TIMEOUT_S == COMMIT_TIMEOUT_S


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
    write(tmp_path, "/var/lib/gpufleet/kernel_upgrade/journal.json",
          json.dumps({"commit_deadline": 1.0, "deadline": {"boot_id": "boot-b", "uptime": 1500.0}}))
    monkeypatch.setenv("GPUFLEET_BOOT_HEALTH_ROOT", str(tmp_path))
    assert bh.main(["gpufleet-boot-health", "/etc/gpufleet/boot-health.json"]) == 0
    out = capsys.readouterr().out
    assert "revert" in out
    result = json.loads((tmp_path / "var/lib/gpufleet/kernel_upgrade/boot-health.json").read_text())
    assert result["action"] == "revert" and result["target"] == NEW and result["boot_id"] == "boot-b"
    assert result["uptime"] == 2000.5
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


@pytest.mark.parametrize("journal_text", ['{"commit_deadline": NaN}', '{"commit_deadline": Infinity}',
                                          '{"commit_deadline": "tomorrow"}', '{"deadline": {"boot_id": "boot-b", "uptime": NaN}}',
                                          "[1, 2]", "{not json", ""])
def test_main_reverts_on_a_deadline_it_cannot_read(tmp_path, monkeypatch, journal_text):
    """39940dd: float(NaN) deadline never passed, 'tomorrow' raised ValueError in every timer run."""
    write(tmp_path, "/etc/gpufleet/boot-health.json", json.dumps(dict(CFG, vllm_unit="", gpu_required=False)))
    write(tmp_path, "/proc/sys/kernel/osrelease", NEW + "\n")
    write(tmp_path, "/proc/sys/kernel/random/boot_id", "boot-b\n")
    write(tmp_path, "/proc/uptime", "200.0 100.0\n")
    write(tmp_path, "/boot/grub/grubenv", f"# GRUB Environment Block\nsaved_entry={OLD_ENTRY}\n")
    write(tmp_path, "/var/lib/gpufleet/kernel_upgrade/journal.json", journal_text)
    monkeypatch.setenv("GPUFLEET_BOOT_HEALTH_ROOT", str(tmp_path))
    assert bh.main(["x", "/etc/gpufleet/boot-health.json"]) == 0
    result = json.loads((tmp_path / "var/lib/gpufleet/kernel_upgrade/boot-health.json").read_text())
    assert result["action"] == "revert" and "failing closed" in result["reasons"][0]


def test_main_with_a_config_that_is_not_an_object_does_nothing(tmp_path, monkeypatch, capsys):
    write(tmp_path, "/etc/gpufleet/boot-health.json", "[]")
    monkeypatch.setenv("GPUFLEET_BOOT_HEALTH_ROOT", str(tmp_path))
    assert bh.main(["x", "/etc/gpufleet/boot-health.json"]) == 1
    assert "not a JSON object with a target" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [{"driver_modules": "nvidia"}, {"driver_modules": [1]}, {"journal": 5}, {"vllm_unit": []},
                                 {"grubenv": {}}])
def test_main_fails_closed_on_a_configuration_it_cannot_use(tmp_path, monkeypatch, bad):
    """A field of the wrong type crashed gather() in every timer run on 39940dd: the candidate was never reverted."""
    write(tmp_path, "/etc/gpufleet/boot-health.json", json.dumps({**CFG, "vllm_unit": "", **bad}))
    write(tmp_path, "/proc/sys/kernel/osrelease", NEW + "\n")
    write(tmp_path, "/proc/uptime", "200.0 100.0\n")
    write(tmp_path, "/boot/grub/grubenv", f"# GRUB Environment Block\nsaved_entry={OLD_ENTRY}\n")
    monkeypatch.setenv("GPUFLEET_BOOT_HEALTH_ROOT", str(tmp_path))
    assert bh.main(["x", "/etc/gpufleet/boot-health.json"]) == 0
    result = json.loads((tmp_path / "var/lib/gpufleet/kernel_upgrade/boot-health.json").read_text())
    assert result["action"] == "revert" and "the configuration cannot be used" in result["reasons"][0]


def test_a_committed_candidate_with_an_unusable_configuration_is_left_alone(tmp_path, monkeypatch):
    write(tmp_path, "/etc/gpufleet/boot-health.json", json.dumps(dict(CFG, journal=5)))
    write(tmp_path, "/proc/sys/kernel/osrelease", NEW + "\n")
    write(tmp_path, "/proc/uptime", "200.0 100.0\n")
    write(tmp_path, "/boot/grub/grubenv", f"# GRUB Environment Block\nsaved_entry={NEW_ENTRY}\n")
    monkeypatch.setenv("GPUFLEET_BOOT_HEALTH_ROOT", str(tmp_path))
    assert bh.main(["x", "/etc/gpufleet/boot-health.json"]) == 0
    assert not (tmp_path / "var/lib/gpufleet/kernel_upgrade/boot-health.json").exists()

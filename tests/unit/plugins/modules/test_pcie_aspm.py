# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pcie_aspm: the policy file parsed, planned, written and read back on fake trees; a kernel that
refuses (EPERM, as on QEMU and with pcie_aspm=off) changes nothing and warns."""

from __future__ import annotations

import errno

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import pcie_aspm as pa
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.modules import pcie_aspm
from tests.unit.fakesysfs import FakeHost
from tests.unit.plugins.modules.uthelper import run_module, target_side


@pytest.fixture(autouse=True)
def _target_side(monkeypatch):
    target_side(monkeypatch)


class KernelAttrFS(HostFS):
    """A HostFS whose policy file behaves like the kernel's: a write selects, a read lists with brackets."""

    def __init__(self, root, refuse: int | None = None):
        super().__init__(root)
        self.refuse = refuse

    def write_text(self, host_path, data):
        if host_path == pa.POLICY_FILE:
            if self.refuse:
                raise HostFSError("write", host_path, OSError(self.refuse, errno.errorcode[self.refuse]))
            data = " ".join(f"[{p}]" if p == data.strip() else p for p in pa.POLICIES)
        super().write_text(host_path, data)


@pytest.mark.parametrize("text,current,available", [
    ("default [performance] powersave powersupersave\n", "performance", list(pa.POLICIES)),
    ("[default] performance powersave", "default", ["default", "performance", "powersave"]),
    ("performance", "performance", list(pa.POLICIES)),
    ("", None, []), (None, None, []),
])
def test_parse_policy(text, current, available):
    assert pa.parse_policy(text) == (current, available)


def test_plan():
    assert pa.plan("performance", list(pa.POLICIES), "performance", "")["action"] is None
    assert pa.plan("default", list(pa.POLICIES), "performance", "ro quiet")["action"] == {
        "action": "set_policy", "path": pa.POLICY_FILE, "before": "default", "after": "performance"}
    skip = pa.plan("default", list(pa.POLICIES), "performance", "ro pcie_aspm=off quiet")
    assert skip["action"] is None and "booted with pcie_aspm=off" in skip["skip"]
    assert pa.plan("default", list(pa.POLICIES), "performance", "pcie_aspm=force")["action"] is not None
    assert "not powersupersave" in pa.plan("default", ["default", "performance"], "powersupersave", "")["error"]


def test_set_policy_writes_and_reads_back(tmp_path):
    FakeHost(tmp_path, aspm_policy="default")
    fs = KernelAttrFS(str(tmp_path))
    result, warnings = pa.set_policy(fs, "performance", check_mode=False)
    assert (result["policy_before"], result["policy"], warnings) == ("default", "performance", [])
    assert (tmp_path / "sys/module/pcie_aspm/parameters/policy").read_text() == "default [performance] powersave powersupersave"
    again, _w = pa.set_policy(fs, "performance", check_mode=False)
    assert again["actions"] == []


def test_set_policy_check_mode_writes_nothing(tmp_path):
    FakeHost(tmp_path, aspm_policy="default")
    before = (tmp_path / "sys/module/pcie_aspm/parameters/policy").read_text()
    result, _w = pa.set_policy(KernelAttrFS(str(tmp_path)), "performance", check_mode=True)
    assert result["actions"] and result["policy"] == "performance"
    assert (tmp_path / "sys/module/pcie_aspm/parameters/policy").read_text() == before


def test_kernel_refuses_with_eperm(tmp_path):
    FakeHost(tmp_path, aspm_policy="default")
    result, warnings = pa.set_policy(KernelAttrFS(str(tmp_path), refuse=errno.EPERM), "performance", False)
    assert (result["writable"], result["actions"], result["policy"]) == (False, [], "default")
    assert "firmware does not let the OS control ASPM" in warnings[0]


def test_other_write_errors_fail(tmp_path):
    FakeHost(tmp_path, aspm_policy="default")
    with pytest.raises(pa.PolicyError, match="Run the module as root"):
        pa.set_policy(KernelAttrFS(str(tmp_path), refuse=errno.EACCES), "performance", False)


def test_readback_mismatch_fails(tmp_path):
    FakeHost(tmp_path, aspm_policy="default")

    class Stubborn(HostFS):
        def write_text(self, host_path, data):
            pass  # something puts the old value back at once

    with pytest.raises(pa.PolicyError, match="reads back default: something else sets the ASPM policy"):
        pa.set_policy(Stubborn(str(tmp_path)), "performance", False)


def test_main_on_a_fake_tree(tmp_path, capsys):
    FakeHost(tmp_path, aspm_policy="default")
    result = run_module(pcie_aspm, {"root": str(tmp_path), "policy": "performance", "_ansible_diff": True}, capsys)
    assert result["changed"] is True and result["policy"] == "performance"
    assert result["diff"]["before"] == "default\n" and result["diff"]["after"] == "performance\n"
    assert run_module(pcie_aspm, {"root": str(tmp_path), "policy": "performance"}, capsys)["changed"] is False


def test_main_pcie_aspm_off_warns_and_changes_nothing(tmp_path, capsys):
    FakeHost(tmp_path, aspm_policy="default", cmdline="BOOT_IMAGE=/vmlinuz ro pcie_aspm=off")
    result = run_module(pcie_aspm, {"root": str(tmp_path), "policy": "performance"}, capsys)
    assert (result["changed"], result["writable"], result["policy"]) == (False, False, "default")
    assert any("pcie_aspm=off" in (w["event"]["msg"] if isinstance(w, dict) else w) for w in result["warnings"])


def test_main_without_aspm_support(tmp_path, capsys):
    (tmp_path / "proc").mkdir()
    result = run_module(pcie_aspm, {"root": str(tmp_path), "policy": "performance"}, capsys)
    assert result["failed"] is True and "no PCIe ASPM support (CONFIG_PCIEASPM)" in result["msg"]

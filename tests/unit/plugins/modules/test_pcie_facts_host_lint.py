# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pcie_facts with host_lint: the lint's findings join the audit's in the same module run, with file and line."""

from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.modules import pcie_facts
from tests.unit.fakesysfs import FakeHost
from tests.unit.plugins.modules.uthelper import run_module


def _host(tmp_path, driver="nvidia"):
    host = FakeHost(tmp_path, cmdline="BOOT_IMAGE=/vmlinuz ro pci=noacs")
    host.gpu("0000:17:00.0", host.host_bridge(), driver=driver)
    host.write("/etc/nccl.conf", "NCCL_P2P_LEVEL=PCI")
    return host


def test_lint_findings_join_the_audit(tmp_path, capsys):
    _host(tmp_path)
    result = run_module(pcie_facts, {"root": str(tmp_path), "include_nvml": "never", "host_lint": True}, capsys)
    lint = {f["code"]: f for f in result["pcie"]["findings"] if "source" in f}
    assert set(lint) == {"pci_noacs", "nccl_p2p_level_unknown"}
    assert (lint["nccl_p2p_level_unknown"]["file"], lint["nccl_p2p_level_unknown"]["line"]) == ("/etc/nccl.conf", 1)
    assert lint["pci_noacs"]["devices"] == [] and lint["pci_noacs"]["device"] is None
    assert "/etc/nccl.conf" in result["pcie"]["host_lint"]["files"]
    assert result["findings_summary"]["warning"] >= 2
    severities = [f["severity"] for f in result["pcie"]["findings"]]
    assert severities == sorted(severities, key=("critical", "warning", "info").index)


def test_without_host_lint_nothing_is_linted(tmp_path, capsys):
    _host(tmp_path)
    result = run_module(pcie_facts, {"root": str(tmp_path), "include_nvml": "never"}, capsys)
    assert "host_lint" not in result["pcie"] and not [f for f in result["pcie"]["findings"] if "source" in f]


def test_vfio_gpu_is_critical_unless_vfio_is_wanted(tmp_path, capsys):
    _host(tmp_path, driver="vfio-pci")
    args = {"root": str(tmp_path), "include_nvml": "never", "host_lint": True}
    found = [f for f in run_module(pcie_facts, args, capsys)["pcie"]["findings"] if f["code"] == "gpu_bound_to_vfio"]
    assert [(f["severity"], f["device"], f["devices"]) for f in found] == [("critical", "0000:17:00.0", ["0000:17:00.0"])]
    wanted = run_module(pcie_facts, dict(args, vfio_wanted=True), capsys)["pcie"]["findings"]
    assert not [f for f in wanted if f["code"] == "gpu_bound_to_vfio"]

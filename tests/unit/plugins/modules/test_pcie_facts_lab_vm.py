"""pcie_facts on a real capture of a lab VM (tests/fixtures/pci/lab-vm-q35, taken with
tests/tools/capture_pci_tree.py inside lab1 as it booted), checked hop by hop against that VM's
own `lspci -vv` of the same moment: link capability and status, MaxPayload supported and set,
MaxReadReq, MSI-X. lspci's text is the independent oracle here; the module decodes config space."""

from __future__ import annotations

import os

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.modules import pcie_facts

from tests.unit.lspci import assert_config_matches_lspci, parse_lspci_vv
from tests.unit.fakesysfs import load_capture

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "pci", "lab-vm-q35")


def _facts(tmp_path):
    root = str(load_capture("lab-vm-q35", tmp_path / "lab"))
    facts, warnings = pcie_facts.gather(HostFS(root), {"include_nvml": "never"})
    assert warnings == []
    return facts


def _lspci() -> dict:
    with open(os.path.join(FIXTURE, "lspci-vv.txt"), encoding="utf-8") as fh:
        return parse_lspci_vv(fh.read())


def test_every_hop_agrees_with_lspci(tmp_path):
    facts = _facts(tmp_path)
    lspci = _lspci()
    assert {g["bdf"] for g in facts["gpus"]} == {"0000:01:00.0", "0000:05:00.0", "0000:06:00.0"}
    hops = set(facts["devices"])
    assert {"0000:00:04.0", "0000:00:06.0", "0000:03:00.0", "0000:04:00.0", "0000:04:01.0"} <= hops
    for bdf, dev in facts["devices"].items():
        assert_config_matches_lspci(bdf, dev, lspci[bdf])


def test_paths_groups_and_pairs(tmp_path):
    facts = _facts(tmp_path)
    devs = facts["devices"]
    gpus = {g["bdf"]: g for g in facts["gpus"]}
    assert gpus["0000:05:00.0"]["path"] == ["0000:00:06.0", "0000:03:00.0", "0000:04:00.0", "0000:05:00.0"]
    assert gpus["0000:01:00.0"]["path"] == ["0000:00:04.0", "0000:01:00.0"]
    # the switch's ports and both GPU stand-ins: one IOMMU group (rp3 has no ACS)
    members = {m["bdf"] for m in devs["0000:05:00.0"]["iommu_group_members"]}
    assert members == {"0000:00:06.0", "0000:03:00.0", "0000:04:00.0", "0000:04:01.0", "0000:05:00.0", "0000:06:00.0"}
    assert devs["0000:01:00.0"]["iommu_group"] != devs["0000:05:00.0"]["iommu_group"]
    levels = {frozenset((p["a"], p["b"])): p["level"] for p in facts["pairs"]}
    assert levels[frozenset(("0000:05:00.0", "0000:06:00.0"))] == "PIX"
    assert levels[frozenset(("0000:01:00.0", "0000:05:00.0"))] == "PHB"
    # QEMU trains every link at 2.5GT/s x1; the root ports advertise 16GT/s x16
    assert devs["0000:00:04.0"]["config"]["pcie"]["link_cap"]["speed_gts"] == 16.0
    assert devs["0000:00:04.0"]["config"]["pcie"]["link_sta"]["width"] == 1

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""P2P findings: NVML's P2P status per PCIe-only pair (with the fix per status; NVSwitch pairs of the
real H200 capture are exempt), tensor-parallel groups across sockets, GPUs behind the chipset."""

from __future__ import annotations

import json

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import p2p as pcie_p2p
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import TopologyError
from ansible_collections.gpufleet.inference.plugins.modules import pcie_facts
from tests.unit.fakenvml import FakeNVML
from tests.unit.fakesysfs import FIXTURES, FakeHost, eight_gpus, load_capture, two_gpus_one_switch, two_numa_nodes


def gpu(bus):
    return {"bus": bus, "name": "NVIDIA H100 PCIe"}


def codes(facts, code):
    return [f for f in facts["findings"] if f["code"] == code]


@pytest.mark.parametrize("status,code,words", [
    ("CHIPSET_NOT_SUPPORTED", 1, "root complex between them does not forward"),
    ("IOH_TOPOLOGY_NOT_SUPPORTED", 3, "crosses host bridges"),
    ("DISABLED_BY_REGKEY", 4, "NVreg_RegistryDwords"),
    ("NOT_SUPPORTED", 5, "pcie_acs clears it on exactly the bridges"),
])
def test_pcie_only_pair_without_p2p_is_a_finding_with_its_fix(tmp_path, status, code, words):
    two_gpus_one_switch(tmp_path)
    fake = FakeNVML([gpu("00000000:03:00.0"), gpu("00000000:04:00.0")], levels={(0, 1): 10},
                    p2p={(0, 1, 4): code, (1, 0, 4): code}, unsupported={"nvmlDeviceGetNvLinkState"})
    facts, _w = pcie_facts.gather(HostFS(str(tmp_path)), {"include_nvml": "always"}, nvml_lib=fake)
    [f] = codes(facts, "p2p_not_supported")
    assert f["severity"] == "warning" and f["devices"] == ["0000:03:00.0", "0000:04:00.0"]
    assert f"as {status}" in f["message"] and (words in f["message"] or words in f["fix"])


def test_p2p_ok_pair_has_no_finding(tmp_path):
    two_gpus_one_switch(tmp_path)
    fake = FakeNVML([gpu("00000000:03:00.0"), gpu("00000000:04:00.0")], levels={(0, 1): 10},
                    unsupported={"nvmlDeviceGetNvLinkState"})
    facts, _w = pcie_facts.gather(HostFS(str(tmp_path)), {"include_nvml": "always"}, nvml_lib=fake)
    assert codes(facts, "p2p_not_supported") == []


def test_nvswitch_pairs_of_the_real_h200_are_exempt(tmp_path):
    root = load_capture("gpu-h200-x4", tmp_path)
    readings = json.loads((FIXTURES / "gpu-h200-x4" / "nvml-readings.json").read_text())
    assert all(p["p2p"]["pci"] == "NOT_SUPPORTED" for p in readings["pairs"])  # what nvidia-smi topo -p2p p shows: NS
    facts, _w = pcie_facts.gather(HostFS(str(root)), {"include_nvml": "always"}, nvml_lib=FakeNVML.from_readings(readings))
    assert codes(facts, "p2p_not_supported") == []


def test_status_picks_the_first_bad_of_read_write_pci():
    assert pcie_p2p.pcie_p2p_status({"p2p": {"read": "OK", "write": "OK", "pci": "OK"}}) == "OK"
    assert pcie_p2p.pcie_p2p_status({"p2p": {"read": "OK", "write": "DISABLED_BY_REGKEY"}}) == "DISABLED_BY_REGKEY"
    assert pcie_p2p.pcie_p2p_status({"p2p": None}) is None


def test_tp_group_across_sockets(tmp_path):
    two_numa_nodes(tmp_path)
    params = {"include_nvml": "never", "tp_groups": ["0000:17:00.0,0000:97:00.0"]}
    facts, _w = pcie_facts.gather(HostFS(str(tmp_path)), params)
    [f] = codes(facts, "tp_group_spans_sockets")
    assert "spans NUMA nodes 0, 1 (node 0: 0000:17:00.0; node 1: 0000:97:00.0)" in f["message"]
    alone = pcie_facts.gather(HostFS(str(tmp_path)), {"include_nvml": "never", "tp_groups": ["0000:17:00.0"]})[0]
    assert codes(alone, "tp_group_spans_sockets") == []
    with pytest.raises(TopologyError, match="tp_groups: '0000:55:00.0' is not one of the audited GPUs"):
        pcie_facts.gather(HostFS(str(tmp_path)), {"include_nvml": "never", "tp_groups": ["0000:17:00.0,0000:55:00.0"]})


def test_tp_groups_within_one_socket_on_an_eight_gpu_board(tmp_path):
    eight_gpus(tmp_path)
    params = {"include_nvml": "never", "tp_groups": ["0000:13:00.0,0000:14:00.0,0000:33:00.0,0000:34:00.0"]}
    facts, _w = pcie_facts.gather(HostFS(str(tmp_path)), params)
    assert codes(facts, "tp_group_spans_sockets") == []


def test_gpu_behind_the_intel_pch_or_an_amd_chipset_switch(tmp_path):
    host = FakeHost(tmp_path)
    hb = host.host_bridge(0, 0)
    host.add("0000:00:01.0", hb, kind="root_port", vendor="0x8086")
    host.gpu("0000:01:00.0", "0000:00:01.0")
    host.add("0000:00:1c.0", hb, kind="root_port", vendor="0x8086", device="0x7ab8")  # PCH root port
    host.gpu("0000:02:00.0", "0000:00:1c.0")
    host.add("0000:00:03.0", hb, kind="root_port", vendor="0x1022", device="0x1483")
    host.add("0000:03:00.0", "0000:00:03.0", kind="upstream_port", vendor="0x1022", device="0x57ad")  # X570 chipset
    host.add("0000:04:00.0", "0000:03:00.0", kind="downstream_port", vendor="0x1022", device="0x57a3")
    host.gpu("0000:05:00.0", "0000:04:00.0")
    facts, _w = pcie_facts.gather(HostFS(str(tmp_path)), {"include_nvml": "never"})
    found = {f["device"]: f for f in codes(facts, "gpu_behind_chipset")}
    assert sorted(found) == ["0000:02:00.0", "0000:05:00.0"]  # not the GPU on CPU lanes
    assert found["0000:02:00.0"]["devices"] == ["0000:02:00.0", "0000:00:1c.0"]
    assert found["0000:05:00.0"]["devices"] == ["0000:05:00.0", "0000:03:00.0"]
    only = pcie_facts.gather(HostFS(str(tmp_path)), {"include_nvml": "never", "tp_groups": ["0000:01:00.0"]})[0]
    assert codes(only, "gpu_behind_chipset") == []  # judged per group when groups are given


def test_phb_pair_with_root_port_redirect_is_reported_with_the_exact_ports(tmp_path):
    from tests.unit.plugins.module_utils.test_pcie_acs import two_root_ports  # pylint: disable=import-outside-toplevel
    two_root_ports(tmp_path)
    facts, _w = pcie_facts.gather(HostFS(str(tmp_path)), {"include_nvml": "never"})
    [f] = codes(facts, "acs_redirect")
    assert f["severity"] == "info" and f["devices"] == ["0000:01:00.0", "0000:02:00.0", "0000:00:01.0", "0000:00:02.0"]
    assert "(PHB)" in f["message"] and "exactly 0000:00:01.0, 0000:00:02.0 with gpufleet.inference.pcie_acs" in f["fix"]

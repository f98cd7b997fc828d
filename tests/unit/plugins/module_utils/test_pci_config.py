# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Config space decoder: real captured bytes, synthetic layouts, short and corrupt reads."""

from __future__ import annotations

import struct

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._pci import config as pc
from tests.unit.fakesysfs import FIXTURES, capture_tool, config_space

DEV_VM = "dev-vm-firecracker"
GPU_H200 = "gpu-h200-microvm"


def captured_configs(name: str) -> dict[str, bytes]:
    """{bdf: config bytes} of a capture under tests/fixtures/pci."""
    tool = capture_tool()
    data = tool.load(str(FIXTURES / name))
    return {path.split("/")[-2]: tool.config_bytes(blob) for path, blob in data["binary"].items() if path.endswith("/config")}


# ---- real captures --------------------------------------------------------------------------
def test_dev_vm_virtio_functions_are_conventional_pci_with_msix():
    configs = captured_configs(DEV_VM)
    expected_msix = {"0000:00:01.0": 5, "0000:00:02.0": 2, "0000:00:03.0": 3, "0000:00:04.0": 4, "0000:00:05.0": 2}
    for bdf, table_size in expected_msix.items():
        cfg = pc.decode_config(configs[bdf])
        assert cfg["size"] == 256
        assert cfg["vendor_id"] == "0x1af4"
        assert cfg["pcie"] is None, "virtio-pci here has no PCI Express capability"
        assert cfg["extended_readable"] is None  # not PCIe: there is no extended space to miss
        assert cfg["msix"] == {"offset": 0x98, "table_size": table_size, "enabled": True, "function_masked": False}
        assert [c["id"] for c in cfg["capabilities"]] == ["vendor"] * 5 + ["msix"]
        assert cfg["capabilities_complete"] is True


def test_dev_vm_host_bridge_has_no_capabilities():
    cfg = pc.decode_config(captured_configs(DEV_VM)["0000:00:00.0"])
    assert (cfg["vendor_id"], cfg["device_id"], cfg["class"], cfg["size"]) == ("0x8086", "0x0d57", "0x060000", 4096)
    assert cfg["capabilities"] == [] and cfg["extended_capabilities"] == []
    assert cfg["is_bridge"] is False and cfg["header_type"] == 0


def test_dev_vm_net_class_and_subsystem():
    cfg = pc.decode_config(captured_configs(DEV_VM)["0000:00:03.0"])
    assert cfg["class"] == "0x020000"
    assert (cfg["subsystem_vendor_id"], cfg["subsystem_id"]) == ("0x1af4", "0x1041")
    assert cfg["command"] == {"memory": True, "bus_master": True}


# ---- synthetic layouts ----------------------------------------------------------------------
def test_endpoint_link_mps_mrrs_and_speeds():
    cfg = pc.decode_config(config_space("0x10de", "0x2330", "0x030200", link_cap=(32.0, 16), link_sta=(16.0, 8),
                                        mps_supported=512, mps=256, mrrs=4096, msix=9))
    pcie = cfg["pcie"]
    assert pcie["port_type"] == "endpoint" and pcie["version"] == 2
    assert (pcie["mps_supported"], pcie["mps"], pcie["mrrs"]) == (512, 256, 4096)
    assert pcie["link_cap"]["speed_gts"] == 32.0 and pcie["link_cap"]["gen"] == 5 and pcie["link_cap"]["width"] == 16
    assert pcie["link_sta"]["speed_gts"] == 16.0 and pcie["link_sta"]["gen"] == 4 and pcie["link_sta"]["width"] == 8
    assert pcie["link_sta"]["dll_active"] is True
    assert pcie["link_speeds_supported"] == [2.5, 5.0, 8.0, 16.0, 32.0]
    assert pcie["link_cap"]["aspm_support"] == "L0s L1"
    assert pcie["link_ctl"]["aspm"] == "disabled"
    assert pcie["relaxed_ordering"] and pcie["extended_tag"] and pcie["no_snoop"]
    assert cfg["msix"]["table_size"] == 9
    assert [c["id"] for c in cfg["capabilities"]] == ["pm", "msix", "pcie"]
    assert cfg["extended_readable"] is True
    assert [c["id"] for c in cfg["extended_capabilities"]] == ["aer"]


@pytest.mark.parametrize("kind", ["root_port", "upstream_port", "downstream_port"])
def test_bridge_port_types(kind):
    cfg = pc.decode_config(config_space("0x1000", "0xc030", "0x060400", bridge=True, port_type=kind, secondary_bus=5))
    assert cfg["is_bridge"] and cfg["header_type"] == 1
    assert cfg["bus"]["secondary"] == 5
    assert cfg["pcie"]["port_type"] == kind
    assert cfg["pcie"]["slot_implemented"] is (kind != "upstream_port")


@pytest.mark.parametrize("aspm", ["disabled", "L0s", "L1", "L0s L1"])
def test_aspm_control(aspm):
    assert pc.decode_config(config_space("0x10de", "0x2330", "0x030200", aspm=aspm))["pcie"]["link_ctl"]["aspm"] == aspm


def test_acs_capability_and_control_bits():
    cfg = pc.decode_config(config_space("0x1000", "0xc030", "0x060400", bridge=True, port_type="downstream_port",
                                        acs_cap=("SV", "TB", "RR", "CR", "UF", "EC", "DT"), acs_ctrl=("SV", "RR", "CR", "UF")))
    acs = cfg["acs"]
    assert all(acs["cap"].values())
    assert acs["ctrl"] == {"SV": True, "TB": False, "RR": True, "CR": True, "UF": True, "EC": False, "DT": False}
    assert acs["p2p_redirect"] is True and acs["ctrl_raw"] == 0b11101
    assert [c["id"] for c in cfg["extended_capabilities"]] == ["aer", "acs"]
    assert acs["offset"] == 0x148


def test_acs_without_redirect():
    cfg = pc.decode_config(config_space("0x1000", "0xc030", "0x060400", bridge=True, port_type="downstream_port",
                                        acs_cap=("SV", "RR", "CR"), acs_ctrl=("SV",)))
    assert cfg["acs"]["p2p_redirect"] is False


def test_aer_status_bits():
    unc = 1 << 14 | 1 << 20  # completion timeout, unsupported request
    cor = 1 << 0 | 1 << 6 | 1 << 13
    aer = pc.decode_config(config_space("0x10de", "0x2330", "0x030200", aer_uncorrectable=unc, aer_correctable=cor))["aer"]
    assert aer["uncorrectable"] == ["CmpltTO", "UnsupReq"]
    assert aer["correctable"] == ["RxErr", "BadTLP", "AdvNonFatalErr"]
    assert aer["uncorrectable_status"] == unc and aer["correctable_mask"] == 0x2000


def test_conventional_pci_function_has_no_pcie_block():
    cfg = pc.decode_config(config_space("0x1af4", "0x1041", "0x020000", port_type=None, msix=3, size=256))
    assert cfg["pcie"] is None and cfg["acs"] is None and cfg["extended_readable"] is None


# ---- short and corrupt reads ----------------------------------------------------------------
def test_64_byte_read_as_non_root_marks_capabilities_incomplete():
    cfg = pc.decode_config(config_space("0x10de", "0x2330", "0x030200", size=64))
    assert cfg["vendor_id"] == "0x10de" and cfg["class"] == "0x030200"
    assert cfg["capabilities_complete"] is False
    assert cfg["pcie"] is None and cfg["capabilities"] == []


def test_256_byte_read_of_pcie_function_hides_extended_caps():
    cfg = pc.decode_config(config_space("0x1000", "0xc030", "0x060400", bridge=True, port_type="downstream_port",
                                        acs_cap=("RR",), acs_ctrl=("RR",), size=256))
    assert cfg["pcie"]["port_type"] == "downstream_port"
    assert cfg["extended_readable"] is False
    assert cfg["acs"] is None and cfg["aer"] is None and cfg["extended_capabilities"] == []


def test_capability_list_cut_mid_way():
    data = config_space("0x10de", "0x2330", "0x030200", msix=4)[:0x52]  # ends inside MSI-X
    cfg = pc.decode_config(data)
    assert [c["id"] for c in cfg["capabilities"]] == ["pm", "msix"]
    assert cfg["msix"] is None and cfg["pcie"] is None


@pytest.mark.parametrize("data,reason", [
    (b"\x86\x80" * 10, "needs 64"),
    (b"\xff" * 256, "0xffff"),
    (b"\x00" * 256, "0x0000"),
])
def test_unusable_config_raises_clear_error(data, reason):
    with pytest.raises(pc.ConfigSpaceError, match=reason):
        pc.decode_config(data)


def test_capability_loop_terminates():
    data = bytearray(config_space("0x10de", "0x2330", "0x030200"))
    data[0x61] = 0x40  # PCIe cap points back to PM: a cycle
    cfg = pc.decode_config(bytes(data))
    assert [c["id"] for c in cfg["capabilities"]] == ["pm", "pcie"]


def test_extended_capability_loop_terminates():
    data = bytearray(config_space("0x10de", "0x2330", "0x030200"))
    struct.pack_into("<I", data, 0x100, 0x0001 | 1 << 16 | 0x100 << 20)  # AER points to itself
    assert [c["id"] for c in pc.decode_config(bytes(data))["extended_capabilities"]] == ["aer"]


def test_pointer_into_header_is_ignored():
    data = bytearray(config_space("0x10de", "0x2330", "0x030200"))
    data[0x34] = 0x10
    assert pc.decode_config(bytes(data))["capabilities"] == []


def test_pcie_capability_version_1_derives_speeds_from_lnkcap():
    data = bytearray(config_space("0x8086", "0x10fb", "0x020000", link_cap=(5.0, 8)))
    struct.pack_into("<H", data, 0x62, 0x0001)  # version 1 endpoint
    pcie = pc.decode_config(bytes(data))["pcie"]
    assert pcie["version"] == 1 and pcie["link_speeds_supported"] == [2.5, 5.0]


# ---- link arithmetic ------------------------------------------------------------------------
@pytest.mark.parametrize("speed,width,gbps", [
    (32.0, 16, 63.02), (16.0, 16, 31.51), (8.0, 16, 15.75), (5.0, 16, 8.0), (2.5, 1, 0.25), (64.0, 16, 121.0),
    (None, 16, None), (32.0, 0, None),
])
def test_link_bandwidth(speed, width, gbps):
    assert pc.link_bandwidth_gbps(speed, width) == gbps


def test_link_generation():
    assert [pc.link_generation(s) for s in (2.5, 5.0, 8.0, 16.0, 32.0, 64.0, 3.0, None)] == [1, 2, 3, 4, 5, 6, None, None]


# ---- the real H200 (device tool microVM) -----------------------------------------------------
def test_h200_endpoint_decoded_from_real_bytes():
    cfg = pc.decode_config(captured_configs(GPU_H200)["0000:00:06.0"])
    assert (cfg["vendor_id"], cfg["device_id"], cfg["class"], cfg["size"]) == ("0x10de", "0x2335", "0x030200", 4096)
    assert [c["id"] for c in cfg["capabilities"]] == ["pm", "msi", "pcie", "msix"]
    pcie = cfg["pcie"]
    assert pcie["port_type"] == "endpoint" and pcie["version"] == 2 and pcie["flr_capable"]
    assert (pcie["mps_supported"], pcie["mps"], pcie["mrrs"]) == (256, 256, 4096)  # as LAB.md measured
    assert (pcie["link_cap"]["gen"], pcie["link_cap"]["width"], pcie["link_sta"]["gen"], pcie["link_sta"]["width"]) == (5, 16, 5, 16)
    assert pcie["link_speeds_supported"] == [2.5, 5.0, 8.0, 16.0, 32.0]
    assert pcie["link_ctl"]["aspm"] == "disabled" and pcie["link_cap"]["aspm_support"] == "L1"
    assert cfg["msix"] == {"offset": 0xB0, "table_size": 9, "enabled": True, "function_masked": False}
    assert cfg["msi"]["enabled"] is False
    assert cfg["extended_readable"] is True and cfg["acs"] is None
    assert cfg["aer"]["uncorrectable"] == [] and cfg["aer"]["correctable"] == []
    # the hypervisor hides some extended capabilities behind Null (0x0000) entries
    assert [c["id"] for c in cfg["extended_capabilities"]] == [
        "null", "ltr", "null", "aer", "null", "null", "vendor", "power_budget", "dsn"]

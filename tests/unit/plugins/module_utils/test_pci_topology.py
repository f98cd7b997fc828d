# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sysfs walk: parsers, the path walk on a real capture and on synthetic trees, target selection."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._pci import topology as pt
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from tests.unit.fakesysfs import FakeHost, load_capture, two_gpus_one_switch, two_numa_nodes

DEV_VM = "dev-vm-firecracker"


@pytest.fixture
def dev_vm(tmp_path):
    return HostFS(str(load_capture(DEV_VM, tmp_path / "root")))


# ---- parsers ------------------------------------------------------------------------------
@pytest.mark.parametrize("text,bdf", [
    ("0000:3b:00.0", "0000:3b:00.0"), ("3B:00.1", "0000:3b:00.1"), ("00000000:3B:00.0", "0000:3b:00.0"),
    ("10000:e1:00.0", "10000:e1:00.0"), (" 0000:00:06.0 ", "0000:00:06.0"),
    ("0000:3b:00", None), ("gpu0", None), ("0000:3b:00.8", None), ("", None),
])
def test_normalize_bdf(text, bdf):
    assert pt.normalize_bdf(text) == bdf


@pytest.mark.parametrize("text,cpus", [("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]), ("5", [5]), ("", []), (None, []),
                                       ("0-1\n", [0, 1])])
def test_parse_cpulist(text, cpus):
    assert pt.parse_cpulist(text) == cpus


def test_format_cpulist_round_trip():
    assert pt.format_cpulist([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert pt.parse_cpulist(pt.format_cpulist(range(64, 128))) == list(range(64, 128))


def test_parse_meminfo_and_counters():
    info = pt.parse_meminfo("MemTotal:  1000 kB\nHugePages_Total:   16\nHugepagesize:    2048 kB\nbogus line\n")
    assert info == {"MemTotal": 1000, "HugePages_Total": 16, "Hugepagesize": 2048}
    assert pt.parse_counters("RxErr 3\nBadTLP 0\nTOTAL_ERR_COR 3\n") == {"RxErr": 3, "BadTLP": 0, "TOTAL_ERR_COR": 3}
    assert pt.parse_counters(None) is None


@pytest.mark.parametrize("text,gts", [("32.0 GT/s PCIe", 32.0), ("2.5 GT/s", 2.5), ("Unknown", None), (None, None)])
def test_parse_link_speed(text, gts):
    assert pt.parse_link_speed(text) == gts


def test_parse_aspm_policy_and_cmdline():
    assert pt.parse_aspm_policy("default [performance] powersave powersupersave") == "performance"
    assert pt.parse_aspm_policy(None) is None
    assert pt.iommu_passthrough_on_cmdline("ro quiet intel_iommu=on iommu=pt")
    assert pt.iommu_passthrough_on_cmdline("iommu.passthrough=1")
    assert not pt.iommu_passthrough_on_cmdline("intel_iommu=on")


@pytest.mark.parametrize("path,hb,chain", [
    ("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0", "pci0000:00", ["0000:00:01.0", "0000:01:00.0"]),
    ("/sys/devices/pci0000:00/0000:00:06.0", "pci0000:00", ["0000:00:06.0"]),
    ("/sys/devices/pci0000:00/0000:00:0e.0/pci10000:00/10000:00:01.0/10000:01:00.0", "pci0000:00",
     ["0000:00:0e.0", "10000:00:01.0", "10000:01:00.0"]),
])
def test_split_sysfs_path(path, hb, chain):
    assert pt.split_sysfs_path(path) == (hb, chain)


def test_lookup_pci_ids_keeps_only_wanted():
    text = ("# comment\n10de  NVIDIA Corporation\n\t2330  GH100 [H100 SXM5 80GB]\n\t\t10de 16c1  H100 SXM5\n"
            "\t2335  GH100 [H200 SXM 141GB]\n1af4  Red Hat, Inc.\n\t1041  Virtio 1.0 network device\n"
            "C 03  Display controller\n\t02  3D controller\n")
    names = pt.lookup_pci_ids(text, {("10de", "2335"), ("1af4", "ffff"), ("8086", "0001")})
    assert names == {("10de", "2335"): ("NVIDIA Corporation", "GH100 [H200 SXM 141GB]"), ("1af4", "ffff"): ("Red Hat, Inc.", None)}


# ---- topology levels ------------------------------------------------------------------------
def _fn(path, hb="pci0000:00", node=0):
    return {"host_bridge": hb, "path": path, "numa_node": node}


@pytest.mark.parametrize("a,b,level,common", [
    (_fn(["rp", "up", "dn0", "A"]), _fn(["rp", "up", "dn1", "B"]), "PIX", "up"),
    (_fn(["rp", "up1", "dn0", "up2", "dn2", "A"]), _fn(["rp", "up1", "dn1", "B"]), "PXB", "up1"),
    (_fn(["rp", "br", "A"]), _fn(["rp", "br", "B"]), "PIX", "br"),
    (_fn(["rp0", "A"]), _fn(["rp1", "B"]), "PHB", None),
    (_fn(["A"]), _fn(["B"]), "PHB", None),
    (_fn(["rp0", "A"], "pci0000:00", 0), _fn(["rp1", "B"], "pci0000:40", 0), "NODE", None),
    (_fn(["rp0", "A"], "pci0000:00", 0), _fn(["rp1", "B"], "pci0000:80", 1), "SYS", None),
    (_fn(["rp0", "A"], "pci0000:00", -1), _fn(["rp1", "B"], "pci0000:80", 1), "NODE", None),
])
def test_topology_level(a, b, level, common):
    got, got_common, _below = pt.topology_level(a, b)
    assert (got, got_common) == (level, common)
    assert pt.topology_level(b, a)[0] == level  # pylint: disable=arguments-out-of-order


def test_nearest_level():
    assert pt.nearest_level(["SYS", "PXB", "NODE"]) == "PXB"
    assert pt.nearest_level([]) is None


# ---- the walk on a real capture -------------------------------------------------------------
def test_dev_vm_functions_and_record(dev_vm):
    walker = pt.PciWalker(dev_vm)
    assert walker.functions() == ["0000:00:00.0", "0000:00:01.0", "0000:00:02.0", "0000:00:03.0", "0000:00:04.0", "0000:00:05.0"]
    rec = walker.device("0000:00:03.0")
    assert rec["sysfs_path"] == "/sys/devices/pci0000:00/0000:00:03.0"
    assert (rec["host_bridge"], rec["parent"]) == ("pci0000:00", None)
    assert (rec["class"], rec["class_name"], rec["driver"]) == ("0x020000", "Ethernet controller", "virtio-pci")
    assert rec["numa_node"] == -1 and rec["local_cpulist"] == "0-1"
    assert rec["iommu_group"] is None and rec["iommu_group_members"] == []
    assert [i["irq"] for i in rec["irqs"]] == [37, 38, 39]
    assert {i["mode"] for i in rec["irqs"]} == {"msix"}
    assert all(i["smp_affinity_list"] == "0-1" and i["effective_affinity_list"] in ("0", "1") for i in rec["irqs"])
    assert rec["config"]["msix"]["table_size"] == 3 and rec["config_error"] is None
    assert rec["link_sysfs"] is None and rec["aer_counters"] is None


def test_dev_vm_host_facts(dev_vm):
    walker = pt.PciWalker(dev_vm)
    assert walker.iommu_groups() == 0
    assert walker.numa_nodes() == {0: {"cpulist": "0-1", "cpus": 2}}
    huge = walker.hugepages()
    assert huge["total"] == 0 and huge["size_kb"] == 2048 and huge["reserved_pages"] == 0
    assert set(huge["sizes"]) == {"2048kB", "1048576kB"}
    assert walker.aspm_policy() == "default"
    assert "console=ttyS0" in walker.cmdline()


def test_dev_vm_names_from_captured_pci_ids(dev_vm):
    names, source = pt.PciWalker(dev_vm).names(["0000:00:03.0", "0000:00:00.0"])
    assert source == "pci.ids"
    assert names["0000:00:03.0"] == ("Red Hat, Inc.", "Virtio 1.0 network device")
    assert names["0000:00:00.0"] == ("Intel Corporation", None)


def test_dev_vm_model_of_a_listed_function(dev_vm):
    model = pt.build_model(dev_vm, ["0000:00:03.0", "0000:00:02.0"])
    assert model["gpus"][0] == {"bdf": "0000:00:03.0", "host_bridge": "pci0000:00", "path": ["0000:00:03.0"],
                                "numa_node": -1, "root_port": None, "name": "Virtio 1.0 network device"}
    assert model["pairs"][0]["level"] == "PHB" and model["pairs"][0]["acs_redirect"] == []
    assert model["iommu"] == {"groups": 0, "enabled": False, "passthrough_cmdline": False, "passthrough": False}
    assert model["devices"]["0000:00:03.0"]["role"] == "target"


# ---- synthetic trees ------------------------------------------------------------------------
def test_switch_path_groups_and_acs(tmp_path):
    two_gpus_one_switch(tmp_path)
    model = pt.build_model(HostFS(str(tmp_path)), ["0000:03:00.0", "0000:04:00.0"])
    gpu = model["gpus"][0]
    assert gpu["path"] == ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]
    assert gpu["root_port"] == "0000:00:01.0" and gpu["host_bridge"] == "pci0000:00"
    assert {b: d["role"] for b, d in model["devices"].items()} == {
        "0000:00:01.0": "bridge", "0000:01:00.0": "bridge", "0000:02:00.0": "bridge", "0000:02:01.0": "bridge",
        "0000:03:00.0": "target", "0000:04:00.0": "target"}
    pair = model["pairs"][0]
    assert (pair["level"], pair["common_ancestor"]) == ("PIX", "0000:01:00.0")
    assert pair["bridges_between"] == ["0000:02:00.0", "0000:02:01.0"]
    assert pair["acs_redirect"] == ["0000:02:00.0", "0000:02:01.0"]
    dev = model["devices"]["0000:03:00.0"]
    assert dev["parent"] == "0000:02:00.0" and dev["driver"] == "nvidia"
    assert dev["iommu_group_type"] == "DMA-FQ" and [m["bdf"] for m in dev["iommu_group_members"]] == ["0000:03:00.0"]
    assert dev["link_sysfs"] == {"current_speed_gts": 32.0, "current_width": 16, "max_speed_gts": 32.0, "max_width": 16}
    assert dev["aer_counters"]["correctable"]["TOTAL_ERR_COR"] == 0
    assert len(dev["irqs"]) == 4


def test_switch_without_acs_shares_one_group(tmp_path):
    two_gpus_one_switch(tmp_path, acs=False)
    model = pt.build_model(HostFS(str(tmp_path)), ["0000:03:00.0", "0000:04:00.0"])
    assert model["pairs"][0]["acs_redirect"] == []
    members = model["devices"]["0000:03:00.0"]["iommu_group_members"]
    assert [(m["bdf"], m["is_bridge"]) for m in members] == [
        ("0000:01:00.0", True), ("0000:02:00.0", True), ("0000:02:01.0", True), ("0000:03:00.0", False), ("0000:04:00.0", False)]


def test_nested_switch_is_pxb(tmp_path):
    host = two_gpus_one_switch(tmp_path)
    host.switch("0000:05:00.0", "0000:02:01.0", ["0000:06:00.0"])
    host.gpu("0000:07:00.0", "0000:06:00.0")
    model = pt.build_model(HostFS(str(tmp_path)), ["0000:03:00.0", "0000:07:00.0"])
    pair = model["pairs"][0]
    assert pair["level"] == "PXB" and pair["common_ancestor"] == "0000:01:00.0"
    assert pair["bridges_between"] == ["0000:02:00.0", "0000:02:01.0", "0000:05:00.0", "0000:06:00.0"]
    assert pair["acs_redirect"] == ["0000:02:00.0", "0000:02:01.0", "0000:06:00.0"]  # downstream ports only


def test_two_numa_nodes_is_sys(tmp_path):
    two_numa_nodes(tmp_path)
    model = pt.build_model(HostFS(str(tmp_path)), ["0000:17:00.0", "0000:97:00.0"])
    assert model["pairs"][0]["level"] == "SYS" and model["pairs"][0]["numa_nodes"] == [0, 1]
    assert model["numa_nodes"] == {0: {"cpulist": "0-7", "cpus": 8}, 1: {"cpulist": "8-15", "cpus": 8}}
    assert model["devices"]["0000:97:00.0"]["local_cpulist"] == "8-15"
    assert {i["effective_affinity_list"] for i in model["devices"]["0000:97:00.0"]["irqs"]} == {"0"}


def test_unreadable_config_is_recorded_not_raised(tmp_path):
    host = two_gpus_one_switch(tmp_path)
    host.real("/sys/devices/pci0000:00/0000:00:01.0/config").unlink()
    host.real("/sys/devices/pci0000:00/0000:00:01.0/config").mkdir()  # EISDIR: root ignores chmod 000
    rec = pt.PciWalker(HostFS(str(tmp_path))).device("0000:00:01.0")
    assert rec["config"] is None and "cannot read /sys/bus/pci/devices/0000:00:01.0/config" in rec["config_error"]


def test_dead_function_config_is_recorded(tmp_path):
    host = FakeHost(tmp_path)
    hb = host.host_bridge()
    host.add("0000:00:01.0", hb, config=b"\xff" * 4096)
    rec = pt.PciWalker(HostFS(str(tmp_path))).device("0000:00:01.0")
    assert "does not answer" in rec["config_error"]


# ---- target selection -----------------------------------------------------------------------
def test_select_gpus_by_class_and_skip_bmc_vga(tmp_path):
    host = two_gpus_one_switch(tmp_path)
    host.add("0000:00:1f.0", "pci0000:00", kind="pci", class_code="0x030000", vendor="0x1a03", device="0x2000")
    walker = pt.PciWalker(HostFS(str(tmp_path)))
    assert pt.select_targets(walker) == ["0000:03:00.0", "0000:04:00.0"]
    assert pt.select_targets(walker, exclude_vendors=()) == ["0000:00:1f.0", "0000:03:00.0", "0000:04:00.0"]
    assert pt.select_targets(walker, vendor="0x1a03") == ["0000:00:1f.0"]
    assert pt.select_targets(walker, vendor="10de", device="2330", class_prefix="0302") == ["0000:03:00.0", "0000:04:00.0"]
    assert pt.select_targets(walker, devices=["03:00.0", "0000:03:00.0", "0000:01:00.0"]) == ["0000:03:00.0", "0000:01:00.0"]


def test_select_unknown_bdf_says_what_where_why(dev_vm):
    with pytest.raises(pt.TopologyError) as err:
        pt.select_targets(pt.PciWalker(dev_vm), devices=["0000:99:00.0"])
    msg = str(err.value)
    assert "0000:99:00.0 not found under /sys/bus/pci/devices" in msg and "lspci -D" in msg and "0000:00:03.0" in msg


def test_select_malformed_bdf(dev_vm):
    with pytest.raises(pt.TopologyError, match="'gpu0' is not a PCI address"):
        pt.select_targets(pt.PciWalker(dev_vm), devices=["gpu0"])


def test_select_no_gpu_on_dev_vm(dev_vm):
    with pytest.raises(pt.TopologyError) as err:
        pt.select_targets(pt.PciWalker(dev_vm))
    msg = str(err.value)
    assert msg.startswith("No GPU found under /sys/bus/pci/devices")
    assert "class 03xx" in msg and "6 functions scanned" in msg and "Ethernet controller [1af4:1041]" in msg
    assert "set devices:" in msg


def test_select_without_sysfs(tmp_path):
    with pytest.raises(pt.TopologyError, match="No GPU found"):
        pt.select_targets(pt.PciWalker(HostFS(str(tmp_path))))


def test_h200_capture_walk(tmp_path):
    """The device tool's H200 microVM: the GPU sits straight on bus 0, 8 MSI-X vectors, no NUMA, no IOMMU."""
    fs = HostFS(str(load_capture("gpu-h200-microvm", tmp_path / "root")))
    walker = pt.PciWalker(fs)
    assert pt.select_targets(walker) == ["0000:00:06.0"]
    assert walker.path("0000:00:06.0") == ("pci0000:00", ["0000:00:06.0"])
    rec = walker.device("0000:00:06.0")
    assert (rec["driver"], rec["numa_node"], rec["local_cpulist"], rec["iommu_group"]) == ("nvidia", -1, "0-15", None)
    assert [i["irq"] for i in rec["irqs"]] == list(range(42, 50)) and {i["mode"] for i in rec["irqs"]} == {"msix"}
    assert rec["link_sysfs"] == {"current_speed_gts": 32.0, "current_width": 16, "max_speed_gts": 32.0, "max_width": 16}
    assert rec["config"]["pcie"]["link_sta"]["speed_gts"] == rec["link_sysfs"]["current_speed_gts"]
    assert walker.aspm_policy() == "default" and walker.iommu_groups() == 0

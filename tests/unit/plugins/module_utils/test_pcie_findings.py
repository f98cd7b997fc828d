# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Findings over synthetic trees (one scenario per finding) and the dev VM capture."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import findings as pf
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import build_model
from tests.unit.fakesysfs import FakeHost, degraded_link, load_capture, two_gpus_one_switch, two_numa_nodes

SWITCH_GPUS = ["0000:03:00.0", "0000:04:00.0"]
NUMA_GPUS = ["0000:17:00.0", "0000:97:00.0"]


def findings(root, targets, vfio_wanted=False, **extra):
    model = build_model(HostFS(str(root)), targets)
    model.update(extra)
    return pf.find(model, vfio_wanted=vfio_wanted)


def codes(found, severity=None):
    return sorted(f["code"] for f in found if severity is None or f["severity"] == severity)


def one(found, code):
    hits = [f for f in found if f["code"] == code]
    assert len(hits) == 1, f"expected one {code}, got {[f['code'] for f in found]}"
    return hits[0]


def test_every_finding_has_the_contract_fields(tmp_path):
    two_numa_nodes(tmp_path)
    for f in findings(tmp_path, NUMA_GPUS, vfio_wanted=True):
        assert set(f) == {"code", "severity", "device", "devices", "message", "fix"}
        assert f["severity"] in pf.SEVERITIES and f["message"].strip() and f["fix"].strip()


def test_clean_switch_host_has_only_the_acs_and_hugepage_findings(tmp_path):
    two_gpus_one_switch(tmp_path)
    assert codes(findings(tmp_path, SWITCH_GPUS)) == ["acs_redirect", "no_hugepages"]


def test_acs_redirect_between_gpus_under_one_switch(tmp_path):
    two_gpus_one_switch(tmp_path)
    f = one(findings(tmp_path, SWITCH_GPUS), "acs_redirect")
    assert f["severity"] == "warning"
    assert f["devices"] == SWITCH_GPUS + ["0000:02:00.0", "0000:02:01.0"]
    assert "(PIX)" in f["message"] and "root complex" in f["message"]
    # the fix names the real controls on exactly these ports; pci=noacs is no kernel option
    assert "exactly 0000:02:00.0, 0000:02:01.0 with gpufleet.inference.pcie_acs" in f["fix"]
    assert "pci=disable_acs_redir=" in f["fix"] and "tuning_myths.md" in f["fix"]
    assert "boot with pci=noacs" not in f["fix"]


def test_acs_redirect_is_info_when_vfio_is_wanted(tmp_path):
    two_gpus_one_switch(tmp_path, cmdline="intel_iommu=on iommu=pt", hugepages_2m=512)
    found = findings(tmp_path, SWITCH_GPUS, vfio_wanted=True)
    assert one(found, "acs_redirect")["severity"] == "info"
    assert codes(found, "warning") == [] and codes(found, "critical") == []


def test_no_acs_means_no_redirect_but_a_shared_group(tmp_path):
    two_gpus_one_switch(tmp_path, acs=False)
    found = findings(tmp_path, SWITCH_GPUS)
    assert "acs_redirect" not in codes(found)
    shared = [f for f in found if f["code"] == "iommu_group_shared"]
    assert [f["device"] for f in shared] == SWITCH_GPUS
    assert shared[0]["severity"] == "info"
    assert "also holds 0000:04:00.0 (3D controller)" in shared[0]["message"]
    assert [f["severity"] for f in findings(tmp_path, SWITCH_GPUS, vfio_wanted=True) if f["code"] == "iommu_group_shared"] == ["warning"] * 2


def test_iommu_group_shared_with_non_bridge_device(tmp_path):
    host = degraded_link(tmp_path, link_sta=(32.0, 16))
    group = int(host.real("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/iommu_group").resolve().name)
    host.add("0000:00:14.0", "pci0000:00", kind="pci", class_code="0x0c0330", vendor="0x8086", device="0xa36d", group=group)
    host.add("0000:01:00.1", "0000:00:01.0", class_code="0x040300", vendor="0x10de", device="0x22a3", group=group)
    found = findings(tmp_path, ["0000:01:00.0"], vfio_wanted=True)
    f = one(found, "iommu_group_shared")
    assert f["severity"] == "warning" and f["devices"] == ["0000:01:00.0", "0000:00:14.0"]
    assert "0000:00:14.0 (USB controller)" in f["message"] and "0000:01:00.1" not in f["message"]


def test_iommu_group_with_own_functions_only(tmp_path):
    host = degraded_link(tmp_path, link_sta=(32.0, 16))
    group = int(host.real("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/iommu_group").resolve().name)
    host.add("0000:01:00.1", "0000:00:01.0", class_code="0x040300", vendor="0x10de", device="0x22a3", group=group)
    assert "iommu_group_functions" not in codes(findings(tmp_path, ["0000:01:00.0"]))
    f = one(findings(tmp_path, ["0000:01:00.0"], vfio_wanted=True), "iommu_group_functions")
    assert f["severity"] == "info" and "0000:01:00.1" in f["message"]


def test_gpus_on_two_numa_nodes(tmp_path):
    two_numa_nodes(tmp_path)
    found = findings(tmp_path, NUMA_GPUS)
    f = one(found, "pair_sys_level")
    assert f["severity"] == "warning" and f["devices"] == NUMA_GPUS and "NUMA nodes (0 and 1)" in f["message"]
    irq = one(found, "irq_remote_numa")
    assert irq["device"] == "0000:97:00.0" and irq["severity"] == "warning"
    assert "4 of 4 MSI/MSI-X IRQs" in irq["message"] and "CPUs 0 outside its node's CPUs 8-15" in irq["message"]
    assert "8-15" in irq["fix"]


def test_local_irqs_give_no_irq_finding(tmp_path):
    two_numa_nodes(tmp_path, remote_irqs=False)
    found = findings(tmp_path, NUMA_GPUS)
    assert "irq_remote_numa" not in codes(found) and "pair_sys_level" in codes(found)


def test_unknown_numa_node_on_a_two_node_host(tmp_path):
    host = FakeHost(tmp_path, nodes={0: "0-7", 1: "8-15"})
    hb = host.host_bridge(numa_node=-1)
    host.add("0000:00:01.0", hb, kind="root_port")
    host.gpu("0000:01:00.0", "0000:00:01.0")
    f = one(findings(tmp_path, ["0000:01:00.0"]), "numa_node_unknown")
    assert f["severity"] == "info" and "NUMA node -1" in f["message"]


def test_degraded_width_is_critical(tmp_path):
    degraded_link(tmp_path, link_sta=(32.0, 8))
    f = one(findings(tmp_path, ["0000:01:00.0"]), "link_below_capability")
    assert f["severity"] == "critical" and f["device"] == "0000:01:00.0" and f["devices"] == ["0000:00:01.0", "0000:01:00.0"]
    assert "runs at 32 GT/s (Gen5) x8; both ends can do 32 GT/s (Gen5) x16 (31.51 of 63.02 GB/s" in f["message"]
    assert "idle" not in f["message"]


def test_degraded_speed_is_a_warning_with_the_idle_note(tmp_path):
    degraded_link(tmp_path, link_sta=(2.5, 16))
    f = one(findings(tmp_path, ["0000:01:00.0"]), "link_below_capability")
    assert f["severity"] == "warning" and "drop the link speed when idle" in f["message"]


def test_link_trained_at_the_slower_partner_is_not_degraded_but_capped(tmp_path):
    host = FakeHost(tmp_path)
    hb = host.host_bridge()
    host.add("0000:00:01.0", hb, kind="root_port", link_cap=(16.0, 8))
    host.gpu("0000:01:00.0", "0000:00:01.0", link_cap=(32.0, 16), link_sta=(16.0, 8))
    found = findings(tmp_path, ["0000:01:00.0"])
    assert "link_below_capability" not in codes(found)
    f = one(found, "link_capped")
    assert "can do 32 GT/s (Gen5) x16 but the port above it (0000:00:01.0) allows only 16 GT/s (Gen4) x8" in f["message"]


def test_slow_endpoint_below_fast_port_is_not_degraded_but_said(tmp_path):
    """The QEMU lab shape: root port 16 GT/s x16, endpoint 2.5 GT/s x1, link 2.5 x1. The port's
    LnkSta is below its LnkCap because the device is the limit: info, not a degraded link."""
    host = FakeHost(tmp_path)
    hb = host.host_bridge()
    host.add("0000:00:01.0", hb, kind="root_port", link_cap=(16.0, 16), link_sta=(2.5, 1))
    host.add("0000:01:00.0", "0000:00:01.0", class_code="0x010802", link_cap=(2.5, 1))
    found = findings(tmp_path, ["0000:01:00.0"])
    assert [c for c in codes(found) if c.startswith("link")] == ["link_limited_by_device"]
    f = one(found, "link_limited_by_device")
    assert f["severity"] == "info" and f["devices"] == ["0000:00:01.0", "0000:01:00.0"]
    assert "0000:00:01.0 can do 16 GT/s (Gen4) x16 but 0000:01:00.0 only 2.5 GT/s (Gen1) x1" in f["message"]


def test_degraded_link_is_not_also_called_device_limited(tmp_path):
    host = FakeHost(tmp_path)
    hb = host.host_bridge()
    host.add("0000:00:01.0", hb, kind="root_port", link_cap=(32.0, 16))
    host.gpu("0000:01:00.0", "0000:00:01.0", link_cap=(16.0, 16), link_sta=(16.0, 8))
    found = [c for c in codes(findings(tmp_path, ["0000:01:00.0"])) if c.startswith("link")]
    assert found == ["link_below_capability"]


def test_port_without_link_capability_is_unknown_not_capped(tmp_path):
    """QEMU's XIO3130 downstream ports report LnkCap "Speed unknown, Width x0" (the lab VM's real
    capture): nothing to judge by, which the audit says (info) instead of calling the links behind
    them capped at nothing. The root ports above a slower device are said to be device-limited."""
    root = load_capture("lab-vm-q35", tmp_path / "lab")
    found = findings(root, ["0000:01:00.0", "0000:05:00.0", "0000:06:00.0"])
    assert "link_capped" not in codes(found) and "link_below_capability" not in codes(found)
    assert {f["device"] for f in found if f["code"] == "link_cap_unknown"} == {"0000:04:00.0", "0000:04:01.0"}
    limited = {tuple(f["devices"]) for f in found if f["code"] == "link_limited_by_device"}
    assert limited == {("0000:00:04.0", "0000:01:00.0"), ("0000:00:06.0", "0000:03:00.0")}


def test_switch_internal_links_are_not_judged(tmp_path):
    host = two_gpus_one_switch(tmp_path)
    host.switch("0000:05:00.0", "0000:02:01.0", ["0000:06:00.0"], link_cap=(16.0, 16))
    host.gpu("0000:07:00.0", "0000:06:00.0", link_cap=(16.0, 16))
    model = build_model(HostFS(str(tmp_path)), ["0000:07:00.0"])
    links = pf.path_links(model, "0000:07:00.0")
    assert [(ln["device"], ln["partner"]) for ln in links] == [
        ("0000:01:00.0", "0000:00:01.0"), ("0000:05:00.0", "0000:02:01.0"), ("0000:07:00.0", "0000:06:00.0")]


def test_mps_below_what_the_path_supports(tmp_path):
    host = FakeHost(tmp_path)
    hb = host.host_bridge()
    host.add("0000:00:01.0", hb, kind="root_port", mps_supported=512, mps=128)
    host.gpu("0000:01:00.0", "0000:00:01.0", mps_supported=512, mps=128)
    f = one(findings(tmp_path, ["0000:01:00.0"]), "mps_below_path")
    assert f["severity"] == "warning" and f["devices"] == ["0000:00:01.0", "0000:01:00.0"]
    assert "supports MaxPayload 512 B" in f["message"] and "Set MaxPayload to 512" in f["fix"]


def test_mps_above_a_hops_capability_is_critical(tmp_path):
    host = FakeHost(tmp_path)
    hb = host.host_bridge()
    host.add("0000:00:01.0", hb, kind="root_port", mps_supported=256, mps=256)
    host.gpu("0000:01:00.0", "0000:00:01.0", mps_supported=512, mps=512)
    f = one(findings(tmp_path, ["0000:01:00.0"]), "mps_above_path")
    assert f["severity"] == "critical" and f["devices"] == ["0000:01:00.0"]


def test_mps_at_the_path_maximum_is_fine(tmp_path):
    host = FakeHost(tmp_path)
    hb = host.host_bridge()
    host.add("0000:00:01.0", hb, kind="root_port", mps_supported=512, mps=256)
    host.gpu("0000:01:00.0", "0000:00:01.0", mps_supported=256, mps=256)
    assert not [c for c in codes(findings(tmp_path, ["0000:01:00.0"])) if c.startswith("mps")]


@pytest.mark.parametrize("where", ["root_port", "gpu"])
def test_aspm_enabled_on_the_gpu_path(tmp_path, where):
    host = FakeHost(tmp_path, aspm_policy="powersave")
    hb = host.host_bridge()
    host.add("0000:00:01.0", hb, kind="root_port", aspm="L1" if where == "root_port" else "disabled")
    host.gpu("0000:01:00.0", "0000:00:01.0", aspm="L0s L1" if where == "gpu" else "disabled")
    f = one(findings(tmp_path, ["0000:01:00.0"]), "aspm_enabled")
    assert f["devices"] == (["0000:00:01.0"] if where == "root_port" else ["0000:01:00.0"])
    assert "kernel ASPM policy: powersave" in f["message"]
    assert "pcie_aspm=off does not turn ASPM off" in f["fix"] and "policy to performance" in f["fix"]


def test_hugepages_reserved_gives_no_finding(tmp_path):
    degraded_link(tmp_path, link_sta=(32.0, 16), hugepages_2m=1024)
    assert codes(findings(tmp_path, ["0000:01:00.0"])) == []


def test_no_hugepages_is_info_or_warning_with_vfio(tmp_path):
    degraded_link(tmp_path, link_sta=(32.0, 16), cmdline="iommu=pt")
    assert one(findings(tmp_path, ["0000:01:00.0"]), "no_hugepages")["severity"] == "info"
    assert one(findings(tmp_path, ["0000:01:00.0"], vfio_wanted=True), "no_hugepages")["severity"] == "warning"


def test_iommu_pt_missing_when_vfio_is_wanted(tmp_path):
    degraded_link(tmp_path, link_sta=(32.0, 16), cmdline="ro intel_iommu=on", hugepages_2m=8)
    assert "iommu_pt_missing" not in codes(findings(tmp_path, ["0000:01:00.0"]))
    f = one(findings(tmp_path, ["0000:01:00.0"], vfio_wanted=True), "iommu_pt_missing")
    assert f["severity"] == "warning" and f["device"] is None and "iommu=pt" in f["fix"]


def test_iommu_identity_groups_count_as_passthrough(tmp_path):
    host = degraded_link(tmp_path, link_sta=(32.0, 16), hugepages_2m=8)
    for group in host.real("/sys/kernel/iommu_groups").iterdir():
        (group / "type").write_text("identity\n")
    assert "iommu_pt_missing" not in codes(findings(tmp_path, ["0000:01:00.0"], vfio_wanted=True))


def test_iommu_off_when_vfio_is_wanted(tmp_path):
    degraded_link(tmp_path, link_sta=(32.0, 16), iommu=False, hugepages_2m=8)
    f = one(findings(tmp_path, ["0000:01:00.0"], vfio_wanted=True), "iommu_disabled")
    assert f["severity"] == "critical" and "intel_iommu=on" in f["fix"]


def test_aer_counters_and_status_bits(tmp_path):
    host = FakeHost(tmp_path, hugepages_2m=8)
    hb = host.host_bridge()
    host.add("0000:00:01.0", hb, kind="root_port", aer_correctable=1 << 0)
    host.gpu("0000:01:00.0", "0000:00:01.0")
    host.write("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/aer_dev_nonfatal", "CmpltTO 2\nTOTAL_ERR_NONFATAL 2")
    found = findings(tmp_path, ["0000:01:00.0"])
    by_dev = {f["device"]: f for f in found if f["code"] == "aer_errors"}
    assert by_dev["0000:00:01.0"]["severity"] == "info" and "status bits RxErr" in by_dev["0000:00:01.0"]["message"]
    assert by_dev["0000:01:00.0"]["severity"] == "warning" and "nonfatal 2" in by_dev["0000:01:00.0"]["message"]


def test_nvml_replays(tmp_path):
    degraded_link(tmp_path, link_sta=(32.0, 16), hugepages_2m=8)
    f = one(findings(tmp_path, ["0000:01:00.0"], nvml={"gpus": {"0000:01:00.0": {"pcie_replay_counter": 17}}}), "pcie_replays")
    assert "17 PCIe replays" in f["message"]


def test_short_config_as_non_root(tmp_path):
    host = FakeHost(tmp_path, hugepages_2m=8)
    hb = host.host_bridge()
    host.add("0000:00:01.0", hb, kind="root_port", config_size=64)
    host.gpu("0000:01:00.0", "0000:00:01.0", config_size=256)
    found = findings(tmp_path, ["0000:01:00.0"])
    short = {f["device"]: f["message"] for f in found if f["code"] == "config_short"}
    assert "capability list is cut off" in short["0000:00:01.0"]
    assert "extended capabilities (ACS, AER) are hidden" in short["0000:01:00.0"]


def test_unreadable_bridge_config(tmp_path):
    host = degraded_link(tmp_path, link_sta=(32.0, 16), hugepages_2m=8)
    cfg = host.real("/sys/devices/pci0000:00/0000:00:01.0/config")
    cfg.unlink()
    f = one(findings(tmp_path, ["0000:01:00.0"]), "config_unreadable")
    assert f["device"] == "0000:00:01.0" and "No such file" in f["message"]


def test_order_and_summary(tmp_path):
    degraded_link(tmp_path, link_sta=(32.0, 4))
    found = findings(tmp_path, ["0000:01:00.0"], vfio_wanted=True)
    ranks = [pf.SEVERITIES.index(f["severity"]) for f in found]
    assert ranks == sorted(ranks)
    assert pf.summary(found) == {"critical": 1, "warning": 2, "info": 0, "total": 3}


def test_dev_vm_audit_of_a_virtio_nic(tmp_path):
    """Conventional PCI, no IOMMU, no NUMA info, one node: only the host-wide hugepage note."""
    root = load_capture("dev-vm-firecracker", tmp_path / "root")
    assert codes(findings(root, ["0000:00:03.0", "0000:00:02.0"])) == ["no_hugepages"]
    assert codes(findings(root, ["0000:00:03.0"], vfio_wanted=True)) == ["iommu_disabled", "no_hugepages"]

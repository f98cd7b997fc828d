# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""health_compare: audits of fake sysfs trees (and a real capture) compared with their previous audit."""

from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import health as hc
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.modules import pcie_facts
from tests.unit.fakesysfs import FakeHost, load_capture, two_numa_nodes

CMDLINE = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet"
XID_LOG = """\
2026-12-01T20:01:02+0000 gpu-01 kernel: NVRM: Xid (PCI:0000:97:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
2026-12-01T20:01:03+0000 gpu-01 kernel: NVRM: Xid (PCI:0000:17:00): 13, pid=1234, Graphics Exception
2026-12-01T20:01:04+0000 gpu-01 kernel: nvme nvme0: something else
"""


def audit(root) -> dict:
    facts, _warnings = pcie_facts.gather(HostFS(str(root)), {"include_nvml": "never"})
    return facts


def degraded_host(root, irq_cpus: str, cmdline: str = CMDLINE) -> None:
    """two_numa_nodes after a bad day: the node-1 GPU gone, the node-0 GPU trained at Gen4 x8 with new correctable AER
    errors, its IRQs on ``irq_cpus``."""
    host = FakeHost(root, nodes={0: "0-7", 1: "8-15"}, cmdline=cmdline)
    hb0 = host.host_bridge(0, 0x16, numa_node=0)
    host.host_bridge(0, 0x96, numa_node=1)
    host.add("0000:16:01.0", hb0, kind="root_port", acs_cap=("SV", "RR", "CR", "UF"),
             acs_ctrl=("SV", "RR", "CR", "UF"), link_sta=(16.0, 8))
    host.gpu("0000:17:00.0", "0000:16:01.0", irq_cpus=irq_cpus, link_sta=(16.0, 8))
    host.write(f"{host.dirs['0000:17:00.0']}/aer_dev_correctable", "RxErr 0\nBadTLP 5\nBadDLLP 2\nTOTAL_ERR_COR 7")


def test_same_host_twice_has_no_findings(tmp_path):
    two_numa_nodes(tmp_path / "a", remote_irqs=False)
    two_numa_nodes(tmp_path / "b", remote_irqs=False)
    assert hc.compare(audit(tmp_path / "a"), audit(tmp_path / "b")) == []


def test_a_real_capture_against_itself_has_no_findings(tmp_path):
    a, b = load_capture("lab-vm-q35", tmp_path / "a"), load_capture("lab-vm-q35", tmp_path / "b")
    assert hc.compare(audit(a), audit(b)) == []


def test_changed_host_is_flagged_with_fixes(tmp_path):
    two_numa_nodes(tmp_path / "before", remote_irqs=False)
    # after: the node-1 GPU is gone, the node-0 GPU trained at Gen4 x8, its IRQs moved to CPU 8 (node 1),
    # its AER counters grew, and someone put pcie_aspm=off on the command line
    degraded_host(tmp_path / "after", irq_cpus="8", cmdline=CMDLINE + " pcie_aspm=off")
    findings = hc.compare(audit(tmp_path / "before"), audit(tmp_path / "after"), XID_LOG,
                          previous_kernel="6.1.0-50-cloud-amd64", current_kernel="6.1.0-56-cloud-amd64")
    got = {(f["code"], f["severity"], f["device"]) for f in findings}
    assert got == {
        ("xid", "critical", "0000:97:00.0"), ("xid", "warning", "0000:17:00.0"),
        ("gpu_missing", "critical", "0000:97:00.0"),
        ("link_degraded", "critical", "0000:17:00.0"), ("link_degraded", "critical", "0000:16:01.0"),
        ("aer_new", "warning", "0000:17:00.0"), ("irq_off_numa", "warning", "0000:17:00.0"),
        ("cmdline_changed", "warning", None), ("kernel_changed", "info", None)}
    by_code = {f["code"]: f for f in findings}
    assert "Gen4 (16GT/s) x8" in by_code["link_degraded"]["message"] and "was Gen5 (32GT/s) x16" in by_code["link_degraded"]["message"]
    assert "correctable.BadTLP +5" in by_code["aer_new"]["message"]
    assert "+pcie_aspm=off" in by_code["cmdline_changed"]["message"]
    assert all(f["fix"] for f in findings)
    assert [f["severity"] for f in findings] == sorted((f["severity"] for f in findings),
                                                       key=["critical", "warning", "info"].index)


def test_first_run_reports_only_xids(tmp_path):
    two_numa_nodes(tmp_path / "a", remote_irqs=False)
    findings = hc.compare(None, audit(tmp_path / "a"), XID_LOG)
    assert [f["code"] for f in findings] == ["xid", "xid"]


def test_a_link_that_trained_higher_is_info(tmp_path):
    from tests.unit.fakesysfs import degraded_link
    degraded_link(tmp_path / "a", link_sta=(16.0, 8))
    degraded_link(tmp_path / "b", link_sta=(32.0, 16))
    findings = hc.compare(audit(tmp_path / "a"), audit(tmp_path / "b"))
    assert {(f["code"], f["severity"]) for f in findings} == {("link_changed", "info")}


def test_xid_parser():
    xids = hc.parse_xids(XID_LOG)
    assert [(x["bdf"], x["xid"]) for x in xids] == [("0000:97:00.0", 79), ("0000:17:00.0", 13)]
    assert xids[0]["text"].startswith("pid=1234")


def _qemu_like(root, port_cap) -> None:
    """A root port above a GPU whose link status is fixed at 2.5GT/s x1 whatever the port offers (QEMU's
    emulated PCIe): only the port's capability tells a narrower port from the previous one."""
    from tests.unit.fakesysfs import FakeHost
    host = FakeHost(root)
    hb = host.host_bridge(0, 0)
    host.add("0000:00:04.0", hb, kind="root_port", link_cap=port_cap, link_sta=(2.5, 1))
    host.gpu("0000:01:00.0", "0000:00:04.0", link_cap=(2.5, 1), link_sta=(2.5, 1))


def test_a_narrower_root_port_is_flagged_though_the_link_reads_the_same(tmp_path):
    _qemu_like(tmp_path / "a", (16.0, 16))
    _qemu_like(tmp_path / "b", (16.0, 8))
    findings = hc.compare(audit(tmp_path / "a"), audit(tmp_path / "b"))
    assert [(f["code"], f["severity"], f["device"]) for f in findings] == [("link_cap_reduced", "critical", "0000:00:04.0")]
    assert "is Gen4 (16GT/s) x8 now, was Gen4 (16GT/s) x16" in findings[0]["message"]
    assert "bifurcation" in findings[0]["fix"]
    # and back: wider again is information, not an alarm
    back = hc.compare(audit(tmp_path / "b"), audit(tmp_path / "a"))
    assert [(f["code"], f["severity"]) for f in back] == [("link_cap_changed", "info")]


def test_a_link_degraded_with_its_port_reports_both(tmp_path):
    from tests.unit.fakesysfs import FakeHost
    degraded_a = FakeHost(tmp_path / "a")
    hb = degraded_a.host_bridge(0, 0)
    degraded_a.add("0000:00:01.0", hb, kind="root_port", link_cap=(32.0, 16))
    degraded_a.gpu("0000:01:00.0", "0000:00:01.0")
    degraded_b = FakeHost(tmp_path / "b")
    hb = degraded_b.host_bridge(0, 0)
    degraded_b.add("0000:00:01.0", hb, kind="root_port", link_cap=(16.0, 16))
    degraded_b.gpu("0000:01:00.0", "0000:00:01.0", link_sta=(16.0, 16))
    got = {(f["code"], f["device"]) for f in hc.compare(audit(tmp_path / "a"), audit(tmp_path / "b"))}
    assert got == {("link_degraded", "0000:00:01.0"), ("link_cap_reduced", "0000:00:01.0"),
                   ("link_degraded", "0000:01:00.0")}

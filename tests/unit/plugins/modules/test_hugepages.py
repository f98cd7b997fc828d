# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hugepages: execute() on a simulated kernel that may give fewer pages than asked, 1 GiB pages through the
command line across a simulated reboot, and main() through AnsibleModule."""

from __future__ import annotations


import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils.hugepages.hugepages import HugepagesError
from ansible_collections.gpufleet.inference.plugins.modules import hugepages
from tests.unit.fakesysfs import SimKernel, node_memory
from tests.unit.plugins.module_utils.test_hugepages import G1, GIB_KB, M2, two_node_host
from tests.unit.plugins.modules.uthelper import run_module


def params(**kw):
    base = {"pages_2m": None, "pages_1g": None, "nodes": [], "per_node": {}, "max_memory_percent": 80, "allow_partial": False,
            "method_1g": "cmdline"}
    base.update(kw)
    return base


def on(fs, warn=None) -> Host:
    """The Host of a run: its files; the module runs no command; warnings to ``warn`` (dropped by default)."""
    return Host(fs=fs, cmd=None, warn=warn or (lambda msg: None))


def set_pages(node, size, before, after) -> dict:
    """The action that writes one node's nr_hugepages of one size."""
    kb = {"2M": M2, "1G": G1}[size]
    return {"action": "set", "path": f"/sys/devices/system/node/node{node}/hugepages/hugepages-{kb}kB/nr_hugepages",
            "node": node, "size": size, "before": before, "after": after}


def nr(host, node, kb=M2) -> int:
    return int(host.real(f"/sys/devices/system/node/node{node}/hugepages/hugepages-{kb}kB/nr_hugepages").read_text())


def test_reserve_2m_on_every_node_reads_back_and_persists_as_sysctl(tmp_path):
    host = two_node_host(tmp_path)
    sim = SimKernel(host)
    result = hugepages.execute(params(pages_2m=1024), on(sim.fs()), False)
    assert result["changed"] is True
    assert result["actions"] == [set_pages(0, "2M", 0, 1024), set_pages(1, "2M", 0, 1024)]
    assert (nr(host, 0), nr(host, 1)) == (1024, 1024)
    assert result["nodes"]["1"]["pages"]["2M"] == {"before": 0, "wanted": 1024, "after": 1024, "free": 1024}
    assert result["nodes"]["0"]["limit_kb"] == 64 * GIB_KB * 80 // 100
    assert result["sysctl"] == {"vm.nr_hugepages": 2048} and result["cmdline_args"] == []
    assert (result["partial"], result["reboot_pending"], result["supported_sizes"]) == (False, False, ["2M", "1G"])
    sim.writes.clear()
    again = hugepages.execute(params(pages_2m=1024), on(sim.fs()), False)
    assert (again["changed"], again["actions"], sim.writes) == (False, [], [])


def test_check_mode_writes_nothing_and_predicts(tmp_path):
    host = two_node_host(tmp_path)
    sim = SimKernel(host)
    result = hugepages.execute(params(pages_2m=64, nodes=[1]), on(sim.fs()), True)
    assert sim.writes == [] and result["changed"] is True and nr(host, 1) == 0
    assert result["diff"] == {"before": "node 0 2M: 0\nnode 0 1G: 0\nnode 1 2M: 0\nnode 1 1G: 0\n",
                              "after": "node 0 2M: 0\nnode 0 1G: 0\nnode 1 2M: 64\nnode 1 1G: 0\n"}
    assert result["cmdline_args"] == ["hugepagesz=2M", "hugepages=0:0,1:64"] and result["sysctl"] is None


def test_fewer_pages_than_asked_fails_and_puts_the_counts_back(tmp_path):
    host = two_node_host(tmp_path, pages={0: {M2: 10}, 1: {M2: 10}})
    sim = SimKernel(host, hugepage_cap={(1, M2): 700})
    with pytest.raises(HugepagesError) as err:
        hugepages.execute(params(pages_2m=1024), on(sim.fs()), False)
    msg = str(err.value)
    assert msg.startswith("The kernel gave fewer huge pages than asked: node 1: 2M pages 700 of 1024 (free memory is fragmented")
    assert "The counts were put back as they were." in msg and "allow_partial: true" in msg
    assert (nr(host, 0), nr(host, 1)) == (10, 10)


def test_allow_partial_keeps_what_the_kernel_gave_and_says_so(tmp_path):
    host = two_node_host(tmp_path)
    sim = SimKernel(host, hugepage_cap={(1, M2): 700})
    warnings = []
    result = hugepages.execute(params(pages_2m=1024, allow_partial=True), on(sim.fs(), warnings.append), False)
    assert result["partial"] is True and result["shortfall"] == ["node 1: 2M pages 700 of 1024 (free memory is fragmented or short)"]
    assert result["nodes"]["1"]["pages"]["2M"]["after"] == 700 and nr(host, 1) == 700
    assert warnings and "700 of 1024" in warnings[0]


def test_memory_guard_refuses_before_any_write(tmp_path):
    host = two_node_host(tmp_path, mem_gib=(64, 8))
    sim = SimKernel(host)
    with pytest.raises(HugepagesError, match=r"Refusing to reserve huge pages on NUMA node 1: 4000 x 2M is 7.8 GiB, 98% of the "
                                             r"node's 8.0 GiB, above max_memory_percent 80 .*Nothing was changed\."):
        hugepages.execute(params(pages_2m=4000), on(sim.fs()), False)
    assert sim.writes == []
    assert hugepages.execute(params(pages_2m=4000, max_memory_percent=99), on(sim.fs()), True)["changed"] is True


def test_1g_pages_wait_for_a_reboot_then_are_checked(tmp_path):
    host = two_node_host(tmp_path)
    sim = SimKernel(host)
    before = hugepages.execute(params(pages_1g=4), on(sim.fs()), False)
    assert before["changed"] is False and sim.writes == []  # no runtime write for 1 GiB increases
    assert before["cmdline_args"] == ["hugepagesz=1G", "hugepages=8"] and before["reboot_pending"] is True
    # the reboot: the kernel booted with the arguments and gave every page
    host.write("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro hugepagesz=1G hugepages=8")
    for node in (0, 1):
        node_memory(host, node, 64 * GIB_KB, {G1: 4})
    after = hugepages.execute(params(pages_1g=4), on(sim.fs()), False)
    assert (after["changed"], after["reboot_pending"], after["partial"]) == (False, False, False)
    assert after["nodes"]["0"]["pages"]["1G"] == {"before": 4, "wanted": 4, "after": 4, "free": 4}


def test_a_boot_that_gave_fewer_1g_pages_fails_unless_partial(tmp_path):
    host = two_node_host(tmp_path, cmdline="BOOT_IMAGE=/vmlinuz ro hugepagesz=1G hugepages=8")
    node_memory(host, 0, 64 * GIB_KB, {G1: 4})
    node_memory(host, 1, 64 * GIB_KB, {G1: 1})
    sim = SimKernel(host)
    with pytest.raises(HugepagesError, match=r"booted with hugepagesz=1G hugepages=8 but gave fewer 1 GiB pages: node 1: 1G pages 1 of 4"):
        hugepages.execute(params(pages_1g=4), on(sim.fs()), False)
    result = hugepages.execute(params(pages_1g=4, allow_partial=True), on(sim.fs()), False)
    assert result["partial"] is True and result["reboot_pending"] is False


def test_1g_decrease_and_runtime_method_write_sysfs(tmp_path):
    host = two_node_host(tmp_path, pages={0: {G1: 4}, 1: {G1: 4}})
    sim = SimKernel(host)
    down = hugepages.execute(params(pages_1g=2), on(sim.fs()), False)
    assert down["actions"] == [set_pages(0, "1G", 4, 2), set_pages(1, "1G", 4, 2)] and nr(host, 0, G1) == 2
    up = hugepages.execute(params(pages_1g=3, method_1g="runtime"), on(sim.fs()), False)
    assert up["actions"] == [set_pages(0, "1G", 2, 3), set_pages(1, "1G", 2, 3)] and up["reboot_pending"] is False


def test_per_node_counts(tmp_path):
    host = two_node_host(tmp_path)
    sim = SimKernel(host)
    result = hugepages.execute(params(per_node={"0": {"pages_2m": 100}, "1": {"pages_2m": 300}}), on(sim.fs()), False)
    assert (nr(host, 0), nr(host, 1)) == (100, 300)
    assert result["cmdline_args"] == ["hugepagesz=2M", "hugepages=0:100,1:300"] and result["sysctl"] is None


@pytest.mark.parametrize("extra, message", [
    ({"per_node": {"zero": {"pages_2m": 1}}}, "per_node: 'zero' is not a NUMA node number"),
    ({"per_node": {"0": {"pages_4k": 1}}}, "per_node[0]: give a dictionary with pages_2m and/or pages_1g"),
    ({"per_node": {"0": {"pages_2m": "lots"}}}, "per_node[0].pages_2m='lots' is out of range: give a number from 0 to 4294967296 pages"),
    ({"pages_2m": 1, "max_memory_percent": 0}, "max_memory_percent must be between 1 and 100, got 0"),
    ({"pages_2m": 1, "nodes": [5]}, "NUMA node 5 does not exist on this host"),
    ({"pages_2m": 10 ** 9}, "Refusing to reserve huge pages on NUMA node 0"),
    # issue 31: a bool was written as "True" to nr_hugepages, 2**63 reached the kernel
    ({"pages_2m": True}, "pages_2m=True is out of range: give a number from 0 to 4294967296 pages"),
    ({"pages_1g": 2 ** 63}, "pages_1g=9223372036854775808 is out of range"),
    ({"per_node": {"0": {"pages_2m": -1}}}, "per_node[0].pages_2m=-1 is out of range"),
])
def test_main_bad_input_fails_cleanly_and_changes_nothing(tmp_path, capsys, extra, message):
    host = two_node_host(tmp_path)
    result = run_module(hugepages, dict({"root": str(host.root)}, **extra), capsys)
    assert result["failed"] is True and message in result["msg"] and result["changed"] is False
    assert (nr(host, 0), nr(host, 1)) == (0, 0)


def test_main_check_mode_with_diff(tmp_path, capsys):
    host = two_node_host(tmp_path)
    result = run_module(hugepages, {"root": str(host.root), "pages_2m": 8, "_ansible_check_mode": True, "_ansible_diff": True}, capsys)
    assert result["changed"] is True and "node 0 2M: 8" in result["diff"]["after"] and nr(host, 0) == 0
    assert result["meminfo"]["MemTotal"] == 263842412


def test_main_applies_on_a_plain_tree(tmp_path, capsys):
    """Without a kernel behind the tree the write simply lands; the read-back sees it."""
    host = two_node_host(tmp_path)
    result = run_module(hugepages, {"root": str(host.root), "pages_2m": 8}, capsys)
    assert result["changed"] is True and nr(host, 0) == nr(host, 1) == 8
    assert run_module(hugepages, {"root": str(host.root), "pages_2m": 8}, capsys)["changed"] is False

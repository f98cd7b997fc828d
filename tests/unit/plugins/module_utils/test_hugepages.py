# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hugepages module_utils: reading nodes, the per-node memory guard, plans and how reservations persist."""

from __future__ import annotations

import shutil

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.hugepages import hugepages as hp
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from tests.unit.fakesysfs import FakeHost, node_memory

GIB_KB = 1048576
M2, G1 = 2048, 1048576


def two_node_host(root, mem_gib=(64, 64), pages=None, **kw) -> FakeHost:
    """Two NUMA nodes with ``mem_gib`` GiB each; ``pages`` {node: {kb: n}}."""
    host = FakeHost(root, nodes={0: "0-7", 1: "8-15"}, **kw)
    for node, gib in enumerate(mem_gib):
        node_memory(host, node, gib * GIB_KB, (pages or {}).get(node))
    return host


def layout_of(host):
    return hp.read_layout(HostFS(str(host.root)))


def test_parse_node_meminfo():
    text = "Node 1 MemTotal:       65831324 kB\nNode 1 MemFree:        60000000 kB\nNode 1 HugePages_Total:     0\n"
    assert hp.parse_node_meminfo(text) == {"MemTotal": 65831324, "MemFree": 60000000, "HugePages_Total": 0}


def test_read_layout_numa(tmp_path):
    host = two_node_host(tmp_path, pages={1: {G1: 2}})
    node_memory(host, 2, 0, has_memory=False)
    layout = layout_of(host)
    assert layout["numa"] is True and layout["supported_kb"] == [M2, G1] and layout["default_kb"] == 2048
    assert layout["nodes"][0]["mem_total_kb"] == 64 * GIB_KB and layout["nodes"][2]["has_memory"] is False
    assert layout["nodes"][1]["sizes"][G1] == {"nr": 2, "free": 2, "surplus": 0}


def test_read_layout_without_numa_uses_the_global_files(tmp_path):
    host = FakeHost(tmp_path, hugepages_2m=16)
    shutil.rmtree(host.real("/sys/devices/system/node"))
    layout = layout_of(host)
    assert layout["numa"] is False and list(layout["nodes"]) == [0]
    assert layout["nodes"][0]["mem_total_kb"] == 263842412 and layout["nodes"][0]["sizes"][M2]["nr"] == 16
    assert hp.plan(layout, {0: {M2: 32}}, {M2})[0]["path"] == "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"


def test_desired_applies_counts_to_memory_nodes_with_overrides(tmp_path):
    host = two_node_host(tmp_path)
    node_memory(host, 2, 0, has_memory=False)
    layout = layout_of(host)
    assert hp.desired(layout, {M2: 512, G1: None}, [], None) == {0: {M2: 512}, 1: {M2: 512}}
    assert hp.desired(layout, {M2: 512, G1: 4}, [1], None) == {1: {M2: 512, G1: 4}}
    assert hp.desired(layout, {M2: 512, G1: None}, [], {1: {M2: 0, G1: 2}}) == {0: {M2: 512}, 1: {M2: 0, G1: 2}}


@pytest.mark.parametrize("pages, nodes, per_node, message", [
    ({M2: 1}, [7], None, "NUMA node 7 does not exist on this host (nodes: 0, 1, 2)"),
    ({M2: 1}, [2], None, "NUMA node 2 has no memory of its own"),
    ({M2: -1}, [], None, "2M pages on node 0: -1 is negative"),
    ({M2: None}, [], {9: {M2: 1}}, "NUMA node 9 does not exist"),
])
def test_desired_refuses_bad_requests(tmp_path, pages, nodes, per_node, message):
    host = two_node_host(tmp_path)
    node_memory(host, 2, 0, has_memory=False)
    with pytest.raises(hp.HugepagesError, match=message.replace("(", r"\(").replace(")", r"\)")):
        hp.desired(layout_of(host), pages, nodes, per_node)


def test_desired_refuses_a_size_the_kernel_lacks(tmp_path):
    host = two_node_host(tmp_path)
    shutil.rmtree(host.real("/sys/kernel/mm/hugepages/hugepages-1048576kB"))
    with pytest.raises(hp.HugepagesError, match=r"This kernel has no 1G huge pages .*pdpe1gb"):
        hp.desired(layout_of(host), {G1: 1}, [], None)


# ---- the guard -------------------------------------------------------------------------------------------------
def test_guard_allows_up_to_the_share_and_refuses_beyond(tmp_path):
    layout = layout_of(two_node_host(tmp_path, mem_gib=(64, 16)))
    limit_pages_node1 = 16 * GIB_KB * 80 // 100 // M2  # 6553 pages of 2 MiB
    assert hp.guard(layout, {1: {M2: limit_pages_node1}}, 80) == []
    problems = hp.guard(layout, {0: {M2: 1000}, 1: {M2: limit_pages_node1 + 1}}, 80)
    assert len(problems) == 1
    assert problems[0].startswith("Refusing to reserve huge pages on NUMA node 1: 6554 x 2M is 12.8 GiB, 80% of the node's "
                                  "16.0 GiB, above max_memory_percent 80 (12.8 GiB). At most 6553 pages of 2M fit")


def test_guard_counts_sizes_it_does_not_manage(tmp_path):
    layout = layout_of(two_node_host(tmp_path, mem_gib=(16, 16), pages={0: {G1: 10}}))  # 10 GiB already in 1 GiB pages
    problems = hp.guard(layout, {0: {M2: 2048}}, 80)  # + 4 GiB = 14 GiB of 16
    assert "10 x 1G" in problems[0] and "At most 1433 pages of 2M fit" in problems[0]
    assert hp.guard(layout, {0: {M2: 1433}}, 80) == []
    assert hp.guard(layout, {0: {M2: 2048, G1: 0}}, 80) == []  # giving the 1 GiB pages back makes room


def test_guard_without_node_memory_refuses(tmp_path):
    host = two_node_host(tmp_path)
    host.real("/sys/devices/system/node/node1/meminfo").unlink()
    assert "MemTotal is unknown" in hp.guard(layout_of(host), {1: {M2: 1}}, 80)[0]


# ---- plans and persistence -------------------------------------------------------------------------------------------
def test_plan_writes_decreases_first(tmp_path):
    layout = layout_of(two_node_host(tmp_path, pages={0: {M2: 100}, 1: {M2: 0}}))
    actions = hp.plan(layout, {0: {M2: 10}, 1: {M2: 50}}, {M2})
    assert [(a["node"], a["before"], a["after"]) for a in actions] == [(0, 100, 10), (1, 0, 50)]
    assert actions[1]["path"] == "/sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages"
    assert hp.plan(layout, {0: {M2: 100}}, {M2}) == []
    assert hp.plan(layout, {0: {G1: 4}}, {M2}) == []  # 1 GiB not at runtime


def test_persistence_even_2m_is_a_sysctl(tmp_path):
    layout = layout_of(two_node_host(tmp_path))
    assert hp.persistence(layout, {0: {M2: 512}, 1: {M2: 512}}) == {"sysctl": {"vm.nr_hugepages": 1024}, "cmdline_args": []}


def test_persistence_uneven_2m_and_1g_are_kernel_arguments(tmp_path):
    layout = layout_of(two_node_host(tmp_path))
    assert hp.persistence(layout, {0: {M2: 512}}) == {
        "sysctl": None, "cmdline_args": ["hugepagesz=2M", "hugepages=0:512,1:0"]}
    assert hp.persistence(layout, {0: {G1: 4}, 1: {G1: 4}}) == {"sysctl": None, "cmdline_args": ["hugepagesz=1G", "hugepages=8"]}
    both = hp.persistence(layout, {0: {G1: 2, M2: 100}, 1: {G1: 0, M2: 100}})
    assert both == {"sysctl": {"vm.nr_hugepages": 200}, "cmdline_args": ["hugepagesz=1G", "hugepages=0:2,1:0"]}
    assert hp.persistence(layout, {0: {G1: 0}, 1: {G1: 0}}) == {"sysctl": None, "cmdline_args": []}


def test_persistence_when_the_default_size_is_1g(tmp_path):
    host = two_node_host(tmp_path)
    text = host.real("/proc/meminfo").read_text().replace("Hugepagesize:       2048 kB", "Hugepagesize:    1048576 kB")
    host.real("/proc/meminfo").write_text(text)
    assert hp.persistence(layout_of(host), {0: {M2: 8}, 1: {M2: 8}}) == {
        "sysctl": None, "cmdline_args": ["hugepagesz=2M", "hugepages=16"]}


def test_booted_with_needs_each_pair_adjacent():
    cmdline = "BOOT_IMAGE=/vmlinuz root=UUID=x ro hugepagesz=1G hugepages=8 quiet"
    assert hp.booted_with(cmdline, ["hugepagesz=1G", "hugepages=8"]) is True
    assert hp.booted_with(cmdline, ["hugepagesz=1G", "hugepages=16"]) is False
    assert hp.booted_with("hugepages=8 hugepagesz=1G", ["hugepagesz=1G", "hugepages=8"]) is False
    assert hp.booted_with(cmdline, []) is False

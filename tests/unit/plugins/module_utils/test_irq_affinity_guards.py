# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""irq_affinity guards on fake trees: isolated CPUs (sysfs isolated, nohz_full, isolcpus= on the
command line) are never pinned to, a reversed CPU range is refused, a memory-only NUMA node is named."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.irq import affinity as ia
from tests.unit.plugins.module_utils.test_irq_affinity import G0, G1, numa_host, settings, walker_for


@pytest.mark.parametrize("text,why", [("7-0", "'7-0' is a reversed range \\(write 0-7\\)"), ("3-", "'3-' is not a CPU"),
                                      ("a-3", "'a-3' is not a CPU"), ("0-3,9-8", "'9-8' is a reversed range")])
def test_reversed_or_broken_ranges_are_refused(text, why):
    with pytest.raises(ia.IrqError, match=f"cpus: '{text}' is not a CPU list \\({why}"):
        ia.parse_cpu_option(text, list(range(16)), "cpus")


def test_parse_isolcpus_with_flags_and_nohz_full():
    got = ia.parse_isolcpus("ro isolcpus=managed_irq,domain,2-5,7 nohz_full=12-13 rcu_nocbs=12-13")
    assert got == {"isolcpus= on the kernel command line": [2, 3, 4, 5, 7], "nohz_full= on the kernel command line": [12, 13]}
    assert ia.parse_isolcpus("ro quiet") == {}


@pytest.mark.parametrize("where,cpus", [("/sys/devices/system/cpu/isolated", "2-3"), ("/sys/devices/system/cpu/nohz_full", "2-3"),
                                        ("/proc/cmdline", "BOOT_IMAGE=/vmlinuz ro isolcpus=nohz,domain,2-3")])
def test_isolated_cpus_of_the_node_are_left_out(tmp_path, where, cpus):
    host = numa_host(tmp_path)
    host.write(where, cpus)
    resolved, warnings = ia.resolve_cpus(walker_for(host), {G0: settings(), G1: settings()})
    assert resolved[G0]["cpus"] == [0, 1, 4, 5, 6, 7] and resolved[G1]["cpus"] == list(range(8, 16))
    assert warnings and "isolated CPUs 2-3 of its node are left out" in warnings[0]
    with pytest.raises(ia.IrqError, match="cpus: 2-3 includes isolated CPUs \\(2-3 in .*never pinned there"):
        ia.resolve_cpus(walker_for(host), {G0: settings(cpus="2-3")})


def test_nohz_full_null_means_none(tmp_path):
    host = numa_host(tmp_path)
    host.write("/sys/devices/system/cpu/nohz_full", "(null)")
    host.write("/sys/devices/system/cpu/isolated", "")
    resolved, warnings = ia.resolve_cpus(walker_for(host), {G0: settings()})
    assert resolved[G0]["cpus"] == list(range(8)) and warnings == []


def test_a_node_all_isolated_leaves_no_cpu_and_says_why(tmp_path):
    host = numa_host(tmp_path)
    host.write("/sys/devices/system/cpu/isolated", "0-7")
    with pytest.raises(ia.IrqError, match="No CPU is left for the interrupts of 0000:17:00.0.*isolated CPUs 0-7 are never used"):
        ia.resolve_cpus(walker_for(host), {G0: settings()})


def test_memory_only_numa_node_is_named(tmp_path):
    host = numa_host(tmp_path)
    host.write("/sys/devices/system/node/node2/cpulist", "")  # a CXL memory expander's node
    host.write(f"{host.dirs[G1]}/numa_node", "2")
    with pytest.raises(ia.IrqError, match="NUMA node 2 of 0000:97:00.0 is a memory-only node.*nodes with CPUs: 0, 1"):
        ia.resolve_cpus(walker_for(host), {G1: settings()})
    resolved, _w = ia.resolve_cpus(walker_for(host), {G1: settings(numa_node=1)})
    assert resolved[G1]["cpus"] == list(range(8, 16))

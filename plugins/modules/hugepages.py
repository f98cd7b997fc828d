#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hugepages
short_description: Reserve 2 MiB and 1 GiB huge pages per NUMA node, behind a memory guard
version_added: 0.1.0
description:
  - Reserves 2 MiB huge pages at runtime on each NUMA node through
    C(/sys/devices/system/node/nodeN/hugepages/hugepages-2048kB/nr_hugepages). Decreases are written before increases.
  - 1 GiB pages are reserved through the kernel command line by default (O(method_1g=cmdline)). A running system seldom
    has whole free gigabytes. The module computes the arguments (RV(cmdline_args)) and says whether a reboot is
    still pending (RV(reboot_pending)). The C(gpufleet.inference.hugepages) role passes them to
    M(gpufleet.inference.kernel_cmdline).
  - The memory guard refuses, before any write, a reservation above O(max_memory_percent) of a node's C(MemTotal).
    It counts every page size, so sizes that are not managed count at what they hold now.
  - Reads every count back. The kernel may give fewer pages than asked when memory is fragmented. The module then
    fails, after putting the counts back as they were, unless O(allow_partial=true). RV(nodes) always shows what the
    kernel really gave. A boot that gave fewer 1 GiB pages than the command line asked for is reported the same way.
  - Returns how the reservation survives a reboot. That is the sysctl C(vm.nr_hugepages) (RV(sysctl)) when every node
    gets the same number of 2 MiB pages; otherwise, and for 1 GiB pages, kernel arguments (RV(cmdline_args)). The
    role writes both.
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - Linux with sysfs. Run as root.
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  pages_2m:
    description: Number of 2 MiB pages on each node of O(nodes). Leave it unset to leave 2 MiB pages as they are.
    type: int
  pages_1g:
    description: Number of 1 GiB pages on each node of O(nodes). Leave it unset to leave 1 GiB pages as they are.
    type: int
  nodes:
    description: NUMA nodes that O(pages_2m) and O(pages_1g) apply to. Empty means every node with memory.
    type: list
    elements: int
    default: []
  per_node:
    description:
      - Counts for single nodes, overriding O(pages_2m) and O(pages_1g) there. Keys are node numbers. Values are
        dictionaries with C(pages_2m) and/or C(pages_1g).
    type: dict
    default: {}
  max_memory_percent:
    description: The most of a node's C(MemTotal), in percent, that huge pages of all sizes may take.
    type: int
    default: 80
  allow_partial:
    description: Accept fewer pages than asked (warn instead of failing and putting the counts back).
    type: bool
    default: false
  method_1g:
    description:
      - V(cmdline) reserves 1 GiB pages at boot only. Runtime writes for that size only lower the count.
      - V(runtime) also writes increases at runtime. This works only while the node has whole free gigabytes.
    type: str
    choices: [cmdline, runtime]
    default: cmdline
notes:
  - 2 MiB persistence uses C(vm.nr_hugepages), which counts pages of the default size. When C(default_hugepagesz) is
    not 2 MiB, or nodes get different counts, the module uses C(hugepagesz=2M hugepages=0:N,1:M) instead. The per-node
    form needs kernel 5.16 or later.
seealso:
  - name: HugeTLB pages
    description: The kernel's documentation of the sysfs files and boot parameters.
    link: https://docs.kernel.org/admin-guide/mm/hugetlbpage.html
"""

EXAMPLES = r"""
- name: Reserve 4096 x 2 MiB pages on every node
  gpufleet.inference.hugepages:
    pages_2m: 4096
  become: true
  register: hp

- name: Reserve 16 x 1 GiB pages on node 1 only (applied at the next boot)
  gpufleet.inference.hugepages:
    pages_1g: 16
    nodes: [1]
  become: true
  register: hp1g

- name: Put the 1 GiB reservation on the kernel command line
  gpufleet.inference.kernel_cmdline:
    owner: hugepages
    args: "{{ hp1g.cmdline_args }}"
    state: present
  become: true

- name: Different counts per node, accepting what the kernel can give now
  gpufleet.inference.hugepages:
    per_node:
      0: {pages_2m: 8192}
      1: {pages_2m: 2048}
    allow_partial: true
  become: true
"""

RETURN = r"""
actions:
  description:
    - The writes done (or that would be done in check mode), decreases first. Each is C(action=set) with the C(path) of
      the C(nr_hugepages) file, the NUMA C(node), the page C(size) (V(2M) or V(1G)), and the page count C(before) and
      C(after).
  returned: always
  type: list
  elements: dict
  sample: [{action: set, path: /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages, node: 0, size: 2M,
            before: 0, after: 4096},
           {action: set, path: /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages, node: 1, size: 2M,
            before: 0, after: 4096}]
nodes:
  description: Per NUMA node, its memory, the guard's limit and, per page size, the count before, wanted and after.
  returned: success
  type: dict
  sample: {"0": {mem_total_kb: 131890012, limit_kb: 105512009,
                 pages: {2M: {before: 0, wanted: 4096, after: 4096, free: 4096}, 1G: {before: 0, wanted: null, after: 0, free: 0}}}}
cmdline_args:
  description: Kernel arguments that make the reservation survive a reboot (1 GiB pages; 2 MiB pages when the sysctl cannot).
  returned: success
  type: list
  elements: str
  sample: [hugepagesz=1G, hugepages=16]
sysctl:
  description: The persistent sysctl for 2 MiB pages, or null when kernel arguments carry them (or they are not managed).
  returned: success
  type: dict
  sample: {vm.nr_hugepages: 8192}
reboot_pending:
  description: 1 GiB pages are asked for that the running kernel was not booted for; they come after a reboot.
  returned: success
  type: bool
partial:
  description: The kernel gave fewer pages than asked, and O(allow_partial) accepted it.
  returned: success
  type: bool
shortfall:
  description: Where the kernel gave fewer pages than asked.
  returned: success
  type: list
  elements: str
  sample: ["node 1: 2M pages 3712 of 4096 (memory fragmented)"]
supported_sizes:
  description: Page sizes this kernel offers.
  returned: success
  type: list
  elements: str
  sample: [2M, 1G]
meminfo:
  description: Huge page lines of C(/proc/meminfo) after the run (counts, sizes in kB).
  returned: success
  type: dict
  sample: {MemTotal: 263842412, HugePages_Total: 8192, HugePages_Free: 8192, HugePages_Rsvd: 0, HugePages_Surp: 0,
           Hugepagesize: 2048, Hugetlb: 16777216}
diff:
  description: Counts per node before and after, in diff mode.
  returned: when diff mode is on and something changes
  type: dict
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.hugepages.hugepages import HugepagesError, execute

ARGUMENT_SPEC = dict(
    root=dict(type="path", default="/"),
    pages_2m=dict(type="int"),
    pages_1g=dict(type="int"),
    nodes=dict(type="list", elements="int", default=[]),
    per_node=dict(type="dict", default={}),
    max_memory_percent=dict(type="int", default=80),
    allow_partial=dict(type="bool", default=False),
    method_1g=dict(type="str", choices=["cmdline", "runtime"], default="cmdline"),
)


def main():
    run_module(ModuleSpec("hugepages", ARGUMENT_SPEC, "reads and writes sysfs", (HugepagesError,)), execute)


if __name__ == "__main__":
    main()

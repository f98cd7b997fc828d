#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cpu_placement
short_description: Place the vLLM service on the CPUs of its GPUs' NUMA node, away from the pinned interrupts
version_added: 0.3.0
description:
  - Reads each GPU's NUMA node (C(/sys/bus/pci/devices/BDF/numa_node)), the node's online CPUs
    (C(/sys/devices/system/node/nodeN/cpulist)) and, with O(exclude_irq_cpus), the CPUs that serve the interrupts of the
    functions the C(gpufleet.inference.irq_affinity) role pinned (C(/etc/gpufleet/irq_affinity.json), their
    C(/proc/irq/N/smp_affinity_list)).
  - Writes C(CPUAffinity) (the node's CPUs less the IRQ CPUs), C(NUMAPolicy) and C(NUMAMask) into one systemd drop-in of
    O(unit), reads it back and, on the live host, runs C(systemctl daemon-reload) and checks what systemd shows for the
    unit. The drop-in survives reboots; O(state=absent) removes it. The service takes the placement when it restarts
    (RV(restart_needed); the C(gpufleet.inference.cpu_tuning) role's handler restarts it).
  - A GPU that reports no NUMA node (C(-1), as in a VM) is placed on the host's only node; on a host of several nodes the
    module asks for O(nodes).
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  state:
    description: V(present) writes the drop-in; V(absent) removes it.
    type: str
    choices: [present, absent]
    default: present
  unit:
    description: The vLLM service (the C(gpufleet.inference.vllm_service) role's C(vllm_service_name) plus C(.service)).
    type: str
    default: vllm.service
  gpus:
    description: The GPUs' PCI addresses; default every display-class function (class 03xx) but BMC video.
    type: list
    elements: str
  nodes:
    description: The NUMA nodes to place the service on, instead of the GPUs' own.
    type: list
    elements: int
  numa_policy:
    description: The unit's C(NUMAPolicy) over the nodes (V(preferred) takes one node).
    type: str
    choices: [preferred, bind, interleave]
    default: preferred
  exclude_irq_cpus:
    description: Leave out the CPUs that serve the interrupts irq_affinity pinned.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: vLLM on its GPUs' node, away from their interrupts
  gpufleet.inference.cpu_placement:
    unit: vllm.service
  become: true
  notify: Restart vLLM
"""

RETURN = r"""
actions:
  description: The drop-in written or removed and the daemon-reload, or what would be done in check mode.
  returned: always
  type: list
  elements: dict
  sample: [{action: create, path: /etc/systemd/system/vllm.service.d/50-gpufleet-cpu-placement.conf, after: "0644"}]
unit_settings:
  description: The unit's settings the drop-in holds.
  returned: success
  type: dict
  sample: {CPUAffinity: "2-15", NUMAPolicy: preferred, NUMAMask: "0"}
gpus:
  description: Each GPU and its NUMA node (null when the firmware gives none).
  returned: success
  type: dict
  sample: {"0000:17:00.0": 0}
nodes:
  description: The NUMA nodes the service is placed on.
  returned: success
  type: list
  elements: int
  sample: [0]
cpus:
  description: The CPUs the service may run on.
  returned: success
  type: str
  sample: "2-15"
irq_cpus:
  description: The CPUs left out for the pinned interrupts.
  returned: success
  type: str
  sample: "0-1"
irq_devices:
  description: The pinned functions whose interrupts were read.
  returned: success
  type: list
  elements: str
  sample: ["0000:17:00.0"]
dropin:
  description: The drop-in's path.
  returned: success
  type: str
  sample: /etc/systemd/system/vllm.service.d/50-gpufleet-cpu-placement.conf
systemd_reads:
  description: What C(systemctl show) reports for the unit after the change (C(LoadState) C(not-found) when it is not installed).
  returned: on the live host (root C(/)), not in check mode
  type: dict
  sample: {LoadState: loaded, CPUAffinity: "2-15", NUMAPolicy: preferred, NUMAMask: "0"}
restart_needed:
  description: Whether the service must restart to run with the new placement.
  returned: success
  type: bool
  sample: true
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.cpu.cpu_placement import PlacementError, execute

ARGUMENT_SPEC = dict(
    state=dict(type="str", choices=["present", "absent"], default="present"),
    unit=dict(type="str", default="vllm.service"),
    gpus=dict(type="list", elements="str"),
    nodes=dict(type="list", elements="int"),
    numa_policy=dict(type="str", choices=["preferred", "bind", "interleave"], default="preferred"),
    exclude_irq_cpus=dict(type="bool", default=True),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("cpu_placement", ARGUMENT_SPEC, "reads the NUMA topology and writes the vLLM unit's drop-in",
                          (PlacementError,)), execute)


if __name__ == "__main__":
    main()

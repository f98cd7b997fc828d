#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: irq_affinity
short_description: Pin a PCI function's MSI/MSI-X interrupts to CPUs of its NUMA node, alongside irqbalance
version_added: 0.1.0
description:
  - Finds the MSI/MSI-X vectors of each function (C(/sys/bus/pci/devices/<bdf>/msi_irqs)). Sets
    C(/proc/irq/N/smp_affinity_list) to CPUs local to the function's NUMA node, one vector per CPU, round robin.
    O(cpus) narrows the choice to an allow-list and O(housekeeping_cpus) keeps CPUs free.
  - Never pins to isolated CPUs (C(/sys/devices/system/cpu/isolated), C(/sys/devices/system/cpu/nohz_full),
    C(isolcpus=) and C(nohz_full=) on the kernel command line). They are left out of a node's CPUs, and O(cpus) that
    names one fails. A reversed CPU range (C(7-0)) fails. A function whose NUMA node has no CPUs (a memory-only node,
    CXL or HBM) fails with the node named; set O(numa_node) for it.
  - Functions that share the same CPUs start their round robin at different CPUs, evenly apart, so their first
    vectors do not all land on one CPU.
  - Reads every value back after writing it. A vector whose write the kernel answers with C(EIO) is kernel-managed
    (NVMe I/O queues, for example). It is reported as managed and left alone, not failed. Any other failure puts the
    vectors already changed back and fails.
  - Keeps irqbalance running. With O(irqbalance=policyscript) (the default), irqbalance's C(--policyscript) bans the
    pinned functions' IRQs by device path, which stays valid when IRQ numbers change. With V(banned_cpus), the CPUs
    used go into C(IRQBALANCE_BANNED_CPULIST). Either way only the module's own part of the irqbalance environment
    file changes. RV(irqbalance.restart_required) says when irqbalance must be restarted, and
    RV(irqbalance.present) reports when irqbalance is not installed.
  - With O(persist), the function and its settings go to C(/etc/gpufleet/irq_affinity.json). With O(install_reapply)
    as well, the same run installs what re-applies the pinning from that file at boot and whenever a driver binds the
    function again (the kernel resets affinity when a driver re-requests its vectors, and the new vectors get new
    numbers). That is the script C(/usr/local/libexec/gpufleet-irq-affinity-apply), which carries the module's own
    module_utils, the units C(gpufleet-irq-affinity.service) (enabled) and C(gpufleet-irq-affinity@.service), and the
    udev rule C(/etc/udev/rules.d/90-gpufleet-irq-affinity.rules). With O(reapply_interval), a timer is added. Each file
    is read back and shown in the diff. The C(gpufleet.inference.irq_affinity) role uses this.
  - Reports per IRQ the affinity before and after, the NUMA node, and whether it was served remotely.
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - Linux with sysfs and procfs. Run as root.
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  devices:
    description:
      - PCI functions whose interrupts to pin. Give addresses (C(0000:3b:00.0)) or vendor:device IDs (C(10de:2335)) for
        every function with that ID.
      - An empty list is accepted only with O(exclusive=true). It then drops every function from the re-apply
        configuration and the irqbalance ban, and leaves the interrupts where they are.
    type: list
    elements: str
    required: true
  state:
    description:
      - V(present) pins the vectors. V(absent) sets them back to the kernel's default affinity
        (C(/proc/irq/default_smp_affinity)), and with O(persist) drops the functions from the re-apply configuration
        and from the irqbalance ban.
    type: str
    choices: [present, absent]
    default: present
  cpus:
    description:
      - Allow-list of CPUs (C(0-15,32-47)). Only CPUs that are also on the function's NUMA node are used, unless
        O(allow_remote=true). Empty means every CPU of the node.
    type: str
    default: ''
  housekeeping_cpus:
    description: CPUs never used for these interrupts (C(0,1)), for example those that serve the system's other work.
    type: str
    default: ''
  policy:
    description:
      - V(spread) puts one vector per CPU, round robin. V(node) lets every vector run on any CPU of the node.
    type: str
    choices: [spread, node]
    default: spread
  numa_node:
    description:
      - NUMA node to use instead of the function's C(numa_node). Use it when the firmware reports C(-1).
    type: int
  allow_remote:
    description: When O(cpus) has no CPU on the function's node, use O(cpus) anyway instead of failing.
    type: bool
    default: false
  allow_no_irqs:
    description:
      - Do not fail for a function without MSI/MSI-X vectors. The NVIDIA driver enables them only when the GPU is
        opened. The function is still recorded with O(persist), so the re-apply unit pins it when vectors appear.
    type: bool
    default: false
  irqbalance:
    description:
      - How irqbalance is kept off the pinned interrupts. V(policyscript) writes
        C(/usr/local/libexec/gpufleet-irqbalance-policy) and adds C(--policyscript) to C(IRQBALANCE_ARGS). V(banned_cpus)
        manages one marked C(IRQBALANCE_BANNED_CPULIST) line. V(none) leaves irqbalance alone.
      - Nothing is written when irqbalance is not installed. RV(irqbalance.present) then is false.
    type: str
    choices: [policyscript, banned_cpus, none]
    default: policyscript
  irqbalance_config:
    description:
      - irqbalance's environment file. By default C(/etc/default/irqbalance) (Debian, Ubuntu), or
        C(/etc/sysconfig/irqbalance) (EL) when only that exists.
    type: path
  persist:
    description:
      - Record the functions and settings in C(/etc/gpufleet/irq_affinity.json) for the re-apply script of the
        C(gpufleet.inference.irq_affinity) role. Offsets are then computed over every function in that file, the same
        way the script computes them.
    type: bool
    default: false
  exclusive:
    description:
      - The functions of this call are the only pinned ones. Others are dropped from the re-apply configuration and the
        irqbalance ban; their interrupts stay where they are until irqbalance moves them.
    type: bool
    default: false
  install_reapply:
    description:
      - Also install the boot-time and bind-time re-apply (needs O(persist)). The script and its two units are written
        when O(devices) is not empty and O(state=present). The udev rule and the enabled boot unit follow the functions
        the configuration holds; the rule is removed when it holds none. systemd is reloaded when a unit file changes,
        and the udev rules are reloaded when the rule changes.
      - Under a O(root) other than C(/), units are enabled with C(systemctl --root), and nothing that needs the running
        systemd or udev is done.
    type: bool
    default: false
  reapply_wait:
    description: Seconds the re-apply script waits for a function's vectors to appear and settle after a bind or boot.
    type: int
    default: 30
  reapply_interval:
    description:
      - Also re-apply periodically, every this systemd time span (C(10min)), through C(gpufleet-irq-affinity.timer).
        Empty removes the timer an earlier run installed.
    type: str
    default: ''
  reapply_python:
    description:
      - The host's Python 3.7 or later, the re-apply script's C(#!) line. By default C(/usr/bin/python3) when the host
        has it, else the interpreter of the module run.
    type: path
  legacy_libdir:
    description:
      - Where earlier versions copied the module_utils for the re-apply script. Its C(ansible_collections) directory is
        removed when the script is installed.
    type: path
notes:
  - C(systemctl is-active) is asked about the timer in check mode too (a read).
  - Kernel-managed vectors cannot be told from others without writing. After a real run the module remembers them in
    C(/run/gpufleet), so that check mode can then predict them.
seealso:
  - module: gpufleet.inference.pcie_facts
  - name: irqbalance(1)
    description: The C(--policyscript) and C(IRQBALANCE_BANNED_CPULIST) interfaces.
    link: https://github.com/Irqbalance/irqbalance
"""

EXAMPLES = r"""
- name: Pin every H200's interrupts to its own NUMA node, keeping CPUs 0-1 for housekeeping
  gpufleet.inference.irq_affinity:
    devices: ['10de:2335']
    housekeeping_cpus: '0-1'
    persist: true
  become: true
  register: pinned

- name: Show where each interrupt went
  ansible.builtin.debug:
    msg: "IRQ {{ item.irq }} of {{ item.bdf }}: {{ item.before }} -> {{ item.after }} (node {{ item.numa_node }}, remote before: {{ item.remote_before }})"
  loop: "{{ pinned.irqs }}"

- name: Pin a NIC's queues to an allow-list of CPUs, irqbalance told by banned CPUs
  gpufleet.inference.irq_affinity:
    devices: ['0000:5e:00.0']
    cpus: '16-31'
    irqbalance: banned_cpus
  become: true

- name: Pin a GPU's interrupts and install what re-applies them at boot and on driver bind (what the role does)
  gpufleet.inference.irq_affinity:
    devices: ['10de:2335']
    persist: true
    exclusive: true
    install_reapply: true
    reapply_interval: 10min
  become: true

- name: Give the interrupts back to the kernel's default and irqbalance
  gpufleet.inference.irq_affinity:
    devices: ['0000:5e:00.0']
    state: absent
    persist: true
  become: true
"""

RETURN = r"""
actions:
  description:
    - What the module did, or would do in check mode. An interrupt is C(action=pin) (O(state=present)) or C(action=reset)
      (O(state=absent)) with the C(path) of its C(smp_affinity_list), the C(irq) number, the C(device) it belongs to and
      the CPU list C(before) and C(after); a file is C(action=write) or C(action=remove) with its C(path) (the contents
      are in the diff). With O(install_reapply), also C(action=create), C(write), C(remove) or C(remove_tree) with a
      C(path), and C(action=daemon_reload), C(enable_unit), C(disable_unit), C(start_unit) or C(reload_udev_rules) with
      the C(unit) and the C(argv) run.
  returned: always
  type: list
  elements: dict
  sample: [{action: pin, path: /proc/irq/120/smp_affinity_list, irq: 120, device: "0000:3b:00.0", before: 0-15, after: "2"},
           {action: write, path: /etc/gpufleet/irq_affinity.pinned}]
irqs:
  description: One entry per vector of the functions.
  returned: success
  type: list
  elements: dict
  contains:
    irq:
      description: IRQ number.
      type: int
    bdf:
      description: PCI function.
      type: str
    mode:
      description: C(msix) or C(msi).
      type: str
    numa_node:
      description: NUMA node the function belongs to (null when unknown).
      type: int
    before:
      description: C(smp_affinity_list) before the run.
      type: str
    effective_before:
      description: C(effective_affinity_list) before the run (the CPU that really served it).
      type: str
    wanted:
      description: The affinity computed for it.
      type: str
    after:
      description: C(smp_affinity_list) read back after the run (in check mode, the value it has now).
      type: str
    remote_before:
      description: It was served by a CPU outside the function's NUMA node (null when the node is unknown).
      type: bool
    remote_after:
      description: Its affinity after the run leaves the node (only with O(allow_remote)).
      type: bool
    managed:
      description: The kernel manages its affinity (writes answer EIO); left alone. Null when not yet known.
      type: bool
    status:
      description: C(changed), C(ok), C(managed), C(change) (check mode) or C(failed).
      type: str
  sample: [{irq: 120, bdf: "0000:3b:00.0", mode: msix, numa_node: 0, before: 0-15, effective_before: "9", wanted: "2",
            after: "2", remote_before: false, remote_after: false, managed: false, status: changed}]
devices:
  description: Per function, the NUMA node, its local CPUs, the CPUs used and the number of vectors.
  returned: success
  type: list
  elements: dict
  sample: [{bdf: "0000:3b:00.0", numa_node: 0, local_cpus: 0-15, cpus: 2-15, vectors: 9, managed_vectors: 0, remote: false}]
irqbalance:
  description: irqbalance's presence, its environment file, the mode used, and whether it must be restarted.
  returned: success
  type: dict
  contains:
    present:
      description: irqbalance is installed.
      type: bool
    binary:
      description: Path of the irqbalance binary, null when absent.
      type: str
    config:
      description: irqbalance's environment file.
      type: str
    mode:
      description: O(irqbalance) as used.
      type: str
    restart_required:
      description: The ban changed; irqbalance must be restarted (if it runs) to read it.
      type: bool
    note:
      description: Why nothing was done for irqbalance (it is not installed), or null.
      type: str
  sample: {present: true, binary: /usr/sbin/irqbalance, config: /etc/default/irqbalance, mode: policyscript,
           restart_required: true, note: null}
persisted:
  description: The functions in the re-apply configuration after the run (empty unless O(persist)).
  returned: success
  type: list
  elements: str
  sample: ["0000:3b:00.0"]
reapply:
  description: With O(install_reapply), the re-apply as the run leaves it (in check mode, as it would leave it).
  returned: success and O(install_reapply)
  type: dict
  contains:
    script:
      description: Path of the re-apply script, null when it is not installed.
      type: str
    unit_enabled:
      description: C(gpufleet-irq-affinity.service) is enabled for boot.
      type: bool
    timer:
      description: The timer unit when O(reapply_interval) is set and functions are pinned, else null.
      type: str
    udev_rule:
      description: The udev rule's path while functions are pinned, else null.
      type: str
  sample: {script: /usr/local/libexec/gpufleet-irq-affinity-apply, unit_enabled: true, timer: null,
           udev_rule: /etc/udev/rules.d/90-gpufleet-irq-affinity.rules}
diff:
  description: Affinities and files before and after, in diff mode.
  returned: when diff mode is on and something changes
  type: list
  elements: dict
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.irq.affinity import IrqError
from ansible_collections.gpufleet.inference.plugins.module_utils.irq.irq_affinity import execute

ARGUMENT_SPEC = dict(
    root=dict(type="path", default="/"),
    devices=dict(type="list", elements="str", required=True),
    state=dict(type="str", choices=["present", "absent"], default="present"),
    cpus=dict(type="str", default=""),
    housekeeping_cpus=dict(type="str", default=""),
    policy=dict(type="str", choices=["spread", "node"], default="spread"),
    numa_node=dict(type="int"),
    allow_remote=dict(type="bool", default=False),
    allow_no_irqs=dict(type="bool", default=False),
    irqbalance=dict(type="str", choices=["policyscript", "banned_cpus", "none"], default="policyscript"),
    irqbalance_config=dict(type="path"),
    persist=dict(type="bool", default=False),
    exclusive=dict(type="bool", default=False),
    install_reapply=dict(type="bool", default=False),
    reapply_wait=dict(type="int", default=30),
    reapply_interval=dict(type="str", default=""),
    reapply_python=dict(type="path"),
    legacy_libdir=dict(type="path"),
)


def main():
    run_module(ModuleSpec("irq_affinity", ARGUMENT_SPEC, "reads sysfs and writes /proc/irq", (IrqError,)), execute)


if __name__ == "__main__":
    main()

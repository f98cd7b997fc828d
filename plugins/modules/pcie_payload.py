#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pcie_payload
short_description: Set PCIe MaxPayload and MaxReadRequest of GPUs and their path, safely, with read-back and restore
version_added: 0.1.0
description:
  - Sets MaxPayload Size (MPS) and MaxReadRequest Size (MRRS) in the PCI Express Device Control register of the GPUs (or the
    functions in O(devices)) with C(setpci), writing only the bits of the field (C(setpci -s BDF CAP_EXP+8.w=VALUE:MASK)).
  - "MPS follows the kernel's C(pcie_bus_safe) rule: every PCIe function below one root port (the root port, switch ports,
    the GPUs and their peers under the same switch) ends with one MaxPayload, never above the smallest that any of them
    supports. O(mps=max_safe) picks that value; a larger explicit value fails with a message that names the limiting
    device, and whether it is on the GPU's path or a peer."
  - Functions the task does not write (a NIC beside the GPUs, a bridge with O(include_path=false)) keep their value, which
    then fixes the value of their hierarchy; add them to O(devices) to change them together.
  - MRRS is a requester setting and is written on the listed devices only, within the PCIe encoding (128 to 4096 bytes)
    and never above O(mrrs_cap).
  - Writes top-down (root port, switch ports, endpoints, as the kernel does), reads every write back from the sysfs
    C(config) file, and fails when a device did not take the value (QEMU keeps these fields read-only), after rolling back
    what it wrote, so a failed run changes nothing.
  - Records the original values on the host (O(state_dir)) before the first write; O(state=default) restores them.
  - With O(persist=true) installs a systemd oneshot unit, C(gpufleet-pcie-payload.service), that re-applies the values at
    every boot through C(/usr/local/libexec/gpufleet-pcie-payload-apply /etc/gpufleet/pcie_payload.json). That script
    carries this module's own module_utils (the same capability walk, writes, read-back and per-hierarchy rollback), and
    names the interpreter the module runs under (C(/usr/bin/python3) when that is the same one).
  - A systemd oneshot unit rather than a udev rule, because the values of one hierarchy must be applied together and in
    order (root port before the switch ports before the GPUs) with a rollback when one does not take; udev runs C(RUN+=)
    programs per device, in parallel, in no fixed order, kills them after a timeout, and runs them again on every
    C(change) event or C(udevadm trigger). The unit runs once, before C(sysinit.target) and the GPU services, and its log
    is in the journal (C(journalctl -u gpufleet-pcie-payload)).
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - pciutils (C(setpci)) on the host; Linux with sysfs; root (C(become)).
  - systemd for O(persist=true); the boot script needs Python 3.7 or later (the interpreter the module runs under).
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  devices:
    description:
      - PCI addresses (C(0000:3b:00.0), or C(3b:00.0) for domain 0) of the functions to tune.
      - Default, every GPU as M(gpufleet.inference.pcie_facts) finds them (PCI class C(03), the BMC display controllers of
        ASPEED and Matrox left out); GPUs without a PCI Express capability are skipped with a warning. A listed function
        without one fails.
      - With O(state=default), the hierarchies of these devices are restored (default, every recorded device).
    type: list
    elements: str
    default: []
  mps:
    description:
      - MaxPayload Size. V(max_safe) for the largest value every function of the hierarchy supports, or a size in bytes
        (V(128), V(256), V(512), V(1024), V(2048), V(4096)). Omit it to leave MaxPayload alone.
    type: str
  mrrs:
    description: MaxReadRequest Size in bytes for the listed devices (128 to 4096, a power of two). Omit it to leave it alone.
    type: int
  mrrs_cap:
    description:
      - Upper bound on MaxReadRequest. The lower of O(mrrs) and this is written; without O(mrrs), a current value above
        the cap is lowered to it. For platforms whose root complex or firmware needs small read requests.
    type: int
  include_path:
    description:
      - Write the bridges on each device's path (root port, switch upstream and downstream ports) with the same MaxPayload.
      - With V(false) they keep their values, and MaxPayload can only be set to the value they hold.
    type: bool
    default: true
  state:
    description:
      - V(present) sets the values.
      - V(default) restores the original values recorded in O(state_dir) and removes the boot unit when no tuned device is
        left. O(mps), O(mrrs) and O(mrrs_cap) are ignored.
    type: str
    choices: [present, default]
    default: present
  persist:
    description:
      - Re-apply the values at every boot with the oneshot unit C(gpufleet-pcie-payload.service). The unit keeps every
        register the task manages, changed by this run or already right, so that a firmware or BIOS reset is undone at the
        next boot. V(false) removes the unit and its files when a previous run installed them.
    type: bool
    default: true
  on_readonly:
    description:
      - What to do when a device keeps a field read-only (the write succeeds, the value reads back unchanged).
      - V(fail) rolls back every write of the run and fails.
      - V(warn) rolls back the writes of that device's hierarchy only, warns, and goes on with the other hierarchies.
    type: str
    choices: [fail, warn]
    default: fail
  state_dir:
    description: Directory on the host (under O(root)) where the original values are recorded, as C(originals.json).
    type: path
    default: /var/lib/gpufleet/pcie_payload
  force:
    description:
      - Write live even when a process uses a device on the path (holds its C(/dev/nvidiaN), C(/dev/dri/renderD*) or
        C(/dev/dri/card*), or an open vfio group). Without it such a write is refused, with the holders named.
    type: bool
    default: false
  defer_to_boot:
    description:
      - Do not write live. Record the originals and persist the new values; the boot unit applies them at the next boot,
        before udev loads the GPU drivers and before the services start (the safe way on a busy host). Returns
        RV(reboot_required=true). Needs O(persist=true).
    type: bool
    default: false
notes:
  - A live write is refused while a process uses a device on the path (the holders are named in the message and in
    RV(path_users)); stop the users, use O(defer_to_boot=true) and reboot, or set O(force=true). A packet in flight while
    the two ends of a link disagree on MaxPayload is a malformed TLP. An nvidia-bound GPU whose device minor cannot be
    resolved counts as used by any process holding any C(/dev/nvidiaN).
  - The boot unit runs before C(systemd-udev-trigger.service) (udev coldplug loads the GPU drivers) and before the
    services that use the GPUs, so its writes see no DMA.
  - Some drivers save config space at probe and restore it after a device reset (C(nvidia-smi -r), vfio reset), which
    brings the old values back until the next boot or run; run the role again after such a reset.
  - The kernel's C(pcie_bus_safe) also lowers MaxPayload to 128 below hot-plug capable switch ports, for cards that may be
    added later. This module judges the devices present; run it again after adding a card.
seealso:
  - module: gpufleet.inference.pcie_facts
  - name: Path- and peer-safe payload sizes
    description: docs/pcie_payload.md in the collection.
    link: https://github.com/gpufleet/inference/blob/main/docs/pcie_payload.md
"""

EXAMPLES = r"""
- name: Largest safe MaxPayload on every GPU and its path, MaxReadRequest 4096, kept across reboots
  gpufleet.inference.pcie_payload:
    mps: max_safe
    mrrs: 4096
  become: true
  register: payload

- name: Show what limits each GPU
  ansible.builtin.debug:
    msg: "{{ item.key }}: MPS {{ item.value.mps_after }} (limit {{ item.value.limit }} from {{ item.value.limiting_device }})"
  loop: "{{ payload.devices | dict2items | selectattr('value.role', 'eq', 'target') }}"

- name: Tune two GPUs and the RDMA NIC that shares their switch, without persistence
  gpufleet.inference.pcie_payload:
    devices: ['0000:17:00.0', '0000:18:00.0', '0000:19:00.0']
    mps: 512
    mrrs: 4096
    mrrs_cap: 1024
    persist: false
  become: true

- name: Put back what the firmware had
  gpufleet.inference.pcie_payload:
    state: default
  become: true
"""

RETURN = r"""
actions:
  description:
    - What was done (or would be done in check mode), in order. Register writes are C(action=set) with C(device),
      C(register) (C(mps) or C(mrrs)), C(before), C(after) (bytes) and the C(argv) of setpci; file and unit steps are
      C(record_originals), C(remove_record), C(write_file), C(remove_file), C(enable_unit), C(disable_unit),
      C(daemon_reload).
  returned: always
  type: list
  elements: dict
  sample: [{action: set, device: "0000:00:01.0", register: mps, before: 256, after: 512,
            argv: [/usr/bin/setpci, -s, "0000:00:01.0", "CAP_EXP+8.w=0040:00e0"]}]
devices:
  description:
    - Per PCI address, every function the task judged or wrote. C(role) is C(target) (a listed device or GPU), C(path) (a
      bridge on its path) or C(function) (another function of the same card).
    - C(limit) and C(limiting_device) are the largest safe MaxPayload of the hierarchy and the function that sets it;
      C(path_limit)/C(path_limiting_device) and C(peer_limit)/C(peer_limiting_device) split it into the device's own path
      and the rest of the hierarchy.
    - C(mps_after) and C(mrrs_after) are read back from the device after the writes (predicted in check mode).
  returned: success
  type: dict
  sample:
    "0000:03:00.0": {role: target, hierarchy: "0000:00:01.0", class_name: 3D controller, vendor_id: "0x10de",
                     device_id: "0x2330", port_type: endpoint, mps_supported: 512, mps_before: 256, mps_after: 256,
                     mrrs_before: 512, mrrs_after: 4096, mrrs_capped: false, limit: 256, limiting_device: "0000:04:00.0",
                     path_limit: 512, path_limiting_device: "0000:00:01.0", peer_limit: 256, peer_limiting_device: "0000:04:00.0"}
persisted:
  description: Entries the boot unit re-applies after this task, one per managed function (empty when nothing is persisted).
  returned: success
  type: list
  elements: dict
  sample: [{bdf: "0000:03:00.0", vendor_id: "0x10de", device_id: "0x2330", hierarchy: "0000:00:01.0", depth: 4, mrrs: 4096}]
readonly:
  description: Devices whose field stayed read-only, with O(on_readonly=warn).
  returned: success
  type: list
  elements: dict
  sample: [{device: "0000:01:00.0", register: mrrs, wanted: 4096, reads: 512}]
path_users:
  description: Processes that use a device on a path to be written, one line each (empty when idle).
  returned: success
  type: list
  elements: str
  sample: ["process 4242 (python3) holds /dev/nvidia0 of 0000:03:00.0"]
deferred:
  description: With O(defer_to_boot=true), the register writes the boot unit makes at the next boot.
  returned: success
  type: list
  elements: dict
  sample: [{device: "0000:03:00.0", register: mrrs, before: 512, after: 4096}]
reboot_required:
  description: True when writes were deferred to the next boot.
  returned: success
  type: bool
diff:
  description:
    - First the register values and the boot persistence before and after, then each file the run writes or removes
      (the record, the persistence configuration, the boot script, the unit) with its text before and after.
  returned: when diff mode is on
  type: list
  elements: dict
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import TopologyError
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.payload import PayloadError
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.boot import PERSIST_CONFIG
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.pcie_payload import execute

ARGUMENT_SPEC = dict(
    root=dict(type="path", default="/"),
    devices=dict(type="list", elements="str", default=[]),
    mps=dict(type="str"),
    mrrs=dict(type="int"),
    mrrs_cap=dict(type="int"),
    include_path=dict(type="bool", default=True),
    state=dict(type="str", choices=["present", "default"], default="present"),
    persist=dict(type="bool", default=True),
    on_readonly=dict(type="str", choices=["fail", "warn"], default="fail"),
    state_dir=dict(type="path", default="/var/lib/gpufleet/pcie_payload"),
    force=dict(type="bool", default=False),
    defer_to_boot=dict(type="bool", default=False),
)


def main():
    run_module(ModuleSpec("pcie_payload", ARGUMENT_SPEC, f"reads sysfs and writes {PERSIST_CONFIG}, its state_dir and the boot unit",
                          (PayloadError, TopologyError)), execute)


if __name__ == "__main__":
    main()

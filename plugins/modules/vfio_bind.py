#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vfio_bind
short_description: Bind PCI functions to vfio-pci after an IOMMU group check, and hand them back
version_added: 0.1.0
description:
  - Binds PCI functions, named by address or by vendor:device ID, to C(vfio-pci) the way driverctl does it. It writes
    C(driver_override), then the current driver's C(unbind), then C(/sys/bus/pci/drivers_probe). It loads the
    C(vfio-pci) kernel module first when C(/sys/bus/pci/drivers/vfio-pci) is absent.
  - The other functions of the same slot (a GPU's audio function C(.1)) are bound with it unless O(companions=false).
  - Before any write it checks every IOMMU group involved. Each member must be one of the functions being bound, be
    on C(vfio-pci) or C(pci-stub) already, be a PCI bridge, or be listed in O(group_allow). Otherwise the module fails
    and names the member that blocks the group, with the fix.
  - Refuses to release a function that is in use unless O(force=true). In use means a process holds one of its device
    nodes (C(/dev/nvidiaN), C(/dev/nvme*), C(/dev/dri/*), C(/dev/snd/*), C(/dev/vfio/N)), a filesystem or swap on it is
    mounted or active, device mapper or MD holds it, or one of its network interfaces is up. An nvidia-bound GPU whose
    device minor cannot be resolved (no C(/proc/driver/nvidia/gpus/BDF/information)) counts as in use.
  - Refuses the boot display device (sysfs C(boot_vga) 1) and the display controllers of BMCs (ASPEED, Matrox; the remote
    console) unless O(force_display=true).
  - Waits until the kernel has really bound the function. It listens for the udev C(bind) event through pyudev, and
    falls back to watching the C(driver) link. It never sleeps for a fixed time.
  - Records the original driver under C(/var/lib/gpufleet/vfio) before the first change. O(state=absent) clears the
    override, unbinds C(vfio-pci), loads the original driver's module if it is not loaded, and reprobes. It fails if
    the original driver does not take the function back.
  - With O(persist), the binding survives reboots. V(udev) writes C(/etc/udev/rules.d/61-gpufleet-vfio.rules), which
    matches by address like driverctl and also covers built-in drivers. V(modprobe) writes
    C(/etc/modprobe.d/gpufleet-vfio.conf) with C(options vfio-pci ids=) and a C(softdep) line per original driver
    module that loads C(vfio-pci) before it.
  - The IOMMU kernel arguments are not this module's job. The C(gpufleet.inference.vfio) role puts them on the kernel
    command line with M(gpufleet.inference.kernel_cmdline).
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - Linux with sysfs, an enabled IOMMU (C(intel_iommu=on) or AMD-Vi) and C(vfio-pci) built in or as a module. Run as root.
  - pyudev (optional) to wait for the bind on udev events instead of polling the driver link.
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  devices:
    description:
      - PCI functions to bind. Give addresses (C(0000:3b:00.0), or C(3b:00.0) for domain 0) or vendor:device IDs
        (C(10de:2335), which select every function with that ID).
    type: list
    elements: str
    required: true
  state:
    description:
      - V(present) binds the functions to C(vfio-pci). V(absent) hands them back to their original drivers.
    type: str
    choices: [present, absent]
    default: present
  companions:
    description: Also bind the other functions of each selected function's slot, except bridges. This covers a GPU's audio function.
    type: bool
    default: true
  group_allow:
    description:
      - PCI addresses that may stay as they are in an IOMMU group being handed to C(vfio-pci). Use it for functions
        you know are harmless, for example a function you parked yourself.
    type: list
    elements: str
    default: []
  force:
    description:
      - Release functions that are in use (open device nodes, mounted filesystems, interfaces up). Processes that hold
        them will see their device vanish. This is destructive, so it is off by default.
    type: bool
    default: false
  force_display:
    description:
      - Bind the boot display device (C(boot_vga)) or a BMC display controller anyway. The host loses that console.
    type: bool
    default: false
  bind_now:
    description:
      - Change the running kernel's bindings. With V(false) the module only writes the O(persist) files, for a host
        that must reboot with the IOMMU turned on first.
      - The in-use check still applies, because the next boot takes the functions. The IOMMU group check waits for a
        run after that reboot.
    type: bool
    default: true
  persist:
    description:
      - How the binding survives a reboot. V(none) changes the running kernel only.
      - V(udev) works by address. V(modprobe) works by ID; it is refused when another function has the same ID and is
        not bound, or when the original driver is built into the kernel.
      - With O(state=absent), the functions are removed from both files unless this is V(none).
    type: str
    choices: [none, udev, modprobe]
    default: none
  restore_driver:
    description:
      - With O(state=absent), the driver expected to take the functions back. It overrides the recorded original and
        helps when that record is lost. The module loads it with C(modprobe) when it is not loaded.
    type: str
  timeout:
    description: Seconds to wait for each function to be bound after the probe.
    type: float
    default: 10
notes:
  - Binding fails with C(Invalid argument) (-22) when the IOMMU is off, and the module says so. Check
    C(/sys/kernel/iommu_groups) and the kernel command line.
  - The udev rule runs on every C(add) event, coldplug at boot included. It sets C(driver_override). When another
    driver holds the function, the rule releases it and reprobes, which is how built-in drivers such as C(nvme) are
    kept away.
seealso:
  - module: gpufleet.inference.pcie_facts
  - name: driverctl
    description: The persistent driver override model this module follows.
    link: https://gitlab.com/driverctl/driverctl
"""

EXAMPLES = r"""
- name: Hand every H200 (and its companion functions) to vfio-pci, persistently
  gpufleet.inference.vfio_bind:
    devices: ['10de:2335']
    persist: udev
  become: true

- name: Bind one NVMe drive by address; its IOMMU group also holds a parked function
  gpufleet.inference.vfio_bind:
    devices: ['0000:3b:00.0']
    group_allow: ['0000:3b:00.3']
  become: true

- name: Give the GPU back to the nvidia driver
  gpufleet.inference.vfio_bind:
    devices: ['0000:3b:00.0']
    state: absent
    persist: udev
  become: true

- name: Preview what would happen, with the group verdicts
  gpufleet.inference.vfio_bind:
    devices: ['10de:2335']
  check_mode: true
  diff: true
  register: preview
"""

RETURN = r"""
actions:
  description:
    - What the module did, or would do in check mode, in order. C(action) is C(set_override) (the C(device), the C(path)
      of its C(driver_override), C(before) and C(after), null when cleared), C(unbind) (the C(device) and the C(driver) it
      leaves), C(load_module) (the kernel C(module)), C(probe) (the C(device) and the C(driver) it should bind to, null
      for its default driver), C(remove_id) (the vendor:device C(id) taken out of vfio-pci's dynamic table, at C(path)),
      or C(write) and C(remove) of a persistence file's C(path) (the contents are in the diff).
  returned: always
  type: list
  elements: dict
  sample: [{action: set_override, device: "0000:3b:00.0", path: /sys/bus/pci/devices/0000:3b:00.0/driver_override,
            before: null, after: vfio-pci},
           {action: unbind, device: "0000:3b:00.0", driver: nvidia}, {action: load_module, module: vfio-pci},
           {action: probe, device: "0000:3b:00.0", driver: vfio-pci},
           {action: write, path: /etc/udev/rules.d/61-gpufleet-vfio.rules}]
devices:
  description: Every function handled, selected or companion.
  returned: success
  type: list
  elements: dict
  contains:
    bdf:
      description: PCI address.
      type: str
    id:
      description: vendor:device ID.
      type: str
    class_name:
      description: PCI class in words.
      type: str
    selected_by:
      description: C(bdf), C(id) or C(companion).
      type: str
    companion_of:
      description: For a companion, the selected function of its slot.
      type: str
    iommu_group:
      description: IOMMU group number, null without an IOMMU.
      type: int
    driver_before:
      description: Driver before the run.
      type: str
    driver_after:
      description: Driver after the run (in check mode, the driver it would have).
      type: str
    driver_override_before:
      description: C(driver_override) before the run, null when unset.
      type: str
    driver_override_after:
      description: C(driver_override) after the run.
      type: str
    original_driver:
      description: The driver recorded before the first bind, which O(state=absent) restores.
      type: str
    in_use:
      description: Why the function counts as in use (empty when it is free).
      type: list
      elements: str
  sample: [{bdf: "0000:3b:00.0", id: "10de:2335", class_name: 3D controller, selected_by: id, companion_of: null, iommu_group: 12,
            driver_before: nvidia, driver_after: vfio-pci, driver_override_before: null, driver_override_after: vfio-pci,
            original_driver: nvidia, in_use: []}]
groups:
  description: Each IOMMU group involved, with every member and its verdict. C(blocks) marks a member that stops the bind.
  returned: success
  type: dict
  sample: {"12": [{bdf: "0000:3b:00.0", class_name: 3D controller, driver: nvidia, verdict: bound with the targets},
                  {bdf: "0000:3a:00.0", class_name: PCI bridge, driver: pcieport, verdict: bridge}]}
iommu_enabled:
  description: Whether the kernel has IOMMU groups.
  returned: success
  type: bool
persist:
  description: The persistence method and the files it changed (or would change).
  returned: success
  type: dict
  sample: {method: udev, files: [/etc/udev/rules.d/61-gpufleet-vfio.rules]}
udev_rules_changed:
  description: The udev rules file changed. Reload udev (C(udevadm control --reload)).
  returned: success
  type: bool
initramfs_update_required:
  description: The modprobe.d file changed. Rebuild the initramfs so it also applies when the driver loads early.
  returned: success
  type: bool
wait_source:
  description: How the bind was awaited, C(udev) (pyudev events) or C(poll) (the driver link); null when nothing was probed.
  returned: success
  type: str
diff:
  description: Bindings and files before and after, in diff mode.
  returned: when diff mode is on and something changes
  type: list
  elements: dict
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.vfio.binding import VfioError
from ansible_collections.gpufleet.inference.plugins.module_utils.vfio.vfio_bind import execute

ARGUMENT_SPEC = dict(
    root=dict(type="path", default="/"),
    devices=dict(type="list", elements="str", required=True),
    state=dict(type="str", choices=["present", "absent"], default="present"),
    companions=dict(type="bool", default=True),
    group_allow=dict(type="list", elements="str", default=[]),
    force=dict(type="bool", default=False),
    force_display=dict(type="bool", default=False),
    bind_now=dict(type="bool", default=True),
    persist=dict(type="str", choices=["none", "udev", "modprobe"], default="none"),
    restore_driver=dict(type="str"),
    timeout=dict(type="float", default=10),
)


def main():
    run_module(ModuleSpec("vfio_bind", ARGUMENT_SPEC, "reads and writes sysfs", (VfioError,)), execute)


if __name__ == "__main__":
    main()

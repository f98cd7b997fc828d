#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pcie_acs
short_description: Clear ACS P2P redirect on exactly the bridges between the GPUs of a tensor-parallel group
version_added: 0.1.0
description:
  - Finds, from the same PCIe model as M(gpufleet.inference.pcie_facts), the bridges whose Access Control Services
    redirect peer traffic between the GPUs in O(devices) (one tensor-parallel group) up to the root complex. These are the
    switch ports below the GPUs' common switch (C(PIX)/C(PXB) pairs), or the two root ports of a pair on one host bridge
    (C(PHB)). Pairs across host bridges (C(NODE)/C(SYS)) have no such bridge.
  - Clears ReqRedir (RR), CmpltRedir (CR) and EgressCtrl (EC) in their ACS Control register, and nothing else, with
    C(setpci -A linux-sysfs -s BRIDGE ECAP_ACS+6.w=0000:MASK); reads every write back and rolls all of them back when one
    does not take.
  - Records the original ACS Control values on the host (O(state_dir)) before the first write; O(state=default) restores
    them.
  - With O(persist=true) the collection's boot unit C(gpufleet-pcie-payload.service) (shared with
    M(gpufleet.inference.pcie_payload), one file C(/etc/gpufleet/pcie_payload.json)) clears the same bits at every boot,
    before udev loads the GPU drivers.
  - Returns RV(kernel_args), the boot parameters that do the same while the kernel enumerates the bus
    (C(pci=disable_acs_redir=), Linux 5.0+; C(pci=config_acs=), Linux 6.11+), for M(gpufleet.inference.kernel_cmdline)
    and the reboot contract. C(pci=noacs) is not one of them; mainline Linux has no such option.
  - "Security trade-off: ACS redirect is what lets the IOMMU see, and refuse, peer traffic between devices. With it
    cleared, the GPUs below these bridges can reach each other's memory without the IOMMU, so they belong in one IOMMU
    group and must not be passed to different VMs. The module refuses to run on a host that passes devices to VMs
    (a function bound to vfio-pci, the vfio role's files, C(vfio-pci.ids=) on the command line) unless
    O(force_on_vfio_host=true)."
  - A live write is refused while a process uses a device below the bridges (C(/dev/nvidiaN), C(/dev/dri/*), an open vfio
    group), with the holders named. O(defer_to_boot=true) leaves the change to the boot unit, O(force=true) writes anyway.
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - pciutils (C(setpci)) on the host; Linux with sysfs; root (C(become)).
  - systemd for O(persist=true).
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  devices:
    description:
      - PCI addresses of the GPUs of one tensor-parallel group. Default, every GPU (PCI class C(03), BMC display
        controllers left out).
      - With O(state=default), the recorded bridges on these GPUs' paths are restored (default, every recorded bridge).
    type: list
    elements: str
    default: []
  state:
    description: V(present) clears the redirect bits; V(default) puts back the recorded originals.
    type: str
    choices: [present, default]
    default: present
  persist:
    description: Keep the clear across reboots through the collection's boot unit. V(false) drops the ACS entries from it.
    type: bool
    default: true
  defer_to_boot:
    description: Do not write live; persist the clear for the boot unit and return RV(reboot_required=true). Needs O(persist=true).
    type: bool
    default: false
  force:
    description: Write live even when a process uses a device below the bridges.
    type: bool
    default: false
  force_on_vfio_host:
    description: Clear ACS redirect on a host that passes devices to VMs (see the security trade-off above).
    type: bool
    default: false
  state_dir:
    description: Directory on the host (under O(root)) where the original values are recorded, as C(originals.json).
    type: path
    default: /var/lib/gpufleet/pcie_acs
notes:
  - QEMU's C(pcie-root-port) exposes ACS and the kernel turns RR/CR on there when the IOMMU is on; a bit the emulator keeps
    read-only fails with a message that says so, after the rollback.
seealso:
  - module: gpufleet.inference.pcie_facts
  - module: gpufleet.inference.kernel_cmdline
  - name: Widely copied tuning advice, and what the collection does instead
    description: docs/tuning_myths.md in the collection.
    link: https://github.com/gpufleet/inference/blob/main/docs/tuning_myths.md
"""

EXAMPLES = r"""
- name: Let the four GPUs of the tensor-parallel group reach each other without the root complex
  gpufleet.inference.pcie_acs:
    devices: ['0000:17:00.0', '0000:18:00.0', '0000:19:00.0', '0000:1a:00.0']
  become: true
  register: acs

- name: The same at boot, through the kernel command line (reboot contract)
  gpufleet.inference.kernel_cmdline:
    owner: pcie_acs
    args: "{{ acs.kernel_args }}"
  become: true
  when: acs.kernel_args | length > 0

- name: On a busy host, leave the change to the next boot
  gpufleet.inference.pcie_acs:
    defer_to_boot: true
  become: true

- name: Put ACS back as the kernel set it
  gpufleet.inference.pcie_acs:
    state: default
  become: true
"""

RETURN = r"""
actions:
  description: What was done (or would be), in order. C(set_acs) with C(device), C(before), C(after) and C(argv); file and
    unit steps C(record_originals), C(remove_record), C(write_file), C(remove_file), C(enable_unit), C(disable_unit),
    C(daemon_reload); C(set_at_boot) for deferred writes.
  returned: always
  type: list
  elements: dict
  sample: [{action: set_acs, device: "0000:02:00.0", before: 13, after: 1,
            argv: [/usr/bin/setpci, -A, linux-sysfs, -O, sysfs.path=/sys/bus/pci, -s, "0000:02:00.0", "ECAP_ACS+6.w=0000:000c"]}]
bridges:
  description: Per bridge between the group's GPUs that redirects (or was cleared by this module), ACSCtl before and after
    (read back), the bits cleared and the GPU pairs it sits between.
  returned: success
  type: dict
  sample: {"0000:02:00.0": {ctrl_before: 13, ctrl_after: 1, cleared: [RR, CR], pairs: [["0000:03:00.0", "0000:04:00.0"]]}}
pairs:
  description: Every GPU pair of the group, its level, the bridges on its peer path and those that redirect.
  returned: success
  type: list
  elements: dict
kernel_args:
  description: Boot parameters that clear the same bits while the kernel enumerates the bus, for the running kernel.
  returned: success
  type: list
  elements: str
  sample: ["pci=disable_acs_redir=0000:02:00.0;0000:02:01.0"]
path_users:
  description: Processes that use a device below the bridges to be written.
  returned: success
  type: list
  elements: str
vfio_reasons:
  description: Why the host looks like it passes devices to VMs (empty when it does not).
  returned: success
  type: list
  elements: str
reboot_required:
  description: True when the clear was deferred to the next boot.
  returned: success
  type: bool
persisted:
  description: The ACS entries the boot unit applies.
  returned: success
  type: list
  elements: dict
diff:
  description: ACS Control per bridge and the persisted bridges, before and after.
  returned: when diff mode is on
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils.hostfs import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils.pci_topology import (
    PciWalker, TopologyError, build_model, normalize_bdfs, select_targets,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie_acs import (
    MASK, RECORD_FILE, AcsError, apply_writes, bit_names, failure_message, kernel_args, merge_record, pair_bridges,
    parse_record, persist_entries, plan_clear, plan_restore, read_acs, redirecting_bridges, setpci_argv, vfio_reasons,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie_boot import (
    PERSIST_CONFIG, parse_persist, persistence_plan,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie_state import PcieState, StepFailed, shown_actions
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie_users import refusal, users

class PcieAcs(PcieState):
    SET_WHAT = "The ACS bits are set"

    def __init__(self, module: AnsibleModule, fs: HostFS, setpci: str):
        super().__init__(module, fs, setpci, RECORD_FILE)

    def file_actions(self, record_text, record, acs_entries, persist: bool) -> list[dict]:
        payload = list(parse_persist(self.read(PERSIST_CONFIG), "devices").values())
        acs = acs_entries if persist else []
        return self.record_action(record_text, record) + persistence_plan(
            self.read, self.fs.exists, self.python(), self.systemctl_argv, payload, acs, bool(payload or acs), self.fs.root == "/")

    def guard(self, what: str, bdfs: list[str], force: bool, boot_way: str, result: dict) -> None:
        found = users(PciWalker(self.fs), bdfs)
        result["path_users"] = found["lines"]
        for note in found["notes"]:
            self.module.warn(note)
        if found["holders"] and not force:
            msg = refusal(what, found, boot_way)
            if not self.module.check_mode:
                raise AcsError(msg)
            self.module.warn(msg)

    def set_action(self, w: dict, kind: str = "set_acs") -> dict:
        return {"action": kind, "device": w["device"], "before": w["before"], "after": w["after"],
                "argv": setpci_argv(self.setpci, self.fs.root, w["device"], w["after"], w["mask"])}

    def apply(self, writes: list[dict]) -> None:
        outcome = apply_writes(self.fs, writes, self.run, self.setpci)
        if outcome["failures"]:
            raise AcsError(failure_message(outcome["failures"][0], outcome))

    # ---- present ----------------------------------------------------------------------------------
    def present(self, devices, persist, defer, force, force_vfio) -> dict:
        walker = PciWalker(self.fs)
        try:
            group = select_targets(walker, devices=devices)
        except TopologyError as err:
            raise AcsError(str(err)) from None
        if len(group) < 2:
            raise AcsError(f"The group has {len(group)} GPU ({', '.join(group)}): ACS redirect only matters between two or more. "
                           "List the GPUs of the tensor-parallel group in devices.")
        model = build_model(self.fs, group, with_names=False)
        record_text = self.read(self.record_path)
        record = parse_record(record_text, self.fs.path(self.record_path))
        sel = redirecting_bridges(model, group)
        bridges = dict(sel["bridges"])
        for pair in sel["pairs"]:  # bridges this module cleared earlier stay managed (persisted, reported)
            for hop in pair["bridges"]:
                if hop in record["devices"] and hop not in bridges:
                    bridges[hop] = {"ctrl": None, "on": bit_names(record["devices"][hop]["ctrl"] & MASK),
                                    "clear": record["devices"][hop]["ctrl"] & MASK, "pairs": [[pair["a"], pair["b"]]]}
                elif hop in bridges and [pair["a"], pair["b"]] not in bridges[hop]["pairs"]:
                    bridges[hop]["pairs"].append([pair["a"], pair["b"]])
        current = {b: read_acs(self.fs, b) for b in bridges}
        writes = plan_clear(bridges, current)
        result = {"pairs": sel["pairs"], "path_users": [], "reboot_required": False, "vfio_reasons": [],
                  "kernel_args": [], "persisted": []}
        reasons = vfio_reasons(self.fs, self.fs.read_optional("/proc/cmdline"))
        result["vfio_reasons"] = reasons
        if bridges and reasons and not force_vfio:
            raise AcsError(
                f"Refusing to clear ACS redirect on {', '.join(bridges)}: this host passes devices to VMs ({'; '.join(reasons)}). "
                "ACS redirect is what makes the IOMMU check peer traffic; without it a device below these bridges can reach "
                "the others' memory, so they could not be given to different VMs safely. Set force_on_vfio_host: true only "
                "if no GPU below them is passed to a VM.")
        boot = kernel_args(sorted(bridges), self.fs.read_optional("/proc/sys/kernel/osrelease"))
        for note in boot["notes"]:
            self.module.warn(note)
        result["kernel_args"] = boot["args"]
        rec_after = merge_record(record, writes, current)
        entries = persist_entries(bridges, {b: current[b] for b in bridges})
        result["persisted"] = entries if persist else []
        before = {b: current[b]["ctrl"] for b in bridges}
        sets = [self.set_action(w) for w in writes]
        if defer and not persist:
            raise AcsError("defer_to_boot: true needs persist: true: the boot unit makes the change.")
        if writes and not defer:
            self.guard("clear ACS redirect on " + ", ".join(w["device"] for w in writes), [w["device"] for w in writes], force,
                       "set defer_to_boot: true (the boot unit clears the bits before udev loads the GPU drivers) or put "
                       "result.kernel_args on the kernel command line, and reboot", result)
        files = self.file_actions(record_text, rec_after, entries, persist)
        if defer:
            result["reboot_required"] = bool(writes)
            sets = [self.set_action(w, "set_at_boot") for w in writes]
            if not self.module.check_mode:
                self.do_file_actions(files)
            return self.finish(result, files + sets, bridges, before, before, entries)
        if not self.module.check_mode:
            first = [a for a in files if a["action"] == "record_originals"]
            self.do_file_actions(first)  # the originals are on disk before the first write
            try:
                self.apply(writes)
            except AcsError:
                if first:  # everything was rolled back: the record must not claim a change
                    self.put_record_back(record_text)
                raise
            self.do_file_actions([a for a in files if a["action"] != "record_originals"])
        after = {b: (read_acs(self.fs, b)["ctrl"] if not self.module.check_mode else
                     next((w["after"] for w in writes if w["device"] == b), before[b])) for b in bridges}
        return self.finish(result, [a for a in files if a["action"] == "record_originals"] + sets
                           + [a for a in files if a["action"] != "record_originals"], bridges, before, after, entries)

    # ---- default ----------------------------------------------------------------------------------
    def default(self, devices, force) -> dict:
        record_text = self.read(self.record_path)
        record = parse_record(record_text, self.fs.path(self.record_path))
        only = None
        if devices:
            model = build_model(self.fs, devices, with_names=False)
            gpus = {g["bdf"]: g for g in model["gpus"]}
            only = {hop for a in gpus for b in gpus if a < b for hop in pair_bridges(model, gpus[a], gpus[b])[1]}
        present = set(self.fs.listdir("/sys/bus/pci/devices"))
        current = {b: read_acs(self.fs, b) for b in record["devices"] if b in present}
        plan = plan_restore(record, current, only)
        for bdf in plan["gone"]:
            self.module.warn(f"{bdf} had its ACS Control recorded but no longer exists; its entry is dropped.")
        result = {"pairs": [], "path_users": [], "reboot_required": False, "vfio_reasons": [], "kernel_args": [], "persisted": []}
        if plan["writes"]:
            self.guard("restore ACS Control on " + ", ".join(w["device"] for w in plan["writes"]),
                       [w["device"] for w in plan["writes"]], force,
                       "stop the users, or run with persist: false and reboot (the kernel sets ACS again at boot)", result)
        done = set(plan["restore"]) | set(plan["gone"])
        rec_after = {"format": record["format"], "devices": {b: r for b, r in record["devices"].items() if b not in done}}
        existing = parse_persist(self.read(PERSIST_CONFIG), "acs")
        entries = [e for b, e in sorted(existing.items()) if b not in done]
        files = self.file_actions(record_text, rec_after, entries, bool(entries))
        before = {b: current[b]["ctrl"] for b in plan["restore"]}
        if not self.module.check_mode:
            self.apply(plan["writes"])
            self.do_file_actions(files)
        after = {b: (read_acs(self.fs, b)["ctrl"] if not self.module.check_mode else
                     next((w["after"] for w in plan["writes"] if w["device"] == b), before[b])) for b in plan["restore"]}
        bridges = {b: {"on": [], "clear": 0, "pairs": []} for b in plan["restore"]}
        result["persisted"] = entries
        return self.finish(result, [self.set_action(w) for w in plan["writes"]] + files, bridges, before, after, entries)

    def finish(self, result, actions, bridges, before, after, entries) -> dict:
        shown = shown_actions(actions)
        result["bridges"] = {b: {"ctrl_before": before.get(b), "ctrl_after": after.get(b),
                                 "cleared": bit_names((before.get(b) or 0) & ~(after.get(b) or 0) & MASK),
                                 "pairs": info["pairs"]} for b, info in bridges.items()}
        result.update(changed=bool(shown), actions=shown)
        if self.module._diff:  # pylint: disable=protected-access
            result["diff"] = {"before": {"acsctl": before}, "after": {"acsctl": after, "persisted": [e["bdf"] for e in entries]}}
        return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            devices=dict(type="list", elements="str", default=[]),
            state=dict(type="str", choices=["present", "default"], default="present"),
            persist=dict(type="bool", default=True),
            defer_to_boot=dict(type="bool", default=False),
            force=dict(type="bool", default=False),
            force_on_vfio_host=dict(type="bool", default=False),
            state_dir=dict(type="path", default="/var/lib/gpufleet/pcie_acs"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not p["state_dir"].startswith("/"):
        module.fail_json(msg=f"state_dir must be an absolute path on the host, got {p['state_dir']!r}.")
    try:
        devices = normalize_bdfs(p["devices"])
    except TopologyError as err:
        module.fail_json(msg=str(err))
    acs = PcieAcs(module, HostFS(p["root"]), module.get_bin_path("setpci", required=True))
    try:
        if p["state"] == "present":
            result = acs.present(devices, p["persist"], p["defer_to_boot"], p["force"], p["force_on_vfio_host"])
        else:
            result = acs.default(devices, p["force"])
    except (AcsError, TopologyError) as err:
        module.fail_json(msg=str(err), changed=False)
    except StepFailed as err:
        module.fail_json(msg=str(err), **err.fields)
    except HostFSError as err:
        module.fail_json(msg=f"pcie_acs under root {p['root']} failed: {err}. It reads sysfs and writes {PERSIST_CONFIG}, "
                             f"{p['state_dir']} and the boot unit: run it as root (become: true).", changed=False)
    module.exit_json(**result)


if __name__ == "__main__":
    main()

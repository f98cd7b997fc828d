# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.pcie_acs executes (``execute``), on top of pcie/state.py's PcieState (record, boot
persistence, unit) and the pure planning of pcie/acs.py: read the registers, guard against live users, write through
setpci, read back, roll back, persist. Failures are raised (AcsError, TopologyError, StepFailed), never fail_json-ed
here.
"""

from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import (
    PciWalker, TopologyError, build_model, normalize_bdfs, select_targets,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.acs import (
    MASK, RECORD_FILE, AcsError, apply_writes, bit_names, failure_message, kernel_args, merge_record, pair_bridges,
    parse_record, persist_entries, plan_clear, plan_restore, read_acs, redirecting_bridges, setpci_argv, vfio_reasons,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.boot import (
    PERSIST_CONFIG, parse_persist, persistence_plan,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.state import PcieState, shown_actions
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.users import refusal, users


class PcieAcs(PcieState):
    SET_WHAT = "The ACS bits are set"

    def __init__(self, host: Host, setpci: str, state_dir: str, check_mode: bool):
        super().__init__(host, setpci, RECORD_FILE, state_dir, check_mode)

    def file_actions(self, record_text, record, acs_entries, persist: bool) -> list[dict]:
        payload = list(parse_persist(self.read(PERSIST_CONFIG), "devices").values())
        acs = acs_entries if persist else []
        return self.record_action(record_text, record) + persistence_plan(
            self.read, self.fs.exists, self.script(), self.systemctl_argv, payload, acs, bool(payload or acs), self.fs.root == "/")

    def guard(self, what: str, bdfs: list[str], force: bool, boot_way: str, result: dict) -> None:
        found = users(PciWalker(self.fs), bdfs)
        result["path_users"] = found["lines"]
        for note in found["notes"]:
            self.warn(note)
        if found["holders"] and not force:
            msg = refusal(what, found, boot_way)
            if not self.check_mode:
                raise AcsError(msg)
            self.warn(msg)

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
            self.warn(note)
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
            if not self.check_mode:
                self.do_file_actions(files)
            return self.finish(result, files + sets, bridges, before, before, entries)
        if not self.check_mode:
            first = [a for a in files if a["action"] == "record_originals"]
            self.do_file_actions(first)  # the originals are on disk before the first write
            try:
                self.apply(writes)
            except AcsError:
                if first:  # everything was rolled back: the record must not claim a change
                    self.put_record_back(record_text)
                raise
            self.do_file_actions([a for a in files if a["action"] != "record_originals"])
        after = {b: (read_acs(self.fs, b)["ctrl"] if not self.check_mode else
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
            self.warn(f"{bdf} had its ACS Control recorded but no longer exists; its entry is dropped.")
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
        if not self.check_mode:
            self.apply(plan["writes"])
            self.do_file_actions(files)
        after = {b: (read_acs(self.fs, b)["ctrl"] if not self.check_mode else
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
        # finish() returns the diff in diff mode only
        result["diff"] = [{"before": {"acsctl": before}, "after": {"acsctl": after, "persisted": [e["bdf"] for e in entries]}}] \
            + self.file_diffs(actions)
        return result


def execute(params: dict, host: Host, check_mode: bool) -> dict:
    """The pcie_acs module's run: the options checked (AcsError, TopologyError: nothing done), setpci found, then
    state present (clear ACS redirect on the bridges between the GPUs) or default (restore the recorded bits)."""
    p = params
    if not p["state_dir"].startswith("/"):
        raise AcsError(f"state_dir must be an absolute path on the host, got {p['state_dir']!r}.")
    devices = normalize_bdfs(p["devices"])
    acs = PcieAcs(host, host.cmd.find_live("setpci", required=True), p["state_dir"], check_mode)
    if p["state"] == "present":
        return acs.present(devices, p["persist"], p["defer_to_boot"], p["force"], p["force_on_vfio_host"])
    return acs.default(devices, p["force"])

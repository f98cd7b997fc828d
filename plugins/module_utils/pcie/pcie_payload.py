# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.pcie_payload executes (``execute``), on top of pcie/state.py's PcieState (record, boot
persistence, unit) and the pure planning of pcie/payload.py: read the registers, guard against live users, write
through setpci, read back, roll back, persist. Failures are raised (PayloadError, TopologyError, StepFailed), never
fail_json-ed here.
"""

from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import PciWalker, normalize_bdfs
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.payload import (
    RECORD_FILE, PayloadError, apply_writes, failure_message, gather, gather_recorded, merge_record, parse_mps,
    parse_record, parse_size, persist_entries, plan_present, plan_restore, read_payload, restore_scope, setpci_argv,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.boot import (
    PERSIST_CONFIG, UNIT_WANTS, parse_persist, persistence_plan,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.state import PcieState, StepFailed, shown_actions
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.users import refusal, users


class PciePayload(PcieState):
    """The payload registers on top of PcieState (record, persistence files, unit)."""

    def __init__(self, host: Host, setpci: str, state_dir: str, check_mode: bool):
        super().__init__(host, setpci, RECORD_FILE, state_dir, check_mode)

    def record(self) -> tuple[str | None, dict]:
        text = self.read(self.record_path)
        return text, parse_record(text, self.fs.path(self.record_path))

    def persistence_actions(self, entries: list[dict], persist: bool) -> list[dict]:
        """File and unit steps that make the boot unit match ``entries`` (or remove it); the ACS
        entries pcie_acs keeps in the same file stay as they are, and keep the unit alive."""
        acs = list(parse_persist(self.read(PERSIST_CONFIG), "acs").values())
        return persistence_plan(self.read, self.fs.exists, self.script(), self.systemctl_argv, entries if persist else [],
                                acs, persist or bool(acs), self.fs.root == "/")

    # ---- the two states -----------------------------------------------------------------------
    def present(self, devices: list[str], mps, mrrs, mrrs_cap, include_path: bool, persist: bool, on_readonly: str,
                force: bool = False, defer: bool = False) -> dict:
        model = gather(self.fs, devices)
        for warning in model["warnings"]:
            self.warn(warning)
        plan = plan_present(model, mps, mrrs, mrrs_cap, include_path)
        record_text, record = self.record()
        persist_text = self.read(PERSIST_CONFIG)
        existing = parse_persist(persist_text)
        sets = [self.set_action(w) for w in plan["writes"]]

        live = {b: {"mps": d["mps_after"], "mrrs": d["mrrs_after"]} for b, d in plan["devices"].items()}
        rec_after = merge_record(record, plan["writes"], model["functions"])
        entries = persist_entries(plan["managed"], existing, live)
        file_actions = self.record_action(record_text, rec_after) + self.persistence_actions(entries, persist)
        result = {"devices": plan["devices"], "persisted": entries if persist else [], "readonly": [], "path_users": [],
                  "deferred": [], "reboot_required": False}
        before_state = self.diff_state(plan["devices"], "before", existing, persist_text)
        if plan["writes"]:
            found = users(PciWalker(self.fs), sorted({w["device"] for w in plan["writes"]}))
            result["path_users"] = found["lines"]
            for note in found["notes"]:
                self.warn(note)
            if defer:
                if not persist:
                    raise PayloadError("defer_to_boot: true needs persist: true: the values are applied by the boot unit.")
                return self.defer(result, plan, record_text, rec_after, entries, before_state)
            if found["holders"] and not force:
                msg = refusal("write MaxPayload/MaxReadReq on " + ", ".join(sorted({w["device"] for w in plan["writes"]})), found,
                              "set defer_to_boot: true (the boot unit gpufleet-pcie-payload.service applies them before udev "
                              "loads the GPU drivers) and reboot")
                if not self.check_mode:
                    raise PayloadError(msg)
                self.warn(msg)
        if self.check_mode or not (sets or file_actions):
            actions = [a for a in file_actions if a["action"] == "record_originals"] + sets + \
                      [a for a in file_actions if a["action"] != "record_originals"]
            return self.finish(result, actions, before_state, plan["devices"], entries, persist)

        # Record the originals before the first write, so that a crash leaves them known.
        first = [a for a in file_actions if a["action"] == "record_originals"] if sets else []
        self.do_file_actions(first)
        outcome = apply_writes(self.fs, plan["writes"], self.run, self.setpci, stop_on_readonly=on_readonly == "fail")
        hard = [f for f in outcome["failures"] if f["kind"] == "error" or on_readonly == "fail"]
        if hard:
            if first and not outcome["done"] and not outcome["rollback_failed"]:
                self.put_record_back(record_text)
            raise StepFailed(failure_message(hard[0], model["functions"], outcome),
                             changed=bool(outcome["rollback_failed"]), actions=[],
                             failures=outcome["failures"], rolled_back=outcome["rolled_back"],
                             rollback_failed=outcome["rollback_failed"], devices=plan["devices"])
        for failure in outcome["failures"]:
            self.warn(failure_message(failure, model["functions"], {"rolled_back": [], "rollback_failed": []}))
            result["readonly"].append({k: failure[k] for k in ("device", "register", "wanted", "reads")})
        # Read every reported device back, then make the record and the boot unit match what took.
        for bdf, dev in plan["devices"].items():
            now = read_payload(self.fs, bdf)
            dev["mps_after"], dev["mrrs_after"] = now["mps"], now["mrrs"]
        live = {b: {"mps": d["mps_after"], "mrrs": d["mrrs_after"]} for b, d in plan["devices"].items()}
        done = [w for w in plan["writes"]
                if any(d["device"] == w["device"] and d["register"] == w["register"] for d in outcome["done"])]
        rec_after = merge_record(record, done, model["functions"])
        skipped = {w["hierarchy"] for w in plan["writes"] for f in outcome["failures"] if f["device"] == w["device"]}
        entries = persist_entries(plan["managed"], existing, live, skipped)
        final = self.record_action(self.read(self.record_path), rec_after) + self.persistence_actions(entries, persist)
        self.do_file_actions(final)
        net_record = self.record_action(record_text, rec_after)
        actions = net_record + [self.set_action(w) for w in done] + \
            [a for a in final if a["action"] not in ("record_originals", "remove_record")]
        result["persisted"] = entries if persist else []
        return self.finish(result, actions, before_state, plan["devices"], entries, persist)

    def defer(self, result: dict, plan: dict, record_text: str | None, rec_after: dict, entries: list[dict],
              before_state: dict) -> dict:
        """No live write: record the originals and persist the new values for the boot unit, which applies
        them at the next boot before the GPU drivers load. The registers read as before until then."""
        file_actions = self.record_action(record_text, rec_after) + self.persistence_actions(entries, True)
        if not self.check_mode:
            self.do_file_actions(file_actions)
        result["deferred"] = [{k: w[k] for k in ("device", "register", "before", "after")} for w in plan["writes"]]
        result["reboot_required"] = True
        for dev in plan["devices"].values():
            dev["mps_after"], dev["mrrs_after"] = dev["mps_before"], dev["mrrs_before"]
        deferred = [dict(self.set_action(w), action="set_at_boot") for w in plan["writes"]]
        return self.finish(result, file_actions + deferred, before_state, plan["devices"], entries, True)

    def default(self, devices: list[str], persist: bool, force: bool = False) -> dict:
        record_text, record = self.record()
        persist_text = self.read(PERSIST_CONFIG)
        existing = parse_persist(persist_text)
        scope = restore_scope(record, existing, devices)
        model = gather_recorded(self.fs, list(record["devices"]))
        plan = plan_restore(record, model, scope)
        for bdf in plan["gone"]:
            self.warn(f"{bdf} was tuned earlier but no longer exists; its recorded values are dropped.")
        rec_after = {"format": record["format"], "devices": {b: r for b, r in record["devices"].items() if b not in plan["restore"]}}
        entries = sorted((e for e in existing.values() if e.get("hierarchy") not in scope),
                         key=lambda e: (e.get("depth", 0), e["bdf"]))
        file_actions = self.record_action(record_text, rec_after) + self.persistence_actions(entries, persist and bool(entries))
        report = {}
        for bdf in plan["restore"]:
            info = model["functions"].get(bdf)
            if info is None:
                continue
            original = record["devices"][bdf]["original"]
            report[bdf] = {"role": "restored", "hierarchy": record["devices"][bdf]["hierarchy"], "class_name": info["class_name"],
                           "vendor_id": info["vendor_id"], "device_id": info["device_id"], "port_type": info["port_type"],
                           "mps_supported": info["mps_supported"], "mps_before": info["mps"],
                           "mps_after": original.get("mps", info["mps"]), "mrrs_before": info["mrrs"],
                           "mrrs_after": original.get("mrrs", info["mrrs"]), "mrrs_capped": False,
                           "limit": None, "limiting_device": None, "path_limit": None, "path_limiting_device": None,
                           "peer_limit": None, "peer_limiting_device": None}
        result = {"devices": report, "persisted": entries if persist else [], "readonly": [], "path_users": [], "deferred": [],
                  "reboot_required": False}
        before_state = self.diff_state(report, "before", existing, persist_text)
        sets = [self.set_action(w) for w in plan["writes"]]
        if sets:
            found = users(PciWalker(self.fs), sorted({w["device"] for w in plan["writes"]}))
            result["path_users"] = found["lines"]
            if found["holders"] and not force:
                msg = refusal("restore MaxPayload/MaxReadReq on " + ", ".join(sorted({w["device"] for w in plan["writes"]})),
                              found, "stop the users and run state: default again, or reboot (the firmware values come "
                              "back by themselves once the boot unit is gone: run with persist: false first)")
                if not self.check_mode:
                    raise PayloadError(msg)
                self.warn(msg)
        if not self.check_mode and sets:
            outcome = apply_writes(self.fs, plan["writes"], self.run, self.setpci)
            if outcome["failures"]:
                raise StepFailed("Restoring the original values failed: " + failure_message(
                    outcome["failures"][0], model["functions"], outcome) + " The record is kept; run state=default again once fixed.",
                    changed=bool(outcome["rollback_failed"]), actions=[], failures=outcome["failures"],
                    rolled_back=outcome["rolled_back"], rollback_failed=outcome["rollback_failed"])
            for bdf, dev in report.items():
                now = read_payload(self.fs, bdf)
                dev["mps_after"], dev["mrrs_after"] = now["mps"], now["mrrs"]
        if not self.check_mode:
            self.do_file_actions(file_actions)
        return self.finish(result, sets + file_actions, before_state, report, entries, persist)

    # ---- helpers ------------------------------------------------------------------------------
    def set_action(self, write: dict) -> dict:
        return {"action": "set", "device": write["device"], "register": write["register"], "before": write["before"],
                "after": write["after"], "argv": setpci_argv(self.setpci, self.fs.root, write["device"], write["register"], write["after"])}

    def diff_state(self, devices: dict, when: str, existing: dict, persist_text: str | None) -> dict:
        return {"registers": {b: {"mps": d[f"mps_{when}"], "mrrs": d[f"mrrs_{when}"]} for b, d in sorted(devices.items())},
                "boot_unit_enabled": self.fs.exists(UNIT_WANTS), "persisted": sorted(existing)}

    def finish(self, result: dict, actions: list[dict], before_state: dict, devices: dict, entries: list[dict], persist: bool) -> dict:
        shown = shown_actions(actions)
        result.update(changed=bool(shown), actions=shown)
        after = self.diff_state(devices, "after", {}, None)
        after["boot_unit_enabled"] = bool(persist and entries)
        after["persisted"] = sorted(e["bdf"] for e in entries) if persist else []
        # the registers and the boot unit's state, then each file written or removed (its text); finish() returns it
        # in diff mode only
        result["diff"] = [{"before": before_state, "after": after}] + self.file_diffs(actions)
        return result


def execute(params: dict, host: Host, check_mode: bool) -> dict:
    """The pcie_payload module's run: the options checked (PayloadError, TopologyError: nothing done), setpci found,
    then state present (set MaxPayload/MaxReadReq) or default (restore the recorded originals)."""
    p = params
    mps = parse_mps(p["mps"])
    mrrs = parse_size(p["mrrs"], "mrrs") if p["mrrs"] is not None else None
    mrrs_cap = parse_size(p["mrrs_cap"], "mrrs_cap") if p["mrrs_cap"] is not None else None
    if not p["state_dir"].startswith("/"):
        raise PayloadError(f"state_dir must be an absolute path on the host, got {p['state_dir']!r}.")
    if p["state"] == "present" and mps is None and mrrs is None and mrrs_cap is None:
        raise PayloadError("Nothing to set: give mps (max_safe or bytes), mrrs or mrrs_cap, or state: default to restore.")
    devices = normalize_bdfs(p["devices"])
    payload = PciePayload(host, host.cmd.find_live("setpci", required=True), p["state_dir"], check_mode)
    if p["state"] == "present":
        return payload.present(devices, mps, mrrs, mrrs_cap, p["include_path"], p["persist"], p["on_readonly"],
                               p["force"], p["defer_to_boot"])
    return payload.default(devices, p["persist"], p["force"])

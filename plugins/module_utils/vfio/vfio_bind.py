# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.vfio_bind executes (``execute``): read the bindings, check the IOMMU groups, plan,
bind or unbind through sysfs (each step read back, the whole run rolled back on a failure), persist
through modprobe.d or udev, and report. ``vfio/binding.py`` holds the pure planning it builds on; ``bind()`` takes
``modprobe(name)``, which execute() builds over the Host's HostCmd (modprobe_with); nothing here imports
AnsibleModule.
"""

from __future__ import annotations

import json

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import PCI_DEVICES, PciWalker, normalize_bdf
from ansible_collections.gpufleet.inference.plugins.module_utils.vfio.binding import (
    DRIVERS_PROBE, MODPROBE_CONF, PCI_DRIVERS, STATE_FILE, UDEV_RULES, VFIO, BindWatcher, VfioError, check_groups,
    describe_action, display_reasons, in_use, iommu_enabled, load_originals, parse_modprobe, plan_absent, plan_persist, plan_present,
    read_state, remember, resolve, result_action,
)


EINVAL = 22


def _render_bindings(states: dict) -> str:
    return "".join(f"{bdf}: driver={st['driver'] or 'none'} driver_override={st['driver_override'] or 'none'}\n"
                   for bdf, st in sorted(states.items()))


class ApplyFailed(VfioError, Failed):
    """A kernel step failed after others ran (rolled back where it could be): a VfioError that says changed (the functions
    were unbound and probed again) and lists the actions, for finish()."""

    def __init__(self, msg: str, **fields):
        Failed.__init__(self, msg, **fields)


def _predict(states: dict, actions: list) -> dict:
    """The bindings the actions would leave (for check mode and the diff)."""
    out = {bdf: dict(st) for bdf, st in states.items()}
    for a in actions:
        st = out.get(a.get("bdf"))
        if st is None:
            continue
        if a["op"] == "override":
            st["driver_override"] = a["value"]
        elif a["op"] == "unbind":
            st["driver"] = None
        elif a["op"] == "probe":
            st["driver"] = a["expect"] or st["driver"]
    return out


class Applier:
    """Runs runtime actions against the kernel through HostFS; remembers what it did for a rollback."""

    def __init__(self, fs: HostFS, modprobe, watcher: BindWatcher, timeout: float):
        self.fs = fs
        self.modprobe = modprobe
        self.watcher = watcher
        self.timeout = timeout

    def run(self, a: dict) -> None:
        op, bdf = a["op"], a.get("bdf")
        try:
            if op == "override":
                self.fs.write_text(f"{PCI_DEVICES}/{bdf}/driver_override", (a["value"] or "") + "\n")
                got = self.fs.read_optional(f"{PCI_DEVICES}/{bdf}/driver_override")
                want = a["value"] or "(null)"
                if (got or "(null)") not in (want, a["value"] or ""):
                    raise VfioError(f"Wrote {a['value'] or 'nothing'} to {PCI_DEVICES}/{bdf}/driver_override but it reads back "
                                    f"'{got}': the kernel did not take the override. Check dmesg.")
            elif op == "unbind":
                self.fs.write_text(f"{PCI_DEVICES}/{bdf}/driver/unbind", bdf)
                if self.watcher.driver(bdf) == a["driver"]:
                    raise VfioError(f"{bdf} is still bound to {a['driver']} after the unbind: the driver refused to let go. "
                                    "Check dmesg, stop what uses the device, and run again.")
            elif op == "modprobe":
                self.modprobe(a["module"])
                if a.get("driver") and not self.fs.isdir(f"{PCI_DRIVERS}/{a['driver']}"):
                    raise VfioError(f"modprobe {a['module']} succeeded but {PCI_DRIVERS}/{a['driver']} did not appear: "
                                    f"the module does not provide the {a['driver']} PCI driver on this kernel.")
            elif op == "remove_id":
                try:
                    self.fs.write_text(f"{PCI_DRIVERS}/{VFIO}/remove_id", a["id"].replace(":", " "))
                except HostFSError:
                    pass  # the ID was not in the dynamic table: nothing to remove
            elif op == "probe":
                self._probe(a)
        except HostFSError as err:
            if op == "probe" and err.errno == EINVAL:
                raise VfioError(
                    f"Failed to bind {bdf} to {a['expect'] or 'its driver'}: the kernel answered '{err.strerror}' (-22) to the "
                    f"probe. vfio-pci does this when the IOMMU is off or the function has no IOMMU group: boot with "
                    f"intel_iommu=on (AMD: amd_iommu=on) and iommu=pt, then reboot; 'dmesg | grep -i vfio' tells more.") from None
            raise VfioError(f"Failed to {describe_action(a)}: {err}. Run as root on the live host, and check dmesg.") from None

    def _probe(self, a: dict) -> None:
        bdf, expect = a["bdf"], a["expect"]
        self.fs.write_text(DRIVERS_PROBE, bdf)
        got = self.watcher.wait(bdf, expect, self.timeout)
        if expect and got != expect:
            if got:
                why = (f"{got} claimed it first: driver_override is clear, so any matching loaded driver may take it. Unload "
                       f"{got} or blacklist it, or set restore_driver: {got}.")
            elif expect == VFIO:
                why = ("Check 'dmesg | tail' for vfio-pci's reason, usually the IOMMU: intel_iommu=on (AMD: amd_iommu=on) "
                       "on the kernel command line.")
            else:
                why = f"Check 'dmesg | tail' for {expect}'s reason, and that {expect} drives this device ID."
            raise VfioError(f"Failed to bind {bdf} to {expect}: after {self.timeout:g} s it is "
                            f"{'bound to ' + got if got else 'bound to no driver'}. {why}")


def _rollback(fs: HostFS, applier: Applier, before: dict, touched: list[str]) -> list[str]:
    """Put touched functions back as they were; returns notes for the error message."""
    notes = []
    for bdf in touched:
        st = before[bdf]
        steps = [{"op": "override", "bdf": bdf, "value": st["driver_override"]}]
        now = applier.watcher.driver(bdf)
        if now and now != st["driver"]:
            steps.append({"op": "unbind", "bdf": bdf, "driver": now})
        if st["driver"] and now != st["driver"]:
            steps.append({"op": "probe", "bdf": bdf, "expect": st["driver"]})
        try:
            for step in steps:
                applier.run(step)
            notes.append(f"{bdf} restored to {st['driver'] or 'no driver'}")
        except VfioError as err:
            notes.append(f"{bdf} could not be restored ({err})")
    return notes


def modprobe_with(cmds):
    """The ``modprobe(name)`` bind() takes, over the Host's HostCmd: loads a kernel module on the live host only."""

    def modprobe(name: str) -> None:
        if cmds.chrooted:
            raise VfioError(f"The {name} driver is not loaded in the tree under root {cmds.fs.root}: the module loads "
                            "kernel modules only on the live host (root: /).")
        argv = [cmds.find("modprobe", required=True), name]
        rc, out, err = cmds.run(argv)
        if rc != 0:
            raise VfioError(f"'{' '.join(argv)}' failed with rc {rc}: {(err or out).strip()}. Install the module for the "
                            f"running kernel (uname -r), or build {name} into it.")

    return modprobe


def execute(params: dict, host: Host, check_mode: bool) -> dict:
    """The vfio_bind module's run: the timeout checked (Failed, nothing changed), then bind() on the Host's files,
    kernel modules loaded through its HostCmd (modprobe_with), warnings to ``host.warn``."""
    if not 0 < params["timeout"] <= 600:  # nan too
        raise Failed(f"timeout must be a positive number of seconds, at most 600, got {params['timeout']}", changed=False)
    return bind(params, host.fs, check_mode, modprobe_with(host.cmd), warn=host.warn)


def bind(params: dict, fs: HostFS, check_mode: bool, modprobe, watcher: BindWatcher | None = None, warn=None) -> dict:
    """The whole run: select, read, check, plan, apply, read back. Raises VfioError with the reason.
    ``modprobe(name)`` loads a kernel module; ``watcher`` (a BindWatcher of ``fs`` by default) waits for the binds."""
    run = _Run(params, fs, warn or (lambda msg: None))
    runtime, file_actions = run.check_and_plan()
    steps = run.with_modules(runtime)
    after_states = _predict(run.states, steps)
    originals = run.originals
    new_originals = remember(originals, run.order) if run.state == "present" else given_back(originals, after_states)
    orig_action = []
    if new_originals != originals and (steps or file_actions):  # bookkeeping only alongside a real change
        orig_action = [{"op": "write", "path": STATE_FILE, "internal": True,
                        "after": json_text(new_originals) if new_originals else None}]
    wait_source = None
    if not check_mode:
        after_states, new_originals, wait_source = run.apply(steps, file_actions, orig_action, new_originals,
                                                             (modprobe, watcher))
    return run.result(steps, file_actions, after_states, new_originals, wait_source)


class _Run:
    """One vfio_bind run: the options, the targets and their bindings as read, what the checks found (``usage``,
    ``groups``), and the steps: check and plan, the kernel modules the probes need, apply, the result."""

    def __init__(self, params: dict, fs: HostFS, warn):
        self.params, self.fs, self.warn = params, fs, warn
        self.allow = []
        for raw in params.get("group_allow") or []:
            bdf = normalize_bdf(raw)
            if bdf is None:
                raise VfioError(f"group_allow: '{raw}' is not a PCI address; write it as DDDD:BB:DD.F (0000:3b:00.3).")
            self.allow.append(bdf)
        self.walker = PciWalker(fs)
        self.targets = resolve(self.walker, params["devices"], companions=params["companions"])
        self.states = {t["bdf"]: read_state(self.walker, t["bdf"]) for t in self.targets}
        self.order = [self.states[t["bdf"]] for t in self.targets]
        self.originals = load_originals(fs)
        self.state, self.persist = params["state"], params["persist"]
        self.usage: dict[str, list] = {bdf: [] for bdf in self.states}
        self.groups: dict = {}
        self.groups_on = iommu_enabled(fs)

    def check_and_plan(self) -> tuple[list[dict], list[dict]]:
        """The runtime steps and the file steps; VfioError naming every problem found (nothing changed)."""
        problems: list[str] = []
        pending: list[dict] = []
        if self.state == "present":
            runtime, releasing, pending = self._plan_present(problems)
        else:
            runtime = plan_absent(self.order, self.originals, self.params.get("restore_driver"))
            releasing = [a["bdf"] for a in runtime if a["op"] == "unbind"]
        problems += self._check_in_use(releasing)
        if self.state == "present" and not self.groups_on and pending:
            self.warn(f"No IOMMU groups on this host: the group check of {', '.join(s['bdf'] for s in pending)} runs when "
                      "the module runs again after the reboot with the IOMMU on.")
        file_actions, persist_problems = plan_persist(self.fs, self.persist, self.state, self.order, self.originals, self.walker)
        problems += persist_problems
        if problems:
            raise VfioError(" ".join(problems) + " Nothing was changed.")
        return runtime, file_actions

    def _plan_present(self, problems: list[str]) -> tuple[list[dict], list[str], list[dict]]:
        """state=present: (runtime steps, the functions to release from their driver, the functions not on vfio-pci);
        a display console, a group that cannot be split, are added to ``problems``; the IOMMU off with bind_now fails."""
        params = self.params
        pending = [s for s in self.order if s["driver"] != VFIO]
        for st in pending:
            shown = display_reasons(self.walker, st["bdf"])
            if shown and params.get("force_display"):
                self.warn("; ".join(shown) + ". Binding it to vfio-pci anyway (force_display: true).")
            elif shown:
                problems.append("; ".join(shown) + ". Binding it to vfio-pci takes that console away (a blank screen, no "
                                "BMC remote console). Leave it out of devices, or set force_display: true.")
        if params["bind_now"] and pending and not self.groups_on:
            raise VfioError(
                f"Failed to bind {', '.join(s['bdf'] for s in pending)} to {VFIO}: the IOMMU is off on this host "
                f"(/sys/kernel/iommu_groups is empty), and vfio-pci refuses functions without an IOMMU group (-22). "
                f"Put intel_iommu=on (AMD: amd_iommu=on) and iommu=pt on the kernel command line and reboot (the vfio role "
                f"does both), or run with bind_now: false to write only the persistent configuration.")
        if self.groups_on:
            self.groups, group_problems = check_groups(self.walker, self.states, self.allow)
            problems += group_problems
        runtime = plan_present(self.order) if params["bind_now"] else []
        # a function in use now is also refused when only the persistent rule is written: the next boot takes it
        releasing = [s["bdf"] for s in pending if s["driver"] and (params["bind_now"] or self.persist != "none")]
        return runtime, releasing, pending

    def _check_in_use(self, releasing: list[str]) -> list[str]:
        """Who uses each function to release (``usage``): a problem, or with force a warning."""
        problems = []
        for bdf in releasing:
            self.usage[bdf] = in_use(self.walker, self.states[bdf])
            if self.usage[bdf]:
                st = self.states[bdf]
                when = ("" if self.params["bind_now"] or self.state == "absent"
                        else " Writing the persistent rule would take it away at the next boot.")
                msg = f"{bdf} ({st['class_name']}, on {st['driver']}) is in use: {'; '.join(self.usage[bdf])}.{when}"
                if self.params["force"]:
                    self.warn(msg + " Releasing it anyway (force: true).")
                else:
                    problems.append(msg + " Stop what uses it (or unmount it), or set force: true to release it anyway.")
        return problems

    def with_modules(self, runtime: list[dict]) -> list[dict]:
        """The runtime steps with the kernel modules the probes need loaded first, and (state=absent) the device ID
        taken out of vfio-pci's dynamic table where modprobe.d put it there."""
        steps: list[dict] = []
        loaded: set[str] = set()
        ids_in_modprobe = set(parse_modprobe(self.fs.read_optional(MODPROBE_CONF))[0])
        for a in runtime:
            if a["op"] == "probe":
                driver = a["expect"]
                if driver and driver not in loaded and not self.fs.isdir(f"{PCI_DRIVERS}/{driver}"):
                    steps.append({"op": "modprobe", "module": a.get("module") or driver, "driver": driver})
                    loaded.add(driver)
                if self.state == "absent" and self.states[a["bdf"]]["id"] in ids_in_modprobe:
                    steps.append({"op": "remove_id", "id": self.states[a["bdf"]]["id"]})
            steps.append(a)
        return steps

    def apply(self, steps: list[dict], file_actions: list[dict], orig_action: list[dict], new_originals: dict,
              kernel: tuple) -> tuple[dict, dict, str | None]:
        """Outside check mode: the originals recorded first (present), the kernel steps (kernel_steps()), the files,
        the bindings read back. Returns (bindings after, the originals record after, the wait source)."""
        fs, originals = self.fs, self.originals
        for a in orig_action:
            if self.state == "present":  # record before the first change
                _write_state(fs, a["after"])
        wait_source = self.kernel_steps(steps, *kernel) if steps else None
        for a in file_actions:
            if a["op"] == "write":
                fs.write_atomic(a["path"], a["after"])
            else:
                fs.remove(a["path"])
        after_states = {bdf: read_state(self.walker, bdf) for bdf in self.states}
        if self.state == "absent" and orig_action:  # forget only the functions that are back on a driver now
            new_originals = given_back(originals, after_states)
            _write_state(fs, json_text(new_originals) if new_originals else None)
        if self.params["bind_now"] and self.state == "present":
            wrong = [b for b, s in after_states.items() if s["driver"] != VFIO]
            if wrong:
                raise VfioError(f"After the run {', '.join(wrong)} is not on {VFIO}: something rebound it. Check dmesg and udev rules.")
        return after_states, new_originals, wait_source

    def kernel_steps(self, steps: list[dict], modprobe, watcher: BindWatcher | None) -> str:
        """Run the kernel steps in order; on a failure roll the touched functions back (present) and raise
        ApplyFailed. Returns how the binds were waited for (the watcher's source)."""
        watcher = watcher or BindWatcher(self.fs)
        applier = Applier(self.fs, modprobe, watcher, self.params["timeout"])
        touched: list[str] = []
        try:
            for a in steps:
                if a.get("bdf") and a["bdf"] not in touched:
                    touched.append(a["bdf"])
                applier.run(a)
        except VfioError as err:
            notes = _rollback(self.fs, applier, self.states, touched) if self.state == "present" else []
            # the functions were unbound and probed again (reset) even where rolled back: that is a change
            raise ApplyFailed(f"{err}{' Rolled back: ' + '; '.join(notes) + '.' if notes else ''}", changed=bool(touched),
                              actions=[result_action(a, self.states) for a in steps]) from None
        finally:
            watcher.close()
        return watcher.source

    def result(self, steps: list[dict], file_actions: list[dict], after_states: dict, new_originals: dict,
               wait_source: str | None) -> dict:
        """The module's result: the actions, each target's binding before and after, the groups, the persistence
        and the diff (the bindings, then each file)."""
        states, originals = self.states, self.originals
        actions = [result_action(a, states) for a in steps + file_actions]
        devices = []
        for t in self.targets:
            bdf = t["bdf"]
            b, a = states[bdf], after_states[bdf]
            devices.append({
                "bdf": bdf, "id": b["id"], "class_name": b["class_name"], "selected_by": t["selected_by"],
                "companion_of": t["companion_of"], "iommu_group": b["iommu_group"],
                "driver_before": b["driver"], "driver_after": a["driver"],
                "driver_override_before": b["driver_override"], "driver_override_after": a["driver_override"],
                "original_driver": (new_originals.get(bdf) or originals.get(bdf) or {}).get("driver"),
                "in_use": self.usage[bdf],
            })
        diff = []
        if actions:
            diff.append({"before_header": "bindings", "after_header": "bindings",
                         "before": _render_bindings(states), "after": _render_bindings(after_states)})
            for a in file_actions:
                diff.append({"before_header": a["path"], "after_header": a["path"], "before": a["before"], "after": a["after"]})
        changed_files = [a["path"] for a in file_actions]
        return {"changed": bool(actions), "actions": actions, "devices": devices, "groups": self.groups,
                "iommu_enabled": self.groups_on, "persist": {"method": self.persist, "files": changed_files},
                "udev_rules_changed": UDEV_RULES in changed_files,
                "initramfs_update_required": MODPROBE_CONF in changed_files, "wait_source": wait_source, "diff": diff}


def given_back(originals: dict, after_states: dict) -> dict:
    """The originals record after state=absent: an entry is forgotten only when its function is on a driver other than
    vfio-pci (given back); one left without a driver keeps its entry, so that a later run can still restore it."""
    return {k: v for k, v in originals.items()
            if k not in after_states or after_states[k]["driver"] in (None, VFIO)}


def json_text(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _write_state(fs: HostFS, text: str | None) -> None:
    if text is None:
        fs.remove(STATE_FILE)
    else:
        fs.write_atomic(STATE_FILE, text, mode=0o600)

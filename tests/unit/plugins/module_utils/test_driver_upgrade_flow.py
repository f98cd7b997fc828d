# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver upgrade's steps on the shared change flow (driver/upgrade.py), driven against an in-memory host: the
driver's installed packages, the loaded module's version, a process that may hold the GPU, the journal and its
history. The controller executes each action as the role's task files do (install: apt; activate: a module reload,
refused while a process holds the GPU, or a reboot; rollback: the old versions reinstalled and activated) and can be
killed after any action, before its report; a new run then starts with event start and must finish the change."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.change import flow
from ansible_collections.gpufleet.inference.plugins.module_utils.driver import upgrade
from tests.unit.plugins.module_utils.flow_sim import BASE_RUNS

OLD, NEW = "1.0", "1.1"
PACKAGES = ["gpufleet-nvidia-standin-utils", "gpufleet-nvidia-standin-dkms"]
SETTINGS = {"activate": "reload", "reboot_ok": False, "check_mode": False, "lock": True, "verify_pcie": False,
            "outputs": True, "stability": True, "hold_packages": [],
            "gate": {"threshold": 0.95, "alpha": 0.01, "pass_alpha": 0.005, "min_runs": 5, "max_runs": 15}}


class Host:
    """The installed version of the driver's packages, the loaded module's version (it follows the installed one only
    on an activation), whether a process holds the GPU, the journal and the history."""

    def __init__(self, speed_new=1.0, install_ok=True, verify_ok=True, held_by=None, settings=None):
        self.installed, self.loaded, self.held_by = OLD, OLD, held_by
        self.journal, self.history, self.activations, self.now = None, [], 0, 1_796_000_000.0
        self.speed_new, self.install_ok, self.verify_ok = speed_new, install_ok, verify_ok
        self.settings, self.runs = settings or SETTINGS, {}

    def observe(self, event, data):
        self.now += 10
        return {"event": event, "data": data, "preflight": {"ok": True}, "running": self.loaded,
                "default": self.installed, "now": self.now, "target": NEW, "run_id": "run1", "packages": PACKAGES,
                "package_version": NEW, "installed": {p: self.installed for p in PACKAGES},
                "version_file": "/proc/driver/gpufleet_nvidia/version", "state": {"loaded": self.loaded},
                "settings": self.settings}

    def write(self, journal):
        if journal is None:
            return
        if journal.get("finished"):
            self.history.append(copy.deepcopy(journal))
            self.journal = None
        else:
            self.journal = flow.check_journal(upgrade.DRIVER, copy.deepcopy(journal), "journal.json")

    def activate(self, how):
        """driver_reload (refused while the GPU is held) or a reboot; {} when it went, else its failure."""
        if how == "none" or self.loaded == self.installed:
            return {}
        if how == "reload" and self.held_by:
            return {"failed": True, "msg": f"Refusing to reload the driver: {self.held_by} has /dev/nvidia0 open"}
        self.activations += 1
        self.loaded = self.installed
        return {}

    def bench(self, action):
        label, speed = action["label"], self.speed_new if self.loaded == NEW else 1.0
        done = self.runs.get((label, self.loaded), 0)
        runs = [BASE_RUNS[(done + i) % len(BASE_RUNS)] * speed for i in range(action["runs"])]
        self.runs[(label, self.loaded)] = done + len(runs)
        return {"label": label, "samples": runs, "driver": self.loaded, "files": [f"/b/{label}-{done}.json"],
                "contaminated": [], "failed": 0, "requests": 32 * len(runs)}

    def execute(self, action):
        """Do what the role's action file does; the event and data it reports."""
        name, health = action["name"], {"gpus": [{"bdf": "0000:01:00.0"}], "devices": {}}
        if name in ("lock", "commit"):
            return {"lock": "locked", "commit": "committed"}[name], {"locked": action["hold"]}
        if name == "benchmark":
            return "benchmarked", self.bench(action)
        if name == "audit":
            return "audited", {"findings": [], "pcie": health}
        if name == "outputs":
            return "outputs", {"reference": "/var/lib/gpufleet/driver_upgrade/outputs-reference.json", "band": {}}
        if name == "install":
            if not self.install_ok:
                return "installed", {"install": {"failed": True, "rc": 100, "msg": "non-zero return code", "stdout": (
                    "Error! Bad return status for module build on kernel: 6.1.0-50-cloud-amd64 (x86_64)\n"
                    "Consult /var/lib/dkms/gpufleet-nvidia/1.3/build/make.log for more information.\n")}}
            self.installed = NEW
            return "installed", {"install": {"failed": False}}
        if name == "activate":
            activation = self.activate(action["how"])
            ok = self.verify_ok or self.loaded != NEW
            verify = {"ok": ok, "msg": "" if ok else "verify failed: gpus_present: 1 GPU(s) present before are gone",
                      "checks": [{"name": "gpus_present", "ok": ok, "reason": "", "fix": ""}]}
            return "activated", {"activation": activation, "verify": verify}
        if name == "check":
            return "checked", {"outputs": {"verdict": "equivalent", "reason": "equivalent (simulated)"}, "pcie": health,
                               "kernel_log": []}
        if name == "rollback":
            if action["packages"]:
                self.installed = OLD
            if action["reactivate"]:
                self.held_by, self.loaded = None, self.installed  # the old driver comes back (a reboot if held)
            return "rolled_back", {"locked": action["hold"], "server": "serving"}
        raise AssertionError(f"no task file for {name}")


def drive(host: Host, kill_after: int | None = None, max_steps: int = 60) -> dict:
    event, data, done, seen = "start", {}, 0, []
    for _step in range(max_steps):
        journal, action = upgrade.step(host.journal, host.observe(event, data))
        host.write(journal)
        seen.append(action)
        if action["name"] == "finish":
            return {"finish": action, "actions": seen}
        done += 1
        if kill_after is not None and done == kill_after:
            if action["name"] in ("install", "activate", "rollback"):
                host.execute(action)  # the controller died after the action's tasks, before its report
            event, data, kill_after = "start", {}, None
            continue
        event, data = host.execute(action)
    raise AssertionError(f"no finish after {max_steps} steps: {seen[-4:]}")


def names(result):
    return [a["name"] for a in result["actions"]]


def test_a_candidate_as_fast_is_installed_reloaded_verified_and_kept():
    host = Host()
    result = drive(host)
    assert result["finish"]["decision"] == "pass", result["finish"]
    assert (host.installed, host.loaded, host.activations) == (NEW, NEW, 1)
    assert names(result)[:6] == ["lock", "benchmark", "audit", "outputs", "install", "activate"]
    # the packages the upgrade names, whatever their names (the VM lab found the user space left unheld after a rollback)
    assert result["actions"][0]["hold"] == sorted(PACKAGES)
    install = result["actions"][4]
    assert install["packages"] == {p: NEW for p in PACKAGES} and result["actions"][5]["how"] == "reload"
    done = host.history[-1]
    assert done["stage"] == "committed" and done["format"] == upgrade.JOURNAL_FORMAT
    assert done["old_packages"] == {p: OLD for p in PACKAGES}
    assert flow.serving_record(upgrade.DRIVER, done)["stage"] == f"driver {OLD} -> {NEW}"


def test_a_slower_candidate_is_rolled_back_to_the_old_versions_and_activated_again():
    host = Host(speed_new=0.80)
    result = drive(host)
    assert result["finish"]["decision"] == "regression", result["finish"]
    assert (host.installed, host.loaded, host.activations) == (OLD, OLD, 1)
    rollback = result["actions"][-2]
    assert rollback["name"] == "rollback" and rollback["packages"] == {p: OLD for p in PACKAGES}
    assert rollback["reactivate"] is True and rollback["activate"] == "reload"
    assert rollback["hold"] == sorted(PACKAGES)  # the reinstall cleared apt's holds: every named package held again
    assert host.history[-1]["stage"] == "rolled_back"


def test_a_reload_refused_while_a_process_holds_the_gpu_rolls_back_without_touching_it():
    host = Host(held_by="pid 4242 (python3, vllm.service)")
    result = drive(host)
    assert result["finish"]["decision"] == "verify_failed"
    assert "Refusing to reload the driver: pid 4242 (python3, vllm.service)" in result["finish"]["reason"]
    assert host.activations == 0 and host.installed == OLD
    assert result["actions"][-2]["packages"] == {p: OLD for p in PACKAGES}


def test_a_failed_install_and_a_failed_verify_roll_back():
    result = drive(Host(install_ok=False))
    assert result["finish"]["decision"] == "preflight_failed"
    assert "Bad return status for module build" in result["finish"]["reason"]
    host = Host(verify_ok=False)
    result = drive(host)
    assert result["finish"]["decision"] == "verify_failed" and "gpus_present" in result["finish"]["reason"]
    assert (host.installed, host.loaded) == (OLD, OLD)


@pytest.mark.parametrize("kill_after", range(1, 14))
@pytest.mark.parametrize("speed", [1.0, 0.8], ids=["kept", "rolled-back"])
def test_a_controller_killed_after_any_action_is_finished_correctly_by_a_rerun(kill_after, speed):
    host = Host(speed_new=speed)
    result = drive(host, kill_after=kill_after)
    expected = (NEW, "pass") if speed == 1.0 else (OLD, "regression")
    assert (host.loaded, result["finish"]["decision"]) == expected, result["finish"]
    assert host.installed == host.loaded
    assert len(host.history) == 1 and host.history[0]["finished"]


def test_check_mode_no_opt_in_already_and_no_driver_change_nothing():
    for settings in (dict(SETTINGS, check_mode=True), dict(SETTINGS, activate="reboot", reboot_ok=False)):
        host = Host(settings=settings)
        result = drive(host)
        assert result["finish"]["decision"] == "planned" and names(result) == ["lock", "finish"]
        assert host.installed == OLD and host.journal is None and host.history == []
    host = Host()
    host.installed = host.loaded = NEW
    assert drive(host)["finish"]["decision"] == "already"
    host = Host()
    host.loaded = None
    assert drive(host)["finish"]["decision"] == "refused"


def test_a_setting_no_step_can_use_is_refused():
    with pytest.raises(flow.FlowError, match="activate 'kexec' is not one of reload, reboot"):
        upgrade.step(None, Host(settings=dict(SETTINGS, activate="kexec")).observe("start", {}))

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM upgrade's steps on the shared change flow (vllm/upgrade.py), driven against an in-memory host: the unit's
venv link, the version the unit runs, the venvs on disk, the journal and its history. The controller executes each
action as roles/vllm_upgrade does (the install builds a venv beside the old one, the switch moves the link and
restarts, the rollback moves it back and restarts) and can be killed after any action, before its report; a new run
then starts with event start and must finish the change correctly."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.change import flow
from ansible_collections.gpufleet.inference.plugins.module_utils.vllm import upgrade
from tests.unit.plugins.module_utils.flow_sim import BASE_RUNS

OLD, NEW = "0.32.0", "0.33.1"
VENVS = {OLD: "/opt/gpufleet/vllm/vllm-0.32.0-aaaa", NEW: "/opt/gpufleet/vllm/vllm-0.33.1-bbbb"}
SETTINGS = {"restart_ok": True, "check_mode": False, "lock": True, "verify_pcie": False, "outputs": True,
            "stability": True, "findings": "fail",
            "gate": {"threshold": 0.95, "alpha": 0.01, "pass_alpha": 0.005, "min_runs": 5, "max_runs": 15}}
FALLBACK = {"id": "attention_fallback", "severity": "warning", "message": "FLASH_ATTN unavailable, using TRITON_ATTN"}


class Host:
    """The unit's link (``link``: the version it points at), the version the unit runs (``serving``: it follows the link
    only on a restart), the venvs on disk, the journal and the history."""

    def __init__(self, speed_new=1.0, outputs_new="equivalent", ready_new=True, findings_new=(), install_ok=True,
                 settings=None):
        self.link, self.serving, self.venvs = OLD, OLD, {OLD}
        self.journal, self.history, self.restarts, self.now = None, [], 0, 1_796_000_000.0
        self.speed_new, self.outputs_new, self.ready_new, self.findings_new = speed_new, outputs_new, ready_new, findings_new
        self.install_ok, self.settings, self.runs = install_ok, settings or SETTINGS, {}

    def observe(self, event, data):
        self.now += 10
        link = self.link
        return {"event": event, "data": data, "preflight": {}, "running": link, "default": link,
                "current_link": "/opt/gpufleet/vllm/current", "current_venv": VENVS.get(link), "now": self.now,
                "target": NEW, "run_id": "run1", "settings": self.settings}

    def write(self, journal):
        if journal is None:
            return
        if journal.get("finished"):
            self.history.append(copy.deepcopy(journal))
            self.journal = None
        else:
            self.journal = flow.check_journal(upgrade.VLLM, copy.deepcopy(journal), "journal.json")

    def restart(self):
        self.restarts += 1
        self.serving = self.link

    def ready(self):
        findings = list(self.findings_new) if self.serving == NEW else []
        ok = self.ready_new or self.serving != NEW
        return {"ok": ok, "msg": "" if ok else "GET /health: connection refused", "kernel_path": {"findings": findings}}

    def bench(self, action):
        label, speed = action["label"], self.speed_new if self.serving == NEW else 1.0
        done = self.runs.get((label, self.serving), 0)
        runs = [BASE_RUNS[(done + i) % len(BASE_RUNS)] * speed for i in range(action["runs"])]
        self.runs[(label, self.serving)] = done + len(runs)
        return {"label": label, "samples": runs, "version": self.serving, "files": [f"/b/{label}-{done}.json"],
                "contaminated": [], "failed": 0, "requests": 32 * len(runs)}

    def execute(self, action):
        """Do what the role's action file does; the event and data it reports."""
        name = action["name"]
        health = {"gpus": [{"bdf": "0000:01:00.0"}], "devices": {}}
        if name == "lock":
            return "locked", {"locked": []}
        if name == "benchmark":
            return "benchmarked", self.bench(action)
        if name == "audit":
            return "audited", {"findings": [], "pcie": health}
        if name == "outputs":
            return "outputs", {"reference": "/var/lib/gpufleet/vllm_upgrade/outputs-reference.json", "band": {}}
        if name == "install":
            if not self.install_ok:
                return "installed", {"install": {"failed": True, "msg": "No matching distribution for vllm==0.33.1"}}
            self.venvs.add(NEW)
            return "installed", {"venv": VENVS[NEW], "version": NEW, "install": {"failed": False},
                                 "ready_before": self.ready()}
        if name == "switch":
            self.link = NEW
            self.restart()
            return "switched", {"ready": self.ready()}
        if name == "check":
            verdict = self.outputs_new if self.serving == NEW else "equivalent"
            return "checked", {"outputs": {"verdict": verdict, "reason": f"{verdict} (simulated)"}, "pcie": health,
                               "kernel_log": []}
        if name == "commit":
            return "committed", {"locked": []}
        if name == "rollback":
            self.link = OLD
            if action["restart"]:
                self.restart()
            return "rolled_back", {"locked": [], "server": "serving"}
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
            if action["name"] in ("switch", "rollback", "install"):
                host.execute(action)  # the controller died after the action's tasks, before its report
            event, data, kill_after = "start", {}, None
            continue
        event, data = host.execute(action)
    raise AssertionError(f"no finish after {max_steps} steps: {seen[-4:]}")


def names(result):
    return [a["name"] for a in result["actions"]]


def test_a_candidate_as_fast_and_as_correct_is_kept_and_the_link_points_at_it():
    host = Host()
    result = drive(host)
    assert result["finish"]["decision"] == "pass", result["finish"]
    assert (host.link, host.serving, host.restarts) == (NEW, NEW, 1)
    assert names(result)[:6] == ["lock", "benchmark", "audit", "outputs", "install", "switch"]
    done = host.history[-1]
    assert done["stage"] == "committed" and done["format"] == upgrade.JOURNAL_FORMAT
    assert done["old_venv"] == VENVS[OLD] and done["target_venv"] == VENVS[NEW]
    commit = result["actions"][-2]
    assert commit["name"] == "commit" and commit["old_venv"] == VENVS[OLD] and commit["venv"] == VENVS[NEW]
    assert flow.serving_record(upgrade.VLLM, done)["stage"] == f"vllm {OLD} -> {NEW}"


@pytest.mark.parametrize("host, decision", [
    (Host(outputs_new="diverged"), "diverged"),
    (Host(speed_new=0.80), "regression"),
    (Host(ready_new=False), "verify_failed"),
    (Host(findings_new=[FALLBACK]), "verify_failed"),
], ids=["outputs-diverge", "slower", "not-ready", "new-fallback"])
def test_a_failing_candidate_is_switched_back_and_restarted_without_a_reboot(host, decision):
    result = drive(host)
    assert result["finish"]["decision"] == decision, result["finish"]
    assert (host.link, host.serving) == (OLD, OLD)
    assert host.restarts == 2  # the switch, then the switch back
    rollback = result["actions"][-2]
    assert rollback["name"] == "rollback" and rollback["venv"] == VENVS[OLD] and rollback["restart"] is True
    assert "reboot" not in rollback
    assert host.history[-1]["stage"] == "rolled_back"


def test_a_new_fallback_in_note_mode_is_named_in_the_verdict_and_the_candidate_is_judged():
    host = Host(findings_new=[FALLBACK], settings=dict(SETTINGS, findings="note"))
    result = drive(host)
    assert result["finish"]["decision"] == "pass"
    assert "attention_fallback (warning)" in result["finish"]["reason"]
    assert host.history[-1]["verify"]["new_findings"] == [FALLBACK]


def test_a_finding_the_old_version_had_too_is_not_new():
    host = Host(findings_new=[FALLBACK])
    host.ready = lambda: {"ok": True, "msg": "", "kernel_path": {"findings": [FALLBACK]}}  # old and new alike
    assert drive(host)["finish"]["decision"] == "pass"


def test_an_install_that_fails_rolls_back_without_a_restart_and_nothing_was_switched():
    host = Host(install_ok=False)
    result = drive(host)
    assert result["finish"]["decision"] == "preflight_failed"
    assert "No matching distribution" in result["finish"]["reason"] and "Nothing was switched" in result["finish"]["reason"]
    assert (host.link, host.serving, host.restarts) == (OLD, OLD, 0)
    assert result["actions"][-2]["restart"] is False


@pytest.mark.parametrize("kill_after", range(1, 14))
@pytest.mark.parametrize("speed", [1.0, 0.8], ids=["kept", "rolled-back"])
def test_a_controller_killed_after_any_action_is_finished_correctly_by_a_rerun(kill_after, speed):
    host = Host(speed_new=speed)
    result = drive(host, kill_after=kill_after)
    expected = (NEW, "pass") if speed == 1.0 else (OLD, "regression")
    assert (host.link, result["finish"]["decision"]) == expected, result["finish"]
    assert host.serving == host.link  # the unit runs what the link says: a switch lost mid-way was redone
    assert len(host.history) == 1 and host.history[0]["finished"]


def test_check_mode_and_no_opt_in_plan_and_change_nothing():
    for settings in (dict(SETTINGS, check_mode=True), dict(SETTINGS, restart_ok=False)):
        host = Host(settings=settings)
        result = drive(host)
        assert result["finish"]["decision"] == "planned"
        assert "install vLLM 0.33.1 into a venv beside it" in result["finish"]["reason"]
        assert host.journal is None and host.history == [] and host.link == OLD
    assert "vllm_upgrade_restart_ok" in result["finish"]["reason"]


def test_a_host_on_the_target_already_and_one_without_a_venv():
    host = Host()
    host.link = host.serving = NEW
    assert drive(host)["finish"]["decision"] == "already"
    obs = Host().observe("start", {})
    obs.update(running=None, default=None, current_venv=None)
    _journal, action = upgrade.step(None, obs)
    assert action["decision"] == "refused" and "vllm_service" in action["reason"]


def test_a_link_moved_outside_the_flow_during_the_candidate_is_a_verdict_of_its_own():
    host = Host()
    event, data = "start", {}
    while True:
        journal, action = upgrade.step(host.journal, host.observe(event, data))
        host.write(journal)
        if action["name"] == "benchmark" and action["label"] == "candidate":
            break
        event, data = host.execute(action)
    host.link = OLD  # an operator, or a vllm_service run, switched it back
    journal, action = upgrade.step(host.journal, host.observe(*host.execute(action)))
    assert journal["verdict"]["decision"] == "reverted" and "moved outside this flow" in journal["verdict"]["reason"]
    assert action["name"] == "rollback"


@pytest.mark.parametrize("bad, match", [
    ({"findings": "maybe"}, "set vllm_upgrade_findings"),
])
def test_settings_no_step_can_use_are_refused(bad, match):
    obs = Host(settings=dict(SETTINGS, **bad)).observe("start", {})
    with pytest.raises(flow.FlowError, match=match):
        upgrade.step(None, obs)


def test_the_installed_event_of_the_wrong_shape_and_a_venv_that_is_the_old_one_are_refused():
    host = Host()
    drive_to = "install"
    event, data = "start", {}
    while True:
        journal, action = upgrade.step(host.journal, host.observe(event, data))
        host.write(journal)
        if action["name"] == drive_to:
            break
        event, data = host.execute(action)
    with pytest.raises(flow.FlowError, match="data field 'venv' is 5, not the candidate venv's path"):
        upgrade.step(host.journal, host.observe("installed", {"venv": 5}))
    with pytest.raises(flow.FlowError, match="is the old one"):
        upgrade.step(host.journal, host.observe("installed", {"venv": VENVS[OLD], "version": NEW}))


@pytest.mark.parametrize("version", ["../etc", "0.33/1", "", "0.33.1 ; rm"])
def test_a_target_that_cannot_name_a_venv_is_refused(version):
    with pytest.raises(upgrade.VersionError, match="is not a vLLM version"):
        upgrade.validate_version(version, "target")


def test_a_rollback_lost_between_the_link_and_the_restart_restarts_on_the_rerun():
    host = Host(speed_new=0.8)
    event, data = "start", {}
    while True:
        journal, action = upgrade.step(host.journal, host.observe(event, data))
        host.write(journal)
        if action["name"] == "rollback":
            break
        event, data = host.execute(action)
    host.link = OLD  # the first task of the rollback ran; the controller died before the restart
    assert host.serving == NEW
    result = drive(host)
    assert result["finish"]["decision"] == "regression"
    assert (host.link, host.serving) == (OLD, OLD)


def test_the_history_keeps_every_vllm_change_with_its_kind_and_verdict(tmp_path):
    from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history as bh  # pylint: disable=import-outside-toplevel
    db = bh.connect(str(tmp_path / "history.sqlite"))
    for host in (Host(), Host(outputs_new="diverged")):
        result = drive(host)
        record = flow.record_facts(upgrade.VLLM, host.history[-1], result["finish"])
        assert record["kind"] == "vllm"
        bh.append_verdict(db, record["serving_verdict"], "gpu1", "vllm_upgrade")
    stored = bh.verdicts(db, "gpu1")
    assert [(v["source"], v["stage"], v["verdict"], v["keep"]) for v in stored] == [
        ("vllm_upgrade", f"vllm {OLD} -> {NEW}", "pass", True), ("vllm_upgrade", f"vllm {OLD} -> {NEW}", "diverged", False)]

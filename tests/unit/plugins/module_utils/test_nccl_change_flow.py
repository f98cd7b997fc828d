# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NCCL change's steps on the shared change flow (nccl/change.py), driven against an in-memory host: the two NCCL
files (their text), the environment the unit's main process started with (systemd loads the EnvironmentFile, then the
unit's own EnvironmentFile, which may override it), the journal and its history. The controller executes each action
as roles/nccl_change does (install: both files written; activate: the unit restarted and proven ready; rollback: the
original bytes put back, or a file removed, and a restart) and can be killed after any action, or in the middle of
one, before its report; a new run then starts with event start and must finish the change correctly."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.change import flow
from ansible_collections.gpufleet.inference.plugins.module_utils.change.flow import SHARED_ACTIONS
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.upgrade import DRIVER
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.flow import KERNEL
from ansible_collections.gpufleet.inference.plugins.module_utils.lint.host_lint import env_file
from ansible_collections.gpufleet.inference.plugins.module_utils.nccl import change
from ansible_collections.gpufleet.inference.plugins.module_utils.nccl.env import (
    NONE_ID, render_conf, render_envfile, resolve, settings_id,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.vllm.upgrade import VLLM
from tests.unit.plugins.module_utils.flow_sim import BASE_RUNS

CONF, ENV = "/etc/nccl.conf", "/etc/gpufleet/nccl.env"
OLD = resolve("pcie_safe")
NEW = resolve("p2p_off")
# The old files as a person might have left them: a comment of their own, no trailing newline in the conf.
OLD_FILES = {"conf": "# tuned by hand 2026-03\n" + render_conf(OLD, "pcie_safe").rstrip("\n"),
             "env": render_envfile(OLD, "pcie_safe") + "# keep PXB: see ticket 4411\n"}
NEW_FILES = {"conf": render_conf(NEW, "p2p_off"), "env": render_envfile(NEW, "p2p_off")}
SETTINGS = {"restart_ok": True, "check_mode": False, "lock": True, "verify_pcie": False, "outputs": True,
            "stability": True, "findings": "fail", "allow_unknown": [], "allow_findings": [],
            "gate": {"threshold": 0.95, "alpha": 0.01, "pass_alpha": 0.005, "min_runs": 5, "max_runs": 15}}
FALLBACK = {"id": "custom_allreduce_off", "severity": "warning", "message": "Custom allreduce is disabled"}


def parse(text):
    return {s.key: s.value for s in env_file(text, ENV, 0)} if text else {}


class Host:
    """The files (``files``: name -> text, None when absent, with their mode and owner), the environment the unit's
    process started with (it follows the files only on a restart; ``unit_env`` is the unit's own EnvironmentFile, loaded
    after the NCCL one), the journal and the history."""

    def __init__(self, speed_new=1.0, outputs_new="equivalent", ready_new=True, findings_new=(), install_ok=True,
                 settings=None, candidate=None, files=None, unit_env=None):
        self.files = dict(OLD_FILES if files is None else files)
        self.modes = {name: ("0644", 0, 0) for name in change.FILES}
        self.unit_env = unit_env or {}
        self.environ = None
        self.restart()  # the unit's start before the change: restarts 1
        self.candidate = dict(NEW if candidate is None else candidate)
        self.journal, self.history, self.now, self.runs = None, [], 1_796_000_000.0, {}
        self.speed_new, self.outputs_new, self.ready_new, self.findings_new = speed_new, outputs_new, ready_new, findings_new
        self.install_ok, self.settings = install_ok, settings or SETTINGS

    def restart(self):
        self.restarts = getattr(self, "restarts", 0) + 1
        self.environ = {"PATH": "/usr/bin", "HOME": "/var/lib/vllm", **parse(self.files["env"]), **self.unit_env}

    def seen(self):
        return change.names(self.candidate, parse(self.files["env"]), self.environ, self.journal)

    def file_record(self, name):
        text = self.files[name]
        mode, uid, gid = self.modes[name]
        import hashlib  # pylint: disable=import-outside-toplevel
        return {"path": {"conf": CONF, "env": ENV}[name], "exists": text is not None, "text": text,
                "sha256": hashlib.sha256(text.encode()).hexdigest() if text is not None else None,
                "mode": mode if text is not None else None, "uid": uid, "gid": gid}

    def observe(self, event, data):
        self.now += 10
        seen = self.seen()
        return {"event": event, "data": data, "preflight": {}, "now": self.now, "run_id": "run1", "unit": "vllm.service",
                "pid": 4242, "environ_error": "", "candidate": self.candidate,
                "files": {n: self.file_record(n) for n in change.FILES}, "settings": self.settings, **seen}

    def write(self, journal):
        if journal is None:
            return
        if journal.get("finished"):
            self.history.append(copy.deepcopy(journal))
            self.journal = None
        else:
            self.journal = change.check_journal(copy.deepcopy(journal), "journal.json")

    def on_candidate(self):
        return self.seen()["environ"] == change.view(self.candidate, change.managed_keys(self.candidate))

    def ready(self):
        findings = list(self.findings_new) if self.on_candidate() else []
        ok = self.ready_new or not self.on_candidate()
        return {"ok": ok, "msg": "" if ok else "GET /health: connection refused", "kernel_path": {"findings": findings}}

    def bench(self, action):
        label, cand = action["label"], self.on_candidate()
        done = self.runs.get((label, cand), 0)
        runs = [BASE_RUNS[(done + i) % len(BASE_RUNS)] * (self.speed_new if cand else 1.0) for i in range(action["runs"])]
        self.runs[(label, cand)] = done + len(runs)
        return {"label": label, "samples": runs, "nccl": self.seen()["running"], "files": [f"/b/{label}-{done}.json"],
                "contaminated": [], "failed": 0, "requests": 32 * len(runs)}

    def execute(self, action, partial=False):
        """Do what the role's action file does; the event and data it reports. ``partial``: the controller dies in the
        middle of the action (the install wrote the conf only; the rollback put the files back but did not restart)."""
        name = action["name"]
        health = {"gpus": [{"bdf": "0000:01:00.0"}], "devices": {}}
        if name in ("lock", "commit"):
            return {"lock": "locked", "commit": "committed"}[name], {"locked": []}
        if name == "benchmark":
            return "benchmarked", self.bench(action)
        if name == "audit":
            return "audited", {"findings": [], "pcie": health}
        if name == "outputs":
            return "outputs", {"reference": "/var/lib/gpufleet/nccl_change/outputs-reference.json", "band": {}}
        if name == "install":
            assert action["settings"] == self.candidate
            before = self.ready()
            self.files["conf"] = render_conf(self.candidate, "p2p_off")
            if partial or not self.install_ok:
                return "installed", {"install": {"failed": True, "msg": f"cannot write {ENV}: No space left on device"}}
            self.files["env"] = render_envfile(self.candidate, "p2p_off")
            return "installed", {"install": {"failed": False}, "ready_before": before}
        if name == "activate":
            if action["restart"]:
                self.restart()
            return "activated", {"restart": {"failed": False, "restarted": action["restart"]}, "ready": self.ready()}
        if name == "check":
            verdict = self.outputs_new if self.on_candidate() else "equivalent"
            return "checked", {"outputs": {"verdict": verdict, "reason": f"{verdict} (simulated)"}, "pcie": health,
                               "kernel_log": []}
        if name == "rollback":
            for f in action["files"]:
                key = "conf" if f["path"] == CONF else "env"
                self.files[key] = f["content"] if f["state"] == "file" else None
            if action["restart"] and not partial:
                self.restart()
            return "rolled_back", {"locked": [], "server": "serving", "files": [f["path"] for f in action["files"]]}
        raise AssertionError(f"no task file for {name}")


def drive(host: Host, kill_after: int | None = None, partial: bool = False, max_steps: int = 60) -> dict:
    """Run the flow to its finish; with ``kill_after`` the controller dies after that many actions (after the action's
    tasks, or in their middle with ``partial``), before the report, and a new run starts."""
    event, data, done, seen = "start", {}, 0, []
    for _step in range(max_steps):
        journal, action = change.step(host.journal, host.observe(event, data))
        host.write(journal)
        seen.append(action)
        if action["name"] == "finish":
            return {"finish": action, "actions": seen}
        done += 1
        if kill_after is not None and done == kill_after:
            host.execute(action, partial=partial)
            event, data, kill_after = "start", {}, None
            continue
        event, data = host.execute(action)
    raise AssertionError(f"no finish after {max_steps} steps: {seen[-4:]}")


def names(result):
    return [a["name"] for a in result["actions"]]


def test_candidate_settings_as_fast_and_as_correct_are_kept_and_the_process_runs_them():
    host = Host()
    result = drive(host)
    assert result["finish"]["decision"] == "pass", result["finish"]
    assert names(result)[:6] == ["lock", "benchmark", "audit", "outputs", "install", "activate"]
    assert host.files == {"conf": NEW_FILES["conf"], "env": NEW_FILES["env"]} and host.restarts == 2
    assert host.environ["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_LEVEL" not in host.environ
    done = host.history[-1]
    assert done["stage"] == "committed" and done["format"] == change.JOURNAL_FORMAT
    assert done["original"]["conf"]["text"] == OLD_FILES["conf"] and done["original"]["env"]["text"] == OLD_FILES["env"]
    assert (done["old_p2p"], done["target_p2p"]) == ("p2p_on (NCCL_P2P_LEVEL=PXB)", "p2p_off")
    assert done["old_settings"] == OLD and done["target_settings"] == NEW
    assert done["verify"]["environ"] == NEW and done["verify"]["problems"] == []
    assert flow.serving_record(change.NCCL, done)["stage"] == f"nccl {done['old']} -> {done['target']}"


@pytest.mark.parametrize("host, decision", [
    (Host(outputs_new="diverged"), "diverged"),
    (Host(speed_new=0.80), "regression"),
    (Host(ready_new=False), "verify_failed"),
    (Host(findings_new=[FALLBACK]), "verify_failed"),
], ids=["outputs-diverge", "slower", "not-ready", "new-fallback"])
def test_failing_settings_are_put_back_byte_for_byte_and_the_unit_restarted(host, decision):
    result = drive(host)
    assert result["finish"]["decision"] == decision, result["finish"]
    assert host.files == OLD_FILES  # the hand-written comment and the missing trailing newline included
    assert host.environ["NCCL_P2P_LEVEL"] == "PXB" and "NCCL_P2P_DISABLE" not in host.environ
    assert host.restarts == 3  # the start, the candidate's, the way back
    rollback = result["actions"][-2]
    assert rollback["name"] == "rollback" and rollback["restart"] is True and "reboot" not in rollback
    assert host.history[-1]["stage"] == "rolled_back"


def test_files_that_did_not_exist_are_removed_on_the_way_back():
    host = Host(speed_new=0.8, files={"conf": None, "env": None})
    result = drive(host)
    assert result["finish"]["decision"] == "regression"
    assert host.files == {"conf": None, "env": None}
    assert [f["state"] for f in result["actions"][-2]["files"]] == ["absent", "absent"]
    assert not any(k.startswith("NCCL_") for k in host.environ)


def test_a_process_that_does_not_hold_the_candidates_values_fails_the_verification_naming_the_key():
    # The unit's own EnvironmentFile (vllm_service_env) is loaded after the NCCL one: a key it sets wins. Here it sets
    # one for the candidate's restart only (it had none before: a baseline where it did is refused, see below).
    host = Host()
    result = None
    event, data = "start", {}
    while result is None:
        journal, action = change.step(host.journal, host.observe(event, data))
        host.write(journal)
        if action["name"] == "finish":
            result = action
            break
        if action["name"] == "activate":
            host.unit_env = {"NCCL_P2P_DISABLE": "0"}  # the unit's own env sets it, later than the NCCL file
        event, data = host.execute(action)
        host.unit_env = {}
    assert result["decision"] == "verify_failed", result
    assert "NCCL_P2P_DISABLE is 0 in vllm.service's process, want 1" in result["reason"]
    assert host.files == OLD_FILES


def test_a_new_start_log_finding_in_note_mode_is_named_in_the_verdict():
    host = Host(findings_new=[FALLBACK], settings=dict(SETTINGS, findings="note"))
    result = drive(host)
    assert result["finish"]["decision"] == "pass"
    assert "custom_allreduce_off (warning)" in result["finish"]["reason"]


@pytest.mark.parametrize("candidate, match", [
    (dict(NEW, NCCL_P2P_DISABEL="1"), "unknown key; did you mean NCCL_P2P_DISABLE"),
    (dict(NEW, NCCL_BUFFSIZE="1K"), "NCCL_BUFFSIZE='1K': 1024 bytes is outside"),
    (dict(NEW, NCCL_NVLS_ENABLE="1"), "NVLink multicast stays off"),
    (dict(NEW, NCCL_PROTO="LL"), "[nccl_proto_forced] "),
    (dict(NEW, NCCL_P2P_DISABLE="true"), "not in their normal form"),
], ids=["unknown-key", "bad-value", "nvls-on", "lint-proto-forced", "not-normalised"])
def test_candidate_settings_are_checked_first_and_refused_before_anything_changes(candidate, match):
    host = Host(candidate=candidate)
    result = drive(host)
    assert result["finish"]["decision"] == "refused" and match in result["finish"]["reason"], result["finish"]
    assert "Nothing was changed" in result["finish"]["reason"]
    assert names(result) == ["finish"] and host.files == OLD_FILES and host.restarts == 1 and host.journal is None


def test_a_lint_finding_the_user_allows_goes_through():
    candidate = dict(NEW, NCCL_PROTO="LL128")
    refused = drive(Host(candidate=candidate))["finish"]
    assert refused["decision"] == "refused" and "nccl_change_allow_findings" in refused["reason"]
    host = Host(candidate=candidate, settings=dict(SETTINGS, allow_findings=["nccl_proto_forced"]))
    assert drive(host)["finish"]["decision"] == "pass" and host.environ["NCCL_PROTO"] == "LL128"


def test_a_service_that_runs_other_settings_than_its_files_is_refused():
    host = Host()
    host.files["env"] = NEW_FILES["env"]  # written, not restarted: a restart is pending
    result = drive(host)
    assert result["finish"]["decision"] == "refused"
    assert "a restart is pending" in result["finish"]["reason"]
    assert "NCCL_P2P_DISABLE is not set in vllm.service's process (want 1)" in result["finish"]["reason"]


def test_a_failed_write_puts_the_original_files_back_without_a_restart():
    host = Host(install_ok=False)
    result = drive(host)
    assert result["finish"]["decision"] == "preflight_failed"
    assert "No space left on device" in result["finish"]["reason"]
    assert host.files == OLD_FILES and host.restarts == 1 and result["actions"][-2]["restart"] is False


@pytest.mark.parametrize("kill_after", range(1, 14))
@pytest.mark.parametrize("partial", [False, True], ids=["after", "midway"])
@pytest.mark.parametrize("speed", [1.0, 0.8], ids=["kept", "rolled-back"])
def test_a_controller_killed_after_or_during_any_action_is_finished_correctly_by_a_rerun(kill_after, partial, speed):
    host = Host(speed_new=speed)
    result = drive(host, kill_after=kill_after, partial=partial)
    expected = (NEW_FILES, "pass") if speed == 1.0 else (OLD_FILES, "regression")
    assert (host.files, result["finish"]["decision"]) == expected, result["finish"]
    assert host.environ == {"PATH": "/usr/bin", "HOME": "/var/lib/vllm", **parse(host.files["env"])}
    assert len(host.history) == 1 and host.history[0]["finished"]


def test_check_mode_and_no_opt_in_plan_and_change_nothing():
    for settings in (dict(SETTINGS, check_mode=True), dict(SETTINGS, restart_ok=False)):
        host = Host(settings=settings)
        result = drive(host)
        assert result["finish"]["decision"] == "planned"
        assert "NCCL_P2P_DISABLE is not set in the running settings (want 1)" in result["finish"]["reason"]
        assert host.journal is None and host.history == [] and host.files == OLD_FILES and host.restarts == 1
    assert "nccl_change_restart_ok" in result["finish"]["reason"]


def test_a_host_that_runs_the_candidate_already():
    host = Host(files=NEW_FILES)
    assert drive(host)["finish"]["decision"] == "already"


def test_files_changed_outside_the_flow_during_the_candidate_are_a_verdict_of_their_own():
    host = Host()
    event, data = "start", {}
    while True:
        journal, action = change.step(host.journal, host.observe(event, data))
        host.write(journal)
        if action["name"] == "benchmark" and action["label"] == "candidate":
            break
        event, data = host.execute(action)
    host.files["env"] = OLD_FILES["env"]  # an nccl_env run (or an operator) put the old settings back and restarted
    host.restart()
    journal, action = change.step(host.journal, host.observe(*host.execute(action)))
    assert journal["verdict"]["decision"] == "reverted" and "changed outside this flow" in journal["verdict"]["reason"]
    assert action["name"] == "rollback"


def test_other_settings_asked_for_while_a_change_is_open_are_refused_and_a_damaged_journal_too():
    host = Host()
    event, data = "start", {}
    for _step in range(3):
        journal, action = change.step(host.journal, host.observe(event, data))
        host.write(journal)
        event, data = host.execute(action)
    host.candidate = dict(NEW, NCCL_DEBUG="INFO")
    _journal, action = change.step(host.journal, host.observe("start", {}))
    assert action["decision"] == "refused"
    damaged = dict(host.journal, original={"conf": {"path": CONF, "exists": True}})
    with pytest.raises(flow.FlowError, match="field 'original'"):
        change.check_journal(damaged, "journal.json")


@pytest.mark.parametrize("bad, match", [({"findings": "maybe"}, "set nccl_change_findings")])
def test_settings_no_step_can_use_are_refused(bad, match):
    obs = Host(settings=dict(SETTINGS, **bad)).observe("start", {})
    with pytest.raises(flow.FlowError, match=match):
        change.step(None, obs)


def test_names_are_stable_and_name_the_managed_view_only():
    assert settings_id({}) == NONE_ID == "nccl-none"
    assert settings_id({"NCCL_A": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}) == \
        settings_id({"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NCCL_A": "1"})
    assert settings_id(NEW).startswith("nccl-") and len(settings_id(NEW)) == 17
    seen = change.names(NEW, OLD, {**OLD, "PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1"}, None)
    assert seen["environ"] == OLD and seen["running"] == seen["default"] != seen["target"]
    assert change.p2p_choice(NEW) == "p2p_off" and change.p2p_choice({}) == "p2p_on"


# Every kind's shape, in one place (it was the vLLM upgrade's test over kernel and vLLM): the same test for every kind.
@pytest.mark.parametrize("kind", [KERNEL, VLLM, DRIVER, change.NCCL], ids=["kernel", "vllm", "driver", "nccl"])
def test_every_kind_answers_the_shared_actions_and_has_the_shared_stages(kind):
    actions = {a["name"]: a["reports"] for a in kind.actions}
    assert {k: actions.get(k) for k in SHARED_ACTIONS} == SHARED_ACTIONS
    assert set(actions.values()) <= set(kind.events)
    assert kind.stages[0] == "baseline" and kind.stages[-5:] == ("candidate", "verdict") + flow.TERMINAL
    assert set(flow.SHARED_EVENTS) <= set(kind.events)
    for event, (stages, _handler) in kind.handlers.items():
        assert event in kind.events and set(stages) <= set(kind.stages)


def test_the_history_keeps_every_nccl_change_with_its_kind_and_verdict(tmp_path):
    from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history as bh  # pylint: disable=import-outside-toplevel
    db = bh.connect(str(tmp_path / "history.sqlite"))
    for host in (Host(), Host(outputs_new="diverged")):
        result = drive(host)
        record = flow.record_facts(change.NCCL, host.history[-1], result["finish"])
        assert record["kind"] == "nccl"
        bh.append_verdict(db, record["serving_verdict"], "gpu1", "nccl_change")
    stored = bh.verdicts(db, "gpu1")
    assert [(v["source"], v["verdict"], v["keep"]) for v in stored] == [
        ("nccl_change", "pass", True), ("nccl_change", "diverged", False)]
    assert all(v["stage"].startswith("nccl nccl-") for v in stored)

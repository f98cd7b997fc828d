# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_upgrade_step's executor on a host tree under tmp_path: the unit's venv link and the venvs' markers read
through HostFS, the journal written durably and archived, the lease and the take-over of the shared step
(change/step.py), and refusals that write nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils.vllm import vllm_upgrade_step as step_mod
from ansible_collections.gpufleet.inference.plugins.module_utils.vllm.upgrade import JOURNAL

BASE = "/opt/gpufleet/vllm"
OLD_VENV = BASE + "/vllm-0.32.0-aaaa"
NOW = 1_796_000_000.0


def venvs(root: Path, current: str = OLD_VENV, versions: dict | None = None) -> None:
    """The vllm_service role's install root: finished venvs (their marker) and the current link."""
    for venv, version in (versions or {OLD_VENV: "0.32.0", BASE + "/vllm-0.33.1-bbbb": "0.33.1"}).items():
        path = root / venv.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        (path / ".gpufleet-complete").write_text(json.dumps({"package": "vllm", "version": version}))
    os.symlink(current, root / BASE.lstrip("/") / "current")


def params(**over) -> dict:
    p = {"target": "0.33.1", "event": "start", "data": {}, "run_id": "run1", "restart_ok": True, "lock": True,
         "verify_pcie": False, "outputs": True, "stability": True, "findings": "fail",
         "gate": {"min_runs": 5, "max_runs": 15}, "base_dir": BASE, "journal": JOURNAL, "lease_run_id": "",
         "take_over": "", "lease_ttl": 7200, "preflight": {}}
    p.update(over)
    return p


def run(root: Path, check_mode: bool = False, **over) -> dict:
    return step_mod.execute(params(**over), Host(HostFS(str(root)), None, None), check_mode, now=NOW)


def baseline(root: Path) -> dict:
    runs = [1000.0, 1012.0, 995.0, 1004.0, 998.0]
    data = {"label": "baseline", "samples": runs, "version": "0.32.0", "files": ["/b.json"], "contaminated": [],
            "requests": 160}
    return run(root, event="benchmarked", data=data)


def test_the_link_names_the_running_version_and_the_start_locks(tmp_path):
    venvs(tmp_path)
    result = run(tmp_path)
    assert (result["running"], result["current_venv"]) == ("0.32.0", OLD_VENV)
    assert result["next_action"]["name"] == "lock" and result["actions"] == [] and not result["changed"]
    assert run(tmp_path, event="locked")["next_action"]["name"] == "benchmark"


def test_the_baseline_opens_the_journal_durably_and_a_finished_one_is_archived(tmp_path):
    venvs(tmp_path)
    result = baseline(tmp_path)
    path = tmp_path / JOURNAL.lstrip("/")
    journal = json.loads(path.read_text())
    assert journal["format"] == "gpufleet.vllm_upgrade_journal/1" and journal["old_venv"] == OLD_VENV
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert result["actions"][-1] == {"action": "write_journal", "path": JOURNAL, "stage": "baseline"}
    assert result["record"]["kind"] == "vllm"
    done = run(tmp_path, event="error", data={"msg": "the benchmark task failed"})
    assert done["next_action"]["decision"] == "error" and not path.exists()
    archived = list((tmp_path / "var/lib/gpufleet/vllm_upgrade/history").iterdir())
    assert len(archived) == 1 and json.loads(archived[0].read_text())["stage"] == "stopped"


def test_check_mode_plans_and_writes_nothing(tmp_path):
    venvs(tmp_path)
    result = run(tmp_path, check_mode=True, event="locked")
    assert result["next_action"]["decision"] == "planned" and not (tmp_path / "var/lib/gpufleet").exists()


def test_a_corrupt_journal_and_a_bad_target_are_refused_and_nothing_is_written(tmp_path):
    venvs(tmp_path)
    path = tmp_path / JOURNAL.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    result = run(tmp_path)
    assert result["next_action"]["decision"] == "refused" and "is not valid JSON" in result["next_action"]["reason"]
    assert f"mv {JOURNAL} {JOURNAL}.broken" in result["next_action"]["reason"]
    assert path.read_text() == "{not json" and result["actions"] == []
    assert "is not a vLLM version" in run(tmp_path, target="../../etc")["next_action"]["reason"]


def test_a_link_to_an_unfinished_venv_is_refused(tmp_path):
    venvs(tmp_path, current=BASE + "/vllm-half", versions={OLD_VENV: "0.32.0"})
    (tmp_path / BASE.lstrip("/") / "vllm-half").mkdir()
    result = run(tmp_path, event="locked")
    assert result["running"] is None and result["next_action"]["decision"] == "refused"
    assert "playbooks/serve.yml" in result["next_action"]["reason"]


def test_a_live_lease_of_another_run_refuses_and_this_runs_lease_is_renewed(tmp_path):
    venvs(tmp_path)
    lease = tmp_path / "var/lib/gpufleet/lease.json"
    lease.parent.mkdir(parents=True)
    lease.write_text(json.dumps({"run_id": "other", "holder": "ctl", "acquired_at": NOW - 10, "expires_at": NOW + 600,
                                 "play": "kernel_upgrade"}))
    result = baseline(tmp_path)
    assert result["next_action"]["decision"] == "refused" and "held by" in result["next_action"]["reason"]
    assert not (tmp_path / JOURNAL.lstrip("/")).exists()
    lease.write_text(json.dumps({"run_id": "run1", "holder": "ctl", "acquired_at": NOW - 10, "expires_at": NOW + 60,
                                 "play": "vllm_upgrade"}))
    result = run(tmp_path, event="locked", lease_run_id="run1")
    assert result["actions"][0]["action"] == "renew_lease", result["next_action"]
    assert json.loads(lease.read_text())["expires_at"] == NOW + 7200

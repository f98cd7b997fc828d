# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Journals written by the release before the shared change flow (format gpufleet.kernel_upgrade_journal/1, written
by main 81bbd13's kernel/flow.py at each stage a controller can be lost at, fixtures/kernel_journal_v1/) still load
from the host and resume to the same end: the flow that replaced it reads them unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.journal import JOURNAL, load_journal
from tests.unit.plugins.module_utils.flow_sim import NEW, OLD, Host, drive

FIXTURES = Path(__file__).parent / "fixtures" / "kernel_journal_v1"
STAGES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def restore(fixture: dict, tmp_path: Path) -> Host:
    """A simulated host in the state the fixture's run left it, its journal read back from a file through HostFS."""
    state, host = fixture["host"], Host()
    host.running, host.default, host.boot, host.boot_at = state["running"], state["default"], state["boot"], state["boot_at"]
    host.now, host.unit, host.once, host.held = state["now"], state["unit"], state["once"], state["held"]
    host.installed = set(state["installed"])
    path = tmp_path / JOURNAL.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(fixture["journal"]))
    host.journal = load_journal(HostFS(str(tmp_path)))
    return host


def test_every_stage_a_controller_can_be_lost_at_has_a_fixture():
    assert STAGES == ["baseline", "boot_once", "booted", "candidate", "pinned", "verdict"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_journal_of_the_previous_release_resumes_to_the_commit(stage, tmp_path):
    fixture = json.loads((FIXTURES / f"{stage}.json").read_text())
    assert fixture["journal"]["format"] == "gpufleet.kernel_upgrade_journal/1" and fixture["journal"]["stage"] == stage
    host = restore(fixture, tmp_path)
    assert host.journal == fixture["journal"]  # read as written: no field dropped or renamed
    result = drive(host)
    assert result["finish"]["decision"] == "pass", result["finish"]
    assert (host.running, host.default) == (NEW, NEW)
    done = host.history[-1]
    assert done["format"] == "gpufleet.kernel_upgrade_journal/1" and done["stage"] == "committed"
    assert done["resumed"][0]["stage"] == stage and done["old"] == OLD
    assert done["baseline"]["samples"] == fixture["journal"]["baseline"]["samples"]  # the recorded baseline is kept

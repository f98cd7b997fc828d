# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_ready's kernel_path: the module against the lab stand-in server (extras/lab_inference_server.py, a
real HTTP server), reading the H200's real vLLM start logs from a file and from the journal (a journalctl
on PATH that prints the stored log, as the unit's journal would hold it)."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from ansible_collections.gpufleet.inference.plugins.modules import vllm_ready as vr
from tests.helpers import REPO
from tests.unit.test_lab_inference_server import LabServer
from tests.unit.plugins.modules.uthelper import run_module

LOGS = os.path.join(REPO, "docs", "examples", "h200-vllm")


@pytest.fixture
def lab(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with LabServer(str(model), "--served-model-name", "tiny") as server:
        yield server


def warnings_of(result) -> list[str]:
    """ansible-core 2.19 returns warnings as events ({"event": {"msg": ...}}), older ones as strings."""
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]


def test_kernel_path_from_a_log_file(lab, capsys):
    result = run_module(vr, {"url": lab.url, "served_model_name": "tiny", "checks": ["health", "models", "completion"],
                             "timeout": 20, "start_log": os.path.join(LOGS, "start-baseline.log")}, capsys)
    kp = result["kernel_path"]
    assert kp["attention_backend"] == "FLASH_ATTN" and kp["cuda_graphs"]["captured"]
    assert kp["cuda_graphs"]["capture_sizes"][-1] == 512 and kp["starts"] == 2
    assert any("open-file limit" in w for w in warnings_of(result))


def test_kernel_path_from_the_journal(lab, capsys, tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = os.path.join(LOGS, "start-eager.log")
    journalctl = bindir / "journalctl"
    journalctl.write_text(f"#!{sys.executable}\nimport sys\nassert '-o' in sys.argv and 'cat' in sys.argv\n"
                          f"sys.stdout.write(open({log!r}).read())\n")
    journalctl.chmod(journalctl.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    result = run_module(vr, {"url": lab.url, "served_model_name": "tiny", "checks": ["health", "models"], "timeout": 20,
                             "unit": "vllm.service", "start_log_journal": True}, capsys)
    kp = result["kernel_path"]
    assert kp["enforce_eager"] is True and kp["cuda_graphs"]["mode"] == "NONE"
    assert any("CUDA graphs are off" in w and "--enforce-eager" in w for w in warnings_of(result))


def test_no_start_log_gives_null(lab, capsys):
    result = run_module(vr, {"url": lab.url, "served_model_name": "tiny", "checks": ["health"], "timeout": 20}, capsys)
    assert result["kernel_path"] is None


def test_unreadable_start_log_warns(lab, capsys, tmp_path):
    result = run_module(vr, {"url": lab.url, "served_model_name": "tiny", "checks": ["health"], "timeout": 20,
                             "start_log": str(tmp_path / "missing.log")}, capsys)
    assert result["kernel_path"] is None and any("could not be read" in w for w in warnings_of(result))

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stored H200 runs (docs/examples/h200-vllm/) replayed: the gate's verdicts, the stage table, the
client comparison and the noise cells recomputed from the raw JSON and checked against expected.yml
(the one place to update when the gate changes); and the rendered argv is the role's for host_vars.yml."""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml

from ansible_collections.gpufleet.inference.plugins.module_utils import throughput_gate as tg
from ansible_collections.gpufleet.inference.plugins.module_utils import vllm_flag_stages as vfs
from tests.helpers import REPO

DIR = os.path.join(REPO, "docs", "examples", "h200-vllm")
sys.path.insert(0, os.path.join(REPO, "tests", "tools"))
sys.path.insert(0, os.path.join(REPO, "tests", "benchmarks"))
import h200_report  # noqa: E402


def load(name):
    with open(os.path.join(DIR, name), encoding="utf-8") as fh:
        return json.load(fh)


EXPECTED = yaml.safe_load(open(os.path.join(DIR, "expected.yml"), encoding="utf-8"))


@pytest.mark.parametrize("label", sorted(EXPECTED["gates"]))
def test_gate_verdicts_recomputed(label):
    rows = {r["label"]: r for r in h200_report.gate_rows(load("gate.json"))}
    want, got = EXPECTED["gates"][label], rows[label]
    assert got["decision"] == want["decision"] and got["final"] is want["final"]
    assert got["runs_needed"] == want.get("runs_needed", 0)
    assert got["ratio"] == pytest.approx(want["ratio"], abs=5e-4)
    assert got["candidate_runs"] == want["candidate_runs"]
    if "p_value" in want:
        assert got["p_value"] == pytest.approx(want["p_value"], abs=5e-5)


def test_gate_runs_are_real_and_interleaved():
    gate = load("gate.json")
    for g in gate["gates"]:
        if not g.get("baseline_runs"):
            assert g.get("deadline_hit"), f"{g['label']}: no runs and no reason"
            continue
        # interleaved one by one: as many baseline as candidate runs, every request answered in full
        assert len(g["baseline_runs"]) == len(g["candidate_runs"])
        for run in g["baseline_runs"] + g["candidate_runs"]:
            assert run["errors"] == 0 and run["requests"] == g["requests"] and run["output_throughput"] > 0


def test_stage_table_recomputed():
    tune = load("tune.json")
    rows = vfs.stage_table(tune["records"], 64)
    assert [r["stage"] for r in rows] == [s["stage"] for s in EXPECTED["stages"]]
    for row, want in zip(rows, EXPECTED["stages"]):
        for key, value in want.items():
            if key.startswith("device_"):
                continue
            if isinstance(value, float):
                assert row[key] == pytest.approx(value, abs=5e-4), key
            else:
                assert row[key] == value, key
    # what the device's gate (the one before issue 17) said and did is stored with the runs; expected.yml keeps it,
    # so the stored records are the ones the table was recomputed from
    for rec, want in zip(tune["records"][1:], EXPECTED["stages"][1:]):
        assert rec["gate"]["decision"]["decision"] == want["device_verdict"]
        assert rec["kept"] is want["device_kept"]
    md = vfs.stage_table_markdown(rows, [16, 64, 256])
    assert md.count("\n") == len(rows) + 2 and "| max_num_seqs 512 | max_num_seqs=512 |" in md


@pytest.mark.parametrize("level", ["16", "64", "256"])
def test_client_comparison_recomputed(level):
    rows = {str(r["concurrency"]): r for r in h200_report.compare_rows(load("compare.json"))}
    want, got = EXPECTED["compare"][level], rows[level]
    assert got["ratio"] == pytest.approx(want["ratio"], abs=5e-4)
    assert got["ours_lower"] is want["ours_lower"] and got["within_target"] is want["within_target"]
    # the client never used a whole core: its own CPU was not what held it back
    assert got["ours_cpu_pct_max"] < 100


def test_noise_cells_recomputed():
    rows = h200_report.noise_rows(load("noise.json"), trials=300)
    assert len(rows) == len(EXPECTED["noise"])
    for row, want in zip(rows, EXPECTED["noise"]):
        assert (row["concurrency"], row["requests"], row["n"]) == (want["concurrency"], want["requests"], 8)
        assert row["cv"] == pytest.approx(want["cv"], abs=5e-4)
        assert row["decides"] is want["decides_drop"]


def test_decide_is_the_gate_default():
    # the stage table and the report judge with decide()'s own defaults (threshold 0.95)
    runs = [r["output_throughput"] for r in load("gate.json")["gates"][0]["baseline_runs"]]
    assert tg.decide(runs, runs)["threshold"] == 0.95


def test_rendered_argv_is_the_roles():
    import h200_vllm
    host_vars = os.path.join(REPO, "tests", "tools", "h200", "host_vars.yml")
    stored = load("rendered.json")
    with open(os.path.join(REPO, "tests", "tools", "h200", "profiles.yml"), encoding="utf-8") as fh:
        profiles = yaml.safe_load(fh)["profiles"]
    for name, overrides in profiles.items():
        now = h200_vllm.render(host_vars, overrides)
        assert now["argv"] == stored[name]["argv"], name
        assert now["environment"] == stored[name]["environment"], name
    assert stored["eager"]["argv"][-1] == "--enforce-eager"
    assert stored["baseline"]["environment"]["NCCL_NVLS_ENABLE"] == "0"

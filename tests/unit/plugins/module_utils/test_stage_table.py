# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stage table from a real measured-tuning state (tests/fixtures/tune_measured/standin_state.json,
made by tests/tools/measured_standin.py against the lab stand-in on 127.0.0.1: baseline max_num_seqs 2,
16 kept, 1 reverted), in Markdown and in HTML opened by headless Chromium."""

from __future__ import annotations

import json
import os

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.inference.plugins.filter.stage_table import stage_table_html, stage_table_markdown
from ansible_collections.gpufleet.inference.plugins.module_utils.tuning import stage_table as st
from tests.helpers import REPO
from tests.unit.browser import inspect_charts

STATE = os.path.join(REPO, "tests", "fixtures", "tune_measured", "standin_state.json")


@pytest.fixture
def state():
    with open(STATE, encoding="utf-8") as fh:
        return json.load(fh)


def test_rows_carry_ratios_verdicts_and_outcomes(state):
    rows = st.rows(state)
    serving = [r for r in rows if r["profile"] == "serving"]
    assert [(r["stage"], r["outcome"]) for r in serving] == [
        ("baseline", "baseline"), ("max_num_seqs_16", "kept"), ("max_num_seqs_1", "reverted")]
    base, kept, bad = serving
    assert base["vs_baseline"] == 1.0 and base["vs_previous"] is None and base["verdict"] is None
    assert kept["vs_baseline"] == pytest.approx(kept["tok_s"] / base["tok_s"])
    assert bad["vs_previous"] == pytest.approx(bad["tok_s"] / kept["tok_s"])
    assert (kept["verdict"], kept["reference"]) == ("pass", "baseline")
    assert (bad["verdict"], bad["reference"]) == ("regression", "max_num_seqs_16") and bad["p_value"] <= 0.01
    assert {r["profile"] for r in rows} == {"serving", "latency", "long_context"}


def test_markdown_has_the_summary_and_the_detail(state):
    md = stage_table_markdown(state, note="stand-in")
    assert "| stage | what changed | tok/s c=16 | x baseline | outcome |" in md
    assert "| max_num_seqs_16 | vllm_service: max_num_seqs=16 |" in md
    assert "regression (p=" in md and "vs max_num_seqs_16" in md and "Threshold auto: 1 - 3 x" in md
    assert "stand-in" in md


def test_html_opens_in_a_real_browser_with_one_chart_per_profile(state, tmp_path):
    page = tmp_path / "stages.html"
    page.write_text(stage_table_html([state]))
    seen = inspect_charts(str(page))
    assert seen["resources"] == []
    charts = {c["id"]: c for c in seen["charts"]}
    assert set(charts) == {f"stages-standin-loopback-{p}" for p in ("serving", "latency", "long_context")}
    for c in charts.values():
        assert c["polylines"] == 1 and c["points"] == 3 and c["annotations"] == 1 and c["width"] > 300


def test_filter_refuses_what_is_not_a_state():
    with pytest.raises(AnsibleFilterError, match="not a measured-tuning state"):
        stage_table_markdown({"stages": []})

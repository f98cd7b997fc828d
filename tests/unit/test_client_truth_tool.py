# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tests/tools/client_truth.py: the server's own count over a client's window (pure helpers on synthetic step
traces), the lab stand-in's --step-trace against our client's own count on a real server, and the tables of
docs/examples/client-truth recomputed from its raw runs against expected.yml."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from tests.helpers import REPO

sys.path.insert(0, os.path.join(REPO, "tests", "tools"))
import client_truth as ct  # noqa: E402

EXAMPLES = os.path.join(REPO, "docs", "examples", "client-truth")


def test_parse_trace_reads_steps_and_refuses_a_short_line():
    assert ct.parse_trace("1.0 1.5 3 3 0\n\n2.0 2.25 2 2 1\n") == [(1.0, 1.5, 3, 3, 0), (2.0, 2.25, 2, 2, 1)]
    with pytest.raises(ValueError, match="line 2 has 4 fields"):
        ct.parse_trace("1.0 1.5 3 3 0\n2.0 2.25 2 2\n")


def test_server_truth_counts_only_the_window_and_splits_its_time():
    # a step before the window (a warm-up's), then 4 steps of 4 sequences and one of 2, then one after the window
    steps = [(0.0, 0.5, 4, 4, 0),
             (10.1, 10.2, 4, 4, 0), (10.2, 10.3, 4, 4, 0), (10.3, 10.4, 4, 4, 0), (10.4, 10.5, 4, 4, 0),
             (10.5, 10.6, 2, 2, 0),
             (12.0, 12.1, 9, 9, 0)]
    truth = ct.server_truth(steps, 10.0, 10.7, concurrency=4)
    assert truth["steps"] == 5 and truth["tokens"] == 18
    assert truth["window_tok_s"] == pytest.approx(18 / 0.7, abs=1e-3)
    assert truth["busy_s"] == pytest.approx(0.5) and truth["busy_tok_s"] == pytest.approx(36.0, abs=1e-3)
    assert truth["lead_s"] == pytest.approx(0.1) and truth["tail_s"] == pytest.approx(0.1)
    # in flight: 4 for 0.4 s and 2 for 0.1 s over a 0.7 s window
    assert truth["mean_running"] == pytest.approx((4 * 0.4 + 2 * 0.1) / 0.7, abs=1e-3)
    assert truth["full_share"] == pytest.approx(0.4 / 0.7, abs=1e-4)
    assert truth["full_tok_s"] == pytest.approx(16 / 0.4, abs=1e-3)


def test_server_truth_of_a_window_without_steps():
    truth = ct.server_truth([(0.0, 1.0, 5, 5, 0)], 2.0, 3.0, concurrency=5)
    assert truth["tokens"] == 0 and truth["busy_tok_s"] is None and truth["full_tok_s"] is None
    assert truth["lead_s"] == pytest.approx(1.0)


def test_reaction_pairs_each_send_with_the_finish_it_replaced():
    # c=2: requests 2 and 3 are sent 5 ms and 1 ms after requests 0 and 1 got their last tokens
    starts = [0.0, 0.0, 1.005, 2.001]
    last = [1.0, 2.0, 3.0, 4.0]
    loop = ct.reaction(starts, last, 2)
    assert loop["first_start"] == 0.0 and loop["last_token"] == 4.0
    assert loop["gap_ms_mean"] == pytest.approx(3.0, abs=1e-6)
    assert loop["gap_ms_p50"] == pytest.approx(5.0, abs=1e-6)  # the upper median of two gaps
    assert ct.reaction([0.0], [1.0], 2)["gap_ms_p50"] is None


def test_window_marks_finds_vllm_bench_start_and_end():
    # serve.py: benchmark_start_time, one perf_counter() per request created, then the end of the window
    marks = [(5.0, 1.0), (7.0, 1.5), (7.001, 1.5), (7.002, 1.5), (9.5, 2.25), (9.6, 2.3)]
    assert ct.window_marks(marks, 2.5) == ((7.0, 1.5), (9.5, 2.25))
    with pytest.raises(ValueError, match="timing changed"):
        ct.window_marks(marks, 3.3)


def test_log_ratio_ci_is_the_t_interval_of_the_log_ratios():
    ratios = [1.02, 1.04, 0.99, 1.03]
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / 3)
    half = 3.182446 * sd / 2  # t(0.975, 3)
    got = ct.log_ratio_ci(ratios)
    assert got["n"] == 4 and got["ratio"] == pytest.approx(math.exp(mean), abs=1e-4)
    assert got["ci"] == pytest.approx([math.exp(mean - half), math.exp(mean + half)], abs=1e-4)
    assert ct.log_ratio_ci([1.0]) is None


def test_verdict_says_inconclusive_unless_the_interval_excludes_one():
    assert ct.verdict({"ci": [1.01, 1.05]}) == "above"
    assert ct.verdict({"ci": [0.95, 0.99]}) == "below"
    assert ct.verdict({"ci": [0.99, 1.02]}) == "inconclusive"
    assert ct.verdict({"ci": [0.99, 1.02]}, target=0.03) == "within"
    assert ct.verdict(None) == "inconclusive"


def test_rotation_changes_who_goes_first_each_round():
    clients = ("ours", "vllm", "ours_text")
    assert [ct.rotation(r, clients)[0] for r in range(4)] == ["ours", "vllm", "ours_text", "ours"]


def test_vllm_bench_gets_the_h200_comparisons_arguments_and_its_details():
    import argparse
    args = argparse.Namespace(prompt_tokens=256, output_tokens=128, warmup=32, tokenizer="/models/tok")
    argv = ct.vllm_argv(args, "http://127.0.0.1:8000", "m", 64, 256, 3)
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--max-concurrency"] == "64" and pairs["--num-prompts"] == "256" and pairs["--seed"] == "3"
    assert pairs["--random-input-len"] == "256" and pairs["--random-output-len"] == "128"
    assert pairs["--num-warmups"] == "32" and pairs["--tokenizer"] == "/models/tok" and pairs["--request-rate"] == "inf"
    assert "--ignore-eos" in argv and argv[-1] == "--save-detailed"  # the worker reads start_times and latencies


@pytest.fixture
def traced_server(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    trace = tmp_path / "steps.txt"
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "extras", "lab_inference_server.py"), "--model",
                             str(model), "--port", "0", "--work", "0", "--step-work", "0", "--step-wait-ms", "1",
                             "--max-num-seqs", "4", "--step-trace", str(trace)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert "Listening on" in line, line
        yield line.rsplit(" ", 1)[1].strip(), trace
    finally:
        proc.terminate()
        proc.wait(10)


def test_step_trace_counts_what_our_client_received(traced_server):
    url, trace = traced_server
    cmd = {"url": url, "prompt_tokens": 8, "output_tokens": 16, "concurrency": 4, "requests": 12, "warmup": 4, "seed": 3}
    got = asyncio.run(ct._ours_once(cmd))
    made = 4 + 16 * 4 + 16 * 12  # preflight (4 tokens), warm-up and measured run: all of them in the trace
    deadline = time.time() + 5
    while time.time() < deadline:  # the engine writes its trace when it idles
        steps = ct.parse_trace(trace.read_text()) if trace.exists() else []
        if sum(s[2] for s in steps) >= made:
            break
        time.sleep(0.02)
    assert sum(s[2] for s in steps) == made
    truth = ct.server_truth(steps, got["t0"], got["t1"], 4)
    assert got["tokens"] == 16 * 12 == truth["tokens"]  # the client's count is the server's over its window
    assert truth["window_tok_s"] == pytest.approx(got["tok_s"], rel=1e-3)
    assert 0 < truth["busy_s"] <= got["window_s"] and truth["mean_running"] <= 4
    assert all(s[3] <= 4 for s in steps) and got["chunks"] >= 12
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    total = [ln for ln in metrics.splitlines() if ln.startswith("vllm:generation_tokens_total")]
    assert float(total[0].rsplit(" ", 1)[1]) == sum(s[2] for s in steps)


def _expected():
    with open(os.path.join(EXAMPLES, "expected.yml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _doc(name="runs.json"):
    import json
    with open(os.path.join(EXAMPLES, name), encoding="utf-8") as fh:
        return json.load(fh)


# the raw runs and the key of their figures in expected.yml
STORED = [("runs.json", "cells"), ("runs-vllm-warmups-64.json", "vllm_warmups_64_cells")]


@pytest.mark.parametrize("name", [n for n, _k in STORED])
def test_the_stored_runs_are_real_paired_and_counted_exactly(name):
    doc = _doc(name)
    assert doc["format"] == ct.FORMAT and doc["runs"]
    for run in doc["runs"]:
        assert run["errors"] == 0 and run["tokens"] == run["requests"] * doc["settings"]["output_tokens"]
        # the server generated every token the client counted inside the client's own window
        assert run["truth"]["tokens"] == run["tokens"], run
        assert run["t0"] < run["t1"] and run["window_s"] == pytest.approx(run["t1"] - run["t0"], abs=1e-5)
    for _key, by_client in ct.cells(doc["runs"]).items():
        rounds = [set(v) for v in by_client.values()]
        assert all(r == rounds[0] for r in rounds), "every client ran in every round of a cell"


def _same(got, want, where):
    if isinstance(want, (str, bool)) or want is None:
        assert got == want, where
    else:
        assert got == pytest.approx(want, abs=1e-4), where


@pytest.mark.parametrize("name,key", STORED)
def test_report_recomputed_from_the_raw_runs(name, key):
    expected = _expected()[key]
    got = ct.expected_cells(ct.summarize(_doc(name)))
    assert sorted(got) == sorted(expected)
    for cell, want in expected.items():
        for client, figures in want["clients"].items():
            for figure, value in figures.items():
                _same(got[cell]["clients"][client][figure], value, (cell, client, figure))
        for pair, figures in want["pairs"].items():
            for figure, value in figures.items():
                _same(got[cell]["pairs"][pair][figure], value, (cell, pair, figure))
    text = ct.report_text(_doc(name))
    assert all(f"| {cell.replace('/', ' | ')} |" in text for cell in expected)

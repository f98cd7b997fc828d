# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""inference_benchmark's workload profiles, end to end through main() against the lab inference server (a real HTTP
server on 127.0.0.1 that counts the tokens it is sent and generates): the server sees exactly the lengths each
profile draws, long_context is capped by the server's max_model_len with its warning, the open loop keeps its
schedule, goodput is reported, and bad profile settings fail before any load."""

from __future__ import annotations

import re

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import profiles as pr
from ansible_collections.gpufleet.inference.plugins.modules import inference_benchmark
from tests.unit.plugins.modules.uthelper import run_module
from tests.unit.test_lab_inference_server import LabServer


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    server = LabServer(tmp_path_factory.mktemp("model"), "--work", "4", "--step-work", "16", "--max-model-len", "1024")
    yield server
    server.stop()


def bench(lab, capsys, **extra):
    args = {"url": lab.url, "prompt_tokens": 16, "output_tokens": 4, "concurrency": [2], "requests": 6, "warmup": 0,
            "repetitions": 2, "settle_runs": 0, "monitor_links": False, "max_error_rate": 0.0}
    args.update(extra)
    return run_module(inference_benchmark, args, capsys)


def warnings_of(result) -> list[str]:
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]


def runs_of(result):
    return result["benchmark"]["levels"][0]["runs"]


def test_shared_prefix_sends_the_prefix_with_every_request(lab, capsys):
    result = bench(lab, capsys, profile="shared_prefix", profile_options={"prefix_tokens": 40, "turns": 2})
    assert result["benchmarked"] and not result.get("failed"), result.get("msg")
    assert result["benchmark"]["config"]["profile"] == {"name": "shared_prefix", "prefix_tokens": 40, "turns": 2}
    # 3 conversations of 2 turns: first turns 40 + 16, second turns 40 + 16 + 4 + 16 prompt tokens, as the server counted
    assert [r["prompt_tokens"] for r in runs_of(result)] == [3 * 56 + 3 * 76] * 2
    assert result["plan"]["profile"] == "shared_prefix"


def test_mixed_lengths_reach_the_server_as_drawn(lab, capsys):
    options = {"preset": "chat", "prompt": {"median": 24, "min": 4, "max": 96}, "output": {"median": 6, "min": 1, "max": 24}}
    result = bench(lab, capsys, profile="mixed_lengths", profile_options=options, seed=5)
    assert not result.get("failed"), result.get("msg")
    spec = result["benchmark"]["config"]["profile"]
    for rep, run in enumerate(runs_of(result)):
        drawn = pr.lengths(spec, 5, f"c2/r{rep}", 6, 16, 4)
        # ignore_eos: the server generated exactly the drawn output lengths and was sent the drawn prompt lengths
        assert (run["prompt_tokens"], run["output_tokens"]) == (sum(p for p, _o in drawn), sum(o for _p, o in drawn))
        assert run["short_outputs"] == 0
    assert len({run["output_tokens"] for run in runs_of(result)}) == 2  # each run its own draw


def test_long_context_is_capped_by_the_servers_max_model_len(lab, capsys):
    result = bench(lab, capsys, profile="long_context", profile_options={"context_tokens": 4096}, output_tokens=8,
                   requests=2, concurrency=[1])
    assert not result.get("failed"), result.get("msg")
    assert result["benchmark"]["config"]["profile"] == {"name": "long_context", "context_tokens": 4096, "prompt_tokens": 1016}
    assert [r["prompt_tokens"] for r in runs_of(result)] == [2 * 1016] * 2
    assert any(w.startswith("long_context asked for 4096-token prompts, but the server's max_model_len is 1024: the "
                            "prompts were capped to 1016 tokens") and "--max-model-len 4104" in w for w in warnings_of(result))


def test_a_profile_that_cannot_fit_fails_before_any_load(lab, capsys):
    result = bench(lab, capsys, profile="shared_prefix", profile_options={"prefix_tokens": 1010})
    assert result["failed"] and result["benchmarked"] is False
    assert ("the shared_prefix profile's longest request (1026 prompt + 4 output tokens = 1030) exceeds the server's "
            "max_model_len 1024: lower prefix_tokens") in result["msg"]


def test_open_loop_keeps_its_schedule_and_reports_goodput(lab, capsys):
    result = bench(lab, capsys, arrivals={"mode": "poisson", "rate": 40}, requests=16, concurrency=[8],
                   goodput={"ttft_ms": 60000, "tpot_ms": 60000})
    assert not result.get("failed"), result.get("msg")
    assert result["benchmark"]["config"]["arrivals"] == {"mode": "poisson", "rate": 40.0, "burstiness": 1.0}
    for rep, run in enumerate(runs_of(result)):
        schedule = pr.arrival_offsets(result["benchmark"]["config"]["arrivals"], 0, f"c8/r{rep}", 16)
        planned = 15 / schedule[-1]
        # the client sent on the seeded schedule: its achieved rate is the schedule's own within 30% (the lab
        # server answers in milliseconds; a loaded test host may delay a send by some)
        assert abs(run["arrivals"]["achieved_rate"] / planned - 1) < 0.30, run["arrivals"]
        assert run["goodput"]["good_requests"] == 16 and run["goodput"]["good_share"] == 1.0
    line = result["summary"][0]
    assert line["good_share"] == 1.0 and line["goodput_tps"] > 0 and line["target_rate"] == 40.0
    strict = bench(lab, capsys, goodput={"ttft_ms": 0.001})
    assert strict["summary"][0]["good_share"] == 0.0 and strict["summary"][0]["goodput_tps"] == 0.0


@pytest.mark.parametrize("extra, words", [
    ({"profile": "shared_prefix", "profile_options": {"context_tokens": 4}}, "profile_options context_tokens do not apply"),
    ({"arrivals": {"mode": "gamma"}}, "arrivals.mode gamma needs arrivals.rate"),
    ({"arrivals": {"rate": 3}}, "arrivals.rate and arrivals.burstiness apply to an open loop"),
    ({"goodput": {"ttft": 5}}, "goodput has unknown keys ttft"),
])
def test_bad_profile_settings_fail_before_any_load(lab, capsys, extra, words):
    result = bench(lab, capsys, **extra)
    assert result["failed"] and result["changed"] is False and "benchmarked" not in result
    assert result["msg"].startswith("Invalid benchmark settings: ") and words in result["msg"]


def prefix_counters(server) -> tuple[int, int]:
    import urllib.request
    text = urllib.request.urlopen(f"{server.url}/metrics", timeout=10).read().decode()
    found = dict(re.findall(r"^gpufleet_lab_prefix_cache_(queries|hits)_total (\d+)$", text, re.M))
    return int(found["queries"]), int(found["hits"])


def test_the_lab_servers_prefix_cache_holds_the_shared_prefix_and_never_a_random_prompt(tmp_path, capsys):
    """One request at a time: the first computes the 64-token prefix (4 blocks of 16) and its own 16 tokens, every
    later one only its own 16; unique random prompts never hit."""
    with LabServer(tmp_path, "--work", "4", "--step-work", "16", "--enable-prefix-caching") as caching:
        result = bench(caching, capsys, profile="shared_prefix", profile_options={"prefix_tokens": 64},
                       concurrency=[1], warmup=1)
        assert not result.get("failed"), result.get("msg")
        sent = 1 + 1 + 2 * 6  # preflight, warm-up, 2 runs of 6
        queries, hits = prefix_counters(caching)
        assert queries == 16 + 80 * (sent - 1)  # the preflight's 16-token random prompt, then 80 each
        assert hits == 64 * (sent - 2)  # every shared-prefix request after the first holds the prefix
        random_run = bench(caching, capsys, concurrency=[1])
        # only the preflight's prompt, sent again (its one block, less the last token computed again)
        assert not random_run.get("failed") and prefix_counters(caching)[1] == hits + 15

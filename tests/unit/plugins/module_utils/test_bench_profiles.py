# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench/profiles.py: every profile's request set is a function of (spec, seed, key) only; the open loop's
arrival times keep their rate and burstiness; long_context is capped by max_model_len with a clear message;
goodput's arithmetic; the workload fingerprint refuses results of different profiles, naming what differs, and the
history keeps a series per profile."""

from __future__ import annotations

import math
import statistics

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history as bh
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history_report as hr
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import profiles as pr
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import GateError
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.workload import (
    check_workloads, workload, workload_mismatch,
)

SPECS = {
    "random": pr.check_profile("random"),
    "shared_prefix": pr.check_profile("shared_prefix", {"prefix_tokens": 64}),
    "multi_turn": pr.check_profile("shared_prefix", {"prefix_tokens": 32, "turns": 3}),
    "mixed_chat": pr.check_profile("mixed_lengths", {"preset": "chat"}),
    "mixed_document": pr.check_profile("mixed_lengths", {"preset": "document"}),
    "long_context": pr.check_profile("long_context", {"context_tokens": 2048}),
}


def reqs(spec, seed=0, key="c8/r0", n=12, prompt_tokens=16, output_tokens=8, mode="token_ids"):
    return pr.requests(spec, seed, key, n, prompt_tokens, output_tokens, mode)


# ---- reproducible request sets -------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("mode", ["token_ids", "text"])
def test_the_same_seed_gives_the_same_requests_and_another_seed_others(name, mode):
    spec = SPECS[name]
    first = reqs(spec, mode=mode)
    assert first == reqs(dict(spec), mode=mode)  # the same profile always sends the same requests
    assert len(first) == 12 and len({repr(p) for p, _o in first}) == 12  # every request its own prompt
    assert first != reqs(spec, seed=1, mode=mode)
    assert first != reqs(spec, key="c8/r1", mode=mode)  # another run, other prompts


def test_random_is_the_prompt_the_client_always_sent():
    got = reqs(SPECS["random"], seed=3, n=4, prompt_tokens=10, output_tokens=5)
    assert got == [(pr.make_prompt(3, f"c8/r0/{i}", 10), 5) for i in range(4)]


def test_shared_prefix_shares_the_system_prompt_across_requests_and_runs():
    spec = SPECS["shared_prefix"]
    runs = [reqs(spec, key=key) for key in ("c8/r0", "c8/r1", "c32/warmup")]
    prefix = runs[0][0][0][:64]
    for run in runs:
        for prompt, max_tokens in run:
            assert len(prompt) == 64 + 16 and prompt[:64] == prefix and max_tokens == 8
    suffixes = {tuple(p[64:]) for run in runs for p, _o in run}
    assert len(suffixes) == 36  # the rest is every request's own
    assert reqs(spec, seed=1)[0][0][:64] != prefix


def test_multi_turn_turns_extend_the_conversation_so_far():
    spec = SPECS["multi_turn"]
    got = reqs(spec, n=12)  # 4 conversations of 3 turns, sent turn by turn
    convs = 4
    for i, (prompt, _o) in enumerate(got):
        turn = i // convs
        assert len(prompt) == 32 + (turn + 1) * 16 + turn * 8
        if turn:
            earlier = got[i - convs][0]
            assert prompt[:len(earlier)] == earlier  # the turn before, then its answer and a new user turn
    assert got[0][0][:32] == got[5][0][:32]  # the system prompt of every conversation
    assert got[0][0][32:48] != got[1][0][32:48]  # conversations differ after it
    assert pr.longest(spec, 16, 8) == (32 + 3 * 16 + 2 * 8, 8)


@pytest.mark.parametrize("preset", ["chat", "document"])
def test_mixed_lengths_follow_their_preset(preset):
    """2000 draws: every length inside the preset's [min, max] and the median within 10% of the preset's (the
    log-normal's median; the sample median's standard error is about 1.25 sigma/sqrt(n) = 2.2% in log terms for
    sigma 0.8, so 10% is over 4 standard errors, and the draws are seeded: no flake)."""
    spec = SPECS[f"mixed_{preset}"]
    sizes = pr.lengths(spec, 0, "c8/r0", 2000, 16, 8)
    for part, column in (("prompt", 0), ("output", 1)):
        dist = pr.PRESETS[preset][part]
        values = [s[column] for s in sizes]
        assert dist["min"] <= min(values) and max(values) <= dist["max"]
        assert abs(statistics.median(values) / dist["median"] - 1) < 0.10
        assert len(set(values)) > 100  # drawn, not fixed
    got = reqs(spec, n=20)
    assert [(len(p), o) for p, o in got] == pr.lengths(spec, 0, "c8/r0", 20, 16, 8)


def test_mixed_lengths_presets_are_overridden_key_by_key():
    spec = pr.check_profile("mixed_lengths", {"preset": "chat", "output": {"max": 64, "median": 32}})
    assert spec["output"] == {"median": 32, "sigma": 0.6, "min": 16, "max": 64} and spec["prompt"] == pr.PRESETS["chat"]["prompt"]
    assert max(o for _p, o in pr.lengths(spec, 0, "k", 500, 1, 1)) <= 64
    fixed = pr.check_profile("mixed_lengths", {"prompt": {"sigma": 0}})
    assert {p for p, _o in pr.lengths(fixed, 0, "k", 50, 1, 1)} == {256}


@pytest.mark.parametrize("name, options, words", [
    ("warp", None, "profile must be one of random, shared_prefix"),
    ("random", {"prefix_tokens": 8}, "profile_options prefix_tokens do not apply to profile 'random'"),
    ("shared_prefix", {"turns": 0}, "profile_options.turns must be an integer from 1 to 64"),
    ("shared_prefix", {"prefix_tokens": True}, "profile_options.prefix_tokens must be an integer"),
    ("mixed_lengths", {"preset": "poetry"}, "profile_options.preset must be one of chat, document"),
    ("mixed_lengths", {"prompt": {"median": 10, "min": 20}}, "profile_options.prompt needs min <= median <= max"),
    ("mixed_lengths", {"output": {"mean": 3}}, "profile_options.output has unknown keys mean"),
    ("mixed_lengths", {"prompt": {"sigma": float("nan")}}, "profile_options.prompt.sigma must be a number"),
    ("long_context", {"context_tokens": 2 ** 21}, "profile_options.context_tokens must be an integer from 1 to 1048576"),
    ("long_context", [1], "profile_options must be a dict"),
])
def test_bad_profiles_are_refused_naming_the_setting(name, options, words):
    with pytest.raises(pr.ProfileError, match=None) as err:
        pr.check_profile(name, options)
    assert words in str(err.value)


# ---- long_context and max_model_len --------------------------------------------------------------
def test_long_context_is_capped_by_max_model_len_with_a_clear_message():
    spec = pr.check_profile("long_context", {"context_tokens": 32768})
    fitted, note = pr.fit_to_server(spec, 1024, 128, 16384)
    assert fitted == {"name": "long_context", "context_tokens": 32768, "prompt_tokens": 16256}
    assert note.startswith("long_context asked for 32768-token prompts, but the server's max_model_len is 16384: the "
                           "prompts were capped to 16256 tokens (16384 - 128 output).")
    assert "--max-model-len 32896" in note
    assert {len(p) for p, _o in pr.requests(fitted, 0, "k", 2, 1024, 128)} == {16256}
    whole, note = pr.fit_to_server(pr.check_profile("long_context", {"context_tokens": 16384}), 1024, 128, 32768)
    assert whole["prompt_tokens"] == 16384 and note == ""
    unknown, note = pr.fit_to_server(spec, 1024, 128, None)
    assert unknown["prompt_tokens"] == 32768 and "does not say its max_model_len" in note
    with pytest.raises(pr.ProfileError, match="output_tokens 4096 leaves no room for a prompt"):
        pr.fit_to_server(spec, 1024, 4096, 4096)


def test_the_other_profiles_must_fit_whole():
    spec = SPECS["multi_turn"]  # longest: 32 + 3 * 16 + 2 * 8 = 96 prompt tokens, 8 output
    assert pr.fit_to_server(spec, 16, 8, 104) == (spec, "")
    with pytest.raises(pr.ProfileError, match=r"longest request \(96 prompt \+ 8 output tokens = 104\) exceeds the "
                                              r"server's max_model_len 103: lower prefix_tokens, turns"):
        pr.fit_to_server(spec, 16, 8, 103)
    with pytest.raises(pr.ProfileError, match=r"8192 prompt \+ 1024 output"):
        pr.fit_to_server(SPECS["mixed_document"], 16, 8, 4096)


# ---- arrivals ------------------------------------------------------------------------------------
def gaps(offsets):
    return [b - a for a, b in zip(offsets, offsets[1:])]


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("rate", [0.5, 10.0, 400.0])
def test_poisson_arrivals_keep_the_target_rate(seed, rate):
    """4000 requests: the achieved rate within 6% of the target. The mean of 3999 exponential gaps has a relative
    standard error of 1/sqrt(3999) = 1.6%, so 6% is 3.8 standard errors (a 1-in-7000 miss per draw); the draws are
    seeded, so the 30 cases give the same answer every run."""
    arrivals = pr.check_arrivals({"mode": "poisson", "rate": rate})
    offsets = pr.arrival_offsets(arrivals, seed, "c8/r0", 4000)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    achieved = (len(offsets) - 1) / offsets[-1]
    assert abs(achieved / rate - 1) < 0.06
    cv = statistics.pstdev(gaps(offsets)) / statistics.mean(gaps(offsets))
    assert abs(cv - 1.0) < 0.08  # exponential gaps: CV 1 (its standard error here is about 2%)
    assert offsets == pr.arrival_offsets(arrivals, seed, "c8/r0", 4000)
    assert offsets != pr.arrival_offsets(arrivals, seed + 100, "c8/r0", 4000)


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 2.0, 8.0])
def test_gamma_burstiness_shapes_the_gaps_and_keeps_the_rate(burstiness):
    """Gamma gaps of shape k have CV 1/sqrt(k) at the same mean: 20000 seeded gaps, rate within 5%, CV within 10%."""
    arrivals = pr.check_arrivals({"mode": "gamma", "rate": 20.0, "burstiness": burstiness})
    offsets = pr.arrival_offsets(arrivals, 7, "c32/r2", 20001)
    g = gaps(offsets)
    assert abs(len(g) / offsets[-1] / 20.0 - 1) < 0.05
    assert abs(statistics.pstdev(g) / statistics.mean(g) * math.sqrt(burstiness) - 1) < 0.10


def test_closed_loop_has_no_schedule_and_bad_arrivals_are_refused():
    assert pr.check_arrivals(None) == {"mode": "closed"} and pr.check_arrivals({}) == {"mode": "closed"}
    assert pr.arrival_offsets({"mode": "closed"}, 0, "k", 5) is None
    assert pr.check_arrivals({"mode": "poisson", "rate": 3}) == {"mode": "poisson", "rate": 3.0, "burstiness": 1.0}
    for bad, words in (({"mode": "poisson"}, "needs arrivals.rate"), ({"mode": "gamma", "rate": 0}, "arrivals.rate must be"),
                       ({"mode": "gamma", "rate": 1, "burstiness": 0.01}, "arrivals.burstiness must be"),
                       ({"mode": "poisson", "rate": 1, "burstiness": 2}, "use mode gamma"),
                       ({"mode": "constant", "rate": 1, "burstiness": 1}, "does not apply to constant arrivals"),
                       ({"rate": 5}, "apply to an open loop"), ({"mode": "sometimes"}, "arrivals.mode must be one of"),
                       ({"mode": "poisson", "rate": float("inf")}, "arrivals.rate must be"),
                       ({"mode": "poisson", "rate": 1, "jitter": 1}, "unknown keys jitter"), ([1], "must be a dict")):
        with pytest.raises(pr.ProfileError) as err:
            pr.check_arrivals(bad)
        assert words in str(err.value), bad


def test_constant_arrivals_are_evenly_spaced():
    arrivals = pr.check_arrivals({"mode": "constant", "rate": 4})
    assert arrivals == {"mode": "constant", "rate": 4.0}
    assert pr.arrival_offsets(arrivals, 0, "k", 5) == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_arrival_stats_measure_the_lag_behind_the_schedule():
    arrivals = {"mode": "poisson", "rate": 10.0, "burstiness": 1.0}
    stats = pr.arrival_stats([100.0, 100.1, 100.35, 100.4], [0.0, 0.1, 0.2, 0.3], arrivals)
    assert stats["achieved_rate"] == 7.5 and stats["lag_max_ms"] == pytest.approx(150.0)
    assert stats["target_rate"] == 10.0 and stats["mode"] == "poisson"


# ---- goodput -------------------------------------------------------------------------------------
def test_goodput_counts_requests_that_meet_both_targets():
    results = [(True, 100, 0.2, 0.02),   # good
               (True, 100, 0.6, 0.02),   # TTFT over 500 ms
               (True, 100, 0.2, 0.06),   # TPOT over 50 ms
               (True, 1, 0.3, None),     # one token: no TPOT, meets it
               (False, 0, None, None),   # failed: never good
               (True, 50, 0.5, 0.05)]    # exactly on both targets: good
    got = pr.goodput(results, {"ttft_ms": 500.0, "tpot_ms": 50.0}, 2.0)
    assert got == {"targets": {"ttft_ms": 500.0, "tpot_ms": 50.0}, "good_requests": 3, "requests": 6, "good_share": 0.5,
                   "goodput_tps": 75.5, "request_goodput": 1.5}
    only_ttft = pr.goodput(results, {"ttft_ms": 250.0}, 1.0)
    assert only_ttft["good_requests"] == 2 and only_ttft["goodput_tps"] == 200.0
    assert pr.check_goodput({"ttft_ms": 500, "tpot_ms": None}) == {"ttft_ms": 500.0}
    with pytest.raises(pr.ProfileError, match="goodput.tpot_ms must be a number above 0"):
        pr.check_goodput({"tpot_ms": -1})
    with pytest.raises(pr.ProfileError, match="unknown keys e2el_ms"):
        pr.check_goodput({"e2el_ms": 9})


# ---- the fingerprint -----------------------------------------------------------------------------
def document(profile=None, arrivals=None, **cfg):
    config = {"prompt_tokens": 1024, "output_tokens": 128, "concurrency": [32], "requests": 128, "seed": 3,
              "ignore_eos": True, "prompt_mode": "token_ids", "token_id_range": [1000, 4000], **cfg}
    if profile is not None:
        config["profile"] = profile
    if arrivals is not None:
        config["arrivals"] = arrivals
    return {"client": {"name": "gpufleet.inference_client", "version": "1"},
            "server": {"model": "qwen", "max_model_len": 32768}, "config": config}


def refusal(baseline, candidate) -> str:
    with pytest.raises(GateError) as err:
        check_workloads(baseline, candidate)
    return str(err.value)


def test_results_of_different_profiles_are_never_compared():
    random_doc = document({"name": "random"}, {"mode": "closed"})
    prefix_doc = document(SPECS["shared_prefix"], {"mode": "closed"})
    assert "workload_profile.name: baseline 'random', candidate 'shared_prefix'" in refusal(random_doc, prefix_doc)
    longer = document(dict(SPECS["shared_prefix"], prefix_tokens=2048), {"mode": "closed"})
    assert "workload_profile.prefix_tokens: baseline 64, candidate 2048" in refusal(prefix_doc, longer)
    open_loop = document({"name": "random"}, {"mode": "poisson", "rate": 8.0, "burstiness": 1.0})
    assert "arrivals.mode: baseline 'closed', candidate 'poisson'" in refusal(random_doc, open_loop)
    faster = document({"name": "random"}, {"mode": "poisson", "rate": 16.0, "burstiness": 1.0})
    assert "arrivals.rate: baseline 8, candidate 16" in refusal(open_loop, faster)
    capped = document(dict(SPECS["long_context"], prompt_tokens=1900), {"mode": "closed"})
    whole = document(dict(SPECS["long_context"], prompt_tokens=2048), {"mode": "closed"})
    assert "workload_profile.prompt_tokens: baseline 1900, candidate 2048" in refusal(capped, whole)
    assert check_workloads(prefix_doc, document(dict(SPECS["shared_prefix"]), {"mode": "closed"})) == ""


def test_a_result_stored_before_profiles_is_a_random_closed_loop():
    legacy = document()
    assert workload(legacy)["workload_profile"] == {"name": "random"} and workload(legacy)["arrivals"] == {"mode": "closed"}
    assert workload_mismatch(workload(legacy), workload(document({"name": "random"}, {"mode": "closed"}))) == []
    assert "workload_profile.name: baseline 'random', candidate 'mixed_lengths'" in refusal(
        legacy, document(SPECS["mixed_chat"], {"mode": "closed"}))
    # the goodput targets judge requests after the fact: not compared
    assert check_workloads(document(goodput={"ttft_ms": 100.0}), document(goodput={})) == ""


# ---- the history ---------------------------------------------------------------------------------
def history_doc(finished_at, profile=None, arrivals=None):
    doc = document(profile, arrivals)
    doc.update({"format": "gpufleet.inference_benchmark/1", "label": "site", "host": "gpu-01", "kernel": "6.1.0",
                "tuning": {}, "started_at": finished_at, "finished_at": finished_at,
                "levels": [{"concurrency": 32, "errors": 0, "ttft_ms": {"p50": 40.0}, "tpot_ms": {"p50": 3.0},
                            "output_throughput": {"median": 1000.0, "cv": 0.01, "values": [999.0, 1000.0, 1001.0]}}]})
    return doc


def test_the_history_keeps_a_series_per_profile_and_older_results_in_theirs(tmp_path):
    conn = bh.connect(str(tmp_path / "h.sqlite"))
    legacy = history_doc("2026-12-01T10:00:00Z")
    assert bh.config_of(legacy) == bh.config_of(history_doc("2026-12-01T11:00:00Z", {"name": "random"}, {"mode": "closed"}))
    for i, (profile, arrivals) in enumerate([(None, None), ({"name": "random"}, {"mode": "closed"}),
                                             (SPECS["shared_prefix"], {"mode": "closed"}),
                                             ({"name": "random"}, {"mode": "poisson", "rate": 8.0, "burstiness": 1.0})]):
        bh.append(conn, history_doc(f"2026-12-01T1{i}:00:00Z", profile, arrivals), source="site")
    names = sorted(hr.series_name(s) for s in bh.series(conn, host="gpu-01"))
    assert names == ["benchmark c=32 (1024/128 tok)", "random poisson 8/s c=32 (1024/128 tok)",
                     "shared_prefix c=32 (1024/128 tok)"]
    runs = {hr.series_name(s): len(s["runs"]) for s in bh.series(conn, host="gpu-01")}
    assert runs["benchmark c=32 (1024/128 tok)"] == 2  # the result stored before profiles and the random one: one series

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""inference_client's pure layers: chunked and SSE decoding split at every byte, prompts, the per-event
fold, and the metric maths checked against hand-computed streams (multi-token chunks included)."""

from __future__ import annotations

import json
import math

import pytest

from tests.tools import inference_client as ic

# ---- chunked transfer coding ---------------------------------------------------------------------
CHUNKED = b"5\r\nhello\r\n7;name=value\r\n, world\r\n1\r\n!\r\n0\r\nX-Trailer: 1\r\n\r\n"


def feed_split(decoder_or_parser, data: bytes, cut: int):
    first = decoder_or_parser.feed(data[:cut])
    return first, decoder_or_parser.feed(data[cut:])


@pytest.mark.parametrize("cut", range(len(CHUNKED) + 1))
def test_chunked_decoder_any_split(cut):
    dec = ic.ChunkedDecoder()
    first, second = feed_split(dec, CHUNKED, cut)
    assert first + second == b"hello, world!"
    assert dec.done and dec.leftover == b""


def test_chunked_decoder_byte_by_byte_and_leftover():
    dec = ic.ChunkedDecoder()
    out = b"".join(dec.feed(CHUNKED[i:i + 1]) for i in range(len(CHUNKED)))
    assert out == b"hello, world!" and dec.done
    dec = ic.ChunkedDecoder()
    assert dec.feed(b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1 200") == b"abc"
    assert dec.done and dec.leftover == b"HTTP/1.1 200"
    dec = ic.ChunkedDecoder()
    assert dec.feed(b"a\r\n0123") == b"0123" and not dec.done


@pytest.mark.parametrize("data, fragment", [
    (b"zz\r\n", "invalid chunk size"),
    (b"3\r\nabcXY", "not followed by CRLF"),
    (b"1" * 2000, "longer than 1024"),
])
def test_chunked_decoder_rejects_garbage(data, fragment):
    with pytest.raises(ic.ProtocolError, match=fragment):
        ic.ChunkedDecoder().feed(data)


# ---- server-sent events --------------------------------------------------------------------------
SSE = (": ping\n\ndata: {\"a\": 1}\n\nevent: message\nid: 7\ndata: line1\ndata: line2\n\n"
       "data:nospace\r\n\r\ndata: caf\u00e9\r\rdata: [DONE]\n\n").encode()
SSE_EVENTS = ['{"a": 1}', "line1\nline2", "nospace", "caf\u00e9", "[DONE]"]


@pytest.mark.parametrize("cut", range(len(SSE) + 1))
def test_sse_any_split(cut):
    parser = ic.SSEParser()
    first, second = feed_split(parser, SSE, cut)
    assert first + second == SSE_EVENTS


def test_sse_byte_by_byte_and_unterminated_tail():
    parser = ic.SSEParser()
    events = []
    for i in range(len(SSE)):
        events += parser.feed(SSE[i:i + 1])
    assert events == SSE_EVENTS  # the UTF-8 'é' arrived in two feeds
    parser = ic.SSEParser()
    assert parser.feed(b"data: [DONE]") == []
    assert parser.close() == ["[DONE]"]
    assert ic.SSEParser().close() == []


# ---- workload -------------------------------------------------------------------------------------
def test_make_prompt_is_fixed_by_seed_and_key():
    a = ic.make_prompt(0, "c8/r0/3", 1024)
    assert a == ic.make_prompt(0, "c8/r0/3", 1024)
    assert a != ic.make_prompt(0, "c8/r0/4", 1024) and a != ic.make_prompt(1, "c8/r0/3", 1024)
    assert len(a) == 1024 and all(1000 <= t < 4000 for t in a)
    assert a[:5] == [1203, 1912, 3891, 2089, 1558]  # pinned: prompts must not change between releases
    small = ic.make_prompt(3, "k", 500, id_range=(10, 12))
    assert set(small) == {10, 11}
    text = ic.make_prompt(0, "k", 50, mode="text")
    assert isinstance(text, str) and len(text.split()) == 50 and set(text.split()) <= set(ic.WORDS)
    with pytest.raises(ValueError, match="token_ids or text"):
        ic.make_prompt(0, "k", 5, mode="chat")


def test_completion_payload():
    p = ic.completion_payload("m", [1, 2], 64)
    assert p == {"model": "m", "prompt": [1, 2], "max_tokens": 64, "temperature": 0.0, "stream": True,
                 "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "ignore_eos": True}
    p = ic.completion_payload("m", "hi", 8, ignore_eos=False, per_chunk_usage=False)
    assert "ignore_eos" not in p and p["stream_options"] == {"include_usage": True}


# ---- hand-computed streams ------------------------------------------------------------------------
def chunk(text: str, cumulative: int | None = None, finish: str | None = None, prompt: int = 16) -> str:
    usage = None
    if cumulative is not None:
        usage = {"prompt_tokens": prompt, "completion_tokens": cumulative, "total_tokens": prompt + cumulative}
    return json.dumps({"id": "c", "object": "text_completion", "model": "m",
                       "choices": [{"index": 0, "text": text, "finish_reason": finish}], "usage": usage})


def usage_chunk(completion: int, prompt: int = 16) -> str:
    return json.dumps({"id": "c", "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                                           "total_tokens": prompt + completion}})


def stream(events: list[tuple[float, str]], start: float = 10.0) -> ic.RequestRecord:
    """Fold (seconds after start, data) events into a record, as the client does when they arrive."""
    rec = ic.RequestRecord(start=start)
    for offset, data in events:
        ic.process_event(rec, data, start + offset)
    return rec


def approx_list(values, expected, tol=1e-9):
    return len(values) == len(expected) and all(math.isclose(a, b, abs_tol=tol) for a, b in zip(values, expected))


def test_one_token_per_chunk():
    rec = stream([(0.100, chunk(" a", 1)), (0.120, chunk(" b", 2)), (0.140, chunk(" c", 3)),
                  (0.160, chunk(" d", 4, "length")), (0.161, usage_chunk(4)), (0.162, "[DONE]")])
    m = ic.request_metrics(rec)
    assert m.ok and m.output_tokens == 4 and m.prompt_tokens == 16 and m.tokens_source == "usage"
    assert math.isclose(m.ttft, 0.100) and math.isclose(m.latency, 0.160)
    assert math.isclose(m.tpot, 0.060 / 3)
    assert approx_list(m.itl, [0.020, 0.020, 0.020]) and m.itl_exact
    assert rec.finish_reason == "length" and rec.text_chars == 8


def test_multi_token_chunks_spread_itl_over_their_tokens():
    """vllm#27485: one chunk with 3 tokens after 60 ms is three 20 ms tokens, not one 60 ms one."""
    rec = stream([(0.100, chunk(" a", 1)), (0.160, chunk(" b c d", 4)), (0.220, chunk(" e f g", 7, "length")),
                  (0.221, usage_chunk(7)), (0.222, "[DONE]")])
    m = ic.request_metrics(rec)
    assert m.output_tokens == 7 and m.itl_exact
    assert math.isclose(m.ttft, 0.100) and math.isclose(m.latency, 0.220)
    assert math.isclose(m.tpot, 0.120 / 6)
    assert approx_list(m.itl, [0.020] * 6)
    assert math.isclose(sum(m.itl) / len(m.itl), m.tpot)


def test_first_chunk_with_several_tokens_and_uneven_chunks():
    # first chunk carries 2 tokens at TTFT; then 1 token after 30 ms, then 3 tokens after 90 ms
    rec = stream([(0.050, chunk(" a b", 2)), (0.080, chunk(" c", 3)), (0.170, chunk(" d e f", 6)),
                  (0.171, usage_chunk(6)), (0.172, "[DONE]")])
    m = ic.request_metrics(rec)
    assert math.isclose(m.ttft, 0.050) and math.isclose(m.latency, 0.170)
    assert math.isclose(m.tpot, 0.120 / 5)
    # the second token came with the first (0 gap); then 30 ms for c, 90 ms / 3 for d e f
    assert approx_list(m.itl, [0.0, 0.030, 0.030, 0.030, 0.030])
    assert math.isclose(sum(m.itl) / len(m.itl), m.tpot)


def test_multi_token_chunks_without_per_chunk_usage_are_estimated():
    rec = stream([(0.100, chunk(" a")), (0.160, chunk(" b c d")), (0.220, chunk(" e f g", finish="length")),
                  (0.221, usage_chunk(7)), (0.222, "[DONE]")])
    m = ic.request_metrics(rec)
    assert m.tokens_source == "usage" and m.output_tokens == 7 and not m.itl_exact
    assert approx_list(m.itl, [0.020, 0.020])  # each 60 ms gap / (7 - 1) / (3 - 1) = 3 tokens per chunk
    assert math.isclose(m.tpot, 0.020)


def test_no_usage_counts_chunks_like_vllm_bench():
    rec = stream([(0.100, chunk(" a")), (0.160, chunk(" b c d")), (0.220, chunk(" e f g")), (0.3, "[DONE]")])
    m = ic.request_metrics(rec)
    assert m.tokens_source == "chunks" and m.output_tokens == 3 and m.itl_exact
    assert math.isclose(m.tpot, 0.060) and approx_list(m.itl, [0.060, 0.060])


def test_chunks_without_new_tokens_do_not_move_the_clock():
    # a finish-only chunk with no new token arrives 500 ms later: latency still ends at the last token
    rec = stream([(0.100, chunk(" a", 1)), (0.200, chunk(" b", 2)), (0.700, chunk("", 2, "length")),
                  (0.701, usage_chunk(2)), (0.702, "[DONE]")])
    m = ic.request_metrics(rec)
    assert math.isclose(m.latency, 0.200) and approx_list(m.itl, [0.100]) and math.isclose(m.tpot, 0.100)


def test_single_token_has_no_tpot():
    m = ic.request_metrics(stream([(0.05, chunk(" a", 1, "length")), (0.06, usage_chunk(1)), (0.07, "[DONE]")]))
    assert m.ok and m.output_tokens == 1 and m.tpot is None and m.itl == []


@pytest.mark.parametrize("events, fragment", [
    ([(0.1, chunk(" a", 1))], "without data: [DONE] after 1 chunks"),
    ([(0.1, usage_chunk(0)), (0.2, "[DONE]")], "carried no token"),
    ([(0.1, json.dumps({"error": {"message": "engine died", "code": 500}}))], "server error in stream: engine died"),
])
def test_failed_streams(events, fragment):
    m = ic.request_metrics(stream(events))
    assert not m.ok and fragment in m.error


def test_bad_event_is_a_protocol_error():
    with pytest.raises(ic.ProtocolError, match="not JSON"):
        ic.process_event(ic.RequestRecord(), "{oops", 1.0)
    with pytest.raises(ic.ProtocolError, match="not a JSON object"):
        ic.process_event(ic.RequestRecord(), "[1, 2]", 1.0)


# ---- aggregates -----------------------------------------------------------------------------------
def test_percentile_is_numpy_linear():
    data = [1.0, 2.0, 3.0, 4.0]
    assert ic.percentile(data, 50) == 2.5
    assert math.isclose(ic.percentile(data, 90), 3.7)
    assert math.isclose(ic.percentile(data, 99), 3.97)
    assert ic.percentile(data, 0) == 1.0 and ic.percentile(data, 100) == 4.0
    assert ic.percentile([7.0], 99) == 7.0
    # 11 values 0..100 step 10: p90 lands exactly on 90, p99 between 90 and 100
    ten = [float(v) for v in range(0, 101, 10)]
    assert ic.percentile(ten, 90) == 90.0 and math.isclose(ic.percentile(ten, 99), 99.0)
    with pytest.raises(ValueError):
        ic.percentile([], 50)


def test_describe():
    d = ic.describe([0.001, 0.002, 0.003, 0.004], 1000.0)
    assert d == {"count": 4, "mean": 2.5, "std": round(math.sqrt(1.25), 3), "min": 1.0, "p50": 2.5, "p90": 3.7,
                 "p99": 3.97, "max": 4.0}
    assert ic.describe([])["count"] == 0 and ic.describe([])["p99"] is None


def test_run_summary_hand_computed():
    good_a = stream([(0.100, chunk(" a", 1)), (0.120, chunk(" b", 2)), (0.140, chunk(" c d", 4)),
                     (0.141, usage_chunk(4)), (0.142, "[DONE]")], start=0.0)
    good_b = stream([(0.200, chunk(" a", 1)), (0.300, chunk(" b", 2, "length")), (0.301, usage_chunk(2, prompt=8)),
                     (0.302, "[DONE]")], start=0.5)
    refused = ic.RequestRecord(start=0.0, error="connection refused")
    http500 = ic.RequestRecord(start=0.0, status=500, error="HTTP 500 Internal Server Error: boom")
    s = ic.run_summary([good_a, good_b, refused, http500, ic.RequestRecord(start=0, error="connection refused")],
                       window=2.0, max_tokens=4)
    assert (s["requests"], s["ok"], s["errors"]) == (5, 2, 3)
    assert s["error_reasons"] == {"connection refused": 2, "HTTP 500 Internal Server Error: boom": 1}
    assert (s["output_tokens"], s["prompt_tokens"]) == (6, 24)
    assert s["output_throughput"] == 3.0 and s["request_throughput"] == 1.0 and s["total_token_throughput"] == 15.0
    assert s["ttft_ms"]["mean"] == 150.0 and s["ttft_ms"]["p50"] == 150.0
    # TPOT: a (140-100)/3 = 13.333 ms, b (300-200)/1 = 100 ms
    assert s["tpot_ms"]["min"] == 13.333 and s["tpot_ms"]["max"] == 100.0
    # ITL per token: a 20, 20 (2 tokens at once after 20 ms -> 10, 10), b 100
    assert s["itl_ms"]["count"] == 4 and s["itl_ms"]["mean"] == 35.0
    assert s["e2el_ms"]["max"] == 300.0
    assert s["short_outputs"] == 1  # b made 2 of 4 tokens
    assert s["tokens_per_chunk"] == 1.2 and s["itl_exact"] is True and s["tokens_source"] == ["usage"]


def test_level_summary_spread():
    runs = [{"output_throughput": v, "request_throughput": v / 100, "requests": 10, "errors": 0, "short_outputs": 0}
            for v in (100.0, 104.0, 96.0)]
    lv = ic.level_summary(8, runs, [])
    assert lv["output_throughput"]["median"] == 100.0 and lv["output_throughput"]["values"] == [100.0, 104.0, 96.0]
    assert lv["output_throughput"]["cv"] == round(4.0 / 100.0, 5)
    assert lv["requests"] == 30 and lv["repetitions"] == 3 and lv["ttft_ms"]["count"] == 0
    # the runs in the order taken: up, then down below the first (S = +1 - 1 - 1)
    assert lv["trend"]["s"] == -1 and lv["trend"]["method"] == "exact"
    assert lv["settle"] == {"max_runs": 0, "runs": [], "settled": None, "tolerance": None}
    settle = {"max_runs": 3, "runs": [80.0, 99.0, 101.0], "settled": True, "tolerance": 0.05, "errors": 0}
    assert ic.level_summary(8, runs, [], settle)["settle"] is settle


# ---- settings -------------------------------------------------------------------------------------
@pytest.mark.parametrize("url, expected", [
    ("http://127.0.0.1:8000", ("http", "127.0.0.1", 8000, "")),
    ("http://host:8000/v1/", ("http", "host", 8000, "")),
    ("https://llm.example.com", ("https", "llm.example.com", 443, "")),
    ("http://[::1]:9000/proxy/v1", ("http", "::1", 9000, "/proxy")),
])
def test_parse_endpoint(url, expected):
    ep = ic.parse_endpoint(url)
    assert (ep.scheme, ep.host, ep.port, ep.base_path) == expected


@pytest.mark.parametrize("url, fragment", [
    ("", "empty"), ("ftp://x", "http:// or https://"), ("http://", "no host"), ("http://h:99999", "invalid port"),
    ("http://u:p@h:1", "credentials"), ("http://h:1/?q=1", "query"),
])
def test_parse_endpoint_errors(url, fragment):
    with pytest.raises(ValueError, match=fragment):
        ic.parse_endpoint(url)


@pytest.mark.parametrize("change, fragment", [
    ({"prompt_tokens": 0}, "prompt_tokens must be an integer of at least 1"),
    ({"output_tokens": True}, "output_tokens"),
    ({"concurrency": []}, "at least one level"),
    ({"concurrency": [4, 4]}, "twice"),
    ({"concurrency": [5000]}, "above 4096"),
    ({"concurrency": [64], "requests": 32}, "below the largest concurrency"),
    ({"warmup": -1}, "warmup"),
    ({"repetitions": 0}, "repetitions"),
    ({"timeout": 0}, "timeout"),
    ({"prompt_mode": "chat"}, "prompt_mode"),
    ({"token_id_range": [5, 5]}, "token_id_range"),
    ({"seed": "x"}, "seed"),
    ({"settle_runs": -1}, "settle_runs must be an integer of at least 0"),
    ({"settle_runs": 1}, "0 \\(off\\) or at least 2"),
    ({"settle_tolerance": 0}, "settle_tolerance must be a fraction"),
    ({"settle_tolerance": 1.5}, "settle_tolerance must be a fraction"),
])
def test_check_config_errors(change, fragment):
    cfg = ic.BenchmarkConfig(url="http://127.0.0.1:8000")
    for key, value in change.items():
        setattr(cfg, key, value)
    with pytest.raises(ValueError, match=fragment):
        ic.check_config(cfg)


def test_config_from_params_and_public_view_hides_the_key():
    params = {"url": "http://h:1", "model": None, "api_key": "s3cr3t-key", "prompt_tokens": 8, "output_tokens": 4,
              "concurrency": [1, 2], "requests": 4, "warmup": 0, "repetitions": 2, "seed": 3, "ignore_eos": True,
              "timeout": 5.0, "prompt_mode": "token_ids", "token_id_range": [1, 9], "per_chunk_usage": True,
              "validate_certs": True, "ca_path": None, "label": "x", "results_dir": None}
    cfg = ic.config_from_params(params)
    assert cfg.model is None and cfg.api_key == "s3cr3t-key" and cfg.concurrency == [1, 2]
    public = cfg.public()
    assert "api_key" not in public and public["api_key_set"] is True and "s3cr3t" not in json.dumps(public)
    assert ic.plan(cfg) == {"levels": [1, 2], "requests_per_level": 8, "requests_total": 17,
                            "output_tokens_total": 64, "profile": "random"}
    assert public["settle_runs"] == 0 and public["settle_tolerance"] == 0.05
    settled = ic.config_from_params(dict(params, settle_runs=3, settle_tolerance=0.1))
    # at most 3 settle runs of 4 requests per level before the 2 measured runs
    assert ic.plan(settled)["requests_per_level"] == 4 * (3 + 2)
    assert settled.public()["settle_runs"] == 3 and settled.public()["settle_tolerance"] == 0.1


def test_steady():
    assert ic.steady(100.0, 104.0, 0.05) and ic.steady(104.0, 100.0, 0.05)
    assert ic.steady(100.0, 105.0, 0.05)  # a difference of 5 is within 5% of the larger run, 105
    assert not ic.steady(100.0, 106.0, 0.05) and not ic.steady(120.0, 100.0, 0.05)
    assert not ic.steady(0.0, 0.0, 0.05)  # no tokens is no steady state


def test_labels_and_file_names():
    assert ic.check_label("baseline-6.1_a.b") == "baseline-6.1_a.b"
    for bad in ("", "-x", ".x", "a/b", "a b", "x" * 65):
        with pytest.raises(ValueError, match="label"):
            ic.check_label(bad)
    assert ic.results_filename("base", "6.1.0-50-cloud-amd64", "2026-01-02T03:04:05Z") == \
        "base-6.1.0-50-cloud-amd64-20260102T030405Z.json"
    assert ic.results_filename("b", "6.1+x/y", "2026-01-02T03:04:05Z") == "b-6.1_x_y-20260102T030405Z.json"


def fake_result(cv=0.01, errors=0, short=0, cpu=20.0, per_chunk=True, settle=None, runs=(100.0, 101.0, 99.0)):
    run = {"requests": 10, "errors": errors, "short_outputs": short, "client_cpu_pct": cpu,
           "error_reasons": {"HTTP 500 Internal Server Error: boom": errors} if errors else {}}
    level = {"concurrency": 8, "runs": [run], "errors": errors, "requests": 10,
             "settle": settle or {"max_runs": 3, "runs": [97.0, 100.0], "settled": True, "tolerance": 0.05},
             "trend": ic.trend(list(runs)),
             "output_throughput": {"median": 100.0, "cv": cv}, "request_throughput": {"median": 1.0},
             "ttft_ms": {"p50": 5.0, "p99": 9.0}, "tpot_ms": {"p50": 2.0}, "itl_ms": {"p50": 2.0, "p99": 4.0}}
    return {"levels": [level], "requests": 10, "errors": errors, "short_outputs": short,
            "server": {"url": "http://h:1", "preflight": {"per_chunk_usage_seen": per_chunk}}}


def test_results_document_summary_warnings_failure():
    doc = ic.results_document({"levels": [], "samples": {}}, label="base", host="gpu1", kernel="6.1", tuning={"mps": 256})
    assert (doc["label"], doc["host"], doc["kernel"], doc["tuning"]) == ("base", "gpu1", "6.1", {"mps": 256})
    assert ic.compact_summary(fake_result()) == [{
        "concurrency": 8, "output_throughput": 100.0, "output_throughput_cv": 0.01, "request_throughput": 1.0,
        "ttft_p50_ms": 5.0, "ttft_p99_ms": 9.0, "tpot_p50_ms": 2.0, "itl_p50_ms": 2.0, "itl_p99_ms": 4.0, "errors": 0,
        "settle_runs": 2, "settled": True, "drift": -0.01}]
    cfg = ic.BenchmarkConfig(url="http://h:1", output_tokens=64, per_chunk_usage=True)
    assert ic.result_warnings(fake_result(), cfg) == []
    warnings = ic.result_warnings(fake_result(cv=0.08, short=3, cpu=97.0, per_chunk=False), cfg)
    assert len(warnings) == 4
    assert "3 requests ended before max_tokens (64)" in warnings[0]
    assert "ITL is estimated" in warnings[1]
    assert "varies by 8.0% (CV)" in warnings[2]
    assert "97% of a CPU core" in warnings[3]
    unsettled = {"max_runs": 3, "runs": [50.0, 70.0, 90.0], "settled": False, "tolerance": 0.05}
    warnings = ic.result_warnings(fake_result(settle=unsettled, runs=(90.0, 95.0, 99.0, 104.0, 110.0)), cfg)
    assert len(warnings) == 2
    assert warnings[0].startswith("At concurrency 8 the server did not settle: 3 warm-up runs of 128 requests gave "
                                  "50.0, 70.0, 90.0 tok/s, never two in a row within 5%")
    assert warnings[1].startswith("At concurrency 8 the measured runs rose steadily")
    assert ic.error_failure(fake_result(), 0.0) is None
    message = ic.error_failure(fake_result(errors=2), 0.1)
    assert message.startswith("2 of 10 benchmark requests to http://h:1 failed (20.0%, max_error_rate 10.0%)")
    assert "2 x HTTP 500 Internal Server Error: boom" in message
    assert ic.error_failure(fake_result(errors=1), 0.1) is None


@pytest.mark.parametrize("status, error, fragment", [
    (401, "HTTP 401", "api_key"),
    (400, "HTTP 400: Token id 39161 is out of vocabulary", "token_id_range"),
    (400, "HTTP 400: This model's maximum context length is 512 tokens", "context length"),
    (400, "HTTP 400: extra field ignore_eos not permitted", "ignore_eos: false"),
    (400, "HTTP 400: unknown field continuous_usage_stats", "per_chunk_usage: false"),
    (400, "HTTP 400: something else", "prompt_mode: text"),
    (500, "HTTP 500", "server's log"),
    (200, "server error in stream: Token id 8845 is out of vocabulary", "token_id_range"),  # as vLLM 0.32 answers
])
def test_preflight_hints(status, error, fragment):
    assert fragment in ic.preflight_hint(status, error)

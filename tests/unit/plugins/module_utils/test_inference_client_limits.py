# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""inference_client's limits against real servers on 127.0.0.1 (the scripted SSE server of
test_inference_client_http): a server that answers the preflight and then hangs fails at the
deadline; a run stops once past max_error_rate; token counts that contradict each other are protocol
errors; measured_only sends no warm-up and no settle runs. No mocks: every request crosses a socket."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.tools import inference_client as ic
from tests.unit.plugins.module_utils.test_inference_client_http import (
    Scripted, chunked_stream, final_usage, json_response, run, tok,
)

MODELS = json_response(200, {"object": "list", "data": [{"id": "m", "max_model_len": 4096}]})


def four_tokens(reported: int = 4, cumulative=(1, 2, 3, 4)) -> list:
    """A stream of four tokens with per-chunk cumulative usage, then the final usage (``reported`` tokens)."""
    events = [(0.0, tok(t, c)) for t, c in zip("abcd", cumulative)]
    return chunked_stream(events + [(0.0, final_usage(reported))])


class Hanging(Scripted):
    """The scripted server, closed without waiting for handlers that still hang (asyncio.run cancels them)."""

    async def __aexit__(self, *_exc) -> None:
        self.server.close()


HTTP_500 = json_response(500, {"error": {"message": "engine dead"}})
# headers never come: 4000 steps of 50 ms that write nothing (the handler ends once the client has gone)
HANG = [(0.05, b"")] * 4000


def config(url: str, **kw) -> ic.BenchmarkConfig:
    base = dict(url=url, prompt_tokens=4, output_tokens=4, concurrency=[1], requests=10, warmup=0, repetitions=3)
    base.update(kw)
    return ic.BenchmarkConfig(**base)


def test_a_server_that_hangs_after_the_preflight_fails_at_the_deadline():
    async def scenario():
        async with Hanging([MODELS, four_tokens(), HANG]) as srv:
            cfg = config(srv.url, concurrency=[2], requests=4, warmup=4, timeout=300.0, deadline=1.0)
            t0 = time.monotonic()
            with pytest.raises(ic.BenchmarkError) as err:
                await ic.benchmark(cfg)
            return str(err.value), time.monotonic() - t0, len(srv.requests)

    message, elapsed, requests = run(scenario())
    assert message.startswith("The benchmark of http://127.0.0.1:")
    assert "did not finish within its deadline of 1 s (at concurrency 2, warm-up, after 0 measured runs)" in message
    assert "a hung engine answers /v1/models but no completion" in message
    # it gave up at the deadline, not after the request timeout of 300 s
    assert elapsed < 60.0
    assert requests == 2 + 2  # /v1/models, the preflight, then the two warm-up requests in flight


def test_a_run_stops_once_its_error_rate_is_past_the_maximum():
    async def scenario():
        async with Scripted([MODELS, four_tokens(), HTTP_500]) as srv:
            cfg = config(srv.url, max_error_rate=0.2)
            with pytest.raises(ic.BenchmarkError) as err:
                await ic.benchmark(cfg)
            return str(err.value), len(srv.requests)

    message, requests = run(scenario())
    # 0.2 of a run of 10 allows 2 failures: the 3rd stops the run, and the 27 requests left are never sent
    assert requests == 2 + 3
    assert "at concurrency 1, measured runs, after 0 measured runs" in message
    assert "3 of 3 requests failed, past max_error_rate 20.0% of a run of 10 (stopped early): 3 x HTTP 500 X: engine dead" in message


def test_errors_within_the_rate_are_recorded_not_stopped():
    async def scenario():
        scripts = [MODELS, four_tokens(), HTTP_500] + [four_tokens()] * 4 + [HTTP_500, four_tokens()]
        async with Scripted(scripts) as srv:
            return await ic.benchmark(config(srv.url, requests=5, repetitions=2, max_error_rate=0.2)), len(srv.requests)

    result, requests = run(scenario())
    assert requests == 2 + 10 and result["errors"] == 2
    assert [r["errors"] for r in result["levels"][0]["runs"]] == [1, 1]


def test_stopping_cancels_the_requests_in_flight():
    """Concurrency 3 against a server that fails one request and hangs the others: the failure stops the run at once."""
    async def scenario():
        async with Hanging([MODELS, four_tokens(), HTTP_500, HANG]) as srv:
            cfg = config(srv.url, concurrency=[3], requests=6, timeout=300.0, max_error_rate=0.0)
            t0 = time.monotonic()
            with pytest.raises(ic.BenchmarkError) as err:
                await ic.benchmark(cfg)
            return str(err.value), time.monotonic() - t0

    message, elapsed = run(scenario())
    assert "1 of 1 requests failed, past max_error_rate 0.0% of a run of 6 (stopped early)" in message
    assert elapsed < 60.0


@pytest.mark.parametrize("reported, cumulative, max_tokens, fragment", [
    (10, (1, 2, 3, 4), 4, "usage.completion_tokens 10 exceeds the max_tokens 4 asked for"),
    (4, (1, 3, 2, 4), 4, "cumulative usage.completion_tokens went down between chunks"),
    (3, (1, 2, 3, 4), 4, "the chunks streamed 4 tokens but the final usage.completion_tokens says 3"),
    (4, (1, 2, 3, 4), 4, None),
])
def test_token_counts_that_contradict_each_other_are_protocol_errors(reported, cumulative, max_tokens, fragment):
    async def scenario():
        async with Scripted([four_tokens(reported, cumulative)]) as srv:
            pool = ic.ConnectionPool(ic.parse_endpoint(srv.url))
            body = json.dumps(ic.completion_payload("m", [1, 2, 3, 4], max_tokens)).encode()
            try:
                return await ic.run_batch(pool, [body], {}, 1, 10.0, max_tokens=max_tokens)
            finally:
                pool.close()

    records, _window = run(scenario())
    summary = ic.run_summary(records, 1.0, max_tokens)
    if fragment is None:
        assert records[0].error is None and summary["ok"] == 1 and summary["output_tokens"] == 4
    else:
        assert records[0].error.startswith("protocol error: ") and fragment in records[0].error
        assert summary["errors"] == 1 and summary["output_tokens"] == 0  # not counted as throughput


def test_measured_only_sends_no_warmup_and_no_settle_runs():
    async def scenario(measured_only: bool):
        async with Scripted([MODELS, four_tokens()]) as srv:
            cfg = config(srv.url, requests=3, repetitions=2, warmup=5, settle_runs=3, measured_only=measured_only)
            return await ic.benchmark(cfg), len(srv.requests)

    result, requests = run(scenario(True))
    assert requests == 2 + 2 * 3 and result["levels"][0]["settle"]["runs"] == []
    assert result["config"]["measured_only"] is True and len(result["samples"]["1"]) == 2
    _result, requests = run(scenario(False))
    assert requests > 2 + 5 + 2 * 3  # warm-up and at least two settle runs as well
    assert ic.plan(config("http://x:1", requests=3, repetitions=2, warmup=5, settle_runs=3,
                          measured_only=True))["requests_per_level"] == 6


@pytest.mark.parametrize("kw, fragment", [
    ({"deadline": -1}, "deadline must be 0 (none) or a positive number of seconds"),
    ({"max_error_rate": 1.5}, "max_error_rate must be between 0 and 1"),
])
def test_limits_are_checked(kw, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        ic.check_config(config("http://127.0.0.1:1", **kw))


def test_stop_is_not_asyncio_timeout():
    """RunStopped is a BenchmarkError, so callers that catch BenchmarkError see it."""
    assert issubclass(ic.RunStopped, ic.BenchmarkError)
    assert not issubclass(ic.RunStopped, asyncio.TimeoutError)

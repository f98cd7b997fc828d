# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""load_monitor: the /metrics parser on vLLM's own text, the verdict of a run, and for real: the
client's benchmark against the lab stand-in server (extras/lab_inference_server.py, its /metrics
has vLLM's gauges) alone (clean) and with a second client loading it (contaminated)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.tools import inference_client as ic
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import load_monitor as lm
from tests.unit.test_lab_inference_server import LabServer

# As vLLM 0.x prints them (two engines, one model), with a histogram line that must not count.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="lab"} 3.0
vllm:num_requests_running{engine="1",model_name="lab"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="lab"} 4.0
vllm:num_requests_waiting{engine="1",model_name="lab"} 0.0
vllm:num_requests_running_total_seconds_bucket{le="1.0"} 99
vllm:e2e_request_latency_seconds_count{model_name="lab"} 120.0
"""


def test_parse_in_flight_sums_running_and_waiting_over_engines():
    assert lm.parse_in_flight(VLLM_METRICS) == 9
    assert lm.parse_in_flight("# nothing\nprocess_cpu_seconds_total 1.5\n") is None
    assert lm.parse_in_flight("vllm:num_requests_running NaN\n") is None
    assert lm.parse_in_flight(None) is None


@pytest.mark.parametrize("samples,concurrency,contaminated,available", [
    ([4, 4, 3, 4, 1], 4, False, True),
    ([4, 6, 7, 4], 4, True, True),
    ([None, None], 4, False, False),
    ([], 4, False, False),
])
def test_judge_run(samples, concurrency, contaminated, available):
    out = lm.judge_run(samples, concurrency)
    assert out["contaminated"] is contaminated and out["available"] is available
    if contaminated:
        assert "held up to 7 requests while this client sent at most 4" in out["reason"]


def test_contaminated_runs_per_level():
    levels = [{"concurrency": 4, "runs": [{"server_load": {"contaminated": False}}, {"server_load": {"contaminated": True}}]},
              {"concurrency": 16, "runs": [{}, {}]}]
    assert lm.contaminated_runs(levels) == {"4": [1], "16": []}


def cfg(port: int, **kw) -> ic.BenchmarkConfig:
    base = dict(url=f"http://127.0.0.1:{port}", model="lab", prompt_tokens=16, output_tokens=32, concurrency=[2],
                requests=16, warmup=2, repetitions=3, timeout=60.0)
    base.update(kw)
    return ic.BenchmarkConfig(**base)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = tmp_path_factory.mktemp("model")
    (model / "config.json").write_text("{}\n")
    srv = LabServer(model, "--work", "8", "--step-work", "64")
    yield srv
    srv.stop()


def test_a_benchmark_alone_is_clean(server):
    result = ic.run(ic.benchmark(cfg(server.port), monitor=lm.for_pool))
    loads = [r["server_load"] for r in result["levels"][0]["runs"]]
    assert all(load["available"] and not load["contaminated"] for load in loads), loads
    assert all(load["samples"] >= 1 and load["max_in_flight"] <= 2 for load in loads), loads
    assert lm.contaminated_runs(result["levels"]) == {"2": []}


def test_a_second_client_makes_the_runs_contaminated(server):
    stop = threading.Event()

    def foreign_load():
        other = cfg(server.port, concurrency=[6], requests=24, warmup=0, repetitions=1)
        while not stop.is_set():
            ic.run(ic.benchmark(other))

    thread = threading.Thread(target=foreign_load, daemon=True)
    thread.start()
    try:
        result = ic.run(ic.benchmark(cfg(server.port), monitor=lm.for_pool))
    finally:
        stop.set()
        thread.join(timeout=60)
    loads = [r["server_load"] for r in result["levels"][0]["runs"]]
    assert any(load["contaminated"] for load in loads), loads
    dirty = lm.contaminated_runs(result["levels"])["2"]
    assert dirty and all(loads[i]["max_in_flight"] > 2 for i in dirty)
    assert "another client loaded it" in loads[dirty[0]]["reason"]


def test_a_server_without_metrics_is_not_measured():
    async def scenario():
        async def handler(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        srv = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        pool = ic.ConnectionPool(ic.parse_endpoint(f"http://127.0.0.1:{port}"))
        watch = lm.for_pool(pool, interval=0.01)
        await watch.start()
        await asyncio.sleep(0.05)
        out = await watch.stop(4)
        watch.close()
        srv.close()
        return out
    out = asyncio.run(scenario())
    assert out["available"] is False and out["contaminated"] is False

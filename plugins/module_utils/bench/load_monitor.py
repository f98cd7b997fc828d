# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Foreign load on the inference server during a benchmark run.

While a measured run is in flight, ``InFlightMonitor`` reads the server's own count of requests
from vLLM's ``/metrics`` (``vllm:num_requests_running`` + ``vllm:num_requests_waiting``, summed
over every model and engine label) every ``interval`` seconds, on a connection of its own. The
closed-loop client never has more than ``concurrency`` requests in flight, so a sample above
that is load from someone else: the run is *contaminated*, its throughput is not the kernel's,
and the gate may neither pass nor fail on it (kernel_upgrade_flow answers ``inconclusive``).

Foreign load is seen whenever it lifts the server's count above the client's concurrency; in a
closed loop the client holds ``concurrency`` requests for most of a run, so any steady second
client is caught. A server without these gauges is reported as ``available: false`` (nothing
judged), never as clean.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Sequence

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.transport import HttpConnection

METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")
_SAMPLE_RE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>[-+0-9.eE]+|NaN)(?:\s+\d+)?$")


def parse_in_flight(text: str | None) -> int | None:
    """Requests the server holds (running + waiting) from Prometheus text; None without the gauges."""
    total, seen = 0.0, False
    for line in (text or "").splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line.strip())
        if m and m.group("name") in METRICS and m.group("value") != "NaN":
            total += float(m.group("value"))
            seen = True
    return int(round(total)) if seen else None


def judge_run(samples: Sequence[int | None], concurrency: int) -> dict[str, Any]:
    """One run's server load: contaminated when the server held more requests than the client sent."""
    values = [int(v) for v in samples if v is not None]
    if not values:
        return {"available": False, "samples": len(samples), "max_in_flight": None, "concurrency": concurrency,
                "contaminated": False,
                "reason": "the server exports no vllm:num_requests_running/waiting: foreign load not measured"}
    peak = max(values)
    over = sum(v > concurrency for v in values)
    out = {"available": True, "samples": len(values), "max_in_flight": peak, "concurrency": concurrency,
           "over": over, "contaminated": peak > concurrency, "reason": ""}
    if out["contaminated"]:
        out["reason"] = (f"the server held up to {peak} requests while this client sent at most {concurrency} "
                         f"({over} of {len(values)} samples above): another client loaded it")
    return out


def contaminated_runs(levels: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    """``{level: [repetition, ...]}`` of the contaminated runs of a benchmark result's levels."""
    out: dict[str, list[int]] = {}
    for level in levels:
        runs = [i for i, run in enumerate(level.get("runs") or [])
                if (run.get("server_load") or {}).get("contaminated")]
        out[str(level["concurrency"])] = runs
    return out


class InFlightMonitor:
    """Samples /metrics on its own connection while a run is in flight (start(), then stop(concurrency))."""

    def __init__(self, connect, headers: dict[str, str] | None = None, interval: float = 0.2, path: str = "/metrics"):
        self.connect = connect  # async () -> an open bench/transport.py HttpConnection
        self.headers = dict(headers or {})
        self.interval = interval
        self.path = path
        self.samples: list[int | None] = []
        self._task: asyncio.Task | None = None
        self._conn = None
        self.unavailable = False

    async def sample(self) -> int | None:
        if self.unavailable:
            return None
        try:
            if self._conn is None or not self._conn.reusable:
                if self._conn is not None:
                    self._conn.close()
                self._conn = await self.connect()
            await self._conn.send("GET", self.path, dict(self.headers, Accept="text/plain"), None)
            status, _reason, headers = await self._conn.read_head()
            body = await self._conn.read_body(headers, limit=8 * 1024 * 1024)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            return None
        if status == 404:
            self.unavailable = True
            return None
        value = parse_in_flight(body.decode("utf-8", "replace")) if 200 <= status < 300 else None
        if value is None and 200 <= status < 300:
            self.unavailable = True
        return value

    async def _loop(self) -> None:
        while True:
            self.samples.append(await self.sample())
            await asyncio.sleep(self.interval)

    async def start(self) -> None:
        self.samples = []
        self._task = asyncio.ensure_future(self._loop())
        await asyncio.sleep(0)

    async def stop(self, concurrency: int) -> dict[str, Any]:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self.samples.append(await self.sample())  # the last moment of the run too
        return judge_run(self.samples, concurrency)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def for_pool(pool, headers: dict[str, str] | None = None, interval: float = 0.2) -> InFlightMonitor:
    """A monitor on its own connection to the pool's endpoint (the hook bench/sweep.py's benchmark() takes)."""

    async def connect():
        conn = HttpConnection(pool.endpoint, pool.ssl_context)
        await conn.open()
        conn.reusable = True
        return conn

    return InFlightMonitor(connect, headers, interval)

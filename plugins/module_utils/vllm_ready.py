# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Does the vLLM service prove itself, for gpufleet.inference.vllm_ready: ``/health`` answers 200,
``/v1/models`` lists the served model, a completion comes back, ``/metrics`` has the vLLM counters,
and the unit does not restart meanwhile. Pure: the module passes in its HTTP ``request`` and the
unit watcher (``systemctl show`` through its runner).
"""

from __future__ import annotations

import json
import time


class NotReady(Exception):
    """The service did not prove itself; the message says which check and why."""


def unit_state(run, systemctl: str | None, unit: str | None) -> dict:
    if not systemctl or not unit:
        return {}
    rc, out, _err = run([systemctl, "show", "--property=ActiveState,SubState,MainPID,NRestarts,Result", unit])
    if rc != 0:
        return {}
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def unit_broken(first: dict, now: dict) -> str | None:
    """Why the unit is not on its way up, or None."""
    if not now:
        return None
    if now.get("ActiveState") == "failed":
        return f"the unit failed ({now.get('Result', 'unknown result')})"
    if now.get("ActiveState") == "inactive":
        return "the unit is not running (inactive)"
    if now.get("SubState") == "auto-restart":
        return "the unit's process exited and systemd is restarting it"
    if first and now.get("NRestarts", "0") != first.get("NRestarts", "0"):
        return f"the unit restarted ({first.get('NRestarts')} -> {now.get('NRestarts')} restarts)"
    if first and first.get("MainPID") not in (None, "0") and now.get("MainPID") not in (first.get("MainPID"), "0"):
        return f"the unit's main process changed ({first.get('MainPID')} -> {now.get('MainPID')})"
    return None


class Prober:
    """The HTTP checks. ``request(method, url, body, headers, timeout) -> (status, text, error)``."""

    def __init__(self, request, base: str, api_key: str | None, timeout: int):
        self.request = request
        self.base = base.rstrip("/")
        self.headers = {"Accept": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    def get(self, path: str):
        return self.request("GET", self.base + path, None, self.headers, self.timeout)

    def post(self, path: str, payload: dict):
        headers = dict(self.headers, **{"Content-Type": "application/json"})
        return self.request("POST", self.base + path, json.dumps(payload), headers, self.timeout)

    def wait_healthy(self, deadline: float, interval: float, watch, sleep=time.sleep, clock=time.monotonic) -> float:
        start = clock()
        last = "no answer yet"
        while True:
            status, _text, err = self.get("/health")
            if status == 200:
                return round(clock() - start, 1)
            last = f"HTTP {status}" if status and status > 0 else (err or "connection refused")
            broken = watch()
            if broken:
                raise NotReady(f"{self.base}/health never answered 200 ({last}): {broken}")
            if clock() >= deadline:
                raise NotReady(f"{self.base}/health did not answer 200 within the timeout (last: {last})")
            sleep(interval)

    def models(self, name: str) -> list:
        status, text, err = self.get("/v1/models")
        if status == 401:
            raise NotReady(f"{self.base}/v1/models answered 401: the API key was refused (is vllm_service_api_key the "
                           "key the service runs with?)")
        if status != 200:
            raise NotReady(f"{self.base}/v1/models answered {status if status and status > 0 else err}")
        try:
            ids = [m["id"] for m in json.loads(text)["data"]]
        except (ValueError, KeyError, TypeError):
            raise NotReady(f"{self.base}/v1/models did not return an OpenAI model list: {text[:200]!r}") from None
        if name not in ids:
            raise NotReady(f"{self.base}/v1/models lists {ids}, not the served model name {name!r}")
        return ids

    def completion(self, name: str, prompt: str, max_tokens: int, clock=time.monotonic) -> dict:
        start = clock()
        status, text, err = self.post("/v1/completions", {"model": name, "prompt": prompt, "max_tokens": max_tokens,
                                                          "temperature": 0})
        if status != 200:
            raise NotReady(f"the completion on {self.base}/v1/completions answered "
                           f"{status if status and status > 0 else err}: {(text or '')[:300]}")
        try:
            data = json.loads(text)
            choice = data["choices"][0]
            tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
        except (ValueError, KeyError, TypeError, IndexError):
            raise NotReady(f"the completion returned no choices: {text[:300]!r}") from None
        if not isinstance(choice.get("text"), str) or tokens < 1:
            raise NotReady(f"the completion returned no tokens: {text[:300]!r}")
        return {"text": choice["text"], "finish_reason": choice.get("finish_reason"), "completion_tokens": tokens,
                "seconds": round(clock() - start, 2)}

    def metrics(self) -> int:
        status, text, err = self.get("/metrics")
        if status != 200:
            raise NotReady(f"{self.base}/metrics answered {status if status and status > 0 else err}")
        samples = [ln for ln in text.splitlines() if ln.startswith("vllm:")]
        if not samples:
            raise NotReady(f"{self.base}/metrics exports no vllm: metrics")
        return len(samples)


def prove(prober: Prober, params: dict, watch, sleep=time.sleep, clock=time.monotonic) -> dict:
    checks = params["checks"]
    out = {"seconds_to_healthy": prober.wait_healthy(clock() + params["timeout"], params["interval"], watch, sleep, clock),
           "models": None, "completion": None, "metrics": None}
    if "models" in checks:
        out["models"] = prober.models(params["served_model_name"])
    if "completion" in checks:
        out["completion"] = prober.completion(params["served_model_name"], params["prompt"], params["max_tokens"], clock)
    if "metrics" in checks:
        out["metrics"] = prober.metrics()
    return out

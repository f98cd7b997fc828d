# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Does the vLLM service prove itself, for gpufleet.inference.vllm_ready: ``/health`` answers 200,
``/v1/models`` lists the served model, a completion comes back, ``/metrics`` has the vLLM counters,
and the unit does not restart meanwhile.

The checks (Prober, prove) are pure: they get the HTTP ``request`` and the unit watcher passed in.
execute() is the module's run: the requests through the benchmark client's transport
(bench/transport.py's ``request_text``), ``systemctl show`` and ``journalctl`` through HostCmd (C
locale), the start log through HostFS, and the path vLLM took from ``vllm/startlog.py``.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Callable

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed, bounded
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.transport import request_text
from ansible_collections.gpufleet.inference.plugins.module_utils.vllm.startlog import parse as parse_start_log


# The numbers a run takes, and their allowed ranges: (low, high, unit).
LIMITS = {"timeout": (1, 86400, "seconds"), "interval": (0.01, 300, "seconds"), "request_timeout": (1, 3600, "seconds"),
          "max_tokens": (1, 4096, "tokens"), "journal_lines": (0, 100000, "lines"), "start_log_lines": (1, 1000000, "lines")}


def check_limits(p: dict[str, Any]) -> None:
    """Failed (nothing done) naming the first number outside its LIMITS range, or an api_key no HTTP header can carry."""
    for name, (low, high, unit) in LIMITS.items():
        bounded(name, p[name], low, high, unit)
    key = p.get("api_key")
    if key and not re.fullmatch(r"[\x21-\x7e]+", key):
        raise Failed("api_key holds a space, a control character or a non-ASCII character, which an HTTP Authorization "
                     "header cannot carry (the key is not shown): give the key the service runs with.", changed=False)


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
            raise NotReady(f"{self.base}/v1/models lists {ids}, not the served model name {name!r} (served_model_name)")
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


class Service:
    """The unit's state, its journal and its start log, through the Host's commands and files."""

    def __init__(self, p: dict[str, Any], cmds, warn: Callable[[str], None]):
        self.p = p
        self.cmds = cmds
        self.warn = warn
        self.systemctl = cmds.find("systemctl")
        self.journalctl = cmds.find("journalctl")

    def unit(self) -> dict:
        return unit_state(self.cmds.run, self.systemctl, self.p["unit"])

    def journal(self) -> str:
        if not self.journalctl or not self.p["unit"]:
            return ""
        rc, out, err = self.cmds.run([self.journalctl, "-u", self.p["unit"], "-n", str(self.p["journal_lines"]),
                                      "--no-pager", "-o", "short-iso"])
        return out if rc == 0 else f"(journalctl failed: {err.strip()})"

    def start_log(self) -> str | None:
        p = self.p
        if p["start_log"]:
            try:
                return self.cmds.fs.read_text(p["start_log"])
            except HostFSError as err:
                self.warn(f"start_log {p['start_log']} could not be read ({err.strerror}); kernel_path is null")
                return None
        if not p["start_log_journal"]:
            return None
        if not self.journalctl or not p["unit"]:
            self.warn("start_log_journal needs journalctl and unit; kernel_path is null")
            return None
        rc, out, err = self.cmds.run([self.journalctl, "-u", p["unit"], "-n", str(p["start_log_lines"]), "--no-pager",
                                      "-o", "cat"])
        if rc != 0:
            self.warn(f"journalctl -u {p['unit']} failed ({err.strip()}); kernel_path is null")
            return None
        return out

    def kernel_path(self) -> dict | None:
        text = self.start_log()
        if text is None:
            return None
        path = parse_start_log(text)
        for f in path["findings"]:
            if f["severity"] in ("warning", "error"):
                self.warn(f"vLLM start log: {f['message']}. Fix: {f['fix']}")
        return path


def execute(p: dict[str, Any], host: Host, check_mode: bool, request=request_text) -> dict[str, Any]:  # pylint: disable=unused-argument
    """The module's run: prove() the service while watching its unit; the result, or Failed with the unit's
    state, its last journal lines and the kernel path vLLM took. Changes nothing (check mode runs the same).
    ``request``: the HTTP client (tests)."""
    check_limits(p)
    service = Service(p, host.cmd, host.warn)
    first = service.unit()
    prober = Prober(request, p["url"], p["api_key"], p["request_timeout"])
    try:
        result = prove(prober, p, lambda: unit_broken(first, service.unit()))
    except NotReady as err:
        lines = service.journal()
        tail = f"\nLast {p['journal_lines']} journal lines of {p['unit']}:\n{lines}" if lines else ""
        raise Failed(f"{p['unit'] or p['url']} is not ready: {err}{tail}", changed=False, actions=[], unit=service.unit(),
                     kernel_path=service.kernel_path()) from None
    return dict(changed=False, actions=[], unit=service.unit(), kernel_path=service.kernel_path(), diff={}, **result)

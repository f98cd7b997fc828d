# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_ready (the vllm_service role's readiness proof) against a local HTTP server that answers
like vLLM's OpenAI server, with stand-ins for systemctl and journalctl on PATH."""

from __future__ import annotations

import http.server
import json
import stat
import sys
import textwrap
import threading

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.vllm import vllm_ready as vr
from ansible_collections.gpufleet.inference.plugins.modules import vllm_ready
from tests.unit.plugins.modules.uthelper import run_module

KEY = "k" * 16 + "-unit-test"


class FakeVllm(http.server.BaseHTTPRequestHandler):
    """Answers like vLLM 0.32's API server; behaviour set on the server object."""

    def log_message(self, *args):
        pass

    def reply(self, status, body="", ctype="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorised(self):
        key = self.server.cfg.get("key")
        return not key or self.headers.get("Authorization") == f"Bearer {key}"

    def do_GET(self):  # noqa: N802
        cfg = self.server.cfg
        if self.path == "/health":
            cfg["health_calls"] = cfg.get("health_calls", 0) + 1
            return self.reply(200 if cfg["health_calls"] > cfg.get("unhealthy", 0) else 503)
        if self.path == "/v1/models":
            if not self.authorised():
                return self.reply(401, json.dumps({"error": "Unauthorized"}))
            data = [{"id": n, "object": "model"} for n in cfg.get("models", ["tiny"])]
            return self.reply(200, json.dumps({"object": "list", "data": data}))
        if self.path == "/metrics":
            return self.reply(200, cfg.get("metrics", "# HELP x\nvllm:num_requests_running{model_name=\"tiny\"} 0.0\n"
                                                      "vllm:generation_tokens_total{model_name=\"tiny\"} 4.0\n"), "text/plain")
        return self.reply(404)

    def do_POST(self):  # noqa: N802
        cfg = self.server.cfg
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cfg["posted"] = body
        if not self.authorised():
            return self.reply(401, json.dumps({"error": "Unauthorized"}))
        if cfg.get("completion_status", 200) != 200:
            return self.reply(cfg["completion_status"], json.dumps({"error": {"message": "EngineDeadError"}}))
        tokens = cfg.get("tokens", body["max_tokens"])
        return self.reply(200, json.dumps({"object": "text_completion", "model": body["model"],
                                           "choices": [{"index": 0, "text": " Paris" * tokens, "finish_reason": "length"}],
                                           "usage": {"prompt_tokens": 5, "completion_tokens": tokens}}))


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    srv.cfg = {}
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def url(srv):
    return f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """systemctl/journalctl stand-ins; the unit's state comes from a file the test writes."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    state = tmp_path / "unit-state"
    state.write_text("ActiveState=active\nSubState=running\nMainPID=4242\nNRestarts=0\nResult=success\n")
    for name, body in (("systemctl", f"sys.stdout.write(open({str(state)!r}).read())"),
                       ("journalctl", "sys.stdout.write('vllm[4242]: ImportError: libnuma.so.1: cannot open shared object file\\n')")):
        path = bindir / name
        path.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    return state


# ---- unit state -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("now, reason", [
    ({"ActiveState": "active", "SubState": "running", "NRestarts": "0", "MainPID": "10"}, None),
    ({"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": "1", "MainPID": "0"},
     "the unit's process exited and systemd is restarting it"),
    ({"ActiveState": "failed", "Result": "exit-code"}, "the unit failed (exit-code)"),
    ({"ActiveState": "inactive"}, "the unit is not running (inactive)"),
    ({"ActiveState": "active", "SubState": "running", "NRestarts": "2", "MainPID": "10"}, "the unit restarted (0 -> 2 restarts)"),
    ({"ActiveState": "active", "SubState": "running", "NRestarts": "0", "MainPID": "11"},
     "the unit's main process changed (10 -> 11)"),
    ({}, None),
])
def test_unit_broken(now, reason):
    first = {"ActiveState": "active", "SubState": "running", "NRestarts": "0", "MainPID": "10"}
    assert vr.unit_broken(first, now) == reason


# ---- the checks through main() ------------------------------------------------------------------------------
def test_ready_service_passes_every_check(server, tools, capsys):
    server.cfg.update(key=KEY, unhealthy=2)
    result = run_module(vllm_ready, {"url": url(server), "served_model_name": "tiny", "api_key": KEY,
                                     "unit": "vllm.service", "interval": 0.05, "timeout": 10}, capsys)
    assert result["changed"] is False and result["actions"] == []
    assert result["models"] == ["tiny"] and result["metrics"] == 2
    assert result["completion"]["completion_tokens"] == 4 and result["completion"]["text"] == " Paris" * 4
    assert result["unit"]["ActiveState"] == "active" and server.cfg["health_calls"] == 3
    assert server.cfg["posted"] == {"model": "tiny", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    assert KEY not in json.dumps(result)


def test_wrong_served_name(server, tools, capsys):
    server.cfg.update(models=["other"])
    result = run_module(vllm_ready, {"url": url(server), "served_model_name": "tiny", "unit": "vllm.service"}, capsys)
    assert result["failed"]
    assert result["msg"].startswith(f"vllm.service is not ready: {url(server)}/v1/models lists ['other'], not the served "
                                    "model name 'tiny'")
    assert "Last 50 journal lines of vllm.service:\nvllm[4242]: ImportError: libnuma.so.1" in result["msg"]


def test_refused_key(server, tools, capsys):
    server.cfg.update(key=KEY)
    result = run_module(vllm_ready, {"url": url(server), "served_model_name": "tiny", "api_key": "x" * 20, "unit": "vllm.service"}, capsys)
    assert "answered 401: the API key was refused" in result["msg"]
    assert "x" * 20 not in json.dumps(result)


def test_completion_error(server, tools, capsys):
    server.cfg.update(completion_status=500)
    result = run_module(vllm_ready, {"url": url(server), "served_model_name": "tiny", "unit": "vllm.service"}, capsys)
    assert "the completion on" in result["msg"] and "answered 500" in result["msg"] and "EngineDeadError" in result["msg"]


def test_completion_without_tokens(server, tools, capsys):
    server.cfg.update(tokens=0)
    result = run_module(vllm_ready, {"url": url(server), "served_model_name": "tiny", "unit": "vllm.service"}, capsys)
    assert "the completion returned no tokens" in result["msg"]


def test_metrics_without_vllm_names(server, tools, capsys):
    server.cfg.update(metrics="# nothing\nprocess_cpu_seconds_total 1.0\n")
    result = run_module(vllm_ready, {"url": url(server), "served_model_name": "tiny", "unit": "vllm.service"}, capsys)
    assert result["msg"].endswith("/metrics exports no vllm: metrics" + result["msg"].split("/metrics exports no vllm: metrics", 1)[1])
    ok = run_module(vllm_ready, {"url": url(server), "served_model_name": "tiny", "checks": ["health", "models", "completion"]}, capsys)
    assert not ok.get("failed") and ok["metrics"] is None


def test_crash_loop_fails_fast_with_the_journal(server, tools, capsys):
    server.cfg.update(unhealthy=10 ** 6)
    tools.write_text("ActiveState=activating\nSubState=auto-restart\nMainPID=0\nNRestarts=3\nResult=exit-code\n")
    result = run_module(vllm_ready, {"url": url(server), "served_model_name": "tiny", "unit": "vllm.service",
                                     "timeout": 600, "interval": 0.05}, capsys)
    assert "never answered 200 (HTTP 503): the unit's process exited and systemd is restarting it" in result["msg"]
    assert "libnuma.so.1" in result["msg"]


def test_nothing_listening_times_out(tools, capsys):
    result = run_module(vllm_ready, {"url": "http://127.0.0.1:9", "served_model_name": "tiny", "timeout": 1, "interval": 0.2}, capsys)
    assert result["failed"] and "/health did not answer 200 within the timeout" in result["msg"]
    assert result["msg"].startswith("http://127.0.0.1:9 is not ready")


# ---- prove() with a fake clock -------------------------------------------------------------------------------
def test_prove_timing_and_order():
    calls = []
    now = [0.0]

    def request(method, u, body, headers, timeout):
        calls.append((method, u.rsplit("/", 1)[-1]))
        if u.endswith("/health"):
            return (200, "", None) if now[0] >= 30 else (-1, "", "Connection refused")
        return 500, "", None

    prober = vr.Prober(request, "http://h:1/", None, 5)
    params = {"checks": ["health"], "timeout": 100, "interval": 10, "served_model_name": "m", "prompt": "p", "max_tokens": 1}
    out = vr.prove(prober, params, watch=lambda: None, sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])
    assert out["seconds_to_healthy"] == 30.0 and out["models"] is None
    assert calls == [("GET", "health")] * 4


def test_module_docs_parse():
    import yaml  # pylint: disable=import-outside-toplevel
    for doc in (vllm_ready.DOCUMENTATION, vllm_ready.EXAMPLES, vllm_ready.RETURN):
        assert yaml.safe_load(textwrap.dedent(doc))


@pytest.mark.parametrize("name, value, allowed", [
    ("timeout", 10 ** 12, "from 1 to 86400 seconds"), ("timeout", -1, "from 1 to 86400 seconds"),
    ("interval", float("nan"), "from 0.01 to 300 seconds"), ("interval", float("inf"), "from 0.01 to 300 seconds"),
    ("interval", -1.0, "from 0.01 to 300 seconds"), ("request_timeout", 0, "from 1 to 3600 seconds"),
    ("max_tokens", 2 ** 63, "from 1 to 4096 tokens"), ("journal_lines", -5, "from 0 to 100000 lines"),
])
def test_numbers_out_of_range_are_refused_before_any_request(name, value, allowed, capsys):
    """Issue 31: a huge timeout hung, interval nan/inf/-1 gave a traceback. Now a failure naming the range, no request."""
    args = {"url": "http://127.0.0.1:9", "served_model_name": "tiny", "timeout": 1, "interval": 0.2, name: value}
    result = run_module(vllm_ready, args, capsys)
    assert result["failed"] and result["changed"] is False
    assert result["msg"].startswith(f"{name}=") and allowed in result["msg"] and "exception" not in result


@pytest.mark.parametrize("key", ["k" * 16 + "\n", "k" * 16 + "\0", "caf\u00e9" * 4, "two words here, sixteen"])
def test_an_api_key_no_header_can_carry_is_refused_unshown(key, capsys):
    """The fuzz suite: a key with a newline was sent and the server closed the connection mid-response."""
    result = run_module(vllm_ready, {"url": "http://127.0.0.1:9", "served_model_name": "tiny", "api_key": key}, capsys)
    assert result["failed"] and result["msg"].startswith("api_key holds a space, a control character") and key not in result["msg"]

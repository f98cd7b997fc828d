# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""inference_transport.request_text(), the one-shot request vllm_ready's probes send, against real
sockets on 127.0.0.1: the answer and its body, an HTTP error with its body, a refused port and a
server that accepts and never answers."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.transport import request_text


class Handler(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def log_message(self, *_args):
        pass

    def _answer(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 (http.server's naming)
        Handler.seen.append(("GET", self.path, dict(self.headers), b""))
        if self.path.startswith("/missing"):
            self._answer(404, b'{"detail":"Not Found"}')
        else:
            self._answer(200, b"vllm:num_requests_running 0\n", "text/plain")

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Handler.seen.append(("POST", self.path, dict(self.headers), body))
        self._answer(200, json.dumps({"echo": json.loads(body)}).encode())


@pytest.fixture(name="server")
def fixture_server():
    Handler.seen = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_an_answer_its_body_the_path_and_the_headers(server):
    status, text, err = request_text("GET", server + "/metrics?x=1", None, {"Authorization": "Bearer k"}, 5)
    assert (status, text, err) == (200, "vllm:num_requests_running 0\n", None)
    method, path, headers, _body = Handler.seen[-1]
    assert (method, path, headers["Authorization"]) == ("GET", "/metrics?x=1", "Bearer k")
    status, text, err = request_text("POST", server + "/v1/completions", json.dumps({"prompt": "é"}),
                                     {"Content-Type": "application/json"}, 5)
    assert status == 200 and err is None and json.loads(text) == {"echo": {"prompt": "é"}}
    assert Handler.seen[-1][3] == json.dumps({"prompt": "é"}).encode()


def test_an_http_error_keeps_its_body(server):
    status, text, err = request_text("GET", server + "/missing", None, {}, 5)
    assert status == 404 and json.loads(text) == {"detail": "Not Found"} and err == "HTTP 404 Not Found"


def test_a_refused_port_is_minus_one_with_the_reason():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert request_text("GET", f"http://127.0.0.1:{port}/health", None, {}, 5) == (-1, "", "connection refused")


def test_a_server_that_never_answers_times_out():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)  # the kernel completes the connect; nobody ever reads or answers
        start = time.monotonic()
        status, text, err = request_text("GET", f"http://127.0.0.1:{sock.getsockname()[1]}/health", None, {}, 0.3)
        took = time.monotonic() - start
    assert (status, text, err) == (-1, "", "timed out") and took < 5

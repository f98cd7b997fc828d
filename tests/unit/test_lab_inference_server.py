# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""extras/lab_inference_server.py, the lab stand-in for vLLM, run for real on 127.0.0.1.

Each test starts the server as a subprocess on a free port and talks HTTP to it: the OpenAI
protocol (streamed and not), vLLM's error shapes, the API key from the environment, batching with
--max-num-seqs, clean SIGTERM, and that a CPU hog on its core really lowers its throughput.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = os.path.join(REPO, "extras", "lab_inference_server.py")


class LabServer:
    """The lab server in a subprocess on 127.0.0.1 and a free port; stopped by stop() or the context manager."""

    def __init__(self, model_dir: str, *args: str, env: dict | None = None, cpu: int | None = None,
                 name: str = "lab", start: bool = True):
        self.argv = [sys.executable, SERVER, "--model", str(model_dir), "--served-model-name", name, "--host", "127.0.0.1",
                     "--port", "0", *args]
        self.env = dict(os.environ)
        self.env.pop("VLLM_API_KEY", None)
        self.env.update(env or {})
        self.cpu = cpu
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.stderr = ""
        if start:
            self.start()

    def start(self, timeout: float = 20.0) -> None:
        preexec = (lambda: os.sched_setaffinity(0, {self.cpu})) if self.cpu is not None else None
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=preexec)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            found = re.search(r"Listening on http://127\.0\.0\.1:(\d+)", line)
            if found:
                self.port = int(found.group(1))
                return
        self.stop()
        raise RuntimeError(f"lab server did not start: {self.stderr}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.stderr = self.proc.stderr.read() if self.proc.stderr else ""
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()
        rc = self.proc.returncode
        self.proc = None
        return rc

    def __enter__(self) -> "LabServer":
        return self

    def __exit__(self, *_exc) -> None:
        self.stop()

    # -- a small synchronous HTTP helper
    def request(self, method: str, path: str, body=None, headers: dict | None = None, conn=None):
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        raw = resp.read()
        if own:
            conn.close()
        return resp, raw

    def metrics_text(self) -> str:
        return self.request("GET", "/metrics")[1].decode()

    def metric(self, name: str) -> float:
        total = 0.0
        for line in self.metrics_text().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture
def lab(model_dir):
    server = LabServer(model_dir, "--max-model-len", "512", "--work", "4", "--step-work", "16")
    yield server
    server.stop()


def sse_events(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]


# ---- protocol -------------------------------------------------------------------------------------
def test_health_version_models(lab, model_dir):
    resp, raw = lab.request("GET", "/health")
    assert (resp.status, raw) == (200, b"")
    resp, raw = lab.request("GET", "/version")
    assert json.loads(raw)["version"].startswith("gpufleet-lab")
    resp, raw = lab.request("GET", "/v1/models")
    models = json.loads(raw)
    assert models["object"] == "list"
    entry = models["data"][0]
    assert (entry["id"], entry["root"], entry["max_model_len"], entry["object"]) == ("lab", str(model_dir), 512, "model")


def test_completion_text_and_token_ids(lab):
    resp, raw = lab.request("POST", "/v1/completions", {"model": "lab", "prompt": "one two three", "max_tokens": 5})
    body = json.loads(raw)
    assert resp.status == 200
    assert body["object"] == "text_completion"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert body["choices"][0]["finish_reason"] == "length"
    assert len(body["choices"][0]["text"].split()) == 5
    resp, raw = lab.request("POST", "/v1/completions", {"model": "lab", "prompt": [1000, 1001, 1002, 1003], "max_tokens": 7})
    assert json.loads(raw)["usage"] == {"prompt_tokens": 4, "completion_tokens": 7, "total_tokens": 11}
    # the same prompt gives the same text (the hash chain starts from the prompt)
    again = json.loads(lab.request("POST", "/v1/completions", {"model": "lab", "prompt": "one two three", "max_tokens": 5})[1])
    assert again["choices"][0]["text"] == body["choices"][0]["text"]


def test_stream_format_with_usage(lab):
    resp, raw = lab.request("POST", "/v1/completions", {
        "model": "lab", "prompt": [1000, 1001], "max_tokens": 4, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert resp.status == 200
    assert resp.getheader("content-type").startswith("text/event-stream")
    assert resp.getheader("transfer-encoding") == "chunked"
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    token_chunks = [c for c in chunks if c["choices"]]
    assert [c["usage"]["completion_tokens"] for c in token_chunks] == [1, 2, 3, 4]
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None, None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}


def test_stream_without_usage_and_stream_interval(model_dir):
    with LabServer(model_dir, "--stream-interval", "3", "--work", "1", "--step-work", "1") as lab:
        _resp, raw = lab.request("POST", "/v1/completions", {"model": "lab", "prompt": "hi", "max_tokens": 7, "stream": True})
    events = sse_events(raw)
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["usage"] is None for c in chunks)
    assert [len(c["choices"][0]["text"].split()) for c in chunks] == [1, 3, 3]


def test_eos_after_without_ignore_eos(model_dir):
    with LabServer(model_dir, "--eos-after", "3", "--work", "1", "--step-work", "1") as lab:
        stopped = json.loads(lab.request("POST", "/v1/completions", {"prompt": "a b", "max_tokens": 10})[1])
        ignored = json.loads(lab.request("POST", "/v1/completions", {"prompt": "a b", "max_tokens": 10, "ignore_eos": True})[1])
    assert (stopped["usage"]["completion_tokens"], stopped["choices"][0]["finish_reason"]) == (3, "stop")
    assert (ignored["usage"]["completion_tokens"], ignored["choices"][0]["finish_reason"]) == (10, "length")


@pytest.mark.parametrize("body, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    ({"model": "other", "prompt": "x"}, 404, "does not exist"),
    ({"prompt": [5, 99999]}, 400, "out of vocabulary"),
    ({"prompt": "x", "max_tokens": 600}, 400, "maximum context length is 512"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "only be defined when `stream=True`"),
    ({"prompt": "x", "n": 2}, 400, "n must be 1"),
    ({"prompt": ""}, 400, "prompt is empty"),
    ({"prompt": ["a", "b"]}, 400, "one prompt per request"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens must be"),
])
def test_bad_requests_answer_like_vllm(lab, body, status, fragment):
    resp, raw = lab.request("POST", "/v1/completions", body)
    assert resp.status == status
    error = json.loads(raw)["error"]
    assert fragment in error["message"] and error["code"] == status


def test_unknown_route_and_method(lab):
    assert lab.request("GET", "/v1/nothing")[0].status == 404
    assert lab.request("GET", "/v1/completions")[0].status == 405


def test_keep_alive_serves_several_requests_on_one_connection(lab):
    conn = http.client.HTTPConnection("127.0.0.1", lab.port, timeout=30)
    try:
        for _i in range(3):
            resp, raw = lab.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2, "stream": True}, conn=conn)
            assert resp.status == 200 and sse_events(raw)[-1] == "[DONE]"
        # one /metrics read: it is the 4th request and comes on a 2nd connection
        assert lab.metrics_text().count("\n") > 10
        text = lab.metrics_text()  # the 5th request, on a 3rd connection
        assert "gpufleet_lab_http_requests_total 5" in text
        assert "gpufleet_lab_http_connections_total 3" in text
    finally:
        conn.close()


def test_metrics_count_tokens(lab):
    lab.request("POST", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 6})
    lab.request("POST", "/v1/completions", {"prompt": "a b", "max_tokens": 4, "stream": True})
    resp, raw = lab.request("GET", "/metrics")
    assert resp.getheader("content-type").startswith("text/plain")
    assert "# TYPE vllm:generation_tokens_total counter" in raw.decode()
    assert lab.metric("vllm:generation_tokens_total") == 10
    assert lab.metric("vllm:prompt_tokens_total") == 5
    assert lab.metric("vllm:request_success_total") == 2
    assert lab.metric("vllm:num_requests_running") == 0


@pytest.mark.parametrize("caching", [True, False])
def test_prefix_caching_computes_a_shared_prefix_once(model_dir, caching):
    """--enable-prefix-caching: a prompt's leading full blocks of 16 tokens that an earlier prefill computed are hits
    (480 shared tokens = 30 blocks), a unique prompt hits nothing; without the flag nothing is looked up. What the
    VM lab's measured-tuning e2e (tests/lab/test_profiles_vm.py) sees as throughput, counted here."""
    flags = ["--enable-prefix-caching"] if caching else []
    shared = list(range(1000, 1480))
    with LabServer(model_dir, "--max-model-len", "1024", "--work", "1", "--step-work", "1", *flags) as lab:
        def send(prompt):
            resp, raw = lab.request("POST", "/v1/completions", {"model": "lab", "prompt": prompt, "max_tokens": 1})
            assert resp.status == 200, raw

        counts = []
        for prompt in (shared + list(range(2000, 2032)), shared + list(range(3000, 3032)), list(range(1500, 2012))):
            send(prompt)
            counts.append((lab.metric("gpufleet_lab_prefix_cache_queries_total"),
                           lab.metric("gpufleet_lab_prefix_cache_hits_total")))
    assert counts == ([(512, 0), (1024, 480), (1536, 480)] if caching else [(0, 0)] * 3)


def test_api_key_from_environment(model_dir):
    with LabServer(model_dir, env={"VLLM_API_KEY": "s3cret"}) as lab:
        assert lab.request("GET", "/v1/models")[0].status == 401
        assert lab.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})[0].status == 401
        assert lab.request("GET", "/v1/models", headers={"Authorization": "Bearer s3cret"})[0].status == 200
        assert lab.request("GET", "/health")[0].status == 200  # like vLLM, /health and /metrics need no key


def test_refuses_api_key_on_argv_and_missing_model(tmp_path, model_dir):
    for argv, fragment in ((["--model", str(model_dir), "--api-key", "x"], "VLLM_API_KEY"),
                           (["--model", str(tmp_path / "absent")], "does not exist"),
                           ([], "--model is required"),
                           (["--model", str(model_dir), "--cold-factor", "0.5"], "--cold-factor must be at least 1"),
                           (["--model", str(model_dir), "--cold-steps", "-1"], "--cold-steps must not be negative")):
        proc = subprocess.run([sys.executable, SERVER, *argv], capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode == 2
        assert fragment in proc.stderr


def test_ignores_vllm_only_options_and_stops_on_sigterm(model_dir):
    lab = LabServer(model_dir, "--gpu-memory-utilization", "0.9", "--tensor-parallel-size", "8")
    try:
        assert lab.request("GET", "/health")[0].status == 200
    finally:
        t0 = time.monotonic()
        rc = lab.stop()
    assert rc == 0 and time.monotonic() - t0 < 5
    assert "ignoring vLLM options the lab server does not model: --gpu-memory-utilization 0.9 --tensor-parallel-size 8" in lab.stderr


def test_max_num_seqs_queues_the_rest(model_dir):
    """With one sequence slot, a second concurrent request waits (vllm:num_requests_waiting) until the first is done."""
    import threading

    with LabServer(model_dir, "--max-num-seqs", "1", "--work", "64", "--step-work", "0") as lab:
        threads = [threading.Thread(target=lab.request, args=("POST", "/v1/completions", {"prompt": p, "max_tokens": 3000, "ignore_eos": True}))
                   for p in ("first", "second")]
        for t in threads:
            t.start()
        seen = set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(t.is_alive() for t in threads):
            seen.add((lab.metric("vllm:num_requests_running"), lab.metric("vllm:num_requests_waiting")))
            time.sleep(0.01)
        for t in threads:
            t.join()
        assert (1.0, 1.0) in seen
        assert not any(running > 1 for running, _waiting in seen)
        assert lab.metric("vllm:generation_tokens_total") == 6000


def _throughput(lab: LabServer, seconds: float) -> float:
    """Generated tokens per second over a closed loop of 4 concurrent streams for ``seconds``."""
    import threading

    stop = time.monotonic() + seconds
    before = lab.metric("vllm:generation_tokens_total")
    t0 = time.monotonic()

    def loop() -> None:
        while time.monotonic() < stop:
            lab.request("POST", "/v1/completions", {"prompt": [1000] * 8, "max_tokens": 32, "ignore_eos": True})

    threads = [threading.Thread(target=loop) for _i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (lab.metric("vllm:generation_tokens_total") - before) / (time.monotonic() - t0)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_cpu_hog_on_its_core_lowers_throughput(model_dir):
    """Real CPU work per token: a busy process on the same core takes a real share of the throughput."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    with LabServer(model_dir, "--work", "64", "--step-work", "256", cpu=cpu) as lab:
        _throughput(lab, 0.5)  # warm-up
        idle = _throughput(lab, 1.5)
        # three busy loops on the server's core: on a host already loaded by k other runnable tasks the server's share
        # falls from 1/(1+k) to 1/(4+k), well below 0.8 of it for any k (one hog alone gives (1+k)/(2+k): 0.8 at k=3)
        hogs = [subprocess.Popen([sys.executable, "-c", "import time\nt=time.monotonic()+20\nwhile time.monotonic()<t: pass"],
                                 preexec_fn=lambda: os.sched_setaffinity(0, {cpu})) for _i in range(3)]
        try:
            busy = _throughput(lab, 1.5)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait(timeout=10)
    assert idle > 0
    assert busy < 0.8 * idle, f"throughput with a hog on CPU {cpu}: {busy:.0f} tok/s vs {idle:.0f} without"


def test_cold_start_cost_falls_linearly_to_normal(model_dir):
    """--cold-factor F --cold-steps N: step 0 costs F times its work, step N/2 half way, step N and later 1."""
    sys.path.insert(0, os.path.dirname(SERVER))
    try:
        import lab_inference_server as lis
    finally:
        sys.path.pop(0)
    args, _unknown = lis.parse_args(["--model", str(model_dir), "--cold-factor", "5", "--cold-steps", "10"])
    engine = lis.Engine(args)
    assert [engine.cost_factor(i) for i in (0, 5, 10, 11)] == [5.0, 3.0, 1.0, 1.0]
    warm, _rest = lis.parse_args(["--model", str(model_dir)])
    assert lis.Engine(warm).cost_factor(0) == 1.0


def test_step_wait_is_wall_time_without_cpu_and_follows_the_cold_factor(model_dir):
    """--step-wait-ms W: a step waits W ms times its cost factor, sleeping (no CPU), on top of its hashing."""
    sys.path.insert(0, os.path.dirname(SERVER))
    try:
        import lab_inference_server as lis
    finally:
        sys.path.pop(0)
    args, _unknown = lis.parse_args(["--model", str(model_dir), "--work", "0", "--step-work", "0",
                                     "--step-wait-ms", "20"])
    engine = lis.Engine(args)
    for factor in (1.0, 4.0):
        wall, cpu = time.perf_counter(), time.thread_time()
        engine._step([b"x"], [0], factor)  # pylint: disable=protected-access
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        assert 0.020 * factor <= wall < 0.020 * factor + 0.5 and cpu < 0.01
    bad, _rest = lis.parse_args(["--model", str(model_dir), "--step-wait-ms", "-1"])
    assert lis.check_args(bad) == "--step-wait-ms must not be negative"


# ---- the lab model: tokens with logprobs, teacher-forced scoring, noise -----------------------------------
def completion(lab: LabServer, **body) -> dict:
    body.setdefault("model", "lab")
    resp, raw = lab.request("POST", "/v1/completions", body)
    assert resp.status == 200, raw
    return json.loads(raw)["choices"][0]


def test_lab_model_is_a_distribution_and_pseudo_words_tokenize_back():
    sys.path.insert(0, os.path.dirname(SERVER))
    try:
        import lab_inference_server as server  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    model = server.LabModel(3, 32000)
    ctx = model.context([5, 6, 7])
    pairs = model.dist(ctx)
    total = sum(math.exp(lp) for _t, lp in pairs) + math.exp(model.rest_logprob) * (32000 - server.CANDIDATES)
    assert total == pytest.approx(1.0) and pairs == sorted(pairs, key=lambda p: -p[1])
    assert model.score(ctx, pairs[0][0])[:2] == (pairs[0][1], 1)
    assert model.score(ctx, 31999 if 31999 not in dict(pairs) else 31998)[1] == server.CANDIDATES + 1
    for token in (0, 1, 31, 32, 1025, 31999):
        assert server.tokenize(server.token_text(token), 32000) == [token]


def test_logprobs_of_generated_tokens_in_vllm_shape(lab):
    choice = completion(lab, prompt="the quick brown fox", max_tokens=6, logprobs=3, return_token_ids=True)
    lp = choice["logprobs"]
    assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6 == len(choice["token_ids"])
    assert "".join(lp["tokens"]) == choice["text"] and lp["text_offset"][0] == 0
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) == 3 and top[token] == value == max(top.values()) < 0  # greedy: the argmax
    assert choice["prompt_token_ids"] == [int(t.split(":")[1]) for t in completion(
        lab, prompt="the quick brown fox", max_tokens=1, logprobs=0, echo=True, return_tokens_as_token_ids=True,
    )["logprobs"]["tokens"][:4]]


def test_teacher_forced_scores_equal_the_generation_logprobs(lab):
    gen = completion(lab, prompt="score me please", max_tokens=12, logprobs=1, return_token_ids=True)
    ids = gen["prompt_token_ids"] + gen["token_ids"]
    forced = completion(lab, prompt=ids, max_tokens=1, prompt_logprobs=2)["prompt_logprobs"]
    assert forced[0] is None and len(forced) == len(ids)
    for i, token in enumerate(gen["token_ids"]):
        entry = forced[3 + i]
        assert entry[str(token)]["rank"] == 1 and entry[str(token)]["logprob"] == gen["logprobs"]["token_logprobs"][i]
        assert len(entry) == 2 and sorted(e["rank"] for e in entry.values()) == [1, 2]
    echoed = completion(lab, prompt=ids, max_tokens=0, echo=True, logprobs=1, return_tokens_as_token_ids=True)
    assert echoed["logprobs"]["token_logprobs"][0] is None and echoed["logprobs"]["top_logprobs"][0] is None
    assert echoed["logprobs"]["token_logprobs"][3:] == gen["logprobs"]["token_logprobs"]
    assert echoed["logprobs"]["tokens"] == [f"token_id:{t}" for t in ids] and echoed["finish_reason"] == "length"
    assert echoed["text"].endswith(gen["text"]) and len(echoed["text"].split()) == 15  # the prompt's 3 tokens, then 12


def test_output_noise_perturbs_its_share_of_positions_and_model_seed_is_another_model(model_dir):
    with LabServer(model_dir, "--work", "1", "--step-work", "1") as clean:
        gen = completion(clean, prompt="a long enough prompt", max_tokens=400, logprobs=1, return_token_ids=True,
                         ignore_eos=True)
    ids = gen["prompt_token_ids"] + gen["token_ids"]
    with LabServer(model_dir, "--work", "1", "--step-work", "1", "--output-noise", "0.2") as noisy:
        forced = completion(noisy, prompt=ids, max_tokens=1, prompt_logprobs=0)["prompt_logprobs"][4:]
        again = completion(noisy, prompt=ids, max_tokens=1, prompt_logprobs=0)["prompt_logprobs"][4:]
    lost = sum(1 for entry, token in zip(forced, gen["token_ids"]) if entry[str(token)]["rank"] != 1)
    assert 80 - 3 * 8 < lost < 80 + 3 * 8  # binomial(400, 0.2): mean 80, sd 8
    assert forced == again  # deterministic
    with LabServer(model_dir, "--work", "1", "--step-work", "1", "--model-seed", "9") as other:
        forced = completion(other, prompt=ids, max_tokens=1, prompt_logprobs=0)["prompt_logprobs"][4:]
    agree = sum(1 for entry, token in zip(forced, gen["token_ids"]) if entry[str(token)]["rank"] == 1)
    assert agree < 10  # another model: its argmax meets the reference's by chance only


def test_ttft_knob_delays_the_first_token(model_dir):
    with LabServer(model_dir, "--work", "1", "--step-work", "1", "--ttft-ms", "300") as lab:
        t0 = time.perf_counter()
        completion(lab, prompt="wait for it", max_tokens=2)
        assert time.perf_counter() - t0 >= 0.3


def _streamed(lab: LabServer, max_tokens: int) -> tuple[float, float, int]:
    """(seconds to the first chunk, seconds to the end, tokens) of one streamed request."""
    conn = http.client.HTTPConnection("127.0.0.1", lab.port, timeout=30)
    t0 = time.monotonic()
    conn.request("POST", "/v1/completions", body=json.dumps({"model": "lab", "prompt": [1000, 1001], "stream": True,
                                                            "max_tokens": max_tokens, "ignore_eos": True}),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    first, tokens = None, 0
    for line in resp:
        if line.startswith(b"data: {"):
            first = first if first is not None else time.monotonic() - t0
            tokens += len(json.loads(line[6:])["choices"][0]["text"].split())
    end = time.monotonic() - t0
    conn.close()
    return first, end, tokens


def test_first_token_hold_delays_the_first_token_at_an_equal_throughput(model_dir):
    """--first-token-hold-ms: the first chunk waits 300 ms while the tokens are generated as before (a 20 ms step
    wait, 40 tokens: about 0.8 s), so the request ends when it would have and carries as many tokens: the lab's way to
    show a stage slower to its first token at the same tok/s."""
    args = ("--work", "1", "--step-work", "1", "--step-wait-ms", "20")
    with LabServer(model_dir, *args) as plain:
        _streamed(plain, 4)
        ttft, end, tokens = _streamed(plain, 40)
    with LabServer(model_dir, *args, "--first-token-hold-ms", "300") as held:
        _streamed(held, 4)
        ttft_held, end_held, tokens_held = _streamed(held, 40)
    assert tokens == tokens_held == 40
    assert ttft < 0.15 and ttft_held >= 0.3  # the first token waits
    assert abs(end_held - end) < 0.25 * end, (end, end_held)  # the request does not: same tokens in the same time


def test_a_negative_first_token_hold_is_refused(model_dir):
    proc = subprocess.run([sys.executable, SERVER, "--model", model_dir, "--first-token-hold-ms", "-1"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2 and "--first-token-hold-ms must not be negative" in proc.stderr


@pytest.mark.parametrize("body, fragment", [
    ({"logprobs": 21}, "greater than max allowed: 20"),
    ({"prompt_logprobs": -2}, "must be a positive value or -1"),
    ({"prompt_logprobs": 1, "stream": True}, "not available when `stream=True`"),
    ({"max_tokens": 0}, "0 only with echo"),
])
def test_logprob_requests_refused_like_vllm(lab, body, fragment):
    resp, raw = lab.request("POST", "/v1/completions", {"model": "lab", "prompt": "x y", **body})
    assert resp.status == 400 and fragment in json.loads(raw)["error"]["message"]


def test_fail_share_fails_its_seeded_share_of_completions_and_the_same_ones_every_start(model_dir):
    """--fail-share 0.3: about 30% of 200 completions answer HTTP 500 (binomial, 0.3 +- 4 sd of 0.032), the
    others complete; another start with the same seed fails the same request numbers; /health is untouched."""
    def statuses():
        with LabServer(model_dir, "--work", "1", "--step-work", "1", "--fail-share", "0.3") as failing:
            out = [failing.request("POST", "/v1/completions", {"model": "lab", "prompt": [5, 6, 7], "max_tokens": 2})[0].status
                   for _i in range(200)]
            assert failing.request("GET", "/health")[0].status == 200
            return out
    first = statuses()
    assert set(first) == {200, 500}
    assert 0.17 <= first.count(500) / len(first) <= 0.43
    assert statuses() == first


def test_a_fail_share_outside_zero_to_one_is_refused(model_dir):
    proc = subprocess.run([sys.executable, SERVER, "--model", model_dir, "--fail-share", "1.5"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2 and "--fail-share must be a share between 0 and 1, got 1.5" in proc.stderr

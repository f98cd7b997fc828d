# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tests/tools/h200_vllm.py's own machinery that runs here: the CPU hog (busy loops pinned to a process's
CPUs, gone afterwards), and serve/ready/stop with the role's rendered command for the lab stand-in."""

from __future__ import annotations

import os
import sys
import time

from tests.helpers import REPO

sys.path.insert(0, os.path.join(REPO, "tests", "tools"))
import h200_vllm  # noqa: E402


def test_hog_pins_one_loop_per_cpu_and_stops():
    hog = h200_vllm.Hog(os.getpid(), per_cpu=1)
    with hog:
        procs = list(hog.procs)
        assert len(procs) == len(os.sched_getaffinity(0))
        time.sleep(0.3)
        assert all(p.poll() is None for p in procs)
        # each loop is pinned to one CPU of the target's affinity
        pinned = [os.sched_getaffinity(p.pid) for p in procs]
        assert all(len(cpus) == 1 for cpus in pinned)
        assert set().union(*pinned) == os.sched_getaffinity(0)
    assert all(p.poll() is not None for p in procs) and hog.procs == []


def test_serve_ready_stop_the_rendered_stand_in(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_CALLER_ONLY", "1")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    overrides = {"vllm_service_command": [sys.executable, os.path.join(REPO, "extras", "lab_inference_server.py")],
                 "vllm_service_gpu_memory_utilization": 0.9, "vllm_service_model": str(model),
                 "vllm_service_port": 18931, "vllm_service_max_model_len": 0,
                 "vllm_service_state_dir": str(tmp_path / "state")}
    rendered = h200_vllm.render(os.path.join(REPO, "tests", "tools", "h200", "host_vars.yml"), overrides)
    assert rendered["argv"][:2] == overrides["vllm_service_command"] and "--port" in rendered["argv"]
    rec = h200_vllm.serve(rendered, str(tmp_path / "server.log"))
    try:
        state = h200_vllm.ready(rec["url"], rec["pid"], 30)
        assert state["ready"], state
        assert os.getsid(rec["pid"]) == rec["pid"]  # its own session, as under setsid
        with open(f"/proc/{rec['pid']}/environ", "rb") as fh:
            env = dict(kv.split(b"=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
        assert env[b"NCCL_NVLS_ENABLE"] == b"0" and env[b"HOME"] == str(tmp_path / "state").encode()
        assert b"GPUFLEET_CALLER_ONLY" not in env  # systemd's clean environment, not the caller's
        assert env[b"LD_LIBRARY_PATH"] == b"/usr/local/nvidia/lib64" and rec["inherited_env"] == ["LD_LIBRARY_PATH"]
    finally:
        h200_vllm.stop(rec["pid"])
    assert not h200_vllm.alive(rec["pid"])


def test_compare_rounds_sends_each_clients_request(tmp_path):
    """compare_rounds() against the lab stand-in with our two request shapes in turns: "ours" is the collection's
    default request (no per-chunk usage), "ours_usage" asks for it, and each run records what it sent."""
    import argparse
    import subprocess
    import urllib.request
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "extras", "lab_inference_server.py"), "--model", str(model),
                             "--served-model-name", "lab", "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = ""
        for line in proc.stdout:
            if "Listening on http://127.0.0.1:" in line:
                break
        url = "http://" + line.split("http://", 1)[1].split()[0].rstrip("/")
        with urllib.request.urlopen(url + "/health", timeout=10) as resp:
            assert resp.status == 200
        args = argparse.Namespace(url=url, tokenizer=None, clients=["ours", "ours_usage"], vllm_python=sys.executable,
                                  concurrency=[2], requests=[4], requests_per_slot=2, level_warmup=True, rounds=2,
                                  deadline=time.time() + 120, seed=0, warmup=0, prompt_tokens=16, output_tokens=8,
                                  per_chunk_usage=h200_vllm.DEFAULT_PER_CHUNK_USAGE)
        out = {"levels": {}}
        assert h200_vllm.compare_rounds(out, args, lambda: None) == 0
    finally:
        proc.terminate()
        proc.wait(10)
    rec = out["levels"]["2"]
    assert len(rec["ours"]) == len(rec["ours_usage"]) == 2 and "warmup" in rec
    assert {r["per_chunk_usage"] for r in rec["ours"]} == {False}
    assert {r["per_chunk_usage"] for r in rec["ours_usage"]} == {True}
    assert all(r["itl_exact"] for r in rec["ours_usage"]) and all(r["errors"] == 0 for r in rec["ours"] + rec["ours_usage"])

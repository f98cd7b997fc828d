# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""inference_benchmark: main() as Ansible runs it, against the lab inference server on 127.0.0.1:
results stored with kernel and tuning, check mode, and the errors users meet (endpoint down, wrong
model, bad settings, a server that fails requests, an unwritable results directory)."""

from __future__ import annotations

import json
import os
import platform
import socket
import stat

import pytest

from ansible_collections.gpufleet.inference.plugins.modules import inference_benchmark
from tests.unit.plugins.modules.uthelper import run_module
from tests.unit.test_lab_inference_server import LabServer


def run_main(args, capsys):
    return run_module(inference_benchmark, args, capsys)


def warnings_of(result) -> list[str]:
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    model = tmp_path_factory.mktemp("model")
    server = LabServer(model, "--work", "8", "--step-work", "32", "--max-model-len", "1024",
                       env={"VLLM_API_KEY": "bench-key"})
    yield server
    server.stop()


def small(lab, **extra):
    args = {"url": lab.url, "api_key": "bench-key", "prompt_tokens": 32, "output_tokens": 8, "concurrency": [1, 2],
            "requests": 4, "warmup": 1, "repetitions": 2}
    args.update(extra)
    return args


def free_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def test_benchmark_stores_results_with_kernel_and_tuning(lab, tmp_path, capsys):
    results_dir = tmp_path / "bench"
    result = run_main(small(lab, results_dir=str(results_dir), label="baseline", tuning={"mps": 256, "irq": "pinned"}),
                      capsys)
    assert result["changed"] is True and result["benchmarked"] is True
    assert result["kernel"] == platform.release()
    path = result["results_file"]
    assert os.path.dirname(path) == str(results_dir)
    assert os.path.basename(path).startswith(f"baseline-{platform.release()}-") and path.endswith("Z.json")
    assert result["actions"] == [{"action": "write", "path": path}]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    with open(path, encoding="utf-8") as fh:
        stored = json.load(fh)
    assert stored == result["benchmark"]
    assert (stored["label"], stored["kernel"], stored["tuning"]) == ("baseline", platform.release(), {"mps": 256, "irq": "pinned"})
    assert stored["host"] == platform.node()
    assert stored["config"]["api_key_set"] is True and "bench-key" not in json.dumps(stored)
    assert sorted(result["samples"]) == ["1", "2"] and all(len(v) == 2 for v in result["samples"].values())
    assert [s["concurrency"] for s in result["summary"]] == [1, 2]
    assert all(s["errors"] == 0 and s["output_throughput"] > 0 for s in result["summary"])
    # per level at most: 1 warm-up request, 3 settle runs (the default) and 2 measured runs of 4 requests
    assert result["plan"] == {"levels": [1, 2], "requests_per_level": 21, "requests_total": 43, "output_tokens_total": 336,
                              "profile": "random"}
    for level in stored["levels"]:
        assert level["settle"]["max_runs"] == 3 and 2 <= len(level["settle"]["runs"]) <= 3
        assert level["trend"]["n"] == 2
    assert stored["config"]["settle_runs"] == 3 and stored["config"]["settle_tolerance"] == 0.05
    assert "bench-key" not in json.dumps(result)


def test_without_results_dir_nothing_is_written(lab, capsys):
    result = run_main(small(lab, concurrency=[2], requests=2, warmup=0, repetitions=1), capsys)
    assert result["changed"] is False and result["actions"] == [] and result["results_file"] is None
    assert result["benchmarked"] is True and len(result["samples"]["2"]) == 1


def test_check_mode_probes_only(lab, tmp_path, capsys):
    before = lab.metric("vllm:generation_tokens_total")
    result = run_main(dict(small(lab, results_dir=str(tmp_path / "r"), label="candidate"), _ansible_check_mode=True), capsys)
    assert result["benchmarked"] is False and result["results_file"] is None
    assert result["server"]["model"] == "lab"
    assert result["changed"] is True and result["actions"][0]["action"] == "write"
    assert result["actions"][0]["path"].startswith(f"{tmp_path / 'r'}/candidate-")
    assert not (tmp_path / "r").exists()
    assert lab.metric("vllm:generation_tokens_total") == before  # no load was sent


def test_check_mode_still_reports_an_endpoint_that_is_down(capsys):
    port = free_port()
    result = run_main({"url": f"http://127.0.0.1:{port}", "_ansible_check_mode": True}, capsys)
    assert result["failed"] and "connection refused" in result["msg"]


def test_endpoint_down(capsys):
    port = free_port()
    result = run_main({"url": f"http://127.0.0.1:{port}", "concurrency": [1], "requests": 1}, capsys)
    assert result["failed"] is True
    assert result["msg"].startswith(f"Cannot reach the inference server at http://127.0.0.1:{port} (connection refused).")
    assert "Check that the server is running" in result["msg"]
    assert "Traceback" not in json.dumps(result)


@pytest.mark.parametrize("extra, fragment", [
    ({"model": "gpt-7"}, "does not serve model 'gpt-7'; it serves ['lab']"),
    ({"api_key": "nope"}, "refused the API key"),
    ({"prompt_tokens": 1020}, "exceeds the model's max_model_len 1024"),
    ({"token_id_range": [31000, 33000]}, "out of vocabulary"),
])
def test_server_side_problems(lab, capsys, extra, fragment):
    result = run_main(small(lab, **extra), capsys)
    assert result["failed"] and fragment in result["msg"]


@pytest.mark.parametrize("extra, fragment", [
    ({"url": "localhost:8000"}, "must start with http:// or https://"),
    ({"label": "../etc"}, "label '../etc'"),
    ({"concurrency": [8], "requests": 4}, "requests (4) is below the largest concurrency (8)"),
    ({"output_tokens": 0}, "output_tokens must be an integer of at least 1"),
    ({"max_error_rate": 2.0}, "max_error_rate must be between 0 and 1"),
    ({"settle_runs": 1}, "settle_runs must be 0 (off) or at least 2"),
])
def test_bad_settings_fail_before_any_request(capsys, extra, fragment):
    args = {"url": f"http://127.0.0.1:{free_port()}", "concurrency": [1], "requests": 1}
    args.update(extra)
    result = run_main(args, capsys)
    assert result["failed"] and result["msg"].startswith("Invalid benchmark settings: ") and fragment in result["msg"]


def test_a_relative_results_dir_is_refused_naming_it(capsys):
    """Every path option is checked before the run (hostfs.finish), with the option named."""
    result = run_main({"url": f"http://127.0.0.1:{free_port()}", "concurrency": [1], "requests": 1,
                       "results_dir": "relative/dir"}, capsys)
    assert result["failed"] and result["msg"].startswith("results_dir='relative/dir' is refused: a relative path")


@pytest.mark.parametrize("extra, fragment", [
    ({"timeout": float("nan")}, "timeout must be a positive number of seconds (at most 86400), got nan"),
    ({"deadline": float("inf")}, "deadline must be 0 (none) or a positive number of seconds (at most 604800), got inf"),
    ({"requests": 2 ** 63}, "requests must be an integer of at least 1 and at most 1000000"),
    ({"prompt_tokens": 2 ** 40}, "prompt_tokens must be an integer of at least 1 and at most 1048576"),
])
def test_numbers_out_of_range_fail_before_any_request(capsys, extra, fragment):
    """Issue 31: a nan timeout or an infinite deadline passed the checks; 2**63 requests had no bound."""
    args = {"url": f"http://127.0.0.1:{free_port()}", "concurrency": [1], "requests": 1}
    args.update(extra)
    result = run_main(args, capsys)
    assert result["failed"] and fragment in result["msg"]


def test_unwritable_results_dir(lab, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run_main(small(lab, concurrency=[1], requests=1, warmup=0, repetitions=1, results_dir=str(blocker / "sub")),
                      capsys)
    assert result["failed"] and result["msg"].startswith("The benchmark ran, but its results could not be stored: cannot write")
    assert result["benchmarked"] is True and "samples" in result


def test_requests_that_fail_under_load_fail_the_task(tmp_path, capsys):
    """A server that gives up on long requests: the first run past max_error_rate stops the sweep, with the reasons."""
    with LabServer(tmp_path, "--work", "4096", "--step-work", "0") as slow:
        result = run_main({"url": slow.url, "prompt_tokens": 8, "output_tokens": 400, "concurrency": [2], "requests": 2,
                           "warmup": 0, "repetitions": 1, "timeout": 0.5}, capsys)
        assert result["failed"] and not result["benchmarked"]
        assert result["msg"].startswith(f"Stopped the benchmark of {slow.url} at concurrency 2, settle runs, after 0 "
                                        "measured runs: ")
        assert "past max_error_rate 0.0% of a run of 2 (stopped early): " in result["msg"]
        assert "x timed out after 0.5 s" in result["msg"]
        # without settle runs the measured run is the one that stops
        result = run_main({"url": slow.url, "prompt_tokens": 8, "output_tokens": 400, "concurrency": [2], "requests": 2,
                           "warmup": 0, "settle_runs": 0, "repetitions": 3, "timeout": 0.5, "deadline": 120}, capsys)
    assert result["failed"] and "at concurrency 2, measured runs, after 0 measured runs" in result["msg"]


def test_errors_within_the_allowed_rate_only_warn(tmp_path, capsys):
    with LabServer(tmp_path, "--work", "4096", "--step-work", "0") as slow:
        result = run_main({"url": slow.url, "prompt_tokens": 8, "output_tokens": 400, "concurrency": [1], "requests": 1,
                           "warmup": 0, "repetitions": 2, "timeout": 0.5, "max_error_rate": 1.0}, capsys)
    assert not result.get("failed") and result["benchmark"]["errors"] == 2
    assert result["summary"][0]["errors"] == 2

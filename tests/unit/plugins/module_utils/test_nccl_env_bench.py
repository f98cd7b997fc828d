# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The nccl_env role's A/B script (roles/nccl_env/files/nccl_ab_bench.py) on the controller:
the all_reduce_perf parser, the candidate environments, and whole runs against stand-ins for
nvidia-smi, all_reduce_perf and a PyTorch interpreter (no GPU here; the torch path ran for real
on one H200 with --min-gpus 1, see the role's documentation)."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
import textwrap
import time

import pytest

from tests.helpers import REPO

SCRIPT = os.path.join(REPO, "roles", "nccl_env", "files", "nccl_ab_bench.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("nccl_ab_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The table format of nccl-tests 2.13 all_reduce_perf; the figures are synthetic.
PERF_OUT = textwrap.dedent("""\
    # nThread 1 nGpus 2 minBytes 1048576 maxBytes 4194304 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
    #
    # Using devices
    #  Rank  0 Group  0 Pid  41872 on   gpu-node device  0 [0x17] NVIDIA L40S
    #  Rank  1 Group  0 Pid  41872 on   gpu-node device  1 [0x31] NVIDIA L40S
    #
    #                                                              out-of-place                       in-place
    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
         1048576        262144     float     sum      -1    95.12   11.02   11.02      0    94.80   11.06   11.06      0
         2097152        524288     float     sum      -1    170.3   12.31   12.31      0    169.9   12.34   12.34      0
         4194304       1048576     float     sum      -1    322.1   13.02   13.02      0    321.7   13.04   13.04      0
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 12.135
    #
    """)


def test_parse_all_reduce_perf(bench):
    parsed = bench.parse_all_reduce_perf(PERF_OUT)
    assert parsed["busbw_gbps"] == {"1048576": 11.02, "2097152": 12.31, "4194304": 13.02}
    assert parsed["algbw_gbps"]["4194304"] == 13.02
    assert parsed["wrong"] == 0 and parsed["avg_busbw_gbps"] == 12.135
    assert parsed["time_us"] == {"1048576": 95.12, "2097152": 170.3, "4194304": 322.1}  # out-of-place time per all-reduce


def test_select_gpus_maps_the_tp_group_to_cuda_indexes_in_pci_order(bench):
    ids = ["0000:b1:00.0", "0000:17:00.0", "0000:31:00.0", "0000:ca:00.0"]  # nvidia-smi's order
    assert bench.bus_bdf("00000000:17:00.0") == "0000:17:00.0"
    assert bench.select_gpus(["0000:31:00.0", "0000:b1:00.0"], ids) == ([1, 2], None)
    idx, problem = bench.select_gpus(["0000:99:00.0"], ids)
    assert idx is None and "0000:99:00.0 of --gpus not found" in problem


def test_parse_counts_wrong_values_and_accepts_unchecked_runs(bench):
    wrong = PERF_OUT.replace("13.02      0    321.7   13.04   13.04      0", "13.02      2    321.7   13.04   13.04      1")
    assert bench.parse_all_reduce_perf(wrong)["wrong"] == 3
    unchecked = PERF_OUT.replace("      0    ", "    N/A    ").replace("   0\n", " N/A\n")
    parsed = bench.parse_all_reduce_perf(unchecked)
    assert parsed["wrong"] == 0 and len(parsed["busbw_gbps"]) == 3


def test_parse_ignores_noise(bench):
    parsed = bench.parse_all_reduce_perf("NCCL INFO Bootstrap : Using eth0\nsomething 12 odd\n")
    assert parsed == {"busbw_gbps": {}, "algbw_gbps": {}, "time_us": {}, "wrong": 0, "avg_busbw_gbps": None}


def test_candidate_env_drops_inherited_nccl_keys_and_keeps_multicast_off(bench, tmp_path):
    base = {"PATH": "/usr/bin", "HOME": "/root", "NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "1"}
    env = bench.candidate_env(base, {"NCCL_P2P_LEVEL": "PXB", "NCCL_NVLS_ENABLE": "1"}, str(tmp_path))
    assert "NCCL_P2P_DISABLE" not in env
    assert env["NCCL_P2P_LEVEL"] == "PXB" and env["PATH"] == "/usr/bin"
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["NCCL_CONF_FILE"] == "/dev/null" and env["HOME"] == str(tmp_path)
    assert env["NCCL_DEBUG"] == "WARN"


def test_sizes_double(bench):
    assert bench.sizes(1 << 20, 1 << 23) == [1 << 20, 1 << 21, 1 << 22, 1 << 23]
    assert bench.sizes(1, 16) == [4, 8, 16]


# ---- whole runs against stand-ins -------------------------------------------------------------------
def executable(path, body):
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def fakebin(tmp_path, monkeypatch):
    """A PATH with only our stand-ins (and the interpreter's own directory out of it)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setattr("glob.glob", lambda pattern: [])  # no /proc/driver/nvidia here either
    return bindir


def fake_smi(bindir, gpus):
    rows = "".join(f"00000000:{0x17 + i:02X}:00.0, NVIDIA L40S\\n" for i in range(gpus))
    return executable(bindir / "nvidia-smi", f"""\
        import sys
        sys.stdout.write("{rows}")
        """)


def fake_perf(bindir, record, hang_when=None, wrong_when=None, slow_when=None):
    """all_reduce_perf stand-in: records its argv and NCCL env, prints the table; faster without P2P_DISABLE."""
    return executable(bindir / "all_reduce_perf", f"""\
        import json, os, sys, time
        env = {{k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "CUDA_", "TORCH_", "NVSHMEM_")) or k == "HOME"}}
        with open({str(record)!r}, "a") as fh:
            fh.write(json.dumps({{"argv": sys.argv[1:], "env": env}}) + "\\n")
        off = env.get("NCCL_P2P_DISABLE") == "1"
        if {hang_when!r} and env.get({hang_when!r}) is not None:
            time.sleep(60)
        out = {PERF_OUT!r}
        if off:
            out = out.replace("11.02   11.02", "9.00    9.00").replace("12.31   12.31", "10.00   10.00").replace("13.02   13.02", "11.00   11.00")
        if {wrong_when!r} and env.get({wrong_when!r}) is not None:
            out = out.replace("11.06   11.06      0", "11.06   11.06      5")
        sys.stdout.write(out)
        """)


def args_for(bench, candidates, **extra):
    argv = ["--candidates", json.dumps(candidates), "--min-bytes", "1048576", "--max-bytes", "4194304",
            "--timeout", str(extra.pop("timeout", 30))]
    for key, value in extra.items():
        argv += ["--" + key.replace("_", "-"), str(value)]
    return bench.parse_args(argv)


CANDS = {"p2p_on": {"NCCL_P2P_LEVEL": "PXB", "NCCL_NVLS_ENABLE": "0"},
         "p2p_off": {"NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}}


def test_one_gpu_skips_with_the_count(bench, fakebin):
    fake_smi(fakebin, 1)
    report = bench.bench(args_for(bench, CANDS))
    assert report["skipped"] == "A/B skipped: 1 GPU(s)"
    assert report["gpus"] == 1 and report["gpus_from"] == "nvidia-smi" and report["results"] == {}


def test_no_gpu_and_no_tool(bench, fakebin):
    report = bench.bench(args_for(bench, CANDS))
    assert report["skipped"] == "A/B skipped: 0 GPU(s)" and report["gpus_from"] == "none"


def test_gpus_but_no_tool_is_reported_as_such(bench, fakebin, tmp_path):
    fake_smi(fakebin, 2)
    nopython = executable(fakebin / "python-without-torch", "import sys\nsys.exit(1)\n")
    report = bench.bench(args_for(bench, CANDS, python=nopython))
    assert report["no_tool"] and report["tool"] is None and report["results"] == {}
    assert report["error"].startswith("neither nccl-tests' all_reduce_perf")


def test_nccl_tests_run_per_candidate_with_its_own_env(bench, fakebin, tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")  # inherited: must not leak into p2p_on
    fake_smi(fakebin, 2)
    record = tmp_path / "calls.jsonl"
    fake_perf(fakebin, record)
    report = bench.bench(args_for(bench, CANDS))
    assert report["tool"] == "nccl-tests" and report["gpus"] == 2 and report["error"] is None
    assert report["results"]["p2p_on"]["ok"] and report["results"]["p2p_off"]["ok"]
    assert report["results"]["p2p_on"]["busbw_gbps"]["4194304"] == 13.02
    assert report["results"]["p2p_off"]["busbw_gbps"]["4194304"] == 11.0
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    by_mode = {("off" if c["env"].get("NCCL_P2P_DISABLE") else "on"): c for c in calls}
    assert set(by_mode) == {"on", "off"}
    assert by_mode["on"]["env"]["NCCL_P2P_LEVEL"] == "PXB"
    for call in calls:
        assert call["env"]["NCCL_NVLS_ENABLE"] == "0" and call["env"]["NCCL_CONF_FILE"] == "/dev/null"
        assert call["argv"][call["argv"].index("-g") + 1] == "2"
        assert call["argv"][call["argv"].index("-b") + 1] == "1048576"
        assert not os.path.exists(call["env"]["HOME"]), "the scratch HOME is removed"


def test_a_hanging_candidate_is_killed_and_reported(bench, fakebin, tmp_path):
    fake_smi(fakebin, 2)
    fake_perf(fakebin, tmp_path / "calls.jsonl", hang_when="NCCL_P2P_LEVEL")
    start = time.monotonic()
    report = bench.bench(args_for(bench, CANDS, timeout=2))
    assert time.monotonic() - start < 20
    on = report["results"]["p2p_on"]
    assert not on["ok"] and "did not finish in 2 s" in on["error"] and "nccl#2079" in on["error"]
    assert report["results"]["p2p_off"]["ok"]


def test_wrong_values_fail_the_candidate(bench, fakebin, tmp_path):
    fake_smi(fakebin, 2)
    fake_perf(fakebin, tmp_path / "calls.jsonl", wrong_when="NCCL_P2P_DISABLE")
    report = bench.bench(args_for(bench, CANDS))
    off = report["results"]["p2p_off"]
    assert not off["ok"] and "5 wrong values" in off["error"] and "corrupts data" in off["error"]


def test_explicit_perf_path_missing(bench, fakebin, tmp_path):
    fake_smi(fakebin, 2)
    report = bench.bench(args_for(bench, CANDS, tool="nccl-tests", all_reduce_perf=str(tmp_path / "nope")))
    assert report["tool"] is None and "all_reduce_perf not found" in report["error"] and report["no_tool"]


def test_bad_candidates(bench, fakebin):
    report = bench.bench(bench.parse_args(["--candidates", "{not json"]))
    assert report["error"].startswith("cannot read the candidates")


def fake_torch_python(bindir, record, fail_rank=None):
    """Stands in for a Python with PyTorch: answers the import probe and runs as a worker rank."""
    return executable(bindir / "torch-python", f"""\
        import json, os, sys
        if sys.argv[1:2] == ["-c"]:
            sys.exit(0)  # `import torch.distributed` works
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        with open({str(record)!r}, "a") as fh:
            fh.write(json.dumps({{"argv": sys.argv[1:], "rank": rank, "world": world,
                                 "master": os.environ["MASTER_ADDR"] + ":" + os.environ["MASTER_PORT"],
                                 "nvls": os.environ.get("NCCL_NVLS_ENABLE"), "p2p_off": os.environ.get("NCCL_P2P_DISABLE")}}) + "\\n")
        if rank == {fail_rank!r}:
            sys.stderr.write("NCCL error: unhandled system error")
            sys.exit(3)
        if rank == 0:
            bw = 5.0 if os.environ.get("NCCL_P2P_DISABLE") == "1" else 7.0
            print("some log line")
            print(json.dumps({{"busbw_gbps": {{"1048576": bw, "2097152": bw + 1}}, "algbw_gbps": {{}}, "wrong": 0,
                              "torch": "2.x", "nccl": "2.28.9"}}))
        """)


def test_torch_runs_one_worker_per_gpu(bench, fakebin, tmp_path):
    fake_smi(fakebin, 4)
    record = tmp_path / "ranks.jsonl"
    python = fake_torch_python(fakebin, record)
    report = bench.bench(args_for(bench, CANDS, python=python))
    assert report["tool"] == "torch"
    assert report["results"]["p2p_on"]["busbw_gbps"] == {"1048576": 7.0, "2097152": 8.0}
    assert report["results"]["p2p_on"]["avg_busbw_gbps"] == 7.5
    assert report["results"]["p2p_off"]["busbw_gbps"]["1048576"] == 5.0
    ranks = [json.loads(line) for line in record.read_text().splitlines()]
    assert sorted(r["rank"] for r in ranks) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(r["world"] == 4 and r["nvls"] == "0" for r in ranks)
    assert all(r["argv"][0] == SCRIPT and "--worker" in r["argv"] for r in ranks)
    masters = {r["master"] for r in ranks}
    assert len(masters) == 2 and all(m.startswith("127.0.0.1:") for m in masters)


def test_torch_failing_rank_is_reported(bench, fakebin, tmp_path):
    fake_smi(fakebin, 2)
    python = fake_torch_python(fakebin, tmp_path / "ranks.jsonl", fail_rank=1)
    report = bench.bench(args_for(bench, CANDS, python=python, tool="torch"))
    res = report["results"]["p2p_on"]
    assert not res["ok"] and res["error"].startswith("rank 1 exited 3: NCCL error: unhandled system error")


def test_main_prints_one_json_line(bench, fakebin, capsys):
    fake_smi(fakebin, 1)
    assert bench.main(["--candidates", json.dumps(CANDS)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["skipped"] == "A/B skipped: 1 GPU(s)" and out["finished_at"].endswith("Z")


def test_the_tp_group_only_is_measured(bench, fakebin, tmp_path):
    fake_smi(fakebin, 4)  # 0000:17:00.0 .. 0000:1a:00.0
    record = tmp_path / "calls.jsonl"
    fake_perf(fakebin, record)
    report = bench.bench(args_for(bench, CANDS, gpus="0000:19:00.0,0000:1a:00.0"))
    assert report["error"] is None and report["gpus"] == 2 and report["cuda_visible_devices"] == "2,3", report
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(calls) == 2
    for call in calls:
        assert call["env"]["CUDA_VISIBLE_DEVICES"] == "2,3" and call["argv"][call["argv"].index("-g") + 1] == "2"
    assert report["results"]["p2p_on"]["time_us"]["1048576"] == 95.12
    missing = bench.bench(args_for(bench, CANDS, gpus="0000:99:00.0"))
    assert "0000:99:00.0 of --gpus not found" in missing["error"] and missing["results"] == {}

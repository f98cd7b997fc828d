# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which start of the server a benchmark measured (bench/server_start.py): the process listening on the URL's port
found in a fake /proc tree (its oldest holder, its boot and start tick), vLLM's process_start_time_seconds where /proc
cannot say, and unknown with the reason otherwise (another host's address, unreadable descriptors, no boot id, a
restart between the reads); through the module against the lab server: one start for two benchmarks of one process,
another after a restart, and none of it in the workload fingerprint."""

from __future__ import annotations

import os
import sys
import time

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import server_start as ss
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.workload import workload
from ansible_collections.gpufleet.inference.plugins.modules import inference_benchmark
from tests.unit.plugins.modules.uthelper import run_module
from tests.unit.test_lab_inference_server import LabServer

BOOT = "0b9d2e6c-3f7a-4a57-9d8e-5c2f1a0e4b11"
HEAD = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
# the same comm quirks the kernel allows: spaces and a ')' inside the name
STAT = "{pid} (python3 (x) y) S 1 {pid} {pid} 0 -1 4194560 1 0 0 0 5 3 0 0 20 0 9 0 {tick} 1 2 18446744073709551615\n"


def hexaddr(ip: str) -> str:
    """An IPv4 or IPv6 address as /proc/net/tcp{,6} prints it on this host (32-bit words in native order)."""
    import ipaddress  # pylint: disable=import-outside-toplevel
    raw = ipaddress.ip_address(ip).packed
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return raw.hex().upper()


def sock_line(ip: str, port: int, state: str, inode: int, rem: str = "0.0.0.0", rport: int = 0) -> str:
    return (f"   0: {hexaddr(ip)}:{port:04X} {hexaddr(rem) if ':' not in ip else hexaddr('::')}:{rport:04X} {state} "
            f"00000000:00000000 00:00000000 00000000  1000        0 {inode} 1 0000000000000000 100 0 0 10 0\n")


def proc_tree(root, tcp=(), tcp6=(), procs=None, boot=BOOT, btime=1796410000):
    """A /proc with the given socket lines and ``procs``: {pid: (start tick, [socket inodes held])}."""
    net = root / "proc/net"
    net.mkdir(parents=True, exist_ok=True)
    (net / "tcp").write_text(HEAD + "".join(tcp))
    (net / "tcp6").write_text(HEAD + "".join(tcp6))
    if boot is not None:
        (root / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
        (root / "proc/sys/kernel/random/boot_id").write_text(boot + "\n")
    (root / "proc/stat").write_text(f"cpu  1 2 3 4\nbtime {btime}\nprocesses 99\n")
    for pid, (tick, inodes) in (procs or {}).items():
        fd = root / f"proc/{pid}/fd"
        fd.mkdir(parents=True)
        for n, inode in enumerate([0, 1, 2] + list(inodes)):
            os.symlink(f"socket:[{inode}]" if n > 2 else "/dev/null", fd / str(n))
        (root / f"proc/{pid}/stat").write_text(STAT.format(pid=pid, tick=tick))
        (root / f"proc/{pid}/comm").write_text("vllm\n" if pid == 842 else "worker\n")
    (root / "proc/self").mkdir(exist_ok=True)
    return HostFS(str(root))


def test_the_oldest_holder_of_the_listening_socket_is_the_start(tmp_path):
    fs = proc_tree(tmp_path, tcp=[sock_line("127.0.0.1", 8000, "0A", 4242), sock_line("127.0.0.1", 9000, "0A", 77)],
                   procs={975: (41200, [4242, 5000]), 842: (41117, [4242]), 7: (10, [77]), 1000: (50000, [])})
    got = ss.proc_start(fs, "127.0.0.1", 8000, clk_tck=100)
    assert got == {"id": f"{BOOT}/842/41117", "source": "proc", "reason": None, "pid": 842, "boot_id": BOOT,
                   "start_ticks": 41117, "process": "vllm",
                   "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1796410000 + 411.17))}
    # the same port named as localhost, and a server on the IPv6 wildcard (dual stack) reached by 127.0.0.1
    assert ss.proc_start(fs, "localhost", 8000, clk_tck=100)["id"] == got["id"]
    six = proc_tree(tmp_path / "six", tcp6=[sock_line("::", 8000, "0A", 4242)], procs={842: (41117, [4242])})
    assert ss.proc_start(six, "127.0.0.1", 8000)["id"] == got["id"]


def test_a_server_at_an_address_of_this_host_that_is_not_loopback(tmp_path):
    """10.0.0.5 is this host's: a socket of the host has it (the ssh session Ansible came in on); the server listens
    on every address."""
    fs = proc_tree(tmp_path, tcp=[sock_line("0.0.0.0", 8000, "0A", 4242),
                                  sock_line("10.0.0.5", 22, "01", 900, rem="10.0.0.1", rport=50000)],
                   procs={842: (41117, [4242])})
    assert ss.proc_start(fs, "10.0.0.5", 8000)["pid"] == 842


@pytest.mark.parametrize("tcp, host, procs, boot, why", [
    ([sock_line("0.0.0.0", 8000, "0A", 4242)], "10.9.9.9", {842: (1, [4242])}, BOOT,
     "address 10.9.9.9 is not known to be this host's"),
    ([sock_line("127.0.0.1", 8001, "0A", 4242)], "127.0.0.1", {842: (1, [4242])}, BOOT,
     "no socket of this host listens on 127.0.0.1 port 8000"),
    ([sock_line("127.0.0.1", 8000, "01", 4242)], "127.0.0.1", {842: (1, [4242])}, BOOT,
     "no socket of this host listens"),  # connected, not listening
    ([sock_line("127.0.0.1", 8000, "0A", 4242)], "127.0.0.1", {842: (1, [5])}, BOOT,
     "the process listening on port 8000 was not found"),
    ([sock_line("127.0.0.1", 8000, "0A", 4242)], "127.0.0.1", {842: (1, [4242])}, None,
     "the boot id (/proc/sys/kernel/random/boot_id) is 'missing'"),
    ([sock_line("127.0.0.1", 8000, "0A", 4242)], "127.0.0.1", {842: (1, [4242])}, "not-a-boot-id",
     "is 'not-a-boot-id'"),
])
def test_what_proc_cannot_say_is_unknown_with_the_reason(tmp_path, tcp, host, procs, boot, why):
    got = ss.proc_start(proc_tree(tmp_path, tcp=tcp, procs=procs, boot=boot), host, 8000)
    assert got["id"] is None and got["source"] is None and why in got["reason"], got


def test_unreadable_descriptors_ask_for_root(tmp_path):
    fs = proc_tree(tmp_path, tcp=[sock_line("127.0.0.1", 8000, "0A", 4242)], procs={})
    (tmp_path / "proc/900").mkdir()
    os.symlink("fd", tmp_path / "proc/900/fd")  # a loop: listing it fails as another user's fd/ does without root
    got = ss.proc_start(fs, "127.0.0.1", 8000)
    assert got["id"] is None and "1 processes' file descriptors were not readable: run the task as root" in got["reason"]


def test_an_empty_tree_and_garbage_give_reasons_not_errors(tmp_path):
    assert "no socket of this host listens" in ss.proc_start(HostFS(str(tmp_path)), "127.0.0.1", 8000)["reason"]
    assert ss.parse_sockets("junk\n   0: zz:1F40 00:0 0A x x x x x 12\n   1: 0100007F:1F40") == []
    assert ss.parse_stat_start("842 (python3) S 1 2") is None and ss.parse_stat_start(None) is None
    assert ss.parse_stat_start(STAT.format(pid=1, tick=77)) == 77
    assert ss.proc_start(HostFS(str(tmp_path)), "no-such-host.invalid", 8000)["reason"] == \
        "the URL's host name did not resolve here"


def test_process_start_time_seconds_from_metrics():
    text = ("# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
            "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.79641641131e+09\n"
            "vllm:num_requests_running{model_name=\"m\"} 0.0\n")
    assert ss.parse_metrics_start(text) == 1796416411.31
    assert ss.parse_metrics_start("process_start_time_seconds NaN\n") is None
    assert ss.parse_metrics_start("vllm:num_requests_running 0\n") is None
    assert ss.metrics_start(1796416411.31) == {"id": "metrics/1796416411.31", "source": "metrics", "reason": None,
                                               "started_at": "2026-12-04T20:33:31Z"}
    assert "has no process_start_time_seconds" in ss.metrics_start(None)["reason"]


def test_two_reads_that_differ_are_a_restart_and_proc_wins_over_metrics():
    a, b = {"id": "x/1/2", "source": "proc", "reason": None}, {"id": "x/9/3", "source": "proc", "reason": None}
    assert ss.identify(a, dict(a)) == a and ss.identify(a, None) == a
    assert "the server restarted during the benchmark (x/1/2 at its start, x/9/3 at its end)" in ss.identify(a, b)["reason"]
    assert "could not be read at its end (gone)" in ss.identify(a, ss.unknown("gone"))["reason"]
    m = ss.metrics_start(1796416411.31)
    assert ss.choose(a, m) == a
    assert ss.choose(ss.unknown("no /proc"), m) == dict(m, proc_reason="no /proc")
    assert ss.choose(ss.unknown("no /proc"), ss.unknown("no metrics"))["reason"] == "no /proc; and no metrics"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    server = LabServer(tmp_path_factory.mktemp("model"), "--work", "4", "--step-work", "8", "--max-model-len", "512")
    yield server
    server.stop()


def small(lab, **extra):
    return dict({"url": lab.url, "prompt_tokens": 16, "output_tokens": 4, "concurrency": [1], "requests": 2,
                 "warmup": 0, "repetitions": 2, "settle_runs": 0, "monitor_links": False}, **extra)


def test_the_module_records_the_lab_servers_start_and_a_restart_changes_it(lab, tmp_path, capsys):
    """Root /: the lab server's own process, as /proc says it; two benchmarks of one process name one start, a restart
    another; /metrics gives the same process's start where /proc cannot (a root without /proc); the fingerprint is
    the same across the restart."""
    first = run_module(inference_benchmark, small(lab), capsys)
    second = run_module(inference_benchmark, small(lab), capsys)
    start = first["server"]["start"]
    assert start["source"] == "proc" and start["pid"] == lab.proc.pid, start
    assert start["id"].startswith(open("/proc/sys/kernel/random/boot_id", encoding="ascii").read().strip() + "/")
    assert second["server"]["start"]["id"] == start["id"] and "metrics_start" not in first["server"]
    probe = run_module(inference_benchmark, dict(small(lab), _ansible_check_mode=True), capsys)
    assert probe["server"]["start"]["id"] == start["id"]
    remote = run_module(inference_benchmark, small(lab, root=str(tmp_path)), capsys)["server"]["start"]
    assert remote["source"] == "metrics" and "no socket of this host listens" in remote["proc_reason"]
    assert remote["started_at"] == start["started_at"]
    lab.stop()
    lab.start()
    third = run_module(inference_benchmark, small(lab), capsys)
    assert third["server"]["start"]["id"] not in (None, start["id"]) and third["server"]["start"]["pid"] == lab.proc.pid
    assert workload(first["benchmark"], 1) == workload(third["benchmark"], 1)

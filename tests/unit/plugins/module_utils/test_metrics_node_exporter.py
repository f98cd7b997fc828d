# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""metrics_textfile's files served by the real node_exporter: Debian's prometheus-node-exporter (scripts/bootstrap
installs it) with only its textfile collector, on a free port of 127.0.0.1, read over HTTP from /metrics and parsed by
Prometheus' text parser. The series come out as written, the collector reports no error for any file, and scrapes
taken while the module rewrites a file see the old or the new file whole, never a part (the write is atomic)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils.metrics.metrics_textfile import execute
from tests.unit.plugins.module_utils.test_metrics_textfile import all_outputs, gate_result
from tests.unit.plugins.modules.uthelper import needs_tools

BINARY = "prometheus-node-exporter"
pytestmark = needs_tools(BINARY)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def node_exporter(directory):
    port = free_port()
    proc = subprocess.Popen([BINARY, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
                             "--collector.textfile", f"--collector.textfile.directory={directory}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"node_exporter did not start: {proc.stderr.read().decode() if proc.poll() is not None else 'timeout'}")
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def scrape(url: str) -> dict[str, dict]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_node_exporter_serves_every_file_as_written(tmp_path, capsys):
    written = all_outputs(tmp_path, capsys)  # into tmp_path/textfile, one file per source
    files = sorted(str(p) for p in (tmp_path / "textfile").iterdir())
    with node_exporter(tmp_path / "textfile") as url:
        served = scrape(url)
    for name, entry in written.items():
        assert served[name] == entry["samples"], name
    assert served["node_textfile_scrape_error"] == {(): 0.0}
    assert sorted(dict(k)["file"] for k in served["node_textfile_mtime_seconds"]) == files


def test_scrapes_during_rewrites_see_whole_files(tmp_path):
    """The module rewrites one file 60 times (the verdict flips between pass and regression) while node_exporter is
    scraped as fast as it answers: every scrape holds exactly one verdict set to 1 and no scrape error."""
    directory = tmp_path / "textfile"
    host = Host(fs=HostFS("/"), cmd=None, warn=print)
    params = {"host": "gpu-01", "stage": "kernel_upgrade", "change": "kernel", "directory": str(directory), "name": None}
    execute({**params, "verdict": gate_result("pass", ratio=1.0)}, host, False)
    seen, problems, done = [], [], threading.Event()
    with node_exporter(directory) as url:
        def scraper():
            while not done.is_set():
                got = scrape(url)
                ones = [dict(k)["verdict"] for k, v in got.get("gpufleet_verdict", {}).items() if v == 1]
                if got.get("node_textfile_scrape_error") != {(): 0.0} or len(ones) != 1 or len(got["gpufleet_verdict"]) != 5:
                    problems.append(got)
                seen.append(ones[0] if ones else None)
        thread = threading.Thread(target=scraper)
        thread.start()
        try:
            for i in range(60):
                verdict = ("pass", "regression")[i % 2]
                execute({**params, "verdict": gate_result(verdict, ratio=1.0 if verdict == "pass" else 0.9)}, host, False)
                time.sleep(0.01)
        finally:
            done.set()
            thread.join(timeout=30)
    assert problems == [] and len(seen) >= 20 and {"pass", "regression"} <= set(seen), (len(seen), problems[:1])

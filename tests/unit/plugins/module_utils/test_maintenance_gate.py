# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Blockers (maintenance/blockers.py) and the maintenance_gate executor: real commands under the real timeout(1), a
real HTTP server on 127.0.0.1 answering as Prometheus does, the host's time zone from a tree's /etc/localtime."""

from __future__ import annotations

import json
import os
import shutil
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host.commands import HostCmd
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.maintenance import blockers as bl
from ansible_collections.gpufleet.inference.plugins.module_utils.maintenance import maintenance_gate as gate

from tests.unit.plugins.module_utils.test_gpu_health import _Module

NIGHTS = [{"days": ["mon-fri"], "start": "22:00", "end": "04:00"}]
FRI_1503_BERLIN = datetime(2026, 12, 4, 14, 3, tzinfo=timezone.utc).timestamp()
WED_2300_BERLIN = datetime(2026, 12, 2, 22, 0, tzinfo=timezone.utc).timestamp()


class _Prometheus(BaseHTTPRequestHandler):
    answers: dict = {}

    def do_GET(self):  # noqa: N802
        status, body, delay = self.answers.get(self.path.split("?")[0], (404, "no such path", 0))
        if delay:
            threading.Event().wait(delay)
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def prom():
    _Prometheus.answers = {
        "/quiet": (200, {"status": "success", "data": {"resultType": "vector", "result": []}}, 0),
        "/firing": (200, {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"alertname": "GpuXid", "instance": "gpu07"}, "value": [1, "1"]},
            {"metric": {"alertname": "NodeDown", "instance": "gpu07"}, "value": [1, "1"]}]}}, 0),
        "/bad-query": (200, {"status": "error", "errorType": "bad_data", "error": "parse error at char 7"}, 0),
        "/plain": (204, "", 0),
        "/broken": (503, "upstream down", 0),
        "/slow": (200, "{}", 3),
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _host(tmp_path, zone=None):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True, exist_ok=True)
    if zone:
        (root / "usr/share/zoneinfo" / os.path.dirname(zone)).mkdir(parents=True, exist_ok=True)
        shutil.copy(f"/usr/share/zoneinfo/{zone}", root / "usr/share/zoneinfo" / zone)
        os.symlink(f"/usr/share/zoneinfo/{zone}", root / "etc/localtime")
    fs = HostFS(str(root))
    live = HostFS("/")
    return Host(fs=fs, cmd=HostCmd(_Module(str(tmp_path)), live), warn=lambda m: None)


def test_command_blockers_by_exit_status_and_timeout(tmp_path):
    host = _host(tmp_path)
    cases = bl.parse([{"name": "ok", "command": ["true"]}, {"command": ["sh", "-c", "echo drain in progress >&2; exit 3"]},
                      {"name": "hangs", "command": ["sleep", "20"], "timeout": 1}])
    got = bl.check(cases, lambda b: gate._run(host, b), gate._fetch)
    assert [(a["name"], a["blocked"]) for a in got] == [("ok", False), ("sh", True), ("hangs", True)]
    assert got[1]["reason"] == "blocker sh (sh -c echo drain in progress >&2; exit 3) exited 3: drain in progress"
    assert got[2]["reason"] == "blocker hangs (sleep 20) did not answer in 1 s"


def test_url_blockers_prometheus_and_plain(prom):
    cases = bl.parse([{"url": f"{prom}/quiet?query=ALERTS"}, {"name": "alerts", "url": f"{prom}/firing"},
                      {"url": f"{prom}/bad-query"}, {"url": f"{prom}/plain"}, {"url": f"{prom}/broken"},
                      {"name": "slow", "url": f"{prom}/slow", "timeout": 1},
                      {"name": "nobody", "url": "http://127.0.0.1:9/", "timeout": 2}])
    got = bl.check(cases, None, gate._fetch)
    assert [a["blocked"] for a in got] == [False, True, True, False, True, True, True]
    assert got[1]["reason"].endswith("the Prometheus query returned 2 series: GpuXid, NodeDown")
    assert "the Prometheus query failed: parse error at char 7" in got[2]["reason"]
    assert "answered HTTP 503: upstream down" in got[4]["reason"]
    assert got[5]["reason"].startswith(f"blocker slow ({prom}/slow) did not answer")
    assert got[6]["reason"].startswith("blocker nobody (http://127.0.0.1:9/) did not answer")


@pytest.mark.parametrize("raw, message", [
    ([{"command": "true"}], r"blockers\[0\].command must be an argv list"),
    ([{"command": ["true"], "url": "http://x"}], r"blockers\[0\] must have exactly one of command"),
    ([{"url": "file:///etc/passwd"}], r"blockers\[0\].url must be an http or https URL"),
    ([{"command": ["true"], "timeout": 0}], r"blockers\[0\].timeout=0 is out of range"),
    ([{"command": ["true"], "timeout": True}], r"blockers\[0\].timeout=True is out of range"),
    ({"command": ["true"]}, "blockers must be a list"),
])
def test_bad_blockers_are_refused(raw, message):
    with pytest.raises(bl.BlockerError, match=message):
        bl.parse(raw)


def test_gate_outside_the_window_refuses_before_asking_the_blockers(tmp_path):
    host = _host(tmp_path, "Europe/Berlin")
    marker = tmp_path / "asked"
    params = {"windows": NIGHTS, "blockers": [{"command": ["touch", str(marker)]}], "now": FRI_1503_BERLIN,
              "step": "kernel upgrade"}
    with pytest.raises(Failed) as err:
        gate.execute(params, host, False)
    assert str(err.value).startswith("kernel upgrade refused: outside the maintenance windows (mon,tue,wed,thu,fri "
                                     "22:00-04:00, time zone Europe/Berlin): it is Fri 2026-12-04 15:03 CET")
    assert err.value.fields["allowed"] is False and err.value.fields["window"]["timezone"] == "Europe/Berlin"
    assert not marker.exists()
    got = gate.execute(dict(params, force=True), host, False)
    assert got["allowed"] and got["window"]["forced"] and marker.exists()
    quiet = gate.execute(dict(params, refuse=False), host, False)
    assert quiet["allowed"] is False and quiet["changed"] is False


def test_gate_inside_the_window_is_stopped_by_a_blocker(tmp_path, prom):
    host = _host(tmp_path, "Europe/Berlin")
    params = {"windows": NIGHTS, "now": WED_2300_BERLIN, "blockers": [{"url": f"{prom}/quiet"}, {"url": f"{prom}/firing"}]}
    with pytest.raises(Failed, match="this step refused: blocker 127.0.0.1 .*returned 2 series: GpuXid, NodeDown"):
        gate.execute(params, host, False)
    ok = gate.execute(dict(params, blockers=[{"url": f"{prom}/quiet"}]), host, False)
    assert ok["allowed"] and ok["reason"].startswith("inside the maintenance window") and ok["reason"].endswith(
        "1 blocker(s) clear")


def test_gate_time_zone_from_the_option_the_link_or_utc(tmp_path):
    host = _host(tmp_path, "Europe/Berlin")
    assert gate.host_zone(host, None)[0] == "Europe/Berlin"
    with pytest.raises(Failed, match="time zone America/New_York is not in the host's time zone data"):
        gate.host_zone(host, "America/New_York")
    with pytest.raises(Failed, match=r"timezone='../../etc/shadow' is no time zone name"):
        gate.host_zone(host, "../../etc/shadow")
    bare = _host(tmp_path / "bare")
    name, zone = gate.host_zone(bare, None)
    assert name == "UTC" and zone.utcoffset(None).total_seconds() == 0
    # UTC without tzdata: 14:03 UTC is outside 22:00-04:00
    with pytest.raises(Failed, match="time zone UTC"):
        gate.execute({"windows": NIGHTS, "now": FRI_1503_BERLIN}, bare, False)


def test_gate_without_windows_or_blockers_allows_and_bad_options_are_refused(tmp_path):
    host = _host(tmp_path)
    assert gate.execute({}, host, False)["allowed"] is True
    with pytest.raises(Failed, match=r"windows\[0\].start must be a time of day.*Nothing was done"):
        gate.execute({"windows": [{"start": "25:00", "end": "01:00"}]}, host, False)
    with pytest.raises(Failed, match="now=-1 is out of range"):
        gate.execute({"now": -1}, host, False)

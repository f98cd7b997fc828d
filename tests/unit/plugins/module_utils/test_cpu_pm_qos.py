# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""cpu/pm_qos.py: the PM QoS holder's pure part (the 32-bit value, the unit, what a read-back says) and its process
(hold() on a file standing for /dev/cpu_dma_latency, READY through a real notify socket, the installed script run
until SIGTERM)."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.cpu import pm_qos
from ansible_collections.gpufleet.inference.plugins.module_utils.cpu.cpu_tuning import render_holder


def test_the_value_is_a_native_32_bit_integer_both_ways():
    assert pm_qos.encode(99) == struct.pack("=i", 99) and len(pm_qos.encode(0)) == 4
    assert pm_qos.decode(pm_qos.encode(pm_qos.NO_LIMIT_US)) == 2_000_000_000
    assert pm_qos.decode(b"") is None and pm_qos.decode(b"\x01\x02") is None and pm_qos.decode(None) is None


@pytest.mark.parametrize("bad", [-1, pm_qos.NO_LIMIT_US, 2 ** 31, True, 1.5, "99", None])
def test_a_latency_outside_a_request_is_refused(bad):
    with pytest.raises(pm_qos.PmQosError, match="out of range: give a whole number of µs from 0 to 1999999999"):
        pm_qos.check_latency(bad)


def test_the_unit_holds_the_latency_and_says_it():
    unit = pm_qos.render_unit(99)
    assert "Type=notify\n" in unit and f"ExecStart={pm_qos.HOLD_SCRIPT} 99\n" in unit
    assert unit.endswith("[Install]\nWantedBy=multi-user.target\n") and "Restart=on-failure" in unit
    assert pm_qos.held_of(unit) == 99 and pm_qos.held_of(None) is None and pm_qos.held_of("[Service]\n") is None
    assert [(p, c is None) for p, c, _m in pm_qos.wanted_files("#!x", None)] == [
        (pm_qos.HOLD_SCRIPT, True), (pm_qos.UNIT_PATH, True)]


def test_what_the_read_back_says():
    assert pm_qos.readback_problem(99, "active", 99) is None
    assert pm_qos.readback_problem(99, "active", 20) is None  # another holder's stricter request: honoured
    assert pm_qos.readback_problem(99, None, 99) is None  # under a tree nothing runs; the value alone
    assert "is failed (systemctl is-active)" in pm_qos.readback_problem(99, "failed", 99)
    assert "gives 2000000000 us in force, above the 99 us" in pm_qos.readback_problem(99, "active", pm_qos.NO_LIMIT_US)


def test_hold_writes_reads_back_and_says_ready(tmp_path):
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(pm_qos.encode(pm_qos.NO_LIMIT_US))
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        out = open(tmp_path / "log", "w")
        held = []
        assert pm_qos.hold(str(device), 10, wait=lambda: held.append(device.read_bytes()),
                           environ={"NOTIFY_SOCKET": address}, out=out) == 0
        ready = sock.recv(256).decode()
    out.close()
    assert held == [pm_qos.encode(10)]  # held while waiting
    assert ready.startswith("READY=1\nSTATUS=holding 10 us (in force 10 us)")
    assert "holding" in (tmp_path / "log").read_text()


def test_hold_fails_when_the_value_does_not_take_or_the_device_is_missing(tmp_path):
    log = open(tmp_path / "log", "w")
    assert pm_qos.hold(os.devnull, 10, wait=lambda: pytest.fail("must not hold"), environ={}, out=log) == 1
    assert pm_qos.hold(str(tmp_path / "absent"), 10, wait=lambda: pytest.fail("must not hold"), environ={}, out=log) == 2
    log.close()
    text = (tmp_path / "log").read_text()
    assert "wrote 10 us to /dev/null but it reads back None: the request did not take" in text
    assert "cannot open" in text and "use cstate_method cpuidle" in text
    assert pm_qos.notify("READY=1", environ={}) is False


def test_the_installed_script_holds_until_sigterm(tmp_path):
    """The holder as the module installs it (this file bundled), run as systemd runs it: READY on the notify socket
    once the value is in, the file held until SIGTERM, exit status 0."""
    script = tmp_path / "gpufleet-pm-qos-hold"
    script.write_text(render_holder(sys.executable))
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(pm_qos.encode(pm_qos.NO_LIMIT_US))
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(30)
        proc = subprocess.Popen([sys.executable, str(script), "--device", str(device), "42"], stdout=subprocess.PIPE,
                                text=True, env=dict(os.environ, NOTIFY_SOCKET=address))
        try:
            assert sock.recv(256).decode().startswith("READY=1")
            assert pm_qos.decode(device.read_bytes()) == 42 and proc.poll() is None
        finally:
            proc.send_signal(signal.SIGTERM)
            out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0 and "holding" in out
    bad = subprocess.run([sys.executable, str(script), "--device", str(device), "-3"], capture_output=True, text=True,
                         check=False)
    assert bad.returncode == 2 and "LATENCY_US=-3 is out of range" in bad.stdout

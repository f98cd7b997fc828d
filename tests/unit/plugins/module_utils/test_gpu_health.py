# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU health through NVML (gpu/readings.py, gpu/checks.py) and DCGM's quick diagnostic (gpu/dcgm.py).

No test machine has an NVIDIA GPU: FakeNVML (tests/unit/fakenvml.py) stands in for the pynvml LIBRARY ONLY, answering
each call from a recorded ``calls`` map in the format of tests/tools/capture_nvml_health.py. The base map is
fixtures/nvml_health/synthetic-h200-idle.json (SYNTHETIC: an idle H200's usual values, until a real capture joins it);
each test changes the one NVML answer it is about. dcgmi runs as a real script under the real timeout(1).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host.commands import HostCmd
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.gpu import checks, dcgm, gpu_health, readings

from tests.unit.fakenvml import FakeNVML

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "nvml_health")
BDF = "0000:18:00.0"


def capture(name="synthetic-h200-idle"):
    with open(os.path.join(FIXTURES, name + ".json"), encoding="utf-8") as f:
        return json.load(f)


def gpu_read(**calls):
    """The readings of the fixture's GPU with ``calls`` replacing its recorded answers."""
    doc = copy.deepcopy(capture())
    doc["gpus"][0]["calls"].update(calls)
    return readings.read(FakeNVML.from_health_capture(doc))[BDF]


def codes(gpu, previous=None, limits=checks.Limits()):
    return {(f["code"], f["severity"]) for f in checks.evaluate({BDF: gpu}, previous, limits)}


def test_idle_h200_fixture_reads_every_field_and_finds_nothing():
    gpu = gpu_read()
    assert gpu["name"] == "NVIDIA H200" and gpu["persistence_mode"] == 1
    assert gpu["ecc_mode"] == {"current": 1, "pending": 1}
    assert gpu["ecc"] == {"volatile": {"corrected": 0, "uncorrected": 0}, "aggregate": {"corrected": 0, "uncorrected": 0}}
    assert gpu["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert gpu["retired_pages"] is None and gpu["retired_pages_pending"] is None
    assert set(gpu["unsupported"]) == {"retired_pages_single_bit", "retired_pages_pending"}
    assert gpu["throttle_reasons"] == ["gpu_idle"]
    assert gpu["clocks_mhz"] == {"graphics": 345, "sm": 345, "memory": 3201}
    assert gpu["max_clocks_mhz"]["sm"] == 1980 and gpu["power_limit_mw"] == gpu["power_default_limit_mw"] == 700000
    assert (gpu["temperature_c"], gpu["pcie_replay_counter"]) == (31, 0)
    assert codes(gpu) == set()


def test_every_call_unsupported_is_listed_not_fatal():
    doc = capture()
    doc["gpus"][0]["calls"] = {}
    gpu = readings.read(FakeNVML.from_health_capture(doc))[BDF]
    assert gpu["ecc_mode"] is None and gpu["remapped_rows"] is None and gpu["throttle_reasons"] is None
    assert {"ecc_mode", "remapped_rows", "throttle_reasons", "persistence_mode", "pcie_replay_counter",
            "power_limit_mw", "clock_sm", "max_clock_sm"} <= set(gpu["unsupported"])
    assert codes(gpu) == set()


@pytest.mark.parametrize("ecc, expected", [
    ({"0,0": 0, "0,1": 0, "1,0": 2, "1,1": 2}, {("ecc_uncorrected", "critical")}),
    ({"0,0": 0, "0,1": 0, "1,0": 0, "1,1": 3}, {("ecc_uncorrected", "warning")}),
    ({"0,0": 12, "0,1": 40, "1,0": 0, "1,1": 0}, {("ecc_corrected", "info")}),
    ({"0,0": 1001, "0,1": 5000, "1,0": 0, "1,1": 0}, {("ecc_corrected", "warning")}),
])
def test_ecc_volatile_and_aggregate(ecc, expected):
    """Keys: "error type,counter type" (0 corrected, 1 uncorrected; 0 volatile, 1 aggregate), as NVML numbers them."""
    gpu = gpu_read(nvmlDeviceGetTotalEccErrors=ecc)
    assert codes(gpu) == expected


def test_ecc_off_and_pending_mode_change():
    assert codes(gpu_read(nvmlDeviceGetEccMode=[0, 0])) == {("ecc_disabled", "warning")}
    off_now = gpu_read(nvmlDeviceGetEccMode=[0, 1])
    assert off_now["ecc"] is None  # counters are not read while ECC is off
    assert codes(off_now) == {("ecc_disabled", "warning"), ("ecc_mode_pending", "warning")}


@pytest.mark.parametrize("rows, expected", [
    ([0, 1, 1, 0], {("row_remap_pending", "critical")}),
    ([0, 3, 0, 1], {("row_remap_failure", "critical")}),
    ([2, 1, 0, 0], set()),
])
def test_row_remapping(rows, expected):
    """nvmlDeviceGetRemappedRows: (correctable rows, uncorrectable rows, pending, failure occurred)."""
    assert codes(gpu_read(nvmlDeviceGetRemappedRows=rows)) == expected


def test_retired_pages_pre_ampere():
    gpu = gpu_read(nvmlDeviceGetRetiredPages={"0": [4096, 8192], "1": [12288]},
                   nvmlDeviceGetRetiredPagesPendingStatus=1, nvmlDeviceGetRemappedRows={"error": "Not Supported"})
    assert gpu["retired_pages"] == {"single_bit": 2, "double_bit": 1} and gpu["remapped_rows"] is None
    assert codes(gpu) == {("retired_pages", "warning"), ("retired_pages_pending", "critical")}
    rma = gpu_read(nvmlDeviceGetRetiredPages={"0": list(range(30)), "1": list(range(30))})
    assert codes(rma) == {("retired_pages", "critical")}


@pytest.mark.parametrize("mask, expected", [
    (0x8, {("throttle_hw", "critical")}),
    (0x40, {("throttle_hw", "critical")}),
    (0x80, {("throttle_hw", "critical")}),
    (0x20, {("throttle_thermal", "warning")}),
    (0x10, {("throttle_sync_boost", "warning")}),
    (0x4, set()),      # the software power cap under load is not a fault
    (0x1, set()),
])
def test_throttle_reasons(mask, expected):
    busy = {"0": 1980, "1": 1980, "2": 3201}
    got = codes(gpu_read(nvmlDeviceGetCurrentClocksEventReasons=mask, nvmlDeviceGetClockInfo=busy))
    assert got == expected


def test_throttle_reasons_from_the_older_call_and_unknown_bits():
    gpu = gpu_read(nvmlDeviceGetCurrentClocksEventReasons={"error": "Function Not Found"},
                   nvmlDeviceGetCurrentClocksThrottleReasons=0x48 | 0x1000)
    assert gpu["throttle_reasons"] == ["hw_slowdown", "hw_thermal_slowdown", "unknown_0x1000"]
    msg = checks.evaluate({BDF: gpu})
    assert "hw_slowdown, hw_thermal_slowdown at 31 C" in msg[0]["message"]


def test_clocks_below_max_only_when_a_reason_holds_them():
    idle = gpu_read()  # 345 of 1980 MHz, idle: not a finding
    assert codes(idle) == set()
    held = gpu_read(nvmlDeviceGetCurrentClocksEventReasons=0x20, nvmlDeviceGetClockInfo={"0": 1200, "1": 1200, "2": 3201})
    got = checks.evaluate({BDF: held})
    assert {(f["code"], f["severity"]) for f in got} == {("throttle_thermal", "warning"), ("clocks_below_max", "warning")}
    assert "1200 MHz of 1980 MHz (61%), held by sw_thermal_slowdown" in [f for f in got if f["code"] == "clocks_below_max"][0]["message"]
    assert codes(held, limits=checks.Limits(clock_ratio=0.6)) == {("throttle_thermal", "warning")}


def test_power_limit_against_its_default():
    low = gpu_read(nvmlDeviceGetPowerManagementLimit=450000)
    found = checks.evaluate({BDF: low})
    assert [(f["code"], f["severity"]) for f in found] == [("power_limit_lowered", "warning")]
    assert "450 W, below its default 700 W" in found[0]["message"]
    assert codes(gpu_read(nvmlDeviceGetPowerManagementLimit=700000)) == set()


def test_persistence_mode():
    assert codes(gpu_read(nvmlDeviceGetPersistenceMode=0)) == {("persistence_off", "warning")}


def test_pcie_replay_counter_against_the_previous_check():
    """Only growth since the previous check is gpu_health's: the audit's pcie_replays reports a count above zero."""
    now = gpu_read(nvmlDeviceGetPcieReplayCounter=57)
    assert codes(now) == set()
    assert codes(now, previous={BDF: {"pcie_replay_counter": 57}}) == set()
    grown = checks.evaluate({BDF: now}, {BDF: {"pcie_replay_counter": 50}})
    assert [(f["code"], f["severity"]) for f in grown] == [("pcie_replays_grown", "warning")]
    assert "grew by 7" in grown[0]["message"]


def test_unstable_keeps_only_what_a_change_can_cause():
    gpu = gpu_read(nvmlDeviceGetTotalEccErrors={"0,0": 0, "0,1": 0, "1,0": 0, "1,1": 3}, nvmlDeviceGetPersistenceMode=0,
                   nvmlDeviceGetCurrentClocksEventReasons=0x80)
    found = checks.evaluate({BDF: gpu})
    assert {f["code"] for f in checks.unstable(found)} == {"throttle_hw"}


DIAG_OK = {"DCGM GPU Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]},
                                         {"name": "Persistence Mode", "results": [{"status": "Warn", "warnings": [
                                             {"warning": "Persistence mode for GPU 0 is disabled.", "error_id": 9}]}]},
                                         {"name": "Environment Variables", "results": [{"status": "Skip"}]}]}],
    "version": "3.3.9"}}
DIAG_FAIL_V4 = {"DCGM Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [{"name": "software", "results": [
        {"entity_id": 1, "status": "Fail", "errors": [{"error": "Page 0x1000 is retired", "error_id": 23}]}]}]}]}}


def test_dcgm_parse_three_and_four():
    assert [(r["test"], r["status"]) for r in dcgm.parse(json.dumps(DIAG_OK))] == [
        ("Denylist", "pass"), ("Persistence Mode", "warn"), ("Environment Variables", "skip")]
    found = dcgm.findings(dcgm.parse(json.dumps(DIAG_OK)))
    assert [(f["code"], f["severity"]) for f in found] == [("dcgm_diag", "warning")]
    assert "Persistence mode for GPU 0 is disabled." in found[0]["message"]
    fail = dcgm.findings(dcgm.parse(json.dumps(DIAG_FAIL_V4)))
    assert [(f["severity"], "on GPU 1: Page 0x1000 is retired" in f["message"]) for f in fail] == [("critical", True)]
    for bad in ("Error: unable to connect to host engine", json.dumps({"x": 1})):
        with pytest.raises(ValueError):
            dcgm.parse(bad)


class _Module:
    """The AnsibleModule surface HostCmd uses, running commands for real; tools are found in ``bins`` then PATH."""

    def __init__(self, bins):
        self.bins = bins
        self.run_command_environ_update = {}

    def get_bin_path(self, name, required=False):
        path = os.path.join(self.bins, name)
        if os.path.exists(path):
            return path
        return next((os.path.join(d, name) for d in os.environ["PATH"].split(":") if os.path.exists(os.path.join(d, name))),
                    None)

    def run_command(self, argv, environ_update=None):
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=dict(os.environ, **(environ_update or {})))
        return proc.returncode, proc.stdout, proc.stderr


def _host(tmp_path, dcgmi_script=None):
    bins = tmp_path / "bin"
    bins.mkdir()
    if dcgmi_script is not None:
        (bins / "dcgmi").write_text(dcgmi_script)
        (bins / "dcgmi").chmod(0o755)
    fs = HostFS("/")
    return Host(fs=fs, cmd=HostCmd(_Module(str(bins)), fs), warn=lambda m: None)


def test_dcgm_runs_where_installed_and_is_stopped_by_its_timeout(tmp_path):
    out = tmp_path / "out.json"
    out.write_text(json.dumps(DIAG_FAIL_V4))
    host = _host(tmp_path, f"#!/bin/sh\n[ \"$*\" = 'diag -r 1 -j' ] || exit 9\ncat {out}\nexit 226\n")
    got = gpu_health.run_dcgm(host, "auto", 30)
    assert (got["ran"], got["rc"], [f["severity"] for f in got["findings"]]) == (True, 226, ["critical"])
    slow = _host(tmp_path / "s", "#!/bin/sh\nexec sleep 30\n") if (tmp_path / "s").mkdir() is None else None
    got = gpu_health.run_dcgm(slow, "auto", 1)
    assert got["rc"] == 124 and "did not finish in 1 s" in got["note"] and got["findings"][0]["severity"] == "warning"
    engine = _host(tmp_path / "e", "#!/bin/sh\necho 'Error: unable to establish a connection' >&2\nexit 255\n") \
        if (tmp_path / "e").mkdir() is None else None
    got = gpu_health.run_dcgm(engine, "auto", 10)
    assert [f["code"] for f in got["findings"]] == ["dcgm_unavailable"] and "unable to establish" in got["note"]


def test_dcgm_absent_is_skipped_with_a_note_unless_required(tmp_path):
    host = _host(tmp_path)
    if host.cmd.find("dcgmi"):
        pytest.skip("this machine has dcgmi installed")
    got = gpu_health.run_dcgm(host, "auto", 300)
    assert got == {"ran": False, "rc": None, "results": [], "note": "dcgmi is not installed: DCGM's diagnostic skipped",
                   "findings": []}
    with pytest.raises(Failed, match="dcgm_diag=always but dcgmi is not installed"):
        gpu_health.run_dcgm(host, "always", 300)


def test_execute_joins_nvml_and_dcgm_and_bounds_its_options(tmp_path):
    doc = capture()
    doc["gpus"][0]["calls"].update(nvmlDeviceGetPersistenceMode=0, nvmlDeviceGetRemappedRows=[0, 1, 1, 0])
    host = _host(tmp_path)
    got = gpu_health.execute({"dcgm_diag": "never"}, host, False, nvml_lib=FakeNVML.from_health_capture(doc))
    assert got["available"] and got["changed"] is False and got["actions"] == []
    assert [f["code"] for f in got["findings"]] == ["row_remap_pending", "persistence_off"]
    assert got["summary"] == {"critical": 1, "warning": 1, "info": 0}
    assert [f["code"] for f in got["unstable"]] == ["row_remap_pending"]
    with pytest.raises(Failed, match=r"clock_ratio=1.5 is out of range"):
        gpu_health.execute({"clock_ratio": 1.5}, host, False, nvml_lib=FakeNVML.from_health_capture(doc))
    with pytest.raises(Failed, match="previous.gpus must map"):
        gpu_health.execute({"previous": {"gpus": [1]}}, host, False, nvml_lib=FakeNVML.from_health_capture(doc))
    down = gpu_health.execute({"dcgm_diag": "never"}, host, False, nvml_lib=FakeNVML([], init_error="Driver Not Loaded"))
    assert (down["available"], down["error"], down["findings"]) == (False, "nvmlInit failed: Driver Not Loaded", [])
    with pytest.raises(Failed, match="include_nvml=always.*Driver Not Loaded"):
        gpu_health.execute({"include_nvml": "always", "dcgm_diag": "never"}, host, False,
                           nvml_lib=FakeNVML([], init_error="Driver Not Loaded"))


def test_capture_tool_records_what_the_reader_asks(tmp_path):
    """tests/tools/capture_nvml_health.py's recorder over FakeNVML: replaying its output reads the same values."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools"))
    try:
        import capture_nvml_health  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    doc = capture()
    doc["gpus"][0]["calls"]["nvmlDeviceGetPcieReplayCounter"] = 5
    original = readings.read(FakeNVML.from_health_capture(doc))
    rec = capture_nvml_health.Recorder(FakeNVML.from_health_capture(doc))
    readings.read(rec)
    (gpu,) = rec.handles.values()
    replay = {"gpus": [{"bus": gpu["bus"], "name": gpu["calls"].pop("nvmlDeviceGetName"), "calls": gpu["calls"]}]}
    assert readings.read(FakeNVML.from_health_capture(replay)) == original


# ---- the stability part of the serving verdict -------------------------------------------------------------------
def _gpu_result(**calls):
    doc = copy.deepcopy(capture())
    doc["gpus"][0]["calls"].update(calls)
    fs = HostFS("/")
    host = Host(fs=fs, cmd=None, warn=lambda m: None)
    return gpu_health.execute({"dcgm_diag": "never"}, host, False, nvml_lib=FakeNVML.from_health_capture(doc))


def test_a_gpu_with_a_pending_row_remap_makes_the_change_unstable():
    from ansible_collections.gpufleet.inference.plugins.module_utils.bench import throughput_gate as tg
    from ansible_collections.gpufleet.inference.plugins.module_utils.bench.verdict import serving_verdict
    from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.health import stability
    base = [1000.0, 1004.0, 996.0, 1002.0, 998.0, 1001.0, 999.0, 1003.0]
    same = [1001.0, 997.0, 1003.0, 999.0, 1002.0, 998.0, 1000.0, 1004.0]
    gate = tg.decide(base, same)
    ok = _gpu_result(nvmlDeviceGetPersistenceMode=0)  # a warning, but nothing a change did to the GPU
    steady = stability(None, None, gpu_findings=tg.gpu_unstable(ok))
    assert (steady["status"], steady["measured"]) == ("stable", ["gpu"])
    assert serving_verdict(gate, None, steady)["verdict"] == "pass"
    bad = _gpu_result(nvmlDeviceGetRemappedRows=[0, 1, 1, 0])
    v = serving_verdict(gate, None, stability(None, None, gpu_findings=tg.gpu_unstable(bad)))
    assert (v["verdict"], v["keep"]) == ("unstable", False) and "has a row remap pending" in v["reason"]
    assert tg.gpu_unstable(None) is None
    assert tg.gpu_unstable({"available": False, "findings": [], "dcgm": {"ran": False}}) is None
    with pytest.raises(Failed, match="candidate_gpu_health must be a gpu_health result"):
        tg.gpu_unstable({"gpus": {}})


# ---- the real H200 (docs/examples/h200-nvml: a read-only capture on the device tool's H200, 2026-12-04) -----------
H200 = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "docs", "examples", "h200-nvml")


def _h200(name):
    with open(os.path.join(H200, name), encoding="utf-8") as f:
        return f.read()


def test_the_real_h200_reads_as_nvidia_smi_shows_it_and_is_healthy():
    """Every field from the H200's own NVML answers, checked against nvidia-smi -q -x of the same moment; an idle,
    healthy GPU: no finding (its one corrected ECC error is in the lifetime count, none since the driver loaded)."""
    dump = json.loads(_h200("nvml.json"))
    gpus = readings.read(FakeNVML.from_nvml_dump(dump))
    assert list(gpus) == ["0000:00:06.0"]
    g = gpus["0000:00:06.0"]
    assert g["name"] == "NVIDIA H200" and g["ecc_mode"] == {"current": 1, "pending": 1}
    assert g["ecc"] == {"volatile": {"corrected": 0, "uncorrected": 0}, "aggregate": {"corrected": 1, "uncorrected": 0}}
    assert g["retired_pages"] is None and g["retired_pages_pending"] is None  # Hopper remaps rows
    assert g["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert g["throttle_reasons"] == ["gpu_idle"]
    assert (g["clocks_mhz"], g["max_clocks_mhz"]) == ({"graphics": 345, "sm": 345, "memory": 3201},
                                                      {"graphics": 1980, "sm": 1980, "memory": 3201})
    assert (g["power_limit_mw"], g["power_default_limit_mw"], g["power_enforced_limit_mw"]) == (700000,) * 3
    assert (g["persistence_mode"], g["pcie_replay_counter"], g["temperature_c"]) == (1, 0, 40)
    assert sorted(g["unsupported"]) == ["retired_pages_pending", "retired_pages_single_bit"]
    smi = _h200("nvidia-smi-q.xml")
    for tag, value in (("persistence_mode", "Enabled"), ("current_ecc", "Enabled"), ("replay_counter", "0"),
                       ("gpu_temp", "40 C"), ("current_power_limit", "700.00 W"), ("default_power_limit", "700.00 W"),
                       ("clocks_event_reason_gpu_idle", "Active")):
        assert f"<{tag}>{value}</{tag}>" in smi, tag
    assert "<sm_clock>345 MHz</sm_clock>" in smi and "<sm_clock>1980 MHz</sm_clock>" in smi
    assert checks.evaluate(gpus) == []
    # and what a fault on this GPU would read as: its own answers with a pending row remap and power brake
    g_calls = FakeNVML.from_nvml_dump(dump).gpus[0]["calls"]
    g_calls.update(nvmlDeviceGetRemappedRows=[0, 1, 1, 0], nvmlDeviceGetCurrentClocksEventReasons=0x81)
    faulty = readings.read(FakeNVML([{"bus": "00000000:00:06.0", "name": "NVIDIA H200", "calls": g_calls}]))
    assert [(f["code"], f["severity"]) for f in checks.evaluate(faulty)] == [
        ("row_remap_pending", "critical"), ("throttle_hw", "critical"), ("clocks_below_max", "warning")]


def test_the_real_h200_kernel_log_has_no_xid_and_no_dcgmi():
    from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.health import parse_xids
    lines = json.loads(_h200("dmesg-xid.json"))["lines"]
    assert "dcgmi: not installed" in lines
    assert parse_xids(lines) == []


def test_the_dump_enum_values_are_nvml_s():
    """FakeNVML's enum table against the real nvidia-ml-py's constants, where it is installed."""
    pynvml = pytest.importorskip("pynvml")
    for name, value in FakeNVML.DUMP_ENUMS.items():
        assert getattr(pynvml, name) == value, name

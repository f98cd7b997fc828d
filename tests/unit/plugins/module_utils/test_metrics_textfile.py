# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""metrics_textfile: every result of the collection as Prometheus text, read back by Prometheus' own text parser
(prometheus_client's text_string_to_metric_families). Inputs are real: the audit of the real H200 capture (with its
recorded NVML readings) and of a degraded tree, health_compare's findings, benchmark documents as the history stores
them, throughput_gate's result, tune_measured's state of the stand-in run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.verdict import VERDICTS
from ansible_collections.gpufleet.inference.plugins.module_utils.metrics import textfile as tf
from ansible_collections.gpufleet.inference.plugins.module_utils.metrics.metrics_textfile import CONVERTERS
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import health as hc
from ansible_collections.gpufleet.inference.plugins.modules import metrics_textfile, pcie_facts
from tests.unit.fakenvml import FakeNVML
from tests.unit.fakesysfs import load_capture, two_numa_nodes
from tests.unit.plugins.module_utils.test_bench_history import STEADY, doc
from tests.unit.plugins.module_utils.test_bench_history_links import FLAPPED, STABLE, monitored
from tests.unit.plugins.module_utils.test_health_compare import XID_LOG, degraded_host
from tests.unit.plugins.modules.uthelper import run_module

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
H200 = "gpu-h200-x2"


def parse(text: str) -> dict[str, dict]:
    """Metric name (as exposed: counters with _total) -> {type, help, samples: {labels tuple: value}}."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            entry = out.setdefault(s.name, {"type": fam.type, "help": fam.documentation, "samples": {}})
            key = tuple(sorted(s.labels.items()))
            assert key not in entry["samples"], f"{s.name}{s.labels} twice"
            entry["samples"][key] = s.value
    return out


def write(tmp_path, capsys, **params) -> tuple[dict, dict, str]:
    """Run the module; the result, the parsed file and its text."""
    params.setdefault("directory", str(tmp_path / "textfile"))
    result = run_module(metrics_textfile, {"host": "gpu-01", **params}, capsys)
    assert not result.get("failed"), result
    text = Path(result["path"]).read_text()
    return result, parse(text), text


def h200_audit(tmp_path) -> dict:
    root = load_capture(H200, tmp_path / "h200")
    readings = json.loads((FIXTURES / "pci" / H200 / "nvml-readings.json").read_text())
    facts, _w = pcie_facts.gather(HostFS(str(root)), {"include_nvml": "always"}, nvml_lib=FakeNVML.from_readings(readings))
    return facts


def degraded_audit(tmp_path) -> dict:
    degraded_host(tmp_path / "degraded", irq_cpus="8")
    facts, _w = pcie_facts.gather(HostFS(str(tmp_path / "degraded")), {"include_nvml": "never"})
    return facts


def gate_result(verdict="regression", ratio=0.913, p_value=1.2e-06, runs_needed=0) -> dict:
    return {"verdict": {"verdict": verdict, "keep": verdict == "pass"}, "decision": verdict if verdict in
            ("pass", "regression", "inconclusive") else "pass", "ratio": ratio, "p_value": p_value, "runs_needed": runs_needed}


def test_the_catalogue_follows_prometheus_naming():
    assert tf.catalogue_problems() == []
    assert tf.catalogue_problems([tf.Metric("gpufleet_x_ms", "counter", "", ("gpu",), "audit")]) == [
        "gpufleet_x_ms: _total is for counters, and every counter ends in it",
        "gpufleet_x_ms: labels ('gpu',) (host first, lower-case, each once)"]


def test_every_source_has_one_converter_and_metrics():
    """The module's table of sources (a result's type, the key a registered result holds it under, its samples) and
    the catalogue's sources are the same, so no source is given that writes nothing and none is left unreachable."""
    assert tuple(CONVERTERS) == tf.SOURCES
    assert all(tf.metrics_of(source) for source in tf.SOURCES)


def test_the_real_h200_audit(tmp_path, capsys):
    facts = h200_audit(tmp_path)
    result, got, _text = write(tmp_path, capsys, audit=facts, timestamp=1764800000)
    gpus = [g["bdf"] for g in facts["gpus"]]
    assert len(gpus) == 2 and result["path"].endswith("/gpufleet_audit.prom") and result["changed"]
    speed = got["gpufleet_pcie_link_current_speed_transfers_per_second"]
    assert speed["type"] == "gauge"
    for gpu in gpus:  # each H200 at Gen5 x16: 32 GT/s as 32e9 transfers per second, 16 lanes, not degraded
        own = (("gpu", gpu), ("host", "gpu-01"), ("link", gpu))
        assert speed["samples"][own] == 32e9
        assert got["gpufleet_pcie_link_current_width_lanes"]["samples"][own] == 16
        assert got["gpufleet_pcie_link_degraded"]["samples"][own] == 0
    # the micro-VM puts each GPU on a root bus (no port above it); NVML's replay counter is a counter per GPU
    assert {dict(k)["link"] for k in speed["samples"]} == set(gpus)
    replay = got["gpufleet_gpu_pcie_replay_total"]
    assert replay["type"] == "counter" and {dict(k)["gpu"] for k in replay["samples"]} == set(gpus)
    assert got["gpufleet_audit_gpus"]["samples"] == {(("host", "gpu-01"),): 2.0}
    assert got["gpufleet_audit_timestamp_seconds"]["samples"] == {(("host", "gpu-01"),): 1764800000.0}
    findings = got.get("gpufleet_audit_findings", {"samples": {}})["samples"]
    assert sum(findings.values()) == len(facts["findings"])


def test_a_degraded_link_its_aer_errors_and_findings(tmp_path, capsys):
    _r, got, _t = write(tmp_path, capsys, audit={"pcie": degraded_audit(tmp_path)})
    key = (("gpu", "0000:17:00.0"), ("host", "gpu-01"), ("link", "0000:17:00.0"))
    assert got["gpufleet_pcie_link_current_speed_transfers_per_second"]["samples"][key] == 16e9
    assert got["gpufleet_pcie_link_max_speed_transfers_per_second"]["samples"][key] == 32e9
    assert got["gpufleet_pcie_link_current_width_lanes"]["samples"][key] == 8
    assert got["gpufleet_pcie_link_degraded"]["samples"][key] == 1
    port = (("gpu", "0000:17:00.0"), ("host", "gpu-01"), ("link", "0000:16:01.0"))  # the root port above it, as trained
    assert got["gpufleet_pcie_link_current_speed_transfers_per_second"]["samples"][port] == 16e9
    aer = got["gpufleet_pcie_aer_errors_total"]
    assert aer["type"] == "counter" and aer["samples"][key + (("severity", "correctable"),)] == 7
    assert ("code", "link_below_capability") in {kv for k in got["gpufleet_audit_findings"]["samples"] for kv in k}


def test_health_findings(tmp_path, capsys):
    two_numa_nodes(tmp_path / "before", remote_irqs=False)
    before = pcie_facts.gather(HostFS(str(tmp_path / "before")), {"include_nvml": "never"})[0]
    findings = hc.compare(before, degraded_audit(tmp_path), XID_LOG)
    _r, got, _t = write(tmp_path, capsys, health=findings, timestamp=1764800060.5)
    counted = got["gpufleet_health_findings"]["samples"]
    assert sum(counted.values()) == len(findings)
    assert counted[(("code", "xid"), ("host", "gpu-01"), ("severity", "critical"))] >= 1
    assert got["gpufleet_health_timestamp_seconds"]["samples"][(("host", "gpu-01"),)] == 1764800060.5


def test_a_benchmark_with_a_flapping_link(tmp_path, capsys):
    bench = monitored("2026-12-01T00:00:00Z", [STABLE, FLAPPED, STABLE, STABLE, STABLE])
    _r, got, _t = write(tmp_path, capsys, benchmark=bench, profile="serving")
    labels = (("concurrency", "8"), ("host", "gpu-01"), ("profile", "serving"))
    assert got["gpufleet_benchmark_output_tokens_per_second"]["samples"][labels] == 1001.0
    assert got["gpufleet_benchmark_output_throughput_cv_ratio"]["samples"][labels] == 0.01
    assert got["gpufleet_benchmark_failed_requests"]["samples"][labels] == 0
    ttft = got["gpufleet_benchmark_time_to_first_token_seconds"]["samples"]
    assert ttft[(("concurrency", "8"), ("host", "gpu-01"), ("profile", "serving"), ("quantile", "0.99"))] == 0.09
    assert got["gpufleet_benchmark_link_findings"]["samples"] == {
        (("code", "link_flapping"), ("concurrency", "8"), ("host", "gpu-01"), ("link", "0000:01:00.0"),
         ("profile", "serving"), ("severity", "critical")): 1.0}
    assert got["gpufleet_benchmark_timestamp_seconds"]["samples"] == {(("host", "gpu-01"), ("profile", "serving")): 1796083200.0}
    _r, plain, _t = write(tmp_path, capsys, benchmark={"benchmark": doc("2026-12-01T00:00:00Z", STEADY)}, name="plain")
    assert {dict(k)["profile"] for k in plain["gpufleet_benchmark_output_tokens_per_second"]["samples"]} == {"site"}
    assert "gpufleet_benchmark_link_findings" not in plain  # links not sampled: no series, not a 0


@pytest.mark.parametrize("given", VERDICTS)
def test_a_verdict_is_one_series_set_to_1(tmp_path, capsys, given):
    _r, got, _t = write(tmp_path, capsys, verdict=gate_result(given), stage="kernel_upgrade", change="kernel")
    assert {dict(k)["verdict"]: v for k, v in got["gpufleet_verdict"]["samples"].items()} == {
        v: float(v == given) for v in VERDICTS}
    key = (("change", "kernel"), ("host", "gpu-01"), ("stage", "kernel_upgrade"))
    assert got["gpufleet_verdict_throughput_ratio"]["samples"] == {key: 0.913}
    assert got["gpufleet_verdict_p_value"]["samples"][key] == 1.2e-06


def test_a_gate_before_its_first_look_leaves_the_ratio_out(tmp_path, capsys):
    _r, got, _t = write(tmp_path, capsys, verdict=gate_result("inconclusive", ratio=None, p_value=None, runs_needed=5))
    assert "gpufleet_verdict_throughput_ratio" not in got and "gpufleet_verdict_p_value" not in got
    assert got["gpufleet_verdict_runs_needed"]["samples"] == {(("change", "none"), ("host", "gpu-01"), ("stage", "default")): 5}


def test_the_tuning_state_and_the_changes(tmp_path, capsys):
    state = json.loads((FIXTURES / "tune_measured" / "standin_state.json").read_text())
    _r, got, _t = write(tmp_path, capsys, tuning={"state": state})
    info = got["gpufleet_tuning_stage_info"]["samples"]
    assert len(info) == len(state["stages"]) and set(info.values()) == {1.0}
    by_stage = {dict(k)["stage"]: dict(k) for k in info}
    for e in state["stages"]:
        assert (by_stage[e["name"]]["kind"], by_stage[e["name"]]["status"]) == (e["kind"], e["status"])
    assert sum(got["gpufleet_tuning_stages"]["samples"].values()) == len(state["stages"])
    changes = [{"role": "pcie_link", "what": "ASPM policy", "actions": ["write_policy /sys/module/pcie_aspm/parameters/policy"]},
               {"role": "irq_affinity", "what": "IRQ affinity", "actions": ["pin 41", "pin 42"]}]
    _r, got, _t = write(tmp_path, capsys, changes=changes)
    assert got["gpufleet_tuning_changes"]["samples"] == {
        (("host", "gpu-01"), ("kind", "ASPM policy"), ("role", "pcie_link")): 1.0,
        (("host", "gpu-01"), ("kind", "IRQ affinity"), ("role", "irq_affinity")): 2.0}


def all_outputs(tmp_path, capsys) -> dict[str, dict]:
    """Every source written once: the union of what the module emits (the dashboard test uses it)."""
    state = json.loads((FIXTURES / "tune_measured" / "standin_state.json").read_text())
    got = {}
    for name, params in {
        "audit": {"audit": h200_audit(tmp_path), "timestamp": 1},
        "degraded": {"audit": degraded_audit(tmp_path), "host": "gpu-02"},
        "health": {"health": [{"code": "xid", "severity": "critical"}], "timestamp": 2},
        "benchmark": {"benchmark": monitored("2026-12-01T00:00:00Z", [STABLE, FLAPPED])},
        "verdict": {"verdict": gate_result()},
        "tuning": {"tuning": state},
        "changes": {"changes": [{"role": "hugepages", "what": "huge pages", "actions": []}]},
    }.items():
        for metric, entry in write(tmp_path, capsys, name=f"all_{name}", **params)[1].items():
            merged = got.setdefault(metric, dict(entry, samples={}))
            assert not set(merged["samples"]) & set(entry["samples"]), f"{metric}: a series in two files"
            merged["samples"].update(entry["samples"])
    return got


def test_every_metric_of_the_catalogue_is_written_with_its_type_help_and_labels(tmp_path, capsys):
    got = all_outputs(tmp_path, capsys)
    exposed = {m.name: m for m in tf.CATALOGUE}
    assert set(got) == set(exposed)
    for name, entry in got.items():
        metric = exposed[name]
        assert (entry["type"], entry["help"]) == (metric.type, metric.help)
        assert all(tuple(k for k, _v in key) == tuple(sorted(metric.labels)) for key in entry["samples"]), name


def test_label_values_are_escaped(tmp_path, capsys):
    odd = 'gpu "01"\\rack\n7'
    _r, got, text = write(tmp_path, capsys, verdict=gate_result(), host=odd, stage="a,b=c")
    assert {dict(k)["host"] for k in got["gpufleet_verdict"]["samples"]} == {odd}
    assert 'host="gpu \\"01\\"\\\\rack\\n7"' in text and len(text.splitlines()) == 2 * 4 + len(VERDICTS) + 3


def test_written_atomically_once_and_nothing_in_check_mode(tmp_path, capsys):
    directory = tmp_path / "textfile"
    params = {"verdict": gate_result(), "directory": str(directory)}
    checked = run_module(metrics_textfile, {**params, "_ansible_check_mode": True}, capsys)
    assert checked["changed"] and checked["actions"][0]["action"] == "write" and not directory.exists()
    first, _got, text = write(tmp_path, capsys, **params)
    inode = os.stat(first["path"]).st_ino
    assert first["changed"] and os.listdir(directory) == ["gpufleet_verdict.prom"] and oct(os.stat(first["path"]).st_mode)[-3:] == "644"
    again = run_module(metrics_textfile, {"host": "gpu-01", **params}, capsys)
    assert again["changed"] is False and again["actions"] == [] and os.stat(first["path"]).st_ino == inode
    changed, _got, new_text = write(tmp_path, capsys, **{**params, "verdict": gate_result("pass", ratio=1.01)})
    assert changed["changed"] and new_text != text and os.stat(first["path"]).st_ino != inode  # a new file, renamed over
    assert os.listdir(directory) == ["gpufleet_verdict.prom"]  # no temp file left behind


@pytest.mark.parametrize("params, match", [
    ({"verdict": gate_result(), "name": "../etc/x"}, "name='../etc/x' is refused"),
    ({"verdict": gate_result(), "name": "x.prom"}, "name='x.prom' is refused"),
    ({"verdict": {"verdict": "maybe"}}, "the verdict 'maybe' is not one of pass"),
    ({"verdict": gate_result(ratio=float("nan"))}, "gpufleet_verdict_throughput_ratio: nan is not a finite number"),
    ({"audit": {}, "verdict": gate_result()}, "mutually exclusive"),
    ({"host": "x"}, "one of the following is required"),
    ({"verdict": gate_result(), "change": "firmware"}, "value of change must be one of"),
])
def test_bad_input_is_refused_and_nothing_written(tmp_path, capsys, params, match):
    result = run_module(metrics_textfile, {"directory": str(tmp_path / "textfile"), **params}, capsys)
    assert result["failed"] and not result.get("changed") and not (tmp_path / "textfile").exists()
    assert match in result["msg"], result["msg"]

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""inference_benchmark with monitor_links, against the lab inference server: the GPUs' links (a fake sysfs tree) are
sampled during every measured run (by default, where the host has a GPU), a link that changes speed during a run is
reported with that run's tok/s, and the throughput history keeps it with the run."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.inference_benchmark import execute, run_monitor
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.modules import bench_history
from ansible_collections.gpufleet.inference.plugins.modules.inference_benchmark import ARGUMENT_SPEC
from tests.unit.fakesysfs import degraded_link
from tests.unit.plugins.modules.uthelper import run_module
from tests.unit.test_lab_inference_server import LabServer


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    server = LabServer(tmp_path_factory.mktemp("model"), "--work", "8", "--step-work", "32", "--max-model-len", "1024")
    yield server
    server.stop()


class FlappingLink(HostFS):
    """The GPU's link speed as a marginal riser shows it: every other read of current_link_speed is Gen4."""

    def __init__(self, root, flap: bool):
        super().__init__(root)
        self.flap = flap
        self.reads = 0

    def read_optional(self, host_path):
        if self.flap and host_path.endswith("0000:01:00.0/current_link_speed"):
            self.reads += 1
            return "16.0 GT/s PCIe" if self.reads % 2 == 0 else "32.0 GT/s PCIe"
        return super().read_optional(host_path)


def host(fs, warn=lambda msg: None):
    """The executor's Host over ``fs`` (no commands: the benchmark runs none)."""
    return Host(fs=fs, cmd=None, warn=warn)


def params(lab, **extra):
    out = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    out.update(url=lab.url, prompt_tokens=32, output_tokens=8, concurrency=[2], requests=4, warmup=1, repetitions=2,
               settle_runs=0, monitor_load=False, monitor_links=True)
    out.update(extra)
    return out


@pytest.mark.parametrize("flap", [False, True])
def test_links_are_sampled_during_every_run(lab, tmp_path, flap):
    degraded_link(tmp_path, link_sta=(32.0, 16))
    warnings = []
    result = execute(params(lab), host(FlappingLink(str(tmp_path), flap), warnings.append), check_mode=False)
    runs = result["benchmark"]["levels"][0]["runs"]
    assert all(set(run["server_load"]["links"]["devices"]) == {"0000:00:01.0", "0000:01:00.0"} for run in runs)
    if not flap:
        assert result["link_flapping"] == [] and not [w for w in warnings if "changed speed or width" in w]
        assert all(run["server_load"]["links"]["devices"]["0000:01:00.0"]["state"] == "at_capability" for run in runs)
        return
    assert [(f["concurrency"], f["devices"]) for f in result["link_flapping"]] == [(2, ["0000:01:00.0"])] * 2
    assert [f["output_throughput"] for f in result["link_flapping"]] == [run["output_throughput"] for run in runs]
    assert len([w for w in warnings if w.startswith("Critical: at concurrency 2") and "0000:01:00.0" in w]) == 2


def test_the_flapping_run_reaches_the_history_report_with_its_tok_s(lab, tmp_path, capsys):
    degraded_link(tmp_path / "host", link_sta=(32.0, 16))
    result = execute(params(lab, repetitions=3), host(FlappingLink(str(tmp_path / "host"), True)), check_mode=False)
    assert result["links_monitored"] == ["0000:00:01.0", "0000:01:00.0"]
    db, dest = str(tmp_path / "history.sqlite"), str(tmp_path / "report")
    stored = run_module(bench_history, {"path": db, "documents": [result["benchmark"]], "host": "lab-host"}, capsys)
    assert stored["schema_version"] == 5 and len(stored["added"]) == 1
    report = run_module(bench_history, {"path": db, "state": "report", "dest": dest}, capsys)
    runs = result["benchmark"]["levels"][0]["runs"]
    assert [(f["host"], f["repetition"], f["device"], f["code"], f["output_tps"]) for f in report["link_findings"]] == [
        ("lab-host", i, "0000:01:00.0", "link_flapping", run["output_throughput"]) for i, run in enumerate(runs)]
    md = (tmp_path / "report" / "history.md").read_text()
    assert f"link_flapping 0000:01:00.0 (top 32 GT/s x16) in run 0: {runs[0]['output_throughput']:.1f} tok/s" in md


def test_a_host_without_a_gpu_is_benchmarked_unsampled(lab, tmp_path):
    (tmp_path / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)
    result = execute(params(lab, repetitions=1), host(HostFS(str(tmp_path))), check_mode=False)
    assert result["links_monitored"] == [] and "link_flapping" not in result
    assert all("links" not in (run.get("server_load") or {}) for run in result["benchmark"]["levels"][0]["runs"])
    assert run_monitor(params(lab), [], HostFS(str(tmp_path))) is None


def test_links_are_sampled_by_default():
    assert ARGUMENT_SPEC["monitor_links"]["default"] is True

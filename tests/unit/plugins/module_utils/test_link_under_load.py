# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Links read under load: the pure classification of sampled link sequences, and the audit's re-read of a GPU link
below capability with the link sampled during its copy probe."""

from __future__ import annotations

import asyncio
import json

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import link_samples
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import pcie_facts as pcie_audit
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.findings import classify_link_samples, judge_under_load
from tests.unit.fakesysfs import degraded_link

GEN5_X16 = {"speed_gts": 32.0, "width": 16}


@pytest.mark.parametrize("samples,state,top,changes", [
    # an idle GPU's link at Gen1 trains up as the copies start, and holds: the idle downclock
    ([[2.5, 16], [32.0, 16], [32.0, 16], [32.0, 16]], "at_capability", [32.0, 16], 1),
    ([[32.0, 16]] * 5, "at_capability", [32.0, 16], 0),
    # stays at Gen4 under load on a Gen5 path: a stable downtrain
    ([[16.0, 16]] * 6, "stays_down", [16.0, 16], 0),
    ([[2.5, 16], [16.0, 16], [16.0, 16]], "stays_down", [16.0, 16], 1),
    # trained up, then dropped while the load ran: flapping
    ([[32.0, 16], [32.0, 16], [16.0, 16], [32.0, 16]], "flapping", [32.0, 16], 2),
    ([[2.5, 16], [32.0, 16], [8.0, 16]], "flapping", [32.0, 16], 2),
    # a width change is never idle power saving
    ([[32.0, 16], [32.0, 8], [32.0, 8]], "flapping", [32.0, 16], 1),
    ([[32.0, 8], [32.0, 16]], "flapping", [32.0, 16], 1),
    ([], "no_samples", None, 0),
    ([None, [0, 0]], "no_samples", None, 0),
])
def test_classify_link_samples(samples, state, top, changes):
    assert classify_link_samples(samples, GEN5_X16) == {"state": state, "top": top, "changes": changes}


BELOW = {"code": "link_below_capability", "severity": "warning", "device": "0000:01:00.0", "devices": ["0000:01:00.0"],
         "message": "link 0000:00:01.0 -> 0000:01:00.0 runs at 2.5 GT/s (Gen1) x16.", "fix": "Reseat the card."}


def test_judge_under_load_turns_a_finding_into_what_the_load_showed():
    idle = judge_under_load(BELOW, [[2.5, 16], [32.0, 16], [32.0, 16]], GEN5_X16, "probe")
    assert (idle["code"], idle["severity"]) == ("link_idle_downclock", "info") and "trained up to 32 GT/s (Gen5) x16" in idle["message"]
    down = judge_under_load(BELOW, [[16.0, 16]] * 3, GEN5_X16, "probe")
    assert (down["code"], down["severity"]) == ("link_below_capability", "warning")
    assert down["message"].endswith("stays at 16 GT/s (Gen4) x16: not an idle downclock.")
    flap = judge_under_load(BELOW, [[32.0, 16], [16.0, 16], [32.0, 16]], GEN5_X16, "probe")
    assert (flap["code"], flap["severity"]) == ("link_flapping", "critical") and flap["link_under_load"]["changes"] == 2
    assert judge_under_load(BELOW, [], GEN5_X16, "probe") is BELOW


def _model_with_probe(root, samples):
    facts, _w = pcie_audit.gather(HostFS(root), {"include_nvml": "never"})
    facts["root"] = "/"
    out = {"backend": "torch 2.11.0", "error": None, "gpus": {"0000:01:00.0": {
        "h2d_pinned_gbps": 50.0, "d2h_pinned_gbps": 50.0, "h2d_pageable_gbps": 10.0, "d2h_pageable_gbps": 10.0,
        "link_samples": samples}}}
    facts["bandwidth"] = pcie_audit.bandwidth(facts, {"probe_python": None, "probe_size_mb": 8},
                                              lambda argv, env: (0, json.dumps(out), ""))
    return facts


@pytest.mark.parametrize("samples,code,severity", [
    ([[2.5, 16], [32.0, 16], [32.0, 16]], "link_idle_downclock", "info"),
    ([[2.5, 16]] * 4, "link_below_capability", "warning"),
    ([[32.0, 16], [8.0, 16], [32.0, 16]], "link_flapping", "critical"),
])
def test_audit_rereads_a_gpu_link_below_capability_under_the_probe(tmp_path, samples, code, severity):
    degraded_link(tmp_path, link_sta=(2.5, 16))
    model = _model_with_probe(str(tmp_path), samples)
    assert model["bandwidth"]["gpus"]["0000:01:00.0"]["link_samples"] == samples
    assert "link_samples_pct" not in model["bandwidth"]["gpus"]["0000:01:00.0"]
    at_rest = [f for f in pcie_audit.find(model) if f["device"] == "0000:01:00.0" and f["code"] == "link_below_capability"]
    assert at_rest, "the fake link must read below capability at rest"
    found = [f for f in pcie_audit.reread_under_load(model, pcie_audit.find(model)) if f["device"] == "0000:01:00.0"
             and f["code"] in ("link_below_capability", "link_idle_downclock", "link_flapping")]
    assert [(f["code"], f["severity"]) for f in found] == [(code, severity)]


def test_without_probe_samples_the_finding_stays(tmp_path):
    degraded_link(tmp_path, link_sta=(2.5, 16))
    facts, _w = pcie_audit.gather(HostFS(str(tmp_path)), {"include_nvml": "never"})
    assert [f["code"] for f in facts["findings"] if f["device"] == "0000:01:00.0"].count("link_below_capability") == 1


# ---- sampling during a benchmark run (link_samples.LinkMonitor) ----------------------------------
def _set_link(host, bdf, speed, width):
    host.write(f"{host.dirs[bdf]}/current_link_speed", f"{speed:g} GT/s PCIe")
    host.write(f"{host.dirs[bdf]}/current_link_width", str(width))


def test_path_devices_and_caps_cover_the_gpu_and_its_bridges(tmp_path):
    host = degraded_link(tmp_path, link_sta=(32.0, 16))
    fs = HostFS(str(tmp_path))
    assert link_samples.path_devices(fs, ["0000:01:00.0"]) == ["0000:00:01.0", "0000:01:00.0"]
    assert link_samples.link_caps(fs, ["0000:01:00.0"]) == {"0000:01:00.0": GEN5_X16}
    _set_link(host, "0000:01:00.0", 2.5, 16)
    assert link_samples.read_link(fs, "0000:01:00.0") == [2.5, 16]
    assert link_samples.read_link(fs, "0000:09:00.0") is None


@pytest.mark.parametrize("sequence,state", [
    ([(2.5, 16), (32.0, 16), (32.0, 16)], "at_capability"),    # idle downclock that trains up under the run
    ([(16.0, 16), (16.0, 16), (16.0, 16)], "stays_down"),      # a stable downtrain
    ([(32.0, 16), (16.0, 16), (32.0, 16)], "flapping"),        # changed speed during the run
    ([(32.0, 16), (32.0, 8), (32.0, 8)], "flapping"),          # changed width during the run
])
def test_link_monitor_judges_a_run(tmp_path, sequence, state):
    host = degraded_link(tmp_path, link_sta=sequence[0])
    fs = HostFS(str(tmp_path))
    monitor = link_samples.LinkMonitor(fs, ["0000:01:00.0"], interval=3600)

    async def run():
        await monitor.start()  # takes the first sample
        for speed, width in sequence[1:-1]:
            _set_link(host, "0000:01:00.0", speed, width)
            monitor.sample()
        _set_link(host, "0000:01:00.0", *sequence[-1])
        return await monitor.stop(8)  # takes the last sample

    verdict = asyncio.run(run())
    monitor.close()
    assert monitor.samples["0000:01:00.0"] == [list(s) for s in sequence]
    assert verdict["devices"]["0000:01:00.0"]["state"] == state
    assert verdict["flapping"] == (["0000:01:00.0"] if state == "flapping" else [])
    assert verdict["stays_down"] == (["0000:01:00.0"] if state == "stays_down" else [])

#!/usr/bin/env python
"""What monitor_links costs a benchmark run, on the lab stand-in: (1) the time of one sample (every GPU's and
bridge's current_link_speed/width read through HostFS) over a fake 8-GPU tree (2 sockets x 2 switches x 2 GPUs,
tests/unit/fakesysfs.eight_gpus), and (2) the lab inference server benchmarked with monitor_links on and off,
interleaved, the median output tok/s and run time of each. Read-only; writes nothing but OUT.json.

    usage (repo root, after ". scripts/lib.sh; gpufleet_env"): PYTHONPATH=.collections:. python3 tests/tools/link_monitor_cost.py OUT.json [PAIRS]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time

# pylint: disable=wrong-import-position
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.inference_benchmark import execute, link_devices
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.link_samples import LinkMonitor
from ansible_collections.gpufleet.inference.plugins.modules.inference_benchmark import ARGUMENT_SPEC
from tests.unit.fakesysfs import eight_gpus
from tests.unit.test_lab_inference_server import LabServer


def sample_cost(fs: HostFS, devices: list[str], n: int = 2000) -> dict:
    monitor = LinkMonitor(fs, devices)
    start = time.perf_counter()
    for _sample in range(n):
        monitor.sample()
    per = (time.perf_counter() - start) / n
    return {"devices": len(devices), "samples": n, "us_per_sample": round(per * 1e6, 1)}


def params(url: str, links: bool) -> dict:
    out = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    out.update(url=url, prompt_tokens=64, output_tokens=64, concurrency=[8], requests=256, warmup=1, repetitions=5,
               settle_runs=0, monitor_load=False, monitor_links=links)
    return out


def ab(fs: HostFS, pairs: int) -> dict:
    rows = {True: [], False: []}
    with tempfile.TemporaryDirectory() as model:
        server = LabServer(model, "--work", "8", "--step-work", "32", "--max-model-len", "1024")
        try:
            for i in range(pairs):
                for links in ((True, False) if i % 2 == 0 else (False, True)):
                    res = execute(params(server.url, links), fs, check_mode=False)
                    runs = res["benchmark"]["levels"][0]["runs"]
                    rows[links] += [(r["output_throughput"], r.get("duration_s")) for r in runs]
        finally:
            server.stop()
    out = {}
    for links, vals in rows.items():
        out["on" if links else "off"] = {"runs": len(vals), "median_tps": round(statistics.median(v[0] for v in vals), 1),
                                         "median_run_s": round(statistics.median(v[1] or 0 for v in vals), 3)}
    out["tps_ratio_on_off"] = round(out["on"]["median_tps"] / out["off"]["median_tps"], 4)
    return out


def main() -> None:
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    with tempfile.TemporaryDirectory() as root:
        eight_gpus(root)
        fs = HostFS(root)
        devices = link_devices({"monitor_links": True}, fs)
        report = {"fake_tree": "tests/unit/fakesysfs.eight_gpus", "sample": sample_cost(fs, devices), "lab_ab": ab(fs, pairs)}
    print(json.dumps(report, indent=2))
    with open(sys.argv[1], "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2)


if __name__ == "__main__":
    main()

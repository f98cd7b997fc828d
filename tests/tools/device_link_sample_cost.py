#!/usr/bin/env python
"""Read-only, on a real GPU host: what one monitor_links sample costs there. The GPUs (class 03xx) and every bridge
above them, as inference_benchmark samples them (benchmark_run.link_devices, link_samples.LinkMonitor.sample), read
N times in a row through HostFS("/"); prints the devices, the readings and the time per sample.

    usage (from the repo root): python3 tests/tools/device_link_sample_cost.py [N]
"""

from __future__ import annotations

import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINK = os.path.join(REPO, ".collections", "ansible_collections", "gpufleet")
os.makedirs(LINK, exist_ok=True)
if not os.path.exists(os.path.join(LINK, "inference")):
    os.symlink(REPO, os.path.join(LINK, "inference"))
sys.path.insert(0, os.path.join(REPO, ".collections"))

# pylint: disable=wrong-import-position
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.inference_benchmark import link_devices  # noqa: E402
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS  # noqa: E402
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.link_samples import LinkMonitor, read_link  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    fs = HostFS("/")
    devices = link_devices({"monitor_links": True}, fs)
    monitor = LinkMonitor(fs, devices)
    start = time.perf_counter()
    for _sample in range(n):
        monitor.sample()
    per = (time.perf_counter() - start) / n
    print(json.dumps({"devices": devices, "caps": monitor.caps, "now": {b: read_link(fs, b) for b in devices},
                      "samples": n, "us_per_sample": round(per * 1e6, 1),
                      "us_per_device": round(per * 1e6 / max(len(devices), 1), 1)}, indent=2))


if __name__ == "__main__":
    main()

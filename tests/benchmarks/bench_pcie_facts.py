#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark (not a timed test): pcie_facts' gather() on a synthetic 8-GPU host.

The tree is the common PCIe 8-GPU server: 2 sockets x 2 host bridges, each with a root port, a
switch with 2 GPUs below it, and a NIC on a second root port (8 GPUs, 4 NICs, 16 switch ports,
28 GPU pairs). The host's pci.ids is copied in when present so the name lookup costs what it
costs on a real host. Prints median/min/max over N runs and the 0.5 s target; exit status 0
either way (figures are recorded, not asserted).

    . scripts/lib.sh; gpufleet_env; python tests/benchmarks/bench_pcie_facts.py [-n 30] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for path in (os.path.join(REPO, ".collections"), REPO):
    if path not in sys.path:
        sys.path.insert(0, path)

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS  # noqa: E402
from ansible_collections.gpufleet.inference.plugins.modules.pcie_facts import gather  # noqa: E402
from tests.unit.fakesysfs import eight_gpus  # noqa: E402

TARGET_S = 0.5
PCI_IDS = "/usr/share/misc/pci.ids"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("-n", "--runs", type=int, default=30)
    parser.add_argument("--no-pci-ids", action="store_true", help="leave the name database out of the tree")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="bench-pcie-")
    try:
        host = eight_gpus(root)
        if not args.no_pci_ids and os.path.exists(PCI_IDS):
            os.makedirs(os.path.dirname(host.real(PCI_IDS)), exist_ok=True)
            shutil.copy(PCI_IDS, host.real(PCI_IDS))
        params = {"include_nvml": "never"}
        facts, _warnings = gather(HostFS(root), params)  # warm-up, and a sanity check of the tree
        assert len(facts["gpus"]) == 8 and len(facts["pairs"]) == 28, "the synthetic tree is not 8 GPUs"
        times = []
        for _run in range(args.runs):
            t0 = time.perf_counter()
            gather(HostFS(root), params)
            times.append(time.perf_counter() - t0)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    result = {
        "benchmark": "pcie_facts.gather, synthetic 8-GPU host (2 sockets x 2 switches x 2 GPUs + 4 NICs)",
        "runs": args.runs, "median_s": round(statistics.median(times), 4), "min_s": round(min(times), 4),
        "max_s": round(max(times), 4), "target_s": TARGET_S, "within_target": statistics.median(times) < TARGET_S,
        "devices_read": len(facts["devices"]), "findings": facts["findings_summary"],
        "names_source": facts["names_source"], "python": sys.version.split()[0],
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['benchmark']}\n  runs {result['runs']}: median {result['median_s'] * 1000:.1f} ms, "
              f"min {result['min_s'] * 1000:.1f} ms, max {result['max_s'] * 1000:.1f} ms "
              f"(target < {TARGET_S * 1000:.0f} ms: {'met' if result['within_target'] else 'MISSED'})\n"
              f"  {result['devices_read']} functions decoded, names from {result['names_source']}, "
              f"findings {result['findings']}, Python {result['python']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

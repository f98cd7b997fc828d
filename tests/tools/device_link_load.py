#!/usr/bin/env python
"""Read-only, on a real GPU host (the device tool's H200): each GPU's link read at rest, then during the audit's
copy probe (the samples pcie_audit's PROBE_SCRIPT takes), the audit's verdict on it (pcie_audit.reread_under_load),
and the host lint of the host as it is. Never writes config space or changes a GPU setting.

    usage (from the repo root): python3 tests/tools/device_link_load.py OUT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINK = os.path.join(REPO, ".collections", "ansible_collections", "gpufleet")
os.makedirs(LINK, exist_ok=True)
if not os.path.exists(os.path.join(LINK, "inference")):
    os.symlink(REPO, os.path.join(LINK, "inference"))
sys.path.insert(0, os.path.join(REPO, ".collections"))

# pylint: disable=wrong-import-position
from ansible_collections.gpufleet.inference.plugins.module_utils.lint import host_lint  # noqa: E402
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import pcie_facts as pcie_audit  # noqa: E402
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS  # noqa: E402
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.findings import classify_link_samples  # noqa: E402


def sysfs_link(bdf: str) -> list:
    base = f"/sys/bus/pci/devices/{bdf}/"
    with open(base + "current_link_speed", encoding="ascii") as fh:
        speed = fh.read().strip()
    with open(base + "current_link_width", encoding="ascii") as fh:
        width = fh.read().strip()
    return [speed, width]


def run(argv, env):
    proc = subprocess.run(argv, env=dict(os.environ, **env), capture_output=True, text=True, check=False, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def main(out_path: str) -> None:
    fs = HostFS("/")
    rest_facts, _w = pcie_audit.gather(fs, {"include_nvml": "auto"})
    gpus = [g["bdf"] for g in rest_facts["gpus"]]
    at_rest = {b: sysfs_link(b) for b in gpus}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,"
                          "pcie.link.width.current,pcie.link.width.max", "--format=csv"],
                         capture_output=True, text=True, check=False).stdout
    start = time.time()
    loaded, warnings = pcie_audit.gather(fs, {"include_nvml": "auto", "bandwidth_probe": True, "probe_size_mb": 256}, run=run)
    doc = {"gpus": gpus, "sysfs_link_at_rest": at_rest, "nvidia_smi_at_rest": smi,
           "nvml_at_rest": {b: {k: v for k, v in (g or {}).items() if k.startswith("link_")}
                            for b, g in ((rest_facts.get("nvml") or {}).get("gpus") or {}).items()},
           "probe": loaded["bandwidth"], "probe_s": round(time.time() - start, 1), "warnings": warnings,
           "link_findings": [f for f in loaded["findings"] if f["code"].startswith("link_")],
           "verdicts": {b: classify_link_samples((loaded["bandwidth"]["gpus"].get(b) or {}).get("link_samples"),
                                                 {"speed_gts": 32.0, "width": 16}) for b in gpus},
           "host_lint": host_lint.run(fs, {"units": ["vllm"]})}
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
    print(json.dumps({k: doc[k] for k in ("sysfs_link_at_rest", "verdicts", "link_findings", "probe_s")}, indent=1))
    print(json.dumps({b: {k: v for k, v in g.items() if k != "link_samples"} for b, g in doc["probe"]["gpus"].items()}))
    print("samples:", {b: g.get("link_samples") for b, g in doc["probe"]["gpus"].items()}, "error:", doc["probe"]["error"])
    print("host_lint:", doc["host_lint"]["findings_summary"], [(f["code"], f["file"], f["line"]) for f in doc["host_lint"]["findings"]])


if __name__ == "__main__":
    main(sys.argv[1])

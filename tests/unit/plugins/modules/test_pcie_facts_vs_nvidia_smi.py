"""pcie_facts must report a real GPU's link exactly as nvidia-smi does.

The fixture was captured read-only on the device tool's H200 host (tests/tools/device_audit.sh):
nvidia-smi's link query ran right before the capture of the PCI tree; both are replayed here.
"""

from __future__ import annotations

import csv
import os

from ansible_collections.gpufleet.inference.plugins.module_utils.hostfs import HostFS
from ansible_collections.gpufleet.inference.plugins.modules import pcie_facts

from tests.unit.fakesysfs import load_capture

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "pci", "gpu-h200-microvm")


def _nvidia_smi_rows() -> list[dict[str, str]]:
    with open(os.path.join(FIXTURE, "nvidia-smi-link.csv"), encoding="utf-8") as fh:
        return [{k.strip(): v.strip() for k, v in row.items()} for row in csv.DictReader(fh, skipinitialspace=True)]


def _bdf(nvsmi_bus_id: str) -> str:
    # nvidia-smi prints an 8-digit domain: 00000000:00:06.0
    domain, rest = nvsmi_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest}".lower()


def test_link_matches_nvidia_smi(tmp_path):
    root = str(load_capture("gpu-h200-microvm", tmp_path / "h200"))
    facts, _warnings = pcie_facts.gather(HostFS(root), {"include_nvml": "never"})
    rows = _nvidia_smi_rows()
    assert rows, "the fixture holds no nvidia-smi reading"
    gpus = {g["bdf"]: g for g in facts["gpus"]}
    for row in rows:
        bdf = _bdf(row["pci.bus_id"])
        assert bdf in gpus, f"nvidia-smi lists {bdf}, pcie_facts found {sorted(gpus)}"
        pcie = facts["devices"][bdf]["config"]["pcie"]
        assert pcie["link_sta"]["gen"] == int(row["pcie.link.gen.current"])
        assert pcie["link_sta"]["width"] == int(row["pcie.link.width.current"])
        assert pcie["link_cap"]["gen"] == int(row["pcie.link.gen.max"])
        assert pcie["link_cap"]["width"] == int(row["pcie.link.width.max"])
        # the sysfs attributes the kernel exports agree with config space too
        sysfs = facts["devices"][bdf]["link_sysfs"]
        assert sysfs["current_width"] == pcie["link_sta"]["width"]
        assert sysfs["current_speed_gts"] == pcie["link_sta"]["speed_gts"]

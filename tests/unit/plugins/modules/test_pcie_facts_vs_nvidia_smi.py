"""pcie_facts must report real GPUs' links, pair levels and P2P status exactly as nvidia-smi does.

The fixtures were captured read-only through the device tool: gpu-h200-microvm on one H200
(tests/tools/device_audit.sh), gpu-h200-x2 on a host with two H200s joined through an NVSwitch
fabric, and gpu-h200-x4 on one with four (tests/tools/device_multi_gpu.sh). nvidia-smi's readings were taken right before the
capture of the PCI tree; both are replayed here. For the NVML side, the host's NVML answers
(nvml-readings.json) are replayed through FakeNVML, which stands in for the pynvml library only.
"""

from __future__ import annotations

import csv
import json
import os
import re

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.modules import pcie_facts

from tests.unit.fakenvml import FakeNVML
from tests.unit.fakesysfs import load_capture

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "pci")
# nvidia-smi topo -p2p letters -> NVML's P2P capability; nvidia-smi's words -> NVML's status names
P2P_MATRICES = {"r": "read", "w": "write", "n": "nvlink", "a": "atomics", "p": "pci"}
P2P_WORDS = {"OK": "OK", "CNS": "CHIPSET_NOT_SUPPORTED", "GNS": "GPU_NOT_SUPPORTED",
             "TNS": "IOH_TOPOLOGY_NOT_SUPPORTED", "NS": "NOT_SUPPORTED", "U": "UNKNOWN"}


def _read(fixture: str, name: str) -> str:
    with open(os.path.join(FIXTURES, fixture, name), encoding="utf-8") as fh:
        return fh.read()


def _nvidia_smi_rows(fixture: str) -> list[dict[str, str]]:
    with open(os.path.join(FIXTURES, fixture, "nvidia-smi-link.csv"), encoding="utf-8") as fh:
        return [{k.strip(): v.strip() for k, v in row.items()} for row in csv.DictReader(fh, skipinitialspace=True)]


def _bdf(nvsmi_bus_id: str) -> str:
    # nvidia-smi prints an 8-digit domain: 00000000:00:06.0
    domain, rest = nvsmi_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest}".lower()


def _matrix(text: str) -> dict[tuple[int, int], str]:
    """nvidia-smi's GPU x GPU matrix (topo -m or topo -p2p X): {(i, j): cell} for i != j."""
    cells = {}
    for line in text.splitlines():
        match = re.match(r"\s*GPU(\d+)\s+(.*)$", line)
        if not match or "\t" not in line:
            continue
        row = int(match.group(1))
        for col, cell in enumerate(match.group(2).split("\t")):
            cell = cell.strip()
            if cell and cell != "X" and re.fullmatch(r"[A-Z]+\d*", cell):
                cells[(row, col)] = cell
    return {k: v for k, v in cells.items() if k[0] != k[1]}


@pytest.mark.parametrize("fixture", ["gpu-h200-microvm", "gpu-h200-x2", "gpu-h200-x4"])
def test_link_matches_nvidia_smi(tmp_path, fixture):
    root = str(load_capture(fixture, tmp_path / fixture))
    facts, _warnings = pcie_facts.gather(HostFS(root), {"include_nvml": "never"})
    rows = _nvidia_smi_rows(fixture)
    assert rows, "the fixture holds no nvidia-smi reading"
    gpus = {g["bdf"]: g for g in facts["gpus"]}
    assert len(gpus) == len(rows)
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


@pytest.mark.parametrize("fixture, answer_types", [("gpu-h200-x2", True), ("gpu-h200-x2", False),
                                                   ("gpu-h200-x4", True), ("gpu-h200-x4", False)])
def test_pair_levels_and_p2p_match_nvidia_smi(tmp_path, fixture, answer_types):
    """2 and 4 H200s behind an NVSwitch fabric: nvidia-smi topo -m says NV18 for every pair, and
    every P2P matrix (read, write, nvlink, atomics, pci) says what NVML's P2P status says. The
    same holds when the driver does not answer the NVLink remote type (the fabric's remote address
    is no GPU of this host)."""
    readings = json.loads(_read(fixture, "nvml-readings.json"))
    root = str(load_capture(fixture, tmp_path / fixture))
    facts, _warnings = pcie_facts.gather(HostFS(root), {"include_nvml": "always"},
                                         nvml_lib=FakeNVML.from_readings(readings, answer_remote_types=answer_types))
    assert len(facts["pairs"]) == len(readings["gpus"]) * (len(readings["gpus"]) - 1) // 2
    order = [_bdf(row["pci.bus_id"]) for row in _nvidia_smi_rows(fixture)]  # nvidia-smi's GPU index order
    assert {p["nvlink_via"] for p in facts["pairs"]} == {"nvswitch"}
    pairs = {frozenset((p["a"], p["b"])): p for p in facts["pairs"]}
    topo = _matrix(_read(fixture, "nvidia-smi-topo-m.txt"))
    assert topo, "no GPU pair in nvidia-smi-topo-m.txt"
    for (i, j), level in topo.items():
        pair = pairs[frozenset((order[i], order[j]))]
        assert pair["level"] == level, f"GPU{i}-GPU{j}: nvidia-smi {level}, pcie_facts {pair['level']}"
        assert pair["level_source"] == "nvml"
    # without NVML the sysfs path gives the PCIe level (no switch in this VM: through the host bridge)
    assert {p["sysfs_level"] for p in facts["pairs"]} == {"PHB"}
    for letter, cap in P2P_MATRICES.items():
        matrix = _matrix(_read(fixture, f"nvidia-smi-p2p-{letter}.txt"))
        assert matrix, f"no GPU pair in nvidia-smi-p2p-{letter}.txt"
        for (i, j), word in matrix.items():
            pair = pairs[frozenset((order[i], order[j]))]
            assert pair["p2p"][cap] == P2P_WORDS[word], f"{cap} GPU{i}-GPU{j}: nvidia-smi {word}, pcie_facts {pair['p2p'][cap]}"


@pytest.mark.parametrize("fixture", ["gpu-h200-x2", "gpu-h200-x4"])
def test_multi_gpu_audit_has_no_sys_or_acs_finding(tmp_path, fixture):
    """NVLink through the fabric: no pair may be flagged as SYS-level or ACS-redirected."""
    readings = json.loads(_read(fixture, "nvml-readings.json"))
    root = str(load_capture(fixture, tmp_path / fixture))
    facts, _warnings = pcie_facts.gather(HostFS(root), {"include_nvml": "always"},
                                         nvml_lib=FakeNVML.from_readings(readings))
    codes = {f["code"] for f in facts["findings"]}
    assert not codes & {"pair_sys_level", "acs_redirect", "link_below_capability", "link_capped"}, codes

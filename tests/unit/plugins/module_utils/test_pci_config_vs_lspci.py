# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The decoder agrees with pciutils: every config-space dump (each function of every capture under
tests/fixtures/pci, synthetic functions of every port type, and dumps of the layouts that used to
disagree) goes through pciutils' own ``lspci -F DUMP -vvv``, and what pcie_facts reports for it
(decode_config, the same dict pcie_facts returns under ``config``) is compared field by field with
assert_config_matches_lspci: capability lists, port type, link capability/status/target speed,
MaxPayload supported and set, MaxReadReq, ASPM support and control, MSI, MSI-X, ACS capability and
control bits, AER status bits."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._pci.config import decode_config
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.modules import pcie_facts
from tests.unit.lspci import assert_config_matches_lspci, parse_lspci_vv
from tests.unit.fakesysfs import FIXTURES, config_space, load_capture
from tests.unit.plugins.modules.uthelper import needs_tools

LSPCI = shutil.which("lspci")
pytestmark = needs_tools("lspci")
CAPTURES = sorted(p.name for p in FIXTURES.iterdir() if (p / "capture.json").exists())


def dump_text(functions: list[tuple[str, bytes]]) -> str:
    """``lspci -xxxx`` format, which ``lspci -F`` reads back."""
    lines = []
    for bdf, data in functions:
        lines.append(f"{bdf} dump")
        lines += [f"{off:02x}: " + " ".join(f"{b:02x}" for b in data[off:off + 16]) for off in range(0, len(data), 16)]
        lines.append("")
    return "\n".join(lines)


def lspci_of(tmp_path: Path, functions: list[tuple[str, bytes]]) -> dict[str, dict]:
    dump = tmp_path / "config.dump"
    dump.write_text(dump_text(functions))
    proc = subprocess.run([LSPCI, "-F", str(dump), "-vvv", "-D"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          check=False, env=dict(os.environ, LC_ALL="C"))
    assert proc.returncode == 0, proc.stderr
    return parse_lspci_vv(proc.stdout)


def compare(tmp_path: Path, functions: list[tuple[str, bytes]]) -> dict[str, dict]:
    ref = lspci_of(tmp_path, functions)
    assert sorted(ref) == sorted(b for b, _d in functions)
    for bdf, data in functions:
        assert_config_matches_lspci(bdf, {"config": decode_config(data)}, ref[bdf])
    return ref


def capture_functions(name: str, dest: Path) -> list[tuple[str, bytes]]:
    base = load_capture(name, dest) / "sys/bus/pci/devices"
    return [(bdf, (base / bdf / "config").read_bytes()) for bdf in sorted(os.listdir(base)) if (base / bdf / "config").exists()]


# ---- the captures: lab VMs, the real H200 hosts, a Firecracker VM -----------------------------------
@pytest.mark.parametrize("name", CAPTURES)
def test_every_captured_function_agrees_with_lspci(tmp_path, name):
    functions = capture_functions(name, tmp_path / "tree")
    assert functions, f"{name}: no config space captured"
    ref = compare(tmp_path, functions)
    assert any("caps" in r for r in ref.values())  # the comparison saw capability lists, not empty text


def test_pcie_facts_report_agrees_with_lspci_on_the_real_h200(tmp_path):
    root = load_capture("gpu-h200-x4", tmp_path / "tree")
    facts, _warnings = pcie_facts.gather(HostFS(str(root)), {"include_nvml": "never"})
    functions = capture_functions("gpu-h200-x4", tmp_path / "again")
    ref = lspci_of(tmp_path, functions)
    assert facts["devices"]
    for bdf, dev in facts["devices"].items():
        assert_config_matches_lspci(bdf, dev, ref[bdf])


# ---- synthetic functions of every kind --------------------------------------------------------------
def with_msi(cfg: bytes, enabled: bool = True, capable_log2: int = 3, enabled_log2: int = 1) -> bytes:
    """Insert an MSI capability (64-bit) at 0xa0, past the PCI Express capability (0x60-0x9b), after PM (0x40)."""
    b = bytearray(cfg)
    nxt = b[0x41]
    b[0x41] = 0xA0
    b[0xA0], b[0xA1] = 0x05, nxt
    struct.pack_into("<H", b, 0xA2, int(enabled) | capable_log2 << 1 | enabled_log2 << 4 | 1 << 7)
    return bytes(b)


SYNTHETIC = {
    "0000:00:01.0": config_space("0x8086", "0x347a", "0x060400", bridge=True, port_type="root_port", aspm_support="L1",
                                 aspm="L1", mps_supported=512, mps=256, mrrs=512, acs_cap=("SV", "RR", "CR", "UF"),
                                 acs_ctrl=("SV", "RR", "CR", "UF"), msix=2),
    "0000:01:00.0": config_space("0x1000", "0xc030", "0x060400", bridge=True, port_type="upstream_port", link_cap=(16.0, 16)),
    "0000:02:00.0": config_space("0x1000", "0xc030", "0x060400", bridge=True, port_type="downstream_port",
                                 acs_cap=("SV", "TB", "RR", "CR", "UF", "EC", "DT"), acs_ctrl=("SV", "RR", "CR", "UF", "EC")),
    "0000:03:00.0": with_msi(config_space("0x10de", "0x2330", "0x030200", port_type="endpoint", link_cap=(32.0, 16),
                                          link_sta=(16.0, 8), aspm="L0s L1", mps_supported=512, mrrs=4096, msix=8,
                                          aer_uncorrectable=1 << 12 | 1 << 18 | 1 << 20, aer_correctable=1 << 0 | 1 << 6)),
    "0000:04:00.0": config_space("0x15b3", "0x1021", "0x020700", port_type="legacy_endpoint", link_cap=(8.0, 4)),
    "0000:00:05.0": config_space("0x8086", "0x0b00", "0x088000", port_type="rc_integrated_endpoint"),
    "0000:05:00.0": config_space("0x8086", "0x1234", "0x060400", bridge=True, port_type="pcie_to_pci_bridge", link_cap=(5.0, 1)),
}


def test_synthetic_functions_of_every_port_type_agree(tmp_path):
    ref = compare(tmp_path, sorted(SYNTHETIC.items()))
    assert ref["0000:03:00.0"]["aer_uncorrectable"] == ["MalfTLP", "PoisonedTLP", "UnsupReq"]
    assert ref["0000:02:00.0"]["acs_ctrl"]["EC"] is True and ref["0000:00:01.0"]["aspm"] == "L1"
    assert ref["0000:03:00.0"]["msi"] == {"enabled": True, "vectors_enabled": 2, "vectors_capable": 8}


def test_a_256_byte_read_hides_the_extended_list_for_both(tmp_path):
    data = SYNTHETIC["0000:00:01.0"][:256]
    ref = compare(tmp_path, [("0000:00:01.0", data)])
    assert "ext_caps" not in ref["0000:00:01.0"] and decode_config(data)["extended_readable"] is False


# ---- the classes of disagreement that were found, each as a dump -----------------------------------
def test_target_link_speed_hardwired_to_zero_reads_2_5(tmp_path):
    b = bytearray(config_space("0x8086", "0x1234", "0x020000", link_cap=(2.5, 1)))
    struct.pack_into("<H", b, 0x60 + 0x30, 0)  # Link Control 2: Target Link Speed 0000b
    struct.pack_into("<I", b, 0x60 + 0x2C, 0)  # no Supported Link Speeds vector either
    ref = compare(tmp_path, [("0000:06:00.0", bytes(b))])
    assert ref["0000:06:00.0"]["target_gts"] == 2.5
    assert decode_config(bytes(b))["pcie"]["link_ctl2"] == {"target": {"speed_gts": 2.5, "gen": 1}, "target_hardwired": True}


def test_conventional_function_extended_space_is_junk_not_capabilities(tmp_path):
    b = bytearray(config_space("0x1234", "0x1111", "0x020000", port_type=None))
    struct.pack_into("<I", b, 0x100, 0x0001 | 1 << 16 | 0x148 << 20)  # looks like AER -> ACS
    struct.pack_into("<I", b, 0x148, 0x000D | 1 << 16)
    struct.pack_into("<HH", b, 0x14C, 0x1D, 0x1D)
    ref = compare(tmp_path, [("0000:00:07.0", bytes(b))])
    cfg = decode_config(bytes(b))
    assert "ext_caps" not in ref["0000:00:07.0"]
    assert (cfg["extended_capabilities"], cfg["acs"], cfg["aer"]) == ([], None, None)


def test_cardbus_bridge_keeps_its_capability_pointer_at_0x14(tmp_path):
    b = bytearray(256)
    struct.pack_into("<HH", b, 0, 0x104C, 0xAC56)  # a TI CardBus controller
    struct.pack_into("<HH", b, 0x04, 0x0007, 0x0210)
    struct.pack_into("<I", b, 0x08, 0x060700 << 8 | 0x01)
    b[0x0E] = 0x02  # header type 2
    b[0x14] = 0xA0  # capability pointer of a CardBus header
    b[0x34] = 0x00  # (0x34 is part of the CardBus memory window registers here)
    b[0xA0], b[0xA1] = 0x01, 0x00  # PM
    struct.pack_into("<H", b, 0xA2, 0x0002)
    ref = compare(tmp_path, [("0000:08:00.0", bytes(b))])
    assert ref["0000:08:00.0"]["caps"] == [0xA0]
    assert [c["id"] for c in decode_config(bytes(b))["capabilities"]] == ["pm"]


def test_capability_id_0xff_ends_the_chain(tmp_path):
    b = bytearray(config_space("0x8086", "0x1234", "0x020000", msix=4))  # PM 0x40 -> MSI-X 0x50 -> PCIe 0x60
    b[0x50] = 0xFF  # an entry that reads all ones: the chain is broken here
    ref = compare(tmp_path, [("0000:09:00.0", bytes(b))])
    assert ref["0000:09:00.0"]["caps"] == [0x40] and ref["0000:09:00.0"]["chain_end"] == "<chain broken>"
    cfg = decode_config(bytes(b))
    assert [c["offset"] for c in cfg["capabilities"]] == [0x40] and cfg["pcie"] is None and cfg["msix"] is None

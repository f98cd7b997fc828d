"""tests/lab/lab.py's topology changes (`lab restart NAME --root-port rp1=16x8 --without gpu2`): what QEMU
is given, and the changes it refuses before a VM is powered off. The lab itself runs them in
tests/lab/test_measured_vm.py (health.yml flags the narrower port and the missing GPU stand-in)."""

from __future__ import annotations

import pytest

from tests.lab import lab


def devices(argv: list[str]) -> dict[str, str]:
    return {lab._device_id(spec): spec for kind, spec in zip(argv[::2], argv[1::2]) if kind == "-device"}


def test_no_change_is_the_lab_topology():
    assert lab.topology() == lab.TOPOLOGY
    assert lab.topology({}, []) == lab.TOPOLOGY


def test_a_narrower_root_port_and_a_gpu_left_out():
    got = devices(lab.topology({"rp1": "16x8", "rp4": "2.5x1"}, ["gpu2"]))
    want = devices(lab.TOPOLOGY)
    assert "gpu2" not in got and "gpu2" in want
    assert "x-speed=16,x-width=8" in got["rp1"] and "x-speed=16,x-width=16" in want["rp1"]
    assert "x-speed=2.5,x-width=1" in got["rp4"]
    # everything else as it was, in the same order (QEMU assigns bus numbers in that order)
    assert [d for d in want if d != "gpu2"] == list(got)
    assert {k: v for k, v in got.items() if k not in ("rp1", "rp4")} == \
        {k: v for k, v in want.items() if k not in ("rp1", "rp4", "gpu2")}


def test_the_qemu_command_line_carries_the_change():
    argv = lab.qemu_argv("lab1", 2521, 2048, lab.topology({"rp3": "8x4"}, ["gpu0"]))
    specs = [a for a in argv if a.startswith(("pcie-root-port,id=rp3", "virtio-gpu-pci"))]
    assert specs[0].endswith("x-speed=8,x-width=4,disable-acs=on")
    assert [lab._device_id(s) for s in specs[1:]] == ["gpu1", "gpu2"]


@pytest.mark.parametrize("ports, without, says", [
    ({"rp9": "16x8"}, [], "no root port rp9"),
    ({"rp1": "16"}, [], "give SPEEDxWIDTH"),
    ({"rp1": "12x8"}, [], "give SPEEDxWIDTH"),
    ({"rp1": "16x3"}, [], "give SPEEDxWIDTH"),
    ({}, ["rp3"], "only an endpoint can be left out"),
    ({}, ["sw0up"], "would orphan"),
    ({}, ["gpu7"], "only an endpoint"),
])
def test_changes_it_refuses(ports, without, says):
    with pytest.raises(lab.LabError, match=says):
        lab.topology(ports, without)


def test_root_port_arguments():
    assert lab.parse_root_ports(["rp1=16x8", "rp2=8x4"]) == {"rp1": "16x8", "rp2": "8x4"}
    with pytest.raises(lab.LabError, match="RP=SPEEDxWIDTH"):
        lab.parse_root_ports(["rp1"])

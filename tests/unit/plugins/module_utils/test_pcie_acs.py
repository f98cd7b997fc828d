# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pcie_acs module_utils: which bridges redirect a TP group's peer traffic, the setpci spec, the
record, the boot parameters per kernel, and apply_writes with the real setpci on fake trees."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import acs as pa
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import build_model
from tests.unit.fakesysfs import ACS_REDIRECT_ON, FakeHost, eight_gpus, two_gpus_one_switch, two_numa_nodes
from tests.unit.plugins.modules.uthelper import needs_tools

SETPCI = shutil.which("setpci")
needs_setpci = needs_tools("setpci")


def run(argv):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False,
                          env=dict(os.environ, LC_ALL="C"))
    return proc.returncode, proc.stdout, proc.stderr


def two_root_ports(root) -> FakeHost:
    """PHB: GPUs 01:00.0 and 02:00.0 below root ports 00:01.0 and 00:02.0 of one host bridge (the lab VM's shape);
    an NVMe drive below 00:03.0, whose ACS is on too and must stay untouched."""
    host = FakeHost(root)
    hb = host.host_bridge(0, 0)
    for i, dev in ((1, "0x2330"), (2, "0x2330"), (3, None)):
        host.add(f"0000:00:0{i}.0", hb, kind="root_port", vendor="0x1b36", device="0x000c",
                 acs_cap=("SV", "TB", "RR", "CR", "UF", "EC", "DT"), acs_ctrl=ACS_REDIRECT_ON + ("EC",))
        if dev:
            host.gpu(f"0000:0{i}:00.0", f"0000:00:0{i}.0")
    host.add("0000:03:00.0", "0000:00:03.0", class_code="0x010802", vendor="0x144d", device="0xa80a", driver="nvme")
    return host


def model_of(root, group):
    return build_model(HostFS(str(root)), group, with_names=False)


# ---- which bridges ------------------------------------------------------------------------------
def test_switch_pair_names_the_two_downstream_ports_not_the_root_port(tmp_path):
    two_gpus_one_switch(tmp_path)
    sel = pa.redirecting_bridges(model_of(tmp_path, ["0000:03:00.0", "0000:04:00.0"]), ["0000:03:00.0", "0000:04:00.0"])
    assert list(sel["bridges"]) == ["0000:02:00.0", "0000:02:01.0"]
    port = sel["bridges"]["0000:02:00.0"]
    assert (port["ctrl"], port["on"], port["clear"], port["pairs"]) == (0x1D, ["RR", "CR"], 0x0C, [["0000:03:00.0", "0000:04:00.0"]])
    assert sel["pairs"] == [{"a": "0000:03:00.0", "b": "0000:04:00.0", "level": "PIX",
                             "bridges": ["0000:02:00.0", "0000:02:01.0"], "redirecting": ["0000:02:00.0", "0000:02:01.0"]}]


def test_switch_without_redirect_needs_nothing(tmp_path):
    two_gpus_one_switch(tmp_path, acs=False)
    group = ["0000:03:00.0", "0000:04:00.0"]
    assert pa.redirecting_bridges(model_of(tmp_path, group), group)["bridges"] == {}


def test_phb_pair_names_its_two_root_ports_and_egress_control(tmp_path):
    two_root_ports(tmp_path)
    group = ["0000:01:00.0", "0000:02:00.0"]
    sel = pa.redirecting_bridges(model_of(tmp_path, group), group)
    assert list(sel["bridges"]) == ["0000:00:01.0", "0000:00:02.0"]  # not 00:03.0 (the NVMe drive's)
    assert sel["bridges"]["0000:00:01.0"]["on"] == ["RR", "CR", "EC"] and sel["bridges"]["0000:00:01.0"]["clear"] == 0x2C
    assert sel["pairs"][0]["level"] == "PHB"


def test_sys_pair_has_no_bridge_to_clear(tmp_path):
    two_numa_nodes(tmp_path)
    group = ["0000:17:00.0", "0000:97:00.0"]
    sel = pa.redirecting_bridges(model_of(tmp_path, group), group)
    assert sel["bridges"] == {} and sel["pairs"][0]["level"] == "SYS"


def test_tp_group_of_two_on_an_eight_gpu_board_touches_only_its_switch(tmp_path):
    eight_gpus(tmp_path)
    group = ["0000:13:00.0", "0000:14:00.0"]  # the two GPUs below switch 11:00.0
    sel = pa.redirecting_bridges(model_of(tmp_path, group), group)
    assert list(sel["bridges"]) == ["0000:12:00.0", "0000:12:01.0"]


# ---- specs, plans and records -------------------------------------------------------------------
def test_spec_writes_only_the_masked_bits():
    assert pa.spec(0x0011, 0x000C) == "ECAP_ACS+6.w=0000:000c"
    assert pa.spec(0x001D, 0x002C) == "ECAP_ACS+6.w=000c:002c"
    assert pa.setpci_argv("/usr/bin/setpci", "/", "0000:00:01.0", 0, 0x2C) == [
        "/usr/bin/setpci", "-A", "linux-sysfs", "-O", "sysfs.path=/sys/bus/pci", "-s", "0000:00:01.0", "ECAP_ACS+6.w=0000:002c"]


def test_plan_clear_and_restore():
    bridges = {"0000:02:00.0": {"clear": 0x0C}}
    cur = {"0000:02:00.0": {"ctrl": 0x1D, "vendor_id": "0x1000", "device_id": "0xc030", "readable": True, "offset": 0x148,
                            "error": None}}
    writes = pa.plan_clear(bridges, cur)
    assert writes == [{"device": "0000:02:00.0", "before": 0x1D, "after": 0x11, "mask": 0x0C}]
    record = pa.merge_record(pa.empty_record(), writes, cur)
    assert record["devices"]["0000:02:00.0"]["ctrl"] == 0x1D
    cleared = {"0000:02:00.0": dict(cur["0000:02:00.0"], ctrl=0x11)}
    assert pa.plan_clear(bridges, cleared) == []
    back = pa.plan_restore(record, cleared)
    assert back["writes"] == [{"device": "0000:02:00.0", "before": 0x11, "after": 0x1D, "mask": 0x2C}]
    assert pa.plan_restore(record, {})["gone"] == ["0000:02:00.0"]
    with pytest.raises(pa.AcsError, match="not the recorded 0x1000:0xc030"):
        pa.plan_restore(record, {"0000:02:00.0": dict(cleared["0000:02:00.0"], device_id="0xbeef")})


@pytest.mark.parametrize("text,message", [
    ("", "is empty: it should hold the original ACS Control values"),
    ("   \n", "is empty: it should hold the original ACS Control values"),
    ("{", "not valid JSON"),
    ("[]", "not a gpufleet.inference.pcie_acs record"),
])
def test_an_empty_or_broken_record_is_an_error_never_no_record(text, message):
    with pytest.raises(pa.AcsError, match=message):
        pa.parse_record(text, "/var/lib/gpufleet/pcie_acs/originals.json")
    assert pa.parse_record(None, "x") == pa.empty_record()


@pytest.mark.parametrize("release,args", [
    ("4.18.0-553.el8_10.x86_64", []),
    ("4.19.0-25-amd64", ["pci=disable_acs_redir=0000:02:00.0;0000:02:01.0"]),
    ("5.15.0-105-generic", ["pci=disable_acs_redir=0000:02:00.0;0000:02:01.0"]),
    ("6.8.0-45-generic", ["pci=disable_acs_redir=0000:02:00.0;0000:02:01.0"]),
    ("6.11.0-9-generic", ["pci=disable_acs_redir=0000:02:00.0;0000:02:01.0",
                          "pci=config_acs=x0x00xx@0000:02:00.0;x0x00xx@0000:02:01.0"]),
])
def test_kernel_args_follow_the_running_kernel(release, args):
    out = pa.kernel_args(["0000:02:00.0", "0000:02:01.0"], release)
    assert out["args"] == args
    assert not any("noacs" in a for a in out["args"])
    assert pa.kernel_args([], release) == {"args": [], "notes": []}


def test_config_acs_flags_clear_exactly_rr_cr_ec():
    # the string runs from bit 6 (DT) down to bit 0 (SV); '0' forces a bit off, 'x' leaves it
    flags = pa.CONFIG_ACS_FLAGS
    off = sum(1 << (6 - i) for i, c in enumerate(flags) if c == "0")
    assert off == pa.MASK and set(flags) == {"x", "0"} and len(flags) == 7


def test_vfio_reasons(tmp_path):
    host = two_gpus_one_switch(tmp_path)
    fs = HostFS(str(tmp_path))
    assert pa.vfio_reasons(fs, "ro quiet") == []
    host.mkdir("/sys/bus/pci/drivers/vfio-pci")
    host.link(host.dirs["0000:04:00.0"] + "/driver", "/sys/bus/pci/drivers/vfio-pci")
    assert pa.vfio_reasons(fs, "ro vfio-pci.ids=10de:2330") == [
        "0000:04:00.0 is bound to vfio-pci", "the kernel command line has vfio-pci.ids=10de:2330"]


# ---- the real setpci on a fake tree -------------------------------------------------------------
@needs_setpci
def test_apply_writes_changes_only_the_acsctl_bits_byte_by_byte(tmp_path):
    two_root_ports(tmp_path)
    fs = HostFS(str(tmp_path))
    base = tmp_path / "sys/bus/pci/devices"
    before = {b: (base / b / "config").read_bytes() for b in os.listdir(base)}
    cur = {b: pa.read_acs(fs, b) for b in ("0000:00:01.0", "0000:00:02.0")}
    assert cur["0000:00:01.0"]["ctrl"] == 0x3D and cur["0000:00:01.0"]["offset"] == 0x148
    writes = pa.plan_clear({b: {"clear": 0x2C} for b in cur}, cur)
    out = pa.apply_writes(fs, writes, run, SETPCI)
    assert out["failures"] == [] and len(out["done"]) == 2
    after = {b: (base / b / "config").read_bytes() for b in os.listdir(base)}
    diff = {b: [(i, before[b][i], after[b][i]) for i in range(4096) if before[b][i] != after[b][i]] for b in before if before[b] != after[b]}
    # ACSCtl at 0x148 + 6: 0x3d (SV RR CR UF EC) -> 0x11 (SV UF); the high byte and every other byte untouched
    assert diff == {"0000:00:01.0": [(0x14E, 0x3D, 0x11)], "0000:00:02.0": [(0x14E, 0x3D, 0x11)]}
    # and back, byte for byte
    back = pa.apply_writes(fs, pa.plan_restore(pa.merge_record(pa.empty_record(), writes, cur),
                                               {b: pa.read_acs(fs, b) for b in cur})["writes"], run, SETPCI)
    assert back["failures"] == []
    assert {b: (base / b / "config").read_bytes() for b in os.listdir(base)} == before


@needs_setpci
def test_apply_writes_readonly_bit_rolls_back_what_took(tmp_path):
    two_root_ports(tmp_path)
    fs = HostFS(str(tmp_path))
    cur = {b: pa.read_acs(fs, b) for b in ("0000:00:01.0", "0000:00:02.0")}
    writes = pa.plan_clear({b: {"clear": 0x2C} for b in cur}, cur)
    cfg2 = tmp_path / "sys/bus/pci/devices/0000:00:02.0/config"
    firmware2 = cfg2.read_bytes()

    def readonly_second(argv):  # the emulator ignores the write to the second port, as QEMU does for RO bits
        rc, out, err = run(argv)
        if "0000:00:02.0" in argv:
            cfg2.write_bytes(firmware2)
        return rc, out, err

    out = pa.apply_writes(fs, writes, readonly_second, SETPCI)
    assert [f["kind"] for f in out["failures"]] == ["readonly"] and out["done"] == []
    assert [r["device"] for r in out["rolled_back"]] == ["0000:00:01.0"]
    assert pa.read_acs(fs, "0000:00:01.0")["ctrl"] == 0x3D
    msg = pa.failure_message(out["failures"][0], out)
    assert "still reads 0x003d" in msg and "Rolled back: 0000:00:01.0 ACSCtl 0x003d" in msg

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""driver_verify on the real H200's NVML answers (docs/examples/h200-nvml, read-only, driver 580.159.04) and its
kernel log: the state before a driver change, and each way the state after it can be wrong. FakeNVML
(tests/unit/fakenvml.py) stands in for the pynvml LIBRARY ONLY, replaying the captured answers; the tree under root
holds the driver's /proc file as the H200's NVRM line says it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.driver import driver_verify, verify
from tests.unit.fakenvml import FakeNVML

H200 = Path(__file__).resolve().parents[4] / "docs" / "examples" / "h200-nvml"
NVRM_580 = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \n"
BDF = "0000:00:06.0"


def dump() -> dict:
    return json.loads((H200 / "nvml.json").read_text())


def host(tmp_path: Path, proc_text: str | None = NVRM_580) -> Host:
    if proc_text is not None:
        (tmp_path / "proc/driver/nvidia").mkdir(parents=True, exist_ok=True)
        (tmp_path / "proc/driver/nvidia/version").write_text(proc_text)
    fs = HostFS(str(tmp_path))
    return Host(fs=fs, cmd=_NoCommands(fs), warn=lambda m: None)


class _NoCommands:
    """No command runs in these tests (no packages to ask dpkg about; the kernel log is not read under a tree)."""

    chrooted = True

    def __init__(self, fs):
        self.fs = fs

    def find(self, name, required=False, hint=""):
        raise AssertionError(f"no command expected, asked for {name}")


def state(tmp_path: Path, lib: FakeNVML, proc_text: str | None = NVRM_580) -> dict:
    return driver_verify.execute({}, host(tmp_path, proc_text), False, nvml_lib=lib)["state"]


def test_the_h200_before_a_change_reads_its_driver_gpu_and_persistence(tmp_path):
    lib = FakeNVML.from_nvml_dump(dump())
    got = driver_verify.execute({}, host(tmp_path), False, nvml_lib=lib)
    assert got["changed"] is False and got["actions"] == [] and "ok" not in got
    s = got["state"]
    assert (s["loaded"], s["nvml_version"], s["gpu_source"]) == ("580.159.04", "580.159.04", "nvml")
    assert s["gpus"] == {BDF: {"name": "NVIDIA H200", "persistence_mode": 1}}
    assert lib.shutdown


def test_the_same_driver_after_a_reload_passes_every_check(tmp_path):
    before = state(tmp_path, FakeNVML.from_nvml_dump(dump()))
    got = driver_verify.execute({"expected_version": "580.159.04-0ubuntu1", "before": {"state": before}},
                                host(tmp_path), False, nvml_lib=FakeNVML.from_nvml_dump(dump()))
    assert got["ok"] and got["failed_checks"] == []
    reasons = {c["name"]: c["reason"] for c in got["checks"]}
    assert reasons["driver_version"] == "the loaded module, NVML all say 580.159.04"
    assert reasons["gpus_present"] == "all 1 GPU(s) present before are present (nvml: 1)"
    assert reasons["persistence"] == "persistence mode as before (1 GPU(s) on)"


def test_a_driver_that_did_not_come_up_at_the_expected_version_fails(tmp_path):
    before = state(tmp_path, FakeNVML.from_nvml_dump(dump()))
    lib = FakeNVML.from_nvml_dump(dump())
    with pytest.raises(Failed) as err:
        driver_verify.execute({"expected_version": "590.44.01", "before": before}, host(tmp_path), False, nvml_lib=lib)
    assert err.value.fields["failed_checks"] == ["driver_version"]
    assert "expected_version is 590.44.01, but the loaded module says 580.159.04, NVML says 580.159.04" in str(err.value)


def test_a_gpu_lost_and_persistence_off_after_the_change_fail(tmp_path):
    before = state(tmp_path, FakeNVML.from_nvml_dump(dump()))
    none = FakeNVML([], driver_version="590.44.01")
    proc_590 = NVRM_580.replace("580.159.04", "590.44.01")
    with pytest.raises(Failed) as err:
        driver_verify.execute({"expected_version": "590.44.01", "before": before}, host(tmp_path, proc_590), False,
                              nvml_lib=none)
    assert err.value.fields["failed_checks"] == ["gpus_present"]
    assert f"1 GPU(s) present before are gone after (nvml): {BDF}" in str(err.value)
    off = dump()
    off["gpus"][0]["nvmlDeviceGetPersistenceMode"] = {"value": 0}
    with pytest.raises(Failed) as err:
        driver_verify.execute({"expected_version": "580.159.04", "before": before}, host(tmp_path), False,
                              nvml_lib=FakeNVML.from_nvml_dump(off))
    assert err.value.fields["failed_checks"] == ["persistence"] and "nvidia-persistenced" in str(err.value)


def test_a_new_xid_fails_and_the_old_ones_do_not():
    """The H200's own kernel log (no Xid) before; after, the same lines plus an Xid 79 (fallen off the bus)."""
    lines = [ln for ln in json.loads((H200 / "dmesg-xid.json").read_text())["lines"] if "NVRM" in ln]
    before = {"xids": lines + ["[ 9.1] NVRM: Xid (PCI:0000:00:06): 13, pid=88, Graphics Exception"]}
    after = {"xids": before["xids"] + ["[ 99.2] NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', GPU has fallen off the bus."]}
    assert verify.check_xids(before, dict(before))["ok"]
    got = verify.check_xids(before, after)
    assert not got["ok"] and got["reason"] == "1 new Xid event(s) since the change: Xid 79 on 0000:00:06.0 (GPU has fallen off the bus)"


def test_without_nvml_the_gpus_come_from_sysfs_and_persistence_is_not_measured(tmp_path):
    """The lab VMs' GPU stand-ins (virtio-gpu, vendor 0x1af4, class 0x0380) counted from sysfs."""
    for bdf, cls in (("0000:01:00.0", "0x038000"), ("0000:05:00.0", "0x038000"), ("0000:02:00.0", "0x010802")):
        d = tmp_path / "sys/bus/pci/devices" / bdf
        d.mkdir(parents=True)
        (d / "vendor").write_text("0x1af4\n")
        (d / "class").write_text(cls + "\n")
    proc = "NVRM version: gpufleet stand-in Kernel Module  1.1  Release Build  (gpufleet lab)\n"
    (tmp_path / "proc/driver/gpufleet_nvidia").mkdir(parents=True)
    (tmp_path / "proc/driver/gpufleet_nvidia/version").write_text(proc)
    params = {"include_nvml": "never", "gpu_vendor": "0x1af4", "version_file": "/proc/driver/gpufleet_nvidia/version"}
    before = driver_verify.execute(params, host(tmp_path, None), False)["state"]
    assert (before["gpu_source"], sorted(before["gpus"]), before["loaded"]) == ("sysfs", ["0000:01:00.0", "0000:05:00.0"], "1.1")
    got = driver_verify.execute(dict(params, expected_version="1.1", before=before), host(tmp_path, None), False)
    assert got["ok"] and got["checks"][2]["reason"] == "not measured: NVML was not read before and after"
    lost = copy.deepcopy(before)
    lost["gpus"]["0000:06:00.0"] = {"name": None, "persistence_mode": None}
    with pytest.raises(Failed, match="0000:06:00.0"):
        driver_verify.execute(dict(params, expected_version="1.1", before=lost), host(tmp_path, None), False)


def test_bad_options_are_refused_before_any_read(tmp_path):
    with pytest.raises(Failed, match="gpu_vendor='nvidia' is not a PCI vendor ID"):
        driver_verify.execute({"gpu_vendor": "nvidia"}, host(tmp_path), False)
    with pytest.raises(Failed, match="before must be an earlier driver_verify result"):
        driver_verify.execute({"before": {"state": [1]}}, host(tmp_path), False)
    with pytest.raises(Failed, match="is not a driver version"):
        driver_verify.execute({"expected_version": "5 5", "include_nvml": "never"}, host(tmp_path), False)

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pcie_facts: gather() on synthetic trees and the dev VM capture, main() through AnsibleModule,
error paths (what/where/why/what to do, never a traceback), NVML and the bandwidth probe."""

from __future__ import annotations

import os

import json
import shutil
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.modules import pcie_facts
from tests.unit.fakesysfs import eight_gpus, load_capture, two_gpus_one_switch
from tests.unit.plugins.module_utils.test_nvml import FakeNVML, gpu
from tests.unit.plugins.modules.uthelper import run_module

FACT_KEYS = {"root", "devices", "gpus", "pairs", "numa_nodes", "hugepages", "cmdline", "iommu", "aspm_policy",
             "names_source", "nvml", "bandwidth", "findings", "findings_summary"}


def warnings_of(result) -> list[str]:
    """Warning texts; ansible-core 2.19 returns them as structured events."""
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]


@pytest.fixture
def switch_root(tmp_path):
    two_gpus_one_switch(tmp_path / "host")
    return str(tmp_path / "host")


@pytest.fixture
def dev_vm(tmp_path):
    return str(load_capture("dev-vm-firecracker", tmp_path / "dev-vm"))


# ---- gather -------------------------------------------------------------------------------------
def test_gather_switch_host(switch_root):
    facts, warnings = pcie_facts.gather(HostFS(switch_root), {"include_nvml": "never"})
    assert warnings == []
    assert set(facts) == FACT_KEYS
    assert [g["bdf"] for g in facts["gpus"]] == ["0000:03:00.0", "0000:04:00.0"]
    assert sorted(facts["devices"]) == ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0", "0000:03:00.0", "0000:04:00.0"]
    assert facts["pairs"][0]["level"] == "PIX"
    assert facts["findings_summary"] == {"critical": 0, "warning": 1, "info": 1, "total": 2}
    assert facts["nvml"]["available"] is False and facts["nvml"]["error"] == "include_nvml is never"
    assert facts["bandwidth"] is None
    json.dumps(facts)  # JSON-ready


def test_gather_auto_nvml_skips_fake_roots(switch_root):
    facts, _w = pcie_facts.gather(HostFS(switch_root), {})
    assert facts["nvml"]["available"] is False
    assert "describes the live host" in facts["nvml"]["error"] or "not installed" in facts["nvml"]["error"]


def test_gather_with_nvml(switch_root):
    fake = FakeNVML([gpu("00000000:03:00.0"), gpu("00000000:04:00.0", replays=3)], levels={(0, 1): 10},
                    p2p={(0, 1, 0): 4}, unsupported={"nvmlDeviceGetNvLinkState"})
    facts, _w = pcie_facts.gather(HostFS(switch_root), {"include_nvml": "always"}, nvml_lib=fake)
    pair = facts["pairs"][0]
    assert (pair["level"], pair["level_source"], pair["p2p"]["read"]) == ("PIX", "nvml", "DISABLED_BY_REGKEY")
    assert facts["nvml"]["gpus"]["0000:04:00.0"]["pcie_replay_counter"] == 3
    assert "pcie_replays" in [f["code"] for f in facts["findings"]]


def test_gather_nvml_failure_auto_warns_always_fails(switch_root):
    fake = FakeNVML([], init_error="Driver Not Loaded")
    facts, warnings = pcie_facts.gather(HostFS(switch_root), {"include_nvml": "auto"}, nvml_lib=fake)
    assert facts["nvml"]["error"] == "nvmlInit failed: Driver Not Loaded"
    assert warnings == ["NVML not read: nvmlInit failed: Driver Not Loaded; topology levels come from sysfs."]
    with pytest.raises(pcie_facts.NvmlUnavailable, match="include_nvml=always.*Install the NVIDIA driver"):
        pcie_facts.gather(HostFS(switch_root), {"include_nvml": "always"}, nvml_lib=fake)


def test_gather_eight_gpus(tmp_path):
    eight_gpus(tmp_path)
    facts, _w = pcie_facts.gather(HostFS(str(tmp_path)), {"include_nvml": "never"})
    assert len(facts["gpus"]) == 8 and len(facts["pairs"]) == 28
    levels = [p["level"] for p in facts["pairs"]]
    assert (levels.count("PIX"), levels.count("NODE"), levels.count("SYS")) == (4, 8, 16)
    assert facts["findings_summary"]["warning"] == 4 + 16  # ACS redirect per switch pair, SYS per cross-socket pair


def test_gather_dev_vm_listed_functions(dev_vm):
    facts, warnings = pcie_facts.gather(HostFS(dev_vm), {"devices": ["00:03.0"]})
    assert warnings == []
    assert facts["gpus"][0]["bdf"] == "0000:00:03.0" and facts["names_source"] == "pci.ids"
    assert facts["devices"]["0000:00:03.0"]["device_name"] == "Virtio 1.0 network device"
    assert [f["code"] for f in facts["findings"]] == ["no_hugepages"]
    assert facts["nvml"]["error"] == "no NVIDIA function among the targets"


def test_gather_short_config_warns(tmp_path):
    host = two_gpus_one_switch(tmp_path)
    cfg = host.real("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/config")
    cfg.write_bytes(cfg.read_bytes()[:64])
    facts, warnings = pcie_facts.gather(HostFS(str(tmp_path)), {
        "include_nvml": "never", "privileges": {"euid": 1000, "cap_sys_admin": False, "hostname": "gpu7"}})
    assert warnings == ["gpu7: only part of the config space is readable for 1 function(s): 0000:03:00.0 (64 bytes). "
                        "Run the module as root on gpu7 (become: true) with CAP_SYS_ADMIN: sysfs gives the first 64 bytes "
                        "only to other users and to root without it (an unprivileged container: audit the host itself)."]
    assert "config_short" in [f["code"] for f in facts["findings"]]


def test_short_config_as_root_without_cap_sys_admin_says_so(tmp_path):
    host = two_gpus_one_switch(tmp_path)
    cfg = host.real("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/config")
    cfg.write_bytes(cfg.read_bytes()[:64])
    facts, warnings = pcie_facts.gather(HostFS(str(tmp_path)), {
        "include_nvml": "never", "privileges": {"euid": 0, "cap_sys_admin": False, "hostname": "labc1"}})
    assert len(warnings) == 1 and warnings[0].startswith("labc1: only part of the config space")
    assert "already runs as root on labc1, but without CAP_SYS_ADMIN" in warnings[0]
    assert "run the module as root" not in warnings[0].lower()
    short = [f for f in facts["findings"] if f["code"] == "config_short"]
    assert short and "already runs as root on labc1" in short[0]["fix"]


def test_process_privileges_reads_this_process():
    priv = pcie_facts.process_privileges()
    assert priv["euid"] == os.geteuid() and priv["hostname"] and priv["cap_sys_admin"] in (True, False)


# ---- main() -------------------------------------------------------------------------------------
def test_main_returns_facts_and_top_level(switch_root, capsys):
    result = run_module(pcie_facts, {"root": switch_root, "include_nvml": "never"}, capsys)
    assert result["changed"] is False and result["actions"] == []
    facts = result["ansible_facts"]["gpufleet_pcie"]
    assert facts == result["pcie"]
    assert result["findings_summary"] == facts["findings_summary"]
    assert set(facts) == FACT_KEYS


def test_main_check_mode_gives_the_same_result(switch_root, capsys):
    normal = run_module(pcie_facts, {"root": switch_root, "include_nvml": "never"}, capsys)
    check = run_module(pcie_facts, {"root": switch_root, "include_nvml": "never", "_ansible_check_mode": True}, capsys)
    assert check["pcie"] == normal["pcie"] and check["changed"] is False


def test_main_unknown_bdf(dev_vm, capsys):
    result = run_module(pcie_facts, {"root": dev_vm, "devices": ["0000:3b:00.0"]}, capsys)
    assert result["failed"] is True
    assert result["msg"].startswith(f"PCI function 0000:3b:00.0 not found under /sys/bus/pci/devices (root {dev_vm})")
    assert "Traceback" not in json.dumps(result)


def test_main_no_gpu_at_all(dev_vm, capsys):
    result = run_module(pcie_facts, {"root": dev_vm}, capsys)
    assert result["failed"] is True and result["msg"].startswith("No GPU found under /sys/bus/pci/devices")
    assert "set devices:" in result["msg"]


def test_main_malformed_bdf(dev_vm, capsys):
    assert "is not a PCI address" in run_module(pcie_facts, {"root": dev_vm, "devices": ["3b-00-0"]}, capsys)["msg"]


@pytest.mark.parametrize("breakage", ["missing", "directory", "dead"])
def test_main_unreadable_gpu_config(tmp_path, capsys, breakage):
    host = two_gpus_one_switch(tmp_path)
    cfg = host.real("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/config")
    cfg.unlink()
    if breakage == "directory":
        cfg.mkdir()
    elif breakage == "dead":
        cfg.write_bytes(b"\xff" * 4096)
    result = run_module(pcie_facts, {"root": str(tmp_path), "include_nvml": "never"}, capsys)
    assert result["failed"] is True
    msg = result["msg"]
    assert msg.startswith("Cannot audit 0000:03:00.0 (3D controller [10de:2330]): ")
    assert {"missing": "No such file or directory", "directory": "Is a directory", "dead": "does not answer"}[breakage] in msg
    assert "become: true" in msg and "lspci -D -s 0000:03:00.0" in msg


def test_main_unreadable_bridge_config_warns(tmp_path, capsys):
    host = two_gpus_one_switch(tmp_path)
    host.real("/sys/devices/pci0000:00/0000:00:01.0/config").unlink()
    result = run_module(pcie_facts, {"root": str(tmp_path), "include_nvml": "never"}, capsys)
    assert not result.get("failed")
    assert any("0000:00:01.0 (on the path of a target)" in w for w in warnings_of(result))


def test_main_include_nvml_always_on_a_host_without_driver(switch_root, capsys):
    result = run_module(pcie_facts, {"root": switch_root, "include_nvml": "always"}, capsys)
    if pcie_facts.HAS_PYNVML:
        assert result["failed"] and "NVML could not be read on this host (include_nvml=always)" in result["msg"]
    else:
        assert result["failed"] and "nvidia-ml-py" in result["msg"]


def test_main_rejects_bad_probe_size(switch_root, capsys):
    result = run_module(pcie_facts, {"root": switch_root, "probe_size_mb": 0}, capsys)
    assert result["failed"] and "probe_size_mb must be from 1 to 65536 (MiB)" in result["msg"]


# ---- bandwidth probe ---------------------------------------------------------------------------
def _live_model(root):
    facts, _w = pcie_facts.gather(HostFS(root), {"include_nvml": "never"})
    facts["root"] = "/"  # the probe only runs against the live host
    return facts


PARAMS = {"probe_python": None, "probe_size_mb": 8}


def test_bandwidth_scores_against_path_theory(switch_root):
    calls = []

    def run(argv, env):
        calls.append((argv, env))
        return 0, json.dumps({"backend": "torch 2.11.0", "error": None, "gpus": {
            "0000:03:00.0": {"h2d_pinned_gbps": 52.8, "d2h_pinned_gbps": 55.2, "h2d_pageable_gbps": 15.6, "d2h_pageable_gbps": 0}}}), ""
    result = pcie_facts.bandwidth(_live_model(switch_root), PARAMS, run)
    argv, env = calls[0]
    assert argv[0] == sys.executable and argv[1] == "-c" and env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert json.loads(argv[3]) == {"size_mb": 8, "repeats": 5, "bdfs": ["0000:03:00.0", "0000:04:00.0"]}
    entry = result["gpus"]["0000:03:00.0"]
    assert entry["theoretical_gbps"] == 63.02 and entry["h2d_pinned_pct"] == 83.8 and entry["d2h_pinned_pct"] == 87.6
    assert entry["d2h_pageable_pct"] is None
    assert result["backend"] == "torch 2.11.0" and result["error"] is None


def test_bandwidth_theory_is_the_slowest_link(tmp_path):
    host = two_gpus_one_switch(tmp_path)
    host.real("/sys/devices/pci0000:00/0000:00:01.0/config").write_bytes(
        __import__("tests.unit.fakesysfs", fromlist=["config_space"]).config_space(
            "0x8086", "0x347a", "0x060400", bridge=True, port_type="root_port", link_cap=(16.0, 16)))
    assert pcie_facts.path_bandwidth(_live_model(str(tmp_path)), "0000:03:00.0") == 31.51


def test_bandwidth_probe_garbage_output(switch_root):
    result = pcie_facts.bandwidth(_live_model(switch_root), PARAMS, lambda argv, env: (1, "", "Segmentation fault"))
    assert result["error"].endswith("exited 1 without a result: Segmentation fault") and result["gpus"] == {}


def test_bandwidth_real_probe_without_torch_fails_soft(switch_root):
    """The real probe script in a real subprocess of this interpreter (no torch/cupy/CUDA here)."""
    def run(argv, env):
        proc = subprocess.run(argv, env=dict(env, PATH="/usr/bin:/bin"), capture_output=True, text=True, timeout=120, check=False)
        return proc.returncode, proc.stdout, proc.stderr
    result = pcie_facts.bandwidth(_live_model(switch_root), PARAMS, run)
    try:
        import torch  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
    except ImportError:
        assert result["backend"] is None and result["gpus"] == {}
        assert result["error"].startswith("torch: ModuleNotFoundError") or "sees no CUDA device" in result["error"]
        assert "cupy:" in result["error"]


def test_bandwidth_refuses_fake_roots_and_non_nvidia(switch_root, dev_vm):
    facts, _w = pcie_facts.gather(HostFS(switch_root), {"include_nvml": "never"})
    assert "not the tree under root" in pcie_facts.bandwidth(facts, PARAMS, None)["error"]
    facts, _w = pcie_facts.gather(HostFS(dev_vm), {"devices": ["0000:00:03.0"]})
    assert pcie_facts.bandwidth(facts, PARAMS, None)["error"] == "no NVIDIA GPU among the targets"


def test_main_bandwidth_probe_on_fake_root_warns(switch_root, capsys):
    result = run_module(pcie_facts, {"root": switch_root, "include_nvml": "never", "bandwidth_probe": True}, capsys)
    assert result["pcie"]["bandwidth"]["error"].startswith("the probe measures the live host")
    assert any(w.startswith("Bandwidth probe: ") for w in warnings_of(result))


def test_main_on_the_real_h200_capture(tmp_path, capsys):
    root = str(load_capture("gpu-h200-microvm", tmp_path / "h200"))
    result = run_module(pcie_facts, {"root": root}, capsys)
    pcie = result["pcie"]
    assert [g["bdf"] for g in pcie["gpus"]] == ["0000:00:06.0"] and pcie["pairs"] == []
    assert [f["code"] for f in pcie["findings"]] == ["no_hugepages"]
    assert pcie["nvml"]["available"] is False  # a captured tree is not the live host
    assert pcie_facts.path_bandwidth(pcie, "0000:00:06.0") == 63.02  # Gen5 x16, no partner above


def test_main_unreadable_host_directory(tmp_path, capsys):
    host = two_gpus_one_switch(tmp_path)
    groups = host.real("/sys/kernel/iommu_groups")
    shutil.rmtree(groups)
    groups.symlink_to("iommu_groups")  # a loop gives ELOOP, as an unreadable directory gives EACCES to non-root
    result = run_module(pcie_facts, {"root": str(tmp_path), "include_nvml": "never"}, capsys)
    assert result["failed"] is True
    assert result["msg"].startswith(f"PCIe audit under root {tmp_path} failed: cannot list /sys/kernel/iommu_groups/")
    assert "Too many levels of symbolic links" in result["msg"]
    assert "run it as root" in result["msg"]

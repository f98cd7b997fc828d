# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver parsers on what apt, dpkg, DKMS and kmod really printed for the lab's stand-in NVIDIA driver on a lab VM
(Debian 12, kernel 6.1.0-50-cloud-amd64, dkms 3.0.10; tests/tools/capture_driver_standin.sh, fixtures/driver/), on the
real H200's NVRM line (docs/examples/h200-nvml), and on the formats of the other tools' versions (dkms 2, the
proprietary driver's NVRM line), which no machine here has (SYNTHETIC lines, marked)."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.gpufleet.inference.plugins.module_utils.driver import checks, parse
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.holds import hold_packages
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.reads import unit_of
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.upgrade import parse_apt_simulation

FIX = Path(__file__).resolve().parent / "fixtures" / "driver"
H200 = Path(__file__).resolve().parents[4] / "docs" / "examples" / "h200-nvml"


def fixture(name: str) -> str:
    return (FIX / name).read_text()


def test_the_version_file_of_the_stand_in_the_h200_and_the_proprietary_driver():
    assert parse.driver_version_from_proc(fixture("proc-version-1.0.out")) == "1.0"
    h200 = next(ln for ln in json.loads((H200 / "dmesg-xid.json").read_text())["lines"] if "Open Kernel Module" in ln)
    assert parse.driver_version_from_proc(h200.replace("NVRM: loading", "NVRM version:")) == "580.159.04"
    # SYNTHETIC: the proprietary module's words (NVIDIA's README, "/proc/driver/nvidia/version")
    assert parse.driver_version_from_proc(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 19:29:34 UTC 2024\n") == "550.54.15"
    assert parse.driver_version_from_proc("") is None and parse.driver_version_from_proc(None) is None


def test_modinfo_of_the_installed_stand_in():
    info = parse.parse_modinfo(fixture("modinfo-1.0.out"))
    assert (info["version"], info["name"], info["vermagic"]) == (
        "1.0", "gpufleet_nvidia", "6.1.0-50-cloud-amd64 SMP preempt mod_unload modversions")
    assert info["filename"] == "/lib/modules/6.1.0-50-cloud-amd64/updates/dkms/gpufleet_nvidia.ko"


def test_dkms_status_installed_added_and_the_dkms_2_format():
    assert parse.parse_dkms_status(fixture("dkms-status-1.0.out")) == [
        {"module": "gpufleet-nvidia", "version": "1.0", "kernel": "6.1.0-50-cloud-amd64", "arch": "x86_64",
         "state": "installed", "warning": None}]
    # after the install of 1.3 failed: its source added, built nowhere
    assert parse.parse_dkms_status(fixture("dkms-status-1.3.out")) == [
        {"module": "gpufleet-nvidia", "version": "1.3", "kernel": None, "arch": None, "state": "added", "warning": None}]
    # SYNTHETIC: dkms 2's commas and a warning tail (Ubuntu 20.04's dkms 2.8)
    got = parse.parse_dkms_status("nvidia, 535.161.07, 5.15.0-97-generic, x86_64: installed (WARNING! Diff between "
                                  "built and installed module!)\n")
    assert got[0]["version"] == "535.161.07" and got[0]["warning"] == "WARNING! Diff between built and installed module!"


def test_a_failed_build_is_told_by_the_compiler_s_make_s_and_dkms_s_lines():
    """The real install of 1.3 (apt exits 100; DKMS's build fails in the package's postinst) and its make.log."""
    lines = parse.build_error_lines(fixture("install-1.3.out"), fixture("install-make-1.3.log"))
    text = "\n".join(lines)
    assert "Error! Bad return status for module build on kernel: 6.1.0-50-cloud-amd64 (x86_64)" in text
    assert "error: implicit declaration of function 'gpufleet_kernel_api_from_a_newer_release'" in text
    assert any(ln.startswith("make: ***") and "Error 2" in ln for ln in lines)
    assert len(lines) <= parse.BUILD_LINES_KEPT
    assert "E: Sub-process /usr/bin/dpkg returned an error code (1)" in parse.build_error_lines(fixture("install-1.3.err"))


def test_dpkg_query_installed_and_held_and_upstream_versions():
    installed = parse.parse_dpkg_query(fixture("dpkg-query.out"))
    assert installed["gpufleet-nvidia-standin-dkms"] == "1.0" and installed["dkms"] == "3.0.10-8+deb12u1"
    assert parse.upstream("1:550.54.15-1ubuntu1") == "550.54.15" and parse.upstream("1.1") == "1.1"
    assert parse.upstream("535.216.01-1~deb12u1") == "535.216.01" and parse.upstream(None) is None
    assert hold_packages(list(installed), ["gpufleet-nvidia-standin-utils"]) == [
        "gpufleet-nvidia-standin-dkms", "gpufleet-nvidia-standin-utils"]


def test_apt_s_simulation_of_the_candidate_and_of_a_missing_version():
    sim = parse_apt_simulation(0, fixture("sim-1.1.out"), "")
    assert sim["installs"] == [("gpufleet-nvidia-standin-utils", "1.1"), ("gpufleet-nvidia-standin-dkms", "1.1")]
    packages = ["gpufleet-nvidia-standin-utils", "gpufleet-nvidia-standin-dkms"]
    assert checks.check_candidate(packages, "1.1", sim)["ok"]
    missing = parse_apt_simulation(100, "", fixture("sim-9.9.err"))
    got = checks.check_candidate(["gpufleet-nvidia-standin-utils"], "9.9", missing)
    assert not got["ok"] and got["reason"] == ("apt-get install -s gpufleet-nvidia-standin-utils=9.9 fails: E: Version "
                                               "'9.9' for 'gpufleet-nvidia-standin-utils' was not found")


def test_the_holder_of_the_stand_in_s_device_as_proc_shows_it():
    fd = fixture("holder-fd.txt")
    assert "0 -> /dev/gpufleet_nvidia0" in fd
    assert unit_of(fixture("holder-cgroup.txt")) == "ssh.service"
    assert "Module gpufleet_nvidia is in use" in fixture("rmmod-held.err")  # what the kernel says; the module refuses first


def test_the_trial_build_in_a_private_dkms_tree_says_why_as_the_installed_build_does():
    """dkms 3.0.10's `dkms build --dkmstree --sourcetree` of 1.3 on the lab VM: DKMS's own lines (rc 10), the make.log in
    the private tree, and the compiler's error in it; 1.1's build there and modinfo of what it built."""
    lines = parse.build_error_lines(fixture("trial-build-1.3.out"), fixture("trial-build-1.3.err"),
                                    fixture("trial-make-1.3.log"))
    assert "Error! Bad return status for module build on kernel: 6.1.0-50-cloud-amd64 (x86_64)" in lines
    assert "Consult /var/tmp/capture-1.3/dkms/gpufleet-nvidia/1.3/build/make.log for more information." in lines
    assert any("implicit declaration of function 'gpufleet_kernel_api_from_a_newer_release'" in ln for ln in lines)
    assert parse.build_error_lines(fixture("trial-build-1.1.out")) == []
    built = parse.parse_modinfo(fixture("trial-modinfo-1.1.out"))
    assert built["version"] == "1.1" and built["filename"].startswith("/var/tmp/capture-1.1/dkms/gpufleet-nvidia/1.1/")

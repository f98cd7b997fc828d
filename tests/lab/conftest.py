"""The VM lab is booted once per test session (3 VMs) and shared by every vmlab test module;
the teardown test (marker lab_teardown) runs last and checks that no QEMU process is left.

Modules run in MODULE_ORDER: test_measured_vm first, on a single VM of its own that it powers off before
the session's lab boots; then the read-only checks, on the lab as it booted; then the module
level tuning proofs; then the site.yml scenario (with a reboot); then the tests that change the VMs'
kernels (marker lab_kernel, test_kernel_upgrade_vm) after all others, before the teardown."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.lab.labutil import (BUILD_IMAGE, LAB, N_VMS, NAMES, Lab, gather_topology, lab_containers,
                               lab_qemu_processes, run)


def pytest_configure(config):
    config.addinivalue_line("markers", "lab_teardown: runs after every other VM lab test")
    config.addinivalue_line("markers", "lab_kernel: changes the VMs' kernels; runs after the other VM lab tests, "
                                       "before the teardown")


# test_measured_vm, test_serving_verdict_vm, test_serving_verdict_stability_vm, test_fleet_ops_vm, test_profiles_vm,
# test_cpu_vm and test_vllm_upgrade_vm boot their own single VM and power it off before the session's lab starts.
MODULE_ORDER = ("test_measured_vm", "test_serving_verdict_vm", "test_serving_verdict_stability_vm", "test_fleet_ops_vm",
                "test_profiles_vm",
                "test_cpu_vm", "test_vllm_upgrade_vm",
                "test_container_host", "test_lab", "test_audit_vm",
                "test_tuning_vm", "test_kernel_lock_vm",
                "test_pcie_safety_vm", "test_site_vm", "test_kernel_upgrade_vm")


def _order(item) -> tuple:
    if item.get_closest_marker("lab_teardown") is not None:
        return (3, 0)
    if item.get_closest_marker("lab_kernel") is not None:
        return (2, 0)
    module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
    if "/tests/lab/" not in str(item.fspath).replace("\\", "/"):
        return (0, 0)
    return (1, MODULE_ORDER.index(module) if module in MODULE_ORDER else len(MODULE_ORDER))


def pytest_collection_modifyitems(session, config, items):
    # stable sort: within a module, tests keep their file order
    items.sort(key=_order)


@pytest.fixture(scope="session")
def lab():
    if os.geteuid() != 0:
        pytest.skip("the VM lab needs root (loop devices to build the image)")
    if not shutil.which("qemu-system-x86_64"):
        pytest.skip("qemu-system-x86_64 missing: run scripts/bootstrap")
    if lab_qemu_processes() or lab_containers():
        pytest.fail("a lab is already running in this checkout; `tests/lab/lab down` first "
                    "(the test session owns its lab and tears it down)")
    # lab3 reserves a 1 GiB huge page (inventories/lab/host_vars/lab3.yml): give it room
    os.environ.setdefault("GPUFLEET_LAB_MEMORY_LAB3", "4G")
    b = run([BUILD_IMAGE], timeout=1800)
    assert b.returncode == 0, f"build-image failed:\n{b.stderr[-3000:]}"
    handle = Lab()
    up = run([LAB, "up", str(N_VMS)], timeout=900)
    try:
        assert up.returncode == 0, f"lab up {N_VMS} failed:\n{up.stderr[-3000:]}"
        yield handle
    finally:
        handle.down()


@pytest.fixture(scope="session")
def lab_vms(lab) -> list:
    return list(NAMES)


@pytest.fixture(scope="session")
def topology(lab):
    return gather_topology()

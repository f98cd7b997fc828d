"""The VM lab is booted once per test session (3 VMs) and shared by every vmlab test module;
tests that change the VMs' kernels (marker lab_kernel) run after all others, and the teardown test
(marker lab_teardown) runs last and checks that no QEMU process is left."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.lab.labutil import BUILD_IMAGE, LAB, N_VMS, NAMES, Lab, gather_topology, lab_qemu_processes, run


def pytest_configure(config):
    config.addinivalue_line("markers", "lab_teardown: runs after every other VM lab test")
    config.addinivalue_line("markers", "lab_kernel: changes the VMs' kernels; runs after the other VM lab tests, "
                                       "before the teardown")


def pytest_collection_modifyitems(session, config, items):
    # stable sort: the kernel-changing tests after every other one, the teardown test last
    items.sort(key=lambda item: (item.get_closest_marker("lab_teardown") is not None,
                                 item.get_closest_marker("lab_kernel") is not None))


@pytest.fixture(scope="session")
def lab():
    if os.geteuid() != 0:
        pytest.skip("the VM lab needs root (loop devices to build the image)")
    if not shutil.which("qemu-system-x86_64"):
        pytest.skip("qemu-system-x86_64 missing: run scripts/bootstrap")
    if lab_qemu_processes():
        pytest.fail("a lab is already running in this checkout; `tests/lab/lab down` first "
                    "(the test session owns its lab and tears it down)")
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

"""Every Molecule scenario of the collection (extensions/molecule/*), each in podman containers
built from debootstrap by tests/containers/build-image."""

from __future__ import annotations

import glob
import os
import time

import pytest

from tests.helpers import REPO, assert_ok, run

pytestmark = pytest.mark.molecule

SCENARIOS = sorted(os.path.basename(os.path.dirname(p))
                   for p in glob.glob(os.path.join(REPO, "extensions", "molecule", "*", "molecule.yml")))


@pytest.fixture(scope="session")
def images() -> None:
    for suite in ("bookworm", "trixie"):
        assert_ok(run([os.path.join(REPO, "tests", "containers", "build-image"), suite], timeout=900),
                  f"building the {suite} systemd image")


def test_scenarios_exist() -> None:
    assert SCENARIOS, "no Molecule scenario under extensions/molecule"


REPORTS = os.path.join(os.environ.get("GPUFLEET_CACHE", "/var/cache/gpufleet"), "reports")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(scenario: str, images: None, capsys: pytest.CaptureFixture) -> None:
    """check, converge, idempotence and verify (testinfra), as the scenario's test_sequence says.

    Figures a scenario writes for people (reports/molecule-<scenario>-*.txt under GPUFLEET_CACHE, such
    as the vllm_service gate's runs and verdicts) are printed to the terminal, passed or failed.
    """
    started = time.time()
    proc = run(["molecule", "test", "-s", scenario], timeout=3000)
    for path in sorted(glob.glob(os.path.join(REPORTS, f"molecule-{scenario}-*.txt"))):
        if os.path.getmtime(path) >= started:
            with open(path, encoding="utf-8") as fh, capsys.disabled():
                print(f"\n{os.path.basename(path)}:\n{fh.read().rstrip()}")
    assert_ok(proc, f"molecule test -s {scenario}", lines=150)

"""Every Molecule scenario of the collection (extensions/molecule/*), each in podman containers
built from debootstrap by tests/containers/build-image."""

from __future__ import annotations

import glob
import os

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


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(scenario: str, images: None) -> None:
    """check, converge, idempotence and verify (testinfra), as the scenario's test_sequence says."""
    proc = run(["molecule", "test", "-s", scenario], timeout=3000)
    assert_ok(proc, f"molecule test -s {scenario}", lines=150)

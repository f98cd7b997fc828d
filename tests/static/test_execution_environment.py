"""execution-environment.yml: ansible-builder 3 schema, the files it names exist, its pins match the controller's lock,
and only controller-side dependencies go into the image."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import yaml

from tests.helpers import REPO

pytestmark = pytest.mark.static

EE_FILE = os.path.join(REPO, "execution-environment.yml")
V3_KEYS = {"version", "images", "dependencies", "additional_build_files", "additional_build_steps",
           "build_arg_defaults", "options"}
DEP_KEYS = {"python", "system", "galaxy", "ansible_core", "ansible_runner", "python_interpreter", "exclude"}
# Built from the checkout by the commands in docs/execution_environment.md, never committed.
BUILT = ".ee/gpufleet-inference.tar.gz"
TARGET_SIDE = ("nvidia-ml-py", "pynvml", "pyudev")


def load(path: str):
    with open(os.path.join(REPO, path), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def pins(path: str) -> dict[str, str]:
    out = {}
    with open(os.path.join(REPO, path), encoding="utf-8") as fh:
        for line in fh:
            m = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s#;]+)", line)
            if m:
                out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


@pytest.fixture(scope="module")
def ee() -> dict:
    doc = load("execution-environment.yml")
    assert isinstance(doc, dict), "execution-environment.yml is not a YAML mapping"
    return doc


def test_schema_version_3(ee: dict) -> None:
    assert ee.get("version") == 3, "ansible-builder assumes schema 1 without `version: 3`"
    assert set(ee) <= V3_KEYS, f"unknown top-level keys: {sorted(set(ee) - V3_KEYS)}"
    assert set(ee["dependencies"]) <= DEP_KEYS, f"unknown dependency keys: {sorted(set(ee['dependencies']) - DEP_KEYS)}"
    assert ee["images"]["base_image"]["name"], "images.base_image.name is required"


def test_named_files_exist(ee: dict) -> None:
    for key in ("python", "system", "galaxy"):
        value = ee["dependencies"].get(key)
        if isinstance(value, str):
            assert os.path.isfile(os.path.join(REPO, value)), f"dependencies.{key}: {value} does not exist"
    for entry in ee.get("additional_build_files") or []:
        src = entry["src"]
        if src == BUILT:
            ignored = subprocess.run(["git", "check-ignore", "-q", src], cwd=REPO, check=False).returncode == 0
            assert ignored, f"{src} is a build output: it must be gitignored"
            with open(os.path.join(REPO, "docs", "execution_environment.md"), encoding="utf-8") as fh:
                assert src in fh.read(), f"docs/execution_environment.md must say how {src} is built"
        else:
            assert os.path.exists(os.path.join(REPO, src)), f"additional_build_files: {src} does not exist"
        assert not os.path.isabs(entry["dest"]) and ".." not in entry["dest"].split("/")


def test_pins_match_the_controller_lock(ee: dict) -> None:
    lock = pins("requirements/controller.txt")
    core = ee["dependencies"]["ansible_core"]["package_pip"]
    assert core == f"ansible-core=={lock['ansible-core']}", f"{core} differs from requirements/controller.txt"
    python = pins(ee["dependencies"]["python"])
    for name, version in python.items():
        if name in lock:
            assert version == lock[name], f"{name}=={version} in the EE, {lock[name]} in requirements/controller.txt"


def test_only_controller_side_dependencies(ee: dict) -> None:
    with open(os.path.join(REPO, ee["dependencies"]["python"]), encoding="utf-8") as fh:
        requirements = [line.split("#", 1)[0].strip().lower() for line in fh]
    for name in TARGET_SIDE:
        assert not any(r.startswith(name) for r in requirements), f"{name} is a target-side library, not the EE's"
    # ansible-builder also installs a collection's root requirements.txt / bindep.txt (or those named by
    # meta/execution-environment.yml) into every EE that includes it: this collection has none, on purpose.
    for path in ("requirements.txt", "bindep.txt", "meta/execution-environment.yml"):
        assert not os.path.exists(os.path.join(REPO, path)), f"{path} would put its packages into every EE"


def test_galaxy_requirements_install_this_collection_and_its_dependencies(ee: dict) -> None:
    reqs = load(ee["dependencies"]["galaxy"])["collections"]
    names = {c["name"]: c for c in reqs}
    built = [c for c in reqs if c.get("type") == "file"]
    assert len(built) == 1, "the collection itself, as the built tarball"
    dests = {f"{e['dest']}/{os.path.basename(e['src'])}" for e in ee.get("additional_build_files") or []}
    assert built[0]["name"] in dests, "the galaxy requirement must point at the file additional_build_files copies"
    galaxy = load("galaxy.yml")
    for dependency in galaxy.get("dependencies") or {}:
        assert dependency in names, f"{dependency} (a dependency in galaxy.yml) is not installed into the EE"

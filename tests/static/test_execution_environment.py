"""execution-environment.yml: ansible-builder 3 schema, the files it names exist, its pins match the controller's lock,
and only controller-side dependencies go into the image."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

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


def _documented_build_steps() -> list[str]:
    """Step 1 of docs/execution_environment.md's build block (the tarball), as a user would type it."""
    with open(os.path.join(REPO, "docs", "execution_environment.md"), encoding="utf-8") as fh:
        text = fh.read()
    section = text.split("## Building the image", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    steps = [line.strip() for line in block.splitlines() if line.strip().startswith(("ansible-galaxy ", "mv "))]
    assert steps, "docs/execution_environment.md: no ansible-galaxy build step in its build block"
    return steps


def test_ansible_builder_creates_the_context_from_the_documented_steps(tmp_path) -> None:
    """In a clean copy of the checkout: the documented tarball step, then `ansible-builder create` (ansible-builder
    from PyPI, in .venv-galaxy): both succeed without a warning, and the context holds what the image needs."""
    builder = os.path.join(REPO, ".venv-galaxy", "bin", "ansible-builder")
    assert os.path.isfile(builder), ".venv-galaxy is missing: run scripts/bootstrap"
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, stdout=subprocess.PIPE,
                           check=True, text=True).stdout
    for rel in filter(None, files.split("\0")):
        if os.path.lexists(os.path.join(REPO, rel)):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.join(REPO, rel), src / rel, follow_symlinks=False)
    (tmp_path / "home").mkdir()
    env = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), os.path.dirname(builder), "/usr/bin", "/bin"]),
           "HOME": str(tmp_path / "home"), "LC_ALL": "C.UTF-8", "ANSIBLE_NOCOLOR": "1"}
    outputs = []
    for step in _documented_build_steps() + [f"{builder} create --file execution-environment.yml --context .ee/context"]:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", step], cwd=src, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
        assert proc.returncode == 0, f"{step} failed with rc={proc.returncode}:\n{proc.stdout}"
        outputs.append(f"$ {step}\n{proc.stdout}")
    warnings = [line for out in outputs for line in out.splitlines() if re.search(r"warn", line, re.I)]
    assert not warnings, "warnings while building the context:\n" + "\n".join(warnings)
    context = src / ".ee" / "context"
    containerfile = (context / "Containerfile").read_text(encoding="utf-8")
    core = f"ansible-core=={pins('requirements/controller.txt')['ansible-core']}"
    assert "python3.11" in containerfile and core in containerfile, f"no python3.11 or {core}:\n{containerfile}"
    assert (context / "_build" / "collections" / "gpufleet-inference.tar.gz").is_file(), "the collection is not in the context"
    galaxy = yaml.safe_load((context / "_build" / "requirements.yml").read_text(encoding="utf-8"))
    assert {c["name"] for c in galaxy["collections"]} >= {"ansible.posix"}, galaxy

"""The collection as Galaxy and its users get it: the tarball `ansible-galaxy collection build` makes from a clean
copy of the checkout holds what a user needs and nothing of the development setup, galaxy-importer (what Galaxy
runs on every upload) accepts it offline without an error or a warning, and once installed into an empty
collections path its playbooks run by FQCN, writing their reports where they are told and never into the
installed collection.

galaxy-importer pins its own ansible-core and ansible-lint: it runs from its own venv (.venv-galaxy, built by
scripts/bootstrap from requirements/galaxy-importer.txt). Every command here runs with a clean environment: no
ANSIBLE_* variable, no ansible.cfg, a HOME of its own, so nothing of the checkout leaks into what is checked.
"""

from __future__ import annotations

import ast
import fnmatch
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time

import pytest
import yaml

from tests.helpers import REPO, tail

pytestmark = pytest.mark.static

BINDIR = os.path.dirname(sys.executable)
GALAXY_VENV = os.path.join(REPO, ".venv-galaxy")
IMPORTER_CFG = os.path.join(REPO, "tests", "static", "galaxy-importer.cfg")
ROLES = sorted(r for r in os.listdir(os.path.join(REPO, "roles")) if os.path.isdir(os.path.join(REPO, "roles", r)))
MODULES = sorted(n[:-3] for n in os.listdir(os.path.join(REPO, "plugins", "modules")) if n.endswith(".py")
                 and not n.startswith("_"))
PLAYBOOKS = sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(REPO, "playbooks", "*.yml")))

# Development material: none of it may be in the tarball (galaxy.yml's build_ignore keeps it out).
NOT_SHIPPED = [
    ".ansible/*", ".cache/*", ".collections/*", ".lab/*", ".venv*", ".ci/*", ".ee/*", ".git*", ".yamllint",
    ".ansible-lint", "ansible.cfg", "pytest.ini", "reports/*", "scripts/*", "extensions/*",
    "inventories/lab/*", "inventories/example/group_vars/all/vault.yml", "requirements/controller.*",
    "requirements/collections.txt", "requirements/galaxy-importer.txt", "tests/lab/*", "tests/molecule/*",
    "tests/static/*", "tests/benchmarks/*", "tests/containers/*", "tests/wheelhouse/*", "tests/output/*",
    "tests/tools/devbench/*", "tests/tools/*.sh", "tests/sanity/get_pip_shim.py", "docs/tools/*",
    "docs/development.md", "docs/lab_inference_server.md", "docs/examples/*.log", "docs/examples/*.txt",
    "*.tar.gz", "*.pyc", "tests/tools/inference_client.py", "tests/tools/vllm_flag_stages.py", "tests/tools/h200_*",
    "tests/unit/plugins/module_utils/test_inference_client*",
]
# What a user (and ansible-test from the installed collection) needs.
SHIPPED = (["README.md", "LICENSE", "CHANGELOG.rst", "changelogs/changelog.yaml", "meta/runtime.yml",
            "execution-environment.yml", "inventories/example/hosts.yml", "tests/conftest.py",
            "tests/tools/capture_pci_tree.py"]
           + [f"roles/{r}/README.md" for r in ROLES] + [f"roles/{r}/meta/argument_specs.yml" for r in ROLES]
           + [f"playbooks/{p}.yml" for p in PLAYBOOKS])


def clean_env(home: str, *bindirs: str, **extra: str) -> dict:
    """A minimal environment: these bin directories first, no ANSIBLE_* of the checkout."""
    env = {"PATH": os.pathsep.join([*bindirs, "/usr/local/bin", "/usr/bin", "/bin"]), "HOME": home,
           "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0",
           "ANSIBLE_HOME": os.path.join(home, ".ansible"), "PYTHONDONTWRITEBYTECODE": "1"}
    env.update(extra)
    return env


def sh(argv: list[str], cwd: str, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, check=False)


def ok(proc: subprocess.CompletedProcess, what: str) -> str:
    assert proc.returncode == 0, f"{what} failed with rc={proc.returncode}:\n{tail(proc.stdout, 80)}"
    return proc.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """The tarball, built from the files a clean clone holds (tracked and untracked-but-not-ignored)."""
    started = time.monotonic()
    base = tmp_path_factory.mktemp("galaxy")
    src = base / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, stdout=subprocess.PIPE,
                           check=True, text=True).stdout
    for rel in filter(None, files.split("\0")):
        path = os.path.join(REPO, rel)
        if not os.path.lexists(path):
            continue  # deleted in the worktree, not yet in the index
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, src / rel, follow_symlinks=False)
    home = base / "home"
    home.mkdir()
    env = clean_env(str(home), BINDIR)
    ok(sh([os.path.join(BINDIR, "ansible-galaxy"), "collection", "build", "--output-path", str(base)], str(src), env),
       "ansible-galaxy collection build")
    with open(src / "galaxy.yml", encoding="utf-8") as fh:
        meta = yaml.safe_load(fh)
    tarball = base / f"{meta['namespace']}-{meta['name']}-{meta['version']}.tar.gz"
    assert tarball.is_file(), f"ansible-galaxy did not write {tarball}"
    with tarfile.open(tarball) as tar:
        members = sorted(m.name for m in tar.getmembers() if m.isfile())
    print(f"\ntarball: {len(members)} files, {tarball.stat().st_size / 1024:.0f} KiB, built in "
          f"{time.monotonic() - started:.1f} s")
    return {"base": str(base), "tarball": str(tarball), "members": members, "env": env, "home": str(home)}


def test_tarball_holds_what_a_user_needs_and_no_development_material(built: dict) -> None:
    members = built["members"]
    leaked = sorted(m for m in members if any(fnmatch.fnmatch(m, pattern) for pattern in NOT_SHIPPED))
    assert not leaked, "development material in the tarball (add it to galaxy.yml's build_ignore):\n" + "\n".join(leaked)
    missing = [m for m in SHIPPED if m not in members]
    assert not missing, "missing from the tarball: " + ", ".join(missing)


def test_tarball_tests_import_only_what_is_shipped(built: dict) -> None:
    """tests/unit stays in the tarball for ansible-test: every `tests.*` module it imports must be there too."""
    members = set(built["members"])
    missing = []
    with tarfile.open(built["tarball"]) as tar:
        for name in sorted(m for m in members if m.startswith("tests/") and m.endswith(".py")):
            tree = ast.parse(tar.extractfile(name).read().decode("utf-8"), filename=name)
            for node in ast.walk(tree):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
                for module in modules:
                    if module.split(".")[0] != "tests":
                        continue
                    path = module.replace(".", "/")
                    if f"{path}.py" not in members and not any(m.startswith(f"{path}/") for m in members):
                        missing.append(f"{name}: imports {module}")
    assert not missing, "shipped tests import modules the tarball lacks:\n" + "\n".join(missing)


def test_galaxy_importer_accepts_the_tarball(built: dict) -> None:
    """galaxy-importer as Galaxy runs it (ansible-test off, offline): no ERROR, no WARNING, import completed."""
    importer = os.path.join(GALAXY_VENV, "bin", "python")
    assert os.path.isfile(importer), f"{GALAXY_VENV} is missing: run scripts/bootstrap"
    started = time.monotonic()
    env = clean_env(built["home"], os.path.join(GALAXY_VENV, "bin"), GALAXY_IMPORTER_CONFIG=IMPORTER_CFG)
    proc = sh([importer, "-m", "galaxy_importer.main", "--print-result", built["tarball"]], built["base"], env,
              timeout=900)
    elapsed = time.monotonic() - started
    out = proc.stdout
    start = out.find("\n{\n")  # --print-result: the result as indented JSON after the log
    assert start >= 0, f"galaxy-importer printed no result:\n{tail(out, 40)}"
    log, result = out[:start], out[start + 1:]
    problems = [line for line in log.splitlines() if re.search(r"\b(ERROR|WARNING|Traceback)\b", line)]
    print(f"\ngalaxy-importer: rc {proc.returncode} in {elapsed:.0f} s, {len(problems)} problem line(s)")
    assert proc.returncode == 0, f"galaxy-importer failed with rc={proc.returncode}:\n{tail(out, 80)}"
    assert not problems, "galaxy-importer reported:\n" + "\n".join(problems)
    assert "Importer processing completed successfully" in log, tail(out, 40)
    data = json.JSONDecoder().raw_decode(result)[0]
    blob = {(c["content_type"], c["content_name"]): c for c in data["docs_blob"]["contents"]}
    missing = [f"role {r} (README)" for r in ROLES if not (blob.get(("role", r)) or {}).get("readme_html")]
    missing += [f"module {m} (docs)" for m in MODULES if not (blob.get(("module", m)) or {}).get("doc_strings")]
    assert not missing, "galaxy-importer's result lacks: " + ", ".join(missing)
    assert data["docs_blob"]["collection_readme"]["html"], "no collection README"


@pytest.fixture(scope="module")
def installed(built: dict) -> dict:
    """The tarball installed into an empty collections path; ansible.posix resolves from the venv's site-packages
    (the offline route the README gives: the `ansible` package from PyPI)."""
    base = built["base"]
    path = os.path.join(base, "collections")
    proc = sh([os.path.join(BINDIR, "ansible-galaxy"), "collection", "install", "--offline", "-p", path,
               built["tarball"]], base, built["env"])
    out = ok(proc, "ansible-galaxy collection install")
    assert "ansible.posix" in out, f"ansible.posix (a dependency) was not resolved:\n{out}"
    tree = os.path.join(path, "ansible_collections", "gpufleet", "inference")
    assert os.path.isfile(os.path.join(tree, "MANIFEST.json")), out
    work = os.path.join(base, "work")  # an empty current directory: no ansible.cfg, no inventory of the checkout
    os.makedirs(work)
    env = dict(built["env"], ANSIBLE_COLLECTIONS_PATH=path)
    return {"tree": tree, "work": work, "env": env}


def snapshot(tree: str) -> dict:
    out = {}
    for dirpath, dirs, names in os.walk(tree):
        for name in dirs + names:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[os.path.relpath(path, tree)] = (st.st_size, st.st_mtime_ns)
    return out


def changed_paths(before: dict, after: dict) -> list[str]:
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))


def playbook(installed: dict, *args: str) -> str:
    started = time.monotonic()
    proc = sh([os.path.join(BINDIR, "ansible-playbook"), *args], installed["work"], installed["env"])
    print(f"\nansible-playbook {' '.join(args)}: rc {proc.returncode} in {time.monotonic() - started:.1f} s")
    return ok(proc, "ansible-playbook " + " ".join(args))


def test_every_playbook_resolves_by_fqcn(installed: dict) -> None:
    """gpufleet.inference.<name> for each playbook, and site's import_playbook paths inside the installed tree."""
    for name in PLAYBOOKS:
        out = playbook(installed, f"gpufleet.inference.{name}", "--syntax-check", "-i", "localhost,")
        assert f"{installed['tree']}/playbooks/{name}.yml" in out, out
    out = playbook(installed, "gpufleet.inference.site", "--list-tasks", "-i", "localhost,")
    for stage in ("Audit GPU hosts", "Tune the PCIe path", "Serve - NCCL settings", "Verify GPU hosts"):
        assert stage in out, f"gpufleet.inference.site does not import the stage {stage!r}:\n{tail(out, 40)}"


def _audit_target() -> str:
    """A PCI class prefix this machine has (a CI machine has no GPU): the first function that is no bridge."""
    for dev in sorted(glob.glob("/sys/bus/pci/devices/*")):
        with open(os.path.join(dev, "class"), encoding="ascii") as fh:
            cls = fh.read().strip()[2:4]
        if cls != "06":
            return cls
    pytest.skip("this machine shows no PCI function to audit")
    return ""


def _fleet_report_path(out: str) -> str:
    found = re.search(r"Fleet report: (\S+)/fleet\.md", out)
    assert found, f"the audit playbook did not say where the fleet report goes:\n{tail(out, 30)}"
    return found.group(1)


def test_audit_by_fqcn_writes_reports_outside_the_installed_collection(installed: dict, tmp_path) -> None:
    """The audit playbook by FQCN on localhost: in check mode nothing is written at all; for real, the reports land
    in gpufleet_report_dir and the installed collection's tree is left exactly as it was."""
    reports, host_dir = tmp_path / "reports", tmp_path / "host"
    extra = json.dumps({"gpufleet_report_dir": str(reports), "audit_host_dir": str(host_dir),
                        "audit_class_prefix": _audit_target()})
    before = snapshot(installed["tree"])
    out = playbook(installed, "gpufleet.inference.audit", "-c", "local", "-i", "localhost,", "--check", "-e", extra)
    assert _fleet_report_path(out) == str(reports)
    assert not reports.exists() and not host_dir.exists(), "check mode wrote files"
    assert changed_paths(before, snapshot(installed["tree"])) == [], "check mode wrote into the installed collection"

    out = playbook(installed, "gpufleet.inference.audit", "-c", "local", "-i", "localhost,", "-e", extra)
    assert _fleet_report_path(out) == str(reports)
    for name in ("fleet.md", "fleet.html", "localhost.json"):
        assert (reports / name).is_file(), f"{name} is not in {reports}: {sorted(os.listdir(reports))}"
    assert (host_dir / "pcie.json").is_file()
    written = changed_paths(before, snapshot(installed["tree"]))
    assert written == [], "the audit wrote into the installed collection:\n" + "\n".join(written)


def test_audit_by_fqcn_default_report_dir_is_outside_the_installed_collection(installed: dict) -> None:
    out = playbook(installed, "gpufleet.inference.audit", "-c", "local", "-i", "localhost,", "--check",
                   "-e", json.dumps({"audit_class_prefix": _audit_target()}))
    where = os.path.realpath(_fleet_report_path(out))
    tree = os.path.realpath(installed["tree"])
    assert os.path.commonpath([where, tree]) != tree, f"the fleet report would go to {where}, inside {tree}"

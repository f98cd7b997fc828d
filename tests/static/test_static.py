"""Static checks over the collection: ansible-test sanity, ansible-lint, shellcheck, changelog."""

from __future__ import annotations

import glob
import hashlib
import os
import shutil

import pytest

from tests.helpers import REPO, assert_ok, run

pytestmark = pytest.mark.static

CACHE = os.environ.get("GPUFLEET_CACHE", "/var/cache/gpufleet")


@pytest.fixture(scope="module")
def collection_copy() -> str:
    """ansible-test needs the collection under ansible_collections/<ns>/<name>: copy the
    tracked and untracked-but-not-ignored files there (what a clean clone would hold). One copy per
    checkout (keyed by its path), so that two worktrees checked at once never rsync over each other."""
    base = os.path.join(CACHE, "ansible-test", hashlib.sha256(os.path.realpath(REPO).encode()).hexdigest()[:12])
    dest = os.path.join(base, "ansible_collections", "gpufleet", "inference")
    os.makedirs(dest, exist_ok=True)
    files = run(["git", "ls-files", "-co", "--exclude-standard", "-z"])
    assert_ok(files, "git ls-files")
    listing = os.path.join(base, "files.lst")
    with open(listing, "w", encoding="utf-8") as fh:
        fh.write(files.stdout)
    assert_ok(run(["rsync", "-a", "--delete", "--delete-excluded", "--from0", f"--files-from={listing}", "./", dest + "/"]),
              "rsync to the ansible-test copy")
    # files deleted from the checkout must go from the copy too
    wanted = {p for p in files.stdout.split("\0") if p}
    for dirpath, _dirs, names in os.walk(dest):
        rel_dir = os.path.relpath(dirpath, dest)
        if rel_dir.split(os.sep)[0] == "tests" and rel_dir.startswith(os.path.join("tests", "output")):
            continue
        for name in names:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel not in wanted:
                os.unlink(os.path.join(dirpath, name))
    return dest


def test_ansible_test_sanity(collection_copy: str) -> None:
    """Every sanity test of ansible-core, with tests/sanity/ignore-*.txt empty."""
    for ignore in glob.glob(os.path.join(REPO, "tests", "sanity", "ignore-*.txt")):
        with open(ignore, encoding="utf-8") as fh:
            assert fh.read().strip() == "", f"{ignore} must stay empty: fix the code instead"
    proc = run(["ansible-test", "sanity", "--venv", "--python", "3.11", "--requirements", "--color", "no"],
               cwd=collection_copy, timeout=2400)
    assert_ok(proc, "ansible-test sanity", lines=120)


def test_ansible_lint_production() -> None:
    proc = run(["ansible-lint", "--profile", "production", "--offline", "--nocolor"], timeout=1200)
    assert_ok(proc, "ansible-lint --profile production", lines=120)


def test_shellcheck_scripts() -> None:
    """The controller and lab scripts have no extension, so ansible-test's shellcheck misses them."""
    scripts = [os.path.join(REPO, p) for p in ("scripts/bootstrap", "scripts/run-tests", "scripts/run-site",
                                               "scripts/lib.sh", "tests/containers/build-image", ".ci/run",
                                               "tests/tools/devbench/build")]
    scripts += sorted(glob.glob(os.path.join(REPO, "tests", "lab", "*.sh")))
    for extra in ("tests/lab/lab", "tests/lab/build-image"):
        path = os.path.join(REPO, extra)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                if "bash" in fh.readline():
                    scripts.append(path)
    existing = [s for s in scripts if os.path.isfile(s)]
    assert shutil.which("shellcheck"), "shellcheck is missing: scripts/bootstrap installs it"
    assert_ok(run(["shellcheck", "-x", "-S", "warning"] + existing), "shellcheck")


def test_changelog_lint() -> None:
    assert_ok(run(["antsibull-changelog", "lint"]), "antsibull-changelog lint")

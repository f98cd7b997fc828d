"""Documentation checks: antsibull-docs lints the plugin and role docs, ansible-doc renders every module
and role, and the variable tables in docs/roles/*.md match the roles' argument specs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.helpers import REPO, assert_ok, run

pytestmark = pytest.mark.static

BINDIR = os.path.dirname(sys.executable)
MODULES = sorted(name[:-3] for name in os.listdir(os.path.join(REPO, "plugins", "modules"))
                 if name.endswith(".py") and not name.startswith("_"))
ROLES = sorted(name for name in os.listdir(os.path.join(REPO, "roles"))
               if os.path.isfile(os.path.join(REPO, "roles", name, "meta", "argument_specs.yml")))
# ansible-doc runs in the checkout (its ansible.cfg finds the collection through .collections/)
DOC_ENV = {"PATH": BINDIR + os.pathsep + os.environ.get("PATH", ""), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}


@pytest.fixture(scope="module")
def collection_copy(tmp_path_factory) -> str:
    """antsibull-docs needs the collection under ansible_collections/gpufleet/inference: a private copy of the
    tracked and untracked-but-not-ignored files (what a clean clone would hold), never a shared cache."""
    dest = tmp_path_factory.mktemp("docs") / "ansible_collections" / "gpufleet" / "inference"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, stdout=subprocess.PIPE,
                           check=True, text=True).stdout
    for rel in filter(None, files.split("\0")):
        src = os.path.join(REPO, rel)
        if not os.path.lexists(src):
            continue  # deleted in the worktree, not yet in the index
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)
    return str(dest)


def test_antsibull_docs_lint(collection_copy: str) -> None:
    """The collection docs as the Ansible docsite would build them: schema, markup, references, RST."""
    proc = run([os.path.join(BINDIR, "antsibull-docs"), "lint-collection-docs", "--plugin-docs", "."],
               cwd=collection_copy, env=DOC_ENV, timeout=900)
    assert_ok(proc, "antsibull-docs lint-collection-docs --plugin-docs .")
    assert proc.stdout.strip() == "", f"antsibull-docs reported:\n{proc.stdout}"


def _rendered(kind: str, names: list[str]) -> str:
    proc = run([os.path.join(BINDIR, "ansible-doc"), "-t", kind] + [f"gpufleet.inference.{n}" for n in names],
               env=DOC_ENV, timeout=600)
    assert_ok(proc, f"ansible-doc -t {kind}")
    problems = [line for line in proc.stdout.splitlines() if line.startswith(("[WARNING]", "[ERROR]", "ERROR!"))]
    assert not problems, "\n".join(problems)
    return proc.stdout


def test_ansible_doc_renders_every_module() -> None:
    out = _rendered("module", MODULES)
    for name in MODULES:
        found = re.search(rf"^> MODULE \*?gpufleet\.inference\.{name}\*? ", out, re.M)
        assert found, f"ansible-doc did not render gpufleet.inference.{name}"
        section = out[found.end():].split("> MODULE ", 1)[0]
        for part in ("OPTIONS", "EXAMPLES:", "RETURN VALUES:"):
            assert part in section, f"gpufleet.inference.{name}: no {part} in ansible-doc's output"


def test_ansible_doc_renders_every_role() -> None:
    out = _rendered("role", ROLES)
    for name in ROLES:
        assert re.search(rf"^> ROLE: \*?gpufleet\.inference\.{name}\*? ", out, re.M), f"ansible-doc did not render role {name}"


def test_role_pages_exist_and_tables_are_current() -> None:
    """Every role has docs/roles/<role>.md whose variables table is what docs/tools/role_docs.py renders from
    meta/argument_specs.yml, and roles/<role>/README.md (what Galaxy shows) generated from that page.
    Fix with: .venv/bin/python docs/tools/role_docs.py --write"""
    proc = run([sys.executable, os.path.join(REPO, "docs", "tools", "role_docs.py"), "--check"])
    assert_ok(proc, "docs/tools/role_docs.py --check (run it with --write and commit the pages and READMEs)")
    for name in ROLES:
        path = os.path.join(REPO, "docs", "roles", f"{name}.md")
        assert os.path.isfile(path), f"role {name} has no page docs/roles/{name}.md"
        assert os.path.isfile(os.path.join(REPO, "roles", name, "README.md")), f"role {name} has no README.md"
    every_role = sorted(d for d in os.listdir(os.path.join(REPO, "roles")) if os.path.isdir(os.path.join(REPO, "roles", d)))
    assert every_role == ROLES, f"roles without meta/argument_specs.yml: {sorted(set(every_role) - set(ROLES))}"


def _repository() -> str:
    with open(os.path.join(REPO, "galaxy.yml"), encoding="utf-8") as fh:
        return str(yaml.safe_load(fh)["repository"]).rstrip("/")


# What Galaxy and Automation Hub render outside the repository: the collection's README and each role's.
GALAXY_PAGES = ["README.md"] + [f"roles/{name}/README.md" for name in ROLES]


def test_docs_links_resolve() -> None:
    """Markdown links in README.md, the role READMEs and docs/ point at files that exist: relative ones from the
    page, absolute ones into galaxy.yml's repository (<repository>/blob/main/<path>) in the checkout."""
    pages = [os.path.join(REPO, p) for p in GALAXY_PAGES]
    for dirpath, _dirs, names in os.walk(os.path.join(REPO, "docs")):
        pages += [os.path.join(dirpath, n) for n in names if n.endswith(".md")]
    into_repo = re.compile(re.escape(_repository()) + r"/(?:blob|tree)/main/([^#]+)")
    broken = []
    for page in pages:
        with open(page, encoding="utf-8") as fh:
            text = fh.read()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith("#"):
                continue
            if re.match(r"^[a-z]+:", target):
                own = into_repo.match(target)
                if not own:
                    continue
                path = os.path.join(REPO, own.group(1))
            else:
                path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#", 1)[0]))
            if not os.path.exists(path):
                broken.append(f"{os.path.relpath(page, REPO)}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_galaxy_pages_link_absolutely() -> None:
    """Galaxy shows README.md and the role READMEs away from the repository: a relative link there is dead. Link
    into galaxy.yml's repository instead (role READMEs: docs/tools/role_docs.py does it)."""
    relative = []
    for page in GALAXY_PAGES:
        with open(os.path.join(REPO, page), encoding="utf-8") as fh:
            text = fh.read()
        relative += [f"{page}: {t}" for t in re.findall(r"\]\(([^)\s]+)\)", text)
                     if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]
    assert not relative, "relative links in pages Galaxy renders:\n" + "\n".join(relative)


def test_no_placeholder_urls() -> None:
    """No URL into the reserved .invalid domain (example.invalid stood in for links that do not exist) in any file
    of the checkout: omit what does not exist. Example hosts in EXAMPLES (llm.example.com) are fine."""
    placeholder = re.compile(r"https?://[^\s\"'<>)/]*\.invalid\b")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, stdout=subprocess.PIPE,
                           check=True, text=True).stdout
    found = []
    for rel in filter(None, files.split("\0")):
        path = os.path.join(REPO, rel)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, 1):
                if placeholder.search(line):
                    found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "placeholder URLs:\n" + "\n".join(found)


def test_readme_starts_with_the_two_commands() -> None:
    """The first code block of README.md is the two-command block, unchanged."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    first = re.search(r"```[a-z]*\n(.*?)```", text, re.S)
    assert first, "README.md has no code block"
    commands = [line.split("#", 1)[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["scripts/run-site", "scripts/run-tests"], first.group(0)


def test_readme_table_names_every_module_and_role() -> None:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        table = "\n".join(line for line in fh if line.startswith("| "))
    missing = [f"module {m}" for m in MODULES if f"`{m}`" not in table]
    missing += [f"role {r}" for r in ROLES if f"`{r}`" not in table]
    assert not missing, "README.md's table of roles and modules lacks: " + ", ".join(missing)

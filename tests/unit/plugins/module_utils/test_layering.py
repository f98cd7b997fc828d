# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The folders of plugins/module_utils (docs/development.md, "Where the code is"), from the imports themselves
(parsed with ast, nothing is imported):

- every file sits in a topic folder, one level down; shared packages start with ``_``;
- two rules: a shared package imports shared packages only (``_pci`` may use ``_host``); a topic imports the shared
  packages, its own files, and the topics on its line of ALLOWED; no file imports a package (only names from files),
  and the files import each other without a cycle;
- the name rule: the executor of module M is ``<topic>/M.py``, one file for each module;
- no module_utils but ``_host/module.py`` (run_module) imports AnsibleModule, and none but ``_host/result.py``
  (finish) calls fail_json/exit_json; no module calls them below main();
- every module documents its ``actions`` as a list of dicts, each naming its verb in ``action``;
- the folder map in docs/development.md names every folder;
- the re-apply scripts (the PCIe boot unit's, the irq_affinity role's) carry exactly the import
  closure of their entry module_utils, in dependency order, as bundle.import_closure()
  computes it from the imports (checked here against this file's own walk of the import graph), the
  sources byte for byte; no role or vars file keeps a list of module_utils by hand; each module that
  writes a script imports (so ships, in its module run) everything that script carries.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.inference.plugins.module_utils._host import bundle
from ansible_collections.gpufleet.inference.plugins.module_utils.cpu import cpu_tuning as cpu_tuning_executor
from ansible_collections.gpufleet.inference.plugins.module_utils.cpu import reapply as cpu_reapply
from ansible_collections.gpufleet.inference.plugins.module_utils.irq import reapply as irq_reapply
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import reapply as pcie_reapply

REPO = Path(__file__).resolve().parents[4]
MODULE_UTILS = REPO / "plugins" / "module_utils"
PREFIX = "ansible_collections.gpufleet.inference.plugins.module_utils"
SHARED = {"_host": set(), "_pci": {"_host"}}
# The topics a topic may import besides the shared packages and itself.
ALLOWED = {
    "bench": {"pcie", "gpu"},   # a benchmark samples the PCIe links under load; the verdict weighs GPU health
    "gpu": {"pcie"},            # GPU health opens NVML where the PCIe reader does (pcie/nvml.py's session())
    "change": {"bench", "lease"},  # the change flow judges with the gate and renews the host lease
    "kernel": {"bench", "lease", "change"},  # the rollout is a kind of change: judged by the gate, under the lease
    "maintenance": {"bench"},   # a URL blocker speaks the benchmark's HTTP transport
    "pcie": {"lint"},           # the audit runs the host lint
    "tuning": {"bench"},        # measured stages are judged by the gate
    "vllm": {"bench", "change"},  # readiness speaks the benchmark's HTTP transport; the upgrade is a kind of change
    "irq": {"vfio"},            # a device bound to vfio-pci keeps no IRQ pinning
    "metrics": {"bench", "pcie"},  # the metrics read the audit's links, a benchmark's link findings and the verdicts
    # the driver's preflight is the kernel's apt parser and /boot sums; its verify reads GPUs with gpu_health's NVML
    # reader and Xids with the health audit's parser; the upgrade is a kind of change (its lock's package names too)
    "driver": {"kernel", "gpu", "pcie", "change"},
    # an NCCL settings change is a kind of change; its check first runs the host lint's NCCL rules on the candidate;
    # its verification reads vllm_ready's start-log findings as the vLLM upgrade does
    "nccl": {"change", "lint", "vllm"},
}


def name_of(path: Path) -> str:
    """``topic.file`` of a module_utils file."""
    return ".".join(path.relative_to(MODULE_UTILS).with_suffix("").parts)


def imports_of(path: Path) -> tuple[set[str], set[str]]:
    """(module_utils ``topic.file`` names, other ansible modules) that ``path`` imports, at any depth of the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    ours, ansible = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PREFIX or (node.module.startswith(PREFIX + ".") and node.module.count(".") == PREFIX.count(".") + 1):
                ours.update(f"{node.module[len(PREFIX) + 1:]}.{alias.name}".lstrip(".") for alias in node.names)
            elif node.module.startswith(PREFIX + "."):
                ours.add(node.module[len(PREFIX) + 1:])
            elif node.module.startswith("ansible."):
                ansible.add(node.module)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PREFIX + "."):
                    ours.add(alias.name[len(PREFIX) + 1:])
                elif alias.name.startswith("ansible."):
                    ansible.add(alias.name)
    return ours, ansible


def files() -> list[Path]:
    return sorted(p for p in MODULE_UTILS.rglob("*.py") if p.name != "__init__.py")


@functools.lru_cache(maxsize=None)
def graph() -> dict[str, set[str]]:
    return {name_of(p): imports_of(p)[0] for p in files()}


def closure(names, edges: dict[str, set[str]]) -> set[str]:
    out, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in out:
            out.add(name)
            todo.extend(edges.get(name, ()))
    return out


def modules() -> list[str]:
    """The modules with a main(): controller_files is an action plugin, its module file documents it only."""
    return sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py") if "\ndef main(" in p.read_text(encoding="utf-8"))


def test_every_file_sits_in_a_topic_folder():
    loose = sorted(p.name for p in MODULE_UTILS.glob("*.py") if p.name != "__init__.py")
    assert loose == [], "module_utils files go in a topic folder (docs/development.md, 'Where the code is')"
    deep = sorted(str(p.relative_to(MODULE_UTILS)) for p in files() if len(p.relative_to(MODULE_UTILS).parts) != 2)
    assert deep == []
    for folder in sorted(p for p in MODULE_UTILS.iterdir() if p.is_dir() and p.name != "__pycache__"):
        marker = folder / "__init__.py"
        assert marker.is_file() and marker.read_text(encoding="utf-8") == "", f"{folder.name}/__init__.py: empty package marker"


def test_two_rules_of_imports():
    wrong = []
    for name, deps in graph().items():
        topic = name.split(".")[0]
        for dep in sorted(deps):
            dep_topic = dep.split(".")[0]
            if dep not in graph():
                wrong.append(f"{name} imports {dep}, which is not a module_utils file")
            elif topic in SHARED and dep_topic != topic and dep_topic not in SHARED[topic]:
                wrong.append(f"{name}: the shared package {topic} imports {dep}")
            elif topic not in SHARED and dep_topic != topic and dep_topic not in SHARED and dep_topic not in ALLOWED.get(topic, ()):
                wrong.append(f"{name} imports {dep}: add {dep_topic} to {topic}'s line of ALLOWED, with why, or move the code")
    assert wrong == []


def test_no_import_cycle():
    state: dict[str, str] = {}

    def visit(name, chain):
        if state.get(name) == "done":
            return
        assert state.get(name) != "open", " -> ".join(chain + [name])
        state[name] = "open"
        for dep in sorted(graph().get(name, ())):
            visit(dep, chain + [name])
        state[name] = "done"
    for name in graph():
        visit(name, [])


def test_the_executor_of_module_m_is_topic_slash_m():
    where = {p.stem: [] for p in files()}
    for p in files():
        where[p.stem].append(name_of(p))
    wrong = [f"{m}: {where.get(m) or 'no <topic>/' + m + '.py'}" for m in modules() if len(where.get(m, [])) != 1]
    assert wrong == []


def test_module_utils_never_use_ansible_module():
    wrong = []
    for path in files():
        _ours, ansible = imports_of(path)
        if "ansible.module_utils.basic" in ansible and name_of(path) != "_host.module":
            wrong.append(f"{name_of(path)} imports ansible.module_utils.basic (only _host/module.py's run_module may)")
        if "_host.module" in _ours:  # executors take a Host (_host/host.py), filters and re-apply scripts import them
            wrong.append(f"{name_of(path)} imports _host/module.py, which loads AnsibleModule: only modules call run_module()")
        text = path.read_text(encoding="utf-8")
        code = re.sub(r'(?s)""".*?"""', "", text)  # docstrings may name them
        if name_of(path) != "_host.result" and re.search(r"\.(fail_json|exit_json)\(", code):
            wrong.append(f"{name_of(path)} calls fail_json/exit_json (only _host/result.py's finish() may)")
    assert wrong == []


def test_modules_fail_only_in_main():
    """fail_json/exit_json are called in a module's main() (or through hostfs.finish) only: the code below
    raises, so that a failure never exits from the middle of a helper."""
    wrong = []
    for path in sorted((REPO / "plugins" / "modules").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name != "main":
                calls = [n.lineno for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr in ("fail_json", "exit_json")]
                if calls:
                    wrong.append(f"{path.name}: {node.name} calls fail_json/exit_json (lines {calls})")
    assert wrong == []


def test_every_module_documents_its_actions_as_dicts_of_one_schema():
    """``actions`` are dicts (docs/development.md, "The module skeleton"): every module's RETURN documents them as a
    list of dicts returned always, and each entry of its sample names its verb in ``action`` and holds no file
    contents. What the modules really return is checked on every run through uthelper (check_actions)."""
    wrong = []
    for path in sorted((REPO / "plugins" / "modules").glob("*.py")):
        if path.stem == "__init__":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        ret = next((n.value.value for n in tree.body if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", "") == "RETURN" for t in n.targets)), "")
        actions = (yaml.safe_load(ret) or {}).get("actions")
        if not isinstance(actions, dict):
            wrong.append(f"{path.name}: RETURN documents no actions")
            continue
        shape = (actions.get("returned"), actions.get("type"), actions.get("elements"))
        if shape != ("always", "list", "dict"):
            wrong.append(f"{path.name}: actions are documented as returned {shape[0]}, {shape[1]} of {shape[2]}, "
                         "not returned always, list of dict")
        for entry in actions.get("sample") or []:
            if not isinstance(entry, dict) or not isinstance(entry.get("action"), str) or "content" in entry:
                wrong.append(f"{path.name}: sample action {entry!r} is not a dict with a verb in 'action' and no 'content'")
    assert wrong == []


def test_the_folder_map_in_the_development_guide_names_every_folder():
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    section = text.split("## Where the code is", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^- `([\w]+)/`", section, re.M))
    folders = {p.name for p in MODULE_UTILS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert listed == folders


# The re-apply scripts: entry module_utils -> (its script, the modules that write it or the role that copies it).
SCRIPTS = {
    "pcie.reapply": (pcie_reapply.render_script, ["pcie_payload", "pcie_acs"]),
    "irq.reapply": (irq_reapply.render_script, ["irq_affinity"]),
    "cpu.reapply": (cpu_reapply.render_script, ["cpu_tuning"]),
    "cpu.pm_qos": (cpu_tuning_executor.render_holder, ["cpu_tuning"]),  # the PM QoS holder (not a re-apply)
}


def dependency_ordered(names: list[str]) -> list[str]:
    """Where a name comes before a module_utils it imports (empty when ``names`` is in dependency order)."""
    wrong, seen = [], set()
    for name in names:
        if graph()[name] - seen:
            wrong.append(f"{name} before {sorted(graph()[name] - seen)}")
        seen.add(name)
    return wrong


def test_the_closure_is_computed_from_the_imports():
    sources = {name: (MODULE_UTILS / (name.replace(".", "/") + ".py")).read_text(encoding="utf-8") for name in graph()}
    for entry in SCRIPTS:
        computed = bundle.import_closure(sources, [entry])
        assert sorted(computed) == sorted(closure([entry], graph())), entry
        assert dependency_ordered(computed) == [], entry
        assert bundle.loaded_sources([entry]) == {name: sources[name] for name in computed}
    # a closure can only be computed, never assumed: a missing file and a cycle are errors that say so
    with pytest.raises(bundle.BundleError, match="imports module_utils _pci.topology, whose source is not given"):
        bundle.import_closure({k: v for k, v in sources.items() if k != "_pci.topology"}, ["irq.reapply"])
    cycle = {"t.a": f"from {PREFIX}.t.b import y\n", "t.b": f"from {PREFIX}.t.a import x\n"}
    with pytest.raises(bundle.BundleError, match="t.a -> t.b -> t.a"):
        bundle.import_closure(cycle, ["t.a"])
    assert bundle.import_closure({"t.a": f"from {PREFIX}.t import b as bee\n", "t.b": ""}, ["t.a"]) == ["t.b", "t.a"]
    with pytest.raises(bundle.BundleError, match="imports a topic package, not a file"):
        bundle.import_closure({"t.a": f"from {PREFIX} import t\n"}, ["t.a"])


@pytest.mark.parametrize("entry", sorted(SCRIPTS))
def test_each_script_carries_exactly_the_closure_of_its_entry(entry):
    render, _writers = SCRIPTS[entry]
    carried = bundle.bundled_sources(render("/usr/bin/python3"))
    assert sorted(carried) == sorted(closure([entry], graph()))
    assert dependency_ordered(list(carried)) == []
    for name, source in carried.items():  # the collection's own files, byte for byte: one capability walk, one apply loop
        assert source == (MODULE_UTILS / (name.replace(".", "/") + ".py")).read_text(encoding="utf-8"), name
    if entry.endswith(".reapply"):
        assert {"_pci.config", "_host.device_apply", "_host.files"} <= set(carried)
    else:  # the holder is the standard library and its own file (with the unit renderer)
        assert set(carried) == {entry, "_host.units"}


@pytest.mark.parametrize("entry", sorted(SCRIPTS))
def test_the_modules_that_write_a_script_ship_what_it_carries(entry):
    """A module run holds only the module_utils its module imports (AnsiballZ), and the module renders the
    script from those: each writer's closure holds the script's."""
    _render, writers = SCRIPTS[entry]
    for module in writers:
        ours = imports_of(REPO / "plugins" / "modules" / f"{module}.py")[0]
        assert closure([entry], graph()) <= closure(ours, graph()), module


def test_no_list_of_module_utils_is_kept_by_hand():
    """The roles ship module_utils through the reapply_script lookup only: no vars file or task names a module_utils file."""
    names = {name.split(".")[-1] for name in graph()}
    wrong = []
    for path in sorted((REPO / "roles").glob("*/**/*.yml")):
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
        strings = []

        def walk(node):
            if isinstance(node, dict):
                for value in node.values():
                    walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)
            elif isinstance(node, str):
                strings.append(node)
        walk(data)
        found = sorted({s for s in strings if Path(s).stem in names and s.endswith(".py")} |
                       set(re.findall(r"plugins/module_utils/(\w+)", text)))
        if found:
            wrong.append(f"{path.relative_to(REPO)}: {found}")
    assert wrong == []
    # the irq_affinity role has the module install its script (install_reapply), from the module run's own module_utils
    irq_tasks = (REPO / "roles" / "irq_affinity" / "tasks" / "main.yml").read_text(encoding="utf-8")
    assert irq_tasks.count("gpufleet.inference.reapply_script") == 0 and irq_tasks.count("install_reapply: true") == 1


def test_every_module_ends_through_run_module():
    """The one shape: a module's main() is one call of run_module(ModuleSpec(...), execute) (docs/development.md,
    "The module skeleton"), the executor imported from <topic>/<module>.py."""
    wrong = []
    for name in modules():
        tree = ast.parse((REPO / "plugins" / "modules" / f"{name}.py").read_text(encoding="utf-8"))
        main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
        body = [n for n in main.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        call = body[0].value if len(body) == 1 and isinstance(body[0], ast.Expr) else None
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "run_module"):
            wrong.append(f"{name}: main() is not one run_module() call")
            continue
        executor = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module
                    and n.module.endswith(f".{name}") and any(a.name == "execute" for a in n.names)]
        if not executor:
            wrong.append(f"{name}: execute is not imported from <topic>/{name}.py")
    assert wrong == []


def test_no_function_in_plugins_is_long_or_takes_many_parameters():
    """Short functions with few parameters: at most 80 lines and 12 parameters (self and cls not counted)."""
    wrong = []
    for path in sorted((REPO / "plugins").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
                count = len([n for n in names if n not in ("self", "cls")]) + bool(args.vararg) + bool(args.kwarg)
                lines = node.end_lineno - node.lineno + 1
                if lines > 80 or count > 12:
                    wrong.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines} lines, {count} parameters")
    assert wrong == []

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The layering of plugins/module_utils (docs/development.md, "Layers of module_utils"), from the
imports themselves (parsed with ast, nothing is imported):

- every module_utils file has a layer, and imports module_utils of lower layers only (no cycles,
  no reaching up);
- no module_utils imports AnsibleModule or calls fail_json/exit_json, and no module calls them below main();
- every module documents its ``actions`` as a list of dicts, each naming its verb in ``action``;
- the layer table in docs/development.md is this one;
- the re-apply scripts (the PCIe boot unit's, the irq_affinity role's) carry exactly the import
  closure of their entry module_utils, in dependency order, as reapply_bundle.import_closure()
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

from ansible_collections.gpufleet.inference.plugins.module_utils import irq_reapply, pcie_boot_apply, reapply_bundle

REPO = Path(__file__).resolve().parents[4]
MODULE_UTILS = REPO / "plugins" / "module_utils"
PREFIX = "ansible_collections.gpufleet.inference.plugins.module_utils"

# Layer -> module_utils. A file imports module_utils of lower layers only.
LAYERS = {
    0: ["device_apply", "gate_stats", "hostfs", "hostcmd", "inference_transport", "reapply_bundle"],
    1: ["audit_report", "bench_history", "grub", "host_lease", "host_lint", "inference_metrics", "link_samples", "managed_files", "nccl_env",
        "output_equivalence", "output_prompts", "pci_config", "pcie_aspm", "pcie_boot", "pcie_p2p", "reboot_contract", "svg_chart",
        "throughput_gate", "vllm_args", "vllm_preflight", "vllm_startlog"],
    2: ["bench_changepoint", "health_compare", "inference_sweep", "kernel_cmdline", "kernel_upgrade", "kernel_upgrade_flow",
        "nccl_env_files", "pci_topology", "pcie_state", "tune_measured", "vllm_flag_stages", "vllm_ready",
        "vllm_service_files"],
    3: ["history_report", "hugepages", "inference_client", "irq_affinity", "kernel_boot_entry", "kernel_upgrade_journal",
        "kernel_upgrade_report", "load_monitor", "nvml", "output_equivalence_run", "pcie_acs", "pcie_findings", "pcie_payload", "pcie_users",
        "stage_table", "vfio"],
    4: ["bench_history_apply", "benchmark_run", "boot_health", "irq_pinning", "irq_reapply", "kernel_cmdline_apply", "kernel_rollout_apply",
        "kernel_upgrade_preflight", "pcie_audit", "pcie_boot_apply", "vfio_bind"],
    5: ["irq_boot", "pcie_acs_apply", "pcie_payload_apply"],
}
LAYER = {name: layer for layer, names in LAYERS.items() for name in names}


def imports_of(path: Path) -> tuple[set[str], set[str]]:
    """(module_utils names, other ansible modules) that ``path`` imports, at any depth of the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    ours, ansible = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PREFIX:
                ours.update(alias.name for alias in node.names)
            elif node.module.startswith(PREFIX + "."):
                ours.add(node.module[len(PREFIX) + 1:].split(".")[0])
            elif node.module.startswith("ansible."):
                ansible.add(node.module)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PREFIX + "."):
                    ours.add(alias.name[len(PREFIX) + 1:].split(".")[0])
                elif alias.name.startswith("ansible."):
                    ansible.add(alias.name)
    return ours, ansible


@functools.lru_cache(maxsize=None)
def graph() -> dict[str, set[str]]:
    return {p.stem: imports_of(p)[0] for p in sorted(MODULE_UTILS.glob("*.py")) if p.stem != "__init__"}


def closure(names, edges: dict[str, set[str]]) -> set[str]:
    out, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in out:
            out.add(name)
            todo.extend(edges.get(name, ()))
    return out


def test_every_module_utils_file_has_a_layer():
    files = set(graph())
    assert files - set(LAYER) == set(), "new module_utils: give them a layer here and in docs/development.md"
    assert set(LAYER) - files == set(), "module_utils listed here that no longer exist"


def test_module_utils_import_only_lower_layers():
    wrong = []
    for name, deps in graph().items():
        for dep in sorted(deps):
            if dep not in LAYER:
                wrong.append(f"{name} imports {dep}, which is not a module_utils file")
            elif LAYER[dep] >= LAYER[name]:
                wrong.append(f"{name} (layer {LAYER[name]}) imports {dep} (layer {LAYER[dep]})")
    assert wrong == []


def test_module_utils_never_use_ansible_module():
    wrong = []
    for path in sorted(MODULE_UTILS.glob("*.py")):
        _ours, ansible = imports_of(path)
        if "ansible.module_utils.basic" in ansible:
            wrong.append(f"{path.name} imports ansible.module_utils.basic")
        text = path.read_text(encoding="utf-8")
        code = re.sub(r'(?s)""".*?"""', "", text)  # docstrings may name them
        if path.name != "hostfs.py" and re.search(r"\.(fail_json|exit_json)\(", code):
            wrong.append(f"{path.name} calls fail_json/exit_json (only a module's main() may)")
    # hostfs.finish() is the one shared end of a module run: it is what main() calls.
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


def test_the_layer_table_in_the_development_guide_is_this_one():
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    section = text.split("## Layers of module_utils", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| (\d) \| [^|]+ \| ([^|]+) \|$", section, re.M))
    assert {int(k): sorted(v.replace("`", "").replace(" ", "").split(",")) for k, v in rows.items()} == \
        {k: sorted(v) for k, v in LAYERS.items()}


# The re-apply scripts: entry module_utils -> (its script, the modules that write it or the role that copies it).
SCRIPTS = {
    "pcie_boot_apply": (pcie_boot_apply.render_script, ["pcie_payload", "pcie_acs"]),
    "irq_reapply": (irq_reapply.render_script, ["irq_affinity"]),
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
    sources = {name: (MODULE_UTILS / f"{name}.py").read_text(encoding="utf-8") for name in graph()}
    for entry in SCRIPTS:
        computed = reapply_bundle.import_closure(sources, [entry])
        assert sorted(computed) == sorted(closure([entry], graph())), entry
        assert dependency_ordered(computed) == [], entry
        assert reapply_bundle.loaded_sources([entry]) == {name: sources[name] for name in computed}
    # a closure can only be computed, never assumed: a missing file and a cycle are errors that say so
    with pytest.raises(reapply_bundle.BundleError, match="irq_affinity imports module_utils pci_topology, whose source is not given"):
        reapply_bundle.import_closure({k: v for k, v in sources.items() if k != "pci_topology"}, ["irq_reapply"])
    cycle = {"a": f"from {PREFIX} import b\n", "b": f"from {PREFIX}.a import x\n"}
    with pytest.raises(reapply_bundle.BundleError, match="a -> b -> a"):
        reapply_bundle.import_closure(cycle, ["a"])


@pytest.mark.parametrize("entry", sorted(SCRIPTS))
def test_each_script_carries_exactly_the_closure_of_its_entry(entry):
    render, _writers = SCRIPTS[entry]
    carried = reapply_bundle.bundled_sources(render("/usr/bin/python3"))
    assert sorted(carried) == sorted(closure([entry], graph()))
    assert dependency_ordered(list(carried)) == []
    for name, source in carried.items():  # the collection's own files, byte for byte: one capability walk, one apply loop
        assert source == (MODULE_UTILS / f"{name}.py").read_text(encoding="utf-8"), name
    assert {"pci_config", "device_apply", "hostfs"} <= set(carried)


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
    names = set(graph())
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

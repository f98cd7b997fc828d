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
- the module_utils the irq_affinity role copies to the host are exactly the import closure of the
  module_utils its re-apply script imports;
- the boot-time applier of pcie_boot (stdlib only, Python 3.6, so it cannot import module_utils)
  finds the PCI Express and ACS capabilities where pci_config does, on every captured and
  synthetic config space.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import yaml

from ansible_collections.gpufleet.inference.plugins.module_utils import pcie_boot
from ansible_collections.gpufleet.inference.plugins.module_utils.pci_config import decode_config
from tests.unit.fakesysfs import FIXTURES, load_capture, payload_switch, two_gpus_one_switch, two_numa_nodes

REPO = Path(__file__).resolve().parents[4]
MODULE_UTILS = REPO / "plugins" / "module_utils"
PREFIX = "ansible_collections.gpufleet.inference.plugins.module_utils"

# Layer -> module_utils. A file imports module_utils of lower layers only.
LAYERS = {
    0: ["gate_stats", "hostfs", "hostcmd", "inference_transport"],
    1: ["audit_report", "bench_history", "grub", "host_lease", "inference_metrics", "nccl_env", "pci_config",
        "pcie_aspm", "pcie_boot", "pcie_p2p", "reboot_contract", "svg_chart", "throughput_gate", "vllm_args",
        "vllm_preflight", "vllm_ready", "vllm_startlog"],
    2: ["bench_changepoint", "health_compare", "inference_sweep", "kernel_cmdline", "kernel_upgrade", "kernel_upgrade_flow",
        "pci_topology", "pcie_state", "tune_measured", "vllm_flag_stages"],
    3: ["history_report", "hugepages", "inference_client", "irq_affinity", "kernel_upgrade_journal",
        "kernel_upgrade_report", "load_monitor", "nvml", "pcie_acs", "pcie_findings", "pcie_payload", "pcie_users",
        "stage_table", "vfio"],
    4: ["bench_history_apply", "boot_health", "irq_pinning", "kernel_cmdline_apply", "kernel_rollout_apply",
        "kernel_upgrade_preflight", "pcie_acs_apply", "pcie_audit", "pcie_payload_apply", "vfio_bind"],
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


def test_irq_affinity_ships_the_import_closure_of_its_script():
    script = REPO / "roles" / "irq_affinity" / "files" / "gpufleet-irq-affinity-apply.py"
    direct = imports_of(script)[0]
    want = closure(direct, graph())
    shipped = yaml.safe_load((REPO / "roles" / "irq_affinity" / "vars" / "main.yml").read_text())["__irq_affinity_module_utils"]
    assert sorted(Path(n).stem for n in shipped) == sorted(want)
    # copied in dependency order, so that a partial copy never leaves a file whose imports are missing
    seen: set[str] = set()
    for name in (Path(n).stem for n in shipped):
        assert graph()[name] <= seen, f"{name} is copied before {sorted(graph()[name] - seen)}"
        seen.add(name)


def applier():
    namespace: dict = {"__name__": "gpufleet_pcie_payload_apply"}
    exec(compile(pcie_boot.APPLY_SCRIPT_BODY, "gpufleet-pcie-payload-apply", "exec"), namespace)  # pylint: disable=exec-used
    return namespace


def config_files(tmp_path: Path) -> list[Path]:
    roots = []
    for capture in sorted(p.name for p in FIXTURES.iterdir() if (p / "capture.json").exists()):
        roots.append(load_capture(capture, tmp_path / capture))
    payload_switch(tmp_path / "switch", nic=True)
    two_gpus_one_switch(tmp_path / "acs", acs=True)
    two_numa_nodes(tmp_path / "numa")
    roots += [tmp_path / "switch", tmp_path / "acs", tmp_path / "numa"]
    return sorted({p.resolve() for root in roots for p in Path(root).glob("sys/bus/pci/devices/*/config")})


def test_the_boot_applier_finds_the_capabilities_where_pci_config_does(tmp_path):
    ns = applier()
    files = config_files(tmp_path)
    assert len(files) > 20
    seen_acs = 0
    for path in files:
        data = path.read_bytes()
        cfg = decode_config(data)
        pcie = cfg["pcie"]["offset"] if cfg["pcie"] else None
        acs = cfg["acs"]["offset"] if cfg["acs"] else None
        assert ns["pcie_offset"](data[:256]) == pcie, path
        if len(data) > 256:
            assert ns["acs_offset"](data) == acs, path
            seen_acs += acs is not None
    assert seen_acs > 0

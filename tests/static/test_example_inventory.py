"""inventories/example: it parses, every variable it sets belongs to a role of this collection (with the documented
type and choices, checked here and by Ansible's own argument validation), the hardware profiles are complete, and no
example allows a reboot."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.helpers import REPO, assert_ok, run

pytestmark = pytest.mark.static

INVENTORY = os.path.join(REPO, "inventories", "example")
PROFILES = ("gpu_consumer_2x", "gpu_server_8x")
# Variables the playbooks read (playbooks/audit.yml) that are no role's: keep this list short.
PLAYBOOK_VARS = {"gpufleet_hosts", "gpufleet_report_dir", "gpufleet_benchmark_dir"}
ALLOWED_PREFIXES = ("ansible_", "vault_")


def role_options() -> dict[str, dict]:
    """Every role variable of the collection, from the roles' argument specs (all entry points)."""
    options: dict[str, dict] = {}
    for path in sorted(glob.glob(os.path.join(REPO, "roles", "*", "meta", "argument_specs.yml"))):
        with open(path, encoding="utf-8") as fh:
            specs = (yaml.safe_load(fh) or {}).get("argument_specs") or {}
        for entry in specs.values():
            options.update((entry or {}).get("options") or {})
    return options


def _vars_files() -> dict[str, dict]:
    """Each file of group_vars/ and host_vars/ that Ansible reads (YAML, no .example), with its variables."""
    out = {}
    for kind in ("group_vars", "host_vars"):
        for path in sorted(glob.glob(os.path.join(INVENTORY, kind, "**"), recursive=True)):
            if os.path.isfile(path) and os.path.splitext(path)[1] in (".yml", ".yaml", ".json", ""):
                with open(path, encoding="utf-8") as fh:
                    out[os.path.relpath(path, INVENTORY)] = yaml.safe_load(fh) or {}
    return out


def _hosts_yml_vars(node: dict, where: str = "hosts.yml") -> dict[str, dict]:
    """Variables set on groups and hosts inside hosts.yml."""
    out: dict[str, dict] = {}
    for group, body in (node or {}).items():
        body = body or {}
        if body.get("vars"):
            out[f"{where}: group {group}"] = body["vars"]
        for host, hvars in (body.get("hosts") or {}).items():
            if hvars:
                out[f"{where}: host {host}"] = hvars
        out.update(_hosts_yml_vars(body.get("children") or {}, where))
    return out


def all_settings() -> dict[str, dict]:
    with open(os.path.join(INVENTORY, "hosts.yml"), encoding="utf-8") as fh:
        hosts = yaml.safe_load(fh)
    return {**_vars_files(), **_hosts_yml_vars(hosts)}


BINDIR = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def inventory_copy(tmp_path_factory) -> str:
    """A copy of the tracked files: a local (encrypted) vault.yml stays out."""
    copy = tmp_path_factory.mktemp("inv") / "example"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z", "inventories/example"], cwd=REPO,
                            stdout=subprocess.PIPE, check=True, text=True).stdout
    for rel in filter(None, listed.split("\0")):
        target = copy / os.path.relpath(rel, "inventories/example")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(REPO, rel), target)
    return str(copy)


@pytest.fixture(scope="module")
def inventory(inventory_copy: str) -> dict:
    """ansible-inventory --list, with unparsed files and warnings as failures."""
    proc = run([os.path.join(BINDIR, "ansible-inventory"), "-i", inventory_copy, "--list"],
               env={"ANSIBLE_NOCOLOR": "1", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "True",
                    "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True"})
    assert_ok(proc, "ansible-inventory -i inventories/example --list")
    warnings = [line for line in proc.stdout.splitlines() if line.startswith(("[WARNING]", "[ERROR]"))]
    assert not warnings, "\n".join(warnings)
    return json.loads(proc.stdout[proc.stdout.index("{"):])


def test_inventory_parses_with_the_profiles(inventory: dict) -> None:
    groups = set(inventory) - {"_meta"}
    for group in (*PROFILES, "gpu_hosts", "vfio_hosts", "canary"):
        assert group in groups, f"group {group} is missing"
    gpu_hosts = set(inventory["gpu_hosts"].get("hosts", []))
    for child in inventory["gpu_hosts"]["children"]:
        gpu_hosts |= set(inventory[child].get("hosts", []))
    for host in gpu_hosts:
        profiles = [p for p in PROFILES if host in inventory[p].get("hosts", [])]
        assert len(profiles) == 1, f"{host} must be in exactly one hardware profile, is in {profiles}"
    hostvars = inventory["_meta"]["hostvars"]
    for host in gpu_hosts:
        assert hostvars[host].get("vllm_service_model"), f"{host}: vllm_service_model (required) is not set"


def test_every_variable_is_a_role_variable() -> None:
    known = role_options()
    unknown = []
    for where, variables in all_settings().items():
        for name in variables:
            if name in known or name in PLAYBOOK_VARS or name.startswith(ALLOWED_PREFIXES):
                continue
            unknown.append(f"{where}: {name}")
    assert not unknown, ("variables that no role's meta/argument_specs.yml declares (typo, or a variable of a role "
                         "that does not exist):\n" + "\n".join(unknown))


def _type_ok(value, option: dict) -> bool:
    kind = option.get("type", "str")
    checks = {
        "bool": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "path": lambda v: isinstance(v, str),
        "list": lambda v: isinstance(v, list),
        "dict": lambda v: isinstance(v, dict),
        "raw": lambda v: True,
    }
    if not checks.get(kind, lambda v: True)(value):
        return False
    if kind == "list" and option.get("elements") in checks:
        return all(checks[option["elements"]](v) or isinstance(v, str) and "{{" in v for v in value)
    return True


def test_values_have_the_documented_type_and_choices() -> None:
    known = role_options()
    wrong = []
    for where, variables in all_settings().items():
        for name, value in variables.items():
            option = known.get(name)
            if option is None or value is None or isinstance(value, str) and "{{" in value:
                continue  # templated values are checked by the role's own argument validation at run time
            if not _type_ok(value, option):
                wrong.append(f"{where}: {name}={value!r} is not of type {option.get('type', 'str')}")
            choices = option.get("choices")
            if choices:
                values = value if isinstance(value, list) else [value]
                bad = [v for v in values if v not in choices]
                if bad:
                    wrong.append(f"{where}: {name}={value!r}: {bad} not in {choices}")
    assert not wrong, "\n".join(wrong)


def test_no_example_allows_a_reboot() -> None:
    """Every <role>_reboot_ok the roles know is set to false in group_vars/all (or, for a role whose example is
    commented out, named in a comment there), and no file of the example sets one true."""
    with open(os.path.join(INVENTORY, "group_vars", "all", "main.yml"), encoding="utf-8") as fh:
        text = fh.read()
    all_vars = yaml.safe_load(text)
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    for name in (n for n in role_options() if n.endswith("_reboot_ok")):
        assert all_vars.get(name) is False or re.search(rf"\b{name}\b", comments), \
            f"{name} is not set (false) in group_vars/all/main.yml"
    for where, variables in all_settings().items():
        for name, value in variables.items():
            assert not (name.endswith("_reboot_ok") and value is not False), f"{where}: {name}={value!r}"


def test_kernel_pin_and_vault_are_examples_only() -> None:
    with open(os.path.join(INVENTORY, "group_vars", "all", "main.yml"), encoding="utf-8") as fh:
        text = fh.read()
    assert re.search(r"^# kernel_upgrade_target: ", text, re.M), "the kernel pin example is missing"
    settings = all_settings()
    for where, variables in settings.items():
        for name in ("vllm_service_api_key", "inference_benchmark_api_key"):
            if name in variables:
                assert variables[name] == "{{ vault_vllm_api_key }}", f"{where}: {name} must come from the vault"
        assert not any(n.startswith("vault_") for n in variables), f"{where}: a vault_* value in clear text"
    with open(os.path.join(INVENTORY, "group_vars", "all", "vault.yml.example"), encoding="utf-8") as fh:
        example = yaml.safe_load(fh)
    # the placeholder must fail vllm_service's key check, so an unedited copy can never serve
    assert not re.fullmatch(r"[A-Za-z0-9._~+/=-]{16,}", example["vault_vllm_api_key"])


def test_roles_accept_the_values(inventory_copy: str, tmp_path) -> None:
    """Ansible's own argument validation (ansible.builtin.validate_argument_spec, what each role runs first) over every
    GPU host's resolved variables, role by role: types, choices and required options, after templating."""
    tasks = []
    for path in sorted(glob.glob(os.path.join(REPO, "roles", "*", "meta", "argument_specs.yml"))):
        role = path.split(os.sep)[-3]
        with open(path, encoding="utf-8") as fh:
            spec = yaml.safe_load(fh)["argument_specs"]["main"]["options"]
        tasks.append({
            "name": f"Validate the {role} role's variables",
            "ansible.builtin.validate_argument_spec": {
                "argument_spec": spec,
                "provided_arguments": "{{ dict(__names | zip(__names | map('extract', hostvars[inventory_hostname]))) }}",
            },
            "vars": {"__names": "{{ %r | select('in', hostvars[inventory_hostname]) | list }}" % sorted(spec)},
        })
    play = tmp_path / "validate.yml"
    play.write_text(yaml.safe_dump([{"name": "Validate the example inventory against the roles' argument specs",
                                     "hosts": "gpu_hosts", "connection": "local", "gather_facts": False,
                                     "tasks": tasks}], sort_keys=False))
    proc = run([os.path.join(BINDIR, "ansible-playbook"), "-i", inventory_copy, str(play),
                # a well-formed stand-in for the vault's key (the real one is encrypted and not in the repository)
                "-e", "vault_vllm_api_key=exampleexampleexampleexample0123",
                # the kernel pin is commented out in the example (kernels are left alone until a user pins one), but
                # the kernel_upgrade role requires it: validate with the example's own value
                "-e", "kernel_upgrade_target=6.1.0-56-amd64",
                # the same for the vLLM version move (vllm_upgrade requires its target version)
                "-e", "vllm_upgrade_version=0.26.1"],
               cwd=str(tmp_path), env={"ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
                                       "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default"}, timeout=600)
    assert_ok(proc, "validate_argument_spec over inventories/example", lines=60)
    assert "failed=0" in proc.stdout and "unreachable=0" in proc.stdout


# ---- hosts that deliberately run no service ---------------------------------------------------------------
SERVICE_MODULES = ("gpufleet.inference.vllm_ready",)
SERVICE_ROLES = ("gpufleet.inference.inference_benchmark",)


def _when(node: dict) -> list[str]:
    when = node.get("when")
    return [str(w) for w in (when if isinstance(when, list) else [when] if when is not None else [])]


def _talks_to_service(task: dict) -> bool:
    """vllm_ready, the inference_benchmark role, or a step run between the drain hooks (tasks/disruptive.yml's
    ``__gpufleet_step_tasks``) whose task file holds one of them."""
    include = task.get("ansible.builtin.include_role") or task.get("ansible.builtin.import_role") or {}
    if any(m in task for m in SERVICE_MODULES) or include.get("name") in SERVICE_ROLES:
        return True
    step = (task.get("vars") or {}).get("__gpufleet_step_tasks")
    if not step:
        return False
    with open(os.path.join(REPO, "playbooks", "tasks", step), encoding="utf-8") as fh:
        return any(_talks_to_service(t) for t in yaml.safe_load(fh) or [])


def service_tasks(playbook: str) -> list[tuple[str, list[str]]]:
    """(task name, conditions of the task and its blocks, outermost first) of every task of ``playbook``
    that talks to the running vLLM service: vllm_ready, or the inference_benchmark role, directly or as the step of
    tasks/disruptive.yml."""
    with open(os.path.join(REPO, playbook), encoding="utf-8") as fh:
        plays = yaml.safe_load(fh)
    out = []

    def walk(tasks, chain):
        for task in tasks or []:
            here = chain + _when(task)
            if "block" in task:
                walk(task["block"], here)
                continue
            if _talks_to_service(task):
                out.append((f"{playbook}: {task.get('name')}", here))

    for play in plays:
        walk(play.get("pre_tasks"), _when(play))
        walk(play.get("tasks"), _when(play))
        walk(play.get("post_tasks"), _when(play))
    return out


def skipped(conditions: list[str], hostvars: dict) -> bool | None:
    """True when one of the conditions is false for these variables (Ansible's own conditional evaluation);
    None when none could be decided without run-time values (registered results)."""
    from ansible.parsing.dataloader import DataLoader  # pylint: disable=import-outside-toplevel
    from ansible.template import Templar, trust_as_template  # pylint: disable=import-outside-toplevel

    templar = Templar(loader=DataLoader(), variables=dict(hostvars, ansible_check_mode=False))
    undecided = False
    for cond in conditions:
        try:
            if not templar.evaluate_conditional(trust_as_template(cond)):
                return True
        except Exception:  # pylint: disable=broad-except  # a registered variable of the run: unknown here
            undecided = True
    return None if undecided else False


def test_service_tasks_are_found():
    tasks = dict(service_tasks("playbooks/serve.yml") + service_tasks("playbooks/verify.yml"))
    assert "playbooks/verify.yml: Prove the service serves" in tasks
    assert "playbooks/serve.yml: Benchmark the service" in tasks


def test_a_host_without_its_service_is_never_benchmarked_or_asked(inventory: dict) -> None:
    """A host with vllm_service_enabled false (the vfio VM host) must skip every task of serve.yml and
    verify.yml that benchmarks or checks the service: they would fail against a unit that is off."""
    hostvars = inventory["_meta"]["hostvars"]
    off = sorted(h for h, v in hostvars.items() if v.get("vllm_service_enabled") is False)
    assert off, "the example has a host with vllm_service_enabled: false (gpu8-vm-01)"
    tasks = service_tasks("playbooks/serve.yml") + service_tasks("playbooks/verify.yml")
    wrong = [f"{host}: {name} runs (conditions {conds})" for host in off for name, conds in tasks
             if skipped(conds, hostvars[host]) is not True]
    assert not wrong, "\n".join(wrong)
    on = sorted(h for h, v in hostvars.items() if v.get("vllm_service_model") and v.get("vllm_service_enabled") is not False)
    for name, conds in tasks:  # and the serving hosts still get them
        assert all(skipped(conds, hostvars[h]) is not True for h in on), name

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""YAML test cases for modules that run commands (the pattern of community.general's uthelper).

A test file ``test_<module>.py`` next to ``test_<module>.yaml`` does::

    from tests.unit.plugins.modules.uthelper import UTHelper
    from ansible_collections.gpufleet.inference.plugins.modules import kernel_cmdline
    test_yaml_case = UTHelper(kernel_cmdline, __file__, builders={...}, checks={...}).test_function()

Each entry of ``test_cases`` in the YAML file is one parametrized test:

``id``              the test id.
``setup``           steps that build a host tree under a fresh root (``{root}``), in order:
                    ``{builder: NAME, args: {...}}`` calls builders[NAME](root, **args);
                    ``{files: {HOST_PATH: TEXT}}`` writes files; ``{remove: [HOST_PATH]}`` deletes them;
                    ``{dirs: [HOST_PATH]}`` creates directories.
``input``           the module arguments. The text ``{root}`` anywhere in the case stands for the root.
``flags``           ``check``, ``diff`` (module flags), ``skip`` or ``xfail`` (a reason).
``bins``            names get_bin_path finds (as ``/testbin/NAME``); absent: every name.
``run_command``     the exact commands the module must run, in order, each with ``command`` (argv),
                    ``rc``, ``out``, ``err``; ``real: true`` runs the real binary of that name (from
                    PATH) with the same arguments instead of answering, for tools that can work on
                    the fake tree (setpci -O sysfs.path, systemctl --root); ``writes: {HOST_PATH:
                    TEXT}`` writes files under the root as the command would (update-grub's grub.cfg);
                    ``environ: {VAR: VALUE}`` variables the command must get besides the C locale
                    (LC_ALL=C and LANG=C, asserted for every command: the module's
                    run_command_environ_update merged with the call's environ_update).
                    A nested list (a YAML anchor holding several commands) is flattened.
``output``          expected result keys. Dicts match as subsets (recursively), lists of dicts element
                    by element; everything else exactly.
``output_contains`` ``{KEY: [TEXT, ...]}``: each TEXT must be in str(result[KEY]).
``files``           ``{HOST_PATH: TEXT or null}``: exact content after the run, null for absent.
``files_contain``   ``{HOST_PATH: [TEXT, ...]}``.
``check``           ``{NAME: VALUE}``: calls checks[NAME](root, VALUE, result) for assertions of its own.

The module runs through its real main() and AnsibleModule; only run_command and get_bin_path are
replaced, so every command the module would run is listed and checked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.module_utils import _internal as module_utils_internal
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common import warnings as module_warnings
from ansible.module_utils.testing import patch_module_args

CASE_KEYS = {"id", "setup", "input", "flags", "bins", "run_command", "output", "output_contains", "files",
             "files_contain", "check", "description"}
COMMAND_KEYS = {"command", "rc", "out", "err", "real", "writes", "environ"}
# The environment every command must get (the C locale: the parsers read untranslated output).
C_LOCALE = {"LC_ALL": "C", "LANG": "C"}


def target_side(monkeypatch) -> None:
    """Run modules in this process as they run on a target host.

    Once any test imports controller code (ansible.errors, a filter plugin), ansible-core 2.19 marks
    the process as the controller, and AnsibleModule.warn() then prints through Display instead of
    returning the warning in the module's result. Modules never run in a controller process.
    """
    monkeypatch.setattr(module_utils_internal, "is_controller", False)


def forget_module_warnings() -> None:
    """Drop the warnings and deprecations left in ansible's process-wide lists.

    AnsibleModule.warn() and module_utils' warn() append to lists that live as long as the process; a module run
    in its own process starts with none. In a test process a warning left by one test (or by a call that hung or
    raised before exit_json) would appear in the result of the next module run, of any test."""
    module_warnings._global_warnings.clear()  # pylint: disable=protected-access
    module_warnings._global_deprecations.clear()  # pylint: disable=protected-access


# scripts/run-tests (what CI runs) sets it: a test that needs a tool scripts/bootstrap installs
# (setpci from pciutils, systemctl) then fails when the tool is missing, instead of skipping.
REQUIRE_TOOLS = os.environ.get("GPUFLEET_REQUIRE_TOOLS") == "1"


def missing_tool(tools, what: str) -> None:
    """Skip (or, under GPUFLEET_REQUIRE_TOOLS=1, fail) ``what`` when one of ``tools`` is not on PATH."""
    missing = [t for t in tools if shutil.which(t) is None]
    if not missing:
        return
    msg = (f"{what} needs {', '.join(missing)} on PATH (scripts/bootstrap installs pciutils and friends)")
    if REQUIRE_TOOLS:
        pytest.fail(msg + "; GPUFLEET_REQUIRE_TOOLS=1 makes this a failure, not a skip", pytrace=False)
    pytest.skip(msg)


def needs_tools(*tools: str):
    """A mark for tests that run the real ``tools``: skipped where one is missing, except under
    GPUFLEET_REQUIRE_TOOLS=1 (scripts/run-tests, CI), where the missing tool is a collection error."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing and REQUIRE_TOOLS:
        pytest.fail(f"{', '.join(missing)} not on PATH, and GPUFLEET_REQUIRE_TOOLS=1 allows no skip: run scripts/bootstrap "
                    "(it installs pciutils and friends)", pytrace=False)
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed (scripts/bootstrap installs it)")


def check_actions(result: dict) -> None:
    """A module's ``actions``, where its result has them, are dicts of the one schema (docs/development.md, "The
    module skeleton"): each names its verb in a non-empty string ``action``; file contents stay out (``content``)."""
    if "actions" not in result:
        return
    actions = result["actions"]
    assert isinstance(actions, list), f"actions must be a list of dicts, got {actions!r}"
    for i, action in enumerate(actions):
        assert isinstance(action, dict), f"actions[{i}] must be a dict with an 'action' verb, got {action!r}"
        assert isinstance(action.get("action"), str) and action["action"], f"actions[{i}] names no verb: {action!r}"
        assert "content" not in action, f"actions[{i}] carries file contents (the diff has them): {sorted(action)}"


def run_module(module, args: dict, capsys) -> dict:
    """``module.main()`` as Ansible runs it, with ``args`` as its module arguments: the JSON result it
    prints. A failed result must come with a non-zero exit, a successful one with exit 0; its actions
    must be of the one schema (check_actions)."""
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        module.main()
    result = json.loads(capsys.readouterr().out)
    assert (exc.value.code != 0) == bool(result.get("failed")), result
    check_actions(result)
    return result


def substitute(value, root: str):
    """Replace ``{root}`` in every string of a YAML value."""
    if isinstance(value, str):
        return value.replace("{root}", root)
    if isinstance(value, list):
        return [substitute(v, root) for v in value]
    if isinstance(value, dict):
        return {substitute(k, root): substitute(v, root) for k, v in value.items()}
    return value


def flatten(items: list) -> list:
    """Nested lists flattened, so that a YAML anchor holding several commands can be listed as one item."""
    out = []
    for item in items:
        out.extend(flatten(item) if isinstance(item, list) else [item])
    return out


def assert_subset(expected, actual, where: str = "result") -> None:
    """Dicts: every expected key must match (recursively); lists holding dicts: same length, each
    element matched the same way; anything else: equality."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: expected a dict, got {actual!r}"
        for key, value in expected.items():
            assert key in actual, f"{where}: key {key!r} missing (keys: {sorted(actual)})"
            assert_subset(value, actual[key], f"{where}.{key}")
    elif isinstance(expected, list) and any(isinstance(e, dict) for e in expected):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{where}: {actual!r} != {expected!r}"
        for i, (exp, act) in enumerate(zip(expected, actual)):
            assert_subset(exp, act, f"{where}[{i}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


class CommandLog:
    """Answers run_command from the case's list and records what the module ran."""

    def __init__(self, expected: list[dict], root: Path):
        self.expected = expected
        self.root = root
        self.seen: list[list[str]] = []

    def __call__(self, module, args, check_rc=False, **kwargs):
        argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
        index = len(self.seen)
        assert index < len(self.expected), f"unexpected command #{index + 1}: {argv} (the case lists {len(self.expected)})"
        spec = self.expected[index]
        assert argv == spec["command"], f"command #{index + 1}: ran {argv}, expected {spec['command']}"
        self.seen.append(argv)
        env = dict(getattr(module, "run_command_environ_update", None) or {})
        env.update(kwargs.get("environ_update") or {})
        for key, value in dict(C_LOCALE, **(spec.get("environ") or {})).items():
            assert env.get(key) == value, (f"command #{index + 1} {argv} runs with {key}={env.get(key)!r}, not {value!r} "
                                           f"(its environment update: {env})")
        if spec.get("real"):
            binary = shutil.which(os.path.basename(argv[0]))
            assert binary, f"command #{index + 1}: real {os.path.basename(argv[0])} is not installed"
            proc = subprocess.run([binary] + argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=dict(os.environ, LC_ALL="C", LANG="C"), check=False)
            rc, out, err = proc.returncode, proc.stdout, proc.stderr
        else:
            rc, out, err = spec.get("rc", 0), spec.get("out", ""), spec.get("err", "")
        for host_path, text in (spec.get("writes") or {}).items():
            real = self.root / host_path.lstrip("/")
            real.parent.mkdir(parents=True, exist_ok=True)
            real.write_text(text)
        if check_rc and rc != 0:
            module.fail_json(msg=f"command failed: {argv}", rc=rc, stdout=out, stderr=err)
        return rc, out, err


class UTHelper:
    """Turns a YAML case file into one parametrized pytest function."""

    def __init__(self, module, test_file: str, builders: dict | None = None, checks: dict | None = None):
        self.module = module
        self.builders = builders or {}
        self.checks = checks or {}
        path = Path(test_file).with_suffix(".yaml")
        with open(path, encoding="utf-8") as fh:
            spec = yaml.safe_load(fh)
        unknown = set(spec) - {"test_cases", "anchors"}
        if unknown:
            raise ValueError(f"{path}: unknown top-level keys {sorted(unknown)}")
        self.cases = spec["test_cases"]
        for case in self.cases:
            case["run_command"] = flatten(case.get("run_command") or [])
            bad = set(case) - CASE_KEYS
            if bad:
                raise ValueError(f"{path}: case {case.get('id')!r} has unknown keys {sorted(bad)}")
            for cmd in case.get("run_command", []):
                if set(cmd) - COMMAND_KEYS or "command" not in cmd:
                    raise ValueError(f"{path}: case {case['id']!r}: bad run_command entry {cmd}")
            for name in case.get("check", {}):
                if name not in self.checks:
                    raise ValueError(f"{path}: case {case['id']!r}: no check named {name!r}")

    # ---- the tree ----------------------------------------------------------------------------
    def build(self, root: Path, steps) -> None:
        for step in steps or []:
            if "builder" in step:
                self.builders[step["builder"]](root, **(step.get("args") or {}))
            for host_path, text in (step.get("files") or {}).items():
                real = root / host_path.lstrip("/")
                real.parent.mkdir(parents=True, exist_ok=True)
                real.write_text(text)
            for host_path in step.get("remove") or []:
                real = root / host_path.lstrip("/")
                if real.is_dir() and not real.is_symlink():
                    shutil.rmtree(real)
                elif real.exists() or real.is_symlink():
                    real.unlink()
            for host_path in step.get("dirs") or []:
                (root / host_path.lstrip("/")).mkdir(parents=True, exist_ok=True)

    # ---- one case -----------------------------------------------------------------------------
    def run_case(self, case: dict, tmp_path: Path, monkeypatch, capsys) -> dict:
        flags = case.get("flags") or {}
        if flags.get("skip"):
            pytest.skip(flags["skip"])
        if flags.get("xfail"):
            pytest.xfail(flags["xfail"])
        real = sorted({os.path.basename(c["command"][0]) for c in case.get("run_command") or [] if c.get("real")})
        missing_tool(real, f"case {case['id']!r} (real: true)")
        root = tmp_path / "root"
        root.mkdir()
        case = substitute(case, str(root))
        self.build(root, case.get("setup"))
        log = CommandLog(case.get("run_command") or [], root)
        bins = case.get("bins")

        def get_bin_path(module, arg, required=False, opt_dirs=None):
            if bins is None or arg in bins:
                return f"/testbin/{arg}"
            if required:
                module.fail_json(msg=f"Failed to find required executable \"{arg}\" in paths: /testbin")
            return None

        def run_command(module, args, check_rc=False, **kwargs):
            return log(module, args, check_rc=check_rc, **kwargs)

        monkeypatch.setattr(AnsibleModule, "run_command", run_command)
        monkeypatch.setattr(AnsibleModule, "get_bin_path", get_bin_path)
        target_side(monkeypatch)
        args = dict(case.get("input") or {})
        if flags.get("check"):
            args["_ansible_check_mode"] = True
        if flags.get("diff"):
            args["_ansible_diff"] = True
        with patch_module_args(args), pytest.raises(SystemExit):
            self.module.main()
        result = json.loads(capsys.readouterr().out)
        assert "Traceback" not in result.get("msg", "") and "exception" not in result, result.get("exception")
        check_actions(result)
        assert len(log.seen) == len(log.expected), (
            f"the module ran {len(log.seen)} of the {len(log.expected)} listed commands: {log.seen}")
        assert_subset(case.get("output") or {}, result)
        for key, texts in (case.get("output_contains") or {}).items():
            for text in texts:
                assert text in str(result.get(key)), f"{text!r} not in result[{key!r}]: {result.get(key)!r}"
        for host_path, text in (case.get("files") or {}).items():
            real = root / host_path.lstrip("/")
            if text is None:
                assert not real.exists(), f"{host_path} should not exist"
            else:
                assert real.exists(), f"{host_path} is missing"
                assert real.read_text() == text, f"{host_path}:\n{real.read_text()}"
        for host_path, texts in (case.get("files_contain") or {}).items():
            content = (root / host_path.lstrip("/")).read_text()
            for text in texts:
                assert text in content, f"{text!r} not in {host_path}:\n{content}"
        for name, value in (case.get("check") or {}).items():
            self.checks[name](root, value, result)
        return result

    def test_function(self):
        """The pytest function to bind to a ``test_*`` name in the test module."""
        helper = self

        @pytest.mark.parametrize("case", helper.cases, ids=[c["id"] for c in helper.cases])
        def test_yaml_case(case, tmp_path, monkeypatch, capsys):
            helper.run_case(case, tmp_path, monkeypatch, capsys)

        return test_yaml_case

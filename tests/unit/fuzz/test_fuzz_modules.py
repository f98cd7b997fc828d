# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The attack of issue 31, owned by the project: every module's real main() on fake roots (modules.py) with generated bad
parameter values, corrupted and missing state files, judged by harness.py (no traceback, no hang, no write outside the
root, no partial write, a failure naming the bad parameter).

Seeded and reproducible: ``derandomize=True``, ``database=None``, a deadline. One test function per kind of attack,
parametrized by module, so that a module whose fix is pending is marked xfail(strict=True) by itself (KNOWN_BAD below).
The counts (calls and problems per module) are printed at the end of the run (conftest.py).
"""

from __future__ import annotations

import http.server
import json
import math
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from ansible.module_utils.basic import AnsibleModule
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.fuzz.harness import Call, names_param
from tests.unit.fuzz.modules import specs
from tests.unit.plugins.modules.test_vllm_args_ready import FakeVllm
from tests.unit.plugins.modules.uthelper import target_side

EXAMPLES = int(os.environ.get("GPUFLEET_FUZZ_EXAMPLES", "20"))
FUZZ = settings(derandomize=True, database=None, deadline=20000, max_examples=EXAMPLES,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Modules the fuzz suite finds failing, whose files another fix of issue 31 owns: (test kind, module) -> reason.
# Remove a line when that fix is merged (strict: the mark fails once the module passes).
KNOWN_BAD: dict[tuple[str, str], str] = {}

# ---- the values ---------------------------------------------------------------------------------------------------
NUMBERS = [float("nan"), float("inf"), float("-inf"), 2 ** 63, -(2 ** 63), -1, 0, 1e308, -0.5, 10 ** 12]
TEXTS = ["", "\0", "a\0b", "x\ny", "../../x", "\u00e9\u202e\u540d", " ", "-", "a" * 3000, "{{ lookup('env','HOME') }}"]
SAFE_TEXT = st.text(alphabet=st.characters(blacklist_characters="/.", blacklist_categories=("Cs",)), max_size=12)
SCALARS = st.one_of(st.sampled_from(NUMBERS), st.sampled_from(TEXTS), st.none(), st.booleans(), SAFE_TEXT,
                    st.integers(), st.floats())
KEYS = st.sampled_from(["a", "\0", "", "x\ny"])
GENERIC = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(KEYS, SCALARS, max_size=2))
HOST_PATHS = ["", "relative/x", "/a\0b", "/x\ny/z", "/../../outside/x", "/etc/../../outside/x", "/\u00e9/\u00fc", "/etc/.."]


def real_paths(root: str) -> list:
    """Bad paths for a module that works on / (the call's paths point into the root; none may reach the real host)."""
    return ["", "relative/x", f"{root}/a\0b", f"{root}/x\ny/z", f"{root}/\u00e9/\u00fc", 7, None, ["x"]]


def bad_value(draw, name: str, spec: dict, root: str, root_option: bool):
    """A bad value for option ``name`` (its argument spec ``spec``)."""
    if name == "root":
        return draw(st.sampled_from(["", "relative/root", "/a\0b", 7, ["x"]]))
    kind = spec.get("type", "str")
    if kind == "path":
        return draw(st.sampled_from(HOST_PATHS + [7, None, {"a": 1}] if root_option else real_paths(root)))
    if spec.get("elements") == "path":
        return draw(st.lists(st.sampled_from(real_paths(root)), max_size=2))
    if "int" in (kind, spec.get("elements")):  # ansible-core 2.19's check_type_int raises OverflowError on +-inf
        return draw(GENERIC.filter(lambda v: not has_inf(v)))
    return draw(GENERIC)


def valid(value, spec: dict) -> bool:
    """A drawn value that is a sound one for its option (a bool for a bool, one of the choices): a failure it leads to is
    the run's, not the value's, and need not name the option."""
    if spec.get("type") == "bool" and isinstance(value, bool):
        return True
    if value is None and not spec.get("required"):
        return True  # Ansible reads an optional option's null as not given (its default): the call's own failure
    return bool(spec.get("choices")) and isinstance(value, str) and value in spec["choices"]


def has_inf(value) -> bool:
    if isinstance(value, float):
        return math.isinf(value)
    if isinstance(value, (list, dict)):
        return any(has_inf(v) for v in (value.values() if isinstance(value, dict) else value))
    return False


# ---- the runs -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_url():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    srv.cfg = {}
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def argument_spec(module, args: dict) -> dict:
    """The module's argument spec, as its main() gives it to AnsibleModule."""
    seen = {}

    class Got(Exception):
        pass

    original = AnsibleModule.__init__

    def capture(self, argument_spec, *a, **kw):  # pylint: disable=unused-argument
        seen.update(argument_spec)
        raise Got()

    AnsibleModule.__init__ = capture
    try:
        module.main()
    except Got:
        pass
    finally:
        AnsibleModule.__init__ = original
    assert seen, f"{module.__name__}.main() built no AnsibleModule"
    return seen


class Bench:
    """One module's tree (built once, copied for each call) and its base call."""

    def __init__(self, name: str, spec, top, monkeypatch, capsys):
        self.name = name
        self.spec = spec
        self.top = top
        self.template = top / "template"
        self.template.mkdir()
        spec.build(self.template)
        self.call = Call(spec.module, name, top, monkeypatch, capsys)
        self.options = argument_spec(spec.module, {})
        self.base_failed = self.run(self.base())[0].get("failed")

    def base(self) -> dict:
        return self.spec.base(str(self.call.root))

    def fresh(self) -> None:
        if self.call.root.exists():
            shutil.rmtree(self.call.root)
        shutil.copytree(self.template, self.call.root, symlinks=True)
        for stray in self.top.iterdir():  # what an earlier call left outside the root is gone again
            if stray.name not in ("template", "root", "cwd", "outside"):
                shutil.rmtree(stray) if stray.is_dir() else stray.unlink()

    def run(self, args: dict, prepare=None):
        """One call on a fresh copy of the tree, ``prepare(root)`` first (a corrupted state file, an immutable one)."""
        self.fresh()
        if prepare:
            prepare(self.call.root)
        result, problems = self.call.run(args)
        return result or {}, problems


@pytest.fixture
def bench(request, tmp_path, monkeypatch, capsys, vllm_url):
    target_side(monkeypatch)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/sentinel").write_text("outside the root\n")
    name = request.param
    return Bench(name, specs(vllm_url)[name], tmp_path, monkeypatch, capsys)


def modules_for(kind: str, names):
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BAD[(kind, n)])) if (kind, n) in KNOWN_BAD else n
            for n in names]


ALL = sorted(specs("http://127.0.0.1:9"))


def test_every_module_with_a_main_is_fuzzed():
    """A new module joins the suite (its tree and base call in modules.py) or this fails; ``module:state`` names a
    module's state fuzzed on a tree of its own besides."""
    modules = Path(__file__).resolve().parents[3] / "plugins" / "modules"
    with_main = sorted(p.stem for p in modules.glob("*.py") if "def main(" in p.read_text())
    assert with_main == sorted({name.split(":")[0] for name in ALL})


WITH_STATE = sorted(n for n, s in specs("http://127.0.0.1:9").items() if s.state)


@pytest.mark.parametrize("bench", modules_for("params", ALL), indirect=True)
def test_bad_parameter_values(bench):
    """A bad value in one parameter: no traceback, hang, write outside the root or partial write; a failure names it."""
    names = sorted(bench.options)

    @FUZZ
    @given(st.data())
    def attack(data):
        name = data.draw(st.sampled_from(names), label="parameter")
        value = bad_value(data.draw, name, bench.options[name], str(bench.call.root), bench.spec.root_option)
        args = dict(bench.base(), **{name: value})
        result, problems = bench.run(args)
        if result.get("failed") and not bench.base_failed and not valid(value, bench.options[name]):
            aliases = [name] + list(bench.options[name].get("aliases") or [])
            if not names_param(result, aliases):
                problems.append(f"the failure does not name {name}: {str(result.get('msg'))[:300]}")
        bench.call.record(problems)
        assert not problems, f"{bench.name} with {name}={value!r}: {problems}"

    attack()


def corrupt_texts():
    return st.one_of(
        st.sampled_from(['{"run_id": "a", "expires_at": ', "[]", "null", "1", '"x"', '{"a": [1]}', "{}",
                         '{"expires_at": NaN, "run_id": "x"}', '{"stage": 7, "version": "9"}', "", "\n\n",
                         '{"0000:17:00.0": {"driver": 1}}', '{"devices": "x"}']),
        st.binary(max_size=48).map(lambda b: b.decode("latin-1")))


IMMUTABLE = "<immutable>"  # the state file (or, where there is none yet, its directory) made immutable: chattr +i
ROOT_ADVICE = "run it as root (become: true) on the host itself, not in a container"


def chattr(flag: str, path) -> bool:
    chattr_bin = shutil.which("chattr")
    return bool(chattr_bin) and subprocess.run([chattr_bin, flag, str(path)], capture_output=True, check=False).returncode == 0


def corrupt(host_path: str, text, frozen: list):
    """The prepare step of one attack: ``text`` written to the state file, or None: the file removed, or IMMUTABLE."""
    def prepare(root):
        real = root / host_path.lstrip("/")
        if text is None:
            if real.exists():
                real.unlink()
        elif text == IMMUTABLE:
            target = real if real.exists() else real.parent
            target.mkdir(parents=True, exist_ok=True) if target == real.parent else None
            if chattr("+i", target):
                frozen.append(target)
        else:
            real.parent.mkdir(parents=True, exist_ok=True)
            real.write_bytes(text.encode("utf-8", "surrogateescape"))
    return prepare


@pytest.mark.parametrize("bench", modules_for("state", WITH_STATE), indirect=True)
def test_corrupted_and_missing_state_files(bench):
    """A state file truncated, of the wrong shape, binary, missing or immutable: no traceback, hang, write outside or
    partial write; an immutable file is not blamed on a container (the tests run as root)."""

    @FUZZ
    @given(st.sampled_from(bench.spec.state), st.one_of(corrupt_texts(), st.none(), st.just(IMMUTABLE)))
    def attack(host_path, text):
        frozen: list = []
        try:
            result, problems = bench.run(bench.base(), corrupt(host_path, text, frozen))
        finally:
            for path in frozen:
                chattr("-i", path)
        if frozen and result.get("failed") and ROOT_ADVICE in str(result.get("msg")) and os.geteuid() == 0:
            problems.append(f"an immutable {host_path} is blamed on a container: {result.get('msg')}")
        bench.call.record(problems)
        assert not problems, f"{bench.name} with {host_path} = {text!r}: {problems}; result: {json.dumps(result)[:300]}"

    attack()


@pytest.mark.parametrize("bench", modules_for("missing", ALL), indirect=True)
def test_missing_required_inputs(bench):
    """Each required parameter left out, and the tree emptied: a failure, never a traceback or a write outside."""
    required = sorted(n for n, o in bench.options.items() if o.get("required"))
    for name in required:
        args = {k: v for k, v in bench.base().items() if k != name}
        result, problems = bench.run(args)
        if not result.get("failed"):
            problems.append(f"ran without the required {name}")
        elif not names_param(result, [name]):
            problems.append(f"the failure does not name {name}: {result.get('msg')}")
        bench.call.record(problems)
        assert not problems, f"{bench.name} without {name}: {problems}"
    shutil.rmtree(bench.template)
    os.mkdir(bench.template)
    _result, problems = bench.run(bench.base())
    bench.call.record(problems)
    assert not problems, f"{bench.name} on an empty tree: {problems}"

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""reapply_bundle: the re-apply scripts that carry the module_utils they run.

Sources survive the trip byte for byte; what a host cannot run (Ansible outside a module run, relative
imports) is refused when rendering; the script, run alone (``python -I``, nothing of the checkout on the
path), serves its module_utils under their names with their source lines in tracebacks; the PCIe boot
applier, from its script, finds the PCI Express and ACS capabilities where pci_config does on every
captured and synthetic config space (the check the old stand-alone applier had); and both scripts run
under Python 3.7, the documented minimum, and refuse 3.6 with a message that names the fix.
"""

from __future__ import annotations

import ast
import glob
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.irq import reapply as irq_reapply
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import reapply as pcie_boot_apply
from ansible_collections.gpufleet.inference.plugins.module_utils._host import bundle as rb
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.config import decode_config
from tests.unit.fakesysfs import FIXTURES, load_capture, payload_switch, two_gpus_one_switch, two_numa_nodes

REPO = Path(__file__).resolve().parents[4]
MODULE_UTILS = REPO / "plugins" / "module_utils"
PREFIX = rb.PACKAGE


def pyenv(version: str) -> str | None:
    """An interpreter of that minor version (pyenv's, on the development machines), or None."""
    found = sorted(glob.glob(str(Path.home() / f".pyenv/versions/{version}.*/bin/python{version}"))) or \
        [p for p in (shutil.which(f"python{version}"),) if p]
    return found[-1] if found else None


def render(python: str, sources: dict[str, str], entry: str = "entry") -> str:
    return rb.render_script(python, entry, sources, ["a test script"], "Render it again.", "Use another Python.")


def run_alone(script: Path, *args, python: str = sys.executable) -> subprocess.CompletedProcess:
    """The script in isolated mode, from a directory of its own: it can import only what it carries."""
    return subprocess.run([python, "-I", str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False, timeout=120, cwd=str(script.parent))


# ---- sources survive the trip ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "x = 1\n", "s = '''a''' + \"\"\"b\"\"\"\n", "p = r'\\d+\\\\' '\\''\n", "line = 1 + \\\n    2\n", "t = 'end\\\\'\n",
    "u = 'é ∑ \\N{BULLET}'\n", "'''\n", "q = \"'\"\n", "",
])
def test_a_source_is_carried_byte_for_byte(text):
    assert ast.literal_eval(rb._literal("m", text)) == text  # pylint: disable=protected-access


def test_every_module_utils_file_survives_the_trip():
    for path in sorted(MODULE_UTILS.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert ast.literal_eval(rb._literal(path.stem, text)) == text, path.name  # pylint: disable=protected-access


def test_what_a_host_cannot_run_is_refused():
    with pytest.raises(rb.BundleError, match="module_utils entry imports ansible.module_utils.basic, which a host has only inside"):
        render("/usr/bin/python3", {"entry": "from ansible.module_utils.basic import AnsibleModule\n"})
    with pytest.raises(rb.BundleError, match="uses a relative import"):
        render("/usr/bin/python3", {"entry": "from . import x\n"})
    with pytest.raises(rb.BundleError, match="carriage return"):
        render("/usr/bin/python3", {"entry": "x = 1\r\n"})
    with pytest.raises(rb.BundleError, match="module_utils entry does not parse"):
        render("/usr/bin/python3", {"entry": "def (\n"})
    with pytest.raises(rb.BundleError, match=f"cannot read the source of {PREFIX}.pcie.no_such_file"):
        rb.loaded_sources(["pcie.no_such_file"])


# ---- the script, run alone ---------------------------------------------------------------------------------------
def test_the_script_serves_its_module_utils_and_shows_their_lines_in_tracebacks(tmp_path):
    sources = {
        "t.base": "import sys\n\nVALUE = 41\n\n\ndef fail():\n    raise RuntimeError('from the bundled base')\n",
        "t.entry": (f"import json\nfrom {PREFIX}.t import base\nfrom {PREFIX}.t.base import VALUE\n\n\n"
                    "def main(argv):\n"
                    "    if argv == ['fail']:\n        base.fail()\n"
                    "    print(json.dumps({'name': __name__, 'file': __file__, 'value': VALUE + 1, 'argv': argv}))\n"
                    "    return 3\n"),
    }
    script = tmp_path / "bin" / "tool"
    script.parent.mkdir()
    script.write_text(render(sys.executable, sources, "t.entry"))
    assert rb.bundled_sources(script.read_text()) == {"t.base": sources["t.base"], "t.entry": sources["t.entry"]}
    proc = run_alone(script, "--x", "y")
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout) == {"name": f"{PREFIX}.t.entry", "file": f"{script}/t/entry.py", "value": 42, "argv": ["--x", "y"]}
    proc = run_alone(script, "fail")
    assert proc.returncode == 1 and f'File "{script}/t/base.py", line 7, in fail' in proc.stderr
    assert "raise RuntimeError('from the bundled base')" in proc.stderr


def test_a_script_missing_a_module_utils_says_so_and_how_to_fix_it(tmp_path):
    script = tmp_path / "tool"
    text = render(sys.executable, {"t.entry": f"from {PREFIX}.t import gone\n", "t.gone": "X = 1\n"}, "t.entry")
    script.write_text(text.replace("SOURCES['t.gone'] = ", "NOT_SHIPPED = "))
    proc = run_alone(script)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"tool: cannot import the collection's module_utils from {script}: ")
    assert proc.stderr.rstrip().endswith("Render it again.")


def config_files(tmp_path: Path) -> list[Path]:
    roots = []
    for capture in sorted(p.name for p in FIXTURES.iterdir() if (p / "capture.json").exists()):
        roots.append(load_capture(capture, tmp_path / capture))
    payload_switch(tmp_path / "switch", nic=True)
    two_gpus_one_switch(tmp_path / "acs", acs=True)
    two_numa_nodes(tmp_path / "numa")
    roots += [tmp_path / "switch", tmp_path / "acs", tmp_path / "numa"]
    return sorted({p.resolve() for root in roots for p in Path(root).glob("sys/bus/pci/devices/*/config")})


READ_OFFSETS = f"""
import json, runpy, sys
bundle = runpy.run_path(sys.argv[1], run_name="bundle")
sys.meta_path.insert(0, bundle["BundleImporter"](sys.argv[1]))
from {PREFIX}._host.files import HostFS
from {PREFIX}.pcie.acs import read_acs
from {PREFIX}.pcie.payload import read_payload
out = {{}}
for config in sys.argv[2:]:
    dev = config.rsplit("/", 2)[-2]
    fs = HostFS(config.rsplit("/sys/", 1)[0])
    out[config] = [read_payload(fs, dev)["pcie_offset"], read_acs(fs, dev)["offset"], read_acs(fs, dev)["readable"]]
print(json.dumps(out))
"""


def test_the_boot_applier_finds_the_capabilities_where_pci_config_does(tmp_path):
    """The PCIe boot script's own code (nothing of the checkout on the path) against every captured and synthetic config space."""
    script = tmp_path / "apply"
    script.write_text(pcie_boot_apply.render_script(sys.executable))
    files = [p for p in config_files(tmp_path) if p.stat().st_size >= 64]
    assert len(files) > 20
    proc = subprocess.run([sys.executable, "-I", "-c", READ_OFFSETS, str(script), *map(str, files)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, check=True, cwd=str(tmp_path))
    got = json.loads(proc.stdout)
    seen_acs = 0
    for path in files:
        data = path.read_bytes()
        try:
            cfg = decode_config(data[:4096])
        except ValueError:
            assert got[str(path)][0] is None, path
            continue
        pcie, acs, acs_readable = got[str(path)]
        assert pcie == (cfg["pcie"]["offset"] if cfg["pcie"] and cfg["capabilities_complete"] and len(data) >= 256 else None), path
        if acs_readable:
            assert acs == (cfg["acs"]["offset"] if cfg["acs"] else None), path
            seen_acs += acs is not None
    assert seen_acs > 0


# ---- the documented minimum: Python 3.7 ----------------------------------------------------------------------------
@pytest.mark.skipif(pyenv("3.7") is None, reason="no Python 3.7 on this machine (pyenv's versions/3.7.*)")
def test_both_scripts_run_under_python_3_7(tmp_path):
    from tests.unit.plugins.modules.test_pcie_payload import restore, snapshot, tuned_switch
    py37 = pyenv("3.7")
    root = tmp_path / "host"
    tuned_switch(root)
    tuned = snapshot(root)
    payload_switch(tmp_path / "firmware")
    restore(root, snapshot(tmp_path / "firmware"))  # a reboot: the firmware's values are back
    script = tmp_path / "pcie-apply"
    script.write_text(pcie_boot_apply.render_script(py37))
    proc = run_alone(script, "--root", str(root), str(root / "etc/gpufleet/pcie_payload.json"), python=py37)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert snapshot(root) == tuned and proc.stdout.rstrip().endswith("6 device(s), 0 failed")
    irq = tmp_path / "irq-apply"
    irq.write_text(irq_reapply.render_script(py37))
    proc = run_alone(irq, "--root", str(root), python=py37)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr  # no configuration: nothing to do


@pytest.mark.skipif(pyenv("3.6") is None, reason="no Python 3.6 on this machine (pyenv's versions/3.6.*)")
@pytest.mark.parametrize("render_script,hint", [(pcie_boot_apply.render_script, "ansible_python_interpreter"),
                                                (irq_reapply.render_script, "irq_affinity_python")])
def test_python_3_6_is_refused_with_the_way_out(tmp_path, render_script, hint):
    py36 = pyenv("3.6")
    script = tmp_path / "apply"
    script.write_text(render_script(py36))
    proc = run_alone(script, "--help", python=py36)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"apply: needs Python 3.7 or later to run the collection's module_utils, and {py36} is Python 3.6")
    assert hint in proc.stderr


# ---- which interpreter the PCIe modules write -----------------------------------------------------------------------
class _Module:
    """What HostCmd asks of the module here (the interpreter is found without running anything)."""

    def get_bin_path(self, name, required=False):
        return f"/usr/bin/{name}"


def _state(root: str):
    from ansible_collections.gpufleet.inference.plugins.module_utils._host.commands import HostCmd
    from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
    from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
    from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.state import PcieState
    fs = HostFS(root)
    host = Host(fs=fs, cmd=HostCmd(_Module(), fs), warn=lambda msg: None)
    return PcieState(host, "setpci", "originals.json", "/var/lib/gpufleet/pcie_payload", False)


def test_the_boot_script_names_the_interpreter_that_runs_the_module(tmp_path, monkeypatch):
    """/usr/bin/python3 only when it is that interpreter: on EL 8 it may be a 3.6 beside the 3.11 Ansible runs."""
    real = _state("/")
    other = tmp_path / "python3.11"
    other.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(other))
    expected = "/usr/bin/python3" if Path("/usr/bin/python3").exists() and Path("/usr/bin/python3").samefile(other) else str(other)
    assert real.python() == expected
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv-python"))  # not /usr/bin/python3, whatever that is
    (tmp_path / "venv-python").write_text("")
    assert real.python() == str(tmp_path / "venv-python")
    assert real.script().startswith(f"#!{tmp_path / 'venv-python'}\n")
    if Path("/usr/bin/python3").exists():  # another name of the same interpreter: the stable name is written
        alias = tmp_path / "python3-alias"
        alias.symlink_to("/usr/bin/python3")
        monkeypatch.setattr(sys, "executable", str(alias))
        assert real.python() == "/usr/bin/python3"
        monkeypatch.setattr(sys, "executable", str(tmp_path / "venv-python"))
    tree = tmp_path / "tree"
    tree.mkdir()
    assert _state(str(tree)).python() == str(tmp_path / "venv-python")
    (tree / "usr/bin").mkdir(parents=True)
    (tree / "usr/bin/python3").write_text("")
    assert _state(str(tree)).python() == "/usr/bin/python3"

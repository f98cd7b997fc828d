# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The module table of docs/development.md is what docs/tools/module_table.py makes from the tree: every module of
plugins/modules with its executor, plugins/module_utils/<topic>/<module>.py (the name rule), or its action plugin.

docs/tools and docs/development.md stay out of the Galaxy tarball (galaxy.yml's build_ignore): there the test is
skipped."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "docs" / "tools" / "module_table.py"
PAGE = REPO / "docs" / "development.md"

pytestmark = pytest.mark.skipif(not (TOOL.is_file() and PAGE.is_file()), reason="docs/tools is not shipped")


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("module_table", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_table_in_the_development_guide_is_the_one_the_tool_makes(tool):
    current = tool.in_page(PAGE.read_text(encoding="utf-8"))
    assert current == tool.block(REPO), "docs/development.md's module table is stale: run python docs/tools/module_table.py --write"


def test_every_module_has_a_row_with_its_executor_by_the_name_rule(tool):
    rows = {line.split("|")[1].strip(" `"): line.split("|")[2].strip() for line in tool.table(REPO).splitlines()[2:]}
    modules = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py") if p.stem != "__init__")
    assert sorted(rows) == modules
    for module, where in rows.items():
        if (REPO / "plugins" / "action" / f"{module}.py").is_file():
            assert where.startswith(f"`plugins/action/{module}.py`"), module
        else:
            assert where.startswith("`plugins/module_utils/") and where.endswith(f"/{module}.py`"), (module, where)
            assert where.count("/") == 3, (module, where)


def test_the_check_fails_on_a_stale_table_and_the_rule_places_an_executor_not_yet_written(tool, tmp_path, capsys):
    """A copy of the tree: a module whose executor file does not exist yet is listed by the rule (the one topic it
    imports), one that imports none is an error, and --check fails on a table that differs from the tree."""
    (tmp_path / "plugins" / "modules").mkdir(parents=True)
    (tmp_path / "plugins" / "module_utils" / "kernel").mkdir(parents=True)
    (tmp_path / "plugins" / "module_utils" / "kernel" / "cmdline.py").write_text("")
    (tmp_path / "plugins" / "modules" / "kernel_cmdline_info.py").write_text(
        f"from {tool.PREFIX}._host.files import HostFS\nfrom {tool.PREFIX}.kernel import cmdline\n\ndef main():\n    pass\n")
    assert tool.table(tmp_path).splitlines()[2] == "| `kernel_cmdline_info` | `plugins/module_utils/kernel/kernel_cmdline_info.py` |"
    (tmp_path / "plugins" / "modules" / "lonely.py").write_text("def main():\n    pass\n")
    with pytest.raises(tool.TableError, match="lonely: no plugins/module_utils/<topic>/lonely.py"):
        tool.table(tmp_path)
    (tmp_path / "plugins" / "modules" / "lonely.py").unlink()
    page = tmp_path / "docs" / "development.md"
    page.parent.mkdir()
    page.write_text(f"# Guide\n\n{tool.block(tmp_path)}\n", encoding="utf-8")
    assert tool.main(["--check"], repo=tmp_path) == 0
    (tmp_path / "plugins" / "modules" / "kernel_cmdline.py").write_text("def main():\n    pass\n")
    (tmp_path / "plugins" / "module_utils" / "kernel" / "kernel_cmdline.py").write_text("")
    assert tool.main(["--check"], repo=tmp_path) == 1
    assert "the module table differs from the tree" in capsys.readouterr().err
    assert tool.main(["--write"], repo=tmp_path) == 0 and tool.main(["--check"], repo=tmp_path) == 0
    assert "| `kernel_cmdline` | `plugins/module_utils/kernel/kernel_cmdline.py` |" in page.read_text(encoding="utf-8")

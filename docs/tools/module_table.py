#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Print the module table of docs/development.md: per module, its lines, the lines of code after
DOCUMENTATION/EXAMPLES/RETURN, the functions and classes it still defines besides main(), and the
module_utils it calls into. Run from the checkout: python docs/tools/module_table.py"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PREFIX = "ansible_collections.gpufleet.inference.plugins.module_utils"


def row(path: Path) -> str:
    src = path.read_text(encoding="utf-8")
    tree = ast.parse(src)
    docs_end = max((n.end_lineno for n in tree.body if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", "") in ("DOCUMENTATION", "EXAMPLES", "RETURN") for t in n.targets)), default=0)
    code = [ln for ln in src.split("\n")[docs_end:] if ln.strip() and not ln.strip().startswith("#")]
    own = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name != "main"]
    utils = sorted({n.module[len(PREFIX) + 1:] for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(PREFIX + ".")})
    return (f"| `{path.stem}` | {len(src.splitlines())} | {len(code)} | {', '.join(own) or '-'} | "
            f"{', '.join(utils)} |")


def main() -> None:
    print("| module | lines | code lines | defined besides main() | module_utils |")
    print("|---|---|---|---|---|")
    for path in sorted((REPO / "plugins" / "modules").glob("*.py")):
        if path.stem != "__init__":
            print(row(path))


if __name__ == "__main__":
    main()

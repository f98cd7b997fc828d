# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's one way to run its module_utils on a host outside a module run: a re-apply script
that carries them.

The settings that live in a device and are lost at every reset (PCIe MaxPayload/MaxReadReq and ACS
Control, IRQ affinity) are applied again at boot, and for IRQs at every driver bind, by scripts that
must compute exactly what the modules compute. Each such script is one file, written by one task:

- ``import_closure()`` takes the entry module_utils (``pcie.reapply``, ``irq.reapply``) and finds
  every module_utils it imports, from the ``ast`` of the sources (nothing is imported), in dependency
  order; there is no list kept by hand;
- ``render_script()`` writes the interpreter line, those sources as string literals, a small importer
  that serves them under their usual names (``ansible_collections.gpufleet.inference.plugins.
  module_utils.TOPIC.FILE``) and the few lines that call the entry's ``main(argv)``.

One text file rather than a directory of packages or a zip: one file is one write (the modules' own
atomic write, or one ``copy`` task of a role, where the copy of a module_utils tree cost one task per
file and directory), the script can never meet module_utils of another version (it is renamed into
place whole), it needs no extraction and no binary transfer (``copy`` with ``content``), and
``--diff`` and a human can read what runs at boot. The sources come from the running Python's import
system (``loaded_sources()``): the checkout's files, the zip of a module run (which holds every
module_utils its module imports), or Ansible's collection loader on the controller.

The script runs under Python 3.7 or later (``from __future__ import annotations``; what ansible-core
2.17 and later require on hosts anyway) with the standard library only: a bundled module that imports
Ansible (which exists on the host only inside a module run) is refused when rendering.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from typing import Callable, Iterable, Mapping

PACKAGE = "ansible_collections.gpufleet.inference.plugins.module_utils"
FORMAT = "gpufleet-bundle/1"
MIN_PYTHON = (3, 7)


class BundleError(Exception):
    """A closure that cannot be shipped: a source is missing or unreadable, imports form a cycle, or a
    bundled module needs Ansible. The message names the module and what to change."""


def imports_of(source: str, name: str = "<source>") -> tuple[set[str], set[str]]:
    """(module_utils of this collection, other modules) that ``source`` imports, at any depth of the file."""
    ours, other = _imports(source, name)
    return set(ours), set(other)


@functools.lru_cache(maxsize=256)
def _imports(source: str, name: str) -> tuple[frozenset, frozenset]:
    try:
        tree = ast.parse(source, name)
    except SyntaxError as err:
        raise BundleError(f"module_utils {name} does not parse: {err}") from None
    ours: set[str] = set()
    other: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                raise BundleError(f"module_utils {name} uses a relative import (line {node.lineno}): import "
                                  f"{PACKAGE}.NAME instead, so that the closure can be computed")
            if node.module == PACKAGE:
                raise BundleError(f"module_utils {name} imports a topic package, not a file (line {node.lineno}): "
                                  f"import from {PACKAGE}.TOPIC instead, so that the closure can be computed")
            if _is_topic(node.module):  # from PACKAGE.TOPIC import FILE [as NAME]
                ours.update(f"{node.module[len(PACKAGE) + 1:]}.{alias.name}" for alias in node.names)
            elif node.module and node.module.startswith(PACKAGE + "."):
                ours.add(node.module[len(PACKAGE) + 1:])
            elif node.module:
                other.add(node.module)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    ours.add(alias.name[len(PACKAGE) + 1:])
                else:
                    other.add(alias.name)
    return frozenset(ours), frozenset(other)


def _is_topic(module: str | None) -> bool:
    """``PACKAGE.TOPIC``: a topic package, whose names imported are files (every file of this collection's
    module_utils sits one folder down)."""
    return bool(module) and module.startswith(PACKAGE + ".") and "." not in module[len(PACKAGE) + 1:]


def import_closure(sources: Mapping[str, str], roots: Iterable[str]) -> list[str]:
    """``roots`` and every module_utils they import, directly or not, each after the ones it imports
    (ties by name). Pure. Raises BundleError for a module_utils missing from ``sources`` or an import cycle."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, chain: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "open":
            raise BundleError(f"module_utils import each other in a cycle: {' -> '.join(chain[chain.index(name):] + [name])}")
        if name not in sources:
            by = f"{chain[-1]} imports" if chain else "the entry is"
            raise BundleError(f"{by} module_utils {name}, whose source is not given (is it a module_utils file?)")
        state[name] = "open"
        for dep in sorted(imports_of(sources[name], name)[0]):
            visit(dep, chain + [name])
        state[name] = "done"
        order.append(name)

    for root in roots:
        visit(root, [])
    return order


def _source_from_import_system(name: str) -> str:
    fullname = f"{PACKAGE}.{name}"
    try:
        spec = importlib.util.find_spec(fullname)
    except (ImportError, ValueError):
        spec = None
    getter = getattr(spec.loader, "get_source", None) if spec is not None and spec.loader is not None else None
    source = getter(fullname) if getter else None
    if isinstance(source, bytes):  # Ansible's collection loader on the controller answers with the file's bytes
        source = importlib.util.decode_source(source)
    if source is None:
        raise BundleError(f"cannot read the source of {fullname}: this Python has no copy of it (a module run holds "
                          "only the module_utils its module imports: import the entry module_utils there)")
    return source


def loaded_sources(roots: Iterable[str], source_of=_source_from_import_system) -> dict[str, str]:
    """{name: source} of ``roots`` and of every module_utils they import, in dependency order, read through
    the running Python's import system (``source_of(name)`` in tests)."""
    roots = list(roots)
    sources: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in sources:
            sources[name] = source_of(name)
            todo.extend(sorted(imports_of(sources[name], name)[0]))
    return {name: sources[name] for name in import_closure(sources, roots)}


def _literal(name: str, source: str) -> str:
    """``source`` as a ''' string literal that reads like the file: backslashes doubled, single quotes escaped."""
    if "\r" in source or "\x00" in source:
        raise BundleError(f"module_utils {name} holds a carriage return or a NUL byte, which a bundled source cannot keep")
    return "'''\\\n" + source.replace("\\", "\\\\").replace("'", "\\'") + "'''"


# The script around the sources. Old-style formatting only, so that an interpreter older than
# MIN_PYTHON still parses it and says what is wrong instead of failing on a bundled module.
_IMPORTER = '''

class BundleImporter(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves PACKAGE, its parent packages and the module_utils in SOURCES from this file."""

    def __init__(self, path):
        self.path = path

    @staticmethod
    def bundled(fullname):
        prefix = PACKAGE + "."
        name = fullname[len(prefix):] if fullname.startswith(prefix) else None
        return name if name in SOURCES else None

    @staticmethod
    def package(fullname):
        """PACKAGE, a package above it, or a topic package that holds a bundled file."""
        if fullname == PACKAGE or PACKAGE.startswith(fullname + "."):
            return True
        prefix = fullname + "."
        return fullname.startswith(PACKAGE + ".") and any((PACKAGE + "." + name).startswith(prefix) for name in SOURCES)

    def find_spec(self, fullname, path=None, target=None):
        if self.package(fullname):
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        name = self.bundled(fullname)
        if name is None:
            return None
        spec = importlib.util.spec_from_loader(fullname, self, origin="%s/%s.py" % (self.path, name.replace(".", "/")))
        spec.has_location = True
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = self.bundled(module.__name__)
        if name is not None:
            exec(compile(SOURCES[name], module.__spec__.origin, "exec", dont_inherit=True), module.__dict__)

    def get_source(self, fullname):
        name = self.bundled(fullname)
        return SOURCES[name] if name is not None else None


def main():
    prog = os.path.basename(sys.argv[0])
    if sys.version_info < MIN_PYTHON:
        sys.stderr.write("%s: needs Python %d.%d or later to run the collection's module_utils, and %s is Python %s. "
                         "%s\\n" % (prog, MIN_PYTHON[0], MIN_PYTHON[1], sys.executable, sys.version.split()[0], PYTHON_HINT))
        return 2
    sys.meta_path.insert(0, BundleImporter(os.path.abspath(__file__)))
    sys.excepthook = traceback.print_exception  # reads the bundled lines through get_source (the C printer opens files)
    try:
        entry = importlib.import_module(PACKAGE + "." + ENTRY)
    except ImportError as err:
        sys.stderr.write("%s: cannot import the collection's module_utils from %s: %s. %s\\n"
                         % (prog, os.path.abspath(__file__), err, REINSTALL))
        return 2
    return entry.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
'''


def render_script(python: str, entry: str, sources: Mapping[str, str], header: Iterable[str], reinstall: str,
                  python_hint: str) -> str:
    """The re-apply script: ``#!python``, the ``header`` comment lines, the closure of ``entry`` (from
    ``sources``) and the importer; run, it calls ``entry``'s ``main(argv)`` and exits with what it returns.

    ``reinstall`` says how to install it again (printed when a bundled module cannot be imported),
    ``python_hint`` how to choose another interpreter (printed under a Python older than MIN_PYTHON).
    Raises BundleError when the closure is incomplete or a bundled module imports Ansible.
    """
    names = import_closure(sources, [entry])
    for name in names:
        needs_ansible = sorted(m for m in imports_of(sources[name], name)[1] if m.split(".")[0] in ("ansible", "ansible_collections"))
        if needs_ansible:
            raise BundleError(f"module_utils {name} imports {', '.join(needs_ansible)}, which a host has only inside a module "
                              f"run, so {entry} cannot run from a re-apply script; keep {name} to the standard library")
    lines = [f"#!{python}", "# -*- coding: utf-8 -*-"]
    lines += [f"# {line}".rstrip() for line in header]
    lines += [
        "#",
        f"# {FORMAT}: this file carries the gpufleet.inference module_utils it runs, the import closure of {entry}",
        f"# (computed from their imports): {', '.join(names)}. Their sources follow as they are in the",
        "# collection; the importer at the end serves them under their usual names, so the host runs the",
        f"# modules' own code. Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or later, standard library only.",
        "import importlib.abc",
        "import importlib.util",
        "import os",
        "import sys",
        "import traceback",
        "",
        f"FORMAT = {FORMAT!r}",
        f"PACKAGE = {PACKAGE!r}",
        f"ENTRY = {entry!r}",
        f"MIN_PYTHON = {MIN_PYTHON!r}",
        f"REINSTALL = {reinstall!r}",
        f"PYTHON_HINT = {python_hint!r}",
        "SOURCES = {}",
    ]
    for name in names:
        lines += ["", f"SOURCES[{name!r}] = {_literal(name, sources[name])}"]
    return "\n".join(lines) + "\n" + _IMPORTER


def entry_renderer(entry: str, header: Iterable[str], reinstall: str, python_hint: str) -> Callable[[str], str]:
    """The ``render_script(python)`` of one entry: its script for an interpreter, rendered from the running Python's
    sources (``loaded_sources``), once per interpreter (cached)."""
    header = tuple(header)

    @functools.lru_cache(maxsize=None)
    def render(python: str) -> str:
        return render_script(python, entry, loaded_sources([entry]), header, reinstall, python_hint)

    render.__doc__ = f"The script of {entry} as its module installs it: ``#!python``, the entry and its closure."
    return render


def log(msg: str) -> None:
    """One line of a script's log (stdout, flushed: the unit's journal shows what was done even if it hangs later)."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def bundled_sources(script: str) -> dict[str, str]:
    """{name: source} that a rendered script carries, in its order (read with ``ast``, nothing is run)."""
    out: dict[str, str] = {}
    for node in ast.parse(script).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript)
                and isinstance(node.targets[0].value, ast.Name) and node.targets[0].value.id == "SOURCES"):
            key = node.targets[0].slice
            key = key.value if type(key).__name__ == "Index" else key  # Python < 3.9 wraps it in ast.Index
            key = ast.literal_eval(key)
            out[key] = ast.literal_eval(node.value)
    return out

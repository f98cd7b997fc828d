# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How a module's run ends: ``Failed`` (a run that must fail, with its result fields), bounds on numeric options,
the refusal of a path option no run can use, the failure message of a host I/O error, and ``finish()``, which turns
an executor's result or error into ``exit_json``/``fail_json``. Standard library only: executors that also run from a
re-apply script raise ``Failed`` outside any module run."""

from __future__ import annotations

import errno
import os

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFSError, HostPathError


class Failed(Exception):
    """A module run that must end in failure, raised below main(): the message, and ``fields``, the extra
    result keys (``changed``, ``rc``, ``stderr``, ...). main() or finish() turns it into fail_json."""

    def __init__(self, msg: str, **fields):
        super().__init__(msg)
        self.fields = fields


def bounded(name: str, value, low, high, unit: str = ""):
    """``value`` when it is a number from ``low`` to ``high`` (nan, inf and bools are not); else Failed (nothing changed)
    naming the parameter, the value and the allowed range. For a module's timeouts, intervals and counts, before any work."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not low <= value <= high:
        raise Failed(f"{name}={value!r} is out of range: give a number from {low} to {high}{' ' + unit if unit else ''}. "
                     "Nothing was done.", changed=False)
    return value


def advice(name: str, root: str, does: str, err: HostFSError, params: dict | None = None) -> str:
    """The failure message of a HostFSError: which module under which root, the error, and what to do, which depends on
    why (a refused path, with the option it came from, a read-only file system, a file root may not change, or too few
    rights)."""
    head = f"{name} under root {root} failed: {err}."
    if isinstance(err, HostPathError):
        return f"{head}{source_option(params or {}, err.path)} Give a path inside the host tree; nothing was written."
    if err.errno == errno.EROFS:
        return f"{head} {err.path} is on a read-only file system: remount it read-write (or change the image it comes from)."
    if err.errno == errno.EPERM and os.geteuid() == 0:
        return (f"{head} It runs as root, so {err.path} is immutable or append-only (lsattr {err.path}; chattr -i "
                "allows the change), or a container withholds the capability: run it on the host itself.")
    return f"{head} The module {does}: run it as root (become: true) on the host itself, not in a container."


def path_flaw(value, contained: bool) -> str | None:
    """Why ``value`` cannot be a path a module takes (None when it can); ``contained``: it is a host path under a root
    other than /, where '..' could lead out of the tree."""
    if not isinstance(value, str) or not value:
        return "expected an absolute path"
    if not value.startswith("/"):
        return "a relative path: give it absolute, from /"
    if "\0" in value or "\n" in value or "\r" in value:
        return "it holds a NUL byte or a line break"
    if contained and ".." in value.split("/"):
        return "'..' could lead out of root: give the path without it"
    return None


def refused_path_option(module) -> str | None:
    """The failure message for the first path option (type path in the module's argument spec) that no run can use, before
    anything is read or written; None when every one is sound. An empty optional path without a default means unset."""
    spec = getattr(module, "argument_spec", None) or {}
    root = module.params.get("root")
    for name in sorted(n for n, o in spec.items() if o.get("type") == "path"):
        value, option = module.params.get(name), spec[name]
        if value is None or (value == "" and option.get("default") is None and not option.get("required")):
            continue
        why = path_flaw(value, contained=name != "root" and isinstance(root, str) and root != "/")
        if why:
            return f"{name}={value!r} is refused: {why}. Nothing was done."
    return None


def source_option(params: dict, path) -> str:
    """`` It comes from OPTION.`` for the option whose (string) value the refused ``path`` holds, the longest such value; ``""``."""
    found = [(len(v), n) for n, v in params.items() if n != "root" and isinstance(v, str) and v and isinstance(path, str) and v in path]
    return f" It comes from {max(found)[1]}={params[max(found)[1]]!r}." if found else ""


def finish(module, name: str, does: str, run, known_error) -> None:
    """End a host-changing module's run: a path option no run can use is refused first (refused_path_option); ``run()``
    gives its result (with a ``diff`` entry, if any); a
    ``known_error`` becomes the message as it is (nothing changed), a HostFSError says which
    module failed under which root and what to do (advice(); ``does``: what it reads and writes). The
    diff is returned in diff mode only."""
    root = module.params.get("root", "/")
    refused = refused_path_option(module)
    if refused:
        module.fail_json(msg=refused, changed=False)
    try:
        result = run()
    except Failed as err:  # first: a domain error that is also a Failed carries its own fields (changed, actions)
        module.fail_json(msg=str(err), **err.fields)
    except known_error as err:
        module.fail_json(msg=str(err), changed=False)
    except HostFSError as err:
        module.fail_json(msg=advice(name, root, does, err, module.params), **getattr(err, "fields", {}))
    diff = result.pop("diff", None)
    if module._diff and diff:  # pylint: disable=protected-access  # AnsibleModule's diff mode flag
        result["diff"] = diff
    module.exit_json(**result)

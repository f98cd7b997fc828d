# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whole files a module owns on the host, with their directories: what ``ansible.builtin.file``
(``state: directory``), ``ansible.builtin.copy`` (``content``) and ``ansible.builtin.slurp`` do for a
few small files, in the one module run that also decides their content.

``plan()`` compares the host with what is wanted (content, mode, owner) and returns the actions and the
diff; ``apply()`` carries them out (atomic writes through the HostFS); ``read_back()`` reads every file
again. Pure but for the HostFS; callers keep ``apply()`` behind check mode.
"""

from __future__ import annotations

import stat

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError


class ManagedFilesError(Exception):
    """A path that cannot hold what is wanted (a file where a directory belongs, say)."""


def wanted_dir(path: str, mode: int = 0o755, owner: tuple[int, int] | None = (0, 0)) -> dict:
    """A directory; ``owner`` (uid, gid), or None to leave the owner as it is (new ones: the caller's)."""
    return {"path": path, "mode": mode, "owner": tuple(owner) if owner is not None else None}


def wanted_file(path: str, content: str, mode: int = 0o644, owner: tuple[int, int] | None = (0, 0),
                shown: bool = True) -> dict:
    """A whole file; ``owner`` (uid, gid), or None to leave the owner as it is (new ones: the caller's).
    ``shown=False`` keeps its text out of the diff (a secret): the diff names its size only."""
    return {"path": path, "content": content, "mode": mode, "owner": tuple(owner) if owner is not None else None,
            "shown": shown}


def wanted_absent(path: str, shown: bool = True) -> dict:
    """A file that must not be there (removed when it is); ``shown=False`` as for wanted_file."""
    return {"path": path, "content": None, "shown": shown}


def text_diff(path: str, before: str | None, after: str | None, removed: bool = False) -> dict:
    """One --diff entry of a whole file: its text before and after (None: absent), headed by its path, the
    after side marked when the file goes."""
    return {"before": before or "", "after": "" if removed else (after or ""), "before_header": path,
            "after_header": f"{path} (removed)" if removed else path}


def _text(want: dict, text: str | None) -> str:
    """What the diff shows of a file's text: the text, or for a hidden file its size only."""
    if not text:
        return ""
    return text if want.get("shown", True) else f"({len(text.encode())} bytes, not shown)\n"


def _mode(value: int) -> str:
    return f"{value:04o}"


def _owner(value) -> str:
    return f"{value[0]}:{value[1]}"


def _attribute_actions(path: str, st, want: dict) -> tuple[list[dict], dict, dict]:
    """set_mode / set_owner actions for an existing path, and its attributes before and after (the diff)."""
    actions, before, after = [], {}, {}
    if stat.S_IMODE(st.st_mode) != want["mode"]:
        actions.append({"action": "set_mode", "path": path, "before": _mode(stat.S_IMODE(st.st_mode)),
                        "after": _mode(want["mode"])})
        before["mode"], after["mode"] = _mode(stat.S_IMODE(st.st_mode)), _mode(want["mode"])
    if want["owner"] is not None and (st.st_uid, st.st_gid) != want["owner"]:
        actions.append({"action": "set_owner", "path": path, "before": _owner((st.st_uid, st.st_gid)),
                        "after": _owner(want["owner"])})
        before["owner"], after["owner"] = _owner((st.st_uid, st.st_gid)), _owner(want["owner"])
    return actions, before, after


def _attributes(path: str, st, want: dict, actions: list[dict], diff: list[dict]) -> None:
    """Add the mode and owner changes of an existing path to ``actions`` and, if any, its diff entry."""
    more, before, after = _attribute_actions(path, st, want)
    if more:
        actions.extend(more)
        diff.append({"before": dict(before, path=path), "after": dict(after, path=path),
                     "before_header": path, "after_header": path})


def plan(fs: HostFS, dirs: list[dict], files: list[dict]) -> tuple[list[dict], list[dict]]:
    """The actions that bring ``dirs`` and ``files`` (wanted_dir/wanted_file) to what is wanted, and the
    diff (one entry per path that changes: a file's text before and after, a directory's state and
    attributes). Reads only."""
    actions: list[dict] = []
    diff: list[dict] = []
    for want in dirs:
        path = want["path"]
        st = fs.lstat(path)
        if st is None:
            actions.append({"action": "create_directory", "path": path, "after": _mode(want["mode"])})
            diff.append({"before": {"path": path, "state": "absent"}, "after": {"path": path, "state": "directory"},
                         "before_header": path, "after_header": path})
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise ManagedFilesError(f"{path} exists and is not a directory: it must be one to hold the files written "
                                    f"there. Move it away and run again.")
        _attributes(path, st, want, actions, diff)
    for want in files:
        path = want["path"]
        st = fs.lstat(path)
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise ManagedFilesError(f"{path} exists and is not a regular file (a directory or a link): move it away "
                                    f"so that the file can be written there, and run again.")
        current = fs.read_exact(path) if st is not None else None
        if want["content"] is None:  # wanted_absent
            if st is not None:
                actions.append({"action": "remove", "path": path})
                diff.append(text_diff(path, _text(want, current), None, removed=True))
            continue
        if current != want["content"]:
            actions.append({"action": "write", "path": path} if current is not None
                           else {"action": "create", "path": path, "after": _mode(want["mode"])})
            diff.append(text_diff(path, _text(want, current), _text(want, want["content"])))
            continue  # the atomic write gives the file its mode and owner
        _attributes(path, st, want, actions, diff)
    return actions, diff


def converge(fs: HostFS, dirs: list[dict], files: list[dict], check_mode: bool) -> tuple[list[dict], list[dict]]:
    """plan(), then apply() what it found unless in check mode: (actions, diff) either way."""
    actions, diff = plan(fs, dirs, files)
    if actions and not check_mode:
        apply(fs, dirs, files, actions)
    return actions, diff


def apply(fs: HostFS, dirs: list[dict], files: list[dict], actions: list[dict]) -> None:
    """Carry out ``actions`` (from plan()), in their order: directories, whole files written atomically with
    their mode (or removed), modes and owners. When one fails (a HostFSError: an immutable file, a read-only
    file system), the ones done before it are undone, newest first, and the error goes on with ``fields``:
    changed false when the undo restored everything, else changed true and the actions done."""
    wanted = {w["path"]: w for w in list(dirs) + list(files)}
    done: list[tuple[dict, list]] = []
    for action in actions:
        want = wanted[action["path"]]
        undo: list = []
        try:
            undo = _undo_steps(fs, want, action)
            _apply_one(fs, want, action)
        except HostFSError as err:
            left = _undo(fs, done + [(action, undo)])
            err.fields = {"changed": bool(left), "actions": left} if left else {"changed": False}
            raise
        done.append((action, undo))


def _apply_one(fs: HostFS, want: dict, action: dict) -> None:
    if action["action"] == "create_directory":
        fs.makedirs(want["path"], want["mode"])
        if want["owner"] is not None:
            fs.chown(want["path"], *want["owner"])
    elif action["action"] in ("create", "write"):
        fs.write_atomic(want["path"], want["content"], want["mode"])
        if want["owner"] is not None:
            fs.chown(want["path"], *want["owner"])
    elif action["action"] == "remove":
        fs.remove(want["path"])
    elif action["action"] == "set_mode":
        fs.chmod(want["path"], want["mode"])
    elif action["action"] == "set_owner":
        fs.chown(want["path"], *want["owner"])


def _undo_steps(fs: HostFS, want: dict, action: dict) -> list[tuple]:
    """What puts ``want['path']`` back as it is now, read before ``action`` runs: a list of (verb, path, ...)."""
    path = want["path"]
    if action["action"] == "create_directory":
        missing, parent = [], path
        while parent not in ("", "/") and not fs.exists(parent):
            missing.append(("rmdir", parent))
            parent = parent.rsplit("/", 1)[0] or "/"
        return missing  # deepest first
    st = fs.lstat(path)
    if st is None:
        return [("remove", path)]
    if action["action"] in ("write", "remove"):
        return [("restore", path, fs.read_exact(path, errors="surrogateescape"), stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid))]
    return [("chmod", path, stat.S_IMODE(st.st_mode)), ("chown", path, (st.st_uid, st.st_gid))]


def _undo(fs: HostFS, done: list[tuple[dict, list]]) -> list[dict]:
    """Undo ``done`` newest first; the actions whose undo failed too (what stays changed)."""
    left = []
    for action, steps in reversed(done):
        try:
            for step in steps:
                _undo_step(fs, step)
        except (HostFSError, OSError):
            left.append(action)
    return left


def _undo_step(fs: HostFS, step: tuple) -> None:
    verb, path = step[0], step[1]
    if verb == "rmdir" and fs.exists(path):
        fs.remove_tree(path)
    elif verb == "remove":
        fs.remove(path)
    elif verb == "restore":
        fs.write_atomic(path, step[2], step[3])
        fs.chown(path, *step[4])
    elif verb == "chmod":
        fs.chmod(path, step[2])
    elif verb == "chown":
        fs.chown(path, *step[2])


def read_back(fs: HostFS, files: list[dict]) -> dict:
    """path -> the text the file holds now (None when it is gone)."""
    return {want["path"]: fs.read_exact(want["path"]) for want in files}


def unlike(files: list[dict], texts: dict) -> list[str]:
    """What read_back() found that is not as wanted, one phrase per path (no file text in them)."""
    problems = []
    for want in files:
        path, text = want["path"], texts.get(want["path"])
        if want["content"] is None:
            if text is not None:
                problems.append(f"{path} is still there")
        elif text is None:
            problems.append(f"{path} is missing")
        elif text != want["content"]:
            problems.append(f"{path} differs from what was written")
    return problems

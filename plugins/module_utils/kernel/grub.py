# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one GRUB library of the collection: where GRUB keeps its files and how to read them.

``/etc/default/grub`` and its ``grub.d`` drop-ins (shell assignments, sourced in name order by
grub-mkconfig), ``grub.cfg`` (menu entries and their ``linux`` lines), ``grubenv`` (the 1024-byte
environment block that holds ``saved_entry`` and the one-shot ``next_entry``) and ``grubby --info``
on EL. Pure: callers read the text through HostFS and pass it in (``read_grubenv`` takes the HostFS
itself). ``kernel_cmdline`` (owned kernel arguments) and ``kernel_upgrade`` (the one-shot boot)
build their decisions on these parsers.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

GRUB_DEFAULTS = "/etc/default/grub"
GRUB_DROPIN_DIR = "/etc/default/grub.d"
GRUB_CFG = "/boot/grub/grub.cfg"
GRUBENV = "/boot/grub/grubenv"
GRUBENV_SIZE = 1024
GRUBENV_HEADER = "# GRUB Environment Block"

# The kernel line of a menu entry: linux (BIOS), linux16 (old EL), linuxefi (EL on UEFI).
LINUX_LINE_RE = re.compile(r"^\s*linux(?:16|efi)?\s+(\S+)\s*(.*)$")
_DEFAULT_ASSIGN_RE = re.compile(r"^\s*(?:export\s+)?(GRUB_DEFAULT|GRUB_SAVEDEFAULT)=(.*)$")
_ENTRY_RE = re.compile(r"^\s*(menuentry|submenu)\s+(.*)\{\s*$")
_QUOTED_RE = re.compile(r"'([^']*)'|\"([^\"]*)\"")
_ID_RE = re.compile(r"(?:\$menuentry_id_option|--id)\s+(?:'([^']*)'|\"([^\"]*)\"|(\S+))")
_VMLINUZ_RE = re.compile(r"(?:^|/)vmlinu[xz]-(.+)$")


# ---- /etc/default/grub and grub.d ---------------------------------------------------------------
def shell_value(raw: str) -> str:
    """The value of a shell assignment's right-hand side as the shell sees it: a quoted value
    without its quotes (up to the closing one), an unquoted one up to a ``#`` comment."""
    value = raw.strip()
    if value[:1] in ("'", '"'):
        end = value.find(value[0], 1)
        return value[1:end] if end > 0 else value[1:]
    return value.split("#", 1)[0].strip()


def grub_settings(files: Iterable[tuple[str, str | None]]) -> dict[str, Any]:
    """GRUB_DEFAULT and GRUB_SAVEDEFAULT as grub-mkconfig ends up with them.

    ``files`` are (path, text) in the order grub-mkconfig sources them: /etc/default/grub first,
    then /etc/default/grub.d/*.cfg sorted by name. The last assignment wins. Returns the values
    (GRUB_DEFAULT is ``0`` when nothing sets it, grub-mkconfig's default) and the file that set each.
    """
    out: dict[str, Any] = {"default": "0", "default_from": None, "savedefault": False, "savedefault_from": None}
    for path, text in files:
        for line in (text or "").splitlines():
            m = _DEFAULT_ASSIGN_RE.match(line)
            if not m:
                continue
            value = shell_value(m.group(2))
            if m.group(1) == "GRUB_DEFAULT":
                out["default"], out["default_from"] = value, path
            else:
                out["savedefault"], out["savedefault_from"] = value == "true", path
    return out


def dropin_order(names: Iterable[str]) -> list[str]:
    """grub.d drop-ins in the order grub-mkconfig sources them (``*.cfg``, C-locale sort)."""
    return sorted(n for n in names if n.endswith(".cfg"))


# ---- grubenv ----------------------------------------------------------------------------------------
def parse_grubenv(data: bytes | None) -> dict[str, Any]:
    """{valid, size, vars} of a GRUB environment block (exactly 1024 bytes, header line, key=value lines, # padding)."""
    if data is None:
        return {"valid": False, "size": None, "vars": {}, "problem": "missing"}
    text = data.decode("utf-8", "replace")
    lines = text.split("\n")
    problem = None
    if len(data) != GRUBENV_SIZE:
        problem = f"{len(data)} bytes instead of {GRUBENV_SIZE}"
    elif lines[0] != GRUBENV_HEADER:
        problem = "no '# GRUB Environment Block' header"
    env = {}
    for line in lines[1:]:
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if sep:
            env[key] = value
    return {"valid": problem is None, "size": len(data), "vars": env, "problem": problem}


def read_grubenv(fs) -> dict[str, Any]:
    """parse_grubenv of the host's grubenv, read through ``fs`` (a HostFS); ``missing`` when absent."""
    return parse_grubenv(fs.read_bytes(GRUBENV) if fs.exists(GRUBENV) else None)


# ---- grub.cfg -------------------------------------------------------------------------------------
def first_linux_line(text: str | None) -> tuple[str, str] | None:
    """(kernel path, the rest of the line) of the first ``linux`` line of grub.cfg (the newest kernel's
    normal entry), or None when there is none."""
    for line in (text or "").splitlines():
        m = LINUX_LINE_RE.match(line)
        if m:
            return m.group(1), m.group(2)
    return None


def parse_grub_cfg(text: str | None) -> list[dict[str, Any]]:
    """Every menu entry: title, id, ``path`` (the ``submenu>entry`` id form grub-reboot and
    grub-set-default take), kernel version, args, recovery flag, top-level flag and index."""
    entries: list[dict[str, Any]] = []
    stack: list[dict[str, Any]] = []  # open blocks: {"kind", "id", "entry"}
    depth_other = 0
    top_index = 0
    for line in (text or "").splitlines():
        stripped = line.strip()
        m = _ENTRY_RE.match(line)
        if m:
            head = m.group(2)
            qm = _QUOTED_RE.search(head)
            title = (qm.group(1) if qm.group(1) is not None else qm.group(2)) if qm else ""
            im = _ID_RE.search(head)
            ident = next((g for g in im.groups() if g is not None), "") if im else ""
            in_sub = [b for b in stack if b["kind"] == "submenu"]
            if m.group(1) == "submenu":
                stack.append({"kind": "submenu", "id": ident or title, "entry": None})
                if not in_sub:
                    top_index += 1
                continue
            parent = in_sub[-1]["id"] if in_sub else None
            entry = {"title": title, "id": ident, "path": f"{parent}>{ident or title}" if parent else (ident or title),
                     "submenu": parent, "kernel": None, "version": None, "args": [], "recovery": False,
                     "index": None if parent else top_index}
            if not parent:
                top_index += 1
            entries.append(entry)
            stack.append({"kind": "menuentry", "id": ident, "entry": entry})
            continue
        if stripped.endswith("{"):
            depth_other += 1
            stack.append({"kind": "other", "id": None, "entry": None})
            continue
        if stripped == "}":
            if stack:
                stack.pop()
            continue
        lm = LINUX_LINE_RE.match(line)
        if lm:
            current = next((b["entry"] for b in reversed(stack) if b["entry"] is not None), None)
            if current is not None and current["kernel"] is None:
                current["kernel"] = lm.group(1)
                vm = _VMLINUZ_RE.search(lm.group(1))
                current["version"] = vm.group(1) if vm else None
                current["args"] = lm.group(2).split()
    for entry in entries:
        entry["recovery"] = ("recovery" in entry["id"] or "(recovery mode)" in entry["title"]
                             or "single" in entry["args"])
    return entries


def entry_for(entries: list[dict[str, Any]], version: str) -> dict[str, Any] | None:
    """The entry that boots ``version`` normally and keeps doing so when newer kernels arrive:
    the one in the 'Advanced options' submenu (the top-level simple entry always boots the newest)."""
    normal = [e for e in entries if e["version"] == version and not e["recovery"]]
    stable = [e for e in normal if e["submenu"]]
    return (stable or normal or [None])[0]


def resolve_saved(entries: list[dict[str, Any]], saved: str | None) -> dict[str, Any] | None:
    """The entry a saved_entry/next_entry value names: a path, an id, a title or a top-level index."""
    if not saved:
        saved = "0"
    for entry in entries:
        if saved in (entry["path"], entry["id"], entry["title"]):
            return entry
    if ">" in saved:
        sub, _sep, leaf = saved.partition(">")
        for entry in entries:
            if entry["submenu"] == sub and leaf in (entry["id"], entry["title"]):
                return entry
    if saved.isdigit():
        return next((e for e in entries if e["index"] == int(saved)), None)
    return None


# ---- kernel command lines and grubby (EL) --------------------------------------------------------------
def split_cmdline(text: str | None) -> list[str]:
    """Split a kernel command line on whitespace, keeping double-quoted values whole."""
    out: list[str] = []
    cur: list[str] = []
    quoted = False
    for ch in (text or "").strip():
        if ch == '"':
            quoted = not quoted
        elif ch.isspace() and not quoted:
            if cur:
                out.append("".join(cur))
                cur = []
            continue
        cur.append(ch)
    if cur:
        out.append("".join(cur))
    return out


def parse_grubby_info(text: str) -> list[dict[str, Any]]:
    """``grubby --info=ALL`` -> [{index, kernel, args: [...], title, rescue}]."""
    entries: list[dict[str, Any]] = []
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        key = key.strip()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        if key == "index":
            entries.append({"index": int(value) if value.isdigit() else value, "kernel": None, "args": [], "title": None})
        elif entries and key in ("kernel", "title"):
            entries[-1][key] = value
        elif entries and key == "args":
            entries[-1]["args"] = split_cmdline(value)
    for entry in entries:
        entry["rescue"] = "rescue" in (entry["kernel"] or "") or "rescue" in (entry["title"] or "").lower()
    return entries

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel command line arguments owned per feature, for gpufleet.inference.kernel_cmdline.

Each owner (a role or feature: ``pcie_link``, ``vfio``, ``hugepages``) owns a list of arguments.
On Debian and Ubuntu they live in one drop-in, ``/etc/default/grub.d/99-gpufleet.cfg``, one line
per owner, appended to ``GRUB_CMDLINE_LINUX_DEFAULT``; ``update-grub`` turns it into grub.cfg. On
EL ``grubby`` edits the boot entries and a small JSON state file under ``/etc/gpufleet`` keeps the
owners, so an owner removes its arguments without touching those of others. Arguments an owner
removed stay listed as pending until the running kernel no longer has them, so the need for a
reboot survives a second run.

Everything here is pure: parsers, validation, conflict detection, rendering and planning.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

# The GRUB files and parsers come from grub.py (the one GRUB library); the names stay importable
# from here for the module kernel_cmdline and its tests.
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.grub import (
    GRUB_CFG, GRUB_DEFAULTS, first_linux_line, shell_value, split_cmdline,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.grub import GRUB_DROPIN_DIR as DROPIN_DIR

DROPIN = DROPIN_DIR + "/99-gpufleet.cfg"
STATE_FILE = "/etc/gpufleet/kernel_cmdline.json"
STATE_FORMAT = "gpufleet-kernel-cmdline/1"
PROC_CMDLINE = "/proc/cmdline"
VARIABLE = "GRUB_CMDLINE_LINUX_DEFAULT"

# A kernel argument as this module accepts it: ``flag`` or ``key=value``; no quotes, no
# whitespace, no shell metacharacters (the drop-in is shell, sourced by grub-mkconfig as root).
KEY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
VALUE_RE = re.compile(r"^[A-Za-z0-9_.,:/+@%=-]+$")
OWNER_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
MAX_ARG = 256
# Keys the kernel reads once per occurrence, so several values are meant (hugepagesz=1G hugepages=8
# hugepagesz=2M hugepages=512). grubby keeps one value per key, so it cannot hold repeats.
REPEATABLE = ("console", "hugepagesz", "hugepages", "pci")
# Arguments that contradict each other although their keys differ.
CONTRADICTIONS = (("iommu=off", "intel_iommu=on"), ("iommu=off", "amd_iommu=on"), ("iommu=off", "iommu=pt"))

# Device-list arguments whose list separator is ';' (a GRUB and shell metacharacter): accepted for
# these only, written as '\;' in the drop-in (GRUB's escape; the shell keeps it inside double quotes).
SEMICOLON_LISTS = ("pci=disable_acs_redir=", "pci=config_acs=")

DROPIN_LINE_RE = re.compile(r'^GRUB_CMDLINE_LINUX_DEFAULT="\$\{GRUB_CMDLINE_LINUX_DEFAULT\}((?: [^"\s]+)*)"'
                            r"\s+# gpufleet-owner=([a-z][a-z0-9_]*)\s*$")
ASSIGN_RE = re.compile(r"^\s*(?:export\s+)?(GRUB_CMDLINE_LINUX(?:_DEFAULT)?)=(.*)$")

DROPIN_HEADER = """\
# Managed by Ansible (gpufleet.inference.kernel_cmdline). Do not edit: change the variables of the
# role named on each line instead. One line per owner; each owner rewrites or removes only its own.
# The arguments go to GRUB_CMDLINE_LINUX_DEFAULT, which only the normal boot entries use: the
# recovery entries boot without them, the way back when an argument keeps a host from booting.
# The name sorts after 50-cloudimg-settings.cfg, which sets GRUB_CMDLINE_LINUX_DEFAULT outright.
"""


class CmdlineError(Exception):
    """Bad input or a conflict; the message says what, where, why and what to do."""


# ---- arguments ----------------------------------------------------------------------------------
def arg_key(arg: str) -> str:
    return arg.split("=", 1)[0]


def validate_owner(owner: str) -> str:
    if not isinstance(owner, str) or not OWNER_RE.match(owner):
        raise CmdlineError(f"owner {owner!r} is not valid: use the name of the role or feature that owns the arguments, "
                           "lower case letters, digits and '_' (for example pcie_link, vfio, hugepages).")
    return owner


def validate_arg(arg: Any) -> str:
    """One argument, or CmdlineError naming what is wrong with it."""
    text = arg if isinstance(arg, str) else str(arg)
    if not text:
        raise CmdlineError("An empty kernel argument was given: drop it from args.")
    if len(text) > MAX_ARG:
        raise CmdlineError(f"Kernel argument {text[:40]!r}... is {len(text)} characters long; the limit here is {MAX_ARG}.")
    key, sep, value = text.partition("=")
    if text.startswith(SEMICOLON_LISTS) and ";;" not in text and not text.endswith(";"):
        value = value.replace(";", ",")  # the device list separator, checked like the rest
    bad = sorted({c for c in text.replace(";", "") if not (c.isalnum() or c in "_.,:/+@%=-")} |
                 ({";"} if ";" in text and not text.startswith(SEMICOLON_LISTS) else set()))
    if bad or not KEY_RE.match(key) or (sep and not VALUE_RE.match(value)) or not text.isascii():
        shown = " ".join(repr(c) for c in bad) if bad else "its form"
        raise CmdlineError(
            f"Kernel argument {text!r} is refused because of {shown}: arguments must be 'flag' or 'key=value' with "
            "letters, digits and _ . , : / + @ % = - only; no whitespace, quotes or shell metacharacters (the GRUB drop-in "
            "is a shell file that runs as root). Give each argument as its own list item.")
    return text


def validate_args(args) -> list[str]:
    out: list[str] = []
    for arg in args or []:
        text = validate_arg(arg)
        if text not in out:
            out.append(text)
    return out


def find_conflicts(owners: dict[str, list[str]], grubby: bool = False) -> list[str]:
    """Messages for contradicting arguments across all owners (empty when there are none)."""
    by_key: dict[str, dict[str, list[str]]] = {}
    every: dict[str, list[str]] = {}
    for owner in sorted(owners):
        for arg in owners[owner]:
            by_key.setdefault(arg_key(arg), {}).setdefault(arg, []).append(owner)
            every.setdefault(arg, []).append(owner)
    out = []
    for key, values in sorted(by_key.items()):
        if len(values) < 2 or (key in REPEATABLE and not grubby):
            continue
        shown = " vs ".join(f"{arg} (owner {', '.join(who)})" for arg, who in sorted(values.items()))
        why = ("grubby keeps one value per key" if key in REPEATABLE
               else "the kernel would see both and one silently wins")
        out.append(f"{key}: {shown}; {why}")
    for a, b in CONTRADICTIONS:
        if a in every and b in every:
            out.append(f"{a} (owner {', '.join(every[a])}) contradicts {b} (owner {', '.join(every[b])})")
    return out


# ---- the Debian drop-in -------------------------------------------------------------------------
def parse_dropin(text: str | None) -> tuple[dict[str, list[str]], list[str]]:
    """Owners and their arguments from the drop-in, and the lines that are not ours."""
    owners: dict[str, list[str]] = {}
    foreign: list[str] = []
    for line in (text or "").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = DROPIN_LINE_RE.match(line)
        if m:
            args = [a.replace("\\;", ";") for a in m.group(1).split()]
            owners.setdefault(m.group(2), []).extend(a for a in args if a not in owners.get(m.group(2), []))
        else:
            foreign.append(line)
    return owners, foreign


def render_dropin(owners: dict[str, list[str]]) -> str | None:
    """The drop-in for these owners (sorted by name); None when no owner has arguments."""
    lines = [f'{VARIABLE}="${{{VARIABLE}}} {" ".join(a.replace(";", chr(92) + ";") for a in args)}" # gpufleet-owner={owner}'
             for owner, args in sorted(owners.items()) if args]
    if not lines:
        return None
    return DROPIN_HEADER + "\n".join(lines) + "\n"


def foreign_grub_args(texts) -> list[str]:
    """Arguments set in GRUB_CMDLINE_LINUX(_DEFAULT) by files that are not the drop-in."""
    out: list[str] = []
    for text in texts:
        for line in (text or "").splitlines():
            m = ASSIGN_RE.match(line)
            if not m:
                continue
            value = shell_value(m.group(2))
            out.extend(t for t in value.split() if not t.startswith("$") and t not in out)
    return out


def grub_cfg_args(text: str | None) -> list[str] | None:
    """Arguments of the first ``linux`` line of grub.cfg (the newest kernel's normal entry)."""
    first = first_linux_line(text)
    return None if first is None else [a.replace("\\;", ";") for a in split_cmdline(first[1])]


# ---- the state file -----------------------------------------------------------------------------
def empty_state() -> dict[str, Any]:
    return {"format": STATE_FORMAT, "owners": {}, "pending_removal": {}}


def parse_state(text: str | None, where: str = STATE_FILE) -> dict[str, Any]:
    if text is None or not text.strip():
        return empty_state()
    try:
        data = json.loads(text)
    except ValueError as err:
        raise CmdlineError(f"{where} is not valid JSON ({err}). It records which role owns which kernel argument; "
                           "fix it, or move it away and run every role that sets kernel arguments again.") from None
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
        raise CmdlineError(f"{where} is not a gpufleet.inference.kernel_cmdline state file (format {STATE_FORMAT}); "
                           "move it away and run again.")
    state = empty_state()
    owners = data.get("owners") or {}
    state["owners"] = {o: [str(a) for a in args] for o, args in owners.items() if isinstance(args, list)}
    pending = data.get("pending_removal") or {}
    state["pending_removal"] = {str(a): str(o) for a, o in pending.items()} if isinstance(pending, dict) else {}
    return state


def render_state(state: dict[str, Any]) -> str | None:
    """The state file text, or None when it would hold nothing."""
    if not state["owners"] and not state["pending_removal"]:
        return None
    return json.dumps({"format": STATE_FORMAT, "owners": {o: a for o, a in sorted(state["owners"].items()) if a},
                       "pending_removal": dict(sorted(state["pending_removal"].items()))}, indent=2, sort_keys=True) + "\n"


# ---- planning -----------------------------------------------------------------------------------
def wanted_args(owners: dict[str, list[str]]) -> list[str]:
    out: list[str] = []
    for owner in sorted(owners):
        out.extend(a for a in owners[owner] if a not in out)
    return out


def change_owner(owners: dict[str, list[str]], owner: str, args: list[str], state: str) -> dict[str, list[str]]:
    out = {o: list(a) for o, a in owners.items()}
    if state == "present" and args:
        out[owner] = list(args)
    else:
        out.pop(owner, None)
    return out


def pending_after(pending: dict[str, str], owners_before: dict, owners_after: dict, owner: str,
                  current: list[str], still_configured=()) -> dict[str, str]:
    """Arguments removed and not yet gone from the running kernel, with who removed them."""
    wanted = set(wanted_args(owners_after))
    out = {a: o for a, o in pending.items() if a not in wanted}
    for arg in owners_before.get(owner, []):
        if arg not in wanted:
            out[arg] = owner
    return {a: o for a, o in out.items() if a in current or a in still_configured}


def status(owners: dict[str, list[str]], current: list[str], pending: dict[str, str], owner: str | None = None,
           foreign=()) -> dict[str, Any]:
    """Wanted set vs the running kernel's, as sets."""
    wanted = wanted_args(owners)
    missing = [a for a in wanted if a not in current]
    unexpected = [a for a in pending if a in current and a not in wanted and a not in foreign]
    out = {"wanted": wanted, "current": list(current), "missing": missing, "unexpected": unexpected,
           "reboot_required": bool(missing or unexpected)}
    if owner is not None:
        out["owner_reboot_required"] = (any(a not in current for a in owners.get(owner, []))
                                        or any(pending[a] == owner for a in unexpected))
    return out


def foreign_conflicts(owners: dict[str, list[str]], current: list[str], pending: dict[str, str]) -> list[str]:
    """Arguments of the running kernel, set outside this module, whose key an owner sets to another value."""
    wanted = wanted_args(owners)
    keys = {arg_key(a): a for a in wanted if arg_key(a) not in REPEATABLE}
    out = []
    for arg in current:
        key = arg_key(arg)
        if key in keys and arg not in wanted and arg not in pending:
            out.append(f"the running kernel has {arg}, set outside gpufleet.inference, and {keys[key]} is wanted")
    return out


def plan_dropin(before: str | None, owners: dict[str, list[str]], grub_cfg: str | None, removed: list[str],
                foreign=()) -> dict[str, Any]:
    """What the Debian path has to do: write or remove the drop-in, regenerate grub.cfg.

    grub.cfg is regenerated when the drop-in changes, and also when it lacks a wanted argument
    or still carries a removed one (a run that stopped between the two steps).
    """
    after = render_dropin(owners)
    actions: list[dict[str, Any]] = []
    if (before or None) != after:
        actions.append({"action": "remove_dropin" if after is None else "write_dropin", "path": DROPIN})
    cfg_args = grub_cfg_args(grub_cfg)
    stale = []
    if cfg_args is not None:
        stale = [a for a in wanted_args(owners) if a not in cfg_args]
        stale += [a for a in removed if a in cfg_args and a not in foreign and a not in wanted_args(owners)]
    if actions or stale:
        actions.append({"action": "update_grub", "path": GRUB_CFG, "reason": "drop-in changed" if actions else
                        f"{GRUB_CFG} does not match the drop-in ({', '.join(stale)})"})
    return {"before": before, "after": after, "actions": actions}


def plan_grubby(entries: list[dict], owners: dict[str, list[str]], removable: list[str]) -> dict[str, Any]:
    """Arguments to add to and remove from every normal boot entry (``--update-kernel=ALL``)."""
    wanted = wanted_args(owners)
    normal = [e for e in entries if not e["rescue"]] or entries
    add = [a for a in wanted if any(a not in e["args"] for e in normal)]
    remove = [a for a in removable if a not in wanted and any(a in e["args"] for e in normal)]
    return {"add": add, "remove": remove}


# ---- guards: the command line's length, drop-ins that override ours ------------------------------
# COMMAND_LINE_SIZE of the kernel, NUL included (arch/*/include/uapi/asm/setup.h): the boot loader
# cuts a longer line, silently dropping the last arguments (ours come last).
CMDLINE_LIMITS = {"x86_64": 2048, "i386": 2048, "i486": 2048, "i586": 2048, "i686": 2048, "aarch64": 2048}
DEFAULT_ASSIGN_RE = re.compile(r"^\s*(?:export\s+)?GRUB_CMDLINE_LINUX_DEFAULT=(.*)$")


def cmdline_limit(arch: str | None) -> int | None:
    """The kernel command line limit in bytes (NUL included) for an architecture; None when not known here."""
    return CMDLINE_LIMITS.get((arch or "").strip())


def predicted_cmdline(configured: list[str], kernel: str | None, wanted: list[str], dropped: list[str]) -> str:
    """The command line the next boot gets: the boot entry's arguments without ``dropped``, plus ``wanted``."""
    args = [a for a in configured if a not in dropped and not a.startswith("BOOT_IMAGE=")]
    args += [a for a in wanted if a not in args]
    head = [f"BOOT_IMAGE={kernel}"] if kernel else []
    return " ".join(head + args)


def check_length(line: str, arch: str | None) -> str | None:
    """A message when ``line`` does not fit the architecture's limit, else None."""
    limit = cmdline_limit(arch)
    if limit is None or len(line.encode("utf-8")) + 1 <= limit:
        return None
    return (f"The kernel command line would be {len(line.encode('utf-8'))} bytes, over the {limit}-byte limit of {arch} "
            f"(COMMAND_LINE_SIZE, NUL included): the boot loader would cut it and the kernel would silently lose the last "
            "arguments, ours among them. Nothing was changed. Drop arguments (other owners', or long device lists) first.")


def grub_cfg_kernel(text: str | None) -> str | None:
    """The kernel path of the first ``linux`` line of grub.cfg."""
    first = first_linux_line(text)
    return None if first is None else first[0]


def overriding_dropins(files: list[tuple[str, str | None]], ours: str = DROPIN) -> list[str]:
    """Drop-ins that grub-mkconfig sources after ours (name order) and that set GRUB_CMDLINE_LINUX_DEFAULT
    without keeping its value (no ``$GRUB_CMDLINE_LINUX_DEFAULT`` / ``${GRUB_CMDLINE_LINUX_DEFAULT}``):
    they throw our arguments away. ``files``: (path, text) of every ``*.cfg`` in the drop-in directory."""
    out = []
    mine = os.path.basename(ours)
    for path, text in sorted(files, key=lambda f: os.path.basename(f[0])):
        if os.path.basename(path) <= mine or path == ours:
            continue
        for line in (text or "").splitlines():
            m = DEFAULT_ASSIGN_RE.match(line.split("#", 1)[0] if not line.lstrip().startswith("#") else "")
            if m and "GRUB_CMDLINE_LINUX_DEFAULT" not in m.group(1):
                out.append(path)
                break
    return out


# ---- reading the record through a HostFS (kernel_cmdline_info, kernel_cmdline) ----------------------
def foreign_texts(fs) -> list[str]:
    """/etc/default/grub and every grub.d drop-in but ours: where arguments set outside this module live."""
    texts = [fs.read_optional(GRUB_DEFAULTS) or ""]
    texts += [fs.read_optional(f"{DROPIN_DIR}/{n}") or "" for n in fs.listdir(DROPIN_DIR)
              if n.endswith(".cfg") and f"{DROPIN_DIR}/{n}" != DROPIN]
    return texts


def gather(fs, owner: str | None = None) -> dict:
    """The owners' arguments against /proc/cmdline. Raises CmdlineError or HostFSError."""
    text = fs.read_optional(PROC_CMDLINE)
    if text is None:
        raise CmdlineError(f"Cannot read {PROC_CMDLINE} under root {fs.root}: run the module on a Linux host with /proc mounted.")
    current = split_cmdline(text)
    saved = parse_state(fs.read_text(STATE_FILE) if fs.exists(STATE_FILE) else None, fs.path(STATE_FILE))
    foreign: list[str] = []
    if fs.exists(DROPIN):
        owners, _stray = parse_dropin(fs.read_text(DROPIN))
        source = "dropin"
        foreign = foreign_grub_args(foreign_texts(fs))
    elif saved["owners"]:
        owners, source = saved["owners"], "state"
    else:
        owners, source = {}, "none"
    result = status(owners, current, saved["pending_removal"], owner, foreign)
    result.update(owners=owners, source=source, pending_removal=saved["pending_removal"])
    return result

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure logic of the kernel upgrade: may this host take a new kernel through a one-shot boot, and
which GRUB entry boots which kernel?

Parsers (``/etc/default/grub`` and its ``grub.d`` drop-ins, ``grubenv``, ``grub.cfg``, ``/proc/mounts``,
``apt-get -s`` output), and the preflight decisions, each returned as a check with ``ok``, the
``reason`` and, when it fails, the ``fix``. Nothing here reads a file or runs a command: the modules
``kernel_upgrade_preflight`` and ``kernel_boot_entry`` gather the text through the one I/O seam and
pass it in.

Why each check exists:

* ``grub_default``: ``grub-reboot`` (boot the new kernel once) and ``grub-set-default`` only work
  with ``GRUB_DEFAULT=saved``; with ``GRUB_SAVEDEFAULT=true`` GRUB would save the one-shot entry as
  the default on the way, and a kernel that hangs would be booted again and again.
* ``grubenv``: the one-shot entry lives in ``/boot/grub/grubenv`` (exactly 1024 bytes), which GRUB
  itself must be able to rewrite at boot to clear it. It cannot on LVM, MD RAID, btrfs or ZFS
  (man grub-reboot): the new kernel would stay the next boot after a failure.
* ``boot_space``: the new kernel and its initramfs must fit in ``/boot``.
* ``old_kernel``: the running kernel stays installed and bootable (the way back); an install that
  would remove its package is refused.
* ``target``: the target kernel package is available (or already installed).
* ``driver``: where a GPU driver module is used, one must exist for the new kernel, or the host
  comes back without its GPUs (DKMS not built).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

GRUB_DEFAULTS = "/etc/default/grub"
GRUB_DROPIN_DIR = "/etc/default/grub.d"
# Our drop-in when the role may set GRUB_DEFAULT=saved (an explicit opt-in). It sorts after the
# cloud images' 50-cloudimg-settings.cfg, which may set GRUB_DEFAULT itself.
SAVED_DROPIN = GRUB_DROPIN_DIR + "/98-gpufleet-kernel-upgrade.cfg"
SAVED_DROPIN_TEXT = """\
# Managed by Ansible (gpufleet.inference.kernel_upgrade). grub-reboot and grub-set-default need the
# saved default; GRUB must never save the entry it boots by itself (a one-shot boot into a kernel
# that fails would then stick).
GRUB_DEFAULT=saved
GRUB_SAVEDEFAULT=false
"""
GRUB_CFG = "/boot/grub/grub.cfg"
GRUBENV = "/boot/grub/grubenv"
GRUBENV_SIZE = 1024
GRUBENV_HEADER = "# GRUB Environment Block"
# Where GRUB cannot write its environment block at boot (man grub-reboot, grub-editenv).
UNWRITABLE_FSTYPES = ("btrfs", "zfs")
UNWRITABLE_DEVICE_RE = re.compile(r"^/dev/(mapper/|dm-|md)")
DRIVER_FILE_RE = re.compile(r"^(?P<name>[A-Za-z0-9_-]+)\.ko(\.(xz|zst|gz))?$")
# /boot files of one kernel, and how much larger a new one may be than the running one.
BOOT_FILES = ("vmlinuz-{v}", "initrd.img-{v}", "System.map-{v}", "config-{v}")
BOOT_SPACE_FACTOR = 1.3
BOOT_SPACE_SLACK = 16 * 1024 * 1024
VERSION_RE = re.compile(r"^[0-9][A-Za-z0-9._+~-]*$")

_ASSIGN_RE = re.compile(r"^\s*(?:export\s+)?(GRUB_DEFAULT|GRUB_SAVEDEFAULT)=(.*)$")
_ENTRY_RE = re.compile(r"^\s*(menuentry|submenu)\s+(.*)\{\s*$")
_QUOTED_RE = re.compile(r"'([^']*)'|\"([^\"]*)\"")
_ID_RE = re.compile(r"(?:\$menuentry_id_option|--id)\s+(?:'([^']*)'|\"([^\"]*)\"|(\S+))")
_LINUX_RE = re.compile(r"^\s*linux(?:16|efi)?\s+(\S+)\s*(.*)$")
_VMLINUZ_RE = re.compile(r"(?:^|/)vmlinu[xz]-(.+)$")


class KernelUpgradeError(ValueError):
    """Input that cannot be judged; the message says what, where and what to do."""


def check(name: str, ok: bool, reason: str, fix: str = "") -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "reason": reason, "fix": "" if ok else fix}


def validate_version(version: str, what: str = "kernel version") -> str:
    if not isinstance(version, str) or not VERSION_RE.match(version):
        raise KernelUpgradeError(f"{what} {version!r} is not a kernel release as uname -r prints it "
                                 "(for example 6.1.0-56-cloud-amd64): set it to the release of the target kernel.")
    return version


# ---- /etc/default/grub and grub.d ---------------------------------------------------------------
def _shell_value(raw: str) -> str:
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
            m = _ASSIGN_RE.match(line)
            if not m:
                continue
            value = _shell_value(m.group(2))
            if m.group(1) == "GRUB_DEFAULT":
                out["default"], out["default_from"] = value, path
            else:
                out["savedefault"], out["savedefault_from"] = value == "true", path
    return out


def dropin_order(names: Iterable[str]) -> list[str]:
    """grub.d drop-ins in the order grub-mkconfig sources them (``*.cfg``, C-locale sort)."""
    return sorted(n for n in names if n.endswith(".cfg"))


def check_grub_default(settings: dict[str, Any], fix_allowed: bool, dropin_present: bool = False) -> dict[str, Any]:
    """GRUB_DEFAULT=saved and GRUB_SAVEDEFAULT not true; with ``fix_allowed`` a failing value counts
    as fixable (the module then writes SAVED_DROPIN and runs update-grub)."""
    default, savedefault = settings["default"], settings["savedefault"]
    if default == "saved" and not savedefault:
        return check("grub_default", True, f"GRUB_DEFAULT=saved (set in {settings['default_from']}), GRUB_SAVEDEFAULT is not true")
    problems = []
    if default != "saved":
        problems.append(f"GRUB_DEFAULT={default} (set in {settings['default_from'] or 'nowhere: grub-mkconfig uses 0'})")
    if savedefault:
        problems.append(f"GRUB_SAVEDEFAULT=true (set in {settings['savedefault_from']}), which would make a one-shot "
                        "boot into a failing kernel stick")
    reason = "; ".join(problems) + ": grub-reboot (boot the new kernel once) and grub-set-default need GRUB_DEFAULT=saved"
    fix = (f"Set kernel_upgrade_fix_grub_default: true to let the role write {SAVED_DROPIN} (GRUB_DEFAULT=saved, "
           "GRUB_SAVEDEFAULT=false) and run update-grub, or set them in /etc/default/grub yourself and run update-grub.")
    if dropin_present:
        fix = (f"{SAVED_DROPIN} is there but a file sourced after it overrides it; remove the later assignment and run "
               "update-grub.")
    out = check("grub_default", False, reason, fix)
    out["fixable"] = fix_allowed and not dropin_present
    return out


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


def mount_for(path: str, mounts_text: str | None) -> dict[str, str] | None:
    """The /proc/mounts entry whose mount point is the longest prefix of ``path``."""
    best = None
    for line in (mounts_text or "").splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        device, point, fstype = parts[0], parts[1].replace("\\040", " "), parts[2]
        prefix = point.rstrip("/") + "/"
        if (path == point or path.startswith(prefix) or point == "/") and (best is None or len(point) > len(best["point"])):
            best = {"device": device, "point": point, "fstype": fstype}
    return best


def check_grubenv(env: dict[str, Any], writable: bool, mount: dict[str, str] | None) -> dict[str, Any]:
    fix_create = f"Create it with: grub-editenv {GRUBENV} create"
    if env["problem"] == "missing":
        return check("grubenv", False, f"{GRUBENV} does not exist, so GRUB has nowhere to keep the one-shot entry", fix_create)
    if not env["valid"]:
        return check("grubenv", False, f"{GRUBENV} is not a GRUB environment block ({env['problem']})",
                     f"Move it away and recreate it: grub-editenv {GRUBENV} create; then grub-set-default to the running kernel's entry.")
    if not writable:
        return check("grubenv", False, f"{GRUBENV} is not writable here (read-only /boot, or not root)",
                     "Run the role with become: true on a host whose /boot is mounted read-write.")
    if mount and (mount["fstype"] in UNWRITABLE_FSTYPES or UNWRITABLE_DEVICE_RE.match(mount["device"])):
        return check("grubenv", False,
                     f"{GRUBENV} sits on {mount['device']} ({mount['fstype']}) at {mount['point']}: GRUB cannot rewrite it at boot "
                     "there, so a one-shot entry would stay the next boot after a failed boot (man grub-reboot)",
                     "Put /boot on a plain partition (ext4 or vfat), or upgrade this host by hand with console access.")
    where = f" on {mount['device']} ({mount['fstype']})" if mount else ""
    return check("grubenv", True, f"{GRUBENV} is a valid, writable environment block{where}")


# ---- grub.cfg -------------------------------------------------------------------------------------
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
        lm = _LINUX_RE.match(line)
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


# ---- installed kernels, /boot space, drivers -----------------------------------------------------------
def installed_kernels(boot_names: Iterable[str], module_dirs: Iterable[str]) -> list[str]:
    """Versions with a /boot/vmlinuz-<v> and a /lib/modules/<v> directory, sorted."""
    modules = set(module_dirs)
    found = set()
    for name in boot_names:
        m = re.match(r"^vmlinu[xz]-(.+)$", name)
        if m and m.group(1) in modules and not m.group(1).endswith((".old", ".bak", ".dpkg-tmp")):
            found.add(m.group(1))
    return sorted(found, key=version_key)


def version_key(version: str) -> list:
    """Sort key that orders 6.1.0-9 before 6.1.0-56 (numbers as numbers)."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", version) if p]


def boot_space_needed(file_sizes: dict[str, int], running: str, override_bytes: int = 0) -> int:
    """Bytes a new kernel needs in /boot: the running kernel's files x BOOT_SPACE_FACTOR + slack."""
    if override_bytes > 0:
        return override_bytes
    total = sum(file_sizes.get(f.format(v=running), 0) for f in BOOT_FILES)
    return int(total * BOOT_SPACE_FACTOR) + BOOT_SPACE_SLACK


def check_boot_space(free_bytes: int, needed_bytes: int, target_installed: bool, boot_mount: str = "/boot") -> dict[str, Any]:
    mib = 1024 * 1024
    if target_installed:
        return check("boot_space", True, "the target kernel is already installed: nothing more goes to /boot")
    if free_bytes >= needed_bytes:
        return check("boot_space", True, f"{free_bytes // mib} MiB free on {boot_mount}, {needed_bytes // mib} MiB needed")
    return check("boot_space", False,
                 f"{free_bytes // mib} MiB free on {boot_mount} ({boot_mount} holds /boot) but the new kernel and its "
                 f"initramfs need about {needed_bytes // mib} MiB",
                 "Remove kernels that are neither running nor the target (apt-get purge linux-image-<old version>), or "
                 "set kernel_upgrade_boot_space_mb if the estimate is wrong for this host.")


def driver_files(paths: Iterable[str], names: Iterable[str]) -> list[str]:
    """Module files (``nvidia.ko``, ``.ko.xz``, ``.ko.zst``, ``.ko.gz``) among ``paths`` for the driver ``names``."""
    wanted = set(names)
    out = []
    for path in paths:
        m = DRIVER_FILE_RE.match(path.rsplit("/", 1)[-1])
        if m and m.group("name") in wanted:
            out.append(path)
    return sorted(out)


def driver_required(mode: str, loaded: Iterable[str], names: Iterable[str]) -> bool:
    """``required``: always; ``none``: never; ``auto``: when one of the driver modules is loaded now."""
    if mode == "required":
        return True
    if mode == "none":
        return False
    return bool(set(loaded) & set(names))


def check_driver(required: bool, names: list[str], version: str, found: list[str], phase: str,
                 dkms_modules: Iterable[str] = ()) -> dict[str, Any]:
    shown = "/".join(names)
    if not required:
        return check("driver", True, f"no GPU driver module ({shown}) is in use: nothing to check")
    if found:
        return check("driver", True, f"{shown} module for {version}: {', '.join(found)}")
    dkms = sorted(set(dkms_modules) & set(names))
    if phase == "preflight" and dkms:
        return check("driver", True, f"no {shown} module for {version} yet; DKMS holds {', '.join(dkms)} and builds it "
                     "when the kernel is installed (checked again before the reboot)")
    return check("driver", False,
                 f"no {shown} module for {version} under /lib/modules/{version}/ (nvidia.ko, .ko.xz, .ko.zst or .ko.gz), and "
                 f"{'no DKMS tree for it' if phase == 'preflight' else 'the install did not build one'}: the host would "
                 "come back without its GPUs",
                 f"Install the driver build for {version} (DKMS: apt-get install linux-headers-{version}, then dkms autoinstall "
                 f"-k {version}; or the precompiled driver package for that kernel), or set kernel_upgrade_driver: none if "
                 "this host uses no GPU driver module.")


# ---- apt ---------------------------------------------------------------------------------------------
def parse_apt_simulation(rc: int, out: str, err: str) -> dict[str, Any]:
    """``apt-get install -s`` -> {available, installs: [(name, version)], removes: [name], error}."""
    installs, removes = [], []
    for line in (out or "").splitlines():
        m = re.match(r"^Inst (\S+) (?:\[[^\]]*\] )?\(([^ )]+)", line)
        if m:
            installs.append((m.group(1), m.group(2)))
            continue
        m = re.match(r"^Remv (\S+)", line)
        if m:
            removes.append(m.group(1))
    error = None
    if rc != 0:
        lines = [ln for ln in (err or out or "").splitlines() if ln.startswith("E:")] or (err or out or "").strip().splitlines()[-3:]
        error = " ".join(ln.strip() for ln in lines) or f"apt-get exited {rc}"
    return {"available": rc == 0, "installs": installs, "removes": removes, "error": error}


def check_target(target: str, package: str, installed: list[str], sim: dict[str, Any] | None) -> dict[str, Any]:
    if target in installed:
        return check("target", True, f"{target} is installed already ({package})")
    if sim is None:
        return check("target", False, f"{target} is not installed and there is no package manager answer for {package}",
                     "Install python3-apt/apt on the host, or install the kernel by hand.")
    if not sim["available"]:
        return check("target", False, f"{package} cannot be installed: {sim['error']}",
                     f"Check kernel_upgrade_target ({target}) and kernel_upgrade_package against what the repositories offer "
                     f"(apt-cache policy {package}; apt-get update); the host stays on its kernel.")
    version = next((v for n, v in sim["installs"] if n == package), None)
    return check("target", True, f"{package} is available{' (' + version + ')' if version else ''}")


def check_old_kernel(running: str, installed: list[str], entries: list[dict[str, Any]], removes: Iterable[str],
                     old_packages: Iterable[str]) -> dict[str, Any]:
    if running not in installed:
        return check("old_kernel", False, f"the running kernel {running} has no /boot/vmlinuz-{running} or /lib/modules/{running}: "
                     "there would be no kernel to fall back to",
                     f"Reinstall the running kernel's package (apt-get install --reinstall linux-image-{running}) first.")
    entry = entry_for(entries, running)
    if entry is None:
        return check("old_kernel", False, f"no GRUB entry boots the running kernel {running}, so the old default cannot be pinned",
                     "Run update-grub and check /boot/grub/grub.cfg.")
    removed = sorted(set(removes) & set(old_packages))
    if removed:
        return check("old_kernel", False, f"installing the target would remove {', '.join(removed)}, the running kernel",
                     "Hold the running kernel's package (apt-mark hold) or install the target by hand.")
    return check("old_kernel", True, f"{running} stays installed and bootable through '{entry['path']}'")


def decide(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """The preflight verdict from its checks: ok, the failed ones, and a message with reasons and fixes."""
    failed = [c for c in checks if not c["ok"]]
    if not failed:
        return {"ok": True, "failed_checks": [], "msg": "preflight passed: " + "; ".join(c["reason"] for c in checks)}
    msg = "preflight failed, the host stays on its kernel: " + " | ".join(
        f"{c['name']}: {c['reason']}. {c['fix']}".strip() for c in failed)
    return {"ok": False, "failed_checks": [c["name"] for c in failed], "msg": msg}


def boot_plan(entries: list[dict[str, Any]], env_vars: dict[str, str], version: str, mode: str) -> dict[str, Any]:
    """What kernel_boot_entry must do so that ``version`` boots by default (``mode=default``) or once.

    Returns {entry, actions: [{action, entry}], saved, next}; raises KernelUpgradeError when no entry boots it.
    """
    entry = entry_for(entries, version)
    if entry is None:
        known = sorted({e["version"] for e in entries if e["version"]}, key=version_key)
        raise KernelUpgradeError(f"no GRUB menu entry in {GRUB_CFG} boots kernel {version} (entries boot: "
                                 f"{', '.join(known) or 'none'}). Is the kernel installed? Run update-grub.")
    saved = env_vars.get("saved_entry")
    nxt = env_vars.get("next_entry")
    actions: list[dict[str, Any]] = []
    if mode == "default":
        current = resolve_saved(entries, saved)
        if saved != entry["path"] or current is None or current["version"] != version:
            actions.append({"action": "set_default", "entry": entry["path"]})
        if nxt:
            actions.append({"action": "clear_once", "entry": nxt})
    elif mode == "once":
        if nxt != entry["path"]:
            actions.append({"action": "set_once", "entry": entry["path"]})
    else:
        raise KernelUpgradeError(f"boot must be default or once, got {mode!r}")
    return {"entry": entry, "actions": actions, "saved": saved, "next": nxt}

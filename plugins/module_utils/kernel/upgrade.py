# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure logic of the kernel upgrade: may this host take a new kernel through a one-shot boot, and
which GRUB entry boots which kernel?

Parsers (``/proc/mounts``, ``apt-get -s`` output; the GRUB files are read by ``grub.py``, the one GRUB
library, whose names stay importable from here), and the preflight decisions, each returned as a check with ``ok``, the
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

# The GRUB files and their parsers live in kernel/grub.py; kept importable from here for the callers that
# know them by this module (kernel/journal.py, kernel/kernel_upgrade_preflight.py, kernel/kernel_boot_entry.py).
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.grub import (
    GRUB_CFG, GRUB_DROPIN_DIR, GRUBENV, entry_for, resolve_saved,
)

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
# Where GRUB cannot write its environment block at boot (man grub-reboot, grub-editenv).
UNWRITABLE_FSTYPES = ("btrfs", "zfs")
UNWRITABLE_DEVICE_RE = re.compile(r"^/dev/(mapper/|dm-|md)")
DRIVER_FILE_RE = re.compile(r"^(?P<name>[A-Za-z0-9_-]+)\.ko(\.(xz|zst|gz))?$")
# /boot files of one kernel, and how much larger a new one may be than the running one.
BOOT_FILES = ("vmlinuz-{v}", "initrd.img-{v}", "System.map-{v}", "config-{v}")
BOOT_SPACE_FACTOR = 1.3
BOOT_SPACE_SLACK = 16 * 1024 * 1024
# A kernel release as uname -r prints it: major.minor, then letters, digits and . _ + ~ - (64 at most, the
# kernel's own limit). No space, newline or glob: the release reaches systemd units
# (ConditionKernelVersion=) and GRUB entries.
VERSION_RE = re.compile(r"[0-9]+\.[0-9]+[A-Za-z0-9._+~-]{0,60}")
VERSION_FORM = ("major.minor, then only letters, digits and . _ + ~ - (no space, newline or glob), 64 characters at "
                "most, for example 6.1.0-56-cloud-amd64")


class KernelUpgradeError(ValueError):
    """Input that cannot be judged; the message says what, where and what to do."""


def check(name: str, ok: bool, reason: str, fix: str = "") -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "reason": reason, "fix": "" if ok else fix}


def validate_version(version: str, what: str = "kernel version") -> str:
    if not isinstance(version, str) or not VERSION_RE.fullmatch(version):
        raise KernelUpgradeError(f"{what} {version!r} is not a kernel release as uname -r prints it ({VERSION_FORM}): "
                                 "set it to the release of the kernel.")
    return version


# ---- /etc/default/grub and grub.d (parsed by grub.py) -------------------------------------------
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


# ---- grubenv (parsed by grub.py) --------------------------------------------------------------------
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

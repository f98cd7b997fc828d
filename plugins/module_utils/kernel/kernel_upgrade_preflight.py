# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.kernel_upgrade_preflight executes: read the GRUB settings, grubenv, /boot, the
installed kernels, the driver modules and the package manager's answer through the Host's files (HostFS) and
commands (HostCmd), let the kernel/upgrade.py checks decide, and (on request) write the GRUB_DEFAULT=saved drop-in and
run update-grub. Failures are raised (_host/result.py's Failed), never fail_json-ed here.
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.grub import (
    GRUB_CFG, GRUB_DEFAULTS, GRUB_DROPIN_DIR, GRUBENV, dropin_order, entry_for, grub_settings, parse_grub_cfg, parse_grubenv,
    resolve_saved,
)
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.upgrade import (
    SAVED_DROPIN, SAVED_DROPIN_TEXT, KernelUpgradeError, boot_space_needed, check_boot_space, check_driver, check_grub_default,
    check_grubenv, check_old_kernel, check_target, decide, driver_files, driver_required, installed_kernels, mount_for,
    parse_apt_simulation, validate_version, BOOT_FILES,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.flow import FlowError
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.journal import JOURNAL, load_journal

MAX_WALK = 20000


class BootReads:
    """The reads of the host this module decides on: its files under root (HostFS), /boot's free space and file sizes."""

    def __init__(self, fs: HostFS):
        self.fs = fs

    def running(self) -> str:
        text = self.fs.read_optional("/proc/sys/kernel/osrelease")
        if not text:
            raise Failed(msg=f"Cannot read /proc/sys/kernel/osrelease under root {self.fs.root}: the running kernel is "
                             "unknown. Run the module on a Linux host with /proc mounted.")
        return text.strip()

    def grub_files(self) -> list[tuple[str, str | None]]:
        files = [(GRUB_DEFAULTS, self.fs.read_optional(GRUB_DEFAULTS))]
        for name in dropin_order(self.fs.listdir(GRUB_DROPIN_DIR)):
            files.append((f"{GRUB_DROPIN_DIR}/{name}", self.fs.read_optional(f"{GRUB_DROPIN_DIR}/{name}")))
        return files

    def grubenv(self) -> bytes | None:
        return self.fs.read_bytes(GRUBENV) if self.fs.exists(GRUBENV) else None

    def writable(self, host_path: str) -> bool:
        return os.access(self.fs.path(host_path), os.W_OK)

    def boot_free(self) -> int:
        st = os.statvfs(self.fs.path("/boot"))
        return st.f_bavail * st.f_frsize

    def boot_sizes(self, version: str) -> dict[str, int]:
        out = {}
        for pattern in BOOT_FILES:
            name = pattern.format(v=version)
            path = self.fs.path(f"/boot/{name}")
            if os.path.isfile(path):
                out[name] = os.path.getsize(path)
        return out

    def module_files(self, version: str) -> list[str]:
        base = self.fs.path(f"/lib/modules/{version}")
        out: list[str] = []
        for dirpath, _dirs, names in os.walk(base):
            for name in names:
                out.append(os.path.relpath(os.path.join(dirpath, name), base))
                if len(out) > MAX_WALK * 10:
                    return out
        return out

    def dkms_modules(self) -> list[str]:
        return self.fs.listdir("/var/lib/dkms")

    def loaded_modules(self) -> list[str]:
        return self.fs.listdir("/sys/module")


def check_in_progress(fs: HostFS, running: str, default: str | None) -> dict:
    """An upgrade left half-way: a journal (the role resumes it), or none while the host runs a kernel
    other than its saved default (a one-shot boot nobody recorded: refused, with what to do)."""
    try:
        journal = load_journal(fs, JOURNAL)
    except FlowError as err:
        return {"name": "in_progress", "ok": False, "reason": str(err).split(": nothing was changed", maxsplit=1)[0],
                "fix": str(err)}
    if journal is not None:
        return {"name": "in_progress", "ok": True, "fix": "",
                "reason": f"an upgrade from {journal['old']} to {journal['target']} (run {journal.get('run_id') or '?'}) is in "
                          f"progress at stage {journal['stage']} ({JOURNAL}): the role resumes it"}
    if default is not None and default != running:
        return {"name": "in_progress", "ok": False,
                "reason": f"the host runs {running} but its saved GRUB default is {default}, and there is no upgrade "
                          f"journal ({JOURNAL}): a one-shot boot was left half-way, and a baseline on {running} would "
                          "not be a baseline of the kernel the host boots",
                "fix": f"To go back, reboot (GRUB boots {default}); to keep {running}, check it and make it the default "
                       f"(grub-set-default with its 'submenu>entry' id). Then run again."}
    return {"name": "in_progress", "ok": True, "fix": "", "reason": "no upgrade is in progress (no journal; the host runs "
            "its saved default)"}


def target_of(p: dict) -> str:
    """The target kernel release, checked (Failed, nothing done, when it is not one)."""
    try:
        return validate_version(p["target"], "target")
    except KernelUpgradeError as err:
        raise Failed(msg=str(err)) from None


def refuse_unsupported(host: Host) -> None:
    """Failed on a host this flow does not drive: grubby without update-grub (EL), or no grub.cfg (no GRUB 2)."""
    if host.cmd.find("grubby") and not host.cmd.find("update-grub"):
        raise Failed(msg="This host boots through grubby (EL): the kernel_upgrade flow supports Debian and Ubuntu with GRUB 2 "
                         "(update-grub, grub-reboot) only for now. Upgrade EL hosts by hand (grubby --set-default).")
    if not host.fs.exists(GRUB_CFG):
        raise Failed(msg=f"{GRUB_CFG} does not exist under root {host.fs.root}: this host does not boot through GRUB 2 "
                         "(systemd-boot, a unified kernel image or a cloud provider's direct kernel boot?). The one-shot "
                         "boot this flow relies on needs GRUB; upgrade the kernel another way.")


def grub_default(p: dict, host: Host, reads: BootReads, check_mode: bool) -> tuple[dict, list[dict]]:
    """(the GRUB_DEFAULT check, the actions): with ``fix_grub_default``, a GRUB_DEFAULT that is not saved is fixed by
    the drop-in and update-grub (outside check mode), which are put back when update-grub fails."""
    settings = grub_settings(reads.grub_files())
    grub_check = check_grub_default(settings, p["fix_grub_default"], host.fs.exists(SAVED_DROPIN))
    actions: list[dict] = []
    if not grub_check["ok"] and grub_check.get("fixable"):
        update = host.cmd.find("update-grub") or host.cmd.find("grub-mkconfig")
        if not update:
            raise Failed(msg="GRUB_DEFAULT must be set to saved but neither update-grub nor grub-mkconfig is installed: "
                             "install grub2-common.")
        argv = [update] if update.endswith("update-grub") else [update, "-o", GRUB_CFG]
        actions = [{"action": "write_dropin", "path": SAVED_DROPIN}, {"action": "update_grub", "argv": host.cmd.argv(argv)}]
        if not check_mode:
            host.fs.write_atomic(SAVED_DROPIN, SAVED_DROPIN_TEXT, 0o644)
            rc, out, err = host.cmd.run_in_root(argv)
            if rc != 0:
                host.fs.remove(SAVED_DROPIN)
                raise Failed(msg=f"'{' '.join(argv)}' exited {rc}: {(err or out).strip()[-600:]}. {SAVED_DROPIN} was removed "
                                 "again; fix the GRUB configuration and run again.", rc=rc, stderr=err)
            grub_check = check_grub_default(grub_settings(reads.grub_files()), False, True)
        else:
            grub_check = dict(grub_check, ok=True, fix="",
                              reason=f"would write {SAVED_DROPIN} (GRUB_DEFAULT=saved) and run update-grub: {grub_check['reason']}")
    grub_check.pop("fixable", None)
    return grub_check, actions


def package_answers(p: dict, host: Host, package: str, simulate: bool) -> tuple[dict | None, list[str]]:
    """(apt-get's simulated install of ``package``, when ``simulate`` and apt-get is there; the held packages)."""
    sim = None
    if simulate:
        apt_get = host.cmd.find("apt-get")
        if apt_get:
            spec = f"{package}={p['package_version']}" if p["package_version"] else package
            rc, out, err = host.cmd.run_in_root([apt_get, "install", "-s", "--no-install-recommends", spec])
            sim = parse_apt_simulation(rc, out, err)
    held: list[str] = []
    apt_mark = host.cmd.find("apt-mark")
    if apt_mark:
        rc, out, _err = host.cmd.run_in_root([apt_mark, "showhold"])
        if rc == 0:
            held = sorted(line.strip() for line in out.splitlines() if line.strip())
    return sim, held


def installed_check(target: str, package: str, target_installed: bool, entries: list[dict]) -> dict:
    """The check of the phase after the install: the target is installed, with a GRUB entry."""
    if not target_installed:
        return {"name": "installed", "ok": False, "reason": f"{target} is not installed after the install step",
                "fix": f"Look at the install's output (apt-get install {package}) on the host."}
    if entry_for(entries, target) is None:
        return {"name": "installed", "ok": False, "reason": f"no GRUB entry boots {target} in {GRUB_CFG}",
                "fix": "Run update-grub and check its output; the kernel's postinst hook should have done it."}
    return {"name": "installed", "ok": True, "reason": f"{target} is installed with a GRUB entry", "fix": ""}


def gather_and_decide(p: dict, host: Host, check_mode: bool) -> dict:
    """Read the host, run every check, decide; the result (``actions``: the GRUB_DEFAULT fix, when asked and needed)."""
    target = target_of(p)
    package = p["package"] or f"linux-image-{target}"
    reads = BootReads(host.fs)
    running = reads.running()
    running_package = f"linux-image-{running}"
    refuse_unsupported(host)
    grub_check, actions = grub_default(p, host, reads, check_mode)

    env = parse_grubenv(reads.grubenv())
    mount = mount_for("/boot/grub", host.fs.read_optional("/proc/mounts"))
    env_check = check_grubenv(env, reads.writable(GRUBENV) if env["size"] is not None else False, mount)
    entries = parse_grub_cfg(host.fs.read_optional(GRUB_CFG))
    installed = installed_kernels(host.fs.listdir("/boot"), host.fs.listdir("/lib/modules"))
    target_installed = target in installed
    sim, held = package_answers(p, host, package, not target_installed or p["phase"] == "preflight")

    boot_mount = mount_for("/boot", host.fs.read_optional("/proc/mounts"))
    needed = boot_space_needed(reads.boot_sizes(running), running, p["boot_space_mb"] * 1024 * 1024)
    names = p["driver_modules"]
    dkms = [m for m in reads.dkms_modules() if host.fs.isdir(f"/var/lib/dkms/{m}")]
    required = driver_required(p["driver"], reads.loaded_modules(), names)
    found = driver_files(reads.module_files(target), names) if required else []

    checks = [grub_check, env_check,
              check_boot_space(reads.boot_free(), needed, target_installed, boot_mount["point"] if boot_mount else "/boot"),
              check_old_kernel(running, installed, entries, sim["removes"] if sim else [], [running_package]),
              check_target(target, package, installed, sim),
              check_driver(required, names, target, found, p["phase"], dkms)]
    if p["phase"] == "installed":
        checks.append(installed_check(target, package, target_installed, entries))
    saved = env["vars"].get("saved_entry")
    default_entry = resolve_saved(entries, saved)
    checks.append(check_in_progress(host.fs, running, default_entry["version"] if default_entry else None))
    running_entry = entry_for(entries, running)
    target_entry = entry_for(entries, target)
    return dict(
        decide(checks), checks=checks, running=running, target=target, package=package, running_package=running_package,
        target_installed=target_installed, installed=installed, held=held, driver_required=required, dkms_modules=dkms,
        running_entry=running_entry["path"] if running_entry else None,
        target_entry=target_entry["path"] if target_entry else None,
        default_version=default_entry["version"] if default_entry else None,
        saved_entry=saved, next_entry=env["vars"].get("next_entry") or None,
        entries=[{k: e[k] for k in ("title", "id", "path", "version", "recovery")} for e in entries],
        actions=actions, changed=bool(actions))


def execute(params: dict, host: Host, check_mode: bool) -> dict:
    """The module's result, with the drop-in's diff (returned in diff mode) when it is written."""
    result = gather_and_decide(params, host, check_mode)
    if result["actions"]:
        result["diff"] = {"before": "", "after": SAVED_DROPIN_TEXT, "before_header": SAVED_DROPIN, "after_header": SAVED_DROPIN}
    return result

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.kernel_cmdline executes: find the bootloader (the Debian drop-in with update-grub,
or grubby on EL), read the owners and the running kernel's arguments, refuse what would not reach the
kernel, write the drop-in or run grubby, regenerate grub.cfg, keep the state file, and read it all back.
The pure parsing and planning is in kernel_cmdline.py; commands go through HostCmd (chroot, C locale),
failures are raised (hostfs.Failed, CmdlineError), never fail_json-ed here.
"""

from __future__ import annotations

import json
import os

from ansible_collections.gpufleet.inference.plugins.module_utils._host.commands import HostCmd
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.cmdline import (
    DROPIN, DROPIN_DIR, GRUB_CFG, GRUB_DEFAULTS, PROC_CMDLINE, STATE_FILE, change_owner, check_length,
    find_conflicts, foreign_texts, grub_cfg_kernel, overriding_dropins, predicted_cmdline, foreign_conflicts,
    foreign_grub_args, grub_cfg_args, parse_dropin, parse_grubby_info, parse_state, pending_after, plan_dropin,
    plan_grubby, render_state, split_cmdline, status, wanted_args,
)


class Bootloader(HostCmd):
    """Finds and runs the bootloader tools (HostCmd: under root, through chroot, in the C locale)."""

    def detect(self, wanted: str) -> tuple[str, list[str]]:
        """(bootloader, argv of the command that applies the configuration)."""
        where = "" if self.fs.root == "/" else f" under root {self.fs.root}"
        if wanted in ("auto", "grubby"):
            grubby = self.find("grubby", required=wanted == "grubby")
            if grubby:
                return "grubby", [grubby]
        if not self.fs.exists(GRUB_DEFAULTS):
            raise Failed(msg=(
                f"GRUB files missing: {GRUB_DEFAULTS} does not exist{where}, and grubby is not installed. This module "
                "drives GRUB 2 (update-grub on Debian/Ubuntu, grubby on EL); hosts that boot through systemd-boot, "
                "a unified kernel image or a cloud provider's direct kernel boot need another way to set kernel arguments."))
        update = self.find("update-grub")
        if update:
            return "grub_dropin", [update]
        mkconfig = self.find("grub-mkconfig") or self.find("grub2-mkconfig")
        if mkconfig:
            return "grub_dropin", [mkconfig, "-o", GRUB_CFG]
        raise Failed(msg=(
            f"GRUB files missing: {GRUB_DEFAULTS} exists{where} but neither update-grub nor grub-mkconfig is installed, "
            "so the drop-in cannot be turned into grub.cfg. Install grub2-common (Debian/Ubuntu: apt-get install grub2-common)."))


class KernelCmdline:
    """Reads the owners and the running kernel's arguments, plans, applies."""

    def __init__(self, module, fs: HostFS, loader: Bootloader, bootloader: str, apply_argv: list[str]):
        self.module = module
        self.fs = fs
        self.loader = loader
        self.bootloader = bootloader
        self.apply_argv = apply_argv

    # ---- readers ----------------------------------------------------------------------------
    def read(self, path: str) -> str | None:
        """Exact file content (HostFS.read_text strips the last newline), None when absent."""
        return self.fs.read_exact(path)

    def current(self) -> list[str]:
        text = self.fs.read_optional(PROC_CMDLINE)
        if text is None:
            raise Failed(msg=f"Cannot read {PROC_CMDLINE} under root {self.fs.root}: the module compares the wanted "
                             "arguments with the running kernel's. Run it on a Linux host with /proc mounted.")
        return split_cmdline(text)

    def grubby_entries(self, grubby: str) -> list[dict]:
        rc, out, err = self.loader.run(self.loader.argv([grubby, "--info=ALL"]))
        if rc != 0:
            raise Failed(msg=f"'{grubby} --info=ALL' exited {rc}: {(err or out).strip()}. grubby cannot read the boot "
                             "entries; check /boot/loader/entries and /etc/default/grub.", rc=rc, stderr=err)
        entries = parse_grubby_info(out)
        if not entries:
            raise Failed(msg=f"'{grubby} --info=ALL' listed no boot entry; nothing to add arguments to.")
        return entries

    def dropin_files(self) -> list[tuple[str, str | None]]:
        return [(f"{DROPIN_DIR}/{name}", self.fs.read_optional(f"{DROPIN_DIR}/{name}"))
                for name in self.fs.listdir(DROPIN_DIR) if name.endswith(".cfg")]

    def arch(self) -> str | None:
        arch = self.fs.read_optional("/proc/sys/kernel/arch")
        if arch:
            return arch.strip()
        return os.uname().machine if self.fs.root == "/" else None

    def guard(self, owners_before: dict, owners_after: dict, pending: dict, configured: list[str], entries: list[dict],
              grub_cfg: str | None) -> None:
        """Refuse, before any write, what would not reach the kernel: a later drop-in that resets
        GRUB_CMDLINE_LINUX_DEFAULT (ours would be dropped), or a command line over the architecture's limit."""
        wanted = wanted_args(owners_after)
        added = [a for a in wanted if a not in wanted_args(owners_before) or a not in configured]
        if self.bootloader == "grub_dropin" and added:
            over = overriding_dropins(self.dropin_files())
            if over:
                raise Failed(changed=False, overriding=over, msg=(
                    f"{', '.join(over)} {'sets' if len(over) == 1 else 'set'} GRUB_CMDLINE_LINUX_DEFAULT after {DROPIN} without "
                    "keeping its value, so grub-mkconfig would drop our arguments. Nothing was changed. Make it append "
                    '(GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} ...") or move its arguments to '
                    f"{GRUB_DEFAULTS}, then run again."))
        if not added:
            return
        dropped = list(pending) + [a for a in wanted_args(owners_before) if a not in wanted]
        if self.bootloader == "grub_dropin":
            lines = [predicted_cmdline(configured, grub_cfg_kernel(grub_cfg), wanted, dropped)]
        else:
            lines = [predicted_cmdline(e["args"], e["kernel"], wanted, dropped) for e in entries if not e["rescue"]]
        for line in lines:
            problem = check_length(line, self.arch())
            if problem:
                raise Failed(changed=False, msg=problem, cmdline_bytes=len(line.encode("utf-8")))

    # ---- the run ------------------------------------------------------------------------------
    def run(self, owner: str, args: list[str], state: str) -> dict:
        current = self.current()
        saved = parse_state(self.read(STATE_FILE), self.fs.path(STATE_FILE))
        dropin_before = None
        foreign: list[str] = []
        entries: list[dict] = []
        grub_cfg = None
        if self.bootloader == "grub_dropin":
            dropin_before = self.read(DROPIN)
            owners_before, stray = parse_dropin(dropin_before)
            if stray:
                self.module.warn(f"{DROPIN} holds lines this module did not write; they are dropped: {' | '.join(stray)}")
            foreign = foreign_grub_args(foreign_texts(self.fs))
            grub_cfg = self.fs.read_optional(GRUB_CFG)
            configured = grub_cfg_args(grub_cfg) or []
        else:
            owners_before = saved["owners"]
            entries = self.grubby_entries(self.apply_argv[0])
            configured = sorted({a for e in entries for a in e["args"]})
        owners_after = change_owner(owners_before, owner, args, state)
        if self.bootloader == "grubby" and any(";" in a for a in args):
            raise Failed(changed=False, msg=(
                f"{', '.join(a for a in args if ';' in a)}: a device list with ';' is not written through grubby (boot loader "
                "spec entries are parsed by GRUB, where ';' ends a command). Nothing was changed. Give one device per run "
                "of the owning role, or use the runtime clear with its boot unit (pcie_acs persist: true)."))
        conflicts = find_conflicts(owners_after, grubby=self.bootloader == "grubby")
        if conflicts:
            raise Failed(msg=(
                f"Conflicting kernel arguments, nothing changed: {'; '.join(conflicts)}. Keep one of them: change the "
                "variables of the owning roles (each owner's arguments are listed in the owners key of this result)."),
                owners=owners_after)
        pending = pending_after(saved["pending_removal"], owners_before, owners_after, owner, current, configured)
        self.guard(owners_before, owners_after, pending, configured, entries, grub_cfg if self.bootloader == "grub_dropin" else None)
        for warning in foreign_conflicts(owners_after, current, pending):
            self.module.warn(warning.capitalize() + ": our argument comes later on the command line; remove the other one "
                             "from /etc/default/grub (or with grubby) to be sure which value the kernel takes.")
        for arg in pending:
            if arg in foreign:
                self.module.warn(f"{arg} was removed by owner {pending[arg]} but {GRUB_DEFAULTS} (or another grub.d file) "
                                 "still sets it, so the kernel keeps it after the next boot.")

        actions: list[dict] = []
        if self.bootloader == "grub_dropin":
            plan = plan_dropin(dropin_before, owners_after, grub_cfg, list(pending), foreign)
            for action in plan["actions"]:
                if action["action"] == "update_grub":
                    action["argv"] = self.loader.argv(self.apply_argv)
                actions.append(action)
            diff = {"before": dropin_before or "", "after": plan["after"] or "", "before_header": DROPIN, "after_header": DROPIN}
        else:
            plan = plan_grubby(entries, owners_after, list(pending))
            grubby = self.apply_argv[0]
            if plan["remove"]:
                actions.append({"action": "grubby_remove", "args": plan["remove"],
                                "argv": self.loader.argv([grubby, "--update-kernel=ALL", "--remove-args=" + " ".join(plan["remove"])])})
            if plan["add"]:
                actions.append({"action": "grubby_add", "args": plan["add"],
                                "argv": self.loader.argv([grubby, "--update-kernel=ALL", "--args=" + " ".join(plan["add"])])})
            diff = {"before": json.dumps(owners_before, indent=2, sort_keys=True) + "\n",
                    "after": json.dumps(owners_after, indent=2, sort_keys=True) + "\n",
                    "before_header": f"{STATE_FILE} (owners)", "after_header": f"{STATE_FILE} (owners)"}

        # The state file: owners (grubby) and the removals the running kernel still has. Pruning
        # alone is no reason to write.
        kept = {a: o for a, o in pending.items() if a in current}
        new_state = {"owners": owners_after if self.bootloader == "grubby" else {}, "pending_removal": kept}
        state_text = render_state(new_state)
        old_text = render_state(saved)
        grew = set(kept) - set(saved["pending_removal"]) or (self.bootloader == "grubby" and owners_after != saved["owners"])
        if state_text != old_text and (grew or actions):
            actions.append({"action": "remove_state" if state_text is None else "write_state", "path": STATE_FILE})

        result = status(owners_after, current, pending, owner, foreign)
        result.update(bootloader=self.bootloader, owners=owners_after, actions=actions, changed=bool(actions))
        if self.module._diff:
            result["diff"] = diff
        if actions and not self.module.check_mode:
            self.apply(actions, dropin_before, plan, owners_after, state_text, foreign, pending)
        return result

    # ---- changers -----------------------------------------------------------------------------
    def apply(self, actions: list[dict], dropin_before: str | None, plan: dict, owners_after: dict,
              state_text: str | None, foreign: list[str], pending: dict) -> None:
        done: list[str] = []
        try:
            for action in actions:
                kind = action["action"]
                if kind == "write_dropin":
                    self.fs.write_atomic(DROPIN, plan["after"], 0o644)
                elif kind == "remove_dropin":
                    self.fs.remove(DROPIN)
                elif kind in ("update_grub", "grubby_add", "grubby_remove"):
                    rc, out, err = self.loader.run(action["argv"])
                    if rc != 0:
                        self.fail_command(action, rc, out, err, dropin_before, done)
                elif kind == "write_state":
                    self.fs.write_atomic(STATE_FILE, state_text, 0o644)
                elif kind == "remove_state":
                    self.fs.remove(STATE_FILE)
                done.append(kind)
        except HostFSError as err:
            raise Failed(msg=f"Writing the boot configuration failed after {', '.join(done) or 'no step'}: {err}. "
                             "Run the module as root (become: true) on a writable /etc and /boot.") from None
        self.verify(owners_after, foreign, pending)

    def fail_command(self, action: dict, rc: int, out: str, err: str, dropin_before: str | None, done: list[str]) -> None:
        cmd = " ".join(action["argv"])
        msg = f"'{cmd}' exited {rc}: {(err or out).strip()[-800:]}."
        if self.bootloader == "grub_dropin" and ("write_dropin" in done or "remove_dropin" in done):
            if dropin_before is None:
                self.fs.remove(DROPIN)
            else:
                self.fs.write_atomic(DROPIN, dropin_before, 0o644)
            msg += f" {DROPIN} was put back as it was; grub.cfg is unchanged or partly written, so run {cmd} by hand once fixed."
        else:
            msg += f" Done before the failure: {', '.join(done) or 'nothing'}."
        raise Failed(msg=f"Updating the boot configuration failed: {msg} Fix the bootloader configuration and run again.",
                     rc=rc, stdout=out, stderr=err)

    def verify(self, owners_after: dict, foreign: list[str], pending: dict) -> None:
        """Read the configuration back: it must hold what was asked."""
        wanted = wanted_args(owners_after)
        if self.bootloader == "grub_dropin":
            owners_now, _stray = parse_dropin(self.read(DROPIN))
            if owners_now != {o: a for o, a in owners_after.items() if a}:
                raise Failed(msg=f"{DROPIN} reads back {owners_now}, not {owners_after}: something else writes it.")
            cfg = grub_cfg_args(self.fs.read_optional(GRUB_CFG))
            if cfg is None:
                return
            missing = [a for a in wanted if a not in cfg]
            left = [a for a in pending if a in cfg and a not in wanted and a not in foreign]
            where = f"{GRUB_CFG}'s first boot entry"
        else:
            entries = [e for e in self.grubby_entries(self.apply_argv[0]) if not e["rescue"]]
            missing = [a for a in wanted if any(a not in e["args"] for e in entries)]
            left = [a for a in pending if a not in wanted and any(a in e["args"] for e in entries)]
            where = "a grubby boot entry"
        if missing or left:
            over = overriding_dropins(self.dropin_files()) if self.bootloader == "grub_dropin" else []
            raise Failed(changed=True, overriding=over, msg=(
                (f"{', '.join(over)} overrides GRUB_CMDLINE_LINUX_DEFAULT after {os.path.basename(DROPIN)}. " if over else "") +
                f"The bootloader tool succeeded but {where} still {'lacks ' + ', '.join(missing) if missing else ''}"
                f"{' and ' if missing and left else ''}{'has ' + ', '.join(left) if left else ''}. Another file overrides "
                f"{'GRUB_CMDLINE_LINUX_DEFAULT after ' + os.path.basename(DROPIN) if self.bootloader == 'grub_dropin' else 'the entries'}"
                "; check /etc/default/grub and /etc/default/grub.d/."))

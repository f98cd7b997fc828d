# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.kernel_cmdline executes: check the owner and its arguments, find the bootloader (the
Debian drop-in with update-grub, or grubby on EL), read the owners and the running kernel's arguments, refuse what
would not reach the kernel, write the drop-in or run grubby, regenerate grub.cfg, keep the state file, and read it all
back. On a host without GRUB and grubby (systemd-boot, direct kernel boot) a run with nothing to add or remove is a
no-op with a note; one that asks for arguments fails, saying what to do by hand.
The pure parsing and planning is in kernel/cmdline.py; commands go through the Host's HostCmd (_host/commands.py:
chroot, C locale); failures are raised (_host/result.py's Failed, CmdlineError), never fail_json-ed here.
"""

from __future__ import annotations

import json
import os

from ansible_collections.gpufleet.inference.plugins.module_utils._host.commands import HostCmd, ToolMissing
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.cmdline import (
    DROPIN, DROPIN_DIR, GRUB_CFG, GRUB_DEFAULTS, PROC_CMDLINE, STATE_FILE, CmdlineError, change_owner, check_length,
    find_conflicts, foreign_texts, gather, grub_cfg_kernel, overriding_dropins, predicted_cmdline,
    foreign_conflicts, foreign_grub_args, grub_cfg_args, parse_dropin, parse_state, pending_after, plan_dropin,
    plan_grubby, render_state, split_cmdline, status, validate_args, validate_owner, wanted_args,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.grub import parse_grubby_info

# What a host without GRUB and grubby needs instead (said when arguments are asked for there).
BY_HAND = ("On systemd-boot or a unified kernel image put them in /etc/kernel/cmdline (or the options line of "
           "/boot/loader/entries/*.conf) and run kernel-install (or rebuild the image); on a cloud provider's direct "
           "kernel boot set them in the instance's kernel command line setting. Or leave the arguments empty (the "
           "role's variable, or state: absent) so this step has nothing to do.")


def detect(cmd: HostCmd, wanted: str, strict: bool = True) -> tuple[str, list[str]] | None:
    """(bootloader, argv of the command that applies the configuration); None when the host has neither grubby nor
    /etc/default/grub (no GRUB 2: systemd-boot, direct kernel boot). Failed when GRUB's files are there without the
    tool that turns them into grub.cfg. ``strict``: an explicit grubby must be installed (the run has work to do)."""
    fs = cmd.fs
    if wanted in ("auto", "grubby"):
        grubby = cmd.find("grubby", required=strict and wanted == "grubby")
        if grubby:
            return "grubby", [grubby]
    if not fs.exists(GRUB_DEFAULTS):
        return None
    update = cmd.find("update-grub")
    if update:
        return "grub_dropin", [update]
    mkconfig = cmd.find("grub-mkconfig") or cmd.find("grub2-mkconfig")
    if mkconfig:
        return "grub_dropin", [mkconfig, "-o", GRUB_CFG]
    where = "" if fs.root == "/" else f" under root {fs.root}"
    raise Failed(msg=(
        f"GRUB files missing: {GRUB_DEFAULTS} exists{where} but neither update-grub nor grub-mkconfig is installed, "
        "so the drop-in cannot be turned into grub.cfg. Install grub2-common (Debian/Ubuntu: apt-get install grub2-common)."))


def no_bootloader(fs, args: list[str]) -> Failed:
    """The failure of a run that asks for ``args`` on a host without GRUB 2 and grubby: what it cannot do, what to do."""
    where = "" if fs.root == "/" else f" under root {fs.root}"
    return Failed(changed=False, msg=(
        f"GRUB files missing: {GRUB_DEFAULTS} does not exist{where}, and grubby is not installed, so {' '.join(args)} "
        "cannot be put on the kernel command line; nothing was changed. This module drives GRUB 2 (update-grub on "
        "Debian/Ubuntu, grubby on EL); hosts that boot through systemd-boot, a unified kernel image or a cloud "
        f"provider's direct kernel boot need another way to set kernel arguments. {BY_HAND}"))


def validated(p: dict) -> tuple[str, list[str]]:
    """(owner, its wanted arguments: none with state absent); Failed on a bad owner, argument or conflict among them."""
    try:
        owner = validate_owner(p["owner"])
        args = validate_args(p["args"]) if p["state"] == "present" else []
    except CmdlineError as err:
        raise Failed(msg=str(err), changed=False) from None
    conflicts = find_conflicts({owner: args})
    if conflicts:
        raise Failed(msg=f"Conflicting kernel arguments in args, nothing changed: {'; '.join(conflicts)}. Keep one of them.",
                     changed=False)
    return owner, args


def nothing_to_do(fs, owner: str, why: str) -> dict:
    """The result of a run with no argument to add on a host whose bootloader this module cannot drive: changed=false
    and a note, when no record (drop-in or state file) holds arguments of ``owner`` to remove; else Failed."""
    info = gather(fs, owner)
    mine = info["owners"].get(owner) or []
    if mine:
        raise Failed(changed=False, msg=(
            f"{why} Owner {owner} still has {' '.join(mine)} recorded ({DROPIN if info['source'] == 'dropin' else STATE_FILE}) "
            "but there is no bootloader tool to remove them with; nothing was changed. Remove them from the boot "
            f"configuration by hand, then delete the owner's line (or the file)."))
    result = {k: info[k] for k in ("wanted", "current", "missing", "unexpected", "reboot_required", "owner_reboot_required")}
    result.update(changed=False, actions=[], bootloader="none", owners=info["owners"], msg=(
        f"Nothing to do for owner {owner}: no argument to add or remove, and this module cannot drive this host's "
        f"bootloader: {why} Nothing was changed."))
    return result


def execute(params: dict, host: Host, check_mode: bool) -> dict:
    """The module's run: validate, find the bootloader, plan, apply (outside check mode), read back."""
    owner, args = validated(params)
    try:
        found = detect(host.cmd, params["bootloader"], strict=bool(args))
    except (Failed, ToolMissing) as err:
        if args:
            raise
        return nothing_to_do(host.fs, owner, str(err))
    if found is None:
        if args:
            raise no_bootloader(host.fs, args)
        return nothing_to_do(host.fs, owner, f"neither {GRUB_DEFAULTS} nor grubby is on this host.")
    return KernelCmdline(host, found[0], found[1], check_mode).run(owner, args, params["state"])


class KernelCmdline:
    """Reads the owners and the running kernel's arguments, plans, applies (through the Host's files and commands)."""

    def __init__(self, host: Host, bootloader: str, apply_argv: list[str], check_mode: bool):
        self.host = host
        self.fs = host.fs
        self.cmd = host.cmd
        self.bootloader = bootloader
        self.apply_argv = apply_argv
        self.check_mode = check_mode

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
        rc, out, err = self.cmd.run(self.cmd.argv([grubby, "--info=ALL"]))
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

    def configuration(self, saved: dict) -> dict:
        """What the boot configuration holds now: the owners before this run, the arguments it configures, and
        (drop-in) the drop-in's text, the arguments other grub files set, grub.cfg, or (grubby) the boot entries."""
        if self.bootloader == "grub_dropin":
            dropin_before = self.read(DROPIN)
            owners_before, stray = parse_dropin(dropin_before)
            if stray:
                self.host.warn(f"{DROPIN} holds lines this module did not write; they are dropped: {' | '.join(stray)}")
            grub_cfg = self.fs.read_optional(GRUB_CFG)
            return {"owners": owners_before, "dropin": dropin_before, "foreign": foreign_grub_args(foreign_texts(self.fs)),
                    "grub_cfg": grub_cfg, "configured": grub_cfg_args(grub_cfg) or [], "entries": []}
        entries = self.grubby_entries(self.apply_argv[0])
        return {"owners": saved["owners"], "dropin": None, "foreign": [], "grub_cfg": None, "entries": entries,
                "configured": sorted({a for e in entries for a in e["args"]})}

    def guard(self, owners_before: dict, owners_after: dict, pending: dict, conf: dict) -> None:
        """Refuse, before any write, what would not reach the kernel: a later drop-in that resets
        GRUB_CMDLINE_LINUX_DEFAULT (ours would be dropped), or a command line over the architecture's limit."""
        wanted = wanted_args(owners_after)
        configured = conf["configured"]
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
            lines = [predicted_cmdline(configured, grub_cfg_kernel(conf["grub_cfg"]), wanted, dropped)]
        else:
            lines = [predicted_cmdline(e["args"], e["kernel"], wanted, dropped) for e in conf["entries"] if not e["rescue"]]
        for line in lines:
            problem = check_length(line, self.arch())
            if problem:
                raise Failed(changed=False, msg=problem, cmdline_bytes=len(line.encode("utf-8")))

    def refuse(self, args: list[str], owners_after: dict) -> None:
        """Refuse what grubby cannot carry and conflicts across all owners; nothing is changed."""
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

    def warn_foreign(self, owners_after: dict, current: list[str], pending: dict, foreign: list[str]) -> None:
        for warning in foreign_conflicts(owners_after, current, pending):
            self.host.warn(warning.capitalize() + ": our argument comes later on the command line; remove the other one "
                           "from /etc/default/grub (or with grubby) to be sure which value the kernel takes.")
        for arg in pending:
            if arg in foreign:
                self.host.warn(f"{arg} was removed by owner {pending[arg]} but {GRUB_DEFAULTS} (or another grub.d file) "
                               "still sets it, so the kernel keeps it after the next boot.")

    # ---- the plan -----------------------------------------------------------------------------
    def plan(self, conf: dict, owners_after: dict, pending: dict) -> tuple[list[dict], dict, dict]:
        """(the actions on the boot configuration, the plan they come from, the diff)."""
        actions: list[dict] = []
        if self.bootloader == "grub_dropin":
            plan = plan_dropin(conf["dropin"], owners_after, conf["grub_cfg"], list(pending), conf["foreign"])
            for action in plan["actions"]:
                if action["action"] == "update_grub":
                    action["argv"] = self.cmd.argv(self.apply_argv)
                actions.append(action)
            diff = {"before": conf["dropin"] or "", "after": plan["after"] or "", "before_header": DROPIN, "after_header": DROPIN}
            return actions, plan, diff
        plan = plan_grubby(conf["entries"], owners_after, list(pending))
        grubby = self.apply_argv[0]
        if plan["remove"]:
            actions.append({"action": "grubby_remove", "args": plan["remove"],
                            "argv": self.cmd.argv([grubby, "--update-kernel=ALL", "--remove-args=" + " ".join(plan["remove"])])})
        if plan["add"]:
            actions.append({"action": "grubby_add", "args": plan["add"],
                            "argv": self.cmd.argv([grubby, "--update-kernel=ALL", "--args=" + " ".join(plan["add"])])})
        diff = {"before": json.dumps(conf["owners"], indent=2, sort_keys=True) + "\n",
                "after": json.dumps(owners_after, indent=2, sort_keys=True) + "\n",
                "before_header": f"{STATE_FILE} (owners)", "after_header": f"{STATE_FILE} (owners)"}
        return actions, plan, diff

    def state_action(self, saved: dict, owners_after: dict, kept: dict, changing: bool) -> tuple[dict | None, str | None]:
        """(the state file's action or None, its new text). It keeps the owners (grubby) and the removals the running
        kernel still has; pruning alone is no reason to write."""
        new_state = {"owners": owners_after if self.bootloader == "grubby" else {}, "pending_removal": kept}
        state_text = render_state(new_state)
        grew = set(kept) - set(saved["pending_removal"]) or (self.bootloader == "grubby" and owners_after != saved["owners"])
        if state_text != render_state(saved) and (grew or changing):
            return {"action": "remove_state" if state_text is None else "write_state", "path": STATE_FILE}, state_text
        return None, state_text

    # ---- the run ------------------------------------------------------------------------------
    def run(self, owner: str, args: list[str], state: str) -> dict:
        current = self.current()
        saved = parse_state(self.read(STATE_FILE), self.fs.path(STATE_FILE))
        conf = self.configuration(saved)
        owners_after = change_owner(conf["owners"], owner, args, state)
        self.refuse(args, owners_after)
        pending = pending_after(saved["pending_removal"], conf["owners"], owners_after, owner, current, conf["configured"])
        self.guard(conf["owners"], owners_after, pending, conf)
        self.warn_foreign(owners_after, current, pending, conf["foreign"])
        actions, plan, diff = self.plan(conf, owners_after, pending)
        kept = {a: o for a, o in pending.items() if a in current}
        state_step, state_text = self.state_action(saved, owners_after, kept, bool(actions))
        if state_step:
            actions.append(state_step)
        result = status(owners_after, current, pending, owner, conf["foreign"])
        result.update(bootloader=self.bootloader, owners=owners_after, actions=actions, changed=bool(actions), diff=diff)
        if actions and not self.check_mode:
            self.apply(actions, conf["dropin"], plan, owners_after, state_text)
            self.verify(owners_after, conf["foreign"], pending)
        return result

    # ---- changers -----------------------------------------------------------------------------
    def apply(self, actions: list[dict], dropin_before: str | None, plan: dict, owners_after: dict,
              state_text: str | None) -> None:
        done: list[str] = []
        try:
            for action in actions:
                kind = action["action"]
                if kind == "write_dropin":
                    self.fs.write_atomic(DROPIN, plan["after"], 0o644)
                elif kind == "remove_dropin":
                    self.fs.remove(DROPIN)
                elif kind in ("update_grub", "grubby_add", "grubby_remove"):
                    rc, out, err = self.cmd.run(action["argv"])
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

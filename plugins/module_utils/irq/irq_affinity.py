# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.irq_affinity executes (``execute``): the pinning (irq/pinning.py's ``pin``), then, with
``install_reapply`` and in the same module run, the boot-time and bind-time re-apply that keeps it.

The kernel resets a function's interrupt affinity whenever a driver requests its vectors again (a
rebind, a reboot), so the pinning is re-applied by ``/usr/local/libexec/gpufleet-irq-affinity-apply``
(irq/reapply.py with the module_utils it imports, bundled by _host/bundle.py) from three places:

- ``gpufleet-irq-affinity.service`` at boot (enabled in ``multi-user.target``);
- ``gpufleet-irq-affinity@<bdf>.service``, started by the udev rule
  ``/etc/udev/rules.d/90-gpufleet-irq-affinity.rules`` when a driver binds a pinned function;
- with ``reapply_interval``, ``gpufleet-irq-affinity.timer`` (and the oneshot it starts).

The role used to install these with 10 to 14 tasks (a module run each, two for every ``template``);
here they are one plan over the host's files and units, applied unless in check mode, read back,
and shown in ``actions`` and the diff. Behaviour is the role's: the script and the two units are
installed while functions are given with ``state: present``; the udev rule and the enabled service
follow the functions the configuration holds (the rule is removed when it holds none); the timer
exists only with an interval and functions, and is stopped and removed otherwise.

Commands (systemctl, udevadm) run in the C locale through the Host's HostCmd (_host/commands.py). Under a ``root`` other than ``/``
(tests, an image), ``systemctl --root`` enables and disables offline, and nothing that needs the live
systemd or udev (daemon-reload, start, stop, the rule reload) runs.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.inference.plugins.module_utils.irq import reapply as irq_reapply
from ansible_collections.gpufleet.inference.plugins.module_utils._host import managed_files
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.irq.affinity import IrqError
from ansible_collections.gpufleet.inference.plugins.module_utils.irq.pinning import pin
from ansible_collections.gpufleet.inference.plugins.module_utils._host.bundle import BundleError

SCRIPT = "/usr/local/libexec/" + irq_reapply.PROG
LIBEXEC = "/usr/local/libexec"
SYSTEMD = "/etc/systemd/system"
SERVICE = "gpufleet-irq-affinity.service"
BIND_SERVICE = "gpufleet-irq-affinity@.service"
TIMER = "gpufleet-irq-affinity.timer"
TIMER_SERVICE = "gpufleet-irq-affinity-reapply.service"
UDEV_RULE = "/etc/udev/rules.d/90-gpufleet-irq-affinity.rules"
SERVICE_WANTS = SYSTEMD + "/multi-user.target.wants/" + SERVICE
TIMER_WANTS = SYSTEMD + "/timers.target.wants/" + TIMER
HEADER = "# Installed by gpufleet.inference irq_affinity (install_reapply): do not edit, run the irq_affinity role again.\n"
# A systemd time span: numbers with units (10min, 1h 30min, 90s); nothing that could end a unit file's line.
TIMESPAN = re.compile(r"^(?:\d+(?:\.\d+)?\s*(?:usec|us|msec|ms|seconds|second|sec|s|minutes|minute|min|m|hours|hour|hr|h|"
                      r"days|day|d|weeks|week|w|months|month|M|years|year|y)?\s*)+$")


def render_service(wait: int) -> str:
    return (HEADER +
            "# Pins the interrupts of every function in /etc/gpufleet/irq_affinity.json at boot, once the drivers\n"
            "# (and nvidia-persistenced, which makes the NVIDIA driver enable its vectors) are up.\n"
            "[Unit]\nDescription=Re-apply the IRQ pinning of gpufleet.inference\n"
            "After=systemd-udev-settle.service systemd-modules-load.service nvidia-persistenced.service\n"
            "ConditionPathExists=/etc/gpufleet/irq_affinity.json\n\n"
            f"[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart={SCRIPT} --wait {wait}\n\n"
            "[Install]\nWantedBy=multi-user.target\n")


def render_bind_service(wait: int) -> str:
    return (HEADER +
            f"# Started by {UDEV_RULE} when a driver binds a pinned PCI function:\n"
            "# the kernel reset the function's interrupt affinity, and its vectors may have new numbers.\n"
            f"[Unit]\nDescription=Re-apply the IRQ pinning of PCI function %I\nAfter={SERVICE}\n\n"
            f"[Service]\nType=oneshot\nExecStart={SCRIPT} --device %I --wait {wait}\n")


def render_timer(interval: str) -> str:
    return (HEADER +
            f"# Re-applies the IRQ pinning every {interval} (irq_affinity_reapply_interval).\n"
            "[Unit]\nDescription=Re-apply the IRQ pinning of gpufleet.inference periodically\n\n"
            f"[Timer]\nOnBootSec={interval}\nOnUnitInactiveSec={interval}\nUnit={TIMER_SERVICE}\n\n"
            "[Install]\nWantedBy=timers.target\n")


def render_timer_service() -> str:
    return (HEADER + f"# Run by {TIMER} (irq_affinity_reapply_interval).\n"
            "[Unit]\nDescription=Re-apply the IRQ pinning of gpufleet.inference (timer)\n"
            "ConditionPathExists=/etc/gpufleet/irq_affinity.json\n\n"
            f"[Service]\nType=oneshot\nExecStart={SCRIPT} --wait 0\n")


def render_udev_rule(bdfs: list[str]) -> str:
    return (HEADER +
            "# A driver that binds a PCI function requests its interrupts again, and the kernel resets their affinity:\n"
            "# re-apply the gpufleet.inference pinning for the functions in /etc/gpufleet/irq_affinity.json.\n" +
            "".join(f'ACTION=="bind", SUBSYSTEM=="pci", KERNEL=="{bdf}", '
                    f'RUN+="/bin/systemctl --no-block start gpufleet-irq-affinity@{bdf}.service"\n' for bdf in bdfs))


def validate(params: dict) -> None:
    """The re-apply options, checked before anything is read or written."""
    interval = params.get("reapply_interval") or ""
    if interval and not TIMESPAN.match(interval.strip()):
        raise IrqError(f"reapply_interval {interval!r} is not a systemd time span: give a number with a unit, such as "
                       "10min, 1h or 90s (systemd.time(7)), or leave it empty to re-apply only at boot and on driver bind.")
    wait = params.get("reapply_wait", 30)
    if isinstance(wait, bool) or not isinstance(wait, int) or not 0 <= wait <= 3600:
        raise IrqError(f"reapply_wait {wait!r} must be a whole number of seconds from 0 to 3600.")
    python = params.get("reapply_python") or ""
    if python and not python.startswith("/"):
        raise IrqError(f"reapply_python {python!r} must be the absolute path of the host's Python 3.7 or later "
                       "(the re-apply script's #! line), such as /usr/bin/python3.")


class Systemd:
    """systemctl and udevadm for one run: ``--root`` offline under a tree, the live ones on ``/``."""

    def __init__(self, cmds, fs: HostFS):
        self.cmds = cmds
        self.fs = fs
        self.live = fs.root == "/"

    def argv(self, tool: str, *args: str) -> list[str]:
        """systemctl through HostCmd.systemctl (``--root`` under a tree); udevadm, asked only on a live host."""
        if tool == "systemctl":
            return self.cmds.systemctl(*args)
        return [self.cmds.find_live(tool, required=True)] + list(args)

    def active(self, unit: str) -> bool:
        """Whether ``unit`` runs (a read: also in check mode); only asked on a live host."""
        rc, _out, _err = self.cmds.run(self.argv("systemctl", "is-active", "--quiet", unit))
        return rc == 0


def plan(fs: HostFS, systemd: Systemd, params: dict, persisted: list[str], script: str | None) -> dict:
    """The files, removals and commands that bring the re-apply to what ``params`` and ``persisted`` (the
    functions the configuration holds after this run) want. ``script``: the rendered re-apply script, or
    None when this run does not install it. Reads only."""
    install = script is not None
    wait = params.get("reapply_wait", 30)
    interval = (params.get("reapply_interval") or "").strip()
    files, removals, before_cmds, after_cmds = [], [], [], []
    dirs = []
    if install:
        dirs.append(managed_files.wanted_dir(LIBEXEC))
        files += [managed_files.wanted_file(SCRIPT, script, 0o755),
                  managed_files.wanted_file(f"{SYSTEMD}/{SERVICE}", render_service(wait)),
                  managed_files.wanted_file(f"{SYSTEMD}/{BIND_SERVICE}", render_bind_service(wait))]
    legacy = params.get("legacy_libdir")
    if install and legacy and fs.exists(legacy.rstrip("/") + "/ansible_collections"):
        removals.append({"action": "remove_tree", "path": legacy.rstrip("/") + "/ansible_collections",
                         "why": "the module_utils copy of earlier versions (the script now carries them)"})
    if persisted:
        files.append(managed_files.wanted_file(UDEV_RULE, render_udev_rule(persisted)))
    elif fs.exists(UDEV_RULE):
        removals.append({"action": "remove", "path": UDEV_RULE, "why": "no function is pinned"})
    timer = bool(interval and persisted)
    timer_there = fs.exists(f"{SYSTEMD}/{TIMER}")
    if timer:
        files += [managed_files.wanted_file(f"{SYSTEMD}/{TIMER_SERVICE}", render_timer_service()),
                  managed_files.wanted_file(f"{SYSTEMD}/{TIMER}", render_timer(interval))]
    elif timer_there or fs.exists(f"{SYSTEMD}/{TIMER_SERVICE}"):
        if timer_there and fs.exists(TIMER_WANTS) or (timer_there and systemd.live and systemd.active(TIMER)):
            before_cmds.append({"action": "disable_unit", "unit": TIMER,
                                "argv": systemd.argv("systemctl", "disable", *(["--now"] if systemd.live else []), TIMER)})
        for name in (TIMER, TIMER_SERVICE):
            if fs.exists(f"{SYSTEMD}/{name}"):
                removals.append({"action": "remove", "path": f"{SYSTEMD}/{name}", "why": "no reapply_interval"})
    file_actions, diff = managed_files.plan(fs, dirs, files)
    for r in removals:
        diff.append({"before_header": r["path"], "after_header": r["path"],
                     "before": {"path": r["path"], "state": "present"}, "after": {"path": r["path"], "state": "absent"}})
    units_changed = any(a["path"].startswith(SYSTEMD + "/") and a["action"] in ("create", "write") for a in file_actions) or \
        any(r["path"].startswith(SYSTEMD + "/") for r in removals)
    if units_changed and systemd.live:
        after_cmds.append({"action": "daemon_reload", "argv": systemd.argv("systemctl", "daemon-reload")})
    if persisted and not fs.exists(SERVICE_WANTS):
        if not install and not fs.exists(f"{SYSTEMD}/{SERVICE}"):
            raise IrqError(f"{SERVICE} is not installed, so the pinning of {', '.join(persisted)} would not come back at "
                           "boot: run with install_reapply: true and state: present (the irq_affinity role does).")
        after_cmds.append({"action": "enable_unit", "unit": SERVICE, "wants": SERVICE_WANTS,
                           "argv": systemd.argv("systemctl", "enable", SERVICE)})
    if timer:
        if not fs.exists(TIMER_WANTS):
            after_cmds.append({"action": "enable_unit", "unit": TIMER, "wants": TIMER_WANTS,
                               "argv": systemd.argv("systemctl", "enable", *(["--now"] if systemd.live else []), TIMER)})
        elif systemd.live and not systemd.active(TIMER):
            after_cmds.append({"action": "start_unit", "unit": TIMER, "argv": systemd.argv("systemctl", "start", TIMER)})
    rule_changed = any(a["path"] == UDEV_RULE and a["action"] in ("create", "write") for a in file_actions) or \
        any(r["path"] == UDEV_RULE for r in removals)
    if rule_changed and systemd.live and systemd.cmds.find_live("udevadm"):
        after_cmds.append({"action": "reload_udev_rules", "argv": systemd.argv("udevadm", "control", "--reload")})
    return {"dirs": dirs, "files": files, "file_actions": file_actions, "removals": removals,
            "before_cmds": before_cmds, "after_cmds": after_cmds, "diff": diff}


def apply(fs: HostFS, systemd: Systemd, steps: dict) -> None:
    """Carry out plan()'s steps: stop what goes, write and remove files (read back), then reload and enable.
    Raises Failed (changed) with the step that failed; the pinning is in place by then."""
    def run(cmd: dict) -> None:
        problem = systemd.cmds.unit_step(
            cmd["argv"], "The interrupts are pinned; only their re-apply at boot and on driver bind is not installed",
            "Check that systemd manages this host (systemctl status), then run again.", wants=cmd.get("wants"),
            unit=cmd.get("unit", ""))
        if problem:
            raise Failed(problem.pop("msg"), changed=True, **problem)
    for cmd in steps["before_cmds"]:
        run(cmd)
    managed_files.apply(fs, steps["dirs"], steps["files"], steps["file_actions"])
    back = managed_files.read_back(fs, steps["files"])
    wrong = [f["path"] for f in steps["files"] if back[f["path"]] != f["content"]]
    if wrong:
        raise Failed(f"{', '.join(wrong)} does not read back what was written: another process writes it. The "
                     "interrupts are pinned; run again once it has stopped.", changed=True)
    for r in steps["removals"]:
        if r["action"] == "remove_tree":
            fs.remove_tree(r["path"])
        else:
            fs.remove(r["path"])
    for cmd in steps["after_cmds"]:
        run(cmd)


def execute(params: dict, host: Host, check_mode: bool) -> dict:
    """Pin (irq/pinning.py's pin()), then with ``install_reapply`` plan and apply the re-apply's script, units and
    udev rule (``host.cmd`` runs systemctl and udevadm). Bad re-apply options fail before anything is written."""
    fs, cmds = host.fs, host.cmd
    install_asked = bool(params.get("install_reapply"))
    if install_asked:
        validate(params)
        if not params.get("persist"):
            raise IrqError("install_reapply needs persist: true: the re-apply script pins what "
                           "/etc/gpufleet/irq_affinity.json holds, which only persist writes.")
    script = None
    if install_asked and params["state"] == "present" and params["devices"]:
        try:
            script = irq_reapply.render_script(params.get("reapply_python") or cmds.script_python())
        except BundleError as err:
            raise IrqError(f"Cannot build the re-apply script: {err}") from None
    result = pin(params, fs, check_mode, host.warn)
    if not install_asked:
        return result
    systemd = Systemd(cmds, fs)
    try:
        steps = plan(fs, systemd, params, result["persisted"], script)
    except IrqError as err:  # the pinning may be written by now: say so
        raise Failed(str(err), changed=result["changed"]) from None
    if not check_mode:
        apply(fs, systemd, steps)

    def command(c: dict) -> dict:
        return {"action": c["action"], "unit": c.get("unit", ""), "argv": c["argv"]}
    # in the order apply() takes them
    actions = [command(c) for c in steps["before_cmds"]]
    actions += [{"action": a["action"], "path": a["path"]} for a in steps["file_actions"]]
    actions += [{"action": r["action"], "path": r["path"], "why": r["why"]} for r in steps["removals"]]
    actions += [command(c) for c in steps["after_cmds"]]
    result["actions"] = result["actions"] + actions
    result["diff"] = result["diff"] + steps["diff"]
    result["changed"] = bool(result["actions"])
    result["reapply"] = {"script": SCRIPT if script is not None or fs.exists(SCRIPT) else None,
                         "unit_enabled": fs.exists(SERVICE_WANTS) or any(c["action"] == "enable_unit" and c["unit"] == SERVICE
                                                                         for c in steps["after_cmds"]),
                         "timer": TIMER if (params.get("reapply_interval") or "").strip() and result["persisted"] else None,
                         "udev_rule": UDEV_RULE if result["persisted"] else None}
    return result

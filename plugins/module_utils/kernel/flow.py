# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel upgrade, one kind of change on the shared change flow (change/flow.py):
``step(journal, observation) -> (journal, action)``.

The flow itself (the journal's life, run ownership and take-over, the baseline and candidate gate loops, the
output reference, the health before and after, the serving verdict, commit, rollback and resume) is change/flow.py's;
this file supplies the kernel's own steps (``KERNEL``): the lock (package holds), go or no-go on a host without a
journal, the pin, the install and its post-install checks, the one-shot boot and its boot-health unit, the
verification, the commit deadline and the way back (the saved default, a reboot). The module
``kernel_rollout_step`` reads the host (running kernel, saved GRUB default, boot id, the journal,
the installed packages), calls ``step`` with what the controller just did (``event`` + ``data``),
writes the journal it gets back (durably, before the controller acts) and returns the action.
The role only executes actions: package installs, reboots and module calls.

The journal (``/var/lib/gpufleet/kernel_upgrade/journal.json``) is the host's memory of one
upgrade. ``None`` means no upgrade is in progress. It is written before every step after which
the controller can be lost, and moved to the history when the upgrade ends. It belongs to the run
that started it (``run_id``); another run resumes it only by a take-over at its start (``take_over``).
``check_journal`` and ``check_event`` check the shape of every field a step reads before any step, so
that a damaged journal or event is refused (FlowError), never half-read. While the candidate may run
uncommitted, every contact records the commit ``deadline`` as this boot's id and seconds since this
boot, which the host's boot-health unit compares with its own uptime (never with the wall clock).

Stages, in order (see docs/roles/kernel_upgrade.md for the diagram):

``baseline``   the old kernel (the saved default, running) was measured; nothing changed yet. The gate
               judges the baseline alone first (``decide(baseline, [])``): while its spread is too wide
               for the margin it asks for more baseline runs (the gated level only, measured only), up to
               its cap; a host still too noisy, or drifting, stops here (``inconclusive``, nothing changed).
``pinned``     the old kernel is pinned as the GRUB default (and panic= is on the command line).
``installed``  the target is installed and passed its post-install checks.
``boot_once``  the boot-health unit is installed and the one-shot boot is about to happen
               (``boot_id`` says from which boot).
``booted``     the host came up on the target; verification is next.
``candidate``  the target is being benchmarked (runs recorded as they come).
``verdict``    a verdict is recorded: ``pass`` is committed, anything else rolled back. It is the serving
               verdict (bench/verdict.py): throughput and latency from the gate (a candidate at the same tok/s
               with a TTFT/TPOT beyond its margin is a ``regression``), the outputs compared with the reference
               recorded on the old kernel (``diverged``) and the host's health before and after (``unstable``),
               each part with its figures in ``verdict.parts``. A part left out (settings ``outputs`` or
               ``stability`` false) or without its "before" (a journal written before the part existed) is named
               ``not measured`` in the reason, never passed silently.

The serving verdict's extra steps: after the baseline is ready, the PCIe audit keeps the host's health document
(``health_before``) and, with ``outputs``, the ``outputs`` action records the output reference on the old kernel
(``outputs_reference``); once the gate's answer on the candidate is final, the ``check`` action compares the outputs
and audits the host again (``checks``), and the verdict is given.
``committed`` / ``rolled_back`` / ``stopped``  terminal: the journal goes to the history.
"""

from __future__ import annotations

import math
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.change import flow
from ansible_collections.gpufleet.inference.plugins.module_utils.change.flow import (
    ChangeKind, FlowError, finding_keys, kind_actions, kind_stages, new_findings, stamp as _stamp, truthy,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.change.packages import (
    DRIVER_PREFIXES, DRIVER_SUFFIXES, KERNEL_LOCK_DROPIN, error_lines, render_uu_dropin,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.change.shapes import (
    is_dict, is_num, is_text, list_of, optional,
)

# The kernel's names: its kind and steps, and the flow's names its callers read here (FlowError, finding_keys).
__all__ = ["ACTIONS", "COMMIT_TIMEOUT_S", "EVENTS", "EXPECTED_STAGE", "JOURNAL_FORMAT", "KERNEL", "STAGES", "FlowError",
           "check_event", "check_journal", "commit_timeout", "finding_keys", "gated_level", "judge_baseline",
           "lock_packages", "new_findings", "record_facts", "serving_record", "step"]

JOURNAL_FORMAT = "gpufleet.kernel_upgrade_journal/1"
STAGES = kind_stages("pinned", "installed", "boot_once", "booted")
EVENTS = ("start", "locked", "benchmarked", "audited", "outputs", "pinned", "installed", "rebooted", "verified",
          "checked", "committed", "rolled_back", "error")

# Meta-packages that pull a newer kernel in; held where installed (Debian, Ubuntu).
KERNEL_META = ("linux-image-amd64", "linux-image-cloud-amd64", "linux-image-arm64", "linux-image-cloud-arm64",
               "linux-generic", "linux-image-generic", "linux-headers-generic", "linux-virtual", "linux-image-virtual")
KERNEL_META_PREFIXES = ("linux-generic-hwe-", "linux-image-generic-hwe-", "linux-headers-generic-hwe-")
# Seconds an uncommitted candidate may go without a contact of the controller before its boot-health
# unit reverts it: long enough for a boot and a health check, short enough to ever come.
COMMIT_TIMEOUT_S = (120, 86400)


# ---- the lock ------------------------------------------------------------------------------------
def lock_packages(version: str, installed: list[str], extra: list[str] | None = None) -> list[str]:
    """What the lock holds for kernel ``version``: its image package, the kernel meta-packages and the
    GPU driver/DKMS packages, each only where installed (``installed``: dpkg's installed names)."""
    have = set(installed)
    wanted = {f"linux-image-{version}"} | set(KERNEL_META) | set(extra or [])
    out = {p for p in wanted if p in have}
    for name in have:
        if name.startswith(KERNEL_META_PREFIXES + DRIVER_PREFIXES) or name.endswith(DRIVER_SUFFIXES):
            out.add(name)
    return sorted(out)


def lock_action(name: str, version: str, obs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    hold = lock_packages(version, obs.get("installed_packages") or [], obs["settings"].get("lock_packages"))
    action = {"name": name, "version": version, "lock": bool(obs["settings"].get("lock", True)), "hold": hold,
              "unattended_upgrades": {"path": KERNEL_LOCK_DROPIN, "content": render_uu_dropin(hold)}}
    action.update(extra)
    return action


# ---- the kernel's steps ---------------------------------------------------------------------------
def commit_timeout(settings: dict[str, Any]) -> int:
    """The ``commit_timeout`` setting, bounded; FlowError (nothing changed) outside COMMIT_TIMEOUT_S."""
    value, (low, high) = settings.get("commit_timeout", 1800), COMMIT_TIMEOUT_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
            not low <= value <= high:
        raise FlowError(f"commit_timeout {value!r} is not {low} to {high} seconds (a boot and a health check at least, "
                        "a day at most: an uncommitted candidate must revert by itself): set "
                        "kernel_upgrade_commit_timeout in that range; nothing was changed")
    return int(value)


def _deadline(journal: dict[str, Any], obs: dict[str, Any]) -> None:
    """While the host may run the candidate uncommitted, each contact pushes the host-local commit
    deadline: the boot-health unit reboots into the saved default once it passes. The unit reads
    ``deadline`` (this boot's id, seconds since this boot: a wall clock that jumps moves nothing);
    ``commit_deadline`` (epoch seconds) is for people and is not read by the unit."""
    timeout = commit_timeout(obs["settings"])
    journal["commit_deadline"] = obs["now"] + timeout
    journal["deadline"] = {"boot_id": obs["boot_id"], "uptime": float(obs.get("uptime") or 0.0) + timeout,
                           "timeout": timeout}


def _verdict(journal: dict[str, Any], obs: dict[str, Any], decision: str, reason: str,
             parts: dict[str, Any] | None = None) -> tuple[dict, dict]:
    return flow.verdict(KERNEL, journal, obs, decision, reason, parts)


def commit_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    return lock_action("commit", journal["target"], obs)


def rollback_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    return lock_action("rollback", journal["old"], obs, reboot=obs["running"] != journal["old"])


# ---- before any journal ------------------------------------------------------------------------
def fresh(obs: dict[str, Any]) -> tuple[str, str]:
    """(decision, reason) on a host with no upgrade in progress; decision '' means: go."""
    pre, target, s = obs.get("preflight") or {}, obs["target"], obs["settings"]
    running, default = obs["running"], obs["default"]
    if running == target and default == target:
        return "already", f"{target} runs and is the default already"
    if default is None:
        return "refused", (f"the saved GRUB default of this host names no installed kernel (running {running}): nothing is "
                           "changed. Run grub-editenv /boot/grub/grubenv list, set the default to the kernel that "
                           "should boot (grub-set-default 'submenu>entry'), then run again.")
    if running != default:
        return "refused", (f"this host runs {running} but its saved GRUB default is {default}, and there is no upgrade "
                           f"journal: a one-shot boot was left half-way (by an earlier run that lost its journal, or by "
                           f"hand). A baseline is never measured on a kernel that is not the saved default, so nothing is "
                           f"changed. To go back: reboot (the host boots {default}). To keep {running}: make it the "
                           f"default (grub-set-default) after checking it. Then run again.")
    if not pre.get("ok", False):
        return "preflight_failed", pre.get("msg") or "preflight failed"
    if s.get("check_mode") or not s.get("reboot_ok"):
        reason = (f"would: benchmark {running}, pin it as the default ({pre.get('running_entry')}), install "
                  f"{pre.get('package')}, install the boot-health unit, boot {target} once (grub-reboot), verify, "
                  "benchmark, gate; keep it or roll back")
        if not s.get("check_mode"):
            reason += ". Set kernel_upgrade_reboot_ok: true to do it"
        return "planned", reason
    return "", ""


def journal_extra(obs: dict[str, Any]) -> dict[str, Any]:
    """The kernel's fields of a new journal: the old GRUB entry, the package, the DKMS modules, the boot records."""
    pre = obs.get("preflight") or {}
    return {"old_entry": pre.get("running_entry"), "package": pre.get("package"),
            "target_installed_before": bool(pre.get("target_installed")),
            "dkms_modules": list(pre.get("dkms_modules") or []), "boot_id": None, "commit_deadline": None,
            "deadline": None, "health": None, "verify": None}


def pin_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    return {"name": "pin", "version": journal["old"]}


def install_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    """The target's image package, and its headers where DKMS must build modules for it (DKMS's
    kernel hook builds only for kernels whose headers are installed)."""
    packages = [journal.get("package") or f"linux-image-{journal['target']}"]
    headers = obs["settings"].get("headers", "auto")
    if headers == "always" or (headers == "auto" and journal.get("dkms_modules")):
        packages.append(f"linux-headers-{journal['target']}")
    return {"name": "install", "package": packages[0], "packages": packages, "version": journal["target"]}


def on_pinned(journal, obs):
    if obs["default"] != journal["old"]:
        raise FlowError(f"the pin did not take: the saved default is {obs['default']}, not {journal['old']}")
    _stamp(journal, obs, "pinned", f"{journal['old']} is the default")
    return journal, install_action(journal, obs)


def install_failure(install: dict[str, Any], packages: str, dkms_modules: list[str] | None = None) -> str:
    """Why the package install failed, in a few lines of its own output (a DKMS module that does not build
    for the new kernel makes the kernel's postinst fail: apt-get exits 100 and the package stays
    half-configured)."""
    lines = error_lines(install.get("stderr"), install.get("stdout"), install.get("msg"))
    shown = " / ".join(lines[-8:]) or str(install.get("msg") or "no output")
    logs = ", ".join(f"/var/lib/dkms/{m}/*/build/make.log" for m in dkms_modules or []) or "the make.log it names"
    return (f"apt-get install {packages} failed (rc {install.get('rc')}): {shown}. The new kernel is not booted. Its "
            f"packages may be left half-configured (dpkg --audit): fix the cause (a DKMS build: {logs}), "
            "then dpkg --configure -a, or purge them")


def on_installed(journal, obs):
    post = obs["data"].get("preflight") or {}
    install = obs["data"].get("install") or {}
    problems = []
    if truthy(install.get("failed")):
        problems.append(install_failure(install, " ".join(install_action(journal, obs)["packages"]), journal.get("dkms_modules")))
    if not post.get("ok", False):
        problems.append(post.get("msg") or "checks failed")
    if problems:
        return _verdict(journal, obs, "preflight_failed", "after the install: " + "; ".join(problems))
    _stamp(journal, obs, "installed", "post-install checks passed")
    return arm_boot(journal, obs)


def arm_boot(journal, obs):
    """Record the one-shot boot before it happens, with the boot it starts from."""
    journal["boot_id"] = obs["boot_id"]
    _deadline(journal, obs)
    _stamp(journal, obs, "boot_once", f"one-shot boot into {journal['target']} from boot {obs['boot_id']}")
    return journal, {"name": "boot_once", "version": journal["target"], "old": journal["old"],
                     "commit_timeout": commit_timeout(obs["settings"])}


def after_boot(journal, obs):
    """The host is up after the one-shot boot (or the controller lost it around the boot)."""
    if obs["boot_id"] == journal["boot_id"] and obs["running"] == journal["old"]:
        return arm_boot(journal, obs)  # the reboot never happened: do it again
    if obs["running"] == journal["target"]:
        _deadline(journal, obs)
        _stamp(journal, obs, "booted", f"{journal['target']} runs")
        return journal, {"name": "verify"}
    return came_back_old(journal, obs, "the one-shot boot")


def came_back_old(journal, obs, when: str):
    health = obs.get("health") or {}
    if health.get("action") == "revert" and health.get("target") == journal["target"]:
        journal["health"] = health
        return _verdict(journal, obs, "reverted", (
            f"after {when} the host returned to {obs['running']} by itself: its boot-health unit rebooted it from "
            f"{journal['target']} ({'; '.join(health.get('reasons') or ['no reason kept'])})"))
    if journal["stage"] == "boot_once":
        return _verdict(journal, obs, "failed_boot", (
            f"the one-shot boot into {journal['target']} did not come up: the host came back on {obs['running']} "
            "(GRUB fell back to the saved default); read the console log of that boot"))
    return _verdict(journal, obs, "reverted", (
        f"during stage {journal['stage']} the host left {journal['target']} and runs {obs['running']} (a reboot the "
        "flow did not ask for: the commit deadline passed, a crash, or an operator)"))


def on_verified(journal, obs):
    if obs["running"] != journal["target"]:
        return came_back_old(journal, obs, "the verification")
    data = obs["data"]
    problems = []
    missing = data.get("cmdline_missing") or []
    if missing:
        problems.append("kernel arguments missing from /proc/cmdline: " + " ".join(missing))
    if data.get("findings_after") is not None:
        new = new_findings(journal.get("findings_before"), data["findings_after"])
        if new:
            problems.append("PCIe findings the old kernel did not have: " + ", ".join(new))
    vllm = data.get("vllm") or {}
    if truthy(vllm.get("checked")) and not truthy(vllm.get("ok")):
        problems.append("inference server not healthy: " + (vllm.get("msg") or "?"))
    journal["verify"] = {"problems": problems, "at": obs["now"]}
    if problems:
        return _verdict(journal, obs, "verify_failed", f"{journal['target']} booted but {'; '.join(problems)}")
    return flow.candidate_round(KERNEL, journal, obs, "verified")


def on_rebooted(journal, obs):
    if journal["stage"] != "boot_once":
        raise FlowError(f"a reboot arrived at stage {journal['stage']}; only the one-shot boot reboots mid-flow")
    return after_boot(journal, obs)


def resume_kernel(journal, obs):
    """A new run finds the journal at one of the kernel's own stages."""
    stage, old, target, running = journal["stage"], journal["old"], journal["target"], obs["running"]
    if stage in ("pinned", "installed"):
        if running != old:
            raise FlowError(f"the journal says stage {stage} with {old} running, but the host runs {running}")
        if stage == "pinned":
            return journal, install_action(journal, obs)
        return arm_boot(journal, obs)
    if stage == "boot_once":
        return after_boot(journal, obs)
    if running != target:  # booted
        return came_back_old(journal, obs, f"stage {stage}")
    return journal, {"name": "verify"}


def commit_check(journal: dict[str, Any], obs: dict[str, Any]) -> tuple[str, str]:
    if obs["default"] != journal["target"] or obs["running"] != journal["target"]:
        return (f"running {obs['running']}, saved default {obs['default']}, expected {journal['target']} for both",
                "")
    return "", f"{journal['target']} is the default"


def rollback_check(journal: dict[str, Any], obs: dict[str, Any]) -> tuple[str, str]:
    if obs["running"] != journal["old"] or obs["default"] != journal["old"]:
        return (f"running {obs['running']}, saved default {obs['default']}, expected {journal['old']} for both",
                "check grub-editenv /boot/grub/grubenv list and the console")
    return "", ""


# the kernel's journal fields besides the shared ones (change/shapes.py JOURNAL_FIELDS)
JOURNAL_FIELDS = {
    "old_entry": (optional(is_text), "a GRUB entry id"), "package": (optional(is_text), "a package name"),
    "target_installed_before": (optional(lambda v: isinstance(v, bool)), "true or false"),
    "dkms_modules": (optional(list_of(is_text)), "a list of module names"),
    "boot_id": (optional(is_text), "a boot id"), "commit_deadline": (optional(is_num), "epoch seconds"),
    "deadline": (optional(is_dict), "a deadline record (boot_id, uptime)"),
    "health": (optional(is_dict), "the boot-health result"), "verify": (optional(is_dict), "the verification"),
}
# the kernel's events' data, and the release a benchmark names
EVENT_FIELDS = {
    "benchmarked": {"kernel": (optional(is_text), "a kernel release")},
    "verified": {"cmdline_missing": (optional(list_of(is_text)), "a list of kernel arguments"),
                 "findings_after": (optional(list_of(is_dict)), "a list of findings"),
                 "vllm": (optional(is_dict), "vllm_ready's answer")},
    "installed": {"preflight": (optional(is_dict), "kernel_upgrade_preflight's answer"),
                  "install": (optional(is_dict), "apt's answer")},
}
# nested data fields that reach text: {event: (field, {sub-field: check})}
EVENT_NESTED = {"verified": ("vllm", {"msg": optional(is_text)}), "installed": ("preflight", {"msg": optional(is_text)})}
PREFLIGHT_FIELDS = {"msg": (optional(is_text), "text"), "running_entry": (optional(is_text), "a GRUB entry id"),
                    "package": (optional(is_text), "a package name"),
                    "dkms_modules": (optional(list_of(is_text)), "a list of module names")}

# Every action the flow answers on a kernel upgrade, and the event its task file (roles/kernel_upgrade/tasks/
# action_<name>.yml) reports: the shared flow's (change/flow.py SHARED_ACTIONS) and the kernel's own.
ACTIONS = kind_actions(("pin", "pinned"), ("install", "installed"), ("boot_once", "rebooted"), ("verify", "verified"))

KERNEL = ChangeKind(
    name="kernel", journal_format=JOURNAL_FORMAT, var_prefix="kernel_upgrade", gate_change="kernel",
    side_key="kernel", side_what="a kernel release", stages=STAGES, events=EVENTS,
    handlers={"pinned": (("baseline",), on_pinned), "installed": (("pinned",), on_installed),
              "rebooted": (("boot_once",), on_rebooted), "verified": (("booted",), on_verified)},
    fresh=fresh, journal_extra=journal_extra, lock=lock_action, commit=commit_action, change=pin_action, rollback=rollback_action,
    resume=resume_kernel, away=came_back_old, commit_check=commit_check, rollback_check=rollback_check,
    serving="the host runs its saved default (uname -r; grub-editenv /boot/grub/grubenv list)",
    state_dir="/var/lib/gpufleet/kernel_upgrade", step_module="kernel_rollout_step", actions=ACTIONS, first_change="the pin",
    keepalive=_deadline, check_settings=commit_timeout,
    journal_fields=JOURNAL_FIELDS, event_fields=EVENT_FIELDS, event_nested=EVENT_NESTED,
    preflight_fields=PREFLIGHT_FIELDS)
# The stage an event may arrive at (the action that produces it was issued there).
EXPECTED_STAGE = KERNEL.expected()


# ---- the shared flow, as the kernel's -------------------------------------------------------------
def step(journal: dict[str, Any] | None, obs: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """One transition of the kernel upgrade (change/flow.py step). ``obs``: event, data, preflight (this run's
    kernel_upgrade_preflight result), running, default, boot_id, uptime (seconds since this boot), now, target, run_id,
    take_over (why this run may resume another run's journal, or empty), settings, installed_packages, health (the
    boot-health unit's last result, or None). Returns the journal to write (``None``: nothing to write) and the next
    action; FlowError for an observation that contradicts the journal (the module refuses, nothing changed)."""
    return flow.step(KERNEL, journal, obs)


def check_journal(journal: Any, path: str) -> dict[str, Any]:
    return flow.check_journal(KERNEL, journal, path)


def check_event(obs: dict[str, Any]) -> None:
    flow.check_event(KERNEL, obs)


def gated_level(data: dict[str, Any]) -> tuple[int | None, list[float], list[str]]:
    return flow.gated_level(data, KERNEL.var_prefix)


def judge_baseline(journal: dict[str, Any], obs: dict[str, Any]) -> tuple[dict, dict]:
    return flow.judge_baseline(KERNEL, journal, obs)


def _gate_settings(obs: dict[str, Any]) -> dict[str, Any]:
    return flow.gate_settings(KERNEL, obs)


def serving_record(journal: dict[str, Any]) -> dict[str, Any] | None:
    return flow.serving_record(KERNEL, journal)


def record_facts(journal: dict[str, Any] | None, action: dict[str, Any]) -> dict[str, Any]:
    return flow.record_facts(KERNEL, journal, action)

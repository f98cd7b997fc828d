# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVIDIA driver upgrade, one kind of change on the shared change flow (change/flow.py): ``DRIVER``.

Between upgrades the driver's packages are held (holds.py, the ``lock`` action). The baseline, the audit and the output
reference are taken on the driver that runs; then the candidate packages are installed (``install``; the role runs
driver_upgrade_preflight's trial build first, so a module that does not build never gets here) and activated
(``activate``: a module reload where no process holds the GPU, or a reboot), and driver_verify checks the driver
against its state before (version, every GPU, persistence, no new Xid). Then the shared candidate rounds, the checks
and the serving verdict; ``pass`` keeps the candidate (``commit``: the holds again, on its packages), anything else
reinstalls the versions the host had before and activates them again (``rollback``).

Versions: ``running`` in the observation is the loaded module's version (its /proc file), ``default`` the upstream
version of the installed driver package (what a reboot or a reload would bring up); the journal's ``old`` and
``target`` are upstream versions (``550.54.15``), ``package_version`` the candidate as apt names it
(``550.54.15-1``) and ``old_packages`` each package's version before the change (the way back).

Stages of the kind: ``installing`` (written before the install: a run that finds it installs again, or goes on when
the install took), ``installed`` (the candidate's packages are installed, the old driver still runs: the activation
is next) and ``activated`` (the activation was asked for: the verification is next; a resumed run activates again,
which does nothing when the candidate runs already).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.change import flow
from ansible_collections.gpufleet.inference.plugins.module_utils.change.flow import (
    SHARED_EVENTS, ChangeKind, FlowError, kind_actions, kind_stages,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.change.shapes import (
    is_dict, is_text, list_of, optional,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.holds import UU_DROPIN, dropin, hold_packages
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.parse import build_error_lines

JOURNAL_FORMAT = "gpufleet.driver_upgrade_journal/1"
STATE_DIR = "/var/lib/gpufleet/driver_upgrade"
JOURNAL = STATE_DIR + "/journal.json"
HISTORY_DIR = STATE_DIR + "/history"
STAGES = kind_stages("installing", "installed", "activated")
EVENTS = SHARED_EVENTS + ("installed", "activated")
# Every action the flow answers on a driver upgrade, and the event its task file reports.
ACTIONS = kind_actions(("install", "installed"), ("activate", "activated"))
ACTIVATIONS = ("reload", "reboot")


# ---- before any journal ------------------------------------------------------------------------------
def fresh(obs: dict[str, Any]) -> tuple[str, str]:
    """(decision, reason) on a host with no driver upgrade in progress; decision '' means: go."""
    pre, target, s, running = obs.get("preflight") or {}, obs["target"], obs["settings"], obs["running"]
    if running is None:
        return "refused", (f"no driver is loaded ({obs.get('version_file')} is missing): nothing is changed. Load "
                           "the driver that serves (modprobe, or a reboot) and run again; the upgrade starts from it.")
    if running == target and obs["default"] == target:
        return "already", f"driver {target} runs already"
    if not pre.get("ok", True):
        return "preflight_failed", pre.get("msg") or "preflight failed"
    activate = s.get("activate", "reboot")
    if s.get("check_mode") or (activate == "reboot" and not s.get("reboot_ok")):
        reason = (f"would: benchmark driver {running}, audit the host and record its outputs, install "
                  f"{', '.join(obs.get('packages') or [])} at {obs.get('package_version') or target}, activate it by "
                  f"{'a module reload' if activate == 'reload' else 'a reboot'}, verify it through NVML, benchmark, "
                  "gate, compare outputs and health; keep it, or reinstall the old versions and activate them again")
        if not s.get("check_mode"):
            reason += ". Set driver_upgrade_reboot_ok: true (or driver_upgrade_activate: reload) to do it"
        return "planned", reason
    return "", ""


def journal_extra(obs: dict[str, Any]) -> dict[str, Any]:
    """The driver upgrade's fields of a new journal: the candidate as apt names it, each package's version before the
    change (the way back), the activation, the driver's state before and the verification."""
    installed = obs.get("installed") or {}
    return {"package_version": obs.get("package_version") or obs["target"], "packages": list(obs.get("packages") or []),
            "old_packages": {n: installed.get(n) for n in obs.get("packages") or []},
            "activate": obs["settings"].get("activate", "reboot"), "state_before": obs.get("state"), "verify": None}


def lock_action(name: str, version: str, obs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The lock, commit and rollback actions: the driver's installed packages held, and unattended-upgrades' blacklist
    of them (holds.py, on the kernel lock's lists): the packages the upgrade names (``packages``, whatever their names)
    and ``hold_packages``, where installed, and every installed package of the driver's name patterns."""
    named = list(obs.get("packages") or []) + list(obs["settings"].get("hold_packages") or [])
    hold = hold_packages(list(obs.get("installed") or {}), named)
    action = {"name": name, "version": version, "lock": bool(obs["settings"].get("lock", True)), "hold": hold,
              "unattended_upgrades": {"path": UU_DROPIN, "content": dropin(hold)}}
    action.update(extra)
    return action


def install_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    """The install, and the journal at ``installing`` before it: the install changes what the host comes back to (the
    installed package), so a run that finds the journal must know it may have happened."""
    if journal["stage"] != "installing":
        flow.stamp(journal, obs, "installing", f"installing driver {journal['package_version']}")
    return {"name": "install", "version": journal["target"],
            "packages": {n: journal["package_version"] for n in journal["packages"]}}


def activate_action(journal: dict[str, Any], obs: dict[str, Any], version: str | None = None) -> dict[str, Any]:
    return {"name": "activate", "how": journal["activate"], "version": version or journal["target"]}


def commit_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    return lock_action("commit", journal["target"], obs)


def rollback_action(journal: dict[str, Any], obs: dict[str, Any]) -> dict[str, Any]:
    """Reinstall the versions the host had (when the installed ones differ) and activate the old driver again (when
    another one runs)."""
    installed = obs.get("installed") or {}
    old = journal["old_packages"]
    reinstall = {n: v for n, v in old.items() if v is not None and installed.get(n) != v}
    return lock_action("rollback", journal["old"], obs, packages=reinstall, activate=journal["activate"],
                       reactivate=obs["running"] != journal["old"] or bool(reinstall))


# ---- the kind's steps ----------------------------------------------------------------------------------
def on_installed(journal, obs):
    """The candidate's packages are installed (or apt failed: a DKMS build that fails in the postinst exits 100)."""
    install = obs["data"].get("install") or {}
    if flow.truthy(install.get("failed")):
        lines = " / ".join(build_error_lines(install.get("stderr"), install.get("stdout"), install.get("msg")))
        return flow.verdict(DRIVER, journal, obs, "preflight_failed", (
            f"the install of driver {journal['package_version']} failed: {lines or install.get('msg') or 'no output'}. "
            f"Driver {journal['old']} still runs; its packages are put back"))
    if obs["default"] != journal["target"]:
        return flow.verdict(DRIVER, journal, obs, "preflight_failed", (
            f"after the install the driver's package is {obs['default']}, not {journal['target']}: apt installed "
            "something else (apt-cache policy); its packages are put back"))
    flow.stamp(journal, obs, "installed", f"driver {journal['target']} installed, {journal['old']} still runs")
    return journal, activate_action(journal, obs)


def on_activated(journal, obs):
    """The activation ran: the driver's verification against its state before."""
    data = obs["data"]
    activation, verify = data.get("activation") or {}, data.get("verify") or {}
    flow.stamp(journal, obs, "activated", f"activated by {journal['activate']}")
    if flow.truthy(activation.get("failed")):
        return flow.verdict(DRIVER, journal, obs, "verify_failed", (
            f"driver {journal['target']} was installed but its activation by {journal['activate']} failed: "
            f"{activation.get('msg') or '?'}"))
    if obs["running"] != journal["target"]:
        return away(journal, obs, "the activation")
    journal["verify"] = {"checks": verify.get("checks") or [], "at": obs["now"], "notes": []}
    if not flow.truthy(verify.get("ok")):
        return flow.verdict(DRIVER, journal, obs, "verify_failed",
                            f"driver {journal['target']} runs but {verify.get('msg') or 'its verification failed'}")
    return flow.candidate_round(DRIVER, journal, obs, "verified")


def away(journal, obs, when: str):
    """The candidate does not run where it must: another driver was loaded outside this flow (or the module did not
    come up at its version)."""
    return flow.verdict(DRIVER, journal, obs, "reverted", (
        f"during {when} the loaded driver is {obs['running'] or 'none'}, not {journal['target']} (installed: "
        f"{obs['default']}): it was changed outside this flow, or the candidate's module did not load"))


def resume(journal, obs):
    """A new run finds the journal at installing (install again: apt is idempotent; the install took if the package is
    the candidate's), installed or activated (activate again: a reload of the driver that runs already does nothing;
    a reboot already done is not repeated when the candidate runs)."""
    if journal["stage"] == "installing":
        if obs["default"] == journal["old"] and obs["running"] == journal["old"]:
            return journal, install_action(journal, obs)
        if obs["default"] == journal["target"] and obs["running"] == journal["old"]:
            flow.stamp(journal, obs, "installed", f"driver {journal['target']} found installed by a new run")
            return journal, activate_action(journal, obs)
    if obs["default"] != journal["target"]:
        return flow.verdict(DRIVER, journal, obs, "reverted", (
            f"at stage {journal['stage']} the installed driver is {obs['default']}, not {journal['target']}: its "
            "packages were changed outside this flow"))
    if journal["stage"] == "activated" and obs["running"] == journal["target"]:
        return journal, dict(activate_action(journal, obs), how="none")
    return journal, activate_action(journal, obs)


def commit_check(journal: dict[str, Any], obs: dict[str, Any]) -> tuple[str, str]:
    if obs["running"] != journal["target"] or obs["default"] != journal["target"]:
        return (f"driver {obs['running']} is loaded and {obs['default']} installed, expected {journal['target']}", "")
    return "", f"driver {journal['target']} runs and is held"


def rollback_check(journal: dict[str, Any], obs: dict[str, Any]) -> tuple[str, str]:
    if obs["running"] != journal["old"] or obs["default"] != journal["old"]:
        return (f"driver {obs['running']} is loaded and {obs['default']} installed, expected {journal['old']}",
                "check dpkg -l of the driver's packages, dkms status and the driver's version file; reboot if the "
                "packages are right and the module is not")
    return "", ""


def check_settings(settings: dict[str, Any]) -> None:
    activate = settings.get("activate", "reboot")
    if activate not in ACTIVATIONS:
        raise FlowError(f"activate {activate!r} is not one of {', '.join(ACTIVATIONS)}: set driver_upgrade_activate; "
                        "nothing was changed")


def _versions(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and (v is None or isinstance(v, str))
                                           for k, v in value.items())


JOURNAL_FIELDS = {
    "package_version": (is_text, "a package version"), "packages": (list_of(is_text), "a list of package names"),
    "old_packages": (_versions, "package names and their versions"), "activate": (is_text, "reload or reboot"),
    "state_before": (optional(is_dict), "driver_verify's state"), "verify": (optional(is_dict), "the verification"),
}
EVENT_FIELDS = {
    "installed": {"install": (optional(is_dict), "the install's answer")},
    "activated": {"activation": (optional(is_dict), "the activation's answer"),
                  "verify": (optional(is_dict), "driver_verify's answer")},
}
EVENT_NESTED = {"installed": ("install", {"msg": optional(is_text)}),
                "activated": ("activation", {"msg": optional(is_text)})}
PREFLIGHT_FIELDS = {"msg": (optional(is_text), "text")}

DRIVER = ChangeKind(
    name="driver", journal_format=JOURNAL_FORMAT, var_prefix="driver_upgrade", gate_change="driver",
    side_key="driver", side_what="a driver version", stages=STAGES, events=EVENTS,
    handlers={"installed": (("installing",), on_installed), "activated": (("installed",), on_activated)},
    fresh=fresh, journal_extra=journal_extra, lock=lock_action, commit=commit_action, change=install_action,
    rollback=rollback_action, resume=resume, away=away, commit_check=commit_check, rollback_check=rollback_check,
    serving="the driver that should serve is loaded and installed", state_dir=STATE_DIR,
    step_module="driver_upgrade_step", first_change="the install", actions=ACTIONS,
    check_settings=check_settings, journal_fields=JOURNAL_FIELDS, event_fields=EVENT_FIELDS, event_nested=EVENT_NESTED,
    preflight_fields=PREFLIGHT_FIELDS)


def step(journal: dict[str, Any] | None, obs: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """One transition of the driver upgrade (change/flow.py step)."""
    return flow.step(DRIVER, journal, obs)

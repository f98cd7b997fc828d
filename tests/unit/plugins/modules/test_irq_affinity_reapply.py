# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""irq_affinity with install_reapply (module_utils/irq/irq_affinity.py): the pinning and, in the same run, the re-apply
script, units, udev rule and timer that the irq_affinity role once installed with 10 to 14 tasks. main() runs as
Ansible runs it, on fake trees, with the real systemctl enabling and disabling units offline (--root); the script it
installs then runs as a real process, isolated from the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.irq import affinity as ia
from ansible_collections.gpufleet.inference.plugins.module_utils.irq import irq_affinity as irq_boot
from ansible_collections.gpufleet.inference.plugins.module_utils.irq.reapply import render_script
from ansible_collections.gpufleet.inference.plugins.modules import irq_affinity
from tests.unit.fakesysfs import irqbalance_installed
from tests.unit.plugins.module_utils.test_irq_affinity import G0, G1, numa_host
from tests.unit.plugins.modules.uthelper import needs_tools, run_module

needs_systemctl = needs_tools("systemctl")
SYSTEMD = irq_boot.SYSTEMD
UNITS = [f"{SYSTEMD}/{irq_boot.SERVICE}", f"{SYSTEMD}/{irq_boot.BIND_SERVICE}"]


def args(host, **kw):
    base = {"root": str(host.root), "devices": [G0, G1], "persist": True, "exclusive": True, "install_reapply": True,
            "reapply_python": sys.executable}
    base.update(kw)
    return base


def text(host, path):
    p = host.real(path)
    return p.read_text() if os.path.lexists(p) else None


def installed(host) -> dict:
    """What the re-apply left on the tree: the files it manages and the two enablement links."""
    paths = [irq_boot.SCRIPT, *UNITS, irq_boot.UDEV_RULE, f"{SYSTEMD}/{irq_boot.TIMER}", f"{SYSTEMD}/{irq_boot.TIMER_SERVICE}",
             irq_boot.SERVICE_WANTS, irq_boot.TIMER_WANTS]
    return {p: os.path.lexists(host.real(p)) for p in paths}


@needs_systemctl
def test_install_once_then_nothing_to_do(tmp_path, capsys):
    host = numa_host(tmp_path)
    irqbalance_installed(host)
    first = run_module(irq_affinity, args(host, _ansible_diff=True), capsys)
    assert first["changed"] is True, first
    assert text(host, irq_boot.SCRIPT) == render_script(sys.executable)
    assert os.stat(host.real(irq_boot.SCRIPT)).st_mode & 0o777 == 0o755
    assert text(host, UNITS[0]) == irq_boot.render_service(30)
    assert f"ExecStart={irq_boot.SCRIPT} --device %I --wait 30\n" in text(host, UNITS[1])
    rule = text(host, irq_boot.UDEV_RULE)
    assert [line for line in rule.splitlines() if line.startswith("ACTION")] == [
        f'ACTION=="bind", SUBSYSTEM=="pci", KERNEL=="{b}", RUN+="/bin/systemctl --no-block start gpufleet-irq-affinity@{b}.service"'
        for b in (G0, G1)]
    assert os.readlink(host.real(irq_boot.SERVICE_WANTS)).endswith(irq_boot.SERVICE)  # the real systemctl --root enable
    verbs = [(a["action"], a.get("path") or a.get("unit")) for a in first["actions"] if a["action"] not in ("pin",)]
    assert ("create", irq_boot.SCRIPT) in verbs and ("create", irq_boot.UDEV_RULE) in verbs
    assert ("enable_unit", irq_boot.SERVICE) in verbs
    assert not [v for v in verbs if v[0] in ("daemon_reload", "reload_udev_rules", "start_unit")]  # nothing live under a tree
    assert first["reapply"] == {"script": irq_boot.SCRIPT, "unit_enabled": True, "timer": None, "udev_rule": irq_boot.UDEV_RULE}
    assert irq_boot.UDEV_RULE in [d["after_header"] for d in first["diff"]]
    again = run_module(irq_affinity, args(host), capsys)
    assert (again["changed"], again["actions"]) == (False, [])
    check = run_module(irq_affinity, args(host, _ansible_check_mode=True), capsys)
    assert (check["changed"], check["reapply"]["unit_enabled"]) == (False, True)


@needs_systemctl
def test_check_mode_plans_everything_and_writes_nothing(tmp_path, capsys):
    host = numa_host(tmp_path)
    before = sorted(str(p) for p in host.root.rglob("*"))
    result = run_module(irq_affinity, args(host, _ansible_check_mode=True, _ansible_diff=True), capsys)
    assert sorted(str(p) for p in host.root.rglob("*")) == before
    planned = {(a["action"], a.get("path") or a.get("unit")) for a in result["actions"]}
    assert {("create", irq_boot.SCRIPT), ("create", UNITS[0]), ("create", UNITS[1]), ("create", irq_boot.UDEV_RULE),
            ("write", ia.CONFIG_FILE), ("enable_unit", irq_boot.SERVICE)} <= planned
    assert result["reapply"]["unit_enabled"] is True  # as the run would leave it


@needs_systemctl
def test_the_installed_script_runs_isolated_and_agrees_with_the_module(tmp_path, capsys):
    host = numa_host(tmp_path)
    run_module(irq_affinity, args(host), capsys)
    proc = subprocess.run([sys.executable, "-I", str(host.real(irq_boot.SCRIPT)), "--root", str(host.root), "--wait", "0"],
                          capture_output=True, text=True, check=False, timeout=60, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"devices": [G0, G1], "changed": 0, "ok": 8, "managed": 0}


@needs_systemctl
def test_timer_comes_with_an_interval_and_goes_without_one(tmp_path, capsys):
    host = numa_host(tmp_path)
    with_timer = run_module(irq_affinity, args(host, reapply_interval="10min"), capsys)
    assert with_timer["reapply"]["timer"] == irq_boot.TIMER
    assert "OnUnitInactiveSec=10min\n" in text(host, f"{SYSTEMD}/{irq_boot.TIMER}")
    assert os.path.lexists(host.real(irq_boot.TIMER_WANTS))
    assert ("enable_unit", irq_boot.TIMER) in [(a["action"], a.get("unit")) for a in with_timer["actions"]]
    assert run_module(irq_affinity, args(host, reapply_interval="10min"), capsys)["changed"] is False
    without = run_module(irq_affinity, args(host), capsys)
    assert [(a["action"], a.get("unit") or a.get("path")) for a in without["actions"]] == [
        ("disable_unit", irq_boot.TIMER), ("remove", f"{SYSTEMD}/{irq_boot.TIMER}"),
        ("remove", f"{SYSTEMD}/{irq_boot.TIMER_SERVICE}")]
    state = installed(host)
    assert not state[f"{SYSTEMD}/{irq_boot.TIMER}"] and not state[irq_boot.TIMER_WANTS] and state[irq_boot.SERVICE_WANTS]


@needs_systemctl
def test_unpinning_everything_removes_the_rule_and_leaves_the_inert_unit(tmp_path, capsys):
    """state: absent for every pinned function: the configuration empties (and goes), so does the udev rule; the
    boot unit stays, inert (ConditionPathExists on the configuration), as the role left it."""
    host = numa_host(tmp_path)
    run_module(irq_affinity, args(host), capsys)
    gone = run_module(irq_affinity, args(host, state="absent", exclusive=False), capsys)
    assert gone["persisted"] == [] and {"action": "remove", "path": irq_boot.UDEV_RULE, "why": "no function is pinned"} in gone["actions"]
    assert text(host, irq_boot.UDEV_RULE) is None and text(host, ia.CONFIG_FILE) is None
    assert gone["reapply"]["udev_rule"] is None
    assert run_module(irq_affinity, args(host, state="absent", exclusive=False), capsys)["changed"] is False


@needs_systemctl
def test_the_module_utils_copy_of_earlier_versions_is_removed(tmp_path, capsys):
    host = numa_host(tmp_path)
    old = "/usr/local/lib/gpufleet/python/ansible_collections/gpufleet/inference/plugins/module_utils/irq/affinity.py"
    host.write(old, "# an earlier version's copy\n")
    result = run_module(irq_affinity, args(host, legacy_libdir="/usr/local/lib/gpufleet/python"), capsys)
    assert ("remove_tree", "/usr/local/lib/gpufleet/python/ansible_collections") in [
        (a["action"], a.get("path")) for a in result["actions"]]
    assert not os.path.lexists(host.real("/usr/local/lib/gpufleet/python/ansible_collections"))
    assert os.path.isdir(host.real("/usr/local/lib/gpufleet/python"))


@pytest.mark.parametrize("bad, message", [
    ({"reapply_interval": "10min\nExecStartPre=/bin/sh"}, "reapply_interval '10min\\nExecStartPre=/bin/sh' is not a systemd time span"),
    ({"reapply_interval": "soon"}, "reapply_interval 'soon' is not a systemd time span"),
    ({"reapply_wait": -1}, "reapply_wait -1 must be a whole number of seconds"),
    ({"reapply_python": "python3"}, "reapply_python='python3' is refused: a relative path"),
    ({"persist": False}, "install_reapply needs persist: true"),
])
def test_bad_options_fail_before_anything_is_written(tmp_path, capsys, bad, message):
    host = numa_host(tmp_path)
    before = {str(p): p.read_bytes() for p in host.root.rglob("*") if p.is_file()}
    result = run_module(irq_affinity, args(host, **bad), capsys)
    assert result["failed"] is True and result["changed"] is False and result["msg"].startswith(message), result
    assert {str(p): p.read_bytes() for p in host.root.rglob("*") if p.is_file()} == before


@needs_systemctl
def test_a_failed_enable_says_the_pinning_is_in_place_and_what_to_check(tmp_path, capsys):
    """systemctl cannot create the enablement link (a file stands where its directory belongs): the run fails as
    changed, with systemctl's own words, and the interrupts stay pinned."""
    host = numa_host(tmp_path)
    host.write(f"{SYSTEMD}/multi-user.target.wants", "not a directory\n")
    result = run_module(irq_affinity, args(host), capsys)
    assert result["failed"] is True and result["changed"] is True, result
    assert result["msg"].startswith("'") and f"enable {irq_boot.SERVICE}' exited" in result["msg"]
    assert "The interrupts are pinned; only their re-apply at boot and on driver bind is not installed" in result["msg"]
    assert text(host, "/proc/irq/100/smp_affinity_list").strip() != "0-7"


def test_timespans_systemd_reads_are_accepted():
    for good in ("10min", "1h 30min", "90s", "2.5h", "1d", "500ms"):
        assert irq_boot.TIMESPAN.match(good), good
    for bad in ("", "min", "10 minutes; rm", "10min\n[Install]", "-5s"):
        assert not irq_boot.TIMESPAN.match(bad), bad


@needs_systemctl
def test_unpinning_one_function_where_no_boot_unit_was_ever_installed_says_what_to_run(tmp_path, capsys):
    """Functions were pinned with persist but without install_reapply; unpinning one of them with it cannot enable a
    unit that is not there (state: absent installs nothing): the run fails as changed (the interrupt was reset) and
    says how to install the unit."""
    host = numa_host(tmp_path)
    run_module(irq_affinity, args(host, install_reapply=False), capsys)
    result = run_module(irq_affinity, args(host, devices=[G0], state="absent", exclusive=False), capsys)
    assert result["failed"] is True and result["changed"] is True, result
    assert result["msg"] == (f"{irq_boot.SERVICE} is not installed, so the pinning of {G1} would not come back at boot: run "
                             "with install_reapply: true and state: present (the irq_affinity role does).")
    assert text(host, "/proc/irq/100/smp_affinity_list").strip() == "0-15"  # reset to the default affinity

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""irq_affinity: execute() on a simulated kernel (EIO for managed vectors, new IRQ numbers on rebind), main()
through AnsibleModule, and the role's re-apply script (as the role installs it: irq_reapply with the module_utils
it carries) run as a real subprocess against the same trees."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.irq import affinity as ia
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils.irq.reapply import render_script
from ansible_collections.gpufleet.inference.plugins.modules import irq_affinity
from tests.unit.fakesysfs import DEBIAN_IRQBALANCE, SimKernel, irqbalance_installed
from tests.unit.plugins.module_utils.test_irq_affinity import G0, G1, numa_host
from tests.unit.plugins.modules.uthelper import run_module

NVME = "0000:18:00.0"


def params(**kw):
    base = {"devices": [G0, G1], "state": "present", "cpus": "", "housekeeping_cpus": "", "policy": "spread", "numa_node": None,
            "allow_remote": False, "allow_no_irqs": False, "irqbalance": "policyscript", "irqbalance_config": None,
            "persist": False, "exclusive": False}
    base.update(kw)
    return base


def on(fs) -> Host:
    """The Host of a run without install_reapply: its files; no command runs, warnings are dropped."""
    return Host(fs=fs, cmd=None, warn=lambda msg: None)


def affinity(host, irq) -> str:
    return host.real(f"/proc/irq/{irq}/smp_affinity_list").read_text().strip()


def irqs_of(host, bdf) -> list[int]:
    return sorted(int(n) for n in os.listdir(host.real(f"{host.dirs[bdf]}/msi_irqs")))


def with_nvme(host):
    """An NVMe drive on node 0 with 4 vectors: the admin queue (first) can be moved, the I/O queues are kernel-managed."""
    host.add("0000:16:02.0", "pci0000:16", kind="root_port")
    host.add(NVME, "0000:16:02.0", class_code="0x010802", vendor="0x144d", device="0xa80a", driver="nvme", msix=4)
    irqs = irqs_of(host, NVME)
    return irqs[0], irqs[1:]


@pytest.fixture
def script(tmp_path):
    """The re-apply script as the role installs it, alone in a directory of its own."""
    path = tmp_path / "libexec" / "gpufleet-irq-affinity-apply"
    path.parent.mkdir()
    path.write_text(render_script(sys.executable))
    path.chmod(0o755)
    return path


def run_script(script, host, *args):
    """The script in isolated mode (no PYTHONPATH, no user site, not the checkout): it runs only what it carries."""
    return subprocess.run([sys.executable, "-I", str(script), "--root", str(host.root), "--settle", "0.1", "--wait", "2", *args],
                          capture_output=True, text=True, check=False, timeout=60, cwd=str(script.parent))


# ---- pinning -----------------------------------------------------------------------------------------------------
def test_pin_two_gpus_on_their_nodes_with_irqbalance_policy(tmp_path):
    host = numa_host(tmp_path, remote_irqs=True)
    irqbalance_installed(host)
    sim = SimKernel(host)
    result = irq_affinity.execute(params(housekeeping_cpus="0,8"), on(sim.fs()), False)
    assert result["changed"] is True
    assert [affinity(host, n) for n in range(100, 108)] == ["1", "2", "3", "4", "9", "10", "11", "12"]
    rec = {r["irq"]: r for r in result["irqs"]}
    assert (rec[104]["before"], rec[104]["after"], rec[104]["numa_node"], rec[104]["remote_before"], rec[104]["remote_after"],
            rec[104]["status"]) == ("8-15", "9", 1, True, False, "changed")
    assert rec[100]["remote_before"] is False
    assert result["devices"] == [
        {"bdf": G0, "numa_node": 0, "local_cpus": "0-7", "cpus": "1-7", "vectors": 4, "managed_vectors": 0, "remote": False},
        {"bdf": G1, "numa_node": 1, "local_cpus": "8-15", "cpus": "9-15", "vectors": 4, "managed_vectors": 0, "remote": False}]
    fs = HostFS(str(host.root))
    assert ia.parse_pinned(fs.read_text(ia.PINNED_FILE)) == {G0: "1-7", G1: "9-15"}
    assert fs.read_text(ia.POLICY_SCRIPT).startswith("#!/bin/sh")
    assert os.stat(host.real(ia.POLICY_SCRIPT)).st_mode & 0o777 == 0o755
    assert ia.get_var(fs.read_text("/etc/default/irqbalance"), "IRQBALANCE_ARGS") == f"--policyscript={ia.POLICY_SCRIPT}"
    assert result["irqbalance"]["present"] is True and result["irqbalance"]["restart_required"] is True
    assert result["persisted"] == []


def test_second_run_and_check_mode_change_nothing(tmp_path):
    host = numa_host(tmp_path)
    irqbalance_installed(host)
    sim = SimKernel(host)
    check = irq_affinity.execute(params(), on(sim.fs()), True)
    assert sim.writes == [] and check["changed"] is True
    assert len([a for a in check["actions"] if a["action"] == "pin"]) == 8
    assert [r["status"] for r in check["irqs"]] == ["change"] * 8
    first = irq_affinity.execute(params(), on(sim.fs()), False)
    assert first["changed"] is True and len(first["actions"]) == len(check["actions"])
    sim.writes.clear()
    again = irq_affinity.execute(params(), on(sim.fs()), False)
    assert (again["changed"], again["actions"], sim.writes) == (False, [], [])
    assert again["irqbalance"]["restart_required"] is False
    assert irq_affinity.execute(params(), on(sim.fs()), True)["changed"] is False


def test_managed_vectors_are_reported_and_left_alone_then_known_to_check_mode(tmp_path):
    host = numa_host(tmp_path)
    admin, io_queues = with_nvme(host)
    sim = SimKernel(host, managed_irqs=io_queues)
    result = irq_affinity.execute(params(devices=[NVME]), on(sim.fs()), False)
    statuses = {r["irq"]: (r["status"], r["managed"]) for r in result["irqs"]}
    assert statuses[admin] == ("changed", False)
    assert all(statuses[n] == ("managed", True) for n in io_queues)
    assert result["devices"][0]["managed_vectors"] == 3
    assert result["actions"][0] == {"action": "pin", "path": f"/proc/irq/{admin}/smp_affinity_list", "irq": admin,
                                    "device": NVME, "before": "0-7", "after": "0"}
    assert not any(a.get("irq") == n for a in result["actions"] for n in io_queues)
    cache = json.loads(HostFS(str(host.root)).read_text(ia.MANAGED_CACHE))
    assert cache == {NVME: {"driver": "nvme", "irqs": io_queues}}
    assert irq_affinity.execute(params(devices=[NVME]), on(sim.fs()), True)["changed"] is False
    assert irq_affinity.execute(params(devices=[NVME]), on(sim.fs()), False)["changed"] is False


def test_bad_input_changes_nothing(tmp_path):
    host = numa_host(tmp_path)
    host.add("0000:16:02.0", "pci0000:16", kind="root_port")
    host.gpu("0000:18:00.0", "0000:16:02.0", msix=0)
    irqbalance_installed(host)
    sim = SimKernel(host)
    cases = [
        (params(cpus="0-63"), "cpus: '0-63' names CPUs 16-63 that are not online"),
        (params(devices=["10de:ffff"]), "No PCI function has the ID 10de:ffff"),
        (params(devices=["0000:18:00.0"]), "0000:18:00.0 has no MSI/MSI-X vectors"),
        (params(housekeeping_cpus="0-15"), "No CPU is left for the interrupts of 0000:17:00.0"),
        (params(devices=["nic0"]), "'nic0' is neither a PCI address nor a vendor:device ID"),
    ]
    for p, message in cases:
        with pytest.raises(ia.IrqError, match=message.replace("(", r"\(").replace(")", r"\)")):
            irq_affinity.execute(p, on(sim.fs()), False)
    assert sim.writes == []
    assert not host.real(ia.PINNED_FILE).exists()


def test_someone_elses_policy_script_stops_the_run_before_any_write(tmp_path):
    host = numa_host(tmp_path)
    irqbalance_installed(host, 'IRQBALANCE_ARGS="--policyscript=/usr/local/bin/site-policy"\n')
    sim = SimKernel(host)
    with pytest.raises(ia.IrqError, match="already names the policy script /usr/local/bin/site-policy"):
        irq_affinity.execute(params(), on(sim.fs()), False)
    assert sim.writes == []


def test_no_irqbalance_is_reported_and_its_config_left_alone(tmp_path):
    host = numa_host(tmp_path)
    sim = SimKernel(host)
    result = irq_affinity.execute(params(), on(sim.fs()), False)
    assert result["irqbalance"]["present"] is False and "irqbalance is not installed" in result["irqbalance"]["note"]
    assert result["irqbalance"]["restart_required"] is False
    assert not host.real("/etc/default/irqbalance").exists() and not host.real(ia.POLICY_SCRIPT).exists()
    assert host.real(ia.PINNED_FILE).exists()


def test_banned_cpus_mode(tmp_path):
    host = numa_host(tmp_path)
    irqbalance_installed(host)
    sim = SimKernel(host)
    irq_affinity.execute(params(irqbalance="banned_cpus", cpus="2-5,10-13"), on(sim.fs()), False)
    text = HostFS(str(host.root)).read_text("/etc/default/irqbalance")
    assert ia.get_var(text, "IRQBALANCE_BANNED_CPULIST") == "2-5,10-13" and ia.get_var(text, "IRQBALANCE_ARGS") is None
    assert not host.real(ia.POLICY_SCRIPT).exists()


def test_persist_exclusive_and_absent(tmp_path):
    host = numa_host(tmp_path)
    irqbalance_installed(host)
    sim = SimKernel(host)
    fs = HostFS(str(host.root))
    irq_affinity.execute(params(persist=True, housekeeping_cpus="0"), on(sim.fs()), False)
    config = json.loads(fs.read_text(ia.CONFIG_FILE))
    assert config == {"version": 1, "devices": {G0: dict(ia.DEFAULTS, housekeeping_cpus="0"),
                                                G1: dict(ia.DEFAULTS, housekeeping_cpus="0")}}
    only = irq_affinity.execute(params(devices=[G1], persist=True, exclusive=True, housekeeping_cpus="0"), on(sim.fs()), False)
    assert only["persisted"] == [G1] and list(ia.parse_pinned(fs.read_text(ia.PINNED_FILE))) == [G1]
    assert only["irqbalance"]["restart_required"] is True  # the ban list shrank
    back = irq_affinity.execute(params(devices=[G1], state="absent", persist=True), on(sim.fs()), False)
    assert [affinity(host, n) for n in range(104, 108)] == ["0-15"] * 4
    assert back["persisted"] == [] and not fs.exists(ia.CONFIG_FILE) and not fs.exists(ia.PINNED_FILE)
    assert ia.get_var(fs.read_text("/etc/default/irqbalance"), "IRQBALANCE_ARGS") is None
    assert irq_affinity.execute(params(devices=[G1], state="absent", persist=True), on(sim.fs()), False)["changed"] is False


# ---- main --------------------------------------------------------------------------------------------------------------
def test_main_check_mode_and_diff(tmp_path, capsys):
    host = numa_host(tmp_path)
    irqbalance_installed(host)
    result = run_module(irq_affinity, {"root": str(host.root), "devices": [G1], "_ansible_check_mode": True, "_ansible_diff": True}, capsys)
    assert result["changed"] is True
    assert result["diff"][0]["before"].startswith(f"IRQ 104 ({G1}): 8-15\n") and "IRQ 104 (0000:97:00.0): 8\n" in result["diff"][0]["after"]
    assert [d["after_header"] for d in result["diff"][1:]] == [ia.PINNED_FILE, ia.POLICY_SCRIPT, "/etc/default/irqbalance"]
    assert affinity(host, 104) == "8-15" and not host.real(ia.PINNED_FILE).exists()


def test_main_error_is_clean(tmp_path, capsys):
    host = numa_host(tmp_path)
    result = run_module(irq_affinity, {"root": str(host.root), "devices": [G0], "cpus": "99"}, capsys)
    assert result["failed"] is True and result["msg"].startswith("cpus: '99' names CPUs 99 that are not online on this host")


# ---- the re-apply script (the role's files/), as a real process ------------------------------------------------------
def test_script_re_pins_after_a_rebind_with_new_irq_numbers(tmp_path, script):
    host = numa_host(tmp_path)
    irqbalance_installed(host)
    sim = SimKernel(host)
    first = irq_affinity.execute(params(persist=True, housekeeping_cpus="0,8"), on(sim.fs()), False)
    pinned_before = [r["after"] for r in first["irqs"] if r["bdf"] == G1]
    sim.rebind(G1)  # the driver re-requests its vectors: new numbers, default affinity
    new = irqs_of(host, G1)
    assert new[0] >= 108 and [affinity(host, n) for n in new] == ["0-15"] * 4
    proc = run_script(script, host, "--device", G1)
    assert proc.returncode == 0, proc.stderr
    assert [affinity(host, n) for n in new] == pinned_before == ["9", "10", "11", "12"]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"devices": [G1], "changed": 4, "ok": 0, "managed": 0}
    assert f"{G1} IRQ {new[0]}: 0-15 -> 9" in proc.stdout
    again = run_script(script, host, "--device", G1)  # idempotent: the unit may run twice for one bind
    assert json.loads(again.stdout.splitlines()[-1]) == {"devices": [G1], "changed": 0, "ok": 4, "managed": 0}


def test_script_without_configuration_or_with_unknown_device_is_quiet(tmp_path, script):
    host = numa_host(tmp_path)
    proc = run_script(script, host)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    SimKernel(host).fs().write_atomic(ia.CONFIG_FILE, json.dumps(ia.merge_config({}, {G0: {}}, "present", False)))
    proc = run_script(script, host, "--device", G1)
    assert proc.returncode == 0 and f"{G1}: not in {ia.CONFIG_FILE}; nothing to do." in proc.stdout
    assert affinity(host, 100) == "0-7"
    assert run_script(script, host, "--device", "gpu").returncode == 2


def test_script_reports_a_missing_library(tmp_path, script):
    """A script whose copy of the module_utils is incomplete (_pci/topology.py cut out of it) says so, and how to fix it."""
    host = numa_host(tmp_path)
    text = script.read_text()
    cut = re.sub(r"\nSOURCES\['_pci.topology'\] = '''.*?(?<!\\)'''\n", "\n", text, count=1, flags=re.S)
    assert cut != text and "SOURCES['_pci.topology']" not in cut and "SOURCES['irq.affinity']" in cut
    script.write_text(cut)
    proc = subprocess.run([sys.executable, "-I", str(script), "--root", str(host.root)], capture_output=True, text=True,
                          check=False, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, cwd=str(tmp_path))
    assert proc.returncode == 2
    assert "cannot import the collection's module_utils" in proc.stderr and "irq_affinity role" in proc.stderr


def test_script_accepts_the_lib_option_of_earlier_units(tmp_path, script):
    """Units written by an earlier version pass --lib; the script ignores it rather than failing until the role runs again."""
    host = numa_host(tmp_path)
    proc = run_script(script, host, "--lib", str(tmp_path / "nowhere"))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_debian_default_file_is_parsed(tmp_path):
    assert ia.get_var(DEBIAN_IRQBALANCE, "IRQBALANCE_ARGS") is None

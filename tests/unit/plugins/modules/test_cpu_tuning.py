# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""cpu_tuning and cpu_placement through main(), on fake trees with the real systemctl --root: apply, check mode
and diff, idempotence, the boot unit and its applier run after a "reboot", revert to the exact originals, a host
that lacks a knob, and the vLLM unit's drop-in away from the pinned interrupts."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.cpu import boot, pm_qos
from ansible_collections.gpufleet.inference.plugins.module_utils.cpu.cpu_placement import dropin_path
from ansible_collections.gpufleet.inference.plugins.module_utils.cpu.knobs import value_of
from ansible_collections.gpufleet.inference.plugins.modules import cpu_placement, cpu_tuning
from tests.unit.fakesysfs import FakeHost, cpu_knobs, cpus_online, two_numa_nodes
from tests.unit.plugins.modules.uthelper import needs_tools, run_module, target_side

needs_systemctl = needs_tools("systemctl")
GOV = "sys/devices/system/cpu/cpufreq/policy{}/scaling_governor"
C6 = "sys/devices/system/cpu/cpu{}/cpuidle/state3/disable"
THP = "sys/kernel/mm/transparent_hugepage/enabled"
ALL = {"governor": "performance", "energy_performance_preference": "performance", "cstate_max_latency_us": 10,
       "thp_enabled": "madvise", "thp_defrag": "defer+madvise"}


@pytest.fixture(autouse=True)
def _target_side(monkeypatch):
    target_side(monkeypatch)


def host_tree(root: Path, **kw) -> Path:
    cpu_knobs(FakeHost(root), **kw)
    return root


def snapshot(root: Path) -> dict[str, str]:
    """The value in force of every file under the tree's CPU and THP sysfs, by path (knobs.value_of: a plain file
    stands for the kernel's, which adds the newline and the brackets itself)."""
    out = {}
    for base in ("sys/devices/system/cpu", "sys/kernel/mm/transparent_hugepage"):
        for dirpath, _dirs, names in os.walk(root / base):
            for name in names:
                path = Path(dirpath) / name
                out[str(path.relative_to(root))] = value_of("/" + str(path.relative_to(root)), path.read_text())
    return out


def run(root: Path, capsys, **args) -> dict:
    return run_module(cpu_tuning, dict(args, root=str(root), state_dir=str("/var/lib/gpufleet")), capsys)


def unit_command(root: Path) -> list[str]:
    """The installed unit's ExecStart, pointed at the tree."""
    unit = (root / boot.UNIT_PATH.lstrip("/")).read_text()
    argv = shlex.split(next(ln.split("=", 1)[1] for ln in unit.splitlines() if ln.startswith("ExecStart=")))
    assert argv == [boot.APPLY_SCRIPT, boot.PERSIST_CONFIG]
    return [sys.executable, str(root / argv[0].lstrip("/")), "--root", str(root), str(root / argv[1].lstrip("/"))]


@needs_systemctl
def test_apply_check_diff_idempotence_boot_and_revert(tmp_path, capsys):
    root = host_tree(tmp_path / "host")
    firmware = snapshot(root)
    check = run(root, capsys, _ansible_check_mode=True, _ansible_diff=True, **ALL)
    assert check["changed"] and snapshot(root) == firmware and not (root / "etc").exists()
    assert check["after"]["governor"] == {f"policy{i}": "performance" for i in range(4)}
    assert check["after"]["cstates_disabled"]["cpu3"] == ["state3 (C6, 170 us)"]
    assert {a["action"] for a in check["actions"]} == {"set_value", "create", "enable_unit"}
    assert "policy0/scaling_governor: powersave" in check["diff"][0]["before"]
    assert "policy0/scaling_governor: performance" in check["diff"][0]["after"]

    done = run(root, capsys, _ansible_diff=True, **ALL)
    assert done["changed"] and done["after"] == check["after"] and done["unavailable"] == {}
    assert (root / GOV.format(2)).read_text() == "performance" and (root / C6.format(1)).read_text() == "1"
    assert (root / THP).read_text() == "madvise"
    assert done["originals"]["/" + GOV.format(0)] == "powersave" and done["originals"]["/" + THP] == "always"
    assert json.loads((root / "etc/gpufleet/cpu_tuning.json").read_text())["settings"] == ALL
    assert (root / boot.UNIT_WANTS.lstrip("/")).is_symlink()
    assert run(root, capsys, **ALL)["changed"] is False  # idempotent

    # a reboot: the kernel's defaults are back; the unit's applier sets the kept values again, read back
    cpu_knobs(FakeHost(root))
    assert snapshot(root) == firmware
    proc = subprocess.run(unit_command(root), capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 failed" in proc.stdout and (root / GOV.format(3)).read_text() == "performance"
    assert run(root, capsys, **ALL)["changed"] is False

    # revert the governor only, then everything: exactly the originals, the unit and its files gone
    part = run(root, capsys, state="absent", restore=["governor", "energy_performance_preference"])
    assert part["after"]["governor"] == {f"policy{i}": "powersave" for i in range(4)}
    assert part["after"]["thp_enabled"] == "madvise" and "governor" not in part["persisted"]
    gone = run(root, capsys, state="absent", _ansible_diff=True)
    assert gone["changed"] and snapshot(root) == firmware
    for path in (boot.UNIT_PATH, boot.PERSIST_CONFIG, boot.APPLY_SCRIPT, boot.UNIT_WANTS, "/var/lib/gpufleet/cpu_tuning.json"):
        assert not (root / path.lstrip("/")).exists(), path
    assert run(root, capsys, state="absent")["changed"] is False


@needs_systemctl
def test_a_vm_without_cpufreq_and_cpuidle_skips_those_knobs_and_still_sets_thp(tmp_path, capsys):
    root = host_tree(tmp_path / "vm", driver=None, idle_driver=None)
    result = run(root, capsys, **ALL)
    assert set(result["unavailable"]) == {"governor", "energy_performance_preference", "cstate"}
    assert "governor skipped: no cpufreq policy" in json.dumps(result["warnings"])
    assert (root / THP).read_text() == "madvise"
    assert result["persisted"] == {"thp_enabled": "madvise", "thp_defrag": "defer+madvise"}  # no skipped knob kept
    assert not (root / "sys/devices/system/cpu/cpufreq").exists()  # nothing faked


@needs_systemctl
def test_a_bad_value_changes_nothing(tmp_path, capsys):
    root = host_tree(tmp_path / "host")
    firmware = snapshot(root)
    result = run(root, capsys, governor="schedutil", thp_enabled="never")
    assert result["failed"] and "offers the governors performance, powersave, not schedutil" in result["msg"]
    assert snapshot(root) == firmware and not (root / "var").exists() and not (root / "etc").exists()
    result = run(root, capsys, cstate_max_latency_us=-5)
    assert result["failed"] and "out of range" in result["msg"]


def test_a_damaged_record_is_refused(tmp_path, capsys):
    root = host_tree(tmp_path / "host")
    (root / "var/lib/gpufleet").mkdir(parents=True)
    (root / "var/lib/gpufleet/cpu_tuning.json").write_text("")
    result = run(root, capsys, state="absent")
    assert result["failed"] and "is empty" in result["msg"] and result["changed"] is False


@needs_systemctl
def test_persist_false_keeps_no_boot_unit(tmp_path, capsys):
    root = host_tree(tmp_path / "host")
    result = run(root, capsys, governor="performance", persist=False)
    assert result["changed"] and result["persisted"] == {} and not (root / boot.UNIT_PATH.lstrip("/")).exists()


# ---- the C-state limit through the PM QoS holder --------------------------------------------------
def holder_files(root: Path) -> dict[str, bool]:
    return {p: (root / p.lstrip("/")).exists() or (root / p.lstrip("/")).is_symlink()
            for p in (pm_qos.HOLD_SCRIPT, pm_qos.UNIT_PATH, pm_qos.UNIT_WANTS)}


@needs_systemctl
def test_the_pm_qos_holder_is_installed_enabled_read_back_and_removed(tmp_path, capsys):
    root = host_tree(tmp_path / "host")
    FakeHost(root).write(pm_qos.DEVICE, "")
    (root / pm_qos.DEVICE.lstrip("/")).write_bytes(pm_qos.encode(pm_qos.NO_LIMIT_US))
    firmware = snapshot(root)
    args = {"cstate_max_latency_us": 99, "cstate_method": "pm_qos"}
    check = run(root, capsys, _ansible_check_mode=True, _ansible_diff=True, **args)
    assert [a["action"] for a in check["actions"]] == ["create", "create", "enable_unit"]
    assert check["after"]["pm_qos"]["holds_us"] == 99 and not any(holder_files(root).values())
    assert check["before"]["pm_qos"] == {"installed": False, "enabled": False, "active": None, "holds_us": None,
                                         "in_force_us": pm_qos.NO_LIMIT_US}

    done = run(root, capsys, **args)
    assert not done.get("failed"), done["msg"]
    assert done["changed"] and all(holder_files(root).values()) and snapshot(root) == firmware  # no cpuidle file
    assert done["after"]["pm_qos"] == {"installed": True, "enabled": True, "active": None, "holds_us": 99,
                                       "in_force_us": pm_qos.NO_LIMIT_US}  # a tree: nothing started, nothing held
    assert done["persisted"] == {} and not (root / boot.UNIT_PATH.lstrip("/")).exists()  # the holder is its own boot
    assert f"ExecStart={pm_qos.HOLD_SCRIPT} 99" in (root / pm_qos.UNIT_PATH.lstrip("/")).read_text()
    assert (root / pm_qos.HOLD_SCRIPT.lstrip("/")).stat().st_mode & 0o777 == 0o755
    assert run(root, capsys, **args)["changed"] is False  # idempotent
    moved = run(root, capsys, cstate_max_latency_us=20, cstate_method="pm_qos")
    assert moved["changed"] and moved["after"]["pm_qos"]["holds_us"] == 20

    gone = run(root, capsys, state="absent", restore=["cstate"])
    assert gone["changed"] and not any(holder_files(root).values()) and snapshot(root) == firmware
    assert {a["action"] for a in gone["actions"]} == {"disable_unit", "remove"}
    assert run(root, capsys, state="absent", restore=["cstate"])["changed"] is False


@needs_systemctl
def test_the_two_c_state_methods_replace_each_other(tmp_path, capsys):
    root = host_tree(tmp_path / "host")
    FakeHost(root).write(pm_qos.DEVICE, "")
    firmware = snapshot(root)
    run(root, capsys, cstate_max_latency_us=5)  # cpuidle: C1E and C6 disabled, recorded, kept for the boot
    assert (root / C6.format(0)).read_text() == "1" and not any(holder_files(root).values())

    held = run(root, capsys, cstate_max_latency_us=5, cstate_method="pm_qos")
    assert snapshot(root) == firmware and all(holder_files(root).values())  # the states put back, the holder in
    assert held["originals"] == {} and held["after"]["cstates_disabled"]["cpu0"] == []
    assert not (root / boot.UNIT_PATH.lstrip("/")).exists()  # nothing left for the boot unit to re-apply

    back = run(root, capsys, cstate_max_latency_us=5)
    assert (root / C6.format(3)).read_text() == "1" and not any(holder_files(root).values())
    assert "remove" in {a["action"] for a in back["actions"]} and back["after"]["pm_qos"]["installed"] is False
    run(root, capsys, state="absent")
    assert snapshot(root) == firmware and not any(holder_files(root).values())


@needs_systemctl
def test_without_the_device_the_holder_is_skipped_with_the_reason(tmp_path, capsys):
    root = host_tree(tmp_path / "host")
    result = run(root, capsys, cstate_max_latency_us=99, cstate_method="pm_qos", governor="performance")
    assert "/dev/cpu_dma_latency does not exist" in result["unavailable"]["cstate"]
    assert not any(holder_files(root).values()) and result["persisted"] == {"governor": "performance"}
    assert result["after"]["cstates_disabled"]["cpu0"] == []  # and the cpuidle method was not used instead


# ---- cpu_placement --------------------------------------------------------------------------------
def placement_host(root: Path) -> Path:
    """Two nodes: GPU 17:00.0 on node 0 (CPUs 0-7), 97:00.0 on node 1 (8-15); irq_affinity pinned 17:00.0's IRQs."""
    host = two_numa_nodes(root, remote_irqs=False)
    cpus_online(host, "0-15")
    irqs = sorted(os.listdir(root / "sys/bus/pci/devices/0000:17:00.0/msi_irqs"), key=int)
    for irq, cpu in zip(irqs, (0, 1, 0, 1)):
        host.write(f"/proc/irq/{irq}/smp_affinity_list", str(cpu))
    host.write("/etc/gpufleet/irq_affinity.json", json.dumps({"devices": {"0000:17:00.0": {"cpus": "0-1"}}}))
    return root


def test_placement_on_the_gpu_node_away_from_irq_cpus_check_mode_and_revert(tmp_path, capsys):
    root = placement_host(tmp_path / "host")
    args = {"root": str(root), "gpus": ["17:00.0"], "unit": "vllm.service"}
    check = run_module(cpu_placement, dict(args, _ansible_check_mode=True, _ansible_diff=True), capsys)
    assert check["changed"] and not (root / "etc/systemd").exists()
    assert check["unit_settings"] == {"CPUAffinity": "2-7", "NUMAPolicy": "preferred", "NUMAMask": "0"}
    assert check["irq_cpus"] == "0-1" and check["gpus"] == {"0000:17:00.0": 0} and check["irq_devices"] == ["0000:17:00.0"]
    assert "CPUAffinity=2-7" in check["diff"][0]["after"]
    done = run_module(cpu_placement, args, capsys)
    text = (root / dropin_path("vllm.service").lstrip("/")).read_text()
    assert "[Service]\nCPUAffinity=2-7\nNUMAPolicy=preferred\nNUMAMask=0\n" in text and done["restart_needed"]
    assert run_module(cpu_placement, args, capsys)["changed"] is False
    gone = run_module(cpu_placement, dict(args, state="absent"), capsys)
    assert gone["changed"] and not (root / dropin_path("vllm.service").lstrip("/")).exists()


def test_placement_refusals(tmp_path, capsys):
    root = placement_host(tmp_path / "host")
    both = run_module(cpu_placement, {"root": str(root)}, capsys)
    assert both["failed"] and "preferred takes one node" in both["msg"]
    spread = run_module(cpu_placement, {"root": str(root), "numa_policy": "interleave"}, capsys)
    assert spread["unit_settings"] == {"CPUAffinity": "2-15", "NUMAPolicy": "interleave", "NUMAMask": "0-1"}
    (root / "proc/irq").mkdir(exist_ok=True)
    for irq in os.listdir(root / "sys/bus/pci/devices/0000:17:00.0/msi_irqs"):
        (root / f"proc/irq/{irq}/smp_affinity_list").write_text("0-7")
    none_left = run_module(cpu_placement, {"root": str(root), "gpus": ["0000:17:00.0"]}, capsys)
    assert none_left["failed"] and "none is left for vLLM" in none_left["msg"]
    kept = run_module(cpu_placement, {"root": str(root), "gpus": ["0000:17:00.0"], "exclude_irq_cpus": False}, capsys)
    assert kept["cpus"] == "0-7"
    bad = run_module(cpu_placement, {"root": str(root), "unit": "vllm; rm -rf /"}, capsys)
    assert bad["failed"] and "not a systemd service name" in bad["msg"]
    missing = run_module(cpu_placement, {"root": str(root), "gpus": ["0000:55:00.0"]}, capsys)
    assert missing["failed"] and "0000:55:00.0 not found" in missing["msg"]


def test_placement_of_a_gpu_without_numa_node(tmp_path, capsys):
    """A VM's device reports numa_node -1: the host's one node is used; on two nodes the module asks for nodes."""
    root = placement_host(tmp_path / "host")
    (root / "sys/bus/pci/devices/0000:17:00.0/numa_node").write_text("-1\n")
    result = run_module(cpu_placement, {"root": str(root), "gpus": ["0000:17:00.0"]}, capsys)
    assert result["failed"] and "report no NUMA node" in result["msg"]
    given = run_module(cpu_placement, {"root": str(root), "gpus": ["0000:17:00.0"], "nodes": [1]}, capsys)
    assert given["cpus"] == "8-15" and given["gpus"] == {"0000:17:00.0": None}

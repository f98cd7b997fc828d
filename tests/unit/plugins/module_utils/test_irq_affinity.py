# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""irq_affinity module_utils: vector spreading, NUMA mapping, CPU list checks, plans, writes with read-back and
rollback, waiting for vectors, irqbalance's environment file and the policy script (run for real with sh)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.irq import affinity as ia
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import PciWalker
from tests.unit.fakesysfs import DEBIAN_IRQBALANCE, FakeHost, SimKernel, cpus_online, two_numa_nodes

G0, G1 = "0000:17:00.0", "0000:97:00.0"  # node 0 (CPUs 0-7) and node 1 (CPUs 8-15), 4 vectors each


def numa_host(root, **kw) -> FakeHost:
    host = two_numa_nodes(root, **kw)
    cpus_online(host, "0-15")
    return host


def walker_for(host) -> PciWalker:
    return PciWalker(HostFS(str(host.root)))


def settings(**kw):
    return dict(ia.DEFAULTS, **kw)


# ---- spreading ---------------------------------------------------------------------------------------------
def test_spread_round_robin_one_vector_per_cpu():
    assert ia.spread([7, 5, 6, 8, 9], [2, 3, 4]) == {5: [2], 6: [3], 7: [4], 8: [2], 9: [3]}
    assert ia.spread([5, 6], [2, 3, 4], offset=2) == {5: [4], 6: [2]}
    assert ia.spread([5, 6], [2, 3], policy="node") == {5: [2, 3], 6: [2, 3]}
    assert ia.spread([5], []) == {}


def test_offsets_space_functions_sharing_cpus_evenly():
    eight = list(range(8))
    assert ia.offsets({"d": eight, "b": eight, "c": eight, "a": eight}) == {"a": 0, "b": 2, "c": 4, "d": 6}
    assert ia.offsets({"a": eight, "b": [8, 9]}) == {"a": 0, "b": 0}
    assert ia.offsets({"a": [0, 1], "b": [0, 1], "c": [0, 1]}) == {"a": 0, "b": 0, "c": 1}


@pytest.mark.parametrize("mask, cpus", [("ff", list(range(8))), ("00000001,00000002", [1, 32]), ("0", []), ("", [])])
def test_parse_cpumask(mask, cpus):
    assert ia.parse_cpumask(mask) == cpus


def test_cpu_option_checks_the_machine():
    online = list(range(16))
    assert ia.parse_cpu_option("", online, "cpus") is None
    assert ia.parse_cpu_option("0-3,8", online, "cpus") == [0, 1, 2, 3, 8]
    with pytest.raises(ia.IrqError, match=r"cpus: '8-31' names CPUs 16-31 that are not online on this host \(online CPUs: 0-15\)"):
        ia.parse_cpu_option("8-31", online, "cpus")
    with pytest.raises(ia.IrqError, match="housekeeping_cpus: 'all' is not a CPU list"):
        ia.parse_cpu_option("all", online, "housekeeping_cpus")


# ---- NUMA mapping ---------------------------------------------------------------------------------------------
def test_each_function_gets_its_own_nodes_cpus(tmp_path):
    walker = walker_for(numa_host(tmp_path))
    resolved, warnings = ia.resolve_cpus(walker, {G0: settings(), G1: settings()})
    assert warnings == []
    assert (resolved[G0]["numa_node"], resolved[G0]["cpus"]) == (0, list(range(8)))
    assert (resolved[G1]["numa_node"], resolved[G1]["cpus"]) == (1, list(range(8, 16)))


def test_allow_list_and_housekeeping(tmp_path):
    walker = walker_for(numa_host(tmp_path))
    resolved, _w = ia.resolve_cpus(walker, {G0: settings(cpus="0-3,12-15", housekeeping_cpus="0"),
                                            G1: settings(cpus="0-3,12-15", housekeeping_cpus="0")})
    assert resolved[G0]["cpus"] == [1, 2, 3] and resolved[G1]["cpus"] == [12, 13, 14, 15]


def test_allow_list_without_local_cpu_needs_allow_remote(tmp_path):
    walker = walker_for(numa_host(tmp_path))
    with pytest.raises(ia.IrqError, match=r"cpus: 0-3 has no CPU on NUMA node 1 of 0000:97:00.0 \(its CPUs: 8-15\).*allow_remote"):
        ia.resolve_cpus(walker, {G1: settings(cpus="0-3")})
    resolved, _w = ia.resolve_cpus(walker, {G1: settings(cpus="0-3", allow_remote=True)})
    assert resolved[G1]["cpus"] == [0, 1, 2, 3] and resolved[G1]["remote"] is True


def test_housekeeping_taking_every_cpu_is_refused(tmp_path):
    walker = walker_for(numa_host(tmp_path))
    with pytest.raises(ia.IrqError, match=r"No CPU is left for the interrupts of 0000:17:00.0: NUMA node 0 has CPUs 0-7.*housekeeping_cpus takes 0-7"):
        ia.resolve_cpus(walker, {G0: settings(housekeeping_cpus="0-7")})


def test_unknown_numa_node(tmp_path):
    host = numa_host(tmp_path)
    host.write(f"{host.dirs[G1]}/numa_node", "-1")
    host.write(f"{host.dirs[G1]}/local_cpulist", "0-15")
    resolved, warnings = ia.resolve_cpus(walker_for(host), {G1: settings()})
    assert resolved[G1]["numa_node"] is None and resolved[G1]["cpus"] == list(range(16))
    assert "reports NUMA node -1" in warnings[0] and "Set numa_node" in warnings[0]
    resolved, warnings = ia.resolve_cpus(walker_for(host), {G1: settings(numa_node=1)})
    assert resolved[G1]["cpus"] == list(range(8, 16)) and warnings == []
    with pytest.raises(ia.IrqError, match=r"numa_node: 3 is not a NUMA node of this host \(nodes: 0, 1\)"):
        ia.resolve_cpus(walker_for(host), {G1: settings(numa_node=3)})


def test_single_node_host_with_unknown_node_uses_node_0(tmp_path):
    host = FakeHost(tmp_path, nodes={0: "0-3"})
    host.add("0000:00:01.0", host.host_bridge(), kind="root_port")
    host.gpu("0000:01:00.0", "0000:00:01.0", numa_node=-1)
    cpus_online(host, "0-3")
    resolved, warnings = ia.resolve_cpus(walker_for(host), {"0000:01:00.0": settings()})
    assert (resolved["0000:01:00.0"]["numa_node"], resolved["0000:01:00.0"]["cpus"], warnings) == (0, [0, 1, 2, 3], [])


def test_configured_functions_that_are_gone_are_skipped_not_fatal(tmp_path):
    walker = walker_for(numa_host(tmp_path))
    resolved, warnings = ia.resolve_cpus(walker, {G0: settings(), "0000:5e:00.0": settings()}, strict={G0})
    assert list(resolved) == [G0] and "0000:5e:00.0 (configured earlier) skipped" in warnings[0]
    with pytest.raises(ia.IrqError, match="0000:5e:00.0 is not on this host"):
        ia.resolve_cpus(walker, {"0000:5e:00.0": settings()})


# ---- plans ------------------------------------------------------------------------------------------------------
def test_plan_reports_remote_vectors_and_what_changes(tmp_path):
    walker = walker_for(numa_host(tmp_path, remote_irqs=True))  # node-1 GPU's vectors served on CPU 0
    resolved, _w = ia.resolve_cpus(walker, {G0: settings(), G1: settings()})
    entries, warnings = ia.plan(walker, resolved, [G0, G1])
    assert warnings == []
    g1 = [e for e in entries if e["bdf"] == G1]
    assert [(e["irq"], e["before"], e["wanted"], e["remote_before"], e["status"]) for e in g1] == [
        (104, "8-15", "8", True, "change"), (105, "8-15", "9", True, "change"),
        (106, "8-15", "10", True, "change"), (107, "8-15", "11", True, "change")]
    assert all(e["remote_before"] is False for e in entries if e["bdf"] == G0)


def test_plan_skips_known_managed_vectors_of_the_same_driver(tmp_path):
    walker = walker_for(numa_host(tmp_path))
    resolved, _w = ia.resolve_cpus(walker, {G0: settings()})
    cache = {G0: {"driver": "nvidia", "irqs": [101, 102]}}
    entries, _w = ia.plan(walker, resolved, [G0], known_managed=cache)
    assert [e["status"] for e in entries] == ["change", "managed", "managed", "change"]
    other_driver = {G0: {"driver": "vfio-pci", "irqs": [101, 102]}}
    assert [e["status"] for e in ia.plan(walker, resolved, [G0], known_managed=other_driver)[0]] == ["change"] * 4


def test_plan_no_irqs_is_an_error_unless_allowed(tmp_path):
    host = numa_host(tmp_path)
    host.add("0000:16:02.0", "pci0000:16", kind="root_port")
    host.gpu("0000:18:00.0", "0000:16:02.0", msix=0)
    walker = walker_for(host)
    resolved, _w = ia.resolve_cpus(walker, {"0000:18:00.0": settings()})
    with pytest.raises(ia.IrqError, match=r"0000:18:00.0 has no MSI/MSI-X vectors .*driver: nvidia.*nvidia-persistenced.*allow_no_irqs"):
        ia.plan(walker, resolved, ["0000:18:00.0"])
    entries, warnings = ia.plan(walker, resolved, ["0000:18:00.0"], allow_no_irqs=True)
    assert entries == [] and "re-apply unit pins them when they appear" in warnings[0]


def test_plan_absent_goes_back_to_the_default_affinity(tmp_path):
    host = numa_host(tmp_path)
    host.write("/proc/irq/default_smp_affinity", "00ff")
    host.write("/proc/irq/100/smp_affinity_list", "3")
    walker = walker_for(host)
    resolved, _w = ia.resolve_cpus(walker, {G0: settings()})
    entries, _w = ia.plan(walker, resolved, [G0], state="absent")
    assert [(e["irq"], e["wanted"], e["status"]) for e in entries] == [
        (100, "0-7", "change"), (101, "0-7", "ok"), (102, "0-7", "ok"), (103, "0-7", "ok")]


# ---- writes ---------------------------------------------------------------------------------------------------------
def test_apply_writes_reads_back_and_leaves_managed_vectors(tmp_path):
    host = numa_host(tmp_path)
    sim = SimKernel(host, managed_irqs={101, 102})
    walker = PciWalker(sim.fs())
    resolved, _w = ia.resolve_cpus(walker, {G0: settings()})
    entries, _w = ia.plan(walker, resolved, [G0])
    ia.apply(sim.fs(), entries)
    assert [(e["irq"], e["status"], e["after"], e["managed"]) for e in entries] == [
        (100, "changed", "0", False), (101, "managed", "0-7", True), (102, "managed", "0-7", True), (103, "changed", "3", False)]
    assert host.real("/proc/irq/103/smp_affinity_list").read_text().strip() == "3"
    assert host.real("/proc/irq/103/effective_affinity_list").read_text().strip() == "3"
    cache = ia.managed_cache_after({}, walker, entries)
    assert cache == {G0: {"driver": "nvidia", "irqs": [101, 102]}}


def test_apply_failure_rolls_back_what_it_changed(tmp_path):
    host = numa_host(tmp_path)
    sim = SimKernel(host, online="0-6")  # CPU 7 went offline after planning
    walker = PciWalker(sim.fs())
    resolved, _w = ia.resolve_cpus(walker, {G0: settings()}, online=list(range(8)))
    entries, _w = ia.plan(walker, resolved, [G0])
    entries[3]["wanted"] = "7"
    with pytest.raises(ia.IrqError) as err:
        ia.apply(sim.fs(), entries)
    assert str(err.value).startswith("Failed to pin IRQ 103 of 0000:17:00.0 to CPUs 7: writing /proc/irq/103/smp_affinity_list "
                                     "gave 'Invalid argument' (the CPUs are not usable")
    assert "IRQs 100, 101, 102 were put back as they were." in str(err.value)
    assert [host.real(f"/proc/irq/{n}/smp_affinity_list").read_text().strip() for n in (100, 101, 102)] == ["0-7"] * 3


def test_apply_fails_when_the_value_does_not_read_back(tmp_path):
    host = numa_host(tmp_path)

    class Stubborn(HostFS):
        def write_text(self, host_path, data):  # the kernel keeps its own mask
            if not host_path.endswith("/smp_affinity_list"):
                super().write_text(host_path, data)
    fs = Stubborn(str(host.root))
    walker = PciWalker(fs)
    resolved, _w = ia.resolve_cpus(walker, {G0: settings()})
    entries, _w = ia.plan(walker, resolved, [G0])
    with pytest.raises(ia.IrqError, match=r"IRQ 100 of 0000:17:00.0 reads back '0-7' after writing '0' .*did not take the affinity. "
                                          r"Nothing had been changed."):
        ia.apply(fs, entries)


def test_report_marks_remote_after():
    entries = [{"irq": 1, "bdf": "b", "mode": "msix", "numa_node": 1, "before": "0", "effective_before": "0", "wanted": "0",
                "after": "0", "remote_before": True, "managed": False, "status": "changed"}]
    assert ia.report(entries, {"b": {"local_cpus": [8, 9]}})[0]["remote_after"] is True
    assert ia.report(entries, {"b": {"local_cpus": [0, 1]}})[0]["remote_after"] is False


# ---- waiting for vectors --------------------------------------------------------------------------------------------
def test_wait_for_irqs_returns_once_the_set_settles(tmp_path):
    host = numa_host(tmp_path)
    walker = walker_for(host)
    now = [0.0]
    steps = []

    def sleep(dt):
        now[0] += dt
        steps.append(now[0])
        if len(steps) == 3:  # the driver adds a vector while we wait
            host.write(f"{host.dirs[G0]}/msi_irqs/150", "msix")
    irqs = ia.wait_for_irqs(walker, G0, timeout=30, settle=1.0, clock=lambda: now[0], sleep=sleep)
    assert irqs == [100, 101, 102, 103, 150]
    assert 1.0 <= now[0] - 0.6 < 2.0  # settled one second after the last change at 0.6 s


def test_wait_for_irqs_gives_up_at_the_deadline(tmp_path):
    host = numa_host(tmp_path)
    host.add("0000:16:02.0", "pci0000:16", kind="root_port")
    host.gpu("0000:18:00.0", "0000:16:02.0", msix=0)
    now = [0.0]

    def sleep(dt):
        now[0] += dt
    assert ia.wait_for_irqs(walker_for(host), "0000:18:00.0", timeout=2, clock=lambda: now[0], sleep=sleep) == []
    assert 2.0 <= now[0] < 2.3


# ---- configuration files ------------------------------------------------------------------------------------------
def test_merge_config_and_pinned_round_trip():
    cfg = ia.merge_config({}, {G0: {"cpus": "0-3"}}, "present", exclusive=False)
    assert cfg == {"version": 1, "devices": {G0: dict(ia.DEFAULTS, cpus="0-3")}}
    cfg = ia.merge_config(cfg, {G1: {}}, "present", exclusive=False)
    assert list(cfg["devices"]) == [G0, G1]
    assert list(ia.merge_config(cfg, {G1: {}}, "present", exclusive=True)["devices"]) == [G1]
    assert list(ia.merge_config(cfg, {G0: {}}, "absent", exclusive=False)["devices"]) == [G1]
    pinned = {G1: "8-15", G0: "0-7"}
    assert ia.parse_pinned(ia.render_pinned(pinned)) == pinned


def test_irqbalance_policyscript_is_added_and_removed_cleanly():
    once = ia.irqbalance_config_text(DEBIAN_IRQBALANCE, "policyscript", {G0: "0-7"})
    assert once.startswith(DEBIAN_IRQBALANCE)  # the packaged comments stay
    assert once.endswith(f'\nIRQBALANCE_ARGS="--policyscript={ia.POLICY_SCRIPT}"\n')
    assert ia.irqbalance_config_text(once, "policyscript", {G0: "0-7"}) == once  # idempotent
    assert ia.irqbalance_config_text(once, "policyscript", {}) == DEBIAN_IRQBALANCE + "\n"
    assert ia.irqbalance_config_text(once, "none", {G0: "0-7"}) == DEBIAN_IRQBALANCE + "\n"


def test_irqbalance_args_of_the_admin_are_kept():
    text = 'IRQBALANCE_ONESHOT=\nIRQBALANCE_ARGS="--hintpolicy=ignore -j"\n'
    with_ours = ia.irqbalance_config_text(text, "policyscript", {G0: "0-7"})
    assert ia.get_var(with_ours, "IRQBALANCE_ARGS") == f"--hintpolicy=ignore -j --policyscript={ia.POLICY_SCRIPT}"
    assert ia.irqbalance_config_text(with_ours, "policyscript", {}) == 'IRQBALANCE_ONESHOT=\nIRQBALANCE_ARGS="--hintpolicy=ignore -j"\n'


@pytest.mark.parametrize("args", ['"--policyscript=/opt/site/policy"', '"-l /opt/site/policy"', "--policyscript /opt/site/policy"])
def test_someone_elses_policyscript_is_a_conflict(args):
    with pytest.raises(ia.IrqError, match="IRQBALANCE_ARGS already names the policy script /opt/site/policy"):
        ia.irqbalance_config_text(f"IRQBALANCE_ARGS={args}\n", "policyscript", {G0: "0-7"})


def test_irqbalance_banned_cpus_owns_one_marked_line():
    text = ia.irqbalance_config_text(DEBIAN_IRQBALANCE, "banned_cpus", {G0: "0-3", G1: "8,9"})
    assert text.endswith(f'{ia.MARKER}\nIRQBALANCE_BANNED_CPULIST="0-3,8-9"\n')
    assert "#IRQBALANCE_BANNED_CPULIST=" in text  # the commented template line stays
    assert ia.irqbalance_config_text(text, "banned_cpus", {G0: "0-3", G1: "8,9"}) == text
    assert ia.irqbalance_config_text(text, "banned_cpus", {G0: "0-3"}).endswith('IRQBALANCE_BANNED_CPULIST="0-3"\n')
    assert ia.irqbalance_config_text(text, "policyscript", {}) == DEBIAN_IRQBALANCE + "\n"
    with pytest.raises(ia.IrqError, match="IRQBALANCE_BANNED_CPULIST is already set to '2-3' by someone else"):
        ia.irqbalance_config_text('IRQBALANCE_BANNED_CPULIST="2-3"\n', "banned_cpus", {G0: "0-3"})


def test_set_var_replaces_the_last_assignment_only():
    text = "A=1\n#B=x\nB=2\nB=3\n"
    assert ia.set_var(text, "B", "4") == 'A=1\n#B=x\nB="4"\n'
    assert ia.set_var(text, "B", None) == "A=1\n#B=x\n"
    assert ia.set_var("", "B", "1", marker="# m") == '# m\nB="1"\n'
    assert ia.get_var('B="a b"\n', "B") == "a b" and ia.get_var("#B=1\n", "B") is None


# ---- the policy script, run by a real shell -------------------------------------------------------------------------
@pytest.mark.skipif(not shutil.which("sh"), reason="needs a POSIX shell")
def test_policy_script_bans_pinned_functions_by_device_path(tmp_path):
    pinned = tmp_path / "irq_affinity.pinned"
    script = tmp_path / "policy"
    script.write_text(ia.render_policy_script(str(pinned)))
    script.chmod(0o755)

    def ask(devpath, irq="120"):
        proc = subprocess.run([str(script), devpath, irq], capture_output=True, text=True, check=False)
        return proc.returncode, proc.stdout
    assert ask(f"/sys/devices/pci0000:16/0000:16:01.0/{G0}") == (0, "")  # no list yet
    pinned.write_text(ia.render_pinned({G0: "0-7", G1: "8-15"}))
    assert ask(f"/sys/devices/pci0000:16/0000:16:01.0/{G0}") == (0, "ban=true\n")
    assert ask(f"/sys/bus/pci/devices/{G1}", "77") == (0, "ban=true\n")
    assert ask("/sys/devices/pci0000:00/0000:00:1f.0") == (0, "")
    assert ask("/sys") == (0, "")  # legacy IRQs without a device


def test_irqbalance_state_finds_binary_and_config(tmp_path):
    fs = HostFS(str(tmp_path))
    assert ia.irqbalance_state(fs) == {"present": False, "binary": None, "config": "/etc/default/irqbalance"}
    fs.write_atomic("/usr/sbin/irqbalance", "")
    fs.write_atomic("/etc/sysconfig/irqbalance", "")
    assert ia.irqbalance_state(fs) == {"present": True, "binary": "/usr/sbin/irqbalance", "config": "/etc/sysconfig/irqbalance"}


def test_hostfs_error_keeps_errno():
    err = HostFSError("write", "/proc/irq/1/smp_affinity_list", OSError(5, "Input/output error"))
    assert err.errno == 5

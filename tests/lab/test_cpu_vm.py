"""The CPU stages (issue 35) on a lab VM, each checked over SSH: the cpu_tuning role applied, the boot unit proven by
a reboot, and everything reverted to the values the VM booted with (proven by another reboot).

What the VM has decides what is checked: THP exists in the Debian cloud kernel, so it is set, read back, kept across
the reboot by gpufleet-cpu-tuning.service and restored. The governor and the C-state limit are asked for too; under
QEMU TCG there is no cpufreq driver and usually no cpuidle driver, and then the test checks the clear skip (the
warning names the reason, nothing is written under /sys/devices/system/cpu, nothing is kept for the boot); where the
VM has them, they are checked like THP. The vLLM placement runs against a stand-in ``vllm.service`` (a sleep): the
functions in irq_affinity's configuration (nic1, its vectors pinned to CPU 0) take CPU 0 away, so the unit gets
CPUAffinity=1, and the test reads the running process's Cpus_allowed_list; the revert gives it both CPUs again.
Then the C-state limit through the PM QoS holder (cstate_method pm_qos): /dev/cpu_dma_latency read over SSH gives the
limit while the holder runs, again after a reboot, and the kernel's default once it is removed.

The module boots its own single VM (``lab up 1``) and powers it off at its end, like test_measured_vm:

    . scripts/lib.sh; gpufleet_env
    flock /work/lab.lock env GPUFLEET_LAB_BASE_PORT=2621 python -m pytest -m e2e -x -v tests/lab/test_cpu_vm.py
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.lab.labutil import (INVENTORY_DIR, LAB_DIR, REPO, ansible_env, boot_id, lab_ssh, one_vm, play_recap,
                               record_figure, run)

# e2e: about 15-20 min under TCG (a boot, three reboots, seven role runs); opt-in
pytestmark = [pytest.mark.vmlab, pytest.mark.e2e]

VM = "lab1"
WORK = LAB_DIR / "cpu_vm"
NIC1 = "0000:07:00.0"
STANDIN_UNIT = """[Unit]
Description=gpufleet lab: a stand-in for vllm.service (tests/lab/test_cpu_vm.py)

[Service]
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""
PLAYBOOK = """\
- name: The CPU stages on the lab VM
  hosts: lab1
  become: true
  gather_facts: false
  roles:
    - role: gpufleet.inference.cpu_tuning
"""
LIVE = r"""
cpu=/sys/devices/system/cpu
echo "thp_enabled=$(cat /sys/kernel/mm/transparent_hugepage/enabled)"
echo "thp_defrag=$(cat /sys/kernel/mm/transparent_hugepage/defrag)"
echo "policies=$(ls $cpu/cpufreq 2>/dev/null | grep -c '^policy')"
echo "governors=$(cat $cpu/cpufreq/policy*/scaling_governor 2>/dev/null | tr '\n' ' ')"
echo "idle_driver=$(cat $cpu/cpuidle/current_driver 2>/dev/null || echo none)"
echo "idle_states=$(ls -d $cpu/cpu*/cpuidle/state* 2>/dev/null | wc -l)"
echo "idle_disabled=$(cat $cpu/cpu*/cpuidle/state*/disable 2>/dev/null | tr '\n' ' ')"
echo "unit=$(systemctl is-enabled gpufleet-cpu-tuning.service 2>/dev/null || true)"
echo "unit_active=$(systemctl is-active gpufleet-cpu-tuning.service 2>/dev/null || true)"
echo "files=$(ls /etc/gpufleet/cpu_tuning.json /usr/local/libexec/gpufleet-cpu-tuning-apply \
    /var/lib/gpufleet/cpu_tuning.json /etc/systemd/system/vllm.service.d/50-gpufleet-cpu-placement.conf 2>/dev/null | tr '\n' ' ')"
pid=$(systemctl show -p MainPID --value vllm.service)
echo "vllm_cpus=$(grep Cpus_allowed_list /proc/$pid/status 2>/dev/null | awk '{print $2}')"
echo "vllm_affinity=$(systemctl show -p CPUAffinity --value vllm.service)"
echo "boot_id=$(cat /proc/sys/kernel/random/boot_id)"
"""


def live() -> dict:
    out = lab_ssh(VM, "bash -s", stdin=LIVE)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def word(text: str) -> str:
    m = re.search(r"\[([\w+]+)\]", text)
    return m.group(1) if m else text.strip()


def role(extra: dict, timeout: int = 1800):
    env = ansible_env()
    r = run([REPO / ".venv" / "bin" / "ansible-playbook", "-i", INVENTORY_DIR, str(WORK / "cpu.yml"), "--limit", VM,
             "-e", json.dumps(extra)], timeout=timeout, env=env)
    assert r.returncode == 0, f"cpu_tuning role failed (rc {r.returncode}):\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
    recap = play_recap(r.stdout).get(VM, {})
    assert recap.get("failed", 1) == 0 and recap.get("unreachable", 1) == 0, recap
    return r.stdout + r.stderr, recap  # the modules' warnings (a knob's skip) are on stderr


def reboot() -> float:
    """Reboot the VM through Ansible (it waits for SSH and checks the boot id); the seconds it took."""
    before = boot_id(VM)
    t0 = time.time()
    r = run([REPO / ".venv" / "bin" / "ansible", VM, "-i", INVENTORY_DIR, "-b", "-m", "ansible.builtin.reboot",
             "-a", "reboot_timeout=900"], timeout=1200, env=ansible_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert boot_id(VM) != before
    return time.time() - t0


def other(current: str, words: list[str]) -> str:
    return next(w for w in words if w != current)


@pytest.fixture(scope="module")
def vm():
    """lab1 alone, booted for this module and powered off at its end."""
    with one_vm(WORK) as lab:
        (WORK / "cpu.yml").write_text(PLAYBOOK)
        record_figure(WORK / "figures.jsonl", "cpu_vm", up_s=lab["up_s"])
        lab_ssh(VM, "cat > /etc/systemd/system/vllm.service && systemctl daemon-reload && systemctl enable --now vllm.service",
                stdin=STANDIN_UNIT)
        # what irq_affinity would have pinned: nic1's vectors on CPU 0, named in its configuration (irqbalance stopped
        # for this boot, so that it does not move them while the placement is decided)
        lab_ssh(VM, "systemctl stop irqbalance 2>/dev/null || true")
        lab_ssh(VM, f"mkdir -p /etc/gpufleet && echo '{{\"devices\": {{\"{NIC1}\": {{\"cpus\": \"0\"}}}}}}' > /etc/gpufleet/irq_affinity.json"
                    f" && for i in $(ls /sys/bus/pci/devices/{NIC1}/msi_irqs); do echo 0 > /proc/irq/$i/smp_affinity_list; done")
        yield VM


def test_cpu_stages_apply_survive_a_reboot_and_revert_exactly(vm):
    booted = live()
    thp = {"thp_enabled": word(booted["thp_enabled"]), "thp_defrag": word(booted["thp_defrag"])}
    want = {"thp_enabled": other(thp["thp_enabled"], ["never", "madvise"]),
            "thp_defrag": other(thp["thp_defrag"], ["never", "defer+madvise"])}
    has_cpufreq, has_cpuidle = int(booted["policies"]) > 0, booted["idle_driver"] != "none" and int(booted["idle_states"]) > 0
    shown = ("thp_enabled", "thp_defrag", "policies", "idle_driver", "idle_states")
    record_figure(WORK / "figures.jsonl", "cpu_vm", booted={k: booted[k] for k in shown})
    extra = {"cpu_tuning_governor": "performance", "cpu_tuning_cstate_max_latency_us": 0,
             "cpu_tuning_thp_enabled": want["thp_enabled"], "cpu_tuning_thp_defrag": want["thp_defrag"],
             "cpu_tuning_vllm_placement": "present", "cpu_tuning_vllm_gpus": ["0000:01:00.0"]}

    out, recap = role(extra)
    now = live()
    assert word(now["thp_enabled"]) == want["thp_enabled"] and word(now["thp_defrag"]) == want["thp_defrag"], now
    if has_cpufreq:
        assert set(now["governors"].split()) == {"performance"}, now
    else:
        assert "governor skipped: no cpufreq policy" in out, out[-4000:]
    if has_cpuidle:
        assert "1" in now["idle_disabled"].split(), now
    else:
        assert "cstate skipped: no cpuidle states" in out, out[-4000:]
        assert now["idle_disabled"] == booted["idle_disabled"]
    assert now["unit"] == "enabled" and "/etc/gpufleet/cpu_tuning.json" in now["files"], now
    kept = json.loads(lab_ssh(VM, "cat /etc/gpufleet/cpu_tuning.json"))["settings"]
    assert ("governor" in kept) == has_cpufreq and ("cstate_max_latency_us" in kept) == has_cpuidle, kept
    assert now["vllm_cpus"] == "1" and now["vllm_affinity"] == "1", now  # CPU 0 serves nic1's pinned vectors
    _out, again = role(extra)
    assert again.get("changed") == 0, again

    took = reboot()
    after = live()
    assert after["unit_active"] == "active", after
    assert word(after["thp_enabled"]) == want["thp_enabled"] and word(after["thp_defrag"]) == want["thp_defrag"], after
    assert after["vllm_cpus"] == "1", after  # the drop-in holds at boot
    journal = lab_ssh(VM, "journalctl -b -u gpufleet-cpu-tuning.service --no-pager -o cat")
    assert "0 failed" in journal, journal
    record_figure(WORK / "figures.jsonl", "cpu_vm", reboot_s=round(took), journal=journal.strip().splitlines()[-6:])

    _out, recap = role({"cpu_tuning_state": "absent", "cpu_tuning_vllm_placement": "absent"})
    reverted = live()
    assert word(reverted["thp_enabled"]) == thp["thp_enabled"] and word(reverted["thp_defrag"]) == thp["thp_defrag"]
    assert reverted["governors"] == booted["governors"] and reverted["idle_disabled"] == booted["idle_disabled"]
    assert reverted["files"].strip() == "" and reverted["unit"] in ("", "not-found"), reverted
    assert reverted["vllm_cpus"] == "0-1", reverted  # restarted without the drop-in
    took = reboot()
    final = live()
    assert {k: final[k] for k in ("thp_enabled", "thp_defrag", "governors", "idle_disabled")} == \
        {k: booted[k] for k in ("thp_enabled", "thp_defrag", "governors", "idle_disabled")}, (final, booted)
    record_figure(WORK / "figures.jsonl", "cpu_vm", second_reboot_s=round(took), reverted=True,
                  thp_set=want, has_cpufreq=has_cpufreq, has_cpuidle=has_cpuidle)


HOLDER = r"""
echo "active=$(systemctl is-active gpufleet-pm-qos.service 2>/dev/null || true)"
echo "enabled=$(systemctl is-enabled gpufleet-pm-qos.service 2>/dev/null || true)"
echo "in_force=$(python3 -c 'import struct; print(struct.unpack("=i", open("/dev/cpu_dma_latency", "rb").read(4))[0])')"
echo "files=$(ls /usr/local/libexec/gpufleet-pm-qos-hold /etc/systemd/system/gpufleet-pm-qos.service 2>/dev/null | tr '\n' ' ')"
echo "idle_disabled=$(cat /sys/devices/system/cpu/cpu*/cpuidle/state*/disable 2>/dev/null | tr '\n' ' ')"
"""


def holder() -> dict:
    """The PM QoS holder on the VM: its unit, and the value a read of /dev/cpu_dma_latency gives in force."""
    out = lab_ssh(VM, "bash -s", stdin=HOLDER)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_the_pm_qos_holder_holds_the_limit_across_a_reboot_and_is_removed(vm):
    """cstate_method pm_qos: the holder holds /dev/cpu_dma_latency at the limit (read over SSH through the device, which
    gives the value in force), is enabled and holds it again after a reboot; restoring cstate stops and removes it and
    the device gives the kernel's default again. No cpuidle file is touched."""
    if not lab_ssh(VM, "test -c /dev/cpu_dma_latency && echo yes || true").strip():
        pytest.skip("this VM's kernel has no /dev/cpu_dma_latency")
    booted = holder()
    assert booted["in_force"] == "2000000000" and booted["files"].strip() == "", booted  # no request: the default
    limit = {"cpu_tuning_cstate_max_latency_us": 20, "cpu_tuning_cstate_method": "pm_qos"}
    role(limit)
    held = holder()
    assert held["active"] == "active" and held["enabled"] == "enabled" and held["in_force"] == "20", held
    assert held["idle_disabled"] == booted["idle_disabled"], (held, booted)
    _out, again = role(limit)
    assert again.get("changed") == 0, again

    took = reboot()
    after = holder()
    assert after["active"] == "active" and after["in_force"] == "20", after
    journal = lab_ssh(VM, "journalctl -b -u gpufleet-pm-qos.service --no-pager -o cat")
    assert "holding /dev/cpu_dma_latency at 20 us" in journal, journal

    role({"cpu_tuning_state": "absent", "cpu_tuning_restore": ["cstate"]})
    gone = holder()
    assert gone["active"] != "active" and gone["files"].strip() == "" and gone["in_force"] == "2000000000", gone
    record_figure(WORK / "figures.jsonl", "cpu_vm_pm_qos", booted=booted["in_force"], held=held["in_force"],
                  after_reboot=after["in_force"], reverted=gone["in_force"], reboot_s=round(took),
                  journal=journal.strip().splitlines()[-3:])

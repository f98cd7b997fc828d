"""Measured tuning and health between changes, for real, in one VM of the lab (issue 21).

1. ``playbooks/tune_measured.yml`` on lab1 with the lab inference server (extras/lab_inference_server.py)
   under the vllm_service unit (vllm_service_install: false, the lab's group_vars): a baseline, then each
   kernel-side stage alone (ASPM runtime policy, MaxPayload/MaxReadReq, IRQ affinity, 2 MiB huge pages,
   NCCL settings) benchmarked and gated (threshold 0.40: emulated CPUs are noisy, see
   docs/lab_inference_server.md), four of them reverted because the test says so
   (``tune_measured_force_revert``), then the reboot stage (``pcie_aspm.policy=performance`` on the
   kernel command line) with exactly one reboot. Everything is checked on the VM itself: a sampler unit
   on the VM logs the live state every 2 s (ASPM policy, 2 MiB pages, /etc/nccl.conf, nic1's IRQ
   affinity, the boot id) so the applied state of a stage that is later reverted is seen too; a boot
   unit appends every boot id to a file; ``journalctl --list-boots`` is persistent; /proc/cmdline.
2. ``playbooks/health.yml``: a first run records the audit; lab1 is restarted on its own disk with root
   port rp1 narrowed from 16GT/s x16 to x8 and the GPU stand-in gpu2 (06:00.0) left out
   (``tests/lab/lab restart lab1 --root-port rp1=16x8 --without gpu2``); the second run flags both in the
   fleet report, with their fixes.

The module boots its own single VM (``lab up 1``) and powers it off at its end, before the session's
3-VM lab (conftest.py) starts for the other modules: it runs first in MODULE_ORDER and does not touch what
they get. Figures go to .lab/measured_vm/figures.json, the reports to .lab/measured_vm/.

    . scripts/lib.sh; gpufleet_env
    flock /work/lab.lock env GPUFLEET_LAB_BASE_PORT=2521 python -m pytest -m e2e -x -v tests/lab/test_measured_vm.py
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.lab.labutil import (INVENTORY_DIR, LAB, LAB_DIR, REPO, ansible_env, lab_ssh, one_vm, play_recap, run)

# e2e: about 20-30 min under TCG (3 boots, 7 benchmarks, 2 health runs); opt-in
pytestmark = [pytest.mark.vmlab, pytest.mark.e2e]

VM = "lab1"
WORK = LAB_DIR / "measured_vm"
PCIE = "gpufleet.inference.pcie_link"
# pcie_link with nothing but what a stage names (the lab's group_vars set ASPM, MRRS and the cmdline)
PCIE_NONE = {"pcie_link_state": "present", "pcie_link_aspm_policy": "", "pcie_link_aspm_cmdline": "",
             "pcie_link_mps": "", "pcie_link_mrrs": 0}
CMDLINE_ARG = "pcie_aspm.policy=performance"
HUGEPAGES = 32  # 2 MiB pages for the stage (the VM has 2 GiB)
NIC1 = "0000:07:00.0"

# The playbook's default stages, in its order (the lab has one NUMA node, so IRQ "NUMA-local" is CPUs 0-1,
# spread one vector per CPU), plus one stage that needs a reboot: they are grouped into the stage "reboot".
STAGES = [
    {"name": "aspm", "description": "PCIe ASPM runtime policy performance (no boot argument)", "role": PCIE,
     "vars": {**PCIE_NONE, "pcie_link_aspm_policy": "performance"}, "record": ["aspm_policy"],
     "revert": [{"role": PCIE, "vars": {**PCIE_NONE, "pcie_link_aspm_policy": "@aspm_policy"}}]},
    {"name": "payload", "description": "MaxPayload max_safe, MaxReadReq 4096 along the GPU paths", "role": PCIE,
     "vars": {**PCIE_NONE, "pcie_link_mps": "max_safe", "pcie_link_mrrs": 4096},
     "revert": [{"role": PCIE, "vars": {"pcie_link_state": "absent"}}]},
    {"name": "irq_affinity", "description": "nic1 and NVMe interrupts pinned to their NUMA node's CPUs",
     "role": "gpufleet.inference.irq_affinity", "vars": {"irq_affinity_state": "present"},
     "revert": [{"role": "gpufleet.inference.irq_affinity", "vars": {"irq_affinity_state": "absent"}}]},
    {"name": "hugepages_2m", "description": f"{HUGEPAGES} 2 MiB huge pages per NUMA node",
     "role": "gpufleet.inference.hugepages", "vars": {"hugepages_2m_per_node": HUGEPAGES, "hugepages_mounts": []},
     "record": ["hugepages_2m_per_node"],
     "revert": [{"role": "gpufleet.inference.hugepages",
                 "vars": {"hugepages_per_node": "@hugepages_2m_per_node", "hugepages_mounts": []}}]},
    {"name": "nccl", "description": "NCCL pcie_safe settings, the server restarted to read them",
     "role": "gpufleet.inference.nccl_env",
     "vars": {"nccl_env_profile": "pcie_safe", "nccl_env_restart_units": ["vllm.service"]},
     "files": ["/etc/nccl.conf", "/etc/gpufleet/nccl.env"], "revert": [{"restart": "vllm.service"}]},
    {"name": "aspm_cmdline", "description": f"{CMDLINE_ARG} on the kernel command line", "role": PCIE,
     "vars": {**PCIE_NONE, "pcie_link_aspm_cmdline": CMDLINE_ARG, "pcie_link_reboot_ok": True}, "reboot": True,
     "revert": [{"role": PCIE, "vars": {**PCIE_NONE, "pcie_link_reboot_ok": True}}]},
]
FORCED = ["aspm", "irq_affinity", "hugepages_2m", "nccl"]
EXPECTED = {"baseline": "baseline", "aspm": "reverted", "payload": "kept", "irq_affinity": "reverted",
            "hugepages_2m": "reverted", "nccl": "reverted", "reboot": "kept"}

# One small profile (16/16 tokens, 4 in flight, 32 requests: 1-3 s a run under TCG), 5 runs per look.
PROFILE = {"name": "lab_serving", "prompt_tokens": 16, "output_tokens": 16, "concurrency": [4], "requests": 32,
           "repetitions": 5, "warmup": 4, "settle_runs": 0}
HEALTH_BENCH = {"health_benchmark_prompt_tokens": 16, "health_benchmark_output_tokens": 16,
                "health_benchmark_concurrency": [4], "health_benchmark_requests": 32, "health_benchmark_repetitions": 3}

# Runs on the VM as a transient unit: the live state every 2 s, one line each:
# epoch|boot_id|aspm policy|2 MiB pages|nccl.conf present|irq=cpus,... of nic1|irq_affinity's udev rule present
# (shell only: cheap under TCG)
SAMPLER = r"""
while :; do
  irqs=""
  for i in $(ls /sys/bus/pci/devices/0000:07:00.0/msi_irqs 2>/dev/null); do
    irqs="$irqs$i=$(cat /proc/irq/$i/smp_affinity_list 2>/dev/null),"
  done
  nccl=0; [ -e /etc/nccl.conf ] && nccl=1
  rule=0; [ -e /etc/udev/rules.d/90-gpufleet-irq-affinity.rules ] && rule=1
  echo "$(date +%s)|$(cat /proc/sys/kernel/random/boot_id)|$(cat /sys/module/pcie_aspm/parameters/policy)|\
$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)|$nccl|$irqs|$rule"
  sleep 2
done >> /var/log/gpufleet-sampler.log
"""
BOOT_UNIT = """[Unit]
Description=gpufleet lab: append this boot's id to /var/log/gpufleet-boots.log (tests/lab/test_measured_vm.py)

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'cat /proc/sys/kernel/random/boot_id >> /var/log/gpufleet-boots.log'

[Install]
WantedBy=multi-user.target
"""


def playbook(path: str, *args: str, timeout: int = 3600):
    return run([REPO / ".venv" / "bin" / "ansible-playbook", "-i", INVENTORY_DIR, path, "--limit", VM, *args],
               timeout=timeout, env=ansible_env())


def ok(r, what: str) -> None:
    assert r.returncode == 0, f"{what} failed (rc {r.returncode}):\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
    recap = play_recap(r.stdout).get(VM, {})
    assert recap.get("failed", 1) == 0 and recap.get("unreachable", 1) == 0, recap


def live(name: str = VM) -> dict:
    """The VM's own state, read over SSH."""
    out = lab_ssh(name, f"""
        echo "policy=$(cat /sys/module/pcie_aspm/parameters/policy)"
        echo "pages=$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)"
        echo "nccl=$([ -e /etc/nccl.conf ] && echo 1 || echo 0)"
        echo "boot_id=$(cat /proc/sys/kernel/random/boot_id)"
        echo "boots=$(journalctl --list-boots --no-pager -q | wc -l)"
        echo "recorded_boots=$(cat /var/log/gpufleet-boots.log 2>/dev/null | wc -l)"
        echo "cmdline=$(cat /proc/cmdline)"
        echo "irq_persist=$(ls /etc/udev/rules.d/90-gpufleet-irq-affinity.rules \\
            /etc/systemd/system/gpufleet-irq-affinity.timer 2>/dev/null | tr '\\n' ' ')"
        echo "sysctl_pages=$(grep -rhs nr_hugepages /etc/sysctl.d/ | tr '\\n' ' ')"
        echo "irq=$(for i in $(ls /sys/bus/pci/devices/{NIC1}/msi_irqs); do printf '%s=%s,' $i $(cat /proc/irq/$i/smp_affinity_list); done)"
        echo "devctl=$(lspci -vv -s 01:00.0 | grep -o 'MaxPayload [0-9]* bytes, MaxReadReq [0-9]* bytes')"
    """)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def policy(text: str) -> str:
    m = re.search(r"\[(\w+)\]", text)
    return m.group(1) if m else text


def irq_map(text: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in text.strip(",").split(",") if "=" in p)


def samples() -> list[dict]:
    out = lab_ssh(VM, "cat /var/log/gpufleet-sampler.log")
    rows = []
    for line in out.splitlines():
        f = line.split("|")
        if len(f) == 7 and f[0].isdigit():
            rows.append({"t": int(f[0]), "boot_id": f[1], "policy": policy(f[2]), "pages": f[3], "nccl": f[4],
                         "irq": irq_map(f[5]), "irq_rule": f[6]})
    return rows


def figures(**kw) -> None:
    path = WORK / "figures.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(kw)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


@pytest.fixture(scope="module")
def vm():
    """lab1 alone, booted for this module and powered off at its end (the session's 3-VM lab starts after)."""
    with one_vm(WORK) as lab:
        figures(up_s=lab["up_s"])
        yield VM


@pytest.fixture(scope="module")
def server(vm):
    """The stand-in under the vllm_service unit (serve.yml's stand-in tasks and role, the lab's group_vars),
    a persistent journal, and the boot recorder. irqbalance is stopped for this boot: the IRQ revert must bring
    back the affinities found before the run, and irqbalance would move them on its own meanwhile (the role
    restarts irqbalance only where it runs; a reboot starts it again)."""
    lab_ssh(VM, "systemctl stop irqbalance.service")
    lab_ssh(VM, "mkdir -p /var/log/journal && systemd-tmpfiles --create --prefix /var/log/journal && "
                "systemctl restart systemd-journald && journalctl --flush")
    lab_ssh(VM, "cat > /etc/systemd/system/gpufleet-boot-record.service && systemctl daemon-reload && "
                "systemctl enable --now gpufleet-boot-record.service", stdin=BOOT_UNIT)
    t0 = time.time()
    r = playbook("playbooks/serve.yml", "--tags", "vllm_service", "-e", "gpufleet_site_benchmark=never", timeout=1800)
    ok(r, "serve.yml --tags vllm_service")
    figures(setup_s=round(time.time() - t0))
    assert lab_ssh(VM, "systemctl is-active vllm.service").strip() == "active"
    return VM


def test_measured_tuning_applies_measures_reverts_and_reboots_once(server):
    before = live()
    assert before["nccl"] == "0" and before["recorded_boots"] == "1", before
    assert CMDLINE_ARG not in before["cmdline"]
    lab_ssh(VM, "cat > /usr/local/sbin/gpufleet-sampler && rm -f /var/log/gpufleet-sampler.log && "
                "systemd-run --unit gpufleet-sampler --nice 19 /bin/sh /usr/local/sbin/gpufleet-sampler", stdin=SAMPLER)
    settings = WORK / "tune.json"
    report = WORK / "tune_measured"
    settings.write_text(json.dumps({
        "tune_measured_stages": STAGES, "tune_measured_profiles": [PROFILE],
        "tune_measured_gate": {"threshold": 0.40}, "tune_measured_inconclusive": "keep",
        "tune_measured_force_revert": FORCED, "tune_measured_report_dir": str(report),
        "gpufleet_history_db": str(WORK / "history.sqlite"), "reboot_timeout": 1500,
        "tune_measured_ready_timeout": 600}, indent=1))
    t0 = time.time()
    r = playbook("playbooks/tune_measured.yml", "-e", f"@{settings}", timeout=3600)
    wall = time.time() - t0
    (WORK / "tune_measured.log").write_text(r.stdout + r.stderr)
    ok(r, "tune_measured.yml")
    after = live()
    rows = samples()
    state = json.loads((report / f"{VM}.json").read_text())
    stages = {s["name"]: s for s in state["stages"]}
    figures(tune_measured_s=round(wall), recap=play_recap(r.stdout)[VM], before=before, after=after,
            stages={n: {"status": s["status"], "verdict": s["verdict"], "reason": s["reason"]} for n, s in stages.items()})

    # what the loop decided: the forced ones reverted, the others kept (inconclusive: keep)
    assert {n: s["status"] for n, s in stages.items()} == EXPECTED, {n: s["reason"] for n, s in stages.items()}
    for name in FORCED:
        assert "force_revert" in stages[name]["reason"], stages[name]["reason"]
    assert stages["reboot"]["members"] == ["aspm_cmdline"]

    # each stage applied for real: the sampler saw it on the VM before the reboot
    first = [s for s in rows if s["boot_id"] == before["boot_id"]]
    assert first, "the sampler logged nothing before the reboot"
    assert any(s["policy"] == "performance" for s in first), {s["policy"] for s in first}
    assert any(s["pages"] == str(HUGEPAGES) for s in first), {s["pages"] for s in first}
    assert any(s["nccl"] == "1" for s in first)
    orig_irq = irq_map(before["irq"])
    # spread: one vector per CPU of the node (CPUs 0-1), each vector on a single CPU, both CPUs used
    assert any(set(s["irq"]) == set(orig_irq) and set(s["irq"].values()) == {"0", "1"} for s in first), \
        (orig_irq, {json.dumps(s["irq"], sort_keys=True) for s in first})
    assert any(s["irq_rule"] == "1" for s in first), "irq_affinity's udev rule (the pinning kept across rebinds) never seen"
    # ... and reverted for real: the last reading before the reboot is the state found before the run
    last = first[-1]
    assert last["policy"] == policy(before["policy"]), last
    assert last["pages"] == before["pages"] and last["nccl"] == "0" and last["irq"] == orig_irq, (last, before)
    assert last["irq_rule"] == "0" and before["irq_persist"].strip() == "" and after["irq_persist"].strip() == "", \
        (last, before["irq_persist"], after["irq_persist"])

    # the payload stage in QEMU: MPS/MRRS are read-only, the writes read back unchanged and are rolled back
    assert after["devctl"] == before["devctl"], (before["devctl"], after["devctl"])

    # the reboot stage rebooted once: one new boot id, one more boot in the journal and in the boot record
    assert after["boot_id"] != before["boot_id"]
    assert int(after["recorded_boots"]) == int(before["recorded_boots"]) + 1, (before, after)
    assert int(after["boots"]) == int(before["boots"]) + 1, (before, after)
    assert len({s["boot_id"] for s in rows}) == 1, "the sampler (a transient unit) ran in one boot only"
    assert CMDLINE_ARG in after["cmdline"].split()
    # the kept reboot stage sets the boot-time policy; what the reverts undid stays undone after the boot
    assert policy(after["policy"]) == "performance"
    assert after["pages"] == before["pages"] and after["nccl"] == "0", (before, after)
    assert str(HUGEPAGES) not in after["sysctl_pages"], after["sysctl_pages"]
    assert lab_ssh(VM, "systemctl is-active vllm.service").strip() == "active"

    # the stage table on the controller, its rows as they happened
    md = (report / "stages.md").read_text()
    html = (report / "stages.html").read_text()
    for name, outcome in EXPECTED.items():
        row = next((line for line in md.splitlines() if line.startswith(f"| {name} |") and line.count("|") == 6), None)
        assert row is not None, f"no summary row for {name} in stages.md"
        assert row.rstrip(" |").rsplit("|", 1)[-1].strip() == outcome, row
    assert "<svg" in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")


def test_health_flags_a_narrower_root_port_and_a_missing_gpu(server):
    reports = WORK / "health"
    extra = ["-e", json.dumps({**HEALTH_BENCH, "gpufleet_history_db": str(WORK / "history.sqlite")})]
    t0 = time.time()
    first = playbook("playbooks/health.yml", "-e", f"gpufleet_report_dir={reports}/first", *extra)
    figures(health_first_s=round(time.time() - t0))
    ok(first, "health.yml (first)")
    recorded = json.loads(lab_ssh(VM, "cat /var/lib/gpufleet/health/last.json"))
    assert "0000:06:00.0" in {g["bdf"] for g in recorded["pcie"]["gpus"]}
    assert "Width x16" in re.search(r"LnkCap:.*", lab_ssh(VM, "lspci -vv -s 00:04.0")).group(0)
    assert not [f for f in recorded["findings"] if f["code"] != "xid"], recorded["findings"]  # nothing to compare with yet

    t0 = time.time()
    r = run([LAB, "restart", VM, "--root-port", "rp1=16x8", "--without", "gpu2"], timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    figures(restart_s=round(time.time() - t0))
    # the VM's own view: the port offers x8 now, and the stand-in behind the second downstream port is gone
    assert "Width x8" in re.search(r"LnkCap:.*", lab_ssh(VM, "lspci -vv -s 00:04.0")).group(0)
    assert lab_ssh(VM, "lspci -s 06:00.0").strip() == ""

    t0 = time.time()
    second = playbook("playbooks/health.yml", "-e", f"gpufleet_report_dir={reports}/second", *extra)
    figures(health_second_s=round(time.time() - t0))
    (WORK / "health_second.log").write_text(second.stdout + second.stderr)
    ok(second, "health.yml (second)")
    findings = json.loads(lab_ssh(VM, "cat /var/lib/gpufleet/health/last.json"))["findings"]
    figures(health_findings=findings)
    got = {(f["code"], f["severity"], f["device"]) for f in findings}
    assert ("gpu_missing", "critical", "0000:06:00.0") in got, got
    assert ("link_cap_reduced", "critical", "0000:00:04.0") in got, got
    fleet = (reports / "second" / "health" / "fleet.md").read_text()
    by_code = {f["code"]: f for f in findings}
    for code in ("gpu_missing", "link_cap_reduced"):
        assert by_code[code]["message"] in fleet, (code, fleet[:3000])
        assert by_code[code]["fix"] in fleet, (code, fleet[:3000])
    assert "x8 now, was Gen4 (16GT/s) x16" in by_code["link_cap_reduced"]["message"]

"""The kernel upgrade, for real, in the VM lab: playbooks/kernel_upgrade.yml moves the three VMs
from Debian's 6.1.176 (6.1.0-50-cloud-amd64) to 6.1.192 (6.1.0-56-cloud-amd64, from the image's
offline apt repository), in canary waves, behind the throughput gate on the lab inference server.

* lab1 (the canary) and lab2 pass and keep the new kernel, locked.
* lab3 gets a real regression: a systemd unit with ConditionKernelVersion=6.1.0-56-* that starts
  only under the new kernel and burns the CPU the inference server runs on. The gate measures the
  drop, the role rolls back, and lab3 ends on the old kernel, default and locked, serving.
* Then the failed boot: lab3's GRUB entries for 6.1.0-56 are made unbootable on purpose (a root=
  that does not exist, rootdelay=3 panic=5, for that kernel's entries only); the one-shot boot
  panics, the VM resets (QEMU restarts a guest that reboots), GRUB boots the saved default, and the
  role records the failed boot and leaves lab3 on the old kernel.

The inference server is extras/lab_inference_server.py (a documented stand-in doing real CPU work
per token) run by the vllm_service role's unit through its command override, without installing
vLLM (vllm_service_install: false). This module changes kernels, so it runs after every other VM
lab test module and just before the teardown (see conftest.py).

Run alone: . scripts/lib.sh; gpufleet_env; GPUFLEET_LAB_BASE_PORT=2321 pytest -m vmlab tests/lab/test_kernel_upgrade_vm.py
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.lab.labutil import INVENTORY_DIR, REPO, ansible_env, lab_ssh, run

# e2e: an hour or more under TCG (kernel installs, reboots, benchmarks on 3 VMs); opt-in:
#     scripts/run-tests -m e2e tests/lab
pytestmark = [pytest.mark.vmlab, pytest.mark.lab_kernel, pytest.mark.e2e]

OLD = "6.1.0-50-cloud-amd64"
NEW = "6.1.0-56-cloud-amd64"
HOG = "gpufleet-lab-regression.service"

# The benchmark: small, and the same on both sides. Runs of 32 requests x 16 tokens at 4 in flight
# take 1-3 s under TCG. The threshold is 0.40 rather than the default 0.95, because the speed of
# emulated CPUs on this 2-core machine drifts by minutes, whatever the kernel: on a quiet machine
# (2026-11-29, one VM, nothing else running) the stand-in gave 246-461 tok/s on one kernel within
# ten minutes; in one rollout lab1's baseline was 493 and its candidate 290 (0.587), while by hand
# 6.1.0-50 and 6.1.0-56 then both gave about 300 (docs/lab_inference_server.md). The induced
# regression leaves about a tenth of the throughput (0.10-0.12 measured), so 0.40 keeps a margin
# on both sides. The 5% gate itself is proven where the noise allows it: the simulation
# (tests/benchmarks/bench_throughput_gate.py) at 2% noise; the real vLLM in the vllm_service
# Molecule scenario varies by 13-21% on this machine and is gated at 0.70 there. No settle runs:
# this e2e was shown green without them (2026-11-29), before the benchmark had them.
SETTINGS = {
    "kernel_upgrade_target": NEW,
    "kernel_upgrade_reboot_ok": True,
    "kernel_upgrade_serial": [1, 2],
    "kernel_upgrade_reboot_timeout": 1500,
    "kernel_upgrade_gate_threshold": 0.40,
    "kernel_upgrade_vllm_timeout": 300,
    "inference_benchmark_url": "http://127.0.0.1:8000",
    "inference_benchmark_model": "lab",
    "inference_benchmark_prompt_tokens": 16,
    "inference_benchmark_output_tokens": 16,
    "inference_benchmark_concurrency": [4],
    "inference_benchmark_requests": 32,
    "inference_benchmark_warmup": 4,
    "inference_benchmark_settle_runs": 0,
    "inference_benchmark_timeout": 120,
    # Drain and undrain hooks (playbooks/tasks/disruptive.yml) that write, on the host, the boot they ran in: the
    # rollout test reads from their own log that the drain ran before the reboot and the undrain after it.
    "gpufleet_drain": [{"name": "lab drain", "command": ["sh", "-c", 'echo "drain $(cat /proc/sys/kernel/random/boot_id) '
                                                                     '$(uname -r)" >> /var/log/gpufleet-lab-hooks.log']}],
    "gpufleet_undrain": [{"name": "lab undrain", "command": ["sh", "-c", 'echo "undrain $(cat /proc/sys/kernel/random/boot_id) '
                                                                         '$(uname -r)" >> /var/log/gpufleet-lab-hooks.log']}],
}
HOOK_LOG = "/var/log/gpufleet-lab-hooks.log"

SETUP = f"""
- name: The lab inference server under the vllm_service unit, and lab3's regression in waiting
  hosts: lab_vms
  gather_facts: false
  tasks:
    - name: Create the directories
      ansible.builtin.file:
        path: "{{{{ item }}}}"
        state: directory
        mode: "0755"
      loop: [/opt/gpufleet, /srv/models/lab]

    - name: Copy the lab stand-in server
      ansible.builtin.copy:
        src: {REPO}/extras/lab_inference_server.py
        dest: /opt/gpufleet/lab_inference_server.py
        mode: "0755"

    - name: Create the stand-in's model directory (the preflight wants a config.json)
      ansible.builtin.copy:
        content: "{{}}\\n"
        dest: /srv/models/lab/config.json
        mode: "0644"

    - name: Run it through vllm_service's command override (no vLLM install)
      ansible.builtin.include_role:
        name: gpufleet.inference.vllm_service
      vars:
        vllm_service_install: false
        vllm_service_command: [/usr/bin/python3, /opt/gpufleet/lab_inference_server.py, --work, "4", --step-work, "16"]
        vllm_service_model: /srv/models/lab
        vllm_service_served_model_name: lab
        vllm_service_unit_settings: {{CPUAffinity: "0"}}
        vllm_service_ready_timeout: 300

    - name: Skip the kernel's IO-APIC timer check (a TCG flake under load; the next entries carry it)
      gpufleet.inference.kernel_cmdline:
        owner: lab
        args: [no_timer_check]

    - name: Install the regression that starts only under the new kernel (lab3)
      ansible.builtin.copy:
        dest: /etc/systemd/system/{HOG}
        mode: "0644"
        content: |
          [Unit]
          Description=Lab regression: burns the inference server's CPU, only under kernel {NEW}
          ConditionKernelVersion={NEW.rsplit('-', 2)[0]}-*

          [Service]
          ExecStart=/bin/sh -c 'while :; do :; done'
          CPUAffinity=0
          Nice=-10

          [Install]
          WantedBy=multi-user.target
      when: inventory_hostname == 'lab3'

    - name: Enable it (it does not start under the running kernel)
      ansible.builtin.systemd_service:
        name: {HOG}
        enabled: true
        state: started
        daemon_reload: true
      when: inventory_hostname == 'lab3'
"""


def ansible_playbook(playbook: str | Path, *args: str, timeout: int = 3600):
    return run([REPO / ".venv" / "bin" / "ansible-playbook", "-i", INVENTORY_DIR, str(playbook), *args],
               timeout=timeout, env=ansible_env())


def grubenv(name: str) -> dict:
    out = lab_ssh(name, "grub-editenv /boot/grub/grubenv list")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def held(name: str) -> list[str]:
    return lab_ssh(name, "apt-mark showhold").split()


def serving(name: str) -> bool:
    out = lab_ssh(name, "curl -fsS http://127.0.0.1:8000/v1/models 2>/dev/null || "
                        "python3 -c \"import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8000/v1/models').read().decode())\"")
    return '"lab"' in out


def records(report_dir: Path) -> dict:
    return {p.stem: json.loads(p.read_text()) for p in (report_dir / "hosts").glob("*.json")}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kernel_upgrade")


@pytest.fixture(scope="module")
def settings_file(work) -> Path:
    path = work / "settings.json"
    path.write_text(json.dumps(SETTINGS))
    return path


@pytest.fixture(scope="module")
def servers(lab, work):
    """The lab inference server on every VM (vllm_service unit), lab3's regression unit installed."""
    setup = work / "setup.yml"
    setup.write_text(SETUP)
    t0 = time.time()
    r = ansible_playbook(setup, timeout=1800)
    (work / "setup.log").write_text(r.stdout)
    assert r.returncode == 0, f"setup failed:\n{r.stdout[-6000:]}"
    print(f"kernel upgrade lab: setup {time.time() - t0:.0f} s")
    for name in ("lab1", "lab2", "lab3"):
        assert lab_ssh(name, "uname -r").strip() == OLD
        assert serving(name)


def boot_ids() -> dict:
    return {n: lab_ssh(n, "cat /proc/sys/kernel/random/boot_id").strip() for n in ("lab1", "lab2", "lab3")}


def rollout_with_host_vars(work: Path, name: str, host_vars: dict, waves: dict):
    """playbooks/kernel_upgrade.yml with SETTINGS as inventory group vars, so that a host's own vars
    in `host_vars` win over them (as extra vars they would not), and `waves` (serial,
    max_fail_percentage) as extra vars (play keywords). The log lands in work/<name>.log and the
    fleet report in work/<name>/; returns the run and the report directory."""
    inventory = work / f"{name}.yml"
    group = {k: v for k, v in SETTINGS.items() if k != "kernel_upgrade_serial"}
    inventory.write_text(json.dumps({"lab_vms": {"hosts": host_vars, "vars": group}}))
    report = work / name
    r = run([REPO / ".venv" / "bin" / "ansible-playbook", "-i", INVENTORY_DIR, "-i", inventory,
             REPO / "playbooks" / "kernel_upgrade.yml", "-e", json.dumps(waves),
             "-e", f"kernel_upgrade_fleet_report_dir={report}"], timeout=1800, env=ansible_env())
    (work / f"{name}.log").write_text(r.stdout)
    return r, report


def test_bad_inputs_fail_clearly_and_leave_hosts_alone(servers, work):
    """One wave over the three VMs, each with one bad input: lab1's benchmark endpoint is down, lab2's
    target kernel does not exist, lab3's GRUB has no saved default. Each fails with its reason; none
    is touched (same boot, old kernel, nothing installed)."""
    lab_ssh("lab3", "printf 'GRUB_DEFAULT=0\\n' > /etc/default/grub.d/60-lab-test.cfg")
    before = boot_ids()
    t0 = time.time()
    try:
        r, report = rollout_with_host_vars(
            work, "bad_inputs",
            {"lab1": {"inference_benchmark_url": "http://127.0.0.1:8999"},
             "lab2": {"kernel_upgrade_target": "6.1.0-99-cloud-amd64"},
             "lab3": {}},
            {"kernel_upgrade_serial": [3], "kernel_upgrade_max_fail_percentage": 100})
    finally:
        lab_ssh("lab3", "rm -f /etc/default/grub.d/60-lab-test.cfg")
    print(f"bad inputs run: {time.time() - t0:.0f} s")
    assert r.returncode != 0
    recs = records(report)
    assert recs["lab1"]["decision"] == "error", recs["lab1"]
    assert "Cannot reach the inference server at http://127.0.0.1:8999" in recs["lab1"]["reason"]
    assert recs["lab2"]["decision"] == "preflight_failed", recs["lab2"]
    assert "linux-image-6.1.0-99-cloud-amd64 cannot be installed" in recs["lab2"]["reason"]
    assert recs["lab3"]["decision"] == "preflight_failed", recs["lab3"]
    assert "GRUB_DEFAULT=0 (set in /etc/default/grub.d/60-lab-test.cfg)" in recs["lab3"]["reason"]
    assert "kernel_upgrade_fix_grub_default: true" in recs["lab3"]["reason"]
    assert boot_ids() == before
    for name in ("lab1", "lab2", "lab3"):
        assert lab_ssh(name, f"uname -r; test -e /boot/vmlinuz-{NEW} && echo installed || echo absent").split() == [OLD, "absent"]


def test_a_failing_canary_stops_the_rollout(servers, work):
    """The default ladder with max_fail_percentage 0: the canary (lab1) fails (its benchmark
    endpoint is down), so the rollout stops after wave 1; lab2 and lab3 are never touched and get
    no record."""
    before = boot_ids()
    r, report = rollout_with_host_vars(
        work, "canary_fails",
        {"lab1": {"inference_benchmark_url": "http://127.0.0.1:8999"}, "lab2": {}, "lab3": {}},
        {"kernel_upgrade_serial": [1, 2]})
    assert r.returncode != 0
    recs = records(report)
    assert set(recs) == {"lab1"}, (sorted(recs), r.stdout[-4000:])
    assert recs["lab1"]["decision"] == "error"
    fleet = json.loads((report / "fleet.json").read_text())
    assert fleet["failed"] == ["lab1"]
    # lab2 and lab3 were in later waves: not one of their tasks ran
    for name in ("lab2", "lab3"):
        assert not re.search(rf"^(ok|changed|failed|fatal|skipping): \[{name}\]", r.stdout, re.M), name
    assert boot_ids() == before
    for name in ("lab1", "lab2", "lab3"):
        assert lab_ssh(name, f"test -e /boot/vmlinuz-{NEW} && echo installed || echo absent").strip() == "absent"


def hook_log(name: str) -> list[str]:
    return lab_ssh(name, f"cat {HOOK_LOG} 2>/dev/null || true").splitlines()


def test_outside_its_window_the_upgrade_is_refused_before_anything_changes(servers, settings_file, work):
    """Every VM's only maintenance window is a minute three days from now (in the VM's own time zone): the
    maintenance gate refuses each host before its lease, its drain hook or its preflight touched anything; same boot,
    old kernel, nothing installed, no hook ran."""
    day = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")[(time.gmtime().tm_wday + 3) % 7]
    windows = {"gpufleet_maintenance_windows": [{"days": [day], "start": "00:00", "end": "00:01"}],
               "kernel_upgrade_serial": [3], "kernel_upgrade_max_fail_percentage": 100}
    before, logs = boot_ids(), {n: hook_log(n) for n in ("lab1", "lab2", "lab3")}
    r = ansible_playbook(REPO / "playbooks" / "kernel_upgrade.yml", "-e", f"@{settings_file}", "-e", json.dumps(windows),
                         "-e", f"kernel_upgrade_fleet_report_dir={work / 'outside'}", timeout=1800)
    (work / "outside.log").write_text(r.stdout)
    assert r.returncode != 0, r.stdout[-6000:]
    for name in ("lab1", "lab2", "lab3"):
        assert re.search(rf"fatal: \[{name}\]: FAILED! => .*kernel upgrade refused: outside the maintenance windows "
                         rf"\({day} 00:00-00:01, time zone [^)]+\): it is ", r.stdout), (name, r.stdout[-6000:])
        assert lab_ssh(name, f"uname -r; test -e /boot/vmlinuz-{NEW} && echo installed || echo absent").split() == [OLD, "absent"]
        assert hook_log(name) == logs[name], name
    assert "TASK [gpufleet.inference.kernel_upgrade" not in r.stdout
    assert boot_ids() == before


def test_check_mode_previews_without_changing(servers, settings_file, work):
    """--check: preflight and plan for every host, nothing installed, nothing rebooted."""
    before = boot_ids()
    r = ansible_playbook(REPO / "playbooks" / "kernel_upgrade.yml", "--check", "-e", f"@{settings_file}",
                         "-e", '{"kernel_upgrade_serial": [3]}', timeout=1800)
    (work / "check.log").write_text(r.stdout)
    assert r.returncode == 0, r.stdout[-6000:]
    assert boot_ids() == before
    for name in ("lab1", "lab2", "lab3"):
        assert lab_ssh(name, f"test -e /boot/vmlinuz-{NEW} && echo installed || echo absent").strip() == "absent"
        assert f"{name}: planned ({OLD} -> {NEW})" in r.stdout, r.stdout[-6000:]
    assert "would: benchmark" in r.stdout


@pytest.fixture(scope="module")
def rollout(servers, settings_file, work):
    """One rollout over the three VMs in two waves (lab1, then lab2 and lab3)."""
    report = work / "report"
    for name in ("lab1", "lab2", "lab3"):
        lab_ssh(name, f"rm -f {HOOK_LOG}")
    before = boot_ids()
    t0 = time.time()
    r = ansible_playbook(REPO / "playbooks" / "kernel_upgrade.yml", "-e", f"@{settings_file}",
                         "-e", f"kernel_upgrade_fleet_report_dir={report}", timeout=5400)
    t_rollout = time.time() - t0
    (work / "rollout.log").write_text(r.stdout)
    print(f"kernel upgrade lab: rollout {t_rollout:.0f} s (log {work / 'rollout.log'})")
    return {"rc": r.returncode, "out": r.stdout, "report": report, "t_rollout": t_rollout, "boots_before": before}


def test_the_drain_hook_runs_before_the_reboot_and_the_undrain_after(rollout):
    """Read from the hooks' own log on each VM: one drain, in the boot before the rollout, then one undrain, in a later
    boot (the upgrade rebooted in between) - also on lab3, whose upgrade regressed and rolled back."""
    for name in ("lab1", "lab2", "lab3"):
        lines = [line.split() for line in hook_log(name)]
        assert [line[0] for line in lines] == ["drain", "undrain"], (name, lines)
        assert lines[0][1:] == [rollout["boots_before"][name], OLD], (name, lines)
        assert lines[1][1] != rollout["boots_before"][name], (name, lines)
        assert lines[1][2] == (OLD if name == "lab3" else NEW), (name, lines)


def test_rollout_two_pass_one_regresses_and_rolls_back(rollout):
    out = rollout["out"]
    assert rollout["rc"] != 0, "the rollout must fail: lab3 regressed"
    recs = records(rollout["report"])
    assert set(recs) == {"lab1", "lab2", "lab3"}, out[-6000:]
    for name in ("lab1", "lab2"):
        rec = recs[name]
        assert rec["decision"] == "pass", (name, rec["reason"], out[-6000:])
        assert rec["final_kernel"] == NEW and rec["default_kernel"] == NEW
        assert lab_ssh(name, "uname -r").strip() == NEW
        env = grubenv(name)
        assert NEW in env.get("saved_entry", "") and not env.get("next_entry")
        assert f"linux-image-{NEW}" in held(name)
        assert serving(name)
    rec = recs["lab3"]
    assert rec["decision"] == "regression", (rec["reason"], out[-6000:])
    assert rec["gate"]["ratio"] < 0.4 and rec["gate"]["p_value"] <= 0.01
    assert rec["final_kernel"] == OLD and rec["default_kernel"] == OLD
    assert rec["server_after_rollback"] == "serving"
    assert lab_ssh("lab3", "uname -r").strip() == OLD
    env = grubenv("lab3")
    assert OLD in env.get("saved_entry", "") and not env.get("next_entry")
    assert f"linux-image-{OLD}" in held("lab3")
    assert serving("lab3")
    assert lab_ssh("lab3", f"systemctl is-active {HOG} || true").strip() != "active"
    fleet = json.loads((rollout["report"] / "fleet.json").read_text())
    assert [h["decision"] for h in fleet["hosts"]] == ["pass", "pass", "regression"]
    assert fleet["failed"] == ["lab3"]
    md = (rollout["report"] / "fleet.md").read_text()
    assert "| lab3 | **regression** |" in md
    for name, rec in recs.items():
        print(f"{name}: {rec['decision']} ratio {rec['gate'].get('ratio')} p {rec['gate'].get('p_value')} "
              f"baseline {rec['gate'].get('baseline', {}).get('median')} candidate {rec['gate'].get('candidate', {}).get('median')} "
              f"timings {rec['timings']}")


def test_failed_boot_falls_back_by_itself(rollout, settings_file, work):
    """lab3 has 6.1.0-56 installed but not default; its entries are broken on purpose."""
    broken = ("sed -i -E '/vmlinuz-" + NEW + "/ s#root=UUID=[^ ]+#root=UUID=00000000-0000-4000-8000-000000000000 "
              "rootdelay=3 panic=5#' /boot/grub/grub.cfg && grep -c 'panic=5' /boot/grub/grub.cfg")
    assert int(lab_ssh("lab3", broken).strip()) >= 2
    report = work / "failed_boot"
    t0 = time.time()
    r = ansible_playbook(REPO / "playbooks" / "kernel_upgrade.yml", "-e", f"@{settings_file}", "--limit", "lab3",
                         "-e", f"kernel_upgrade_fleet_report_dir={report}", "-e", "kernel_upgrade_verify_pcie=false",
                         # no update-grub in this run: it would rewrite the broken entries
                         "-e", "kernel_upgrade_panic_timeout=0",
                         timeout=3600)
    took = time.time() - t0
    print(f"failed-boot run: {took:.0f} s")
    (work / "failed_boot.log").write_text(r.stdout)
    try:
        assert r.returncode != 0
        rec = records(report)["lab3"]
        assert rec["decision"] == "failed_boot", (rec["reason"], r.stdout[-6000:])
        assert rec["final_kernel"] == OLD and rec["default_kernel"] == OLD
        assert lab_ssh("lab3", "uname -r").strip() == OLD
        env = grubenv("lab3")
        assert OLD in env.get("saved_entry", "") and not env.get("next_entry")
        assert f"linux-image-{OLD}" in held("lab3")
        assert serving("lab3")
        serial = (REPO / ".lab" / "lab3.serial.log").read_text(errors="replace")
        assert "Rebooting automatically due to panic= boot argument" in serial or "Gave up waiting for root" in serial
    finally:
        lab_ssh("lab3", "update-grub >/dev/null 2>&1; true", timeout=600)

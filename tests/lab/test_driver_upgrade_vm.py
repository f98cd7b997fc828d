"""The NVIDIA driver upgrade's steps on a lab VM, with the stand-in driver of the lab's offline repository
(tests/lab/dkms/build-standin-debs: a real DKMS kernel module, gpufleet_nvidia, versions 1.0-1.3), each checked on the
host over SSH:

* **hold**: `playbooks/driver_upgrade.yml` (preflight only) holds the stand-in's packages (`apt-mark showhold`) and
  writes unattended-upgrades' blacklist of them;
* **refused while a process holds the GPU, and gone back**: an upgrade to 1.1 activated by a module reload while a
  process has `/dev/gpufleet_nvidia0` open: the candidate is installed, the reload is refused naming the process,
  which is never killed, and the role reinstalls 1.0, which still runs (its module never left), and holds it again;
* **kept**: the same upgrade with nothing holding the GPU: the modules are reloaded, 1.1 is loaded (its /proc file and
  modinfo), its packages are 1.1 and still held, and the verify passed;
* **refused before any change**: 1.3, whose module does not compile for the running kernel: the preflight fails with
  the compiler's and DKMS's lines, and nothing changed (packages, DKMS tree, /usr/src, loaded module, no private tree
  left in /var/tmp).

The serving verdict, through `playbooks/driver_upgrade.yml` in gated mode (the shared change flow on the fleet skeleton:
the host lease, the record, the fleet report, the history), with the lab server running as a systemd unit that reads
the stand-in's user space (`--gpu-runtime`) and holds `/dev/gpufleet_nvidia0` open, as a CUDA process holds the GPU,
so that the reload stops and restarts it (driver_upgrade_stop_services):

* **gated, kept**: 1.0 -> 1.1 (as fast): the baseline on 1.0, the candidate installed, the server stopped, the modules
  reloaded, the server restarted on 1.1 and measured, the verdict `pass`; checked on the VM: 1.1 loaded, its packages
  held, the journal archived as committed, the server running again (a new process) on runtime 1.1, the lease gone;
  on the controller: the host's record, fleet.json and fleet.md, the verdict in the history;
* **gated, rolled back**: 1.1 -> 1.2 (40 ms more per engine step): the verdict `regression` (the throughput part
  says no), 1.1's packages reinstalled and reloaded; checked on the VM: 1.1 loaded and held, the journal archived as
  rolled back, the server serving on runtime 1.1 again; on the controller: the record, the fleet report and the
  history entry of the regression.

One VM, no reboot (module reloads). The steps: 4 passed in 539 s under TCG on 2026-12-04; the gated tests: 2 passed
in 747 s (1.1 kept at 0.79 of the baseline's tok/s, 1.2 rolled back at 0.113), 2026-12-04. Run alone:
  . scripts/lib.sh; gpufleet_env; GPUFLEET_LAB_BASE_PORT=2741 flock /work/lab.lock python -m pytest -m e2e -v -s \
      tests/lab/test_driver_upgrade_vm.py
(the gated tests alone: -k gated; they put 1.0 back first when an earlier test of the module left 1.1 loaded)
"""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from tests.lab.labutil import (INVENTORY_DIR, LAB_DIR, REPO, ansible_env, lab_ssh, one_vm, play_recap, run)

pytestmark = [pytest.mark.vmlab, pytest.mark.e2e]

VM = "lab1"
WORK = LAB_DIR / "driver_upgrade_vm"
UTILS, DKMS = "gpufleet-nvidia-standin-utils", "gpufleet-nvidia-standin-dkms"
VERSION_FILE = "/proc/driver/gpufleet_nvidia/version"
STANDIN = {"driver_upgrade_packages": [UTILS, DKMS], "driver_upgrade_kernel_module": "gpufleet_nvidia",
           "driver_upgrade_modules": ["gpufleet_nvidia"], "driver_upgrade_version_file": VERSION_FILE,
           "driver_upgrade_device_prefix": "/dev/gpufleet_nvidia", "driver_upgrade_stop_services": [],
           "driver_upgrade_include_nvml": "never", "driver_upgrade_gpu_vendor": "0x1af4"}
HOLDER = "gpufleet-lab-gpu-holder"


def playbook(*extra: str, **variables):
    r = run([REPO / ".venv" / "bin" / "ansible-playbook", "-i", INVENTORY_DIR, "playbooks/driver_upgrade.yml",
             "--limit", VM, "-e", json.dumps(dict(STANDIN, **variables)), *extra], timeout=1800, env=ansible_env())
    (WORK / f"driver_upgrade-{int(time.time())}.log").write_text(r.stdout + "\n" + r.stderr)
    return r


def recap(r) -> dict:
    return play_recap(r.stdout).get(VM, {})


def host() -> dict:
    """The stand-in driver as the host says it, over SSH."""
    out = lab_ssh(VM, f"cat {VERSION_FILE} 2>/dev/null | head -1; echo '#'; modinfo -F version gpufleet_nvidia; echo '#'; "
                      f"dpkg-query -W -f '${{Package}}=${{Version}}\\n' {UTILS} {DKMS}; echo '#'; apt-mark showhold; "
                      "echo '#'; dkms status; echo '#'; ls /usr/src; echo '#'; ls /var/tmp")
    proc, modinfo, pkgs, held, dkms, src, tmp = (part.strip() for part in out.split("#"))
    return {"loaded": proc.split("Module")[1].split()[0] if "Module" in proc else None, "modinfo": modinfo,
            "packages": dict(line.split("=", 1) for line in pkgs.splitlines()), "held": held.split(),
            "dkms": dkms.splitlines(), "src": src.split(), "tmp": tmp.split()}


@pytest.fixture(scope="module")
def vm():
    """lab1 alone with the stand-in driver 1.0 installed (DKMS builds it) and loaded; powered off at the end."""
    with one_vm(WORK):
        lab_ssh(VM, f"apt-get install -y -q --no-install-recommends {UTILS}=1.0 {DKMS}=1.0 && modprobe gpufleet_nvidia",
                timeout=900)
        assert host()["loaded"] == "1.0"
        yield VM


def test_the_preflight_holds_the_driver_and_reads_it(vm):
    r = playbook(driver_upgrade_version="1.1")
    assert r.returncode == 0 and recap(r).get("failed") == 0, r.stdout[-6000:]
    h = host()
    assert sorted(h["held"]) == [DKMS, UTILS], h
    dropin = lab_ssh(VM, "cat /etc/apt/apt.conf.d/51gpufleet-driver-lock")
    assert f'"^{DKMS}$";' in dropin and f'"^{UTILS}$";' in dropin
    assert h["packages"] == {UTILS: "1.0", DKMS: "1.0"} and h["loaded"] == "1.0"
    assert not [t for t in h["tmp"] if t.startswith("gpufleet-driver-preflight")]  # the trial build's tree is gone


def test_a_reload_while_a_process_holds_the_gpu_is_refused_and_the_old_driver_comes_back(vm):
    lab_ssh(VM, f"systemd-run --unit {HOLDER} --property=StandardInput=file:/dev/gpufleet_nvidia0 sleep 3600")
    pid = lab_ssh(VM, f"systemctl show -P MainPID {HOLDER}").strip()
    try:
        r = playbook(driver_upgrade_version="1.1", driver_upgrade_action="upgrade", driver_upgrade_activate="reload")
        assert r.returncode != 0 and recap(r).get("failed") == 1, r.stdout[-6000:]
        assert f"pid {pid} (sleep, {HOLDER}.service) has /dev/gpufleet_nvidia0 open" in r.stdout, r.stdout[-6000:]
        assert "driver 1.1 was rolled back to 1.0" in r.stdout
        h = host()
        assert h["loaded"] == "1.0" and h["modinfo"] == "1.0" and h["packages"] == {UTILS: "1.0", DKMS: "1.0"}, h
        assert sorted(h["held"]) == [DKMS, UTILS]
        assert lab_ssh(VM, f"systemctl is-active {HOLDER}; systemctl show -P MainPID {HOLDER}").split() == ["active", pid]
    finally:
        lab_ssh(VM, f"systemctl stop {HOLDER} || true")


def test_an_upgrade_with_nothing_holding_the_gpu_is_reloaded_verified_and_kept(vm):
    r = playbook(driver_upgrade_version="1.1", driver_upgrade_action="upgrade", driver_upgrade_activate="reload")
    assert r.returncode == 0 and recap(r).get("failed") == 0, r.stdout[-6000:]
    h = host()
    assert h["loaded"] == "1.1" and h["modinfo"] == "1.1" and h["packages"] == {UTILS: "1.1", DKMS: "1.1"}, h
    assert sorted(h["held"]) == [DKMS, UTILS]
    assert "gpufleet-nvidia/1.1, " in "\n".join(h["dkms"]) and "installed" in "\n".join(h["dkms"])
    assert lab_ssh(VM, "dmesg | grep -c 'gpufleet stand-in Kernel Module  1.1'").strip() != "0"


def test_a_candidate_whose_module_does_not_build_is_refused_before_any_change(vm):
    before = host()
    r = playbook(driver_upgrade_version="1.3", driver_upgrade_action="upgrade", driver_upgrade_activate="reload")
    assert r.returncode != 0 and recap(r).get("failed") == 1, r.stdout[-6000:]
    out = r.stdout
    assert "preflight failed, nothing was changed" in out, out[-6000:]
    assert "gpufleet-nvidia/1.3 does not build for the running kernel 6.1.0-50-cloud-amd64" in out
    assert "implicit declaration of function" in out and "gpufleet_kernel_api_from_a_newer_release" in out
    assert "Bad return status for module build" in out or "Error 2" in out
    after = host()
    assert after == before, (before, after)  # packages, loaded module, holds, DKMS tree, /usr/src, /var/tmp
    assert "gpufleet-nvidia-1.3" not in after["src"] and not any("1.3" in line for line in after["dkms"])


# ---- the gated mode: the serving verdict through the change flow, on the fleet skeleton ----------------------------
SERVER = "/opt/gpufleet/lab/lab_inference_server.py"
RUNTIME = "/usr/lib/gpufleet-nvidia-standin/runtime.json"
UNIT = "gpufleet-lab-gpu-server.service"
JOURNAL_DIR = "/var/lib/gpufleet/driver_upgrade"
# The lab server as a GPU process: it reads the stand-in's user space at start (it refuses a module of another version,
# and takes the version's per-step cost) and holds the stand-in's device open on its stdin while it runs.
UNIT_FILE = f"""[Unit]
Description=gpufleet VM lab: the lab inference server on the stand-in GPU driver (tests/lab/test_driver_upgrade_vm.py)

[Service]
ExecStart=/usr/bin/python3 {SERVER} --model /srv/models/lab --served-model-name lab --host 127.0.0.1 --port 8000 \
    --max-num-seqs 16 --max-model-len 1024 --work 4 --step-work 32 --prefill-work 1 --gpu-runtime {RUNTIME}
StandardInput=file:/dev/gpufleet_nvidia0
StandardOutput=journal
StandardError=journal
"""
# The benchmark at concurrency 1, where 1.2's 40 ms per engine step weighs most against the emulated VM's own cost per
# step; a wide throughput margin for TCG's noise (as the kernel's lab tests), latency left unjudged (TCG's TTFT/TPOT
# vary by 60-90% run to run), the outputs on short prompts only.
GATED = {
    "driver_upgrade_action": "gated", "driver_upgrade_activate": "reload", "driver_upgrade_stop_services": [UNIT],
    "driver_upgrade_serial": [1], "driver_upgrade_gate_threshold": 0.5,
    "driver_upgrade_gate_latency_margins": {"ttft_p50": None, "ttft_p90": None, "tpot_p50": None, "tpot_p90": None},
    "driver_upgrade_outputs_prompt_lengths": ["short"], "driver_upgrade_outputs_max_tokens": 8,
    "driver_upgrade_ready_timeout": 300,
    "inference_benchmark_url": "http://127.0.0.1:8000", "inference_benchmark_model": "lab",
    "inference_benchmark_prompt_tokens": 16, "inference_benchmark_output_tokens": 16,
    "inference_benchmark_concurrency": [1], "inference_benchmark_requests": 12, "inference_benchmark_warmup": 2,
    "inference_benchmark_settle_runs": 0, "inference_benchmark_timeout": 120,
}


def serving() -> bool:
    return '"lab"' in lab_ssh(VM, "python3 -c \"import urllib.request;print(urllib.request.urlopen("
                                  "'http://127.0.0.1:8000/v1/models', timeout=20).read().decode())\"")


def server_state() -> dict:
    """The server unit's state, its process and the GPU runtime it last said it started on (its journal)."""
    out = lab_ssh(VM, f"systemctl is-active {UNIT} || true; systemctl show -P MainPID {UNIT}; "
                      f"journalctl -u {UNIT} --no-pager -q -o cat | grep 'GPU runtime' | tail -1")
    active, pid, runtime = (out.splitlines() + ["", "", ""])[:3]
    return {"active": active.strip(), "pid": pid.strip(), "runtime": runtime.strip()}


def wait_serving(timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if serving():
                return
        except AssertionError:
            pass
        time.sleep(3)
    raise AssertionError(f"the lab server did not serve within {timeout} s: {server_state()}")


def archived(version: str) -> dict:
    """The newest archived journal of the upgrade to ``version``."""
    name = lab_ssh(VM, f"ls -t {JOURNAL_DIR}/history/ | grep -- '-{version}.json$' | head -1").strip()
    assert name, f"no archived journal of {version}: {lab_ssh(VM, f'ls -l {JOURNAL_DIR}/history/')}"
    return json.loads(lab_ssh(VM, f"cat {JOURNAL_DIR}/history/{name}"))


def verdicts(history) -> list:
    with sqlite3.connect(history) as db:
        return db.execute("SELECT host, source, verdict, stage FROM verdicts ORDER BY id").fetchall()


@pytest.fixture(scope="module")
def gpu_server(vm):
    """The lab server running as a GPU process on driver 1.0 (put back first when a test above left 1.1 loaded)."""
    if host()["loaded"] != "1.0":
        lab_ssh(VM, f"apt-get install -y -q --no-install-recommends --allow-downgrades --allow-change-held-packages "
                    f"{UTILS}=1.0 {DKMS}=1.0 && apt-mark hold {UTILS} {DKMS} && modprobe -r gpufleet_nvidia && "
                    "modprobe gpufleet_nvidia", timeout=900)
    lab_ssh(VM, f"mkdir -p /opt/gpufleet/lab /srv/models/lab && cat > {SERVER}",
            stdin=(REPO / "extras" / "lab_inference_server.py").read_text())
    lab_ssh(VM, f"cat > /etc/systemd/system/{UNIT} && systemctl daemon-reload && systemctl restart {UNIT}", stdin=UNIT_FILE)
    wait_serving()
    state = server_state()
    assert host()["loaded"] == "1.0" and state["active"] == "active" and "GPU runtime 1.0 " in state["runtime"], state
    holders = lab_ssh(VM, "ls -l /proc/[0-9]*/fd/ 2>/dev/null | grep -c gpufleet_nvidia0 || true").strip()
    assert holders != "0", "the server must hold the stand-in's device"
    yield state


def gated(version: str):
    report = WORK / f"report-{version}"
    t0 = time.time()
    r = playbook(driver_upgrade_version=version, driver_upgrade_fleet_report_dir=str(report),
                 gpufleet_history_db=str(WORK / "history.sqlite"), **GATED)
    seconds = time.time() - t0
    record_path = report / "hosts" / f"{VM}.json"
    assert record_path.exists(), f"no record on the controller:\n{r.stdout[-8000:]}"
    rec = json.loads(record_path.read_text())
    gate = rec.get("gate") or {}
    print(f"FIGURE driver_upgrade gated {rec['old']} -> {version}: {rec['decision']} in {seconds:.0f} s; gate ratio "
          f"{gate.get('ratio')}, interval {gate.get('interval') or gate.get('ci')}, baseline {gate.get('baseline')}, "
          f"candidate {gate.get('candidate')}")
    print(json.dumps({k: {"says": p.get("says"), "reason": p.get("reason")} for k, p in
                      (rec.get("verdict") or {}).get("parts", {}).items()}, indent=1))
    return r, report, rec


def test_gated_a_candidate_as_fast_is_kept_by_the_serving_verdict(gpu_server):
    r, report, rec = gated("1.1")
    assert r.returncode == 0 and recap(r).get("failed") == 0, r.stdout[-8000:]
    assert rec["decision"] == "pass" and rec["ok"] is True and rec["kind"] == "driver", rec["reason"]
    assert rec["old"] == "1.0" and rec["final_version"] == "1.1" and rec["stage"] == "committed", rec
    assert rec["verdict"]["parts"]["throughput"]["says"] == "yes" and rec["serving_verdict"]["verdict"] == "pass"
    # on the VM: 1.1 loaded and held, the journal archived as committed, the server restarted on runtime 1.1
    h = host()
    assert h["loaded"] == "1.1" and h["modinfo"] == "1.1" and h["packages"] == {UTILS: "1.1", DKMS: "1.1"}, h
    assert sorted(h["held"]) == [DKMS, UTILS], h
    assert all(f'"^{p}$";' in lab_ssh(VM, "cat /etc/apt/apt.conf.d/51gpufleet-driver-lock") for p in (DKMS, UTILS))
    assert lab_ssh(VM, f"test -e {JOURNAL_DIR}/journal.json && echo open || echo none").strip() == "none"
    done = archived("1.1")
    assert done["stage"] == "committed" and done["old"] == "1.0", done.get("stage")
    state = server_state()
    assert state["active"] == "active" and state["pid"] != gpu_server["pid"] and "GPU runtime 1.1 " in state["runtime"]
    assert serving()
    assert lab_ssh(VM, "test -e /var/lib/gpufleet/lease.json && echo held || echo released").strip() == "released"
    assert lab_ssh(VM, f"ls {JOURNAL_DIR}/records/ | grep -c '^1.1-'").strip() == "1"
    # on the controller: the fleet report and the verdict in the history
    fleet = json.loads((report / "fleet.json").read_text())
    assert [(h["host"], h["decision"]) for h in fleet["hosts"]] == [(VM, "pass")] and fleet["kinds"] == ["driver"]
    md = (report / "fleet.md").read_text()
    assert md.startswith("# Driver rollout ") and f"| {VM} | **pass** | 1.0 -> 1.1 | 1.1 |" in md, md
    assert verdicts(WORK / "history.sqlite")[-1][:3] == (VM, "driver_upgrade", "pass")


def test_gated_a_slower_candidate_is_rolled_back_by_the_serving_verdict(gpu_server):
    before = server_state()
    r, report, rec = gated("1.2")
    assert r.returncode != 0 and recap(r).get("failed") == 1, r.stdout[-8000:]
    assert rec["decision"] == "regression" and rec["old"] == "1.1", (rec["reason"], r.stdout[-8000:])
    assert rec["verdict"]["parts"]["throughput"]["says"] == "no" and rec["serving_verdict"]["verdict"] == "regression"
    assert rec["stage"] == "rolled_back" and rec["server_after_rollback"] == "ready", rec
    # on the VM: 1.1 back, loaded and held, the journal archived as rolled back, the server on runtime 1.1 again
    h = host()
    assert h["loaded"] == "1.1" and h["modinfo"] == "1.1" and h["packages"] == {UTILS: "1.1", DKMS: "1.1"}, h
    # both held again after the reinstall (apt clears the hold of what it installs by name; the first run of this test
    # found the user space left unheld: the flow held only the names of its patterns, now every package it names)
    assert sorted(h["held"]) == [DKMS, UTILS], h
    assert all(f'"^{p}$";' in lab_ssh(VM, "cat /etc/apt/apt.conf.d/51gpufleet-driver-lock") for p in (DKMS, UTILS))
    assert archived("1.2")["stage"] == "rolled_back"
    state = server_state()
    assert state["active"] == "active" and state["pid"] != before["pid"] and "GPU runtime 1.1 " in state["runtime"]
    assert serving()
    assert lab_ssh(VM, "test -e /var/lib/gpufleet/lease.json && echo held || echo released").strip() == "released"
    fleet = json.loads((report / "fleet.json").read_text())
    assert [(h["host"], h["decision"]) for h in fleet["hosts"]] == [(VM, "regression")] and fleet["failed"] == [VM]
    md = (report / "fleet.md").read_text()
    assert f"| {VM} | **regression** | 1.1 -> 1.2 | 1.1 |" in md and "Server after the rollback: ready." in md, md
    assert verdicts(WORK / "history.sqlite")[-1][:3] == (VM, "driver_upgrade", "regression")

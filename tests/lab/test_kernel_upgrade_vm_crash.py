"""Crash safety of the kernel upgrade, for real, in the VM lab. Each test first puts the hosts it uses
back on 6.1.0-50 (saved default, rebooted if needed, no journal, lease or boot-health unit), so the
tests run alone (`-k`), in any subset, or as one session after test_kernel_upgrade_vm.py (which
leaves lab1 and lab2 on 6.1.0-56 and lab3 on 6.1.0-50 with 6.1.0-56 installed):

* the controller (ansible-playbook and every process of its session) is killed with SIGKILL (a)
  after the install, before the one-shot boot (lab1), (b) after the one-shot boot, before the
  verdict (lab2), (c) after lab3's regression verdict, before its rollback reboot; a plain re-run
  takes over the dead run's lease and ends each host correctly: (a) and (b) pass against the
  ORIGINAL baseline (the journal's samples, measured once: the re-run measures no baseline), (c)
  rolls back; final kernel, GRUB default, holds and journal (history) are asserted;
* lab1 drops the controller's SSH only under the candidate kernel (a unit with
  ConditionKernelVersion stops sshd): the host returns to 6.1.0-50 by itself within the commit
  timeout (its boot-health unit), and a plain re-run records `reverted`;
* two rollouts at once on lab2: the second is refused, names the first, and changes nothing;
* a second client loading lab2's server during the baseline: the answer is `inconclusive`
  (contaminated), not `pass`, and nothing was changed;
* the real DKMS module of tests/lab/dkms, built for 6.1.0-50 and loaded, made unbuildable for the
  target on lab3: the install (kernel and headers) fails in DKMS's kernel hook and the post-install
  checks find no module, so lab3 stops before its reboot with the reason.

Every test appends its figures (wall times, the gate's verdicts) to .lab/kernel_upgrade_crash_figures.jsonl.
Run (one session, or pick parts with -k):
    . scripts/lib.sh; gpufleet_env; flock /work/lab.lock python -m pytest -m e2e -x -v tests/lab/test_kernel_upgrade_vm_crash.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.lab.labutil import (INVENTORY_DIR, LAB_DIR, REPO, ansible_env, boot_id, lab_ssh, play_recap, record_figure,
                               ssh_try)
from tests.lab.test_kernel_upgrade_vm import HOG, NEW, OLD, SETTINGS, SETUP, ansible_playbook, grubenv, held, serving

pytestmark = [pytest.mark.vmlab, pytest.mark.lab_kernel, pytest.mark.e2e]

STATE = "/var/lib/gpufleet/kernel_upgrade"
JOURNAL = f"{STATE}/journal.json"
HISTORY = f"{STATE}/history"
HEALTH_RESULT = f"{STATE}/boot-health.json"
LEASE = "/var/lib/gpufleet/lease.json"
SSH_BLOCK = "gpufleet-lab-no-ssh.service"
LOAD_UNIT = "gpufleet-lab-load"
FIGURES = LAB_DIR / "kernel_upgrade_crash_figures.jsonl"
CONTROLLERS: list[subprocess.Popen] = []  # every ansible-playbook this module started (each in its own session)
DKMS_SRC = REPO / "tests" / "lab" / "dkms" / "gpufleet_lab"
# The server's own in-flight count (what the benchmark's load monitor reads), run on the host.
IN_FLIGHT = r"""
import re, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:8000/metrics", timeout=20).read().decode()
print(sum(float(v) for v in re.findall(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? (\S+)", text, re.M)))
"""
BENCH_TASK = "Benchmark the inference server ({label})"  # roles/kernel_upgrade/tasks/benchmark.yml


def figure(test: str, **values) -> None:
    """One line of this module's figures, printed and kept in .lab/ (labutil.record_figure)."""
    record_figure(FIGURES, test, **values)


def journal(name: str) -> dict | None:
    out = lab_ssh(name, f"cat {JOURNAL} 2>/dev/null || true").strip()
    return json.loads(out) if out else None


def last_history(name: str) -> dict:
    return json.loads(lab_ssh(name, f"ls -t {HISTORY}/*.json | head -1 | xargs cat"))


def wait_for(name: str, cond, timeout: float, what: str, interval: float = 5.0) -> float:
    """Seconds until cond() held; AssertionError after timeout."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if cond():
                return time.monotonic() - t0
        except (AssertionError, subprocess.TimeoutExpired, ValueError):
            pass
        time.sleep(interval)
    raise AssertionError(f"{name}: not {what} within {timeout} s")


def in_flight(name: str) -> float:
    return float(lab_ssh(name, "python3 -", stdin=IN_FLIGHT).strip())


def settle(name: str, timeout: float = 1200) -> float:
    """Wait until the host has booted (systemd running or degraded), its server answers with no request
    in flight, and it stays on the same boot for 15 s: a controller killed just after it asked for a
    reboot leaves one coming, and one killed during a benchmark leaves the host's benchmark module
    running to its end (it would load the re-run's first runs)."""
    def up() -> str | None:
        out = ssh_try(name, "systemctl is-system-running --wait 2>/dev/null; cat /proc/sys/kernel/random/boot_id", 200)
        lines = (out or "").split()
        ok = len(lines) == 2 and lines[0] in ("running", "degraded") and serving(name) and in_flight(name) == 0
        return lines[1] if ok else None

    def stable() -> bool:
        first = up()
        time.sleep(15)
        return first is not None and up() == first

    return wait_for(name, stable, timeout, "booted, serving and on one boot", interval=3)


def _back_to_old(name: str) -> None:
    script = f"""set -e
systemctl disable --now gpufleet-boot-health.timer >/dev/null 2>&1 || true
systemctl stop {LOAD_UNIT} >/dev/null 2>&1 || true
systemctl reset-failed {LOAD_UNIT} >/dev/null 2>&1 || true
rm -f {JOURNAL} {LEASE} {HEALTH_RESULT} /etc/gpufleet/boot-health.json /etc/systemd/system/gpufleet-boot-health.* \
      /etc/systemd/system/timers.target.wants/gpufleet-boot-health.timer
systemctl daemon-reload
sub=$(grep -o "gnulinux-advanced-[0-9a-f-]*" /boot/grub/grub.cfg | head -1)
entry=$(grep -o "gnulinux-{OLD}-advanced-[0-9a-f-]*" /boot/grub/grub.cfg | head -1)
grub-set-default "$sub>$entry"
grub-editenv /boot/grub/grubenv unset next_entry
"""
    lab_ssh(name, script)
    if lab_ssh(name, "uname -r").strip() != OLD:
        before = boot_id(name)
        ssh_try(name, "systemctl reboot", 30)
        wait_for(name, lambda: (ssh_try(name, "cat /proc/sys/kernel/random/boot_id", 20) or before).strip() != before,
                 1200, "rebooted")
    settle(name)
    assert lab_ssh(name, "uname -r").strip() == OLD and OLD in grubenv(name).get("saved_entry", "")


def back_to_old(*names: str) -> None:
    """The old kernel as the saved default and running, nothing of an earlier upgrade left (journal,
    lease, boot-health unit and result); the hosts in parallel."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(names)) as ex:
        for fut in [ex.submit(_back_to_old, n) for n in names]:
            fut.result()
    print(f"back on {OLD}: {', '.join(names)} in {time.monotonic() - t0:.0f} s")


def rollout_popen(work: Path, tag: str, limit: str, *extra: str) -> tuple[subprocess.Popen, Path]:
    """playbooks/kernel_upgrade.yml in a session of its own (so that a kill takes every process of the
    controller: ansible-playbook, its forks and their ssh); log work/<tag>.log, report work/<tag>/."""
    log = work / f"{tag}.log"
    report = work / tag
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(INVENTORY_DIR),
             str(REPO / "playbooks" / "kernel_upgrade.yml"), "-e", f"@{work / 'settings.json'}",
             "-e", f"kernel_upgrade_fleet_report_dir={report}", "--limit", limit, *extra],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, env=ansible_env(),
            start_new_session=True)
    CONTROLLERS.append(proc)
    return proc, report


def kill_controller(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def kill_when(proc: subprocess.Popen, name: str, cond, timeout: float, log: Path) -> dict:
    """SIGKILL the controller as soon as cond(journal) holds on the host (polled over SSH); the journal
    seen then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            j = journal(name)
            if cond(j):
                kill_controller(proc)
                return j
        except (AssertionError, subprocess.TimeoutExpired, ValueError):
            pass
        time.sleep(1.0)
    rc = proc.poll()
    kill_controller(proc)
    raise AssertionError(f"{name}: the kill point was not reached (playbook rc {rc}):\n{log.read_text()[-6000:]}")


def wait_controller(proc: subprocess.Popen, timeout: float) -> int:
    """The run's exit status; a run past its timeout is killed (no controller is left behind)."""
    try:
        return proc.wait(timeout=timeout)
    except BaseException:  # a timeout, or the session interrupted (timeout -s INT): no controller is left behind
        kill_controller(proc)
        raise


def records(report: Path) -> dict:
    return {p.stem: json.loads(p.read_text()) for p in (report / "hosts").glob("*.json")}


def rerun(work: Path, tag: str, limit: str, *extra: str, timeout: int = 3600) -> tuple[int, dict, str, float]:
    """A plain run to its end: rc, the host records, the log, the wall time."""
    t0 = time.monotonic()
    proc, report = rollout_popen(work, tag, limit, *extra)
    rc = wait_controller(proc, timeout)
    return rc, records(report), (work / f"{tag}.log").read_text(), time.monotonic() - t0


def assert_final(name: str, kernel: str) -> None:
    assert lab_ssh(name, "uname -r").strip() == kernel
    env = grubenv(name)
    assert kernel in env.get("saved_entry", "") and not env.get("next_entry"), env
    assert f"linux-image-{kernel}" in held(name)
    assert journal(name) is None, "the journal must be in the history once the upgrade ended"
    assert lab_ssh(name, "ls /etc/systemd/system/gpufleet-boot-health.timer 2>/dev/null || echo gone").strip() == "gone"
    assert serving(name)


def gate_figures(rec: dict) -> dict:
    gate = rec.get("gate") or {}
    return {"decision": rec.get("decision"), "ratio": gate.get("ratio"), "p_value": gate.get("p_value"),
            "baseline_median": (gate.get("baseline") or {}).get("median"),
            "candidate_median": (gate.get("candidate") or {}).get("median"), "total_s": (rec.get("timings") or {}).get("total_s")}


@pytest.fixture(autouse=True)
def no_controller_left():
    """A test that fails or is interrupted leaves no ansible-playbook of its own running (they run in
    sessions of their own, out of reach of the signals that stop pytest)."""
    yield
    for proc in CONTROLLERS:
        if proc.poll() is None:
            kill_controller(proc)
    CONTROLLERS.clear()


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kernel_upgrade_crash")
    (path / "settings.json").write_text(json.dumps(SETTINGS))
    return path


@pytest.fixture(scope="module")
def lab_servers(lab, work):
    """The lab inference server on every VM and lab3's regression unit, as test_kernel_upgrade_vm.py's
    setup makes them (run only where missing: after that module they are there already)."""
    def ready(name: str) -> bool:
        try:
            if not serving(name):  # lab_ssh fails (AssertionError) where nothing answers on port 8000
                return False
        except AssertionError:
            return False
        return name != "lab3" or lab_ssh(name, f"systemctl is-enabled {HOG} 2>/dev/null || true").strip() == "enabled"

    missing = [n for n in ("lab1", "lab2", "lab3") if not ready(n)]
    if missing:
        setup = work / "setup.yml"
        setup.write_text(SETUP)
        t0 = time.monotonic()
        r = ansible_playbook(setup, timeout=1800)
        (work / "setup.log").write_text(r.stdout)
        assert r.returncode == 0, f"setup failed:\n{r.stdout[-6000:]}"
        figure("setup", hosts=missing, wall_s=round(time.monotonic() - t0))
    for name in ("lab1", "lab2", "lab3"):
        assert ready(name), name


def test_a_killed_after_the_install_finishes_against_the_original_baseline(lab_servers, work):
    back_to_old("lab1")
    t0 = time.monotonic()
    proc, _report = rollout_popen(work, "kill_a", "lab1")
    seen = kill_when(proc, "lab1", lambda j: j is not None and j["stage"] == "boot_once", 3600, work / "kill_a.log")
    t_kill = time.monotonic() - t0
    # killed after the install: the one-shot boot may or may not have started; either way the re-run finishes it
    t_settle = settle("lab1")
    j = journal("lab1")
    assert j is not None and j["stage"] == "boot_once" and j["verdict"] is None, j
    baseline = j["baseline"]["samples"]
    assert baseline == seen["baseline"]["samples"] and len(baseline) == SETTINGS.get("kernel_upgrade_gate_min_runs", 5)
    rebooted = boot_id("lab1") != j["boot_id"]  # the kill may land before or after the reboot was asked for
    rc, recs, out, t_rerun = rerun(work, "rerun_a", "lab1")
    assert rc == 0, out[-6000:]
    rec = recs["lab1"]
    assert rec["decision"] == "pass" and rec["resumed"], rec
    assert rec["resumed"][0]["stage"] == "boot_once"
    assert BENCH_TASK.format(label="baseline") not in out, "the re-run must not measure a second baseline"
    assert rec["baseline"]["samples"] == baseline
    hist = last_history("lab1")
    assert hist["baseline"]["samples"] == baseline and hist["stage"] == "committed", hist["stage"]
    assert_final("lab1", NEW)
    figure("kill_a", killed_after_s=round(t_kill), reboot_started_before_the_kill=rebooted, settle_s=round(t_settle),
           rerun_s=round(t_rerun), **gate_figures(rec))


def test_b_killed_after_the_one_shot_boot_finishes_against_the_original_baseline(lab_servers, work):
    back_to_old("lab2")
    t0 = time.monotonic()
    proc, _report = rollout_popen(work, "kill_b", "lab2")
    kill_when(proc, "lab2", lambda j: j is not None and j["stage"] in ("booted", "candidate"), 3600, work / "kill_b.log")
    t_kill = time.monotonic() - t0
    t_settle = settle("lab2")
    assert lab_ssh("lab2", "uname -r").strip() == NEW
    j = journal("lab2")
    assert j is not None and j["stage"] in ("booted", "candidate") and j["verdict"] is None, j
    baseline = j["baseline"]["samples"]
    rc, recs, out, t_rerun = rerun(work, "rerun_b", "lab2")
    assert rc == 0, out[-6000:]
    rec = recs["lab2"]
    assert rec["decision"] == "pass" and rec["resumed"], rec
    assert BENCH_TASK.format(label="baseline") not in out, "the re-run must not measure a second baseline"
    assert rec["baseline"]["samples"] == baseline
    hist = last_history("lab2")
    assert hist["baseline"]["samples"] == baseline and hist["stage"] == "committed"
    assert_final("lab2", NEW)
    figure("kill_b", killed_after_s=round(t_kill), killed_at_stage=j["stage"], settle_s=round(t_settle),
           rerun_s=round(t_rerun), **gate_figures(rec))


def test_c_killed_after_a_regression_verdict_rolls_back_on_rerun(lab_servers, work):
    back_to_old("lab3")
    lab_ssh("lab3", f"systemctl enable {HOG}")
    t0 = time.monotonic()
    proc, _report = rollout_popen(work, "kill_c", "lab3")
    seen = kill_when(proc, "lab3", lambda j: j is not None and (j.get("verdict") or {}).get("decision") == "regression",
                     3600, work / "kill_c.log")
    t_kill = time.monotonic() - t0
    t_settle = settle("lab3")
    rc, recs, out, t_rerun = rerun(work, "rerun_c", "lab3")
    assert rc != 0
    rec = recs["lab3"]
    assert rec["decision"] == "regression", rec
    assert rec["resumed"] and rec["resumed"][0]["stage"] == "verdict", rec["resumed"]
    for label in ("baseline", "candidate"):
        assert BENCH_TASK.format(label=label) not in out, f"the re-run must execute the recorded verdict, not measure ({label})"
    hist = last_history("lab3")
    assert hist["stage"] == "rolled_back" and hist["verdict"]["decision"] == "regression"
    assert_final("lab3", OLD)
    assert lab_ssh("lab3", f"systemctl is-active {HOG} || true").strip() != "active"
    figure("kill_c", killed_after_s=round(t_kill), settle_s=round(t_settle), rerun_s=round(t_rerun),
           verdict=seen["verdict"]["reason"], **gate_figures(rec))


def test_a_host_the_controller_cannot_reach_returns_to_the_old_kernel_by_itself(lab_servers, work):
    back_to_old("lab1")
    unit = f"""[Unit]
Description=Lab: no SSH under {NEW} (the controller loses the host after the one-shot boot)
ConditionKernelVersion={NEW}
After=ssh.service

[Service]
Type=oneshot
ExecStart=/bin/systemctl stop ssh.service
ExecStart=-/bin/systemctl stop ssh.socket

[Install]
WantedBy=multi-user.target
"""
    lab_ssh("lab1", f"cat > /etc/systemd/system/{SSH_BLOCK} && systemctl daemon-reload && systemctl enable {SSH_BLOCK}",
            stdin=unit)
    try:
        t0 = time.monotonic()
        proc, _report = rollout_popen(work, "unreachable", "lab1", "-e", "kernel_upgrade_commit_timeout=300",
                                      "-e", "kernel_upgrade_reboot_timeout=240")
        rc = wait_controller(proc, 3600)
        t_run = time.monotonic() - t0
        assert rc != 0, (work / "unreachable.log").read_text()[-6000:]
        wait_for("lab1", lambda: (ssh_try("lab1", "uname -r", 20) or "").strip() == OLD, 1800, "back on the old kernel")
        t_back = time.monotonic() - t0
        settle("lab1")
        result = json.loads(lab_ssh("lab1", f"cat {HEALTH_RESULT}"))
        assert result["action"] == "revert" and result["target"] == NEW, result
        assert any("not committed" in r for r in result["reasons"]), result
        rc, recs, out, t_rerun = rerun(work, "rerun_unreachable", "lab1")
        rec = recs.get("lab1") or {}
        assert rc != 0 and rec.get("decision") == "reverted", (rec, out[-4000:])
        assert "returned to" in rec["reason"] and "not committed" in rec["reason"], rec["reason"]
        assert_final("lab1", OLD)
        figure("unreachable", playbook_s=round(t_run), back_on_old_s=round(t_back), rerun_s=round(t_rerun),
               health_reasons=result["reasons"], decision=rec["decision"])
    finally:
        ssh_try("lab1", f"systemctl disable {SSH_BLOCK}; rm -f /etc/systemd/system/{SSH_BLOCK}; systemctl daemon-reload")


def test_two_rollouts_at_once_the_second_is_refused_and_changes_nothing(lab_servers, work):
    back_to_old("lab2")
    # the first run's baseline lasts minutes (10x the requests), so the second comes while the first holds the host
    first, _report = rollout_popen(work, "first", "lab2", "-e", "inference_benchmark_requests=320")
    try:
        wait_for("lab2", lambda: lab_ssh("lab2", f"cat {LEASE} 2>/dev/null || true").strip() != "", 600, "leased", 2)
        lease = json.loads(lab_ssh("lab2", f"cat {LEASE}"))
        boot = boot_id("lab2")
        rc, recs, out, t_second = rerun(work, "second", "lab2", timeout=900)
        assert rc != 0
        assert f"held by run {lease['run_id']}" in out and "nothing was changed" in out, out[-4000:]
        assert "lab2" not in recs, "the refused run must not even start the role"
        recap = play_recap(out)["lab2"]
        assert recap["changed"] == 0 and recap["failed"] == 1, recap
        after = json.loads(lab_ssh("lab2", f"cat {LEASE}"))
        # the first run renews its lease as it goes; the second took nothing over
        assert (after["run_id"], after["taken_at"], after.get("pid")) == (lease["run_id"], lease["taken_at"], lease.get("pid"))
        current = journal("lab2")
        assert current is None or current["run_id"] == lease["run_id"]
        assert boot_id("lab2") == boot
        figure("two_rollouts", second_refused_in_s=round(t_second), first_stage_then=(current or {}).get("stage"),
               refusal=next((ln.strip() for ln in out.splitlines() if "held by run" in ln), "")[:400])
    finally:
        # the first run was a vehicle: stop it while nothing but the lock has changed (no journal, or the baseline)
        try:
            current = journal("lab2")
        except (AssertionError, subprocess.TimeoutExpired, ValueError):
            current = None
        if current is None or current["stage"] == "baseline":
            kill_controller(first)
        else:
            wait_controller(first, 3600)
    if first.returncode == -signal.SIGKILL:
        back_to_old("lab2")  # settles: waits until the killed run's baseline module on the host has ended
    else:
        assert_final("lab2", NEW)


def test_foreign_load_during_the_baseline_is_inconclusive_not_pass(lab_servers, work):
    back_to_old("lab2")
    load = ("import json, threading, urllib.request\n"
            "def go():\n"
            "    while True:\n"
            "        body = json.dumps({'model': 'lab', 'prompt': 'x', 'max_tokens': 64, 'ignore_eos': True}).encode()\n"
            "        req = urllib.request.Request('http://127.0.0.1:8000/v1/completions', body, {'Content-Type': 'application/json'})\n"
            "        try:\n"
            "            urllib.request.urlopen(req, timeout=120).read()\n"
            "        except OSError:\n"
            "            pass\n"
            "for _ in range(8):\n"
            "    threading.Thread(target=go, daemon=True).start()\n"
            "threading.Event().wait()\n")
    lab_ssh("lab2", f"cat > /run/{LOAD_UNIT}.py && systemd-run --unit {LOAD_UNIT} /usr/bin/python3 /run/{LOAD_UNIT}.py", stdin=load)
    try:
        t_loaded = wait_for("lab2", lambda: in_flight("lab2") > 4, 180,
                            "loaded by the second client (more than 4 requests in flight)", 3)
        boot = boot_id("lab2")
        rc, recs, out, t_run = rerun(work, "foreign_load", "lab2", timeout=1800)
        rec = recs["lab2"]
        assert rc != 0 and rec["decision"] == "inconclusive", rec
        assert "contaminated by foreign load" in rec["reason"] and "Drain the host" in rec["reason"], rec["reason"]
        assert "Pin the old kernel as the default" not in out and BENCH_TASK.format(label="candidate") not in out
        assert boot_id("lab2") == boot
        assert lab_ssh("lab2", "uname -r").strip() == OLD and OLD in grubenv("lab2").get("saved_entry", "")
        assert journal("lab2") is None
        hist = last_history("lab2")
        assert hist["stage"] == "stopped" and hist["baseline"]["contaminated"], hist
        figure("foreign_load", loaded_after_s=round(t_loaded), run_s=round(t_run), decision=rec["decision"], contaminated=hist["baseline"]["contaminated"],
               baseline_samples=hist["baseline"]["samples"])
    finally:
        ssh_try("lab2", f"systemctl stop {LOAD_UNIT}; systemctl reset-failed {LOAD_UNIT}; rm -f /run/{LOAD_UNIT}.py")


def test_a_dkms_module_that_cannot_build_for_the_target_stops_the_host_before_its_reboot(lab_servers, work):
    """The real DKMS module of tests/lab/dkms, built for the old kernel and loaded, made unbuildable for the
    target on lab3: the install of the target and its headers fails in DKMS's kernel hook, the
    post-install driver check finds no module, and lab3 stops before its reboot, with the reason."""
    assert lab_ssh("lab3", "command -v dkms >/dev/null && test -e /lib/modules/$(uname -r)/build/include && echo yes "
                           "|| echo no").strip() == "yes", "the lab image lacks dkms or the headers (tests/lab/build-image)"
    back_to_old("lab3")
    t0 = time.monotonic()
    for path in sorted(DKMS_SRC.iterdir()):
        lab_ssh("lab3", f"mkdir -p /usr/src/gpufleet_lab-1.0 && cat > /usr/src/gpufleet_lab-1.0/{path.name}",
                stdin=path.read_text())
    lab_ssh("lab3", f"(dkms status gpufleet_lab/1.0 | grep -q . || dkms add gpufleet_lab/1.0) && dkms install gpufleet_lab/1.0 "
                    f"-k {OLD} && modprobe gpufleet_lab && test -d /sys/module/gpufleet_lab", timeout=1200)
    t_dkms = time.monotonic() - t0
    lab_ssh("lab3", f"apt-get purge -y -qq --allow-change-held-packages 'linux-image-{NEW}' 'linux-headers-{NEW}' "
                    f"'linux-headers-{NEW.rsplit('-', 2)[0]}-common' >/dev/null 2>&1 || true; "
                    f"mkdir -p /etc/gpufleet-lab && touch /etc/gpufleet-lab/dkms-fail-{NEW}", timeout=1200)
    assert lab_ssh("lab3", f"test -e /boot/vmlinuz-{NEW} && echo installed || echo absent").strip() == "absent"
    boot = boot_id("lab3")
    try:
        rc, recs, out, t_run = rerun(work, "dkms_fails", "lab3", "-e", '{"kernel_upgrade_driver_modules": ["gpufleet_lab"]}')
        rec = recs.get("lab3") or {}
        assert rc != 0 and rec.get("decision") == "preflight_failed", (rec, out[-4000:])
        reason = rec["reason"]
        assert "after the install" in reason and "gpufleet_lab" in reason and "the install did not build one" in reason, reason
        assert boot_id("lab3") == boot, "lab3 must not have rebooted"
        assert lab_ssh("lab3", "uname -r").strip() == OLD and OLD in grubenv("lab3").get("saved_entry", "")
        assert not grubenv("lab3").get("next_entry")
        assert f"linux-headers-{NEW}" in lab_ssh("lab3", "dpkg-query -W -f '${Package}\\n' 'linux-headers-*'")
        make_log = lab_ssh("lab3", f"cat /var/lib/dkms/gpufleet_lab/1.0/{NEW}/x86_64/log/make.log "
                                   "/var/lib/dkms/gpufleet_lab/1.0/build/make.log 2>/dev/null || true")
        assert f"does not build for {NEW}" in make_log, make_log[-2000:]
        assert lab_ssh("lab3", "test -d /sys/module/gpufleet_lab && echo loaded").strip() == "loaded"
        hist = last_history("lab3")
        assert hist["stage"] == "rolled_back" and hist["verdict"]["decision"] == "preflight_failed"
        figure("dkms", dkms_build_old_s=round(t_dkms), run_s=round(t_run), decision=rec["decision"], reason=reason[:1500])
    finally:
        ssh_try("lab3", f"rm -f /etc/gpufleet-lab/dkms-fail-{NEW}; modprobe -r gpufleet_lab; "
                        "dkms remove gpufleet_lab/1.0 --all >/dev/null 2>&1; rm -rf /usr/src/gpufleet_lab-1.0; "
                        f"apt-get purge -y -qq --allow-change-held-packages 'linux-image-{NEW}' 'linux-headers-{NEW}' "
                        f"'linux-headers-{NEW.rsplit('-', 2)[0]}-common' >/dev/null 2>&1; dpkg --audit", timeout=1200)

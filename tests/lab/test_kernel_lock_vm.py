"""The kernel lock against unattended-upgrades' own dry run, for real, in a lab VM (issue 16).

The lab image installs the kernel meta-package as Debian does (`linux-image-cloud-amd64` at the version
that depends on the booted kernel) and unattended-upgrades; the image's offline repository (origin
`gpufleet-lab`) holds the meta-package's bookworm-security update, which depends on another kernel ABI
(tests/lab/build-image). That is how a kernel arrives unasked on a Debian GPU host: unattended-upgrades
takes the meta-package's security update and the new kernel with it, and the next reboot boots it,
with no benchmark gate. Here, on lab1:

* unlocked, `unattended-upgrade --dry-run --debug` (allowed to take the lab repository's origin, as the
  stock configuration takes Debian-Security) would upgrade the meta-package: the threat is real;
* `playbooks/kernel_upgrade.yml` without `kernel_upgrade_reboot_ok` (a plan-only run) locks the host:
  `apt-mark hold` on the running kernel's image and the meta-package, and the Package-Blacklist drop-in;
* locked, the same dry run upgrades nothing; each half of the lock alone (the blacklist without the holds,
  the holds without the blacklist) is dry-run too, and what unattended-upgrades does with each is printed
  and recorded (the blacklist must hold on its own: it is what the issue asks for beside the holds).

The VM is put back as it was (holds, drop-ins, journal history) whatever happens. A few minutes under
TCG; marker vmlab: part of the CI run's VM lab session.
Run alone: . scripts/lib.sh; gpufleet_env; flock /work/lab.lock python -m pytest -m vmlab -v tests/lab/test_kernel_lock_vm.py
"""

from __future__ import annotations

import json
import re
import shlex
import time

import pytest

from tests.lab.labutil import LAB_DIR, lab_ssh
from tests.lab.test_kernel_upgrade_vm import NEW, OLD, ansible_playbook, held

pytestmark = pytest.mark.vmlab

VM = "lab1"
META = "linux-image-cloud-amd64"
LOCK_DROPIN = "/etc/apt/apt.conf.d/51gpufleet-kernel-lock"
# the test's own origin rule: the lab repository stands for Debian-Security, which the stock
# 50unattended-upgrades allows (list entries add up across apt.conf files)
ORIGIN_CONF = "/etc/apt/apt.conf.d/52gpufleet-lab-uu-origin"
ASIDE = "/root/51gpufleet-kernel-lock.aside"


def dry_run() -> tuple[list[str], str, float]:
    """What unattended-upgrades would upgrade now on VM (its own words), its output and wall seconds."""
    t0 = time.monotonic()
    out = lab_ssh(VM, "unattended-upgrade --dry-run --debug 2>&1", timeout=900)
    wall = time.monotonic() - t0
    found = re.findall(r"Packages that will be upgraded: ?(.*)", out)
    upgraded = found[-1].split() if found else []
    if not found:
        assert "No packages found that can be upgraded unattended" in out, out[-3000:]
    return upgraded, out, wall


def kernels_in(upgraded: list[str]) -> list[str]:
    return [p for p in upgraded if p.startswith("linux-")]


def restore() -> None:
    lab_ssh(VM, f"apt-mark unhold {META} linux-image-{OLD} linux-image-{NEW} >/dev/null; "
                f"rm -f {LOCK_DROPIN} {ORIGIN_CONF} {ASIDE}; rm -rf /var/lib/gpufleet/kernel_upgrade")


@pytest.fixture(scope="module")
def lab1(lab):
    restore()
    lab_ssh(VM, f"printf '%s\\n' '// gpufleet lab test: the offline repository stands for Debian-Security' "
                f"'Unattended-Upgrade::Origins-Pattern {{ \"origin=gpufleet-lab\"; }};' > {ORIGIN_CONF}")
    try:
        yield VM
    finally:
        restore()


def test_the_image_offers_a_kernel_through_the_meta_package(lab1):
    installed = lab_ssh(VM, f"dpkg-query -W -f='${{Version}}' {META}")
    sim = lab_ssh(VM, "apt-get -s -o Debug::NoLocking=1 dist-upgrade")
    new_abi = re.search(r"^Inst (linux-image-\S+-cloud-amd64) \(", sim, re.M)
    assert re.search(rf"^Inst {META} \[{re.escape(installed)}\] \(", sim, re.M), sim
    assert new_abi and new_abi.group(1) not in (f"linux-image-{OLD}", f"linux-image-{NEW}"), sim
    print(f"{VM}: {META} {installed} installed; apt would bring {new_abi.group(1)} through its update")


def test_unlocked_unattended_upgrades_would_take_the_kernel(lab1):
    assert held(VM) == [], "the host must start unlocked"
    upgraded, out, wall = dry_run()
    assert META in upgraded, out[-3000:]
    print(f"unlocked: unattended-upgrades would upgrade {' '.join(upgraded)} ({wall:.0f} s)")


def test_kernel_upgrade_locks_and_unattended_upgrades_leaves_the_kernel(lab1, tmp_path):
    # the plan-only run (no reboot_ok): the flow locks the running default kernel first, then plans
    args = ["--limit", f"{VM},localhost", "-e", f"kernel_upgrade_target={NEW}", "-e", "kernel_upgrade_reboot_ok=false",
            "-e", f"kernel_upgrade_hosts={VM}", "-e", f"kernel_upgrade_fleet_report_dir={tmp_path}",
            "-e", "gpufleet_history=false"]
    t0 = time.monotonic()
    r = ansible_playbook("playbooks/kernel_upgrade.yml", *args, timeout=1500)
    play_s = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    holds = held(VM)
    assert f"linux-image-{OLD}" in holds and META in holds, holds
    dropin = lab_ssh(VM, f"cat {LOCK_DROPIN}")
    assert f'"^{META}$";' in dropin and "Unattended-Upgrade::Package-Blacklist" in dropin, dropin
    assert lab_ssh(VM, "uname -r").strip() == OLD  # planned only: nothing installed, nothing booted
    assert lab_ssh(VM, f"dpkg-query -W -f='${{db:Status-Abbrev}}' linux-image-{NEW} 2>/dev/null || true").strip() \
        in ("", "un")

    locked, out_locked, wall_locked = dry_run()
    assert kernels_in(locked) == [], out_locked[-3000:]
    blacklist = re.search(r"Initial blacklist: (.*)", out_locked)
    assert blacklist and f"^{META}$" in blacklist.group(1).split(), out_locked[-3000:]

    # each half alone: the blacklist without the holds must still keep the kernel
    lab_ssh(VM, f"apt-mark unhold {shlex.join(holds)} >/dev/null")
    only_blacklist, out_bl, _wall = dry_run()
    assert kernels_in(only_blacklist) == [], out_bl[-3000:]
    assert re.search(rf"(skipping blacklisted package|pkg) {re.escape(META)}", out_bl), out_bl[-3000:]

    # the holds without the blacklist: recorded (what this unattended-upgrades version does with a hold)
    lab_ssh(VM, f"apt-mark hold {shlex.join(holds)} >/dev/null; mv {LOCK_DROPIN} {ASIDE}")
    only_holds, _out_holds, _wall = dry_run()
    lab_ssh(VM, f"mv {ASIDE} {LOCK_DROPIN}")
    version = lab_ssh(VM, "dpkg-query -W -f='${Version}' unattended-upgrades").strip()

    figures = {"vm": VM, "unattended_upgrades": version, "holds": holds, "plan_run_s": round(play_s),
               "locked": kernels_in(locked), "blacklist_only": kernels_in(only_blacklist),
               "holds_only": kernels_in(only_holds), "dry_run_s": round(wall_locked)}
    LAB_DIR.mkdir(exist_ok=True)
    with open(LAB_DIR / "kernel_lock_figures.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(figures) + "\n")
    print(f"unattended-upgrades {version} on {VM}: locked -> {figures['locked'] or 'nothing'}; blacklist alone -> "
          f"{figures['blacklist_only'] or 'nothing'}; holds alone -> {figures['holds_only'] or 'nothing'} "
          f"(plan-only kernel_upgrade.yml {play_s:.0f} s, one dry run {wall_locked:.0f} s)")

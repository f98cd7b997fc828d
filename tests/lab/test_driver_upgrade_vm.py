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

The serving verdict (the candidate 1.2 is slower through the lab server's --gpu-runtime) needs the shared change flow's
benchmark around these steps (driver_upgrade_action: gated): not run in the lab yet (docs/driver_upgrade.md). One VM,
no reboot (module reloads): 4 passed in 539 s under TCG on 2026-12-04. Run alone:
  . scripts/lib.sh; gpufleet_env; GPUFLEET_LAB_BASE_PORT=2741 flock /work/lab.lock python -m pytest -m e2e -v -s \
      tests/lab/test_driver_upgrade_vm.py
"""

from __future__ import annotations

import json
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

"""PCIe safety of issue 20 for real in the VM lab: ACS redirect and live config-space writes.

The lab's tensor-parallel pair is gpu0 (01:00.0, behind root port rp1 00:04.0) and gpu1 (05:00.0,
behind the switch under rp3 00:06.0): a PHB pair. QEMU's pcie-root-port has an ACS capability
(SV TB RR CR UF DT, every one writable; EgressCtrl absent, so read-only 0) and resets ACS Control
to 0; with the IOMMU on, the kernel turns on SV RR CR UF: ACSCtl 0x001d on every root port. rp3 is
started with disable-acs=on and the XIO3130 switch ports have no ACS, so of the two root ports on
the pair's peer path only rp1 redirects: pcie_acs must clear RR/CR there and nowhere else (rp2
00:05.0 and rp4 00:07.0 keep 0x001d). Proven here, one reboot per VM for the boot-time parts, the
three VMs rebooting together:

* lab1, runtime: pcie_acs clears RR/CR on rp1 (0x001d -> 0x0011, the VM's own setpci and lspci
  -vvv ACSCtl read back), a second run changes nothing, state=default restores the recorded 0x001d.
* lab1, no live write under a user: gpu0 bound to vfio-pci and its group held open by a process
  (the cloud kernel has no DRM, so no /dev/dri node exists in the lab: the open vfio group is the
  holder pcie_users can find); a pcie_payload write (MaxReadReq 512) and the ACS clear are refused
  naming that process, config space byte for byte unchanged; the same requests with
  defer_to_boot are accepted (reboot_required) and written to the boot unit only. After the
  reboot the unit ran before systemd-udev-trigger (its journal and systemd's timestamps): the ACS
  clear took (0x0011), the MaxReadReq write did not (QEMU keeps DevCtl's payload fields read-only)
  and is reported as an error with the unit failed, never as a pass; nothing else was written, so
  there was nothing to roll back (the byte-by-byte write and the rollback of writes that took are
  proven on fake trees with the real setpci: tests/unit/plugins/module_utils/test_pcie_acs.py and
  tests/unit/plugins/modules/test_pcie_payload.py, test_pcie_acs.py).
* lab2, the boot re-apply of a runtime clear: pcie_acs with persist (default) clears rp1 live; after
  the reboot gpufleet-pcie-payload.service (the collection's one boot re-apply unit, reapply_bundle)
  has cleared it again (its journal: 0x001d -> 0x0011) and exited 0.
* lab3, the boot-time half through the role: pcie_link with pcie_link_acs (and persist off, so no
  boot unit) puts pci=disable_acs_redir=0000:00:04.0 on the command line (owner pcie_acs) and
  reboots once through the reboot contract; /proc/cmdline holds it, the kernel logs "disabled ACS
  redirect" for 00:04.0 only, ACSCtl reads 0x0011. Then pcie_link_acs false restores the runtime
  value, removes the argument and reboots: the kernel's 0x001d is back.

Marker e2e (several reboots). Figures go to .lab/pcie_safety_figures.jsonl. Run:
    . scripts/lib.sh; gpufleet_env
    flock /work/lab.lock python -m pytest -m e2e -x -v tests/lab/test_pcie_safety_vm.py
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.lab.labutil import LAB_DIR, REPO, ansible_env, boot_id, boots, lab_ssh, play_recap, record_figure, ssh_try
from tests.lab.test_tuning_vm import module

pytestmark = [pytest.mark.vmlab, pytest.mark.e2e]

ACS = "gpufleet.inference.pcie_acs"
PAYLOAD = "gpufleet.inference.pcie_payload"
GPU0, GPU1 = "0000:01:00.0", "0000:05:00.0"
GROUP = [GPU0, GPU1]  # PHB: gpu0 behind rp1, gpu1 behind the switch under rp3
RP1 = "0000:00:04.0"
OTHER_PORTS = ["0000:00:05.0", "0000:00:07.0"]  # root ports with ACS that are not between the pair
NO_ACS = ["0000:00:06.0", "0000:03:00.0", "0000:04:00.0", "0000:04:01.0"]  # rp3 (disable-acs=on), the switch
KERNEL_ACSCTL = 0x1D  # SV RR CR UF: what the kernel enables (QEMU resets ACS Control to 0)
CLEARED = 0x11  # SV UF
UNIT = "gpufleet-pcie-payload.service"
HOLDER = "gpufleet-lab-gpu-holder"
BOOT_ARG = f"pci=disable_acs_redir={RP1}"
FIGURES = LAB_DIR / "pcie_safety_figures.jsonl"
# What the modules write on a host (record, boot file, unit, apply script): none of it after a refusal or a restore.
LEFT_FILES = (f"find /etc/gpufleet /etc/systemd/system/{UNIT} /usr/local/libexec/gpufleet-pcie-payload-apply "
              "/var/lib/gpufleet/pcie_payload /var/lib/gpufleet/pcie_acs -type f 2>/dev/null; true")
FAILED_UNITS = "systemctl list-units --failed --plain --no-legend"
# lspci -vvv's ACSCtl words, bit 0 (SV) up to bit 6 (DT)
LSPCI_ACS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")
# pcie_link with only the ACS part on (no payload, no ASPM), its boot unit off (persist false), so
# that after the reboot only the kernel argument can have cleared the bits; acs_on=false undoes it.
ROLE_PLAY = """\
- name: ACS boot parameters through pcie_link and the reboot contract
  hosts: lab3
  become: true
  gather_facts: false
  vars:
    pcie_link_mps: ""
    pcie_link_mrrs: 0
    pcie_link_aspm_policy: ""
    pcie_link_acs: "{{ acs_on | bool }}"
    pcie_link_acs_devices: GROUP
    pcie_link_persist: false
    pcie_link_reboot_ok: true
  roles:
    - gpufleet.inference.pcie_link
""".replace("GROUP", json.dumps(GROUP))


def figure(test: str, **values) -> None:
    """One line of this module's figures, printed and kept in .lab/ (labutil.record_figure)."""
    record_figure(FIGURES, test, **values)


def acsctl(host: str, bdf: str) -> int:
    """ACS Control of a bridge as the VM's own tools read it: setpci and lspci -vvv must agree."""
    out = lab_ssh(host, f"setpci -s {bdf} ECAP_ACS+6.w; lspci -vvv -s {bdf} | grep 'ACSCtl:'")
    word, line = out.strip().split("\n", 1)
    flags = dict(re.findall(r"(\w+)([+-])", line.split("ACSCtl:", 1)[1]))
    from_lspci = sum(1 << i for i, name in enumerate(LSPCI_ACS) if flags[name] == "+")
    assert int(word, 16) == from_lspci, f"{host} {bdf}: setpci reads {word}, lspci {line.strip()}"
    return from_lspci


def has_acs(host: str, bdf: str) -> bool:
    return lab_ssh(host, f"setpci -s {bdf} ECAP_ACS+6.w >/dev/null 2>&1 && echo yes || echo no").strip() == "yes"


def ports(host: str) -> dict[str, int]:
    return {b: acsctl(host, b) for b in [RP1, *OTHER_PORTS]}


def config_dump(host: str, *bdfs: str) -> str:
    """Every byte of config space (lspci -xxxx, as root: 4096 bytes) of these functions."""
    return lab_ssh(host, "; ".join(f"lspci -xxxx -s {b}" for b in bdfs))


def qemu_gone(name: str) -> str | None:
    """Why the VM's QEMU is no longer running (None while it runs): a reboot must not wait out its timeout
    for a QEMU that died (QEMU 7.2 under TCG once segfaulted in a warm reboot here, see the host's dmesg)."""
    try:
        pid = int((LAB_DIR / f"{name}.pid").read_text().strip())
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return f"the QEMU process of {name} is gone (host dmesg may show a segfault)"
    return f"the QEMU process of {name} ({pid}) is a zombie" if stat.rsplit(")", 1)[1].split()[0] == "Z" else None


def wait_booted(name: str, before: str, timeout: float = 1200) -> str:
    """Poll until the host answers with another boot id; then wait for systemd to finish booting. Its state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gone = qemu_gone(name)
        assert gone is None, gone
        now = (ssh_try(name, "cat /proc/sys/kernel/random/boot_id", 20) or before).strip()
        if now != before:
            return (ssh_try(name, "timeout 600 systemctl is-system-running --wait || true", 660) or "").strip() or "unknown"
        time.sleep(3)
    raise AssertionError(f"{name}: not back with a new boot id within {timeout} s")


def reboot(name: str) -> dict:
    before = boot_id(name)
    t0 = time.monotonic()
    ssh_try(name, "systemctl reboot", 30)
    state = wait_booted(name, before)
    wall = round(time.monotonic() - t0, 1)
    return {"state": state, "wall_s": wall, "failed_units": [u.split()[0] for u in lab_ssh(name, FAILED_UNITS).splitlines()]}


def role_run(play: Path, acs_on: bool, host: str = "lab3") -> dict:
    """ansible-playbook of ROLE_PLAY in a session of its own, killed as a whole if the VM's QEMU dies."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(["ansible-playbook", "-i", "inventories/lab", str(play), "-e", f"acs_on={str(acs_on).lower()}"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, env=ansible_env(),
                                start_new_session=True)
        gone = None
        while proc.poll() is None and time.monotonic() - t0 < 3600:
            gone = qemu_gone(host)
            if gone:
                break
            time.sleep(2)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.seek(0)
        out = log.read() + (f"\n{gone}\n" if gone else "")
    return {"rc": proc.returncode, "out": out, "recap": play_recap(out), "wall_s": round(time.monotonic() - t0, 1)}


def unit_journal(host: str) -> str:
    return lab_ssh(host, f"journalctl -b -u {UNIT} --no-pager -o cat")


def start_holder(host: str, bdf: str) -> dict:
    """gpu0 to vfio-pci (the collection's vfio_bind, nothing persisted) and a process holding its group open."""
    res = module(host, "gpufleet.inference.vfio_bind", {"devices": [bdf], "persist": "none"})
    assert not res.get("failed") and res["changed"] is True, res
    group = lab_ssh(host, f"basename $(readlink /sys/bus/pci/devices/{bdf}/iommu_group)").strip()
    lab_ssh(host, f"systemd-run --unit {HOLDER} --collect sh -c 'exec sleep infinity < /dev/vfio/{group}'")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # poll until the process holds the group (sh opens it, then execs sleep)
        pid = lab_ssh(host, f"systemctl show -p MainPID --value {HOLDER}").strip()
        fd0 = lab_ssh(host, f"readlink /proc/{pid}/fd/0 2>/dev/null; cat /proc/{pid}/comm 2>/dev/null || true").split()
        if fd0 == [f"/dev/vfio/{group}", "sleep"]:
            return {"pid": int(pid), "group": group, "file": f"/dev/vfio/{group}"}
        time.sleep(1)
    raise AssertionError(f"{host}: {HOLDER} does not hold /dev/vfio/{group}")


def stop_holder(host: str, bdf: str) -> None:
    lab_ssh(host, f"systemctl stop {HOLDER} || true")
    res = module(host, "gpufleet.inference.vfio_bind", {"devices": [bdf], "state": "absent", "persist": "none"})
    assert not res.get("failed"), res
    assert lab_ssh(host, f"basename $(readlink /sys/bus/pci/devices/{bdf}/driver)").strip() == "virtio-pci"


# ---- runtime, no reboot ---------------------------------------------------------------------------
def test_runtime_clear_on_exactly_the_bridge_between_the_pair_read_back_and_restored(lab):
    assert lab_ssh("lab1", "ls /sys/class/iommu").split(), "the IOMMU is off: the kernel would not enable ACS"
    before = ports("lab1")
    assert before == {b: KERNEL_ACSCTL for b in before}, f"the kernel's ACSCtl is not 0x001d (RR and CR on): {before}"
    assert not any(has_acs("lab1", b) for b in NO_ACS)
    t0 = time.monotonic()
    res = module("lab1", ACS, {"devices": GROUP, "persist": False})
    t_clear = time.monotonic() - t0
    assert not res.get("failed") and res["changed"] is True, res
    assert res["pairs"] == [{"a": GPU0, "b": GPU1, "level": "PHB", "bridges": [RP1, "0000:00:06.0"], "redirecting": [RP1]}]
    assert res["bridges"] == {RP1: {"ctrl_before": KERNEL_ACSCTL, "ctrl_after": CLEARED, "cleared": ["RR", "CR"],
                                    "pairs": [GROUP]}}
    assert [a["argv"][-1] for a in res["actions"] if a["action"] == "set_acs"] == ["ECAP_ACS+6.w=0000:000c"]
    assert res["kernel_args"] == [BOOT_ARG] and res["persisted"] == [] and res["path_users"] == []
    assert ports("lab1") == {RP1: CLEARED, **{b: KERNEL_ACSCTL for b in OTHER_PORTS}}
    record = json.loads(lab_ssh("lab1", "cat /var/lib/gpufleet/pcie_acs/originals.json"))
    assert record["devices"] == {RP1: {"ctrl": KERNEL_ACSCTL, "vendor_id": "0x1b36", "device_id": "0x000c"}}
    again = module("lab1", ACS, {"devices": GROUP, "persist": False})
    assert not again.get("failed") and again["changed"] is False, again
    t0 = time.monotonic()
    back = module("lab1", ACS, {"state": "default"})
    t_restore = time.monotonic() - t0
    assert not back.get("failed") and back["changed"] is True, back
    assert back["bridges"][RP1]["ctrl_before"] == CLEARED and back["bridges"][RP1]["ctrl_after"] == KERNEL_ACSCTL
    assert ports("lab1") == before
    assert lab_ssh("lab1", "ls /var/lib/gpufleet/pcie_acs/").strip() == ""
    again = module("lab1", ACS, {"state": "default"})
    assert not again.get("failed") and again["changed"] is False, again
    figure("runtime", acsctl_kernel=f"0x{KERNEL_ACSCTL:04x}", acsctl_cleared=f"0x{CLEARED:04x}",
           clear_s=round(t_clear, 1), restore_s=round(t_restore, 1))


# ---- one reboot per VM, the three together -------------------------------------------------------
@pytest.fixture(scope="module")
def one_reboot(lab, tmp_path_factory) -> dict:
    """lab1: a holder, the refused live writes, the same requests deferred to boot; lab2: a runtime clear
    persisted by the boot unit; then lab1 and lab2 reboot while pcie_link on lab3 sets the boot argument
    and reboots through the reboot contract."""
    out: dict = {}
    out["holder"] = holder = start_holder("lab1", GPU0)
    out["dump_before"] = config_dump("lab1", RP1, GPU0)
    out["payload_refused"] = module("lab1", PAYLOAD, {"devices": [GPU0], "mrrs": 512})
    out["acs_refused_vfio"] = module("lab1", ACS, {"devices": GROUP})
    out["acs_refused"] = module("lab1", ACS, {"devices": GROUP, "force_on_vfio_host": True})
    out["dump_after_refusals"] = config_dump("lab1", RP1, GPU0)
    out["files_after_refusals"] = lab_ssh("lab1", LEFT_FILES)
    out["payload_deferred"] = module("lab1", PAYLOAD, {"devices": [GPU0], "mrrs": 512, "defer_to_boot": True})
    out["acs_deferred"] = module("lab1", ACS, {"devices": GROUP, "force_on_vfio_host": True, "defer_to_boot": True})
    out["dump_after_defer"] = config_dump("lab1", RP1, GPU0)
    out["lab1_persisted"] = json.loads(lab_ssh("lab1", "cat /etc/gpufleet/pcie_payload.json"))
    out["lab1_enabled"] = lab_ssh("lab1", f"systemctl is-enabled {UNIT}").strip()
    assert holder["pid"] == int(lab_ssh("lab1", f"systemctl show -p MainPID --value {HOLDER}").strip()), "the holder died"
    stop_holder("lab1", GPU0)  # the reboot ends it anyway; back to virtio-pci so that nothing of it is left

    out["lab2_before"] = ports("lab2")
    out["lab2_clear"] = module("lab2", ACS, {"devices": GROUP})  # persist: true (default)
    out["lab2_live"] = ports("lab2")
    out["lab3_before"] = ports("lab3")
    out["boots_before"] = {n: boots(n) for n in ("lab1", "lab2", "lab3")}
    play = tmp_path_factory.mktemp("pcie_safety") / "acs_boot_args.yml"
    play.write_text(ROLE_PLAY)
    out["play"] = play
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=3) as ex:
        f1, f2 = ex.submit(reboot, "lab1"), ex.submit(reboot, "lab2")
        f3 = ex.submit(role_run, play, True)
        out["lab1_reboot"], out["lab2_reboot"], out["lab3_role"] = f1.result(), f2.result(), f3.result()
    out["reboot_wall_s"] = round(time.monotonic() - t0, 1)
    gone = qemu_gone("lab3")
    assert gone is None, f"{gone}; the role's run:\n{out['lab3_role']['out'][-3000:]}"
    out["boots_after"] = {n: boots(n) for n in ("lab1", "lab2", "lab3")}
    return out


def test_live_payload_and_acs_writes_are_refused_naming_the_holder(one_reboot):
    h = one_reboot["holder"]
    holds = f"process {h['pid']} (sleep) holds {h['file']} of {GPU0}"
    res = one_reboot["payload_refused"]
    assert res.get("failed") and res.get("changed") is False, res
    assert res["msg"].startswith(f"Refusing to write MaxPayload/MaxReadReq on {GPU0} while the path is in use: {holds}."), res["msg"]
    assert "defer_to_boot: true" in res["msg"] and "force: true writes anyway" in res["msg"]
    # a host that passes devices to VMs: the ACS clear is refused for that reason first
    vfio = one_reboot["acs_refused_vfio"]
    assert vfio.get("failed") and vfio.get("changed") is False, vfio
    assert f"({GPU0} is bound to vfio-pci)" in vfio["msg"] and "force_on_vfio_host" in vfio["msg"], vfio["msg"]
    acs = one_reboot["acs_refused"]
    assert acs.get("failed") and acs.get("changed") is False, acs
    assert acs["msg"].startswith(f"Refusing to clear ACS redirect on {RP1} while the path is in use: {holds}."), acs["msg"]
    assert "defer_to_boot: true" in acs["msg"] and "kernel_args" in acs["msg"]
    # not one byte of config space, no record, no boot unit
    assert one_reboot["dump_after_refusals"] == one_reboot["dump_before"]
    assert one_reboot["files_after_refusals"].strip() == "", one_reboot["files_after_refusals"]
    figure("refused", payload_msg=res["msg"], acs_msg=acs["msg"])


def test_the_same_requests_are_accepted_for_the_boot_unit_and_nothing_is_written_live(one_reboot):
    pay, acs = one_reboot["payload_deferred"], one_reboot["acs_deferred"]
    for res in (pay, acs):
        assert not res.get("failed") and res["changed"] is True and res["reboot_required"] is True, res
    assert [(a["device"], a["register"], a["before"], a["after"]) for a in pay["actions"] if a["action"] == "set_at_boot"] \
        == [(GPU0, "mrrs", 128, 512)]
    assert [(a["device"], a["before"], a["after"]) for a in acs["actions"] if a["action"] == "set_at_boot"] \
        == [(RP1, KERNEL_ACSCTL, CLEARED)]
    assert not [a for a in pay["actions"] + acs["actions"] if a["action"] in ("set", "set_acs")]
    assert one_reboot["dump_after_defer"] == one_reboot["dump_before"]
    persisted = one_reboot["lab1_persisted"]
    assert [(e["bdf"], e["mrrs"]) for e in persisted["devices"]] == [(GPU0, 512)]
    assert [(e["bdf"], e["clear"]) for e in persisted["acs"]] == [(RP1, 0x0C)]
    assert one_reboot["lab1_enabled"] == "enabled"


def test_the_boot_unit_ran_before_udev_cleared_acs_and_reports_the_readonly_payload(one_reboot):
    assert one_reboot["boots_after"]["lab1"] == one_reboot["boots_before"]["lab1"] + 1
    # the unit failed (the system is degraded): the read-only MaxReadReq is not passed off as done
    assert one_reboot["lab1_reboot"]["state"] == "degraded" and UNIT in one_reboot["lab1_reboot"]["failed_units"], \
        one_reboot["lab1_reboot"]
    journal = unit_journal("lab1")
    assert re.search(rf"^error: {GPU0} MaxReadReq 512: the device still reads 128 after setpci \(read-only field\?\) "
                     rf"\[/usr/bin/setpci -A linux-sysfs -O sysfs.path=/sys/bus/pci -s {GPU0} CAP_EXP\+8\.w=2000:7000\]$",
                     journal, re.M), journal
    assert re.search(rf"^{RP1}: ACS Control 0x001d -> 0x0011 \[", journal, re.M), journal
    assert "gpufleet-pcie-payload-apply: 1 device(s), 1 failed" in journal, journal
    show = lab_ssh("lab1", f"systemctl show -p ActiveState -p Result -p ExecMainStatus -p Before {UNIT}")
    assert "ActiveState=failed" in show and "Result=exit-code" in show and "ExecMainStatus=1" in show, show
    assert "systemd-udev-trigger.service" in show and "nvidia-persistenced.service" in show, show
    unit_done = int(lab_ssh("lab1", f"systemctl show -p ExecMainExitTimestampMonotonic --value {UNIT}"))
    udev = int(lab_ssh("lab1", "systemctl show -p ExecMainStartTimestampMonotonic --value systemd-udev-trigger.service"))
    assert 0 < unit_done < udev, (unit_done, udev)
    # MaxReadReq still 128 (read-only: nothing took, so nothing needed a rollback); ACS cleared on rp1 only
    assert "MaxPayload 128 bytes, MaxReadReq 128 bytes" in lab_ssh("lab1", f"lspci -vv -s {GPU0} | grep -A2 'DevCtl:'")
    assert ports("lab1") == {RP1: CLEARED, **{b: KERNEL_ACSCTL for b in OTHER_PORTS}}
    figure("deferred_boot", reboot_s=one_reboot["lab1_reboot"]["wall_s"], unit_exit_us=unit_done,
           udev_trigger_start_us=udev, journal=journal.strip().splitlines())


def test_the_runtime_clear_is_reapplied_by_the_boot_unit(one_reboot):
    assert one_reboot["lab2_before"][RP1] == KERNEL_ACSCTL
    res = one_reboot["lab2_clear"]
    assert not res.get("failed") and res["changed"] is True, res
    assert [(e["bdf"], e["clear"]) for e in res["persisted"]] == [(RP1, 0x0C)]
    assert one_reboot["lab2_live"][RP1] == CLEARED
    assert one_reboot["boots_after"]["lab2"] == one_reboot["boots_before"]["lab2"] + 1
    assert UNIT not in one_reboot["lab2_reboot"]["failed_units"], one_reboot["lab2_reboot"]
    journal = unit_journal("lab2")
    assert re.search(rf"^{RP1}: ACS Control 0x001d -> 0x0011 \[", journal, re.M), journal
    assert "ACS on 1 bridge(s), 0 failed" in journal and "0 device(s), 0 failed" in journal, journal
    assert lab_ssh("lab2", f"systemctl is-active {UNIT}").strip() == "active"
    assert ports("lab2") == {RP1: CLEARED, **{b: KERNEL_ACSCTL for b in OTHER_PORTS}}
    again = module("lab2", ACS, {"devices": GROUP})
    assert not again.get("failed") and again["changed"] is False, again
    figure("reapply", reboot_s=one_reboot["lab2_reboot"]["wall_s"], journal=journal.strip().splitlines())


def test_disable_acs_redir_through_pcie_link_with_one_reboot(one_reboot):
    role = one_reboot["lab3_role"]
    assert role["rc"] == 0, role["out"][-6000:]
    assert role["recap"]["lab3"]["failed"] == 0, role["recap"]
    assert one_reboot["lab3_before"][RP1] == KERNEL_ACSCTL
    assert one_reboot["boots_after"]["lab3"] == one_reboot["boots_before"]["lab3"] + 1
    assert f"/proc/cmdline holds {BOOT_ARG}" in role["out"], role["out"][-4000:]
    assert BOOT_ARG in lab_ssh("lab3", "cat /proc/cmdline").split()
    dmesg = lab_ssh("lab3", "dmesg | grep 'disabled ACS redirect' || true").strip().splitlines()
    assert [line.split("]", 1)[1].strip() for line in dmesg] == [f"pci {RP1}: disabled ACS redirect"], dmesg
    # no boot unit (persist false): the kernel argument alone cleared the bits
    assert lab_ssh("lab3", f"systemctl cat {UNIT} >/dev/null 2>&1 && echo unit || echo none").strip() == "none"
    assert ports("lab3") == {RP1: CLEARED, **{b: KERNEL_ACSCTL for b in OTHER_PORTS}}
    figure("boot_arg", role_s=role["wall_s"], parallel_reboots_s=one_reboot["reboot_wall_s"], dmesg=dmesg,
           cmdline=lab_ssh("lab3", "cat /proc/cmdline").strip())


def test_everything_is_put_back(one_reboot):
    """lab3: pcie_link_acs false restores the runtime value, drops the argument and reboots; lab1 and lab2:
    state=default restores ACS Control and removes the boot unit with its last entry."""
    boots3 = boots("lab3")
    with ThreadPoolExecutor(max_workers=1) as ex:
        f3 = ex.submit(role_run, one_reboot["play"], False)
        restored = {}
        for host in ("lab1", "lab2"):
            restored[host] = module(host, ACS, {"state": "default"})
        restored["lab1_payload"] = module("lab1", PAYLOAD, {"state": "default"})
        role = f3.result()
    for host in ("lab1", "lab2"):
        res = restored[host]
        assert not res.get("failed") and res["changed"] is True, res
        assert res["bridges"][RP1]["ctrl_after"] == KERNEL_ACSCTL, res
        assert ports(host) == {b: KERNEL_ACSCTL for b in [RP1, *OTHER_PORTS]}
    assert not restored["lab1_payload"].get("failed") and restored["lab1_payload"]["changed"] is True, restored["lab1_payload"]
    for host in ("lab1", "lab2"):
        lab_ssh(host, "systemctl reset-failed 2>/dev/null || true")
        assert lab_ssh(host, LEFT_FILES).strip() == ""
        again = module(host, ACS, {"state": "default"})
        assert not again.get("failed") and again["changed"] is False, again
    assert role["rc"] == 0, role["out"][-6000:]
    assert boots("lab3") == boots3 + 1
    assert BOOT_ARG not in lab_ssh("lab3", "cat /proc/cmdline")
    assert lab_ssh("lab3", "dmesg | grep 'disabled ACS redirect' || true").strip() == ""
    assert ports("lab3") == {b: KERNEL_ACSCTL for b in [RP1, *OTHER_PORTS]}
    assert lab_ssh("lab3", "ls /var/lib/gpufleet/pcie_acs/ 2>/dev/null; true").strip() == ""
    figure("put_back", role_s=role["wall_s"])

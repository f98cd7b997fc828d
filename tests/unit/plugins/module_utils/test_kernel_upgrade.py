# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure parts of the kernel upgrade: GRUB settings, grubenv, grub.cfg entries, /boot space, drivers,
apt simulations, the preflight decisions with their reasons, the boot-entry plans, the fleet report."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.kernel import upgrade as ku
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel import grub
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel import report as kr

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "grub"
OLD = "6.1.0-50-cloud-amd64"
NEW = "6.1.0-56-cloud-amd64"
UUID = "e5dd2c0a-b16b-46de-9f7a-806e3ce0ca85"
OLD_PATH = f"gnulinux-advanced-{UUID}>gnulinux-{OLD}-advanced-{UUID}"
NEW_PATH = f"gnulinux-advanced-{UUID}>gnulinux-{NEW}-advanced-{UUID}"


def grubenv(**env) -> bytes:
    body = grub.GRUBENV_HEADER + "\n" + "".join(f"{k}={v}\n" for k, v in env.items())
    return (body + "#" * (grub.GRUBENV_SIZE - len(body))).encode()


@pytest.fixture(scope="module")
def one_kernel():
    return grub.parse_grub_cfg((FIXTURES / "debian12-lab-one-kernel.cfg").read_text())


@pytest.fixture(scope="module")
def two_kernels():
    return grub.parse_grub_cfg((FIXTURES / "debian12-lab-two-kernels.cfg").read_text())


# ---- /etc/default/grub + grub.d --------------------------------------------------------------------------
@pytest.mark.parametrize("files,default,source,savedefault", [
    ([("/etc/default/grub", "GRUB_DEFAULT=saved\n")], "saved", "/etc/default/grub", False),
    ([("/etc/default/grub", 'GRUB_DEFAULT="saved"\nGRUB_SAVEDEFAULT=false\n')], "saved", "/etc/default/grub", False),
    ([("/etc/default/grub", "GRUB_TIMEOUT=5\n")], "0", None, False),
    ([("/etc/default/grub", "GRUB_DEFAULT=saved\n"), ("/etc/default/grub.d/50-cloudimg-settings.cfg", "GRUB_DEFAULT=0\n")],
     "0", "/etc/default/grub.d/50-cloudimg-settings.cfg", False),
    ([("/etc/default/grub", "GRUB_DEFAULT=0\n"), ("/etc/default/grub.d/98-gpufleet-kernel-upgrade.cfg", ku.SAVED_DROPIN_TEXT)],
     "saved", "/etc/default/grub.d/98-gpufleet-kernel-upgrade.cfg", False),
    ([("/etc/default/grub", "#GRUB_DEFAULT=saved\nexport GRUB_DEFAULT='1>2' # comment\n")], "1>2", "/etc/default/grub", False),
    ([("/etc/default/grub", "GRUB_DEFAULT=saved\nGRUB_SAVEDEFAULT=true\n")], "saved", "/etc/default/grub", True),
    ([("/etc/default/grub", None)], "0", None, False),
])
def test_grub_settings_last_assignment_wins(files, default, source, savedefault):
    got = grub.grub_settings(files)
    assert (got["default"], got["default_from"], got["savedefault"]) == (default, source, savedefault)


def test_dropin_order_is_what_grub_mkconfig_sources():
    assert grub.dropin_order(["99-gpufleet.cfg", "50-cloudimg-settings.cfg", "README", "98-gpufleet-kernel-upgrade.cfg",
                              "init-select.cfg.dpkg-old"]) == [
        "50-cloudimg-settings.cfg", "98-gpufleet-kernel-upgrade.cfg", "99-gpufleet.cfg"]


def test_grub_default_saved_passes():
    c = ku.check_grub_default({"default": "saved", "default_from": "/etc/default/grub", "savedefault": False,
                               "savedefault_from": None}, fix_allowed=False)
    assert c["ok"] and c["fix"] == "" and "GRUB_DEFAULT=saved" in c["reason"]


def test_grub_default_zero_fails_with_the_fix_in_words():
    c = ku.check_grub_default(grub.grub_settings([("/etc/default/grub", "GRUB_DEFAULT=0\n")]), fix_allowed=False)
    assert not c["ok"] and not c["fixable"]
    assert "GRUB_DEFAULT=0 (set in /etc/default/grub)" in c["reason"] and "grub-reboot" in c["reason"]
    assert "kernel_upgrade_fix_grub_default: true" in c["fix"] and ku.SAVED_DROPIN in c["fix"]
    assert ku.check_grub_default(grub.grub_settings([("/etc/default/grub", "")]), fix_allowed=True)["fixable"]


def test_savedefault_true_is_refused_because_a_failed_boot_would_stick():
    c = ku.check_grub_default(grub.grub_settings([("/etc/default/grub", "GRUB_DEFAULT=saved\nGRUB_SAVEDEFAULT=true\n")]), False)
    assert not c["ok"] and "GRUB_SAVEDEFAULT=true" in c["reason"] and "stick" in c["reason"]


def test_our_dropin_overridden_by_a_later_file_is_named():
    c = ku.check_grub_default(grub.grub_settings([("/etc/default/grub", ""), (ku.SAVED_DROPIN, ku.SAVED_DROPIN_TEXT),
                                                  ("/etc/default/grub.d/99-z.cfg", "GRUB_DEFAULT=2\n")]),
                              fix_allowed=True, dropin_present=True)
    assert not c["ok"] and not c["fixable"] and "overrides it" in c["fix"]


# ---- grubenv ------------------------------------------------------------------------------------------------
def test_grubenv_parse_and_valid():
    env = grub.parse_grubenv(grubenv(saved_entry=OLD_PATH, next_entry=NEW_PATH))
    assert env["valid"] and env["vars"] == {"saved_entry": OLD_PATH, "next_entry": NEW_PATH}
    assert ku.check_grubenv(env, True, {"device": "/dev/vda1", "point": "/", "fstype": "ext4"})["ok"]


@pytest.mark.parametrize("data,writable,mount,words", [
    (None, True, None, "does not exist"),
    (b"# GRUB Environment Block\nsaved_entry=0\n", True, None, "bytes instead of 1024"),
    (b"x" * 1024, True, None, "no '# GRUB Environment Block' header"),
    (grubenv(), False, None, "not writable"),
    (grubenv(), True, {"device": "/dev/mapper/vg0-boot", "point": "/boot", "fstype": "ext4"}, "GRUB cannot rewrite it at boot"),
    (grubenv(), True, {"device": "/dev/md0", "point": "/boot", "fstype": "ext4"}, "/dev/md0"),
    (grubenv(), True, {"device": "/dev/nvme0n1p2", "point": "/", "fstype": "btrfs"}, "btrfs"),
])
def test_grubenv_refusals_say_why(data, writable, mount, words):
    c = ku.check_grubenv(grub.parse_grubenv(data), writable, mount)
    assert not c["ok"] and words in c["reason"] and c["fix"]


def test_mount_for_takes_the_longest_prefix():
    mounts = ("/dev/vda1 / ext4 rw 0 0\n/dev/vda2 /boot ext4 rw 0 0\n/dev/vda3 /boot/efi vfat rw 0 0\n"
              "/dev/mapper/x /bootstrap ext4 rw 0 0\n")
    assert ku.mount_for("/boot/grub", mounts)["device"] == "/dev/vda2"
    assert ku.mount_for("/boot", mounts)["point"] == "/boot"
    assert ku.mount_for("/boot/grub", "/dev/vda1 / ext4 rw 0 0\n")["point"] == "/"
    assert ku.mount_for("/boot", "") is None


# ---- grub.cfg (real captures from the lab VMs) ------------------------------------------------------------------
def test_entries_of_a_one_kernel_grub_cfg(one_kernel):
    assert [(e["path"], e["version"], e["recovery"]) for e in one_kernel] == [
        (f"gnulinux-simple-{UUID}", OLD, False),
        (OLD_PATH, OLD, False),
        (f"gnulinux-advanced-{UUID}>gnulinux-{OLD}-recovery-{UUID}", OLD, True)]
    assert one_kernel[0]["index"] == 0 and one_kernel[1]["submenu"] == f"gnulinux-advanced-{UUID}"


def test_entry_for_prefers_the_stable_submenu_entry(two_kernels):
    # the top-level entry boots the newest kernel, whichever it is: never pin it
    assert two_kernels[0]["version"] == NEW and two_kernels[0]["submenu"] is None
    assert ku.entry_for(two_kernels, OLD)["path"] == OLD_PATH
    assert ku.entry_for(two_kernels, NEW)["path"] == NEW_PATH
    assert ku.entry_for(two_kernels, "6.1.0-99-cloud-amd64") is None


@pytest.mark.parametrize("saved,version", [
    (None, NEW), ("0", NEW), (OLD_PATH, OLD), (NEW_PATH, NEW), (f"gnulinux-{OLD}-advanced-{UUID}", OLD),
    (f"Debian GNU/Linux, with Linux {OLD}", OLD), (f"gnulinux-advanced-{UUID}>Debian GNU/Linux, with Linux {OLD}", OLD),
])
def test_resolve_saved_entry_forms(two_kernels, saved, version):
    assert ku.resolve_saved(two_kernels, saved)["version"] == version


def test_resolve_saved_unknown(two_kernels):
    assert ku.resolve_saved(two_kernels, "gnulinux-5.10.0-old") is None
    assert ku.resolve_saved(two_kernels, "7") is None


def test_grub_cfg_with_menuentry_options_and_nested_blocks():
    text = """function load_video {
  if [ x$feature_all_video_module = xy ]; then
    insmod all_video
  fi
}
menuentry 'Ubuntu' --class ubuntu --id "gnulinux-simple-abc" {
\trecordfail
\tlinux\t/vmlinuz-6.8.0-45-generic root=/dev/sda2 ro quiet splash
}
submenu 'Advanced options for Ubuntu' --id gnulinux-advanced-abc {
\tmenuentry 'Ubuntu, with Linux 6.8.0-45-generic' --id 'gnulinux-6.8.0-45-generic-advanced-abc' {
\t\tif [ x$grub_platform = xefi ]; then
\t\t\tset timeout=0
\t\tfi
\t\tlinux\t/vmlinuz-6.8.0-45-generic root=/dev/sda2 ro quiet splash
\t}
\tmenuentry 'Ubuntu, with Linux 6.8.0-40-generic (recovery mode)' --id 'gnulinux-6.8.0-40-generic-recovery-abc' {
\t\tlinux\t/vmlinuz-6.8.0-40-generic root=/dev/sda2 ro recovery nomodeset
\t}
}
menuentry 'UEFI Firmware Settings' $menuentry_id_option 'uefi-firmware' {
\tfwsetup
}
"""
    entries = grub.parse_grub_cfg(text)
    assert [(e["path"], e["version"], e["recovery"], e["index"]) for e in entries] == [
        ("gnulinux-simple-abc", "6.8.0-45-generic", False, 0),
        ("gnulinux-advanced-abc>gnulinux-6.8.0-45-generic-advanced-abc", "6.8.0-45-generic", False, None),
        ("gnulinux-advanced-abc>gnulinux-6.8.0-40-generic-recovery-abc", "6.8.0-40-generic", True, None),
        ("uefi-firmware", None, False, 2)]
    # only a recovery entry boots 6.8.0-40: no normal entry for it
    assert ku.entry_for(entries, "6.8.0-40-generic") is None


# ---- installed kernels, /boot space, drivers -------------------------------------------------------------
def test_installed_kernels_need_vmlinuz_and_modules():
    boot = ["vmlinuz-6.1.0-9-amd64", f"vmlinuz-{OLD}", f"vmlinuz-{NEW}", "vmlinuz-6.1.0-7-amd64.old", "initrd.img-6.1.0-9-amd64",
            "vmlinuz-5.10.0-30-amd64"]
    modules = ["6.1.0-9-amd64", OLD, NEW, "6.1.0-7-amd64"]
    assert ku.installed_kernels(boot, modules) == ["6.1.0-9-amd64", OLD, NEW]


def test_boot_space_estimate_and_decision():
    sizes = {f"vmlinuz-{OLD}": 8 << 20, f"initrd.img-{OLD}": 30 << 20, f"System.map-{OLD}": 4 << 20, f"config-{OLD}": 1 << 18,
             f"vmlinuz-{NEW}": 999 << 20}
    need = ku.boot_space_needed(sizes, OLD)
    assert need == int(((8 + 30 + 4) * (1 << 20) + (1 << 18)) * 1.3) + (16 << 20)
    assert ku.boot_space_needed(sizes, OLD, override_bytes=200 << 20) == 200 << 20
    assert ku.check_boot_space(need, need, False)["ok"]
    short = ku.check_boot_space(need - 1, need, False, "/boot")
    assert not short["ok"] and "MiB free on /boot" in short["reason"] and "apt-get purge" in short["fix"]
    assert ku.check_boot_space(0, need, True)["ok"]


@pytest.mark.parametrize("name,found", [
    ("updates/dkms/nvidia.ko", True), ("kernel/drivers/video/nvidia.ko.xz", True), ("extra/nvidia.ko.zst", True),
    ("updates/dkms/nvidia.ko.gz", True), ("updates/dkms/nvidia-uvm.ko", False), ("updates/dkms/nvidia.ko.sig", False),
    ("kernel/drivers/gpu/drm/nouveau/nouveau.ko", False),
])
def test_driver_files(name, found):
    assert bool(ku.driver_files([name], ["nvidia"])) is found


def test_driver_checks():
    assert ku.driver_required("auto", ["nvidia", "nvidia_uvm"], ["nvidia"])
    assert not ku.driver_required("auto", ["virtio_net"], ["nvidia"])
    assert ku.driver_required("required", [], ["nvidia"]) and not ku.driver_required("none", ["nvidia"], ["nvidia"])
    assert ku.check_driver(False, ["nvidia"], NEW, [], "preflight")["ok"]
    assert ku.check_driver(True, ["nvidia"], NEW, ["updates/dkms/nvidia.ko"], "installed")["ok"]
    dkms = ku.check_driver(True, ["nvidia"], NEW, [], "preflight", ["nvidia"])
    assert dkms["ok"] and "DKMS" in dkms["reason"]
    missing = ku.check_driver(True, ["nvidia"], NEW, [], "installed", ["nvidia"])
    assert not missing["ok"] and f"/lib/modules/{NEW}/" in missing["reason"] and "without its GPUs" in missing["reason"]
    assert "dkms autoinstall" in missing["fix"] and "kernel_upgrade_driver: none" in missing["fix"]
    assert not ku.check_driver(True, ["nvidia"], NEW, [], "preflight", [])["ok"]


# ---- apt ----------------------------------------------------------------------------------------------------------
APT_OK = f"""Reading package lists...
The following NEW packages will be installed:
  linux-image-{NEW}
0 upgraded, 1 newly installed, 0 to remove and 0 not upgraded.
Inst linux-image-{NEW} (6.1.192-2 localhost [amd64])
Conf linux-image-{NEW} (6.1.192-2 localhost [amd64])
"""
APT_REMOVES = APT_OK + f"Remv linux-image-{OLD} [6.1.176-1]\n"
APT_MISSING = ("E: Unable to locate package linux-image-6.1.0-99-cloud-amd64\n"
               "E: Couldn't find any package by glob 'linux-image-6.1.0-99-cloud-amd64'\n")


def test_apt_simulation_parses_installs_and_removes():
    sim = ku.parse_apt_simulation(0, APT_REMOVES, "")
    assert sim["available"] and sim["installs"] == [(f"linux-image-{NEW}", "6.1.192-2")]
    assert sim["removes"] == [f"linux-image-{OLD}"] and sim["error"] is None


def test_target_not_available_is_a_clear_failure():
    sim = ku.parse_apt_simulation(100, "Reading package lists...\n", APT_MISSING)
    c = ku.check_target("6.1.0-99-cloud-amd64", "linux-image-6.1.0-99-cloud-amd64", [OLD], sim)
    assert not c["ok"]
    assert c["reason"].startswith("linux-image-6.1.0-99-cloud-amd64 cannot be installed: E: Unable to locate package")
    assert "apt-cache policy" in c["fix"] and "stays on its kernel" in c["fix"]


def test_target_available_or_installed():
    assert "(6.1.192-2)" in ku.check_target(NEW, f"linux-image-{NEW}", [OLD], ku.parse_apt_simulation(0, APT_OK, ""))["reason"]
    assert ku.check_target(NEW, f"linux-image-{NEW}", [OLD, NEW], None)["ok"]
    assert not ku.check_target(NEW, f"linux-image-{NEW}", [OLD], None)["ok"]


def test_old_kernel_must_stay(one_kernel):
    pkg = [f"linux-image-{OLD}"]
    assert ku.check_old_kernel(OLD, [OLD], one_kernel, [], pkg)["ok"]
    removed = ku.check_old_kernel(OLD, [OLD], one_kernel, [f"linux-image-{OLD}"], pkg)
    assert not removed["ok"] and "would remove" in removed["reason"]
    gone = ku.check_old_kernel(OLD, [], one_kernel, [], pkg)
    assert not gone["ok"] and "no kernel to fall back to" in gone["reason"]
    no_entry = ku.check_old_kernel("6.1.0-9-amd64", ["6.1.0-9-amd64"], one_kernel, [], pkg)
    assert not no_entry["ok"] and "update-grub" in no_entry["fix"]


def test_decide_lists_every_failed_check_with_its_fix():
    checks = [ku.check("grub_default", True, "fine"), ku.check("target", False, "not there", "pin another"),
              ku.check("driver", False, "missing", "build it")]
    v = ku.decide(checks)
    assert not v["ok"] and v["failed_checks"] == ["target", "driver"]
    assert v["msg"] == ("preflight failed, the host stays on its kernel: target: not there. pin another | "
                        "driver: missing. build it")
    assert ku.decide(checks[:1]) == {"ok": True, "failed_checks": [], "msg": "preflight passed: fine"}


@pytest.mark.parametrize("version", ["6.1.0-56-cloud-amd64", "5.14.0-427.el9.x86_64", "6.8.0-45-generic"])
def test_valid_versions(version):
    assert ku.validate_version(version) == version


@pytest.mark.parametrize("version", ["", "linux-image-6.1", "6.1 0", "6.1;reboot", None, "../6.1"])
def test_invalid_versions(version):
    with pytest.raises(ku.KernelUpgradeError, match="uname -r"):
        ku.validate_version(version)


# ---- boot plans -----------------------------------------------------------------------------------------------------
def test_pin_old_default_before_install(one_kernel):
    plan = ku.boot_plan(one_kernel, {}, OLD, "default")
    assert plan["actions"] == [{"action": "set_default", "entry": OLD_PATH}]
    assert ku.boot_plan(one_kernel, {"saved_entry": OLD_PATH}, OLD, "default")["actions"] == []


def test_boot_once_then_keep_or_roll_back(two_kernels):
    env = {"saved_entry": OLD_PATH}
    assert ku.boot_plan(two_kernels, env, NEW, "once")["actions"] == [{"action": "set_once", "entry": NEW_PATH}]
    assert ku.boot_plan(two_kernels, dict(env, next_entry=NEW_PATH), NEW, "once")["actions"] == []
    assert ku.boot_plan(two_kernels, env, NEW, "default")["actions"] == [{"action": "set_default", "entry": NEW_PATH}]
    # a rollback while a one-shot entry is still pending drops it, so the next boot is the old kernel
    assert ku.boot_plan(two_kernels, dict(env, next_entry=NEW_PATH), OLD, "default")["actions"] == [
        {"action": "clear_once", "entry": NEW_PATH}]
    # a saved default by index 0 boots the newest kernel: pinning the old one must rewrite it
    assert ku.boot_plan(two_kernels, {"saved_entry": "0"}, OLD, "default")["actions"][0]["action"] == "set_default"


def test_boot_plan_without_an_entry_says_what_to_do(one_kernel):
    with pytest.raises(ku.KernelUpgradeError, match=f"no GRUB menu entry .* boots kernel {NEW} .*entries boot: {OLD}.*update-grub"):
        ku.boot_plan(one_kernel, {}, NEW, "once")


# ---- the fleet report -----------------------------------------------------------------------------------------------
def record(host, decision, base, cand, ratio=None, run_id="r1"):
    return {"format": "gpufleet.kernel_upgrade/1", "host": host, "run_id": run_id, "target": NEW, "old": OLD,
            "decision": decision, "reason": f"{decision} because", "final_kernel": NEW if decision == "pass" else OLD,
            "default_kernel": NEW if decision == "pass" else OLD, "locked": [f"linux-image-{NEW if decision == 'pass' else OLD}"],
            "baseline": {"samples": base}, "candidate": {"samples": cand},
            "gate": {"decision": decision, "ratio": ratio, "p_value": 0.004, "p_value_pass": 1.0, "decided_by": "test"}, "timings": {"total_s": 600.0},
            "server_after_rollback": "serving" if decision == "regression" else None}


def test_fleet_report_rows_counts_and_markdown():
    recs = [record("lab1", "pass", [100, 102, 98, 101, 99], [101, 100, 99, 103, 98], 1.0),
            record("lab3", "regression", [100, 101, 99, 100, 102], [40, 42, 41, 39, 43], 0.41),
            record("old", "pass", [1], [1], run_id="r0")]
    rep = kr.fleet_report(recs, ["lab1", "lab2", "lab3"], "r1")
    assert [h["decision"] for h in rep["hosts"]] == ["pass", "not reached", "regression"]
    assert rep["counts"] == {"not reached": 1, "pass": 1, "regression": 1}
    assert rep["failed"] == ["lab3"] and not rep["ok"]
    assert rep["hosts"][0]["baseline_median"] == 100.0 and rep["hosts"][2]["candidate_median"] == 41.0
    md = kr.render_markdown(rep)
    assert "Outcome: 1 regression, 1 pass, 1 not reached; failed: lab3." in md
    assert f"| lab3 | **regression** | {OLD} -> {NEW} | {OLD} | {OLD} | 100.0 (5) | 41.0 (5) | 0.410 | 0.0040 | 1.0000 | test |" in md
    assert "- **lab3** (regression): regression because Server after the rollback: serving." in md
    assert "| lab2 | **not reached** |" in md and "its wave has not run yet" in md


def test_fleet_report_counts_inconclusive_apart_from_regression():
    noisy = record("lab4", "inconclusive", [100, 130, 80, 115, 90], [], None)
    noisy["gate"] = {"decision": "inconclusive", "final": True, "decided_by": "too-noisy", "cv": 0.186,
                     "smallest_detectable_drop": 0.21, "too_noisy": True, "advice": "runs of about 2300 requests (now 128)"}
    recs = [record("lab3", "regression", [100, 101, 99, 100, 102], [40, 42, 41, 39, 43], 0.41), noisy]
    rep = kr.fleet_report(recs, ["lab3", "lab4"], "r1")
    assert rep["counts"] == {"inconclusive": 1, "regression": 1}
    assert rep["inconclusive"] == ["lab4"] and rep["failed"] == ["lab3", "lab4"]
    assert rep["hosts"][1]["cv"] == 0.186 and rep["hosts"][1]["advice"].startswith("runs of about 2300")
    md = kr.render_markdown(rep)
    assert "Outcome: 1 regression, 1 inconclusive; failed: lab3, lab4." in md
    assert ("- **lab4** (inconclusive): inconclusive because Measured CV 18.6%, smallest detectable drop 21.0%; would "
            "help: runs of about 2300 requests (now 128).") in md
    summary = kr.gate_summary(dict(noisy["gate"], screened=[{"side": "baseline", "index": 2}]))
    assert summary["too_noisy"] and summary["cv"] == 0.186 and summary["screened"][0]["index"] == 2


def test_gate_summary_keeps_what_the_record_needs():
    gate = {"decision": "pass", "ratio": 1.01, "p_value": 0.6, "p_value_pass": 0.004, "decided_by": "test", "threshold": 0.95,
            "alpha": 0.01, "reason": "pass: ...", "ci": [0.98, 1.03], "warnings": [], "method": "exact",
            "baseline": {"n": 5, "median": 100.0, "mean": 100.0, "cv": 0.01, "min": 99.0, "max": 101.0}}
    s = kr.gate_summary(gate)
    assert s["decision"] == "pass" and s["baseline"]["median"] == 100.0 and s["candidate"] == {
        "n": None, "median": None, "cv": None, "min": None, "max": None}
    assert "method" not in s and kr.gate_summary({}) == {} and kr.gate_summary(None) == {}


def test_fleet_report_shows_each_part_of_the_serving_verdict_and_why_one_said_no():
    """A host rolled back for diverged outputs: the JSON row and the Markdown table carry each part with its figure,
    the Why section the part that said no and the one not measured, with their reasons; a record from before the parts
    has none (a dash)."""
    from tests.unit.plugins.module_utils.flow_sim import Host, drive
    host = Host(outputs_new="diverged")
    drive(host)
    journal = host.history[0]
    record = {"host": "lab1", "run_id": "r1", "decision": "diverged", "reason": journal["verdict"]["reason"],
              "verdict": journal["verdict"], "gate": {"ratio": 1.0}}
    rep = kr.fleet_report([record, {"host": "lab2", "run_id": "r1", "decision": "pass", "reason": "old record"}],
                          ["lab1", "lab2"], "r1")
    row = rep["hosts"][0]
    assert row["parts"]["outputs"] == {"answer": "diverged", "says": "no", "reason": "diverged (simulated)",
                                       "figures": {"top1_agreement": 0.8}}
    assert row["parts"]["throughput"]["says"] == "yes" and row["parts"]["throughput"]["figures"]["ratio"] > 0.9
    assert rep["hosts"][1]["parts"] == {} and rep["failed"] == ["lab1"] and rep["counts"] == {"diverged": 1, "pass": 1}
    md = kr.render_markdown(rep)
    assert "| throughput | latency | outputs | stability |" in md and "no (diverged) top-1 0.800" in md
    assert "  - outputs: no (diverged): diverged (simulated)" in md
    assert "  - latency: not measured: no per-run TTFT/TPOT given for both sides" in md
    assert md.startswith("# Kernel rollout r1\n\nOutcome: 1 diverged, 1 pass;")

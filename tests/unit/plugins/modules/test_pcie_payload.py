# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pcie_payload: the YAML cases (every setpci call path), and the byte-level proof with the real
setpci and systemctl on fake sysfs trees: MPS/MRRS written and read back, the boot unit's own
command re-applying them after a simulated reboot, and state=default restoring the original
config space byte for byte."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import payload as pp
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import boot
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.reapply import render_script
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.modules import pcie_payload
from tests.unit.fakesysfs import load_capture, payload_switch, two_gpus_one_switch, two_numa_nodes
from tests.unit.plugins.modules.uthelper import UTHelper, missing_tool, needs_tools, target_side

SETPCI = shutil.which("setpci")
SYSTEMCTL = shutil.which("systemctl")
# The YAML cases run everywhere; those with real: true need setpci, checked per case by UTHelper
# (a skip where it is missing, a failure under GPUFLEET_REQUIRE_TOOLS=1, as CI runs).
needs_setpci = needs_tools("setpci")
needs_setpci_systemctl = needs_tools("setpci", "systemctl")


@pytest.fixture(autouse=True)
def _target_side(monkeypatch):
    target_side(monkeypatch)


def subprocess_run(argv):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False,
                          env=dict(os.environ, LC_ALL="C", LANG="C"))
    return proc.returncode, proc.stdout, proc.stderr


def tuned_switch(root, persist: bool = True, **kw):
    """payload_switch as a first run of the module leaves it: tuned, recorded and persisted."""
    missing_tool(["setpci"], "the tuned_switch builder (it tunes the tree with the real setpci)")
    payload_switch(root, **kw)
    fs = HostFS(str(root))
    model = pp.gather(fs, [])
    plan = pp.plan_present(model, "max_safe", 4096, None, True)
    outcome = pp.apply_writes(fs, plan["writes"], subprocess_run, SETPCI)
    assert not outcome["failures"], outcome
    record = pp.merge_record(pp.empty_record(), plan["writes"], model["functions"])
    fs.write_atomic("/var/lib/gpufleet/pcie_payload/originals.json", boot.render_json(record))
    if persist:
        live = {b: {"mps": d["mps_after"], "mrrs": d["mrrs_after"]} for b, d in plan["devices"].items()}
        fs.write_atomic(boot.PERSIST_CONFIG, boot.render_persist(pp.persist_entries(plan["managed"], {}, live)))
        fs.write_atomic(boot.APPLY_SCRIPT, render_script(sys.executable), 0o755)
        fs.write_atomic(boot.UNIT_PATH, boot.render_unit())
        wants = Path(fs.path(boot.UNIT_WANTS))
        wants.parent.mkdir(parents=True, exist_ok=True)
        wants.symlink_to(boot.UNIT_PATH)


def persisted_only(root):
    """The boot unit of a run that changed nothing (unit_keeps_values_that_needed_no_change)."""
    fs = HostFS(str(root))
    model = pp.gather(fs, [])
    plan = pp.plan_present(model, "max_safe", 4096)
    assert plan["writes"] == []
    live = {b: {"mps": d["mps_after"], "mrrs": d["mrrs_after"]} for b, d in plan["devices"].items()}
    fs.write_atomic(boot.PERSIST_CONFIG, boot.render_persist(pp.persist_entries(plan["managed"], {}, live)))
    fs.write_atomic(boot.APPLY_SCRIPT, render_script(sys.executable), 0o755)
    fs.write_atomic(boot.UNIT_PATH, boot.render_unit())
    wants = Path(fs.path(boot.UNIT_WANTS))
    wants.parent.mkdir(parents=True, exist_ok=True)
    wants.symlink_to(boot.UNIT_PATH)


def short_peer(root):
    payload_switch(root)
    cfg = Path(root) / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0/config"
    cfg.write_bytes(cfg.read_bytes()[:64])


def capture(root, name):
    load_capture(name, root)


def check_config(root, expected, result):
    fs = HostFS(str(root))
    for bdf, want in expected.items():
        now = pp.read_payload(fs, bdf)
        assert (now["mps"], now["mrrs"]) == (want.get("mps", now["mps"]), want.get("mrrs", now["mrrs"])), (bdf, now)
        if "devctl_other_bits" in want:
            assert now["devctl"] & ~0x70E0 & 0xFFFF == want["devctl_other_bits"], hex(now["devctl"])


def check_record_lacks(root, bdf, result):
    record = json.loads((Path(root) / "var/lib/gpufleet/pcie_payload/originals.json").read_text())
    assert bdf not in record["devices"]


test_yaml_case = UTHelper(
    pcie_payload, __file__,
    builders={"payload_switch": payload_switch, "tuned_switch": tuned_switch, "two_numa_nodes": two_numa_nodes,
              "capture": capture, "short_peer": short_peer, "persisted_only": persisted_only},
    checks={"config": check_config, "record_lacks": check_record_lacks},
).test_function()


# ---- the real thing, end to end -------------------------------------------------------------------
def run_module(args, capsys):
    """main() with nothing replaced: the real setpci and systemctl run against the tree."""
    with patch_module_args(args), pytest.raises(SystemExit):
        pcie_payload.main()
    return json.loads(capsys.readouterr().out)


def snapshot(root) -> dict[str, bytes]:
    base = Path(root) / "sys/bus/pci/devices"
    return {bdf: (base / bdf / "config").read_bytes() for bdf in sorted(os.listdir(base))}


def restore(root, snap) -> None:
    base = Path(root) / "sys/bus/pci/devices"
    for bdf, data in snap.items():
        (base / bdf / "config").write_bytes(data)


def changed_bytes(before: dict, after: dict) -> dict[str, list[int]]:
    return {bdf: [i for i, (a, b) in enumerate(zip(before[bdf], after[bdf])) if a != b]
            for bdf in before if before[bdf] != after[bdf]}


def unit_command(root) -> list[str]:
    """The ExecStart of the installed unit, run against the tree: the same script and config file."""
    unit = (Path(root) / boot.UNIT_PATH.lstrip("/")).read_text()
    exec_start = [ln.split("=", 1)[1] for ln in unit.splitlines() if ln.startswith("ExecStart=")]
    assert len(exec_start) == 1
    argv = shlex.split(exec_start[0])
    assert argv == [boot.APPLY_SCRIPT, boot.PERSIST_CONFIG]
    script = Path(root) / argv[0].lstrip("/")
    assert os.stat(script).st_mode & stat.S_IXUSR
    shebang = script.read_text().splitlines()[0]
    assert shebang == "#!" + sys.executable
    return [sys.executable, str(script), "--root", str(root), str(Path(root) / argv[1].lstrip("/"))]


@needs_setpci_systemctl
def test_byte_level_cycle_on_a_switch_where_path_and_peer_limits_differ(tmp_path, capsys):
    root = tmp_path / "host"
    payload_switch(root)
    firmware = snapshot(root)
    args = {"root": str(root), "mps": "max_safe", "mrrs": 4096}

    first = run_module(args, capsys)
    assert first["changed"] is True, first
    gpu_a = first["devices"]["0000:03:00.0"]
    assert (gpu_a["path_limit"], gpu_a["peer_limit"], gpu_a["limit"], gpu_a["limiting_device"]) == (512, 256, 256, "0000:04:00.0")
    tuned = snapshot(root)
    # Only the Device Control register (PCIe capability at 0x60, +8) changed, on the six functions of the hierarchy.
    assert changed_bytes(firmware, tuned) == {
        "0000:00:01.0": [0x68], "0000:01:00.0": [0x68], "0000:02:00.0": [0x68], "0000:02:01.0": [0x68],
        "0000:03:00.0": [0x68, 0x69], "0000:04:00.0": [0x68, 0x69]}
    fs = HostFS(str(root))
    for bdf in ("0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0"):
        assert (pp.read_payload(fs, bdf)["mps"], pp.read_payload(fs, bdf)["mrrs"]) == (256, 512)
    for bdf in ("0000:03:00.0", "0000:04:00.0"):
        now = pp.read_payload(fs, bdf)
        assert (now["mps"], now["mrrs"]) == (256, 4096)
        assert now["devctl"] & ~0x70E0 & 0xFFFF == pp.devctl_of(firmware[bdf], 0x60) & ~0x70E0 & 0xFFFF
    assert pp.read_payload(fs, "0000:06:00.0")["mps"] == 256  # other root port: untouched
    assert (root / boot.UNIT_WANTS.lstrip("/")).is_symlink()

    # The unit file is valid for systemd.
    analyze = shutil.which("systemd-analyze")
    if analyze:
        proc = subprocess.run([analyze, f"--root={root}", "verify", boot.UNIT_NAME], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, check=False)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr

    # Second run: nothing to do.
    second = run_module(args, capsys)
    assert (second["changed"], second["actions"]) == (False, [])

    # A reboot brings the firmware's values back; the unit's own command re-applies the tuned ones.
    restore(root, firmware)
    proc = subprocess.run(unit_command(root), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 0, proc.stdout
    assert snapshot(root) == tuned
    assert "0000:00:01.0: MaxPayload 128 -> 256" in proc.stdout
    assert "0000:03:00.0: MaxReadReq 512 -> 4096" in proc.stdout
    assert proc.stdout.rstrip().endswith("6 device(s), 0 failed")
    # Run again at the next boot with nothing to do: every line says "already set".
    proc = subprocess.run(unit_command(root), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 0 and "->" not in proc.stdout and "MaxPayload 256 already set" in proc.stdout

    # state=default: the original config space, byte for byte, and no unit left.
    back = run_module({"root": str(root), "state": "default"}, capsys)
    assert back["changed"] is True, back
    assert snapshot(root) == firmware
    for path in (boot.UNIT_PATH, boot.APPLY_SCRIPT, boot.PERSIST_CONFIG, boot.UNIT_WANTS, "/var/lib/gpufleet/pcie_payload/originals.json"):
        assert not os.path.lexists(root / path.lstrip("/")), path
    again = run_module({"root": str(root), "state": "default"}, capsys)
    assert (again["changed"], again["actions"]) == (False, [])


def rebooted_after_tuning(root, capsys) -> dict[str, bytes]:
    """payload_switch tuned by the module (max_safe, MRRS 4096, persisted), then rebooted: the firmware's values
    are back and the boot unit is to run. Returns the firmware's config space."""
    payload_switch(root)
    firmware = snapshot(root)
    assert run_module({"root": str(root), "mps": "max_safe", "mrrs": 4096}, capsys)["changed"] is True
    restore(root, firmware)
    return firmware


@needs_setpci_systemctl
def test_boot_unit_rolls_back_a_hierarchy_whose_device_does_not_take(tmp_path, capsys):
    root = tmp_path / "host"
    firmware = rebooted_after_tuning(root, capsys)
    # setpci that ignores writes to 0000:02:01.0, as a read-only field would
    wrapper = tmp_path / "setpci-ro"
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" 0000:02:01.0 "*) exit 0;; esac\nexec {SETPCI} "$@"\n')
    wrapper.chmod(0o755)
    argv = unit_command(root)
    proc = subprocess.run(argv[:2] + ["--setpci", str(wrapper)] + argv[2:], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 1, proc.stdout
    assert "error: 0000:02:01.0 MaxPayload 256: the device still reads 128" in proc.stdout
    assert "0000:00:01.0: MaxPayload rolled back to 128" in proc.stdout
    assert "0000:03:00.0: skipped, an earlier write below 0000:00:01.0 failed" in proc.stdout
    assert snapshot(root) == firmware  # the hierarchy is back where the firmware left it


@needs_setpci_systemctl
def test_boot_unit_skips_a_replaced_card_and_applies_the_rest(tmp_path, capsys):
    root = tmp_path / "host"
    two_numa_nodes(root)
    assert run_module({"root": str(root), "mrrs": 4096}, capsys)["changed"] is True
    tuned = snapshot(root)
    firmware_17 = bytearray(tuned["0000:17:00.0"])
    firmware_17[0x69] = (firmware_17[0x69] & 0x8F) | 0x20  # MRRS 512
    firmware_97 = bytearray(tuned["0000:97:00.0"])
    firmware_97[0x69] = (firmware_97[0x69] & 0x8F) | 0x20
    restore(root, {"0000:17:00.0": bytes(firmware_17), "0000:97:00.0": bytes(firmware_97)})
    (root / "sys/bus/pci/devices/0000:17:00.0/device").write_text("0x2335\n")
    proc = subprocess.run(unit_command(root), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 1
    assert "error: 0000:17:00.0 is 0x10de:0x2335, not the recorded 0x10de:0x2330 (card replaced?)" in proc.stdout
    assert pp.read_payload(HostFS(str(root)), "0000:17:00.0")["mrrs"] == 512
    assert pp.read_payload(HostFS(str(root)), "0000:97:00.0")["mrrs"] == 4096


def test_apply_script_rejects_a_foreign_file(tmp_path):
    script = tmp_path / "apply"
    script.write_text(render_script(sys.executable))
    bad = tmp_path / "x.json"
    bad.write_text('{"format": "other"}')
    proc = subprocess.run([sys.executable, str(script), str(bad)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False)
    assert proc.returncode == 2 and "is not a gpufleet-pcie-payload/1 file" in proc.stdout
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "missing.json")], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 2 and "cannot read" in proc.stdout


@needs_setpci
def test_check_mode_leaves_every_byte(tmp_path, capsys):
    root = tmp_path / "host"
    payload_switch(root, nic=True)
    before = snapshot(root)
    files_before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    result = run_module({"root": str(root), "devices": ["03:00.0", "04:00.0", "05:00.0"], "mps": "max_safe", "mrrs": 4096,
                         "_ansible_check_mode": True, "_ansible_diff": True}, capsys)
    assert result["changed"] is True and len([a for a in result["actions"] if a["action"] == "set"]) == 11
    assert snapshot(root) == before
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == files_before


@needs_setpci
def test_multifunction_gpu_functions_get_the_same_mps(tmp_path, capsys):
    """A GPU's audio function shares its link: the kernel gives it the same MaxPayload, so do we."""
    host = two_gpus_one_switch(tmp_path / "host", acs=True)
    host.add("0000:03:00.1", "0000:02:00.0", class_code="0x040300", vendor="0x10de", device="0x22a3", mps_supported=512,
             mps=256, group=None)
    for bdf in ("0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0", "0000:03:00.0", "0000:04:00.0"):
        cfg = host.real(f"/sys/bus/pci/devices/{bdf}/config")
        data = bytearray(cfg.read_bytes())
        data[0x64] = (data[0x64] & 0xF8) | 2  # DevCap: 512
        cfg.write_bytes(bytes(data))
    result = run_module({"root": str(tmp_path / "host"), "mps": "max_safe", "persist": False}, capsys)
    assert result["changed"] is True, result
    assert result["devices"]["0000:03:00.1"]["role"] == "function"
    fs = HostFS(str(tmp_path / "host"))
    assert {pp.read_payload(fs, b)["mps"] for b in ("0000:00:01.0", "0000:03:00.0", "0000:03:00.1", "0000:04:00.0")} == {512}


@needs_setpci_systemctl
def test_boot_unit_checks_a_whole_hierarchy_before_writing_any_of_it(tmp_path, capsys):
    """A replaced card at the bottom of a hierarchy: nothing of that hierarchy is written (not written, then rolled back)."""
    root = tmp_path / "host"
    firmware = rebooted_after_tuning(root, capsys)
    (root / "sys/bus/pci/devices/0000:04:00.0/device").write_text("0x2335\n")
    proc = subprocess.run(unit_command(root), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 1, proc.stdout
    assert "error: 0000:04:00.0 is 0x10de:0x2335, not the recorded 0x10de:0x2330 (card replaced?)" in proc.stdout
    assert "0000:00:01.0: skipped, 0000:04:00.0 below 0000:00:01.0 cannot be applied" in proc.stdout
    assert "->" not in proc.stdout and "rolled back" not in proc.stdout
    assert proc.stdout.rstrip().endswith("6 device(s), 1 failed")
    assert snapshot(root) == firmware


@needs_setpci_systemctl
def test_the_diff_shows_each_file_with_its_text_before_and_after(tmp_path, capsys):
    """--diff names every file a run writes or removes, with its text as it was before the run (remembered before
    the first write, not read back after it) and as it is after; the first entry is the register state."""
    root = tmp_path / "host"
    payload_switch(root)
    args = {"root": str(root), "mps": "max_safe", "mrrs": 4096, "_ansible_diff": True}
    first = run_module(args, capsys)
    state, files = first["diff"][0], first["diff"][1:]
    assert state["after"]["boot_unit_enabled"] is True and state["before"]["boot_unit_enabled"] is False
    assert [d["before_header"] for d in files] == [
        "/var/lib/gpufleet/pcie_payload/originals.json", "/usr/local/libexec/gpufleet-pcie-payload-apply",
        "/etc/gpufleet/pcie_payload.json", "/etc/systemd/system/gpufleet-pcie-payload.service"]
    for d in files:
        assert d["before"] == "" and d["after"] == (root / d["before_header"].lstrip("/")).read_text()
    config_before = (root / "etc/gpufleet/pcie_payload.json").read_text()
    second = run_module(dict(args, mrrs=512), capsys)
    changed = {d["before_header"]: d for d in second["diff"][1:]}
    assert changed["/etc/gpufleet/pcie_payload.json"]["before"] == config_before
    assert changed["/etc/gpufleet/pcie_payload.json"]["after"] == (root / "etc/gpufleet/pcie_payload.json").read_text() != config_before
    gone = run_module({"root": str(root), "state": "default", "persist": False, "_ansible_diff": True}, capsys)
    removed = {d["before_header"]: d for d in gone["diff"][1:]}
    assert removed["/etc/systemd/system/gpufleet-pcie-payload.service"]["after_header"].endswith("(removed)")
    assert "[Service]" in removed["/etc/systemd/system/gpufleet-pcie-payload.service"]["before"]
    assert not (root / "etc/systemd/system/gpufleet-pcie-payload.service").exists()

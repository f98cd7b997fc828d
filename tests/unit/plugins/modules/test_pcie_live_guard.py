# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""No config-space write under traffic: pcie_payload refuses a live write on a path with an
active user (named), defer_to_boot persists it for the boot unit instead (which then applies it),
and force writes anyway. The real setpci and systemctl run on fake trees."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._pci import users as pcie_users
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import PciWalker
from tests.unit.fakesysfs import hold, nvidia_proc, payload_switch
from tests.unit.plugins.modules.test_pcie_payload import restore, run_module, snapshot, unit_command
from tests.unit.plugins.modules.uthelper import needs_tools, target_side

SETPCI = shutil.which("setpci")
SYSTEMCTL = shutil.which("systemctl")
pytestmark = needs_tools("setpci", "systemctl")


def warnings_of(result) -> list[str]:
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]


@pytest.fixture(autouse=True)
def _target_side(monkeypatch):
    target_side(monkeypatch)


def busy_switch(root, **kw):
    host = payload_switch(root, **kw)
    nvidia_proc(host, "0000:03:00.0", 0)
    nvidia_proc(host, "0000:04:00.0", 1)
    hold(host, 4242, "python3", "/dev/nvidia1", "/dev/nvidiactl")
    hold(host, 77, "bash", "/dev/null")
    return host


# ---- who uses a path --------------------------------------------------------------------------------
def test_users_names_the_holder_of_a_gpu_below_a_written_bridge(tmp_path):
    busy_switch(tmp_path)
    found = pcie_users.users(PciWalker(HostFS(str(tmp_path))), ["0000:00:01.0"])
    assert found["lines"] == ["process 4242 (python3) holds /dev/nvidia1 of 0000:04:00.0"]
    assert "0000:03:00.0" in found["checked"] and "0000:06:00.0" not in found["checked"]  # the other root port
    # the NVMe path is not this GPU's path: nothing holds it
    assert pcie_users.users(PciWalker(HostFS(str(tmp_path))), ["0000:00:02.0"])["holders"] == []


def test_unresolved_nvidia_minor_counts_any_nvidia_holder(tmp_path):
    host = payload_switch(tmp_path)
    hold(host, 9, "nvidia-smi", "/dev/nvidia3")
    found = pcie_users.users(PciWalker(HostFS(str(tmp_path))), ["0000:03:00.0"])
    assert found["lines"] == ["process 9 (nvidia-smi) holds /dev/nvidia3 of 0000:03:00.0"]
    assert "names no device minor" in found["notes"][0]


def test_render_node_and_open_vfio_group_are_users(tmp_path):
    host = payload_switch(tmp_path)
    host.mkdir(host.dirs["0000:03:00.0"] + "/drm/renderD128")
    host.link(host.dirs["0000:04:00.0"] + "/driver", "/sys/bus/pci/drivers/vfio-pci")
    group = host.real(host.dirs["0000:04:00.0"] + "/iommu_group").resolve().name
    hold(host, 100, "qemu-system-x86", f"/dev/vfio/{group}")
    hold(host, 101, "vllm", "/dev/dri/renderD128")
    lines = pcie_users.users(PciWalker(HostFS(str(tmp_path))), ["0000:01:00.0"])["lines"]
    assert lines == [f"process 100 (qemu-system-x86) holds /dev/vfio/{group} of 0000:04:00.0",
                     "process 101 (vllm) holds /dev/dri/renderD128 of 0000:03:00.0"]


# ---- pcie_payload refuses, defers to boot, or forces ----------------------------------------------
def test_live_payload_write_is_refused_and_nothing_changes(tmp_path, capsys):
    root = tmp_path / "host"
    busy_switch(root)
    firmware = snapshot(root)
    out = run_module({"root": str(root), "mps": "max_safe", "mrrs": 4096}, capsys)
    assert out.get("failed") is True and out["changed"] is False
    assert "Refusing to write MaxPayload/MaxReadReq" in out["msg"]
    assert "process 4242 (python3) holds /dev/nvidia1 of 0000:04:00.0" in out["msg"]
    assert "defer_to_boot: true" in out["msg"] and "force: true" in out["msg"]
    assert snapshot(root) == firmware
    assert not (root / "etc/gpufleet/pcie_payload.json").exists()


def test_check_mode_reports_the_users_and_warns(tmp_path, capsys):
    root = tmp_path / "host"
    busy_switch(root)
    out = run_module({"root": str(root), "mps": "max_safe", "_ansible_check_mode": True}, capsys)
    assert out["changed"] is True and out["path_users"] == ["process 4242 (python3) holds /dev/nvidia1 of 0000:04:00.0"]
    assert any("Refusing to write" in w for w in warnings_of(out))


def test_defer_to_boot_persists_and_the_boot_unit_applies_it(tmp_path, capsys):
    root = tmp_path / "host"
    busy_switch(root)
    firmware = snapshot(root)
    out = run_module({"root": str(root), "mps": "max_safe", "mrrs": 4096, "defer_to_boot": True}, capsys)
    assert out["changed"] is True and out["reboot_required"] is True, out
    assert snapshot(root) == firmware  # nothing written live
    assert {(d["device"], d["register"], d["after"]) for d in out["deferred"]} >= {
        ("0000:00:01.0", "mps", 256), ("0000:03:00.0", "mrrs", 4096)}
    assert {a["action"] for a in out["actions"]} >= {"record_originals", "write_file", "enable_unit", "set_at_boot"}
    # the next boot, before the GPU driver: the unit's own command applies the deferred values
    proc = subprocess.run(unit_command(root), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 0 and "0000:00:01.0: MaxPayload 128 -> 256" in proc.stdout, proc.stdout
    tuned = snapshot(root)
    assert tuned != firmware
    # idle after the boot: the module finds the values in place
    again = run_module({"root": str(root), "mps": "max_safe", "mrrs": 4096}, capsys)
    assert again["changed"] is False and again["path_users"] == [], again
    # state=default is a live write too: refused while the GPU is held, done once it is free
    (root / "proc/4242/fd/3").unlink()
    (root / "proc/4242/fd/4").unlink()
    back = run_module({"root": str(root), "state": "default"}, capsys)
    assert back["changed"] is True and snapshot(root) == firmware, back


def test_restore_is_refused_while_in_use(tmp_path, capsys):
    root = tmp_path / "host"
    host = payload_switch(root)
    firmware = snapshot(root)
    assert run_module({"root": str(root), "mps": "max_safe"}, capsys)["changed"] is True
    nvidia_proc(host, "0000:03:00.0", 0)
    nvidia_proc(host, "0000:04:00.0", 1)
    hold(host, 5, "vllm", "/dev/nvidia0")
    out = run_module({"root": str(root), "state": "default"}, capsys)
    assert out.get("failed") is True and "Refusing to restore" in out["msg"] and "process 5 (vllm)" in out["msg"]
    assert snapshot(root) != firmware
    forced = run_module({"root": str(root), "state": "default", "force": True}, capsys)
    assert forced["changed"] is True and snapshot(root) == firmware


def test_force_writes_under_traffic(tmp_path, capsys):
    root = tmp_path / "host"
    busy_switch(root)
    firmware = snapshot(root)
    out = run_module({"root": str(root), "mps": "max_safe", "force": True, "persist": False}, capsys)
    assert out["changed"] is True and out["path_users"] and snapshot(root) != firmware
    restore(root, firmware)

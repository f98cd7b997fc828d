# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vfio_bind: execute() against a simulated kernel (SimKernel acts on driver_override, unbind and drivers_probe
as the kernel does), and main() through AnsibleModule for check mode and the error paths."""

from __future__ import annotations

import json

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.vfio import binding as vfio
from ansible_collections.gpufleet.inference.plugins.module_utils.vfio import vfio_bind as vfio_bind_utils
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.modules import vfio_bind
from tests.unit.fakesysfs import (
    FakeHost, SimKernel, driver_module, group_of, hold, mount, net_interface, nvidia_proc, nvme_disk, two_gpus_one_switch,
)
from tests.unit.plugins.module_utils.test_vfio import gpu_host
from tests.unit.plugins.modules.uthelper import run_module

GPU, AUDIO, NVME = "0000:17:00.0", "0000:17:00.1", "0000:18:00.0"


def override(bdf, before, after) -> dict:
    """The action that sets (or clears) one function's driver_override."""
    return {"action": "set_override", "device": bdf, "path": f"/sys/bus/pci/devices/{bdf}/driver_override",
            "before": before, "after": after}


def params(**kw):
    base = {"devices": [GPU], "state": "present", "companions": True, "group_allow": [], "force": False, "bind_now": True,
            "persist": "none", "restore_driver": None, "timeout": 1.0}
    base.update(kw)
    return base


class Run:
    """bind() (what execute() runs) on a SimKernel, collecting modprobe calls and warnings."""

    def __init__(self, host, **sim_kw):
        self.sim = SimKernel(host, **sim_kw)
        self.modprobes: list[str] = []
        self.warnings: list[str] = []

    def modprobe(self, name):
        self.modprobes.append(name)
        if name not in ("vfio-pci", "nvidia", "snd_hda_intel"):
            raise vfio.VfioError(f"modprobe {name}: module not found")
        self.sim.load(name)

    def __call__(self, check_mode=False, **kw):
        return vfio_bind_utils.bind(params(**kw), self.sim.fs(), check_mode, self.modprobe,
                                    watcher=vfio.BindWatcher(self.sim.fs(), use_udev=False), warn=self.warnings.append)


# ---- bind and give back ---------------------------------------------------------------------------------
def test_bind_gpu_and_audio_loads_vfio_records_originals_and_persists(tmp_path):
    host = gpu_host(tmp_path)
    run = Run(host)
    result = run(devices=["10de:2330"], persist="udev")
    assert result["changed"] is True
    assert run.modprobes == ["vfio-pci"]
    assert result["actions"] == [
        override(GPU, None, "vfio-pci"), {"action": "unbind", "device": GPU, "driver": "nvidia"},
        {"action": "load_module", "module": "vfio-pci"}, {"action": "probe", "device": GPU, "driver": "vfio-pci"},
        override(AUDIO, None, "vfio-pci"), {"action": "unbind", "device": AUDIO, "driver": "snd_hda_intel"},
        {"action": "probe", "device": AUDIO, "driver": "vfio-pci"}, {"action": "write", "path": vfio.UDEV_RULES}]
    assert [(d["bdf"], d["driver_before"], d["driver_after"], d["selected_by"]) for d in result["devices"]] == [
        (GPU, "nvidia", "vfio-pci", "id"), (AUDIO, "snd_hda_intel", "vfio-pci", "companion")]
    assert run.sim.driver(GPU) == run.sim.driver(AUDIO) == "vfio-pci"
    assert result["udev_rules_changed"] is True and result["initramfs_update_required"] is False
    fs = HostFS(str(host.root))
    assert vfio.udev_bdfs(fs.read_text(vfio.UDEV_RULES)) == [GPU, AUDIO]
    assert json.loads(fs.read_text(vfio.STATE_FILE)) == {
        GPU: {"driver": "nvidia", "module": "nvidia", "id": "10de:2330"},
        AUDIO: {"driver": "snd_hda_intel", "module": "snd_hda_intel", "id": "10de:22e8"}}
    group = str(group_of(host, GPU))
    assert [m["verdict"] for m in result["groups"][group]] == ["bound with the targets", "bound with the targets"]
    # the original drivers were recorded before the first kernel write
    first_kernel_write = next(i for i, (p, _d) in enumerate(run.sim.writes) if p.startswith("/sys/bus/pci"))
    assert first_kernel_write == 0 and fs.exists(vfio.STATE_FILE)


def test_second_run_changes_nothing(tmp_path):
    host = gpu_host(tmp_path)
    run = Run(host)
    run(devices=["10de:2330"], persist="udev")
    run.sim.writes.clear()
    again = run(devices=["10de:2330"], persist="udev")
    assert (again["changed"], again["actions"], run.sim.writes) == (False, [], [])
    assert again["wait_source"] is None


def test_check_mode_reads_everything_and_writes_nothing(tmp_path):
    host = gpu_host(tmp_path)
    run = Run(host)
    result = run(check_mode=True, devices=[GPU], persist="udev")
    assert run.sim.writes == [] and run.modprobes == []
    assert result["changed"] is True and {"action": "load_module", "module": "vfio-pci"} in result["actions"]
    assert [d["driver_after"] for d in result["devices"]] == ["vfio-pci", "vfio-pci"]
    assert run.sim.driver(GPU) == "nvidia"
    assert not HostFS(str(host.root)).exists(vfio.UDEV_RULES)
    bindings = result["diff"][0]
    assert f"{GPU}: driver=nvidia driver_override=none" in bindings["before"]
    assert f"{GPU}: driver=vfio-pci driver_override=vfio-pci" in bindings["after"]
    assert result["diff"][1]["after_header"] == vfio.UDEV_RULES


def test_absent_gives_the_functions_back_and_cleans_up(tmp_path):
    host = gpu_host(tmp_path)
    run = Run(host)
    run(devices=["10de:2330"], persist="udev")
    back = run(devices=["10de:2330"], state="absent", persist="udev")
    assert back["changed"] is True
    assert run.sim.driver(GPU) == "nvidia" and run.sim.driver(AUDIO) == "snd_hda_intel"
    assert [d["driver_override_after"] for d in back["devices"]] == [None, None]
    fs = HostFS(str(host.root))
    assert not fs.exists(vfio.UDEV_RULES) and not fs.exists(vfio.STATE_FILE)
    assert run.sim.vectors[GPU] == len(fs.listdir(f"/sys/bus/pci/devices/{GPU}/msi_irqs"))  # the driver's vectors are back
    again = run(devices=["10de:2330"], state="absent", persist="udev")
    assert again["changed"] is False


def test_absent_loads_the_original_driver_when_it_is_gone(tmp_path):
    host = gpu_host(tmp_path)
    run = Run(host)
    run(devices=[GPU])
    # nvidia was unloaded meanwhile (no other GPU kept it)
    host.real("/sys/bus/pci/drivers/nvidia/module").unlink()
    host.real("/sys/bus/pci/drivers/nvidia").rmdir()
    run(devices=[GPU], state="absent")
    assert run.modprobes == ["vfio-pci", "nvidia"] and run.sim.driver(GPU) == "nvidia"


def test_absent_fails_when_the_original_driver_does_not_return(tmp_path):
    host = gpu_host(tmp_path)
    run = Run(host)
    run(devices=[GPU], companions=False, group_allow=[AUDIO])
    with pytest.raises(vfio.VfioError, match=rf"Failed to bind {GPU} to nouveau: after 1 s it is bound to nvidia\. nvidia claimed it first"):
        run.sim.host.mkdir("/sys/bus/pci/drivers/nouveau")
        run(devices=[GPU], companions=False, group_allow=[AUDIO], state="absent", restore_driver="nouveau")


# ---- refusals: nothing changes ---------------------------------------------------------------------------
def test_shared_group_is_refused_before_any_write(tmp_path):
    host = two_gpus_one_switch(tmp_path, acs=False)
    nvidia_proc(host, "0000:03:00.0", 0)
    nvidia_proc(host, "0000:04:00.0", 1)
    run = Run(host)
    with pytest.raises(vfio.VfioError) as err:
        run(devices=["0000:03:00.0"], persist="udev")
    group = group_of(host, "0000:03:00.0")
    assert f"IOMMU group {group} also holds 0000:04:00.0 (3D controller [10de:2330])" in str(err.value)
    assert str(err.value).endswith("Nothing was changed.")
    assert run.sim.writes == [] and run.modprobes == []
    assert run(devices=["0000:03:00.0"], group_allow=["0000:04:00.0"], check_mode=True)["changed"] is True


def test_in_use_gpu_is_refused_unless_forced(tmp_path):
    host = gpu_host(tmp_path)
    nvidia_proc(host, GPU, 0)
    hold(host, 31337, "vllm", "/dev/nvidia0")
    run = Run(host)
    with pytest.raises(vfio.VfioError, match=r"0000:17:00.0 \(3D controller, on nvidia\) is in use: process 31337 \(vllm\) holds "
                                             r"/dev/nvidia0\. Stop what uses it .* force: true"):
        run(devices=[GPU])
    assert run.sim.writes == []
    result = run(devices=[GPU], force=True)
    assert run.sim.driver(GPU) == "vfio-pci"
    assert result["devices"][0]["in_use"] == ["process 31337 (vllm) holds /dev/nvidia0"]
    assert any("Releasing it anyway (force: true)" in w for w in run.warnings)


def test_mounted_nvme_is_refused(tmp_path):
    host = gpu_host(tmp_path)
    blocks = nvme_disk(host, NVME)
    mount(host, blocks[1]["dev"], "/var/lib/vllm")
    host.mkdir("/sys/bus/pci/drivers/vfio-pci")
    run = Run(host)
    with pytest.raises(vfio.VfioError, match="/dev/nvme0n1p1 is mounted on /var/lib/vllm"):
        run(devices=[NVME])
    assert run.sim.writes == []


def test_vm_holding_the_group_blocks_absent(tmp_path):
    host = gpu_host(tmp_path)
    run = Run(host)
    run(devices=[GPU])
    hold(host, 4000, "qemu-system-x86", f"/dev/vfio/{group_of(host, GPU)}")
    with pytest.raises(vfio.VfioError, match="qemu-system-x86"):
        run(devices=[GPU], state="absent")
    assert run.sim.driver(GPU) == "vfio-pci"


def test_iommu_off_is_refused_with_the_fix_and_bind_now_false_persists_only(tmp_path):
    host = gpu_host(tmp_path)
    host.iommu = False
    for link in host.real("/sys/kernel/iommu_groups").iterdir():
        for member in (link / "devices").iterdir():
            member.unlink()
            host.real(f"/sys/bus/pci/devices/{member.name}/iommu_group").unlink()
        (link / "devices").rmdir()
        (link / "type").unlink()
        link.rmdir()
    run = Run(host)
    with pytest.raises(vfio.VfioError, match=r"the IOMMU is off on this host .*intel_iommu=on .*bind_now: false"):
        run(devices=[GPU], persist="udev")
    assert run.sim.writes == []
    result = run(devices=[GPU], persist="udev", bind_now=False)
    assert result["actions"] == [{"action": "write", "path": vfio.UDEV_RULES}] and run.sim.driver(GPU) == "nvidia"
    assert result["iommu_enabled"] is False and result["groups"] == {}


def test_persisting_a_function_in_use_is_refused_even_without_binding_now(tmp_path):
    """The next boot would take the NIC that carries this session away: refused unless forced."""
    host = FakeHost(tmp_path, iommu=False)
    host.add("0000:00:01.0", host.host_bridge(), kind="root_port")
    host.add("0000:01:00.0", "0000:00:01.0", class_code="0x020000", vendor="0x1af4", device="0x1041", driver="virtio-pci")
    net_interface(host, "0000:01:00.0", "ens3", up=True)
    run = Run(host)
    with pytest.raises(vfio.VfioError, match=r"0000:01:00.0 \(Ethernet controller, on virtio-pci\) is in use: network interface ens3 is "
                                             r"up\. Writing the persistent rule would take it away at the next boot\."):
        run(devices=["0000:01:00.0"], persist="udev", bind_now=False)
    assert run.sim.writes == [] and not host.real(vfio.UDEV_RULES).exists()
    result = run(devices=["0000:01:00.0"], persist="udev", bind_now=False, force=True)
    assert result["actions"] == [{"action": "write", "path": vfio.UDEV_RULES}]
    assert any("No IOMMU groups on this host" in w for w in run.warnings)


def test_probe_einval_rolls_back_to_the_original_driver(tmp_path):
    """vfio-pci answers -22 for a function without an IOMMU group (here: the group link is missing)."""
    host = gpu_host(tmp_path)
    host.real(f"{host.dirs[GPU]}/iommu_group").unlink()
    host.mkdir("/sys/bus/pci/drivers/vfio-pci")
    run = Run(host)
    with pytest.raises(vfio.VfioError) as err:
        run(devices=[GPU], companions=False, group_allow=[AUDIO])
    msg = str(err.value)
    assert msg.startswith(f"Failed to bind {GPU} to vfio-pci: the kernel answered 'Invalid argument' (-22)")
    assert "intel_iommu=on" in msg and f"Rolled back: {GPU} restored to nvidia." in msg
    assert run.sim.driver(GPU) == "nvidia" and run.sim.override(GPU) is None


def test_modprobe_failure_is_reported_and_rolled_back(tmp_path):
    host = gpu_host(tmp_path)
    run = Run(host)

    def failing_modprobe(name):
        raise vfio.VfioError(f"'modprobe {name}' failed with rc 1: not found")
    run.modprobe = failing_modprobe
    with pytest.raises(vfio.VfioError, match=r"modprobe vfio-pci' failed .*Rolled back: 0000:17:00.0 restored to nvidia"):
        run(devices=[GPU], companions=False, group_allow=[AUDIO])
    assert run.sim.driver(GPU) == "nvidia"


def test_modprobe_persistence_writes_ids_and_softdeps(tmp_path):
    host = gpu_host(tmp_path)
    run = Run(host)
    result = run(devices=[GPU], persist="modprobe")
    assert result["initramfs_update_required"] is True
    text = HostFS(str(host.root)).read_text(vfio.MODPROBE_CONF)
    assert vfio.parse_modprobe(text) == (["10de:22e8", "10de:2330"], ["nvidia", "snd_hda_intel"])
    back = run(devices=[GPU], persist="modprobe", state="absent")
    assert {"action": "remove_id", "path": "/sys/bus/pci/drivers/vfio-pci/remove_id", "id": "10de:2330"} in back["actions"]
    assert not HostFS(str(host.root)).exists(vfio.MODPROBE_CONF)


def test_builtin_driver_binds_by_udev_and_is_refused_by_modprobe(tmp_path):
    """NVMe (built in, no module link): bound at runtime and kept by the udev rule; modprobe.d cannot keep it."""
    host = gpu_host(tmp_path / "a")
    nvme_disk(host, NVME)
    run = Run(host)
    run(devices=[NVME], persist="udev")
    assert run.sim.driver(NVME) == "vfio-pci"
    other = Run(gpu_host(tmp_path / "b"))
    with pytest.raises(vfio.VfioError, match="nvme is built into the kernel"):
        other(devices=[NVME], persist="modprobe")
    assert other.sim.writes == []


# ---- main ---------------------------------------------------------------------------------------------------
def test_main_check_mode_on_a_fake_tree(tmp_path, capsys):
    host = gpu_host(tmp_path)
    result = run_module(vfio_bind, {"root": str(host.root), "devices": ["10de:2330"], "persist": "udev", "_ansible_check_mode": True,
                                    "_ansible_diff": True}, capsys)
    assert result["changed"] is True and result["persist"] == {"method": "udev", "files": [vfio.UDEV_RULES]}
    assert len(result["diff"]) == 2
    assert not HostFS(str(host.root)).exists(vfio.UDEV_RULES)
    assert HostFS(str(host.root)).readlink(f"/sys/bus/pci/devices/{GPU}/driver").endswith("/nvidia")


@pytest.mark.parametrize("devices, message", [
    (["10de:9999"], "No PCI function has the ID 10de:9999"),
    (["gpu0"], "'gpu0' is neither a PCI address nor a vendor:device ID"),
    (["0000:99:00.0"], "PCI function 0000:99:00.0 (from devices: '0000:99:00.0') is not on this host"),
])
def test_main_bad_devices_fail_cleanly(tmp_path, capsys, devices, message):
    host = gpu_host(tmp_path)
    result = run_module(vfio_bind, {"root": str(host.root), "devices": devices}, capsys)
    assert result["failed"] is True and message in result["msg"] and "Traceback" not in result["msg"]


def test_main_refuses_to_load_modules_under_a_fake_root(tmp_path, capsys):
    host = gpu_host(tmp_path)
    host.real(f"{host.dirs[GPU]}/driver").unlink()  # an unbound function: the next step would be modprobe vfio-pci
    result = run_module(vfio_bind, {"root": str(host.root), "devices": [GPU], "companions": False, "group_allow": [AUDIO]}, capsys)
    assert result["failed"] is True
    assert "The vfio-pci driver is not loaded in the tree under root" in result["msg"]
    assert "the module loads kernel modules only on the live host" in result["msg"]


def test_main_reports_a_driver_that_does_not_let_go(tmp_path, capsys):
    """On a plain tree nothing reacts to unbind: the module reads the link back, fails and says so."""
    host = gpu_host(tmp_path)
    host.mkdir("/sys/bus/pci/drivers/vfio-pci")
    result = run_module(vfio_bind, {"root": str(host.root), "devices": [GPU], "companions": False, "group_allow": [AUDIO]}, capsys)
    assert result["msg"].startswith(f"{GPU} is still bound to nvidia after the unbind: the driver refused to let go.")
    assert result["msg"].endswith(f"Rolled back: {GPU} restored to nvidia.")


def test_main_bad_group_allow_and_timeout(tmp_path, capsys):
    host = gpu_host(tmp_path)
    result = run_module(vfio_bind, {"root": str(host.root), "devices": [GPU], "group_allow": ["usb"]}, capsys)
    assert "group_allow: 'usb' is not a PCI address" in result["msg"]
    result = run_module(vfio_bind, {"root": str(host.root), "devices": [GPU], "timeout": 0}, capsys)
    assert "timeout must be a positive number" in result["msg"]


# ---- guards: an unresolvable GPU, the boot display, the BMC's display ----------------------------------
def test_nvidia_gpu_whose_minor_cannot_be_resolved_counts_as_in_use(tmp_path):
    host = gpu_host(tmp_path)
    (host.real("/proc/driver/nvidia/gpus/0000:17:00.0/information")).unlink()
    run = Run(host)
    with pytest.raises(vfio.VfioError, match="names no device minor.*counted as in use.*force: true") as err:
        run()
    assert run.sim.writes == [] and "Nothing was changed." in str(err.value)
    assert run(force=True)["changed"] is True
    assert any("names no device minor" in w and "Releasing it anyway" in w for w in run.warnings)


def test_boot_vga_is_refused_unless_forced(tmp_path):
    host = gpu_host(tmp_path)
    host.write(host.dirs[GPU] + "/boot_vga", "1")
    run = Run(host)
    with pytest.raises(vfio.VfioError, match="0000:17:00.0 is the boot display device \\(boot_vga 1\\).*force_display: true"):
        run()
    assert run.sim.writes == []
    assert run(force_display=True)["changed"] is True
    assert any("boot display device" in w for w in run.warnings)


def test_bmc_display_controller_is_refused_unless_forced(tmp_path):
    host = gpu_host(tmp_path)
    host.add("0000:16:03.0", "pci0000:16", kind="root_port")
    host.add("0000:19:00.0", "0000:16:03.0", kind="pci", class_code="0x030000", vendor="0x1a03", device="0x2000", driver="ast")
    driver_module(host, "ast")
    run = Run(host)
    with pytest.raises(vfio.VfioError, match="0000:19:00.0 is a BMC display controller \\(ASPEED \\[1a03:2000\\]\\)"):
        run(devices=["0000:19:00.0"])
    assert run.sim.writes == []


@pytest.mark.parametrize("record", [
    {GPU: {"foo": 1}}, {"not-a-bdf": {"driver": "nvidia", "module": "nvidia", "id": "10de:2330"}},
    {GPU: {"driver": "nvidia; rm -rf /", "module": "nvidia", "id": "10de:2330"}}, {GPU: {"driver": "nvidia", "module": None, "id": 7}},
])
def test_an_originals_record_of_the_wrong_shape_is_refused_and_kept(tmp_path, record):
    """Issue 31: any JSON object was taken as the record, and state=absent then deleted it with nothing restored from it."""
    host = gpu_host(tmp_path)
    run = Run(host)
    run(devices=["10de:2330"])
    fs = HostFS(str(host.root))
    text = json.dumps(record)
    fs.write_atomic(vfio.STATE_FILE, text)
    with pytest.raises(vfio.VfioError, match="original-drivers.json: the entry .* Nothing was changed"):
        run(devices=["10de:2330"], state="absent")
    assert fs.read_text(vfio.STATE_FILE) == text and run.sim.driver(GPU) == "vfio-pci"


def test_absent_keeps_the_entry_of_a_function_left_without_a_driver():
    originals = {GPU: {"driver": "nvidia", "module": "nvidia", "id": "10de:2330"},
                 AUDIO: {"driver": "snd_hda_intel", "module": "snd_hda_intel", "id": "10de:22ba"}}
    after = {GPU: {"driver": None}, AUDIO: {"driver": "snd_hda_intel"}}
    assert vfio_bind_utils.given_back(originals, after) == {GPU: originals[GPU]}


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 1e9, 0])
def test_a_timeout_out_of_range_is_refused(tmp_path, capsys, timeout):
    """Issue 31: nan passed the 'timeout <= 0' check."""
    host = gpu_host(tmp_path)
    result = run_module(vfio_bind, {"root": str(host.root), "devices": [GPU], "timeout": timeout}, capsys)
    assert result["failed"] and "timeout must be a positive number of seconds, at most 600" in result["msg"]

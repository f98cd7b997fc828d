# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vfio module_utils on synthetic sysfs trees: selectors, companions, IOMMU group checks, in-use checks,
plans and the persistence files."""

from __future__ import annotations

import time

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.vfio import binding as vfio
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import PciWalker
from tests.unit.fakesysfs import (
    FakeHost, driver_module, gpu_with_audio, group_of, hold, mount, net_interface, nvidia_proc, nvme_disk, two_gpus_one_switch,
)


def gpu_host(root) -> FakeHost:
    """Root port 16:01.0 -> GPU 17:00.0 + audio 17:00.1 (one group); root port 16:02.0 -> NVMe 18:00.0 (nvme, built in)."""
    host = FakeHost(root, nodes={0: "0-7", 1: "8-15"})
    hb = host.host_bridge(0, 0x16, numa_node=0)
    host.add("0000:16:01.0", hb, kind="root_port")
    gpu_with_audio(host, "0000:17:00.0", "0000:16:01.0")
    host.add("0000:16:02.0", hb, kind="root_port")
    host.add("0000:18:00.0", "0000:16:02.0", class_code="0x010802", vendor="0x144d", device="0xa80a", driver="nvme", msix=4)
    driver_module(host, "nvidia")
    driver_module(host, "snd_hda_intel")
    nvidia_proc(host, "0000:17:00.0", 0)  # the nvidia driver names every GPU's /dev/nvidiaN minor
    return host


def walker_for(host) -> PciWalker:
    return PciWalker(HostFS(str(host.root)))


def states_of(walker, bdfs):
    return {b: vfio.read_state(walker, b) for b in bdfs}


# ---- selectors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("0000:3b:00.0", ("bdf", "0000:3b:00.0")),
    ("3B:00.1", ("bdf", "0000:3b:00.1")),
    ("10de:2335", ("id", "10de:2335")),
    ("0x10DE:0x2335", ("id", "10de:2335")),
])
def test_parse_selector(text, expected):
    assert vfio.parse_selector(text) == expected


@pytest.mark.parametrize("text", ["10de", "3b:00", "10de:23355", "gpu0", ""])
def test_parse_selector_rejects_garbage_with_the_formats(text):
    with pytest.raises(vfio.VfioError, match="DDDD:BB:DD.F .* vvvv:dddd"):
        vfio.parse_selector(text)


def test_resolve_by_id_takes_every_match_and_the_audio_companion(tmp_path):
    host = gpu_host(tmp_path)
    gpu_with_audio(host, "0000:19:00.0", "0000:16:02.0")
    got = vfio.resolve(walker_for(host), ["10de:2330"])
    assert [(d["bdf"], d["selected_by"], d["companion_of"]) for d in got] == [
        ("0000:17:00.0", "id", None), ("0000:19:00.0", "id", None),
        ("0000:17:00.1", "companion", "0000:17:00.0"), ("0000:19:00.1", "companion", "0000:19:00.0")]


def test_resolve_by_address_without_companions(tmp_path):
    host = gpu_host(tmp_path)
    got = vfio.resolve(walker_for(host), ["17:00.0", "0000:17:00.0"], companions=False)
    assert [d["bdf"] for d in got] == ["0000:17:00.0"]


def test_resolve_unknown_address_and_id_say_what_exists(tmp_path):
    walker = walker_for(gpu_host(tmp_path))
    with pytest.raises(vfio.VfioError, match=r"PCI function 0000:5e:00.0 .* is not on this host .*lspci -D"):
        vfio.resolve(walker, ["5e:00.0"])
    with pytest.raises(vfio.VfioError, match=r"No PCI function has the ID 10de:9999 .*10de:2330.*lspci -nn") as err:
        vfio.resolve(walker, ["10de:9999"])
    assert "8086:1234" not in str(err.value)  # root ports (bridges) are not offered as candidates
    with pytest.raises(vfio.VfioError, match="devices is empty"):
        vfio.resolve(walker, [])


# ---- IOMMU groups ------------------------------------------------------------------------------------
def test_group_check_refuses_a_shared_group_and_names_the_blocker(tmp_path):
    host = two_gpus_one_switch(tmp_path, acs=False)  # switch ports and both GPUs in one group
    walker = walker_for(host)
    groups, problems = vfio.check_groups(walker, states_of(walker, ["0000:03:00.0"]), allow=[])
    group = str(group_of(host, "0000:03:00.0"))
    assert len(problems) == 1
    assert problems[0].startswith(f"Cannot bind 0000:03:00.0 to vfio-pci: IOMMU group {group} also holds "
                                  "0000:04:00.0 (3D controller [10de:2330]), driven by nvidia")
    assert "Add 0000:04:00.0 to devices" in problems[0] and "group_allow" in problems[0] and "move the card" in problems[0]
    verdicts = {m["bdf"]: m["verdict"] for m in groups[group]}
    assert verdicts == {"0000:01:00.0": "bridge", "0000:02:00.0": "bridge", "0000:02:01.0": "bridge",
                        "0000:03:00.0": "bound with the targets", "0000:04:00.0": "blocks"}


def test_group_check_accepts_listed_allowed_and_parked_members(tmp_path):
    host = two_gpus_one_switch(tmp_path, acs=False)
    walker = walker_for(host)
    assert vfio.check_groups(walker, states_of(walker, ["0000:03:00.0", "0000:04:00.0"]), allow=[])[1] == []
    assert vfio.check_groups(walker, states_of(walker, ["0000:03:00.0"]), allow=["0000:04:00.0"])[1] == []
    host.link(f"{host.dirs['0000:04:00.0']}/driver", "/sys/bus/pci/drivers/vfio-pci")
    groups, problems = vfio.check_groups(walker_for(host), states_of(walker_for(host), ["0000:03:00.0"]), allow=[])
    assert problems == []
    assert "already on vfio-pci" in [m["verdict"] for g in groups.values() for m in g]


def test_group_check_refuses_an_unbound_non_bridge_member(tmp_path):
    """The lab's case: a function with no driver shares the group; the kernel would allow it, we do not."""
    host = FakeHost(tmp_path)
    hb = host.host_bridge()
    host.add("0000:00:01.0", hb, kind="root_port")
    host.gpu("0000:01:00.0", "0000:00:01.0")
    host.add("0000:01:01.0", "0000:00:01.0", class_code="0x020000", vendor="0x1af4", device="0x1041",
             group=group_of(host, "0000:01:00.0"))
    walker = walker_for(host)
    _groups, problems = vfio.check_groups(walker, states_of(walker, ["0000:01:00.0"]), allow=[])
    assert len(problems) == 1 and "0000:01:01.0 (Ethernet controller [1af4:1041]), with no driver" in problems[0]


# ---- in use ----------------------------------------------------------------------------------------------
def test_in_use_nothing_holds_a_fresh_gpu(tmp_path):
    host = gpu_host(tmp_path)
    nvidia_proc(host, "0000:17:00.0", 0)
    walker = walker_for(host)
    assert vfio.in_use(walker, vfio.read_state(walker, "0000:17:00.0")) == []


def test_in_use_process_holding_the_gpu_minor(tmp_path):
    host = gpu_host(tmp_path)
    nvidia_proc(host, "0000:17:00.0", 3)
    hold(host, 4242, "python3", "/dev/nvidiactl", "/dev/nvidia3")
    hold(host, 4243, "bash", "/dev/pts/0", "/dev/nvidia0")
    walker = walker_for(host)
    assert vfio.in_use(walker, vfio.read_state(walker, "0000:17:00.0")) == ["process 4242 (python3) holds /dev/nvidia3"]


def test_in_use_mounted_nvme_swap_and_holders(tmp_path):
    host = gpu_host(tmp_path)
    blocks = nvme_disk(host, "0000:18:00.0", partitions=2)
    mount(host, blocks[1]["dev"], "/data")
    host.write("/proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n/dev/nvme0n1p2 partition 8388604 0 -2")
    host.link("/sys/devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1/holders/dm-0", "/sys/devices/virtual/block/dm-0")
    hold(host, 77, "fio", "/dev/nvme0n1")
    walker = walker_for(host)
    reasons = vfio.in_use(walker, vfio.read_state(walker, "0000:18:00.0"))
    assert reasons == ["process 77 (fio) holds /dev/nvme0n1", "/dev/nvme0n1p1 is mounted on /data",
                       "/dev/nvme0n1p2 is an active swap area",
                       "/dev/nvme0n1 is held by dm-0 (device mapper, MD RAID or LVM)"]


def test_in_use_network_interface_up_and_vfio_group_open(tmp_path):
    host = gpu_host(tmp_path)
    host.add("0000:16:03.0", "pci0000:16", kind="root_port")
    host.add("0000:1a:00.0", "0000:16:03.0", class_code="0x020000", vendor="0x15b3", device="0x1021", driver="mlx5_core")
    net_interface(host, "0000:1a:00.0", "ens1f0", up=True)
    walker = walker_for(host)
    assert vfio.in_use(walker, vfio.read_state(walker, "0000:1a:00.0")) == ["network interface ens1f0 is up"]
    net_interface(host, "0000:1a:00.0", "ens1f0", up=False)
    assert vfio.in_use(walker_for(host), vfio.read_state(walker_for(host), "0000:1a:00.0")) == []
    host.link(f"{host.dirs['0000:17:00.0']}/driver", "/sys/bus/pci/drivers/vfio-pci")
    group = group_of(host, "0000:17:00.0")
    hold(host, 900, "qemu-system-x86", f"/dev/vfio/{group}")
    walker = walker_for(host)
    assert vfio.in_use(walker, vfio.read_state(walker, "0000:17:00.0")) == [f"process 900 (qemu-system-x86) holds /dev/vfio/{group}"]


def test_in_use_finds_virtio_interfaces_and_disks_below_the_function(tmp_path):
    """virtio puts the interface and the disk one bus further down: virtio2/net/ens3, virtio1/block/vda/vda1."""
    host = gpu_host(tmp_path)
    host.add("0000:16:03.0", "pci0000:16", kind="root_port")
    nic = host.add("0000:1b:00.0", "0000:16:03.0", class_code="0x020000", vendor="0x1af4", device="0x1041", driver="virtio-pci")
    host.write(f"{host.dirs[nic]}/virtio2/net/ens3/flags", "0x1003")
    disk = host.add("0000:1c:00.0", "0000:16:03.0", class_code="0x010000", vendor="0x1af4", device="0x1042", driver="virtio-pci")
    base = f"{host.dirs[disk]}/virtio1/block/vda"
    host.write(f"{base}/uevent", "MAJOR=254\nMINOR=0\nDEVNAME=vda\nDEVTYPE=disk")
    host.write(f"{base}/dev", "254:0")
    host.write(f"{base}/vda1/uevent", "MAJOR=254\nMINOR=1\nDEVNAME=vda1\nDEVTYPE=partition")
    host.write(f"{base}/vda1/dev", "254:1")
    mount(host, "254:1", "/")
    walker = walker_for(host)
    assert vfio.in_use(walker, vfio.read_state(walker, nic)) == ["network interface ens3 is up"]
    assert vfio.in_use(walker, vfio.read_state(walker, disk)) == ["/dev/vda1 is mounted on /"]


# ---- plans -------------------------------------------------------------------------------------------------
def test_plan_present_follows_driverctl_order_and_skips_bound(tmp_path):
    host = gpu_host(tmp_path)
    walker = walker_for(host)
    states = [vfio.read_state(walker, b) for b in ("0000:17:00.0", "0000:17:00.1")]
    states[1] = dict(states[1], driver="vfio-pci", driver_override="vfio-pci")
    actions = vfio.plan_present(states)
    assert [vfio.describe_action(a) for a in actions] == [
        "set 0000:17:00.0 driver_override to vfio-pci", "unbind 0000:17:00.0 from nvidia", "probe 0000:17:00.0 (bind to vfio-pci)"]
    assert vfio.plan_present([states[1]]) == []


def test_plan_absent_uses_the_recorded_driver_or_restore_driver(tmp_path):
    state = {"bdf": "0000:17:00.0", "driver": "vfio-pci", "driver_override": "vfio-pci"}
    originals = {"0000:17:00.0": {"driver": "nvidia", "module": "nvidia"}}
    actions = vfio.plan_absent([state], originals, None)
    assert [vfio.describe_action(a) for a in actions] == [
        "clear 0000:17:00.0 driver_override", "unbind 0000:17:00.0 from vfio-pci", "probe 0000:17:00.0 (bind to nvidia)"]
    assert vfio.plan_absent([state], {}, "nouveau")[-1]["expect"] == "nouveau"
    assert vfio.plan_absent([state], {}, None)[-1]["expect"] is None
    assert vfio.plan_absent([{"bdf": "x", "driver": "nvidia", "driver_override": None}], originals, None) == []


def test_remember_keeps_the_first_original(tmp_path):
    first = vfio.remember({}, [{"bdf": "a", "driver": "nvidia", "driver_module": "nvidia", "id": "10de:2330"}])
    again = vfio.remember(first, [{"bdf": "a", "driver": "vfio-pci", "driver_module": "vfio_pci", "id": "10de:2330"}])
    assert again == first == {"a": {"driver": "nvidia", "module": "nvidia", "id": "10de:2330"}}


# ---- persistence ------------------------------------------------------------------------------------------
def test_udev_rules_round_trip_and_guard_against_rebinding_vfio():
    text = vfio.render_udev(["0000:17:00.1", "0000:17:00.0"])
    assert vfio.udev_bdfs(text) == ["0000:17:00.0", "0000:17:00.1"]
    lines = [ln for ln in text.splitlines() if ln.startswith("ACTION")]
    assert lines[0] == 'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="0000:17:00.0", ATTR{driver_override}="vfio-pci"'
    assert 'DRIVER!="vfio-pci", RUN{builtin}+="kmod load vfio-pci"' in lines[1]
    assert "echo %k > /sys/bus/pci/drivers_probe" in lines[1] and "$" not in text  # no udev substitution surprises
    assert text.count("'") % 2 == 0


def test_modprobe_round_trip():
    text = vfio.render_modprobe(["10de:2330", "10de:22e8"], ["snd_hda_intel", "nvidia"])
    assert "options vfio-pci ids=10de:22e8,10de:2330\n" in text
    assert "softdep nvidia pre: vfio-pci\n" in text
    assert vfio.parse_modprobe(text) == (["10de:22e8", "10de:2330"], ["nvidia", "snd_hda_intel"])


def test_plan_persist_udev_add_then_remove(tmp_path):
    host = gpu_host(tmp_path)
    walker = walker_for(host)
    fs = walker.fs
    states = [vfio.read_state(walker, b) for b in ("0000:17:00.0", "0000:17:00.1")]
    actions, problems = vfio.plan_persist(fs, "udev", "present", states, {}, walker)
    assert problems == [] and [(a["op"], a["path"]) for a in actions] == [("write", vfio.UDEV_RULES)]
    fs.write_atomic(vfio.UDEV_RULES, actions[0]["after"])
    assert vfio.plan_persist(fs, "udev", "present", states, {}, walker) == ([], [])
    actions, _p = vfio.plan_persist(fs, "udev", "absent", states[:1], {}, walker)
    assert vfio.udev_bdfs(actions[0]["after"]) == ["0000:17:00.1"]
    actions, _p = vfio.plan_persist(fs, "udev", "absent", states, {}, walker)
    assert [a["op"] for a in actions] == ["remove"]
    assert vfio.plan_persist(fs, "none", "present", states, {}, walker) == ([], [])


def test_plan_persist_modprobe_softdeps_and_refusals(tmp_path):
    host = gpu_host(tmp_path)
    walker = walker_for(host)
    states = [vfio.read_state(walker, b) for b in ("0000:17:00.0", "0000:17:00.1")]
    actions, problems = vfio.plan_persist(walker.fs, "modprobe", "present", states, {}, walker)
    assert problems == []
    assert vfio.parse_modprobe(actions[0]["after"]) == (["10de:22e8", "10de:2330"], ["nvidia", "snd_hda_intel"])
    # another GPU with the same ID that stays on the host: modprobe ids= would take it too
    gpu_with_audio(host, "0000:19:00.0", "0000:16:02.0")
    walker = walker_for(host)
    _a, problems = vfio.plan_persist(walker.fs, "modprobe", "present", states, {}, walker)
    assert any("0000:19:00.0 (3D controller [10de:2330]) has that ID but is not in devices" in p for p in problems)
    # nvme is built in: no softdep can beat it
    nvme = [vfio.read_state(walker, "0000:18:00.0")]
    _a, problems = vfio.plan_persist(walker.fs, "modprobe", "present", nvme, {}, walker)
    assert problems == ["persist: modprobe cannot keep nvme away from 0000:18:00.0: nvme is built into the kernel, so no "
                        "softdep can load vfio-pci before it. Use persist: udev for this function."]


# ---- waiting -------------------------------------------------------------------------------------------------
def test_bind_watcher_polls_the_link_and_respects_the_timeout(tmp_path):
    host = gpu_host(tmp_path)
    watcher = vfio.BindWatcher(HostFS(str(host.root)), use_udev=False)
    assert watcher.source == "poll"
    assert watcher.wait("0000:17:00.0", "nvidia", 5) == "nvidia"  # already there: no wait
    t0 = time.monotonic()
    assert watcher.wait("0000:17:00.0", "vfio-pci", 0.2) == "nvidia"
    assert 0.2 <= time.monotonic() - t0 < 1.0
    watcher.close()


def test_bind_watcher_uses_polling_under_a_fake_root(tmp_path):
    """pyudev describes the live host only: a fake root never opens a netlink monitor."""
    assert vfio.BindWatcher(HostFS(str(tmp_path))).source == "poll"


@pytest.mark.parametrize("text", ["", "\n", "[]", "{"])
def test_an_empty_or_broken_originals_record_is_an_error(tmp_path, text):
    host = gpu_host(tmp_path)
    host.real(vfio.STATE_FILE).parent.mkdir(parents=True, exist_ok=True)
    host.real(vfio.STATE_FILE).write_text(text)
    with pytest.raises(vfio.VfioError, match="original-drivers.json is (empty|not a JSON object)"):
        vfio.load_originals(HostFS(str(tmp_path)))
    host.real(vfio.STATE_FILE).unlink()
    assert vfio.load_originals(HostFS(str(tmp_path))) == {}

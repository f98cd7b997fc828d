"""The tuning modules on the lab VMs as they booted, one module call each, for real (issues 4, 5).

Cheap enough for every CI run (no reboot, a module call per check); the whole-site proof with its
reboot is tests/lab/test_site_vm.py (marker e2e). What is proven here, on QEMU's real config space,
IOMMU groups, MSI-X vectors and huge pages:
- pcie_payload: QEMU keeps MaxPayload/MaxReadReq read-only; asking for another value fails with a
  message naming the device, rolls back, reports no change, and config space is as before.
- kernel_cmdline in check mode: reports the change and reboot_required, writes no GRUB file.
- vfio_bind: a function of an IOMMU group with an unbound non-bridge member is refused, naming the
  member; nic1 (a group of its own) is refused while its interface is up (in use), then goes to
  vfio-pci and back to virtio-pci once it is down; unknown IDs are refused.
- irq_affinity: nic1's vectors pinned NUMA-local one per CPU and read back from /proc/irq; the NVMe's
  kernel-managed I/O queue vectors (writes answer EIO) reported as managed, not failed; a CPU
  outside the machine refused with nothing changed.
- hugepages: 2 MiB pages reserved at runtime and visible in /proc/meminfo; more than the memory
  guard allows is refused with nothing changed.
Every module call that changes something is run a second time: changed=false.
"""

from __future__ import annotations

import json
import re

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import parse_cpulist

from tests.lab.labutil import ansible_env, lab_ssh, run

pytestmark = pytest.mark.vmlab


def module(host: str, name: str, args: dict, check: bool = False) -> dict:
    """One module call on one VM through Ansible (become), its result as a dict."""
    env = ansible_env()
    env.update(ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    argv = ["ansible", host, "-i", "inventories/lab", "-b", "-m", name, "-a", json.dumps(args)]
    if check:
        argv.append("--check")
    r = run(argv, timeout=900, env=env)
    assert "{" in r.stdout, f"{name} on {host}: no JSON (rc {r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}"
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    return doc["plays"][0]["tasks"][0]["hosts"][host]


def driver(host: str, bdf: str) -> str:
    return lab_ssh(host, f"basename $(readlink /sys/bus/pci/devices/{bdf}/driver) 2>/dev/null || echo none").strip()


def test_readonly_payload_fails_cleanly_without_a_false_change(lab):
    before = lab_ssh("lab1", "lspci -vv -s 01:00.0; setpci -s 00:04.0 CAP_EXP+8.w; setpci -s 01:00.0 CAP_EXP+8.w")
    res = module("lab1", "gpufleet.inference.pcie_payload",
                 {"devices": ["0000:01:00.0"], "mps": 128, "mrrs": 512, "persist": False, "on_readonly": "fail"})
    assert res.get("failed"), res
    assert res.get("changed") is False, res
    assert "0000:01:00.0" in res["msg"] and "did not take" in res["msg"], res["msg"]
    after = lab_ssh("lab1", "lspci -vv -s 01:00.0; setpci -s 00:04.0 CAP_EXP+8.w; setpci -s 01:00.0 CAP_EXP+8.w")
    assert after == before
    assert "gpufleet" not in lab_ssh("lab1", "ls /etc/systemd/system /etc/gpufleet 2>/dev/null || true")


def test_payload_bad_input_is_refused_before_any_write(lab):
    res = module("lab1", "gpufleet.inference.pcie_payload", {"devices": ["0000:01:00.0"], "mps": 100, "persist": False})
    assert res.get("failed") and res.get("changed") is False, res
    assert "100" in res["msg"], res["msg"]
    res = module("lab1", "gpufleet.inference.pcie_payload", {"devices": ["0000:0a:00.0"], "mps": 128, "persist": False})
    assert res.get("failed") and "0000:0a:00.0" in res["msg"], res


def test_kernel_cmdline_check_mode_writes_nothing(lab):
    files = "sha256sum /etc/default/grub /boot/grub/grub.cfg; ls /etc/default/grub.d/ 2>/dev/null || true"
    before = lab_ssh("lab2", files)
    res = module("lab2", "gpufleet.inference.kernel_cmdline", {"owner": "labcheck", "args": ["pcie_aspm=off"]}, check=True)
    assert not res.get("failed"), res
    assert res["changed"] is True and res["reboot_required"] is True, res
    assert lab_ssh("lab2", files) == before
    res = module("lab2", "gpufleet.inference.kernel_cmdline",
                 {"owner": "labcheck", "args": ["pcie_aspm=off", "pcie_aspm=force"]}, check=True)
    assert res.get("failed") and "pcie_aspm" in res["msg"], res
    res = module("lab2", "gpufleet.inference.kernel_cmdline", {"owner": "labcheck", "args": ["quiet;reboot"]}, check=True)
    assert res.get("failed"), res


def test_vfio_refuses_a_group_with_an_unbound_device(lab):
    res = module("lab1", "gpufleet.inference.vfio_bind", {"devices": ["0000:05:00.0"], "persist": "none"})
    assert res.get("failed") and res.get("changed") is False, res
    assert "0000:06:00.0" in res["msg"], res["msg"]
    assert driver("lab1", "0000:05:00.0") == "virtio-pci"


def test_vfio_refuses_a_device_in_use_then_binds_and_gives_back(lab):
    assert driver("lab2", "0000:07:00.0") == "virtio-pci"
    # nic1's interface is up: in use, so it is refused (without force) and nothing changes
    res = module("lab2", "gpufleet.inference.vfio_bind", {"devices": ["0000:07:00.0"], "persist": "none"})
    assert res.get("failed") and res.get("changed") is False, res
    assert "is in use: network interface enp7s0 is up" in res["msg"] and "Nothing was changed" in res["msg"], res["msg"]
    assert driver("lab2", "0000:07:00.0") == "virtio-pci"
    lab_ssh("lab2", "ip link set enp7s0 down")
    try:
        res = module("lab2", "gpufleet.inference.vfio_bind", {"devices": ["0000:07:00.0"], "persist": "none"})
        assert not res.get("failed") and res["changed"] is True, res
        assert driver("lab2", "0000:07:00.0") == "vfio-pci"
        group = lab_ssh("lab2", "basename $(readlink /sys/bus/pci/devices/0000:07:00.0/iommu_group)").strip()
        assert lab_ssh("lab2", f"test -e /dev/vfio/{group} && echo yes").strip() == "yes"
        again = module("lab2", "gpufleet.inference.vfio_bind", {"devices": ["0000:07:00.0"], "persist": "none"})
        assert again["changed"] is False, again
    finally:
        back = module("lab2", "gpufleet.inference.vfio_bind", {"devices": ["0000:07:00.0"], "state": "absent",
                                                               "persist": "none"})
    assert not back.get("failed") and back["changed"] is True, back
    assert driver("lab2", "0000:07:00.0") == "virtio-pci"
    res = module("lab2", "gpufleet.inference.vfio_bind", {"devices": ["ffff:ffff"], "persist": "none"})
    assert res.get("failed") and "ffff:ffff" in res["msg"], res


def test_irq_affinity_pins_reads_back_and_leaves_managed_vectors(lab):
    irqs = lab_ssh("lab3", "ls /sys/bus/pci/devices/0000:07:00.0/msi_irqs").split()
    local = lab_ssh("lab3", "cat /sys/bus/pci/devices/0000:07:00.0/local_cpulist").strip()
    res = module("lab3", "gpufleet.inference.irq_affinity", {"devices": ["0000:07:00.0", "0000:02:00.0"]})
    assert not res.get("failed"), res
    nic = [i for i in res["irqs"] if i["bdf"] == "0000:07:00.0"]
    assert {str(i["irq"]) for i in nic} == set(irqs)
    for irq in nic:
        live = lab_ssh("lab3", f"cat /proc/irq/{irq['irq']}/smp_affinity_list").strip()
        assert live == irq["after"] == irq["wanted"], irq
        assert re.fullmatch(r"\d+", live) and irq["remote_before"] is False
    assert len({i["after"] for i in nic}) == min(len(nic), len(parse_cpulist(local)))
    nvme = [i for i in res["irqs"] if i["bdf"] == "0000:02:00.0"]
    assert any(i["managed"] for i in nvme), nvme
    assert all(i["status"] != "failed" for i in nvme), nvme
    again = module("lab3", "gpufleet.inference.irq_affinity", {"devices": ["0000:07:00.0", "0000:02:00.0"]})
    assert again["changed"] is False, [i for i in again["irqs"] if i["status"] != "ok"]
    bad = module("lab3", "gpufleet.inference.irq_affinity", {"devices": ["0000:07:00.0"], "cpus": "0-63"})
    assert bad.get("failed") and bad.get("changed") is False and "63" in bad["msg"], bad


def test_hugepages_2m_at_runtime_and_the_guard(lab):
    res = module("lab3", "gpufleet.inference.hugepages", {"pages_2m": 16})
    assert not res.get("failed") and res["changed"] is True, res
    meminfo = lab_ssh("lab3", "cat /proc/meminfo")
    assert int(re.search(r"^HugePages_Total:\s+(\d+)", meminfo, re.M).group(1)) == 16
    assert re.search(r"^Hugepagesize:\s+2048 kB", meminfo, re.M)
    again = module("lab3", "gpufleet.inference.hugepages", {"pages_2m": 16})
    assert again["changed"] is False, again
    bad = module("lab3", "gpufleet.inference.hugepages", {"pages_2m": 100000})
    assert bad.get("failed") and bad.get("changed") is False, bad
    assert "80" in bad["msg"], bad["msg"]
    assert lab_ssh("lab3", "cat /proc/sys/vm/nr_hugepages").strip() == "16"
    back = module("lab3", "gpufleet.inference.hugepages", {"pages_2m": 0})
    assert not back.get("failed") and lab_ssh("lab3", "cat /proc/sys/vm/nr_hugepages").strip() == "0"

"""The VM lab itself: 3 VMs come up, Ansible reaches them, the PCIe topology inside is what the
lab promises (a link below its capability, two endpoints behind a switch in one IOMMU group,
MSI-X vectors whose affinity can be set), and teardown leaves no QEMU process behind.

Run: . scripts/lib.sh; gpufleet_env; pytest -m vmlab tests/lab   (about 3 minutes on 2 cores once
the base image exists; building it first takes about 2 more)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.lab.labutil import (INVENTORY_DIR, LAB_DIR, N_VMS, NAMES, REPO, ansible_env, lab_containers,
                               lab_qemu_processes, lab_ssh, run)

pytestmark = pytest.mark.vmlab


def test_inventory_lists_every_vm(lab):
    r = run([REPO / ".venv" / "bin" / "ansible-inventory", "-i", INVENTORY_DIR, "--list"],
            timeout=60, env=ansible_env())
    assert r.returncode == 0, r.stderr
    inv = json.loads(r.stdout)
    assert sorted(inv["lab_vms"]["hosts"]) == NAMES
    hostvars = inv["_meta"]["hostvars"]
    ports = {hostvars[n]["ansible_port"] for n in NAMES}
    assert len(ports) == N_VMS
    for n in NAMES:
        hv = hostvars[n]
        assert hv["ansible_host"] == "127.0.0.1"
        assert hv["ansible_user"] == "root"
        assert hv["ansible_python_interpreter"] == "/usr/bin/python3"
        assert Path(hv["ansible_ssh_private_key_file"]).is_file()
    assert "Unable to parse" not in r.stderr, r.stderr


def test_ansible_ping_all(lab):
    r = run([REPO / ".venv" / "bin" / "ansible", "all", "-i", INVENTORY_DIR, "-m", "ping", "-o"],
            timeout=180, env=ansible_env())
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    for n in NAMES:
        assert re.search(rf"^{n} \| SUCCESS", r.stdout, re.M), r.stdout


def _links(lspci_vv: str) -> dict[str, dict]:
    """bdf -> {cap: (GT/s, width), sta: (GT/s, width)} from `lspci -vv`."""
    links, bdf = {}, None
    for line in lspci_vv.splitlines():
        m = re.match(r"^([0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ", line)
        if m:
            bdf = m.group(1)
            continue
        m = re.search(r"\b(LnkCap|LnkSta):.*?Speed ([\d.]+)GT/s.*?Width x(\d+)", line)
        if m and bdf:
            key = "cap" if m.group(1) == "LnkCap" else "sta"
            links.setdefault(bdf, {})[key] = (float(m.group(2)), int(m.group(3)))
    return links


def test_a_link_runs_below_its_capability(lab):
    links = _links(lab_ssh("lab1", "lspci -vv"))
    # the root ports advertise what x-speed/x-width say ...
    assert links["00:04.0"]["cap"] == (16.0, 16), links["00:04.0"]
    assert links["00:05.0"]["cap"] == (8.0, 8), links["00:05.0"]
    assert links["00:06.0"]["cap"] == (16.0, 16), links["00:06.0"]
    assert links["00:07.0"]["cap"] == (8.0, 4), links["00:07.0"]
    # ... and QEMU never trains a link up: some port runs below its capability
    degraded = [b for b, l in links.items() if "cap" in l and "sta" in l and
                (l["sta"][0] < l["cap"][0] or l["sta"][1] < l["cap"][1])]
    assert degraded, f"no link below its capability: {links}"


def test_switch_endpoints_share_an_iommu_group(topology):
    for name, devs in topology.items():
        groups = {d["iommu_group"] for d in devs.values()}
        assert None not in groups, f"{name}: a device without IOMMU group (is the vIOMMU on?)"
        ups = [d["path"] for d in devs.values() if (d["vendor"], d["device"]) == ("0x104c", "0x8232")]
        assert len(ups) == 1, f"{name}: expected one switch upstream port, found {ups}"
        behind = {b: d for b, d in devs.items()
                  if d["path"].startswith(ups[0] + "/") and not d["class"].startswith("0x0604")}
        assert len(behind) == 2, f"{name}: endpoints behind the switch: {sorted(behind)}"
        assert len({d["iommu_group"] for d in behind.values()}) == 1, \
            f"{name}: switch endpoints in different IOMMU groups: " \
            f"{ {b: d['iommu_group'] for b, d in behind.items()} }"
        assert all(d["class"].startswith("0x03") for d in behind.values()), behind


def test_gpu_stand_ins_are_display_class(topology):
    for name, devs in topology.items():
        gpus = sorted(b for b, d in devs.items() if d["class"].startswith("0x03"))
        assert gpus == ["0000:01:00.0", "0000:05:00.0", "0000:06:00.0"], f"{name}: {gpus}"


def test_msix_vectors_and_settable_affinity(topology):
    devs = topology["lab1"]
    aux = devs["0000:07:00.0"]  # virtio-net behind rp4: non-managed vectors
    assert aux["driver"] == "virtio-pci" and len(aux["msi_irqs"]) >= 2, aux
    nvme = devs["0000:02:00.0"]
    assert nvme["driver"] == "nvme" and len(nvme["msi_irqs"]) >= 2, nvme
    lspci = lab_ssh("lab1", "lspci -vv -s 07:00.0")
    assert re.search(r"MSI-X: Enable\+ Count=\d+", lspci), lspci
    irq = aux["msi_irqs"][-1]
    out = lab_ssh("lab1", f"echo 1 > /proc/irq/{irq}/smp_affinity_list && "
                          f"cat /proc/irq/{irq}/smp_affinity_list")
    assert out.strip() == "1"


@pytest.mark.lab_teardown
def test_teardown_leaves_no_qemu(lab):
    r = lab.down()
    assert r.returncode == 0, f"lab down failed:\n{r.stderr}"
    assert lab_qemu_processes() == []
    assert lab_containers() == []
    assert not list(LAB_DIR.glob("*.pid")) and not list(LAB_DIR.glob("*.qcow2"))
    assert not (INVENTORY_DIR / "hosts.yml").exists()

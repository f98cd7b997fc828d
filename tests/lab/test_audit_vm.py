"""The audit in the lab VMs agrees with each VM's own `lspci -vv` and sysfs, for every hop of
every GPU path, and flags what the lab's topology holds: links below capability (QEMU trains
every link at 2.5GT/s x1 under root ports of 8-16GT/s) and the GPUs behind the switch sharing
one IOMMU group. `lspci` text is parsed here as the independent oracle; the module itself
decodes config space and never reads lspci.
"""

from __future__ import annotations

import json

import pytest

from tests.lab.labutil import ansible_env, lab_ssh, run
from tests.unit.lspci import assert_config_matches_lspci, parse_lspci_vv

pytestmark = pytest.mark.vmlab


def test_lspci_parser_reads_a_real_capture() -> None:
    sample = """0000:04:00.0 PCI bridge: Texas Instruments XIO3130 PCI Express Switch (Downstream) (rev 01)
\tCapabilities: [90] Express (v2) Downstream Port (Slot+), MSI 00
\t\tDevCap:\tMaxPayload 128 bytes, PhantFunc 0
\t\tDevCtl:\tCorrErr+ NonFatalErr+ FatalErr+ UnsupReq+
\t\t\tMaxPayload 128 bytes, MaxReadReq 512 bytes
\t\tLnkCap:\tPort #0, Speed unknown, Width x0, ASPM L0s, Exit Latency L0s <64ns
\t\tLnkSta:\tSpeed 2.5GT/s (overdriven), Width x1 (overdriven)
\tCapabilities: [48] MSI-X: Enable+ Count=1 Masked-
"""
    dev = parse_lspci_vv(sample)["0000:04:00.0"]
    assert dev == {"mps_supported": 128, "mps": 128, "mrrs": 512,
                   "link_cap": {"speed_gts": None, "width": 0}, "link_sta": {"speed_gts": 2.5, "width": 1},
                   "msix": {"enabled": True, "table_size": 1}, "caps": [0x90, 0x48], "pcie_version": 2,
                   "port_type": "downstream_port", "aspm_support": "L0s"}


def _ssh(name: str, cmd: str) -> str:
    return lab_ssh(name, cmd, timeout=120)


@pytest.fixture(scope="module")
def audits(lab_vms: list[str], tmp_path_factory) -> dict[str, dict]:
    """playbooks/audit.yml over the lab, for real; returns each host's JSON."""
    report_dir = tmp_path_factory.mktemp("audit")
    r = run(["ansible-playbook", "-i", "inventories/lab", "playbooks/audit.yml",
             "-e", f"gpufleet_report_dir={report_dir}"], timeout=900, env=ansible_env())
    assert r.returncode == 0, f"audit.yml failed:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
    out = {}
    for name in lab_vms:
        with open(report_dir / f"{name}.json", encoding="utf-8") as fh:
            out[name] = json.load(fh)
    assert (report_dir / "fleet.md").read_text().count("| lab") >= len(lab_vms)
    assert "<table>" in (report_dir / "fleet.html").read_text()
    return out


def test_audit_agrees_with_lspci_and_sysfs(lab_vms: list[str], audits: dict[str, dict]) -> None:
    for name in lab_vms:
        pcie = audits[name]["pcie"]
        lspci = parse_lspci_vv(_ssh(name, "lspci -vv -D"))
        gpus = {g["bdf"] for g in pcie["gpus"]}
        assert gpus == {"0000:01:00.0", "0000:05:00.0", "0000:06:00.0"}, f"{name}: GPUs found {sorted(gpus)}"
        hops = set(pcie["devices"])
        # every hop of the three paths: rp1, rp3 + switch up/down ports, and the GPUs
        assert {"0000:00:04.0", "0000:00:06.0", "0000:03:00.0", "0000:04:00.0", "0000:04:01.0"} <= hops
        for bdf, dev in pcie["devices"].items():
            assert_config_matches_lspci(f"{name} {bdf}", dev, lspci[bdf])
            sysfs = f"/sys/bus/pci/devices/{bdf}"
            group = _ssh(name, f"basename $(readlink {sysfs}/iommu_group)").strip()
            assert str(dev["iommu_group"]) == group, f"{name} {bdf} IOMMU group"
            members = set(_ssh(name, f"ls /sys/kernel/iommu_groups/{group}/devices").split())
            assert {m["bdf"] for m in dev["iommu_group_members"]} == members, f"{name} {bdf} group members"
            irqs = set(_ssh(name, f"ls {sysfs}/msi_irqs 2>/dev/null || true").split())
            assert {str(i["irq"]) for i in dev["irqs"]} == irqs, f"{name} {bdf} MSI vectors"


def test_audit_flags_the_lab_topology(lab_vms: list[str], audits: dict[str, dict]) -> None:
    """The lab's links below capability: rp1 and rp3 (LnkCap 16GT/s x16) run at 2.5GT/s x1, their
    LnkSta below their LnkCap, because the device below each can do no more: flagged as
    device-limited (info), not as degraded. QEMU's switch downstream ports report no link
    capability at all (LnkCap "Speed unknown, Width x0"): said as such, never as a link capped at
    nothing. And the two GPU stand-ins behind the switch share one IOMMU group."""
    for name in lab_vms:
        pcie = audits[name]["pcie"]
        codes: dict[str, set] = {}
        for f in pcie["findings"]:
            codes.setdefault(f["code"], set()).update(f.get("devices") or [f.get("device")])
        limited = {tuple(f["devices"]) for f in pcie["findings"] if f["code"] == "link_limited_by_device"}
        assert {("0000:00:04.0", "0000:01:00.0"), ("0000:00:06.0", "0000:03:00.0")} <= limited, \
            f"{name}: root ports running below their capability not flagged: {sorted(codes)}"
        assert {"0000:04:00.0", "0000:04:01.0"} <= codes.get("link_cap_unknown", set()), sorted(codes)
        assert "link_capped" not in codes, f"{name}: a port without LnkCap taken for a cap: {codes['link_capped']}"
        assert "iommu_group_shared" in codes, f"{name}: shared IOMMU group not flagged: {sorted(codes)}"
        assert {"0000:05:00.0", "0000:06:00.0"} <= codes["iommu_group_shared"]
        pair = next(p for p in pcie["pairs"] if {p["a"], p["b"]} == {"0000:05:00.0", "0000:06:00.0"})
        assert pair["level"] == "PIX", pair  # one switch between them, as nvidia-smi topo -m says


# A host "tuned" from copied guides: each file the host lint reads, with what the guides put there. The kernel
# arguments go into a GRUB drop-in only (update-grub is not run, nothing reboots); the unit is never started.
COPIED_GUIDE = {
    "/etc/default/grub.d/60-copied-guide.cfg":
        'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX pci=noacs pcie_aspm=off pcie_port_pm=off swiotlb=65536"\n',
    "/etc/nccl.conf": "# from a forum\nNCCL_P2P_LEVEL=PCI\nNCCL_PROTO=LL\nNCCL_NTHREADS=128\nNCCL_ALGO=Tree\n",
    "/root/.nccl.conf": "NCCL_PROTO=Simple\n",
    "/etc/systemd/system/copied-guide.service":
        "[Service]\nEnvironmentFile=-/etc/default/copied-guide.env\nExecStart=/bin/true\n",
    "/etc/default/copied-guide.env": "USE_HUGEPAGES=1\n",
    "/etc/modprobe.d/60-copied-guide.conf": "options nvidia NVreg_EnableP2PMode=1\noptions vfio-pci ids={gpu_id}\n",
    "/etc/sysctl.d/60-copied-guide.conf": "# 64 x 1GB pages for the model\nvm.nr_hugepages = 64\n# enable io_uring\n"
                                          "kernel.io_uring_disabled = 1\n",
}
# code -> (file, line) each finding must name, in the JSON and in fleet.md
EXPECTED = {
    "pci_noacs": ("/etc/default/grub.d/60-copied-guide.cfg", 1),
    "pcie_aspm_off": ("/etc/default/grub.d/60-copied-guide.cfg", 1),
    "pcie_port_pm_off": ("/etc/default/grub.d/60-copied-guide.cfg", 1),
    "swiotlb_slabs": ("/etc/default/grub.d/60-copied-guide.cfg", 1),
    "nccl_p2p_level_unknown": ("/etc/nccl.conf", 2),
    "nccl_proto_forced": ("/etc/nccl.conf", 3),
    "nccl_nthreads": ("/etc/nccl.conf", 4),
    "nccl_algo_forced": ("/etc/nccl.conf", 5),
    "setting_conflict": ("/root/.nccl.conf", 1),
    "use_hugepages": ("/etc/default/copied-guide.env", 1),
    "nvreg_unknown": ("/etc/modprobe.d/60-copied-guide.conf", 1),
    "gpu_in_vfio_ids": ("/etc/modprobe.d/60-copied-guide.conf", 2),
    "nr_hugepages_default_size": ("/etc/sysctl.d/60-copied-guide.conf", 2),
    "io_uring_disabled": ("/etc/sysctl.d/60-copied-guide.conf", 4),
}


def test_audit_lints_a_copied_guide_configuration(lab_vms: list[str], tmp_path) -> None:
    """lab1 seeded with a copied-guide configuration: the audit (one pcie_facts run with the host lint) reports each
    rule's finding with its file and line, in the host's JSON and in the fleet report; the files are removed after."""
    name = lab_vms[0]
    gpu = "/sys/bus/pci/devices/0000:01:00.0"
    gpu_id = _ssh(name, f"echo $(cut -c3- {gpu}/vendor):$(cut -c3- {gpu}/device)").strip()
    try:
        for path, text in COPIED_GUIDE.items():
            lab_ssh(name, f"cat > {path}", stdin=text.format(gpu_id=gpu_id))
        r = run(["ansible-playbook", "-i", "inventories/lab", "playbooks/audit.yml", "-l", name,
                 "-e", f"gpufleet_report_dir={tmp_path}", "-e", '{"audit_host_lint_units": ["copied-guide"]}'],
                timeout=900, env=ansible_env())
        assert r.returncode == 0, f"audit.yml failed:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
    finally:
        _ssh(name, "rm -f " + " ".join(COPIED_GUIDE))
    pcie = json.loads((tmp_path / f"{name}.json").read_text())["pcie"]
    found = {}
    for f in pcie["findings"]:
        if "source" in f:
            found.setdefault(f["code"], []).append((f["file"], f["line"]))
    missing = {code: where for code, where in EXPECTED.items() if where not in found.get(code, [])}
    assert not missing, f"{name}: not found with their file and line: {missing}; found {found}"
    report = (tmp_path / "fleet.md").read_text()
    for code, (path, line) in EXPECTED.items():
        assert f"| {path}:{line} |" in report, f"fleet.md lacks {code} at {path}:{line}"
    assert "/etc/nccl.conf" in pcie["host_lint"]["files"] and pcie["host_lint"]["service_user"] == "root"

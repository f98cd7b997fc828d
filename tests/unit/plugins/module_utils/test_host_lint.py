# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""host_lint over fake roots: one tree per rule (the rule fires, with its file and line), its clean twin (it does
not), and a host seeded the way copied guides leave it (every rule at once)."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.lint import host_lint as hl
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.modules import host_lint as host_lint_module
from tests.unit.fakesysfs import FakeHost
from tests.unit.plugins.modules.uthelper import run_module

UNIT = "[Unit]\nDescription=vLLM\n[Service]\nUser=vllm\n{body}\nExecStart=/opt/vllm/bin/vllm serve m\n"
PASSWD = "root:x:0:0:root:/root:/bin/bash\nvllm:x:998:998::/var/lib/vllm:/usr/sbin/nologin\n"


def tree(tmp_path, files: dict[str, str], cmdline: str = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet") -> FakeHost:
    host = FakeHost(tmp_path, cmdline=cmdline)
    host.write("/etc/passwd", PASSWD.rstrip("\n"))
    for path, text in files.items():
        host.write(path, text.rstrip("\n"))
    return host


def lint(tmp_path, **params):
    return hl.run(HostFS(str(tmp_path)), dict({"units": ["vllm"]}, **params))["findings"]


def where(findings, code):
    return [(f["file"], f["line"], f["severity"]) for f in findings if f["code"] == code]


# (code, files, cmdline, expected (file, line, severity) list, a text the message must hold)
CASES = [
    ("pci_noacs", {"/etc/default/grub": 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX="quiet pci=noacs,realloc"'}, None,
     [("/etc/default/grub", 2, "warning")], "Unknown option `noacs'"),
    ("pci_noacs", {}, "ro pci=noacs", [("/proc/cmdline", 1, "warning")], "on the running kernel's command line"),
    ("pcie_acs_override",
     {"/etc/default/grub.d/50-acs.cfg": 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX pcie_acs_override=downstream,multifunction"'}, None,
     [("/etc/default/grub.d/50-acs.cfg", 1, "warning")], "out-of-tree"),
    ("pcie_aspm_off", {"/etc/default/grub": 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash pcie_aspm=off"'}, "ro pcie_aspm=off",
     [("/etc/default/grub", 1, "warning")], "as the firmware configured it"),
    ("pcie_port_pm_off", {}, "ro pcie_port_pm=off", [("/proc/cmdline", 1, "info")], "not ASPM"),
    ("swiotlb_slabs", {"/etc/default/grub": 'GRUB_CMDLINE_LINUX="swiotlb=65536"'}, None,
     [("/etc/default/grub", 1, "info")], "128 MiB"),
    ("nvreg_unknown", {"/etc/modprobe.d/nvidia.conf": "# from a forum\noptions nvidia NVreg_EnablePCIeGen3=1 "
                                                      "NVreg_EnableP2PMode=1\noptions nvidia-drm modeset=1"}, None,
     [("/etc/modprobe.d/nvidia.conf", 2, "warning")], "NVreg_EnableP2PMode"),
    ("nvreg_unknown", {}, "ro nvidia.NVreg_PcieMaxPerf=1", [("/proc/cmdline", 1, "warning")], "NVreg_PcieMaxPerf"),
    ("nccl_p2p_level_unknown", {"/etc/nccl.conf": "# copied\nNCCL_DEBUG=WARN\nNCCL_P2P_LEVEL=PCI"}, None,
     [("/etc/nccl.conf", 3, "warning")], "without a warning"),
    ("nccl_proto_forced", {"/var/lib/vllm/.nccl.conf": "NCCL_PROTO=LL", "/etc/systemd/system/vllm.service": UNIT.format(body="")},
     None,
     [("/var/lib/vllm/.nccl.conf", 1, "warning")], "16-byte line"),
    ("nccl_algo_forced", {"/etc/systemd/system/vllm.service": UNIT.format(body='Environment="NCCL_ALGO=Tree"')}, None,
     [("/etc/systemd/system/vllm.service", 5, "warning")], "only choose"),
    ("nccl_nthreads", {"/etc/nccl.conf": "NCCL_NTHREADS=128"}, None, [("/etc/nccl.conf", 1, "warning")],
     "caps every Simple and LL kernel at 128"),
    ("nccl_nthreads", {"/etc/nccl.conf": "NCCL_NTHREADS=32"}, None, [("/etc/nccl.conf", 1, "warning")],
     "raises it to 64"),
    ("nccl_nthreads", {"/etc/nccl.conf": "NCCL_NTHREADS=100"}, None, [("/etc/nccl.conf", 1, "warning")],
     "uses its maximum, 512"),
    ("nccl_nthreads", {"/etc/nccl.conf": "NCCL_NTHREADS=1024"}, None, [("/etc/nccl.conf", 1, "warning")],
     "above the maximum"),
    ("nccl_nthreads", {"/etc/nccl.conf": "NCCL_NTHREADS=512"}, None, [("/etc/nccl.conf", 1, "info")], "default already"),
    ("nccl_conf_syntax", {"/etc/nccl.conf": "NCCL_IB_DISABLE = 1\nNCCL_DEBUG=\"INFO\"\nNCCL_SOCKET_IFNAME=eth0 # lan"}, None,
     [("/etc/nccl.conf", 1, "warning"), ("/etc/nccl.conf", 2, "warning"), ("/etc/nccl.conf", 3, "warning")],
     "everything before"),
    ("use_hugepages", {"/etc/systemd/system/vllm.service": UNIT.format(body="EnvironmentFile=-/etc/gpufleet/vllm.env"),
                       "/etc/gpufleet/vllm.env": "HF_HOME=/srv/hf\nUSE_HUGEPAGES=1"}, None,
     [("/etc/gpufleet/vllm.env", 2, "warning")], "no program"),
    ("nr_hugepages_default_size", {"/etc/sysctl.d/60-gpu.conf": "# 64 x 1GB hugepages for the model\nvm.nr_hugepages = 64"},
     None, [("/etc/sysctl.d/60-gpu.conf", 2, "warning")], "128 MiB, not 64 GiB as its comment says"),
    ("nr_hugepages_default_size", {"/etc/sysctl.conf": "vm.nr_hugepages=512"}, None, [("/etc/sysctl.conf", 1, "info")],
     "1024 MiB"),
    ("io_uring_disabled", {"/etc/sysctl.d/99-io.conf": "# enable io_uring\nkernel.io_uring_disabled = 1"}, None,
     [("/etc/sysctl.d/99-io.conf", 2, "warning")], "does not 'enable' it"),
    ("gpu_in_vfio_ids", {"/etc/modprobe.d/vfio.conf": "options vfio-pci ids=10de:2330"}, None,
     [("/etc/modprobe.d/vfio.conf", 1, "critical")], "before the NVIDIA driver"),
    ("setting_conflict", {"/etc/nccl.conf": "NCCL_P2P_DISABLE=1", "/etc/gpufleet/vllm.env": "NCCL_P2P_DISABLE=0",
                          "/etc/systemd/system/vllm.service": UNIT.format(body="EnvironmentFile=/etc/gpufleet/vllm.env")},
     None, [("/etc/gpufleet/vllm.env", 1, "warning")], "/etc/gpufleet/vllm.env:1 takes effect"),
    ("setting_conflict", {"/etc/sysctl.d/10-a.conf": "vm.swappiness=10", "/etc/sysctl.conf": "vm.swappiness = 60"}, None,
     [("/etc/sysctl.conf", 1, "warning")], "/etc/sysctl.conf:1 takes effect"),
    ("setting_conflict", {"/etc/default/grub": 'GRUB_CMDLINE_LINUX="iommu=pt"',
                          "/etc/default/grub.d/70-x.cfg": 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=off"'}, None,
     [("/etc/default/grub.d/70-x.cfg", 1, "warning")], "different values"),
    ("setting_duplicate", {"/etc/modprobe.d/a.conf": "options nvidia NVreg_EnableMSI=1",
                           "/etc/modprobe.d/b.conf": "options nvidia NVreg_EnableMSI=1"}, None,
     [("/etc/modprobe.d/b.conf", 1, "info")], "/etc/modprobe.d/a.conf:1"),
]


@pytest.mark.parametrize("code,files,cmdline,expected,text", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_fires_with_file_and_line(tmp_path, code, files, cmdline, expected, text):
    host = tree(tmp_path, files, **({"cmdline": cmdline} if cmdline else {}))
    host.gpu("0000:17:00.0", host.host_bridge(), device="0x2330")
    findings = lint(tmp_path)
    assert where(findings, code) == expected, findings
    got = [f for f in findings if f["code"] == code]
    assert any(text in f["message"] for f in got), got
    assert all(f["source"] == hl.SOURCES[code] and f["fix"] for f in got)


CLEAN = {
    "/etc/default/grub": 'GRUB_CMDLINE_LINUX="quiet iommu=pt pcie_aspm.policy=performance pci=disable_acs_redir=0000:16:01.0"',
    "/etc/nccl.conf": "# gpufleet\nNCCL_P2P_LEVEL=PXB\nNCCL_PROTO=^LL128\nNCCL_NTHREADS=0x0\nNCCL_NVLS_ENABLE=0",
    "/etc/modprobe.d/nvidia.conf": "options nvidia NVreg_EnableGpuFirmware=1 NVreg_RestrictProfilingToAdminUsers=0",
    "/etc/sysctl.d/60-gpu.conf": "vm.nr_hugepages = 0\nkernel.io_uring_disabled = 0",
    "/etc/systemd/system/vllm.service": UNIT.format(body="Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID NCCL_DEBUG=WARN"),
}


def test_a_clean_host_has_no_findings(tmp_path):
    host = tree(tmp_path, CLEAN, cmdline="BOOT_IMAGE=/vmlinuz ro quiet iommu=pt pcie_aspm.policy=performance")
    host.gpu("0000:17:00.0", host.host_bridge())
    findings = lint(tmp_path)
    assert [f for f in findings if f["code"] != "nccl_nthreads"] == []
    # 0x0 is not a positive number: NCCL keeps its defaults, and the lint says that it does nothing
    assert where(findings, "nccl_nthreads") == [("/etc/nccl.conf", 4, "warning")]


def test_gpu_bound_to_vfio_unless_passed_through(tmp_path):
    host = tree(tmp_path, {})
    bridge = host.host_bridge()
    host.gpu("0000:17:00.0", bridge, driver="vfio-pci")
    host.gpu("0000:18:00.0", bridge)
    found = lint(tmp_path)
    assert where(found, "gpu_bound_to_vfio") == [("/sys/bus/pci/devices/0000:17:00.0/driver", None, "critical")]
    assert where(lint(tmp_path, passthrough_devices=["0000:17:00.0"]), "gpu_bound_to_vfio") == []


def test_default_hugepagesz_1g_makes_nr_hugepages_1g(tmp_path):
    tree(tmp_path, {"/etc/sysctl.conf": "vm.nr_hugepages = 8  # 1G pages"}, cmdline="ro default_hugepagesz=1G")
    assert where(lint(tmp_path), "nr_hugepages_default_size") == []


def test_other_users_nccl_conf_is_linted_but_never_wins(tmp_path):
    tree(tmp_path, {"/root/.nccl.conf": "NCCL_ALGO=Ring", "/etc/nccl.conf": "NCCL_ALGO=Tree",
                    "/etc/systemd/system/vllm.service": UNIT.format(body="")})
    found = lint(tmp_path)
    assert sorted(where(found, "nccl_algo_forced")) == [("/etc/nccl.conf", 1, "warning"), ("/root/.nccl.conf", 1, "warning")]
    assert where(found, "setting_conflict") == []  # root's file is not the service's: vllm's home has none


def test_unit_drop_in_and_service_user_home(tmp_path):
    tree(tmp_path, {"/usr/lib/systemd/system/vllm.service": UNIT.format(body=""),
                    "/etc/systemd/system/vllm.service.d/10-env.conf": "[Service]\nUser=svc\nEnvironment=NCCL_PROTO=LL",
                    "/etc/passwd": PASSWD + "svc:x:990:990::/srv/svc:/bin/false",
                    "/srv/svc/.nccl.conf": "NCCL_P2P_LEVEL=NVLINK"})
    result = hl.run(HostFS(str(tmp_path)), {"units": ["vllm"]})
    assert result["service_user"] == "svc"
    assert where(result["findings"], "nccl_proto_forced") == [("/etc/systemd/system/vllm.service.d/10-env.conf", 3, "warning")]
    assert where(result["findings"], "nccl_p2p_level_unknown") == [("/srv/svc/.nccl.conf", 1, "warning")]
    assert "/usr/lib/systemd/system/vllm.service" in result["files"]


def test_findings_are_sorted_most_severe_first(tmp_path):
    host = tree(tmp_path, {"/etc/modprobe.d/vfio.conf": "options vfio-pci ids=10de:2330", "/etc/nccl.conf": "NCCL_NTHREADS=512",
                           "/etc/sysctl.conf": "kernel.io_uring_disabled=2"})
    host.gpu("0000:17:00.0", host.host_bridge())
    severities = [f["severity"] for f in lint(tmp_path)]
    assert severities == sorted(severities, key=hl.SEVERITIES.index) and severities[0] == "critical"


@pytest.mark.parametrize("line,expected", [
    ('GRUB_CMDLINE_LINUX="a b=1"', [("a", ""), ("b", "1")]),
    ("export GRUB_CMDLINE_LINUX_DEFAULT='$GRUB_CMDLINE_LINUX_DEFAULT c'", [("c", "")]),
    ('GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} d=x,y"  # note', [("d", "x,y")]),
    ('GRUB_TIMEOUT=5', []),
])
def test_grub_args(line, expected):
    assert [(s.key, s.value) for s in hl.grub_args(line, "/etc/default/grub")] == expected


def test_unit_settings_quoted_environment_and_optional_files():
    env, files, user = hl.unit_settings('[Service]\nEnvironment="A=1 2" B=3\nEnvironmentFile=-/etc/x.env /etc/y.env\n',
                                        "/u", 2)
    assert [(s.key, s.value, s.line) for s in env] == [("A", "1 2", 2), ("B", "3", 2)]
    assert files == ["/etc/x.env", "/etc/y.env"] and user is None


def test_module_main_returns_findings(tmp_path, capsys):
    tree(tmp_path, {"/etc/nccl.conf": "NCCL_P2P_LEVEL=PCI"}, cmdline="ro pci=noacs pcie_aspm=off")
    result = run_module(host_lint_module, {"root": str(tmp_path)}, capsys)
    assert result["changed"] is False and result["actions"] == []
    assert {f["code"] for f in result["findings"]} == {"pci_noacs", "pcie_aspm_off", "nccl_p2p_level_unknown"}
    assert result["findings_summary"] == {"critical": 0, "warning": 3, "info": 0}
    assert "/proc/cmdline" in result["files"] and "/etc/nccl.conf" in result["files"]

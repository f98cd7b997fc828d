# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Synthetic sysfs/procfs trees for topologies no test machine has.

FakeHost writes what the kernel would show under a root directory: /sys/devices/pci* chains with
config space bytes laid out as real hardware lays them out (PM -> MSI-X -> PCI Express capability;
AER -> ACS extended capabilities), /sys/bus/pci/devices links, IOMMU groups, NUMA nodes, MSI-X IRQs
with /proc/irq affinity, hugepages, the kernel command line. Used by the unit tests and the benchmark.
It also restores the JSON captures made by tests/tools/capture_pci_tree.py (load_capture).
"""

from __future__ import annotations

import importlib.util
import os
import struct
from pathlib import Path

SPEED_CODE = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
PORT_TYPE = {"endpoint": 0x0, "legacy_endpoint": 0x1, "root_port": 0x4, "upstream_port": 0x5,
             "downstream_port": 0x6, "pcie_to_pci_bridge": 0x7, "rc_integrated_endpoint": 0x9}
ASPM = {"disabled": 0, "L0s": 1, "L1": 2, "L0s L1": 3}
ACS_BIT = {"SV": 0, "TB": 1, "RR": 2, "CR": 3, "UF": 4, "EC": 5, "DT": 6}
ACS_REDIRECT_ON = ("SV", "RR", "CR", "UF")  # what Linux enables on downstream ports by default
NVIDIA_H100 = ("0x10de", "0x2330")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pci"
TOOLS = Path(__file__).resolve().parents[1] / "tools"


def _mps_code(size: int) -> int:
    return {128: 0, 256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}[size]


def _acs_bits(names) -> int:
    return sum(1 << ACS_BIT[n] for n in names or ())


def config_space(vendor: str, device: str, class_code: str, *, bridge: bool = False, port_type: str | None = "endpoint",
                 link_cap=(32.0, 16), link_sta=None, aspm_support: str = "L0s L1", aspm: str = "disabled",
                 mps_supported: int = 256, mps: int = 256, mrrs: int = 512, msix: int = 0,
                 acs_cap=None, acs_ctrl=None, aer_uncorrectable: int = 0, aer_correctable: int = 0,
                 secondary_bus: int = 0, size: int = 4096) -> bytes:
    """Config space bytes with real capability layouts.

    Standard list: PM at 0x40 -> MSI-X at 0x50 (if ``msix``) -> PCI Express at 0x60 (if ``port_type``).
    Extended list: AER at 0x100 -> ACS at 0x148 (if ``acs_cap``). ``link_sta`` defaults to ``link_cap``.
    ``size`` 256 hides the extended list; 64 is what a non-root reader gets.
    """
    cfg = bytearray(4096)
    struct.pack_into("<HH", cfg, 0x00, int(vendor, 16), int(device, 16))
    struct.pack_into("<HH", cfg, 0x04, 0x0406, 0x0010)  # command: mem + bus master; status: capabilities list
    struct.pack_into("<I", cfg, 0x08, int(class_code, 16) << 8 | 0xA1)
    cfg[0x0E] = 0x01 if bridge else 0x00
    if bridge:
        cfg[0x19] = cfg[0x1A] = secondary_bus
    else:
        struct.pack_into("<HH", cfg, 0x2C, int(vendor, 16), 0x1000 | int(device, 16) & 0xFFF)
    cfg[0x34] = 0x40
    chain = [(0x40, 0x01)] + ([(0x50, 0x11)] if msix else []) + ([(0x60, 0x10)] if port_type else [])
    for i, (off, cap_id) in enumerate(chain):
        cfg[off] = cap_id
        cfg[off + 1] = chain[i + 1][0] if i + 1 < len(chain) else 0
    struct.pack_into("<H", cfg, 0x42, 0x0003)  # PM version 3
    if msix:
        struct.pack_into("<H", cfg, 0x52, 0x8000 | (msix - 1))
    if port_type:
        p = 0x60
        struct.pack_into("<H", cfg, p + 2, 0x0002 | PORT_TYPE[port_type] << 4 | (0x100 if port_type in ("root_port", "downstream_port") else 0))
        struct.pack_into("<I", cfg, p + 4, _mps_code(mps_supported) | 1 << 5 | 1 << 28)
        struct.pack_into("<H", cfg, p + 8, 1 << 4 | _mps_code(mps) << 5 | 1 << 8 | 1 << 11 | _mps_code(mrrs) << 12)
        cap_speed, cap_width = link_cap
        sta_speed, sta_width = link_sta or link_cap
        struct.pack_into("<I", cfg, p + 0x0C, SPEED_CODE[cap_speed] | cap_width << 4 | ASPM[aspm_support] << 10 | 1 << 24)
        struct.pack_into("<H", cfg, p + 0x10, ASPM[aspm] | 1 << 6)
        struct.pack_into("<H", cfg, p + 0x12, SPEED_CODE[sta_speed] | sta_width << 4 | 1 << 13)
        vector = sum(1 << code for speed, code in SPEED_CODE.items() if speed <= cap_speed)
        struct.pack_into("<I", cfg, p + 0x2C, vector)
        struct.pack_into("<H", cfg, p + 0x30, SPEED_CODE[cap_speed])
        next_ecap = 0x148 if acs_cap is not None else 0
        struct.pack_into("<I", cfg, 0x100, 0x0001 | 2 << 16 | next_ecap << 20)  # AER v2
        struct.pack_into("<I", cfg, 0x104, aer_uncorrectable)
        struct.pack_into("<I", cfg, 0x10C, 0x00462030)  # default severity
        struct.pack_into("<I", cfg, 0x110, aer_correctable)
        struct.pack_into("<I", cfg, 0x114, 0x00002000)
        if acs_cap is not None:
            struct.pack_into("<I", cfg, 0x148, 0x000D | 1 << 16)
            struct.pack_into("<HH", cfg, 0x14C, _acs_bits(acs_cap), _acs_bits(acs_ctrl))
    return bytes(cfg[:size])


class FakeHost:
    """Builds a host tree under ``root``. Add host bridges, then functions top-down."""

    def __init__(self, root, nodes=None, cmdline: str = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet",
                 hugepages_2m: int = 0, aspm_policy: str = "default", iommu: bool = True):
        self.root = Path(root)
        self.nodes = nodes or {0: "0-7"}
        self.iommu = iommu
        self.next_irq = 100
        self.next_group = 0
        self.dirs: dict[str, str] = {}  # bdf or host bridge -> host path of its directory
        self.numa: dict[str, int] = {}
        self.write("/proc/cmdline", cmdline)
        self.write("/proc/meminfo", f"MemTotal:       263842412 kB\nHugePages_Total:   {hugepages_2m}\nHugePages_Free:    {hugepages_2m}\n"
                                    "HugePages_Rsvd:        0\nHugePages_Surp:        0\nHugepagesize:       2048 kB\n"
                                    f"Hugetlb:        {hugepages_2m * 2048} kB\n")
        for size, count in (("2048kB", hugepages_2m), ("1048576kB", 0)):
            self.write(f"/sys/kernel/mm/hugepages/hugepages-{size}/nr_hugepages", str(count))
            self.write(f"/sys/kernel/mm/hugepages/hugepages-{size}/free_hugepages", str(count))
        for node, cpus in self.nodes.items():
            self.write(f"/sys/devices/system/node/node{node}/cpulist", cpus)
        self.write("/sys/devices/system/node/online", f"0-{max(self.nodes)}" if len(self.nodes) > 1 else "0")
        self.write("/sys/module/pcie_aspm/parameters/policy",
                   " ".join(f"[{p}]" if p == aspm_policy else p for p in ("default", "performance", "powersave", "powersupersave")))
        self.mkdir("/sys/bus/pci/devices")
        self.mkdir("/sys/kernel/iommu_groups")

    # ---- files --------------------------------------------------------------------------
    def real(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    def mkdir(self, host_path: str) -> None:
        self.real(host_path).mkdir(parents=True, exist_ok=True)

    def write(self, host_path: str, data) -> None:
        path = self.real(host_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data + "\n")

    def link(self, host_path: str, target_host_path: str) -> None:
        path = self.real(host_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        path.symlink_to(os.path.relpath(self.real(target_host_path), path.parent))

    # ---- topology -----------------------------------------------------------------------
    def host_bridge(self, domain: int = 0, bus: int = 0, numa_node: int = 0) -> str:
        name = f"pci{domain:04x}:{bus:02x}"
        self.dirs[name] = f"/sys/devices/{name}"
        self.numa[name] = numa_node
        self.mkdir(self.dirs[name])
        return name

    def new_group(self, *bdfs: str) -> int:
        group = self.next_group
        self.next_group += 1
        self.mkdir(f"/sys/kernel/iommu_groups/{group}/devices")
        self.write(f"/sys/kernel/iommu_groups/{group}/type", "DMA-FQ")
        for bdf in bdfs:
            self.join_group(bdf, group)
        return group

    def join_group(self, bdf: str, group: int) -> None:
        self.link(f"/sys/kernel/iommu_groups/{group}/devices/{bdf}", self.dirs[bdf])
        self.link(f"{self.dirs[bdf]}/iommu_group", f"/sys/kernel/iommu_groups/{group}")

    def add(self, bdf: str, parent: str, *, vendor: str = "0x8086", device: str = "0x1234", class_code: str = "0x060400",
            kind: str = "endpoint", driver: str | None = None, numa_node: int | None = None, msix: int = 0,
            irq_cpus: str | None = None, group: int | str | None = "new", config_size: int = 4096,
            config: bytes | None = None, link_cap=(32.0, 16), link_sta=None, aer_counters: bool = True, **cfg) -> str:
        """Add a function below ``parent`` (a host bridge name or a BDF).

        ``kind``: root_port, upstream_port, downstream_port, pcie_to_pci_bridge (bridges), endpoint,
        rc_integrated_endpoint, or ``pci`` (conventional PCI, no PCIe capability).
        ``group``: "new" for an IOMMU group of its own, an int to join one, None for none.
        ``irq_cpus``: effective affinity of every IRQ (default: the first CPU of its node).
        Other keywords go to config_space().
        """
        path = f"{self.dirs[parent]}/{bdf}"
        self.dirs[bdf] = path
        node = numa_node if numa_node is not None else self.numa[parent]
        self.numa[bdf] = node
        bridge = kind in ("root_port", "upstream_port", "downstream_port", "pcie_to_pci_bridge")
        if config is None:
            config = config_space(vendor, device, class_code, bridge=bridge, port_type=None if kind == "pci" else kind,
                                  link_cap=link_cap, link_sta=link_sta, msix=msix, **cfg)
        attrs = {"class": class_code, "vendor": vendor, "device": device, "subsystem_vendor": vendor,
                 "subsystem_device": "0x" + config[0x2E:0x30][::-1].hex() if not bridge else "0x0000",
                 "revision": "0xa1", "numa_node": str(node),
                 "local_cpulist": self.nodes.get(node, ",".join(self.nodes.values())),
                 "enable": "1", "irq": "0"}
        if kind != "pci":
            sta = link_sta or link_cap
            attrs.update({"current_link_speed": f"{sta[0]:g} GT/s PCIe", "current_link_width": str(sta[1]),
                          "max_link_speed": f"{link_cap[0]:g} GT/s PCIe", "max_link_width": str(link_cap[1])})
            if aer_counters:
                attrs["aer_dev_correctable"] = "\n".join(f"{n} 0" for n in ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout",
                                                                            "NonFatalErr", "CorrIntErr", "HeaderOF", "TOTAL_ERR_COR"))
                attrs["aer_dev_nonfatal"] = "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nTOTAL_ERR_NONFATAL 0"
                attrs["aer_dev_fatal"] = "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nTOTAL_ERR_FATAL 0"
        for name, value in attrs.items():
            self.write(f"{path}/{name}", value)
        self.write(f"{path}/config", config[:config_size])
        if driver:
            self.mkdir(f"/sys/bus/pci/drivers/{driver}")
            self.link(f"{path}/driver", f"/sys/bus/pci/drivers/{driver}")
        self.link(f"/sys/bus/pci/devices/{bdf}", path)
        if bridge and kind != "pcie_to_pci_bridge":
            self.mkdir(f"{path}/pci_bus")
        cpus = irq_cpus or self.nodes.get(node, "0").split(",")[0].split("-")[0]
        for _vector in range(msix):
            irq = self.next_irq
            self.next_irq += 1
            self.write(f"{path}/msi_irqs/{irq}", "msix")
            self.write(f"/proc/irq/{irq}/smp_affinity_list", self.nodes.get(node, "0"))
            self.write(f"/proc/irq/{irq}/effective_affinity_list", cpus)
        if self.iommu and group is not None:
            if group == "new":
                self.new_group(bdf)
            else:
                self.join_group(bdf, int(group))
        return bdf

    def gpu(self, bdf: str, parent: str, **kw) -> str:
        kw.setdefault("vendor", NVIDIA_H100[0])
        kw.setdefault("device", NVIDIA_H100[1])
        kw.setdefault("class_code", "0x030200")
        kw.setdefault("driver", "nvidia")
        kw.setdefault("msix", 4)
        kw.setdefault("aspm_support", "L0s L1")
        return self.add(bdf, parent, kind="endpoint", **kw)

    def switch(self, up_bdf: str, parent: str, down_bdfs, acs: bool = True, link_cap=(32.0, 16), **kw) -> list[str]:
        """A PCIe switch: its upstream port below ``parent`` and downstream ports below that."""
        self.add(up_bdf, parent, kind="upstream_port", vendor="0x1000", device="0xc030", link_cap=link_cap,
                 aspm_support="L1", **kw)
        acs_kw = {"acs_cap": ("SV", "TB", "RR", "CR", "UF", "EC", "DT"), "acs_ctrl": ACS_REDIRECT_ON if acs else ()}
        for i, bdf in enumerate(down_bdfs):
            self.add(bdf, up_bdf, kind="downstream_port", vendor="0x1000", device="0xc030", link_cap=link_cap,
                     aspm_support="L1", secondary_bus=i + 1, **acs_kw, **kw)
        return list(down_bdfs)


# ---- scenarios ---------------------------------------------------------------------------------
def two_gpus_one_switch(root, acs: bool = True, **host_kw) -> FakeHost:
    """Root port 00:01.0 -> switch 01:00.0 -> ports 02:00.0, 02:01.0 -> GPUs 03:00.0, 04:00.0 (node 0)."""
    host = FakeHost(root, **host_kw)
    hb = host.host_bridge(0, 0, numa_node=0)
    host.add("0000:00:00.0", hb, kind="pci", class_code="0x060000", vendor="0x8086", device="0x09a2", group=None)
    host.add("0000:00:01.0", hb, kind="root_port", vendor="0x8086", device="0x347a", acs_cap=("SV", "RR", "CR", "UF"),
             acs_ctrl=ACS_REDIRECT_ON)
    host.switch("0000:01:00.0", "0000:00:01.0", ["0000:02:00.0", "0000:02:01.0"], acs=acs, group=None if not acs else "new")
    if acs:
        host.gpu("0000:03:00.0", "0000:02:00.0")
        host.gpu("0000:04:00.0", "0000:02:01.0")
    else:  # without ACS the switch and both GPUs land in one group
        group = host.new_group("0000:01:00.0", "0000:02:00.0", "0000:02:01.0")
        host.gpu("0000:03:00.0", "0000:02:00.0", group=group)
        host.gpu("0000:04:00.0", "0000:02:01.0", group=group)
    return host


def two_numa_nodes(root, remote_irqs: bool = True, **host_kw) -> FakeHost:
    """GPU 17:00.0 below root port 16:01.0 on node 0; GPU 97:00.0 below 96:01.0 on node 1.

    With ``remote_irqs`` the node-1 GPU's IRQs are served on CPU 0 (node 0).
    """
    host_kw.setdefault("nodes", {0: "0-7", 1: "8-15"})
    host = FakeHost(root, **host_kw)
    hb0 = host.host_bridge(0, 0x16, numa_node=0)
    hb1 = host.host_bridge(0, 0x96, numa_node=1)
    host.add("0000:16:01.0", hb0, kind="root_port", acs_cap=("SV", "RR", "CR", "UF"), acs_ctrl=ACS_REDIRECT_ON)
    host.add("0000:96:01.0", hb1, kind="root_port", acs_cap=("SV", "RR", "CR", "UF"), acs_ctrl=ACS_REDIRECT_ON)
    host.gpu("0000:17:00.0", "0000:16:01.0")
    host.gpu("0000:97:00.0", "0000:96:01.0", irq_cpus="0" if remote_irqs else "8")
    return host


def degraded_link(root, link_sta=(32.0, 8), **host_kw) -> FakeHost:
    """One Gen5 x16 GPU below a Gen5 x16 root port whose link trained at ``link_sta``."""
    host = FakeHost(root, **host_kw)
    hb = host.host_bridge(0, 0)
    host.add("0000:00:01.0", hb, kind="root_port", link_sta=link_sta)
    host.gpu("0000:01:00.0", "0000:00:01.0", link_sta=link_sta)
    return host


def eight_gpus(root, **host_kw) -> FakeHost:
    """2 sockets x 2 switches x 2 GPUs, the common 8-GPU PCIe server (for the benchmark)."""
    host_kw.setdefault("nodes", {0: "0-63", 1: "64-127"})
    host = FakeHost(root, **host_kw)
    bus = 0x10
    for node in (0, 1):
        for sw in range(2):
            hb = host.host_bridge(0, bus, numa_node=node)
            rp = host.add(f"0000:{bus:02x}:01.0", hb, kind="root_port", acs_cap=("SV", "RR", "CR", "UF"), acs_ctrl=ACS_REDIRECT_ON)
            up = f"0000:{bus + 1:02x}:00.0"
            downs = host.switch(up, rp, [f"0000:{bus + 2:02x}:00.0", f"0000:{bus + 2:02x}:01.0"])
            for i, down in enumerate(downs):
                host.gpu(f"0000:{bus + 3 + i:02x}:00.0", down, msix=8)
            # a NIC beside the GPUs, as on real boards
            host.add(f"0000:{bus:02x}:02.0", hb, kind="root_port")
            host.add(f"0000:{bus + 5:02x}:00.0", f"0000:{bus:02x}:02.0", class_code="0x020700", vendor="0x15b3",
                     device="0x1021", driver="mlx5_core", msix=16)
            bus += 0x20
    return host


# ---- captures ----------------------------------------------------------------------------------
def capture_tool():
    """tests/tools/capture_pci_tree.py as a module (one implementation of the capture format)."""
    spec = importlib.util.spec_from_file_location("capture_pci_tree", TOOLS / "capture_pci_tree.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_capture(name_or_path, dest) -> Path:
    """Restore a capture (a name under tests/fixtures/pci, or a path) into ``dest``; returns it as a root."""
    src = Path(name_or_path)
    if not src.exists():
        src = FIXTURES / str(name_or_path)
    tool = capture_tool()
    return Path(tool.restore(tool.load(str(src)), str(dest)))

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


def payload_switch(root, nic: bool = False, mps: int = 128, mrrs: int = 512, gpu_b_mps_supported: int = 256,
                   **host_kw) -> FakeHost:
    """Path-safe and peer-safe MaxPayload differ (for pcie_payload).

    Root port 00:01.0 -> switch 01:00.0 -> ports 02:00.0, 02:01.0 (and 02:02.0 with ``nic``), every
    bridge supporting 512. GPU 03:00.0 supports 512, so its own path allows 512; GPU 04:00.0 below
    the other port supports only ``gpu_b_mps_supported``, which limits the whole hierarchy (peer).
    With ``nic`` a ConnectX (15b3:1021) at 05:00.0 below 02:02.0, supporting 512. Everything is set to
    MaxPayload ``mps`` and MaxReadReq ``mrrs``, like a firmware default. A second, unrelated root port
    00:02.0 holds an NVMe drive (supports 256, set to 256).
    """
    host = FakeHost(root, **host_kw)
    hb = host.host_bridge(0, 0, numa_node=0)
    common = {"mps_supported": 512, "mps": mps, "mrrs": mrrs}
    host.add("0000:00:01.0", hb, kind="root_port", vendor="0x8086", device="0x347a", acs_cap=("SV", "RR", "CR", "UF"),
             acs_ctrl=ACS_REDIRECT_ON, **common)
    downs = ["0000:02:00.0", "0000:02:01.0"] + (["0000:02:02.0"] if nic else [])
    host.switch("0000:01:00.0", "0000:00:01.0", downs, **common)
    host.gpu("0000:03:00.0", "0000:02:00.0", **common)
    host.gpu("0000:04:00.0", "0000:02:01.0", mps_supported=gpu_b_mps_supported, mps=mps, mrrs=mrrs)
    if nic:
        host.add("0000:05:00.0", "0000:02:02.0", class_code="0x020700", vendor="0x15b3", device="0x1021",
                 driver="mlx5_core", msix=4, **common)
    host.add("0000:00:02.0", hb, kind="root_port", vendor="0x8086", device="0x347b", mps_supported=256, mps=256)
    host.add("0000:06:00.0", "0000:00:02.0", class_code="0x010802", vendor="0x144d", device="0xa80a", driver="nvme",
             mps_supported=256, mps=256)
    return host


# ---- vfio, IRQ affinity and huge pages (added with the vfio_bind, irq_affinity and hugepages modules) ------------
DEBIAN_IRQBALANCE = """# irqbalance is a daemon process that distributes interrupts across
# CPUs on SMP systems.
#
#IRQBALANCE_ONESHOT=
#
# IRQBALANCE_BANNED_CPULIST
#IRQBALANCE_BANNED_CPULIST=
#
# IRQBALANCE_ARGS
#    Append any args here to the irqbalance daemon as documented in the man page.
#
#IRQBALANCE_ARGS="""


def group_of(host: FakeHost, bdf: str) -> int | None:
    """The IOMMU group FakeHost put ``bdf`` in."""
    link = host.real(f"{host.dirs[bdf]}/iommu_group")
    return int(os.path.basename(os.readlink(link))) if link.is_symlink() else None


def cpus_online(host: FakeHost, cpulist: str, default_affinity: str | None = None) -> None:
    """/sys/devices/system/cpu/online and /proc/irq/default_smp_affinity (hex mask; default: all online)."""
    host.write("/sys/devices/system/cpu/online", cpulist)
    cpus = set()
    for part in cpulist.split(","):
        lo, _sep, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    host.write("/proc/irq/default_smp_affinity", default_affinity or format(sum(1 << c for c in cpus), "x"))


def node_memory(host: FakeHost, node: int, mem_total_kb: int, pages=None, has_memory: bool = True) -> None:
    """A node's meminfo and its per-size huge page counts ({2048: n, 1048576: m}); keeps has_memory up to date."""
    pages = {2048: 0, 1048576: 0, **(pages or {})}
    host.write(f"/sys/devices/system/node/node{node}/meminfo",
               f"Node {node} MemTotal:       {mem_total_kb} kB\nNode {node} MemFree:        {mem_total_kb // 2} kB\n"
               f"Node {node} HugePages_Total:  {pages[2048]}\n")
    for kb, count in pages.items():
        base = f"/sys/devices/system/node/node{node}/hugepages/hugepages-{kb}kB"
        host.write(f"{base}/nr_hugepages", str(count))
        host.write(f"{base}/free_hugepages", str(count))
        host.write(f"{base}/surplus_hugepages", "0")
    with_memory = getattr(host, "_with_memory", set())
    if has_memory:
        with_memory.add(node)
    else:
        with_memory.discard(node)
    host._with_memory = with_memory  # pylint: disable=protected-access
    host.write("/sys/devices/system/node/has_memory", ",".join(str(n) for n in sorted(with_memory)))


def gpu_with_audio(host: FakeHost, bdf: str, parent: str, **kw) -> tuple[str, str]:
    """An NVIDIA GPU (function .0) and its HDMI audio function (.1, snd_hda_intel) in one IOMMU group."""
    host.gpu(bdf, parent, **kw)
    audio = bdf[:-1] + "1"
    host.add(audio, parent, vendor="0x10de", device="0x22e8", class_code="0x040300", driver="snd_hda_intel",
             msix=1, group=group_of(host, bdf))
    return bdf, audio


def driver_module(host: FakeHost, driver: str, module: str | None = None) -> None:
    """/sys/bus/pci/drivers/<driver>/module -> /sys/module/<module> (absent for built-in drivers)."""
    host.mkdir(f"/sys/module/{module or driver}")
    host.link(f"/sys/bus/pci/drivers/{driver}/module", f"/sys/module/{module or driver}")


def nvidia_proc(host: FakeHost, bdf: str, minor: int) -> None:
    host.write(f"/proc/driver/nvidia/gpus/{bdf}/information", f"Model: \t\t NVIDIA H100\nIRQ:   \t\t 0\nDevice Minor: \t {minor}\n")


def hold(host: FakeHost, pid: int, comm: str, *dev_paths: str) -> None:
    """A process with open descriptors on /dev paths (dangling links, as /proc/PID/fd reads them)."""
    host.write(f"/proc/{pid}/comm", comm)
    host.mkdir(f"/proc/{pid}/fd")
    for fd, dev in enumerate(dev_paths, start=3):
        os.symlink(dev, host.real(f"/proc/{pid}/fd/{fd}"))


def nvme_disk(host: FakeHost, bdf: str, ctrl: int = 0, partitions: int = 1) -> list[dict[str, str]]:
    """NVMe controller nvme<ctrl> under ``bdf`` with namespace 1 the way native multipath lays it out:
    the hidden path nvme<c>c<c>n1 under the controller, the block device under the subsystem. Returns the block devices."""
    base = f"{host.dirs[bdf]}/nvme/nvme{ctrl}"
    host.write(f"{base}/uevent", f"MAJOR=240\nMINOR={ctrl}\nDEVNAME=nvme{ctrl}")
    host.write(f"{base}/dev", f"240:{ctrl}")
    host.write(f"{base}/nvme{ctrl}c{ctrl}n1/uevent", "DEVTYPE=disk")
    head = f"nvme{ctrl}n1"
    sub = f"/sys/devices/virtual/nvme-subsystem/nvme-subsys{ctrl}/{head}"
    blocks = [{"name": head, "dev": f"259:{ctrl * 16}"}]
    host.write(f"{sub}/uevent", f"MAJOR=259\nMINOR={ctrl * 16}\nDEVNAME={head}\nDEVTYPE=disk")
    host.write(f"{sub}/dev", blocks[0]["dev"])
    host.mkdir(f"{sub}/holders")
    for p in range(1, partitions + 1):
        dev = f"259:{ctrl * 16 + p}"
        host.write(f"{sub}/{head}p{p}/uevent", f"MAJOR=259\nMINOR={ctrl * 16 + p}\nDEVNAME={head}p{p}\nDEVTYPE=partition")
        host.write(f"{sub}/{head}p{p}/dev", dev)
        host.mkdir(f"{sub}/{head}p{p}/holders")
        host.link(f"/sys/class/block/{head}p{p}", f"{sub}/{head}p{p}")
        blocks.append({"name": f"{head}p{p}", "dev": dev})
    host.link(f"/sys/class/block/{head}", sub)
    return blocks


def mount(host: FakeHost, dev: str, mountpoint: str, fstype: str = "ext4") -> None:
    """Add a line to /proc/self/mountinfo for block device ``dev`` (major:minor)."""
    path = host.real("/proc/self/mountinfo")
    old = path.read_text() if path.exists() else "22 1 0:21 / /proc rw - proc proc rw\n"
    n = len(old.splitlines()) + 30
    host.write("/proc/self/mountinfo", old.rstrip("\n") + f"\n{n} 1 {dev} / {mountpoint} rw,relatime - {fstype} /dev/x rw")


def net_interface(host: FakeHost, bdf: str, name: str, up: bool = True) -> None:
    host.write(f"{host.dirs[bdf]}/net/{name}/flags", "0x1003" if up else "0x1002")
    host.write(f"{host.dirs[bdf]}/net/{name}/uevent", f"INTERFACE={name}\nIFINDEX=2")


def irqbalance_installed(host: FakeHost, config: str | None = DEBIAN_IRQBALANCE, path: str = "/etc/default/irqbalance") -> None:
    host.write("/usr/sbin/irqbalance", "#!/bin/false")
    if config is not None:
        host.write(path, config)


class SimKernel:
    """Kernel behaviour for the writes the vfio_bind, irq_affinity and hugepages modules make, on a FakeHost tree.

    Wraps a HostFS (``fs()``) whose ``write_text`` acts as the kernel would: driver_override, unbind,
    drivers_probe (binding the override or the function's natural driver, vfio-pci only with an IOMMU group,
    new IRQ numbers for the new driver's vectors), smp_affinity_list (EIO for kernel-managed IRQs, EINVAL for
    offline CPUs) and nr_hugepages (capped where memory is short). Every write is logged in ``writes``.
    """

    def __init__(self, host: FakeHost, managed_irqs=(), hugepage_cap=None, online: str | None = None):
        import errno as _errno
        import re as _re
        from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError

        self.host = host
        self.managed = set(managed_irqs)
        self.cap = dict(hugepage_cap or {})  # {(node, kb): most pages the kernel can give}
        self.writes: list[tuple[str, str]] = []
        self.natural: dict[str, str] = {}
        self.vectors: dict[str, int] = {}
        for bdf, path in host.dirs.items():
            link = host.real(f"{path}/driver")
            if link.is_symlink():
                self.natural[bdf] = os.path.basename(os.readlink(link))
            irqs = host.real(f"{path}/msi_irqs")
            self.vectors[bdf] = len(os.listdir(irqs)) if irqs.is_dir() else 0
        self.online = online
        sim = self
        re_, errno_ = _re, _errno

        class _FS(HostFS):
            def write_text(self, host_path: str, data: str) -> None:
                sim.writes.append((host_path, data))

                def fail(code: int, text: str):
                    raise HostFSError("write", host_path, OSError(code, text))
                m = re_.match(r"^/sys/bus/pci/devices/([^/]+)/driver_override$", host_path)
                if m:
                    return HostFS.write_text(self, host_path, data.strip() or "(null)")
                m = re_.match(r"^/sys/bus/pci/(?:devices/[^/]+/driver|drivers/[^/]+)/unbind$", host_path)
                if m:
                    return sim.unbind(data.strip())
                if host_path == "/sys/bus/pci/drivers_probe":
                    code = sim.probe(data.strip())
                    if code:
                        fail(code, os.strerror(code))
                    return None
                m = re_.match(r"^/proc/irq/(\d+)/smp_affinity_list$", host_path)
                if m:
                    if int(m.group(1)) in sim.managed:
                        fail(errno_.EIO, "Input/output error")
                    wanted = sim.cpus(data)
                    if not wanted & sim.cpus(sim.online_list()):  # the kernel needs one online CPU in the mask
                        fail(errno_.EINVAL, "Invalid argument")
                    HostFS.write_text(self, host_path, data.strip())
                    return HostFS.write_text(self, f"/proc/irq/{m.group(1)}/effective_affinity_list", str(min(wanted)))
                m = re_.match(r"^/sys/devices/system/node/node(\d+)/hugepages/hugepages-(\d+)kB/nr_hugepages$", host_path)
                if m:
                    count = int(data)
                    count = min(count, sim.cap.get((int(m.group(1)), int(m.group(2))), count))
                    HostFS.write_text(self, host_path, str(count))
                    return HostFS.write_text(self, host_path.replace("nr_hugepages", "free_hugepages"), str(count))
                return HostFS.write_text(self, host_path, data)

        self._fs = _FS(str(host.root))

    def fs(self):
        return self._fs

    # ---- helpers -----------------------------------------------------------------------------
    @staticmethod
    def cpus(text: str | None) -> set:
        out = set()
        for part in (text or "").strip().split(","):
            if part:
                lo, _sep, hi = part.partition("-")
                out.update(range(int(lo), int(hi or lo) + 1))
        return out

    def online_list(self) -> str:
        path = self.host.real("/sys/devices/system/cpu/online")
        return self.online or (path.read_text().strip() if path.exists() else ",".join(self.host.nodes.values()))

    def driver(self, bdf: str) -> str | None:
        link = self.host.real(f"{self.host.dirs[bdf]}/driver")
        return os.path.basename(os.readlink(link)) if link.is_symlink() else None

    def load(self, driver: str) -> None:
        """What modprobe does for a PCI driver module: the driver appears and probes unbound functions it matches."""
        self.host.mkdir(f"/sys/bus/pci/drivers/{driver}")
        for bdf in list(self.host.dirs):
            if bdf.startswith("pci") or self.driver(bdf):
                continue
            override = self.override(bdf)
            if override == driver or (override is None and self.natural.get(bdf) == driver):
                self.probe(bdf)

    def override(self, bdf: str) -> str | None:
        path = self.host.real(f"{self.host.dirs[bdf]}/driver_override")
        value = path.read_text().strip() if path.exists() else ""
        return None if value in ("", "(null)") else value

    def unbind(self, bdf: str) -> None:
        path = self.host.dirs[bdf]
        link = self.host.real(f"{path}/driver")
        if link.is_symlink():
            link.unlink()
        irqs = self.host.real(f"{path}/msi_irqs")
        if irqs.is_dir():
            for name in os.listdir(irqs):
                os.unlink(irqs / name)
                proc = self.host.real(f"/proc/irq/{name}")
                for f in os.listdir(proc) if proc.is_dir() else []:
                    os.unlink(proc / f)
                if proc.is_dir():
                    proc.rmdir()

    def probe(self, bdf: str) -> int:
        """drivers_probe: 0, or the errno the write fails with."""
        import errno as _errno
        path = self.host.dirs[bdf]
        if self.driver(bdf):
            return 0
        driver = self.override(bdf) or self.natural.get(bdf)
        if not driver or not self.host.real(f"/sys/bus/pci/drivers/{driver}").is_dir():
            return 0
        if driver == "vfio-pci" and not self.host.real(f"{path}/iommu_group").is_symlink():
            return _errno.EINVAL
        self.host.link(f"{path}/driver", f"/sys/bus/pci/drivers/{driver}")
        if driver != "vfio-pci":
            for _vector in range(self.vectors.get(bdf, 0)):
                irq = self.host.next_irq
                self.host.next_irq += 1
                self.host.write(f"{path}/msi_irqs/{irq}", "msix")
                self.host.write(f"/proc/irq/{irq}/smp_affinity_list", self.online_list())
                self.host.write(f"/proc/irq/{irq}/effective_affinity_list", str(min(self.cpus(self.online_list()))))
        return 0

    def rebind(self, bdf: str) -> None:
        """The driver lets go and takes the function again (rmmod/modprobe, a reset): new IRQ numbers."""
        self.unbind(bdf)
        self.probe(bdf)


INTEL_IDLE_STATES = (("POLL", 0), ("C1", 2), ("C1E", 10), ("C6", 170))
EPP_WORDS = "default performance balance_performance balance_power power"


def cpu_knobs(host: FakeHost, cpus: int = 4, driver: str | None = "intel_pstate", governor: str = "powersave",
              governors: str = "performance powersave", epp: str | None = "balance_performance",
              idle_driver: str | None = "intel_idle", idle_states=INTEL_IDLE_STATES, thp=("always", "madvise")) -> None:
    """The CPU side of a host as the kernel shows it: one cpufreq policy per CPU (``driver`` None: no cpufreq, as in
    a VM), its governor and EPP (``epp`` None: none, as with acpi-cpufreq), cpuidle states ``(name, exit latency in
    us)`` per online CPU (``idle_driver`` None: no cpuidle, as under QEMU TCG), and the THP words in force
    (``thp`` None: no transparent hugepages)."""
    base = "/sys/devices/system/cpu"
    host.write(f"{base}/online", f"0-{cpus - 1}")
    for cpu in range(cpus):
        host.mkdir(f"{base}/cpu{cpu}")
        if driver is not None:
            pol = f"{base}/cpufreq/policy{cpu}"
            for name, text in (("affected_cpus", str(cpu)), ("related_cpus", str(cpu)), ("scaling_driver", driver),
                               ("scaling_governor", governor), ("scaling_available_governors", governors)):
                host.write(f"{pol}/{name}", text)
            if epp is not None:
                host.write(f"{pol}/energy_performance_preference", epp)
                host.write(f"{pol}/energy_performance_available_preferences", EPP_WORDS)
            host.link(f"{base}/cpu{cpu}/cpufreq", pol)
        if idle_driver is not None:
            for i, (name, latency) in enumerate(idle_states):
                st = f"{base}/cpu{cpu}/cpuidle/state{i}"
                for attr, text in (("name", name), ("latency", str(latency)), ("disable", "0")):
                    host.write(f"{st}/{attr}", text)
    host.write(f"{base}/cpuidle/current_driver", idle_driver or "none")
    if thp is not None:
        host.write("/sys/kernel/mm/transparent_hugepage/enabled",
                   " ".join(f"[{w}]" if w == thp[0] else w for w in ("always", "madvise", "never")))
        host.write("/sys/kernel/mm/transparent_hugepage/defrag",
                   " ".join(f"[{w}]" if w == thp[1] else w for w in ("always", "defer", "defer+madvise", "madvise", "never")))

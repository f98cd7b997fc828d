# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The PCI tree as sysfs shows it, read through HostFS.

``/sys/bus/pci/devices/<bdf>`` links to ``/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0``:
the directory chain is the path from the host bridge down to the function. PciWalker reads each
function on that path (config space, driver, IOMMU group, NUMA node, MSI/MSI-X IRQs and their
affinity, the kernel's link attributes, AER counters) and build_model() assembles the model that
pcie_findings judges. Parsers are pure functions; every read goes through the HostFS seam.
"""

from __future__ import annotations

import itertools
import os
import re
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.config import PCI_DEVICES, read_config

try:
    import pyudev
    HAS_PYUDEV = True
except ImportError:  # optional: names then come from pci.ids
    pyudev = None
    HAS_PYUDEV = False

IOMMU_GROUPS = "/sys/kernel/iommu_groups"
NODES = "/sys/devices/system/node"
HUGEPAGES = "/sys/kernel/mm/hugepages"
ASPM_POLICY = "/sys/module/pcie_aspm/parameters/policy"
PCI_IDS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids")

BDF_RE = re.compile(r"^(?:([0-9a-f]{4,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
HOST_BRIDGE_RE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")

# Topology levels, nearest first, as nvidia-smi topo -m names them.
LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")

CLASS_NAMES = {
    "0x0000": "unclassified device", "0x0100": "SCSI controller", "0x0104": "RAID controller",
    "0x0106": "SATA controller", "0x0107": "SAS controller", "0x0108": "NVMe controller",
    "0x0180": "storage controller", "0x0200": "Ethernet controller", "0x0207": "InfiniBand controller",
    "0x0280": "network controller", "0x0300": "VGA controller", "0x0302": "3D controller",
    "0x0380": "display controller", "0x0403": "audio device", "0x0600": "host bridge",
    "0x0601": "ISA bridge", "0x0604": "PCI bridge", "0x0609": "semi-transparent PCI bridge",
    "0x0680": "bridge", "0x0880": "system peripheral", "0x0b40": "co-processor",
    "0x0c03": "USB controller", "0x0c05": "SMBus controller", "0x1080": "encryption controller",
    "0x1200": "processing accelerator", "0x1300": "non-essential instrumentation", "0xffff": "unassigned class",
}
BRIDGE_CLASSES = ("0x0604", "0x0609")
# Display controllers of server BMCs (ASPEED, Matrox): class 03xx, but not GPUs to audit.
BMC_VENDORS = ("1a03", "102b")


class TopologyError(Exception):
    """A target cannot be audited; the message says what, where, why and what to do."""


# ---- pure parsers --------------------------------------------------------------------------
def normalize_bdf(text: str) -> str | None:
    """``3b:00.0``, ``0000:3b:00.0`` or NVML's ``00000000:3B:00.0`` -> ``0000:3b:00.0``; None if not a BDF."""
    m = BDF_RE.match(str(text).strip().lower())
    if not m:
        return None
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{m.group(2)}:{m.group(3)}.{m.group(4)}"


def parse_cpulist(text: str | None) -> list[int]:
    """``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in (text or "").strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi.split(":")[0]) + 1))
        else:
            cpus.append(int(part))
    return sorted(set(cpus))


def format_cpulist(cpus) -> str:
    """[0, 1, 2, 5] -> ``0-2,5``."""
    out = []
    for _key, grp in itertools.groupby(enumerate(sorted(set(cpus))), lambda t: t[1] - t[0]):
        run = [c for _i, c in grp]
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> {key: value} (kB values stay in kB; HugePages_* are counts)."""
    out = {}
    for line in text.splitlines():
        key, _sep, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[key.strip()] = int(fields[0])
    return out


def parse_counters(text: str | None) -> dict[str, int] | None:
    """sysfs AER counter files (``RxErr 0`` lines) -> {name: count}."""
    if text is None:
        return None
    out = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].isdigit():
            out[fields[0]] = int(fields[1])
    return out


def parse_link_speed(text: str | None) -> float | None:
    """sysfs ``current_link_speed`` (``16.0 GT/s PCIe``, ``2.5 GT/s``, ``Unknown``) -> GT/s."""
    try:
        return float((text or "").split()[0])
    except (IndexError, ValueError):
        return None


def parse_aspm_policy(text: str | None) -> str | None:
    """``default [performance] powersave`` -> ``performance``."""
    m = re.search(r"\[(\w+)\]", text or "")
    return m.group(1) if m else None


def iommu_passthrough_on_cmdline(cmdline: str | None) -> bool:
    """iommu=pt or iommu.passthrough=1 on the kernel command line."""
    tokens = (cmdline or "").split()
    return any(t in tokens for t in ("iommu=pt", "iommu.passthrough=1", "iommu.passthrough=on", "iommu.passthrough=y"))


def split_sysfs_path(path: str) -> tuple[str | None, list[str]]:
    """``/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0`` -> (``pci0000:00``, [BDF chain]).

    The host bridge is the last ``pciDDDD:BB`` directory above the first function, which also
    handles VMD domains (``.../0000:00:0e.0/pci10000:00/10000:00:01.0``): their chain continues.
    """
    host_bridge = None
    chain: list[str] = []
    for part in path.split("/"):
        if HOST_BRIDGE_RE.match(part) and not chain:
            host_bridge = part
        elif BDF_RE.match(part) and part.count(":") == 2:
            chain.append(part)
    return host_bridge, chain


def class_name(cls: str | None) -> str | None:
    if not cls:
        return None
    return CLASS_NAMES.get(cls[:6]) or CLASS_NAMES.get(cls[:4] + "80") or f"class {cls[2:6]}"


def is_bridge_class(cls: str | None) -> bool:
    return bool(cls) and cls[:6] in BRIDGE_CLASSES


def lookup_pci_ids(text: str, wanted: set) -> dict:
    """Names from a pci.ids text for wanted {(vendor, device)} ('10de', '2335') pairs.

    Returns {(vendor, device): (vendor_name, device_name or None)}; scans once, only keeping the
    vendor sections it needs.
    """
    vendors = {v for v, _d in wanted}
    names: dict = {}
    vendor = vname = None
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        if line[0] != "\t":
            if line.startswith("C "):
                break  # the class section follows the vendors
            vendor, _sep, vname = line.partition("  ")
            vendor = vendor.lower() if vendor.lower() in vendors else None
            if vendor:
                for key in wanted:
                    if key[0] == vendor:
                        names.setdefault(key, (vname.strip(), None))
            continue
        if vendor and line[1] != "\t":
            dev, _sep, dname = line[1:].partition("  ")
            key = (vendor, dev.lower())
            if key in wanted:
                names[key] = (vname.strip(), dname.strip())
    return names


def topology_level(a: dict, b: dict) -> tuple[str, str | None, list[str]]:
    """Level between two functions, like ``nvidia-smi topo -m`` without NVLink.

    ``a``/``b`` need ``host_bridge``, ``path`` (BDFs, top -> function) and ``numa_node``.
    Returns (level, deepest common function or None, bridges crossed below it).
    PIX: both sit directly below one bridge/switch; PXB: more bridges, no host bridge;
    PHB: same host bridge; NODE: different host bridges, same NUMA node; SYS: across nodes.
    """
    if a["host_bridge"] != b["host_bridge"]:
        na, nb = a.get("numa_node"), b.get("numa_node")
        known = na is not None and nb is not None and na >= 0 and nb >= 0
        return ("SYS" if known and na != nb else "NODE"), None, []
    pa, pb = a["path"], b["path"]
    n = 0
    while n < min(len(pa), len(pb)) - 1 and pa[n] == pb[n]:
        n += 1
    if n == 0:
        return "PHB", None, []
    below = pa[n:-1] + pb[n:-1]
    level = "PIX" if len(pa) - n <= 2 and len(pb) - n <= 2 else "PXB"
    return level, pa[n - 1], below


def nearest_level(levels) -> str | None:
    ranked = [lv for lv in levels if lv in LEVELS]
    return min(ranked, key=LEVELS.index) if ranked else None


# ---- the walker ----------------------------------------------------------------------------
class PciWalker:
    """Reads PCI functions through a HostFS; every record is cached for the run."""

    def __init__(self, fs: HostFS):
        self.fs = fs
        self._devices: dict[str, dict[str, Any]] = {}
        self._basic: dict[str, dict[str, str | None]] = {}

    def functions(self) -> list[str]:
        try:
            return [b for b in self.fs.listdir(PCI_DEVICES) if BDF_RE.match(b)]
        except HostFSError as err:
            raise TopologyError(f"Cannot list PCI functions: {err}. The module needs a Linux host with sysfs mounted at /sys.") from None

    def basic(self, bdf: str) -> dict[str, str | None]:
        """class/vendor/device from the kernel's attribute files (cheap, for filtering)."""
        if bdf not in self._basic:
            base = f"{PCI_DEVICES}/{bdf}/"
            self._basic[bdf] = {k: self.fs.read_optional(base + k) for k in ("class", "vendor", "device")}
        return self._basic[bdf]

    def sysfs_path(self, bdf: str) -> str:
        return self.fs.realpath(f"{PCI_DEVICES}/{bdf}")

    def path(self, bdf: str) -> tuple[str | None, list[str]]:
        """(host bridge, [BDFs from the topmost function down to ``bdf``])."""
        host_bridge, chain = split_sysfs_path(self.sysfs_path(bdf))
        if not chain or chain[-1] != bdf:
            chain = [bdf]
        return host_bridge, chain

    def irqs(self, sysdir: str) -> list[dict[str, Any]]:
        out = []
        names = self.fs.listdir(sysdir + "/msi_irqs")
        for name in sorted((n for n in names if n.isdigit()), key=int):
            irq = f"/proc/irq/{name}/"
            out.append({"irq": int(name), "mode": self.fs.read_optional(f"{sysdir}/msi_irqs/{name}"),
                        "smp_affinity_list": self.fs.read_optional(irq + "smp_affinity_list"),
                        "effective_affinity_list": self.fs.read_optional(irq + "effective_affinity_list")})
        return out

    def group_members(self, group: str) -> list[dict[str, Any]]:
        out = []
        for member in self.fs.listdir(f"{IOMMU_GROUPS}/{group}/devices"):
            cls = self.basic(member)["class"]
            out.append({"bdf": member, "class": cls, "class_name": class_name(cls), "is_bridge": is_bridge_class(cls)})
        return out

    def device(self, bdf: str) -> dict[str, Any]:
        """Everything the audit knows about one function."""
        if bdf in self._devices:
            return self._devices[bdf]
        sysdir = self.sysfs_path(bdf)
        host_bridge, chain = self.path(bdf)
        attr = {}
        for name in ("class", "vendor", "device", "subsystem_vendor", "subsystem_device", "revision", "numa_node",
                     "local_cpulist", "current_link_speed", "current_link_width", "max_link_speed", "max_link_width",
                     "aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal"):
            attr[name] = self.fs.read_optional(f"{sysdir}/{name}")
        driver = self.fs.readlink(sysdir + "/driver")
        group_link = self.fs.readlink(sysdir + "/iommu_group")
        group = os.path.basename(group_link) if group_link else None
        numa = attr["numa_node"]
        rec: dict[str, Any] = {
            "bdf": bdf,
            "sysfs_path": sysdir,
            "host_bridge": host_bridge,
            "parent": chain[-2] if len(chain) > 1 else None,
            "class": attr["class"],
            "class_name": class_name(attr["class"]),
            "vendor_id": attr["vendor"],
            "device_id": attr["device"],
            "subsystem_vendor_id": attr["subsystem_vendor"],
            "subsystem_id": attr["subsystem_device"],
            "revision": attr["revision"],
            "vendor_name": None,
            "device_name": None,
            "driver": os.path.basename(driver) if driver else None,
            "numa_node": int(numa) if numa and numa.lstrip("-").isdigit() else None,
            "local_cpulist": attr["local_cpulist"],
            "iommu_group": int(group) if group and group.isdigit() else None,
            "iommu_group_type": self.fs.read_optional(f"{IOMMU_GROUPS}/{group}/type") if group else None,
            "iommu_group_members": self.group_members(group) if group else [],
            "irqs": self.irqs(sysdir),
            "link_sysfs": None,
            "aer_counters": None,
            "config": None,
            "config_error": None,
        }
        if attr["current_link_speed"] is not None or attr["max_link_speed"] is not None:
            rec["link_sysfs"] = {
                "current_speed_gts": parse_link_speed(attr["current_link_speed"]),
                "current_width": int(attr["current_link_width"]) if (attr["current_link_width"] or "").isdigit() else None,
                "max_speed_gts": parse_link_speed(attr["max_link_speed"]),
                "max_width": int(attr["max_link_width"]) if (attr["max_link_width"] or "").isdigit() else None,
            }
        if any(attr[k] is not None for k in ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal")):
            rec["aer_counters"] = {k[8:]: parse_counters(attr[k]) for k in ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal")}
        read = read_config(self.fs, bdf)
        if read.error:
            rec["config_error"] = read.error
        else:
            rec["config"] = read.config
        self._devices[bdf] = rec
        return rec

    # ---- host-wide facts ------------------------------------------------------------------
    def numa_nodes(self) -> dict[int, dict[str, Any]]:
        out = {}
        for name in self.fs.listdir(NODES):
            if name.startswith("node") and name[4:].isdigit():
                cpulist = self.fs.read_optional(f"{NODES}/{name}/cpulist")
                out[int(name[4:])] = {"cpulist": cpulist, "cpus": len(parse_cpulist(cpulist))}
        return out

    def hugepages(self) -> dict[str, Any]:
        meminfo = parse_meminfo(self.fs.read_optional("/proc/meminfo") or "")
        sizes = {}
        for name in self.fs.listdir(HUGEPAGES):
            if name.startswith("hugepages-"):
                base = f"{HUGEPAGES}/{name}/"
                vals = {k: self.fs.read_optional(base + k) for k in ("nr_hugepages", "free_hugepages")}
                sizes[name[10:]] = {k: int(v) if (v or "").isdigit() else None for k, v in vals.items()}
        return {"total": meminfo.get("HugePages_Total"), "free": meminfo.get("HugePages_Free"),
                "size_kb": meminfo.get("Hugepagesize"), "hugetlb_kb": meminfo.get("Hugetlb"),
                "sizes": sizes,
                "reserved_pages": sum(s["nr_hugepages"] or 0 for s in sizes.values()) or meminfo.get("HugePages_Total") or 0}

    def cmdline(self) -> str | None:
        return self.fs.read_optional("/proc/cmdline")

    def iommu_groups(self) -> int:
        return len(self.fs.listdir(IOMMU_GROUPS))

    def aspm_policy(self) -> str | None:
        return parse_aspm_policy(self.fs.read_optional(ASPM_POLICY))

    def names(self, bdfs) -> tuple[dict[str, tuple], str | None]:
        """{bdf: (vendor name, device name)} from the udev database (pyudev, live host only) or pci.ids."""
        names: dict[str, tuple] = {}
        source = None
        if HAS_PYUDEV and self.fs.root == "/":
            try:
                ctx = pyudev.Context()
                for bdf in bdfs:
                    props = pyudev.Devices.from_sys_path(ctx, f"{PCI_DEVICES}/{bdf}").properties
                    if props.get("ID_VENDOR_FROM_DATABASE"):
                        names[bdf] = (props.get("ID_VENDOR_FROM_DATABASE"), props.get("ID_MODEL_FROM_DATABASE"))
                source = "udev" if names else None
            except Exception:  # pylint: disable=broad-except  # udev unusable (container): fall back to pci.ids
                names = {}
        missing = [b for b in bdfs if b not in names]
        if missing:
            wanted = {}
            for bdf in missing:
                b = self.basic(bdf)
                if b["vendor"] and b["device"]:
                    wanted[bdf] = (b["vendor"][2:].lower(), b["device"][2:].lower())
            for ids in PCI_IDS:
                text = self.fs.read_optional(ids) if wanted else None
                if text:
                    found = lookup_pci_ids(text, set(wanted.values()))
                    for bdf, key in wanted.items():
                        if key in found:
                            names[bdf] = found[key]
                    source = source + "+pci.ids" if source else "pci.ids"
                    break
        return names, source


# ---- target selection and the model ---------------------------------------------------------
def _describe(walker: PciWalker, bdf: str) -> str:
    b = walker.basic(bdf)
    return f"{bdf} {class_name(b['class']) or '?'} [{(b['vendor'] or '?')[2:]}:{(b['device'] or '?')[2:]}]"


def normalize_bdfs(raws) -> list[str]:
    """Every given PCI address in the sysfs form (``0000:3b:00.0``), in order; TopologyError names a malformed one."""
    out = []
    for raw in raws or []:
        bdf = normalize_bdf(raw)
        if bdf is None:
            raise TopologyError(f"devices: '{raw}' is not a PCI address: write it as DDDD:BB:DD.F, for example 0000:3b:00.0 "
                                "(lspci -D prints them).")
        out.append(bdf)
    return out


def select_targets(walker: PciWalker, devices=None, vendor: str | None = None, device: str | None = None,
                   class_prefix: str | None = "03", exclude_vendors=BMC_VENDORS) -> list[str]:
    """The functions to audit: the listed BDFs, or every function matching the filters.

    Raises TopologyError with what/where/why/what-to-do for a malformed or unknown BDF and for
    a host where nothing matches.
    """
    where = f"{PCI_DEVICES} (root {walker.fs.root})"
    present = walker.functions()
    if devices:
        out = []
        for raw in devices:
            bdf = normalize_bdfs([raw])[0]
            if bdf not in present:
                known = ", ".join(present[:12]) + (" ..." if len(present) > 12 else "")
                raise TopologyError(
                    f"PCI function {bdf} not found under {where}: this host has no such function "
                    f"(known: {known or 'none'}). Check the address with 'lspci -D' on the host, or drop it from devices.")
            if bdf not in out:
                out.append(bdf)
        return out

    def norm(x: str | None) -> str:
        x = (x or "").lower()
        return x[2:] if x.startswith("0x") else x

    vendor_n, device_n, prefix = norm(vendor), norm(device), norm(class_prefix)
    excluded = {norm(v) for v in exclude_vendors or ()}
    out = []
    for bdf in present:
        b = walker.basic(bdf)
        v, d, c = norm(b["vendor"]), norm(b["device"]), norm(b["class"])
        if (vendor_n and v != vendor_n) or (device_n and d != device_n):
            continue
        if prefix and not c.startswith(prefix):
            continue
        if not vendor_n and v in excluded:
            continue
        out.append(bdf)
    if not out:
        parts = [f"class {prefix}xx" if prefix else "", f"vendor {vendor_n}" if vendor_n else "", f"device {device_n}" if device_n else ""]
        wanted = " and ".join(p for p in parts if p) or "any function"
        seen = "; ".join(_describe(walker, b) for b in present[:8]) + (" ..." if len(present) > 8 else "")
        raise TopologyError(
            f"No GPU found under {where}: no PCI function matches {wanted} "
            f"({len(present)} functions scanned: {seen or 'none'}). If the host should have a GPU, check that it is "
            f"seated and powered (or passed through to this VM); to audit other functions, set devices: to their "
            f"addresses, or widen vendor/device/class_prefix.")
    return out


def build_model(fs: HostFS, targets: list[str], with_names: bool = True) -> dict[str, Any]:
    """Read every function on the targets' paths and the host facts the findings need."""
    walker = PciWalker(fs)
    devices: dict[str, dict[str, Any]] = {}
    gpus = []
    for bdf in targets:
        host_bridge, chain = walker.path(bdf)
        for hop in chain:
            rec = walker.device(hop)
            rec.setdefault("role", "bridge")
            devices[hop] = rec
        devices[bdf]["role"] = "target"
        gpus.append({"bdf": bdf, "host_bridge": host_bridge, "path": chain,
                     "numa_node": devices[bdf]["numa_node"], "root_port": chain[0] if len(chain) > 1 else None})
    if with_names:
        names, source = walker.names(list(devices))
        for bdf, (vname, dname) in names.items():
            devices[bdf]["vendor_name"], devices[bdf]["device_name"] = vname, dname
    else:
        source = None
    for gpu in gpus:
        gpu["name"] = devices[gpu["bdf"]]["device_name"]
    pairs = []
    for a, b in itertools.combinations(gpus, 2):
        level, common, below = topology_level(a, b)
        acs = [hop for hop in below if ((devices[hop]["config"] or {}).get("acs") or {}).get("p2p_redirect")]
        pairs.append({"a": a["bdf"], "b": b["bdf"], "level": level, "level_source": "sysfs", "sysfs_level": level,
                      "nvml_level": None, "common_ancestor": common, "bridges_between": below,
                      "acs_redirect": acs if level in ("PIX", "PXB") else [],
                      "numa_nodes": [a["numa_node"], b["numa_node"]], "p2p": None, "nvlinks": 0, "nvlink_via": None})
    groups = walker.iommu_groups()
    cmdline = walker.cmdline()
    return {
        "root": fs.root,
        "devices": devices,
        "gpus": gpus,
        "pairs": pairs,
        "numa_nodes": walker.numa_nodes(),
        "hugepages": walker.hugepages(),
        "cmdline": cmdline,
        "iommu": {"groups": groups, "enabled": groups > 0, "passthrough_cmdline": iommu_passthrough_on_cmdline(cmdline),
                  "passthrough": iommu_passthrough_on_cmdline(cmdline)
                  or any(d["iommu_group_type"] == "identity" for d in devices.values() if d["role"] == "target")},
        "aspm_policy": walker.aspm_policy(),
        "names_source": source,
    }

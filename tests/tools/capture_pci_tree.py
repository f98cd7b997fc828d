#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Capture what gpufleet.inference.pcie_facts reads from a host, as a test fixture.

Pure standard library; copy this one file to a host and run it there as root (config space beyond
64 bytes needs root). It only READS, and only an allowlist of files: the PCI functions' identity and
link attributes, ``config``, ``msi_irqs``, the ``driver``/``iommu_group``/``subsystem`` links, the
IOMMU groups, NUMA nodes, /proc/irq/N affinity lists of the captured IRQs, /proc/meminfo,
/proc/cmdline, hugepage counts and the ASPM policy. It never opens ``rom``, ``resource*``,
``reset``, ``remove``, ``rescan`` or any file not named here, and writes nothing outside --out.

Output, under --out (default tests/fixtures/pci):
  NAME/capture.json  the capture: files, config bytes (hex), symlinks and directories, with a
                     ``meta`` block (kernel, date, what was selected). Plain files only, so it can
                     live in the collection (ansible-test forbids ':' in names and symlinks).
  NAME.tar.gz        the same as a real tree with real symlinks: extract it and pass the
                     directory as the module's ``root``.

  capture_pci_tree.py --name gpu-host-h200                       # GPUs (class 03xx) and their paths
  capture_pci_tree.py --name lab-vm --devices 0000:01:00.0       # named functions and their paths
  capture_pci_tree.py --name dev-vm --all                        # every function in full
  capture_pci_tree.py --restore tests/fixtures/pci/dev-vm DEST   # rebuild the tree from a capture
"""

from __future__ import annotations

import argparse
import binascii
import datetime
import io
import json
import os
import re
import sys
import tarfile
import time

FORMAT = "gpufleet-pci-capture/1"
PCI_DEVICES = "/sys/bus/pci/devices"
BDF_RE = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
BASIC_ATTRS = ("class", "vendor", "device", "subsystem_vendor", "subsystem_device", "revision")
# Exactly what PciWalker.device() reads (tests/unit check that a capture replays identically).
FULL_ATTRS = BASIC_ATTRS + ("numa_node", "local_cpulist", "current_link_speed", "current_link_width",
                            "max_link_speed", "max_link_width", "aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal")
DEVICE_LINKS = ("driver", "iommu_group", "subsystem")
HOST_FILES = ("/proc/meminfo", "/proc/cmdline", "/sys/module/pcie_aspm/parameters/policy")
PCI_IDS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids")
NEVER_READ = ("rom", "reset", "remove", "rescan", "config_space_write")  # and resource*: guarded in Reader.read
CONFIG_ROW = 32


class Reader:
    """Read-only access to host paths under ``root``; records everything it read."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.files: dict[str, str] = {}
        self.binary: dict[str, dict] = {}
        self.links: dict[str, str] = {}
        self.dirs: set[str] = set()

    def real(self, host_path: str) -> str:
        return host_path if self.root == "/" else self.root + host_path

    def _guard(self, host_path: str) -> None:
        base = os.path.basename(host_path)
        if base in NEVER_READ or base.startswith("resource"):
            raise ValueError(f"refusing to read {host_path}: it has side effects or is not needed")

    def read(self, host_path: str, keep: bool = True) -> str | None:
        self._guard(host_path)
        try:
            with open(self.real(host_path), "r", encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            return None
        if keep:
            self.files[host_path] = text
        return text

    def read_config(self, host_path: str) -> None:
        self._guard(host_path)
        try:
            with open(self.real(host_path), "rb") as fh:
                raw = fh.read(4096)
        except OSError:
            return
        trimmed = raw.rstrip(b"\0")
        rows = [binascii.hexlify(trimmed[i:i + CONFIG_ROW]).decode() for i in range(0, len(trimmed), CONFIG_ROW)]
        self.binary[host_path] = {"size": len(raw), "hex": rows}

    def readlink(self, host_path: str, keep: bool = True) -> str | None:
        try:
            target = os.readlink(self.real(host_path))
        except OSError:
            return None
        if keep:
            self.links[host_path] = target
        return target

    def listdir(self, host_path: str) -> list[str]:
        try:
            return sorted(os.listdir(self.real(host_path)))
        except OSError:
            return []

    def realpath(self, host_path: str) -> str:
        real = os.path.realpath(self.real(host_path))
        if self.root != "/" and real.startswith(self.root + "/"):
            return real[len(self.root):]
        return real

    def mkdir(self, host_path: str) -> None:
        self.dirs.add(host_path)


def select(reader: Reader, devices, vendor, class_prefix, all_functions: bool) -> list[str]:
    present = [b for b in reader.listdir(PCI_DEVICES) if BDF_RE.match(b)]
    if all_functions:
        return present
    if devices:
        missing = [b for b in devices if b not in present]
        if missing:
            sys.exit(f"capture: {', '.join(missing)} not under {PCI_DEVICES} (root {reader.root}); present: {', '.join(present)}")
        return list(devices)
    out = []
    for bdf in present:
        cls = (reader.read(f"{PCI_DEVICES}/{bdf}/class", keep=False) or "").strip()[2:]
        ven = (reader.read(f"{PCI_DEVICES}/{bdf}/vendor", keep=False) or "").strip()
        if vendor and ven[2:] != vendor.lower().replace("0x", ""):
            continue
        if class_prefix and not cls.startswith(class_prefix):
            continue
        out.append(bdf)
    return out


def capture_function(reader: Reader, bdf: str, full: bool, irqs: set) -> None:
    link = f"{PCI_DEVICES}/{bdf}"
    reader.readlink(link)
    sysdir = reader.realpath(link)
    reader.mkdir(sysdir)
    for attr in FULL_ATTRS if full else BASIC_ATTRS:
        reader.read(f"{sysdir}/{attr}")
    if not full:
        return
    reader.read_config(f"{sysdir}/config")
    for name in DEVICE_LINKS:
        target = reader.readlink(f"{sysdir}/{name}")
        if target and name == "driver":
            reader.mkdir(reader.realpath(f"{sysdir}/{name}"))
    msi = f"{sysdir}/msi_irqs"
    for irq in reader.listdir(msi):
        if irq.isdigit():
            reader.read(f"{msi}/{irq}")
            irqs.add(int(irq))


def capture_pci_ids(reader: Reader, bdfs) -> None:
    """Keep only the pci.ids lines that name the captured functions (the file is 1.3 MB)."""
    wanted = {}
    for bdf in bdfs:
        base = f"{PCI_DEVICES}/{bdf}/"
        ven = reader.read(base + "vendor", keep=False) or ""
        dev = reader.read(base + "device", keep=False) or ""
        if ven.strip() and dev.strip():
            wanted.setdefault(ven.strip()[2:].lower(), set()).add(dev.strip()[2:].lower())
    for path in PCI_IDS:
        text = reader.read(path, keep=False)
        if not text:
            continue
        keep, vendor = ["# pci.ids trimmed by capture_pci_tree.py to the captured functions"], None
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            if line.startswith("C "):
                break
            if line[0] != "\t":
                vendor = line.split(" ", 1)[0].lower()
                if vendor in wanted:
                    keep.append(line)
            elif vendor in wanted and line[1] != "\t" and line[1:].split(" ", 1)[0].lower() in wanted[vendor]:
                keep.append(line)
        reader.files[path] = "\n".join(keep) + "\n"
        return


def capture(root: str = "/", devices=None, vendor=None, class_prefix="03", all_functions=False, note=None) -> dict:
    reader = Reader(root)
    present = [b for b in reader.listdir(PCI_DEVICES) if BDF_RE.match(b)]
    if not present:
        sys.exit(f"capture: no PCI functions under {reader.real(PCI_DEVICES)}")
    targets = select(reader, devices, vendor, class_prefix, all_functions)
    full = set()
    for bdf in targets:
        chain = [p for p in reader.realpath(f"{PCI_DEVICES}/{bdf}").split("/") if BDF_RE.match(p)]
        full.update(chain or [bdf])
    irqs: set = set()
    reader.mkdir(PCI_DEVICES)
    for bdf in present:
        capture_function(reader, bdf, bdf in full, irqs)
    for irq in sorted(irqs):
        for name in ("smp_affinity_list", "effective_affinity_list"):
            reader.read(f"/proc/irq/{irq}/{name}")
    groups = "/sys/kernel/iommu_groups"
    reader.mkdir(groups)
    for group in reader.listdir(groups):
        reader.mkdir(f"{groups}/{group}")  # the module counts the groups
        members = reader.listdir(f"{groups}/{group}/devices")
        if not set(members) & full and not all_functions:
            continue
        reader.mkdir(f"{groups}/{group}/devices")
        reader.read(f"{groups}/{group}/type")
        for member in members:
            reader.readlink(f"{groups}/{group}/devices/{member}")
    nodes = "/sys/devices/system/node"
    for node in reader.listdir(nodes):
        if node.startswith("node") and node[4:].isdigit():
            reader.read(f"{nodes}/{node}/cpulist")
    hugepages = "/sys/kernel/mm/hugepages"
    for size in reader.listdir(hugepages):
        for name in ("nr_hugepages", "free_hugepages"):
            reader.read(f"{hugepages}/{size}/{name}")
    for path in HOST_FILES:
        reader.read(path)
    capture_pci_ids(reader, full)
    meta = {"format": FORMAT, "captured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "kernel": os.uname().release, "machine": os.uname().machine, "root": reader.root, "euid": os.geteuid(),
            "selection": {"devices": list(devices or []), "vendor": vendor, "class_prefix": class_prefix, "all": all_functions},
            "targets": targets, "full_records": sorted(full), "functions": present, "note": note}
    return {"meta": meta, "files": reader.files, "binary": reader.binary, "links": reader.links, "dirs": sorted(reader.dirs)}


# ---- outputs -------------------------------------------------------------------------------------
def config_bytes(blob: dict) -> bytes:
    raw = binascii.unhexlify("".join(blob["hex"]))
    return raw + bytes(blob["size"] - len(raw))


def restore(data: dict, dest: str) -> str:
    """Rebuild the captured tree under ``dest`` (created); returns dest."""
    def real(host_path):
        return os.path.join(dest, host_path.lstrip("/"))
    for host_path in data.get("dirs", []):
        os.makedirs(real(host_path), exist_ok=True)
    for host_path, text in data.get("files", {}).items():
        os.makedirs(os.path.dirname(real(host_path)), exist_ok=True)
        with open(real(host_path), "w", encoding="utf-8") as fh:
            fh.write(text)
    for host_path, blob in data.get("binary", {}).items():
        os.makedirs(os.path.dirname(real(host_path)), exist_ok=True)
        with open(real(host_path), "wb") as fh:
            fh.write(config_bytes(blob))
    for host_path, target in data.get("links", {}).items():
        os.makedirs(os.path.dirname(real(host_path)), exist_ok=True)
        if os.path.lexists(real(host_path)):
            os.unlink(real(host_path))
        os.symlink(target, real(host_path))
    return dest


def write_tar(data: dict, path: str) -> None:
    now = int(time.time())

    def info(name, kind, size=0, target=None):
        ti = tarfile.TarInfo(name.lstrip("/"))
        ti.type, ti.size, ti.mode = kind, size, 0o755 if kind == tarfile.DIRTYPE else 0o644
        ti.mtime = now
        if target is not None:
            ti.linkname = target
        return ti

    with tarfile.open(path, "w:gz") as tar:
        dirs = set()
        for host_path in list(data["dirs"]) + [os.path.dirname(p) for p in list(data["files"]) + list(data["binary"]) + list(data["links"])]:
            while host_path not in ("/", "") and host_path not in dirs:
                dirs.add(host_path)
                host_path = os.path.dirname(host_path)
        for d in sorted(dirs):
            tar.addfile(info(d, tarfile.DIRTYPE))
        for host_path, text in sorted(data["files"].items()):
            raw = text.encode("utf-8")
            tar.addfile(info(host_path, tarfile.REGTYPE, len(raw)), io.BytesIO(raw))
        for host_path, blob in sorted(data["binary"].items()):
            raw = config_bytes(blob)
            tar.addfile(info(host_path, tarfile.REGTYPE, len(raw)), io.BytesIO(raw))
        for host_path, target in sorted(data["links"].items()):
            tar.addfile(info(host_path, tarfile.SYMTYPE, target=target))


def write_outputs(data: dict, out: str, name: str) -> tuple[str, str]:
    out = os.path.abspath(out)
    for forbidden in ("/sys", "/proc", "/dev"):
        if out == forbidden or out.startswith(forbidden + "/"):
            sys.exit(f"capture: refusing to write under {forbidden}")
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    capture_json = os.path.join(folder, "capture.json")
    with open(capture_json, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
    tar_path = os.path.join(out, name + ".tar.gz")
    write_tar(data, tar_path)
    return capture_json, tar_path


def load(path: str) -> dict:
    if os.path.isdir(path):
        path = os.path.join(path, "capture.json")
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if data.get("meta", {}).get("format") != FORMAT:
        sys.exit(f"capture: {path} is not a {FORMAT} capture")
    return data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", help="fixture name: OUT/NAME/capture.json and OUT/NAME.tar.gz")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "pci"))
    parser.add_argument("--root", default="/", help="host root to read (default /)")
    parser.add_argument("--devices", nargs="*", default=[], help="PCI addresses to capture in full (with their paths)")
    parser.add_argument("--vendor", help="only functions of this vendor ID (with --class-prefix)")
    parser.add_argument("--class-prefix", default="03", help="class code prefix of the targets (default 03, display)")
    parser.add_argument("--all", action="store_true", help="capture every function in full")
    parser.add_argument("--note", help="free text stored in meta.note")
    parser.add_argument("--restore", nargs=2, metavar=("CAPTURE", "DEST"), help="rebuild a capture's tree under DEST")
    args = parser.parse_args(argv)
    if args.restore:
        print(restore(load(args.restore[0]), args.restore[1]))
        return 0
    if not args.name or not re.match(r"^[A-Za-z0-9._-]+$", args.name):
        parser.error("--name is required: letters, digits, '.', '_' and '-'")
    data = capture(args.root, [d.lower() for d in args.devices], args.vendor, args.class_prefix, args.all, args.note)
    if not data["meta"]["targets"]:
        print(f"capture: no function matches class {args.class_prefix}xx; capturing identities only "
              "(use --devices or --all for full records)", file=sys.stderr)
    if os.geteuid() != 0 and args.root == "/":
        print("capture: not root: config space is cut at 64 bytes", file=sys.stderr)
    capture_json, tar_path = write_outputs(data, args.out, args.name)
    size = os.path.getsize(capture_json)
    print(f"{capture_json} ({size // 1024} KiB, {len(data['meta']['full_records'])} functions in full, "
          f"{len(data['meta']['functions'])} in all)\n{tar_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

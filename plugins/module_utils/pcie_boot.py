# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's one boot-time re-apply mechanism for PCIe config-space settings.

pcie_payload (MaxPayload/MaxReadReq, the ``devices`` list) and pcie_acs (ACS Control bits
cleared, the ``acs`` list) share one JSON file, one applier script and one systemd oneshot unit.
Each module owns its list and keeps the other's as it found it; the unit stays enabled while
either list holds an entry. The unit runs early in boot, before udev coldplug loads the GPU
drivers (``Before=systemd-udev-trigger.service``) and before the services that use the GPUs, so
no DMA is in flight when a register changes.

Also here: the setpci argv every module uses, always ``-A linux-sysfs`` against the given root,
so a missing tree is an error and never a silent fallback to the real bus.
"""

from __future__ import annotations

import json

PERSIST_CONFIG = "/etc/gpufleet/pcie_payload.json"
PERSIST_FORMAT = "gpufleet-pcie-payload/1"
APPLY_SCRIPT = "/usr/local/libexec/gpufleet-pcie-payload-apply"
UNIT_NAME = "gpufleet-pcie-payload.service"
UNIT_PATH = "/etc/systemd/system/" + UNIT_NAME
UNIT_WANTS = "/etc/systemd/system/sysinit.target.wants/" + UNIT_NAME


def sysfs_bus(root: str) -> str:
    """The PCI bus directory setpci reads under ``root`` (``/sys/bus/pci`` on a real host)."""
    return (root.rstrip("/") or "") + "/sys/bus/pci"


def setpci_base(setpci: str, root: str) -> list[str]:
    """``setpci -A linux-sysfs -O sysfs.path=ROOT/sys/bus/pci``: only the sysfs access method, only this tree.

    Without ``-A``, setpci tries its other access methods (``/proc/bus/pci``, direct port I/O) when the
    sysfs tree is missing, which on a test tree means writing the real bus.
    """
    return [setpci, "-A", "linux-sysfs", "-O", f"sysfs.path={sysfs_bus(root)}"]


def render_json(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _load(text: str | None) -> dict:
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    if not isinstance(data, dict) or data.get("format") != PERSIST_FORMAT:
        return {}
    return data


def parse_persist(text: str | None, key: str = "devices") -> dict[str, dict]:
    """Entries of one list of the persisted configuration by BDF ({} when absent or foreign)."""
    return {e["bdf"]: e for e in _load(text).get(key, []) if isinstance(e, dict) and "bdf" in e}


def render_persist(entries: list[dict], acs: list[dict] | None = None) -> str:
    """The shared file: ``devices`` (payload entries) and, when any, ``acs`` (ACS entries)."""
    data = {"format": PERSIST_FORMAT, "generated_by": "gpufleet.inference.pcie_payload", "devices": entries}
    if acs:
        data["acs"] = acs
    return render_json(data)


def render_unit(script: str = APPLY_SCRIPT, config: str = PERSIST_CONFIG) -> str:
    return f"""# Installed by Ansible (gpufleet.inference.pcie_payload, pcie_acs); removed by their state=default.
# Re-applies the PCIe MaxPayload/MaxReadReq values and the ACS Control bits in {config} once per
# boot, before udev coldplug loads the GPU drivers and before the services that use the GPUs start:
# no DMA is in flight while a register changes. Its log: journalctl -u {UNIT_NAME}
[Unit]
Description=Re-apply PCIe MaxPayload/MaxReadReq and ACS settings tuned by gpufleet.inference
DefaultDependencies=no
After=systemd-remount-fs.service
Before=systemd-udev-trigger.service sysinit.target shutdown.target nvidia-persistenced.service
Conflicts=shutdown.target
ConditionPathExists={config}

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={script} {config}

[Install]
WantedBy=sysinit.target
"""


def render_script(python: str) -> str:
    return "#!" + python + "\n" + APPLY_SCRIPT_BODY


def persistence_plan(read, exists, python: str, systemctl_argv, devices: list[dict], acs: list[dict],
                     persist: bool, real_root: bool) -> list[dict]:
    """File and unit steps that make the boot unit match both lists (or remove it when both are empty).

    ``read(path) -> str | None`` and ``exists(path)`` read the host; ``systemctl_argv(*args)`` builds
    a systemctl command. Returns actions ``write_file``/``remove_file`` (with ``content``/``mode``),
    ``daemon_reload``, ``enable_unit``, ``disable_unit``.
    """
    want = bool(persist and (devices or acs))
    files = [(APPLY_SCRIPT, render_script(python), "0755", "apply script"),
             (PERSIST_CONFIG, render_persist(devices, acs), "0644", "persisted values"),
             (UNIT_PATH, render_unit(), "0644", "systemd unit")]
    actions = []
    enabled = exists(UNIT_WANTS)
    if not want and enabled:
        actions.append({"action": "disable_unit", "unit": UNIT_NAME, "argv": systemctl_argv("disable", UNIT_NAME)})
    unit_changed = False
    for path, text, mode, what in files:
        current = read(path)
        if want and current != text:
            actions.append({"action": "write_file", "path": path, "what": what, "content": text, "mode": mode})
            unit_changed = unit_changed or path == UNIT_PATH
        elif not want and current is not None:
            actions.append({"action": "remove_file", "path": path, "what": what})
            unit_changed = unit_changed or path == UNIT_PATH
    if unit_changed and real_root:
        actions.append({"action": "daemon_reload", "argv": systemctl_argv("daemon-reload")})
    if want and not enabled:
        actions.append({"action": "enable_unit", "unit": UNIT_NAME, "argv": systemctl_argv("enable", UNIT_NAME)})
    return actions


# The boot-time applier: Python standard library only (3.6+), no Ansible. It applies the payload
# entries of the JSON file top-down with setpci, reads each write back, and rolls a hierarchy back
# to the values it found when one of its writes fails, so a partial apply never leaves mixed
# MaxPayload; then it clears the recorded ACS Control bits, each read back.
APPLY_SCRIPT_BODY = r'''# -*- coding: utf-8 -*-
# Installed by Ansible (gpufleet.inference.pcie_payload, pcie_acs). Run at boot by gpufleet-pcie-payload.service:
#   gpufleet-pcie-payload-apply [--root DIR] CONFIG.json
# Re-applies PCIe MaxPayload/MaxReadReq with setpci, reads every write back, and undoes the writes
# of a PCIe hierarchy when one of them does not take; clears the recorded ACS Control bits (read
# back). setpci runs with -A linux-sysfs only. Exit status 1 when anything failed.
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

FORMAT = "gpufleet-pcie-payload/1"
SIZES = (128, 256, 512, 1024, 2048, 4096)
FIELDS = (("mps", 5, 0x00E0, "MaxPayload"), ("mrrs", 12, 0x7000, "MaxReadReq"))


def log(msg):
    print(msg, flush=True)


def pcie_offset(cfg):
    if len(cfg) < 0x40 or not struct.unpack_from("<H", cfg, 0x06)[0] & 0x10:
        return None
    ptr, seen = cfg[0x34] & 0xFC, set()
    while ptr >= 0x40 and ptr not in seen and ptr + 2 <= len(cfg):
        seen.add(ptr)
        if cfg[ptr] == 0xFF:
            return None
        if cfg[ptr] == 0x10:
            return ptr
        ptr = cfg[ptr + 1] & 0xFC
    return None


def acs_offset(cfg):
    if pcie_offset(cfg) is None or len(cfg) < 0x104:
        return None
    ptr, seen = 0x100, set()
    while ptr >= 0x100 and ptr not in seen and ptr + 8 <= len(cfg):
        seen.add(ptr)
        header = struct.unpack_from("<I", cfg, ptr)[0]
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == 0x000D:
            return ptr
        ptr = (header >> 20) & 0xFFC
    return None


class Device(object):
    def __init__(self, sysfs, bdf):
        self.bdf = bdf
        self.base = os.path.join(sysfs, "devices", bdf)

    def attr(self, name):
        with open(os.path.join(self.base, name)) as fh:
            return fh.read().strip()

    def config(self, size=256):
        with open(os.path.join(self.base, "config"), "rb") as fh:
            return fh.read(size)

    def regs(self):
        cfg = self.config()
        off = pcie_offset(cfg)
        if off is None or off + 0x0A > len(cfg):
            raise ValueError("no PCI Express capability in the first %d bytes of config space" % len(cfg))
        return struct.unpack_from("<I", cfg, off + 4)[0], struct.unpack_from("<H", cfg, off + 8)[0]

    def acs_ctl(self):
        cfg = self.config(4096)
        off = acs_offset(cfg)
        if off is None:
            raise ValueError("no ACS capability in its config space (%d bytes readable)" % len(cfg))
        return struct.unpack_from("<H", cfg, off + 6)[0]


def value_of(devctl, shift, mask):
    return 128 << ((devctl & mask) >> shift)


def setpci_run(setpci, sysfs, bdf, spec):
    argv = [setpci, "-A", "linux-sysfs", "-O", "sysfs.path=" + sysfs, "-s", bdf, spec]
    env = dict(os.environ, LC_ALL="C", LANG="C")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, env=env)
    out, err = proc.communicate()
    return argv, proc.returncode, (err or out).strip()


def write(setpci, sysfs, dev, shift, mask, size):
    argv, rc, err = setpci_run(setpci, sysfs, dev.bdf, "CAP_EXP+8.w=%04x:%04x" % (SIZES.index(size) << shift, mask))
    _devcap, devctl = dev.regs()
    got = value_of(devctl, shift, mask)
    problem = None
    if rc != 0:
        problem = "setpci exited %d: %s" % (rc, err)
    elif got != size:
        problem = "the device still reads %d after setpci (%s)" % (got, err or "read-only field?")
    return " ".join(argv), problem


def check_ids(dev, entry):
    ids = (dev.attr("vendor"), dev.attr("device"))
    if ids != (entry.get("vendor_id"), entry.get("device_id")):
        return "is %s:%s, not the recorded %s:%s (card replaced?)" % (ids[0], ids[1], entry.get("vendor_id"), entry.get("device_id"))
    return None


def apply_acs(setpci, sysfs, entries):
    failed = 0
    for entry in entries:
        bdf, clear = entry.get("bdf"), entry.get("clear")
        dev = Device(sysfs, bdf)
        try:
            problem = check_ids(dev, entry)
            if problem is None and not (isinstance(clear, int) and 0 < clear <= 0x7F):
                problem = "clear mask %r is not an ACS Control bit mask" % (clear,)
            if problem is None:
                before = dev.acs_ctl()
                if not before & clear:
                    log("%s: ACS Control 0x%04x, bits 0x%04x already clear" % (bdf, before, clear))
                    continue
                argv, rc, err = setpci_run(setpci, sysfs, bdf, "ECAP_ACS+6.w=0000:%04x" % clear)
                after = dev.acs_ctl()
                if rc != 0:
                    problem = "setpci exited %d: %s [%s]" % (rc, err, " ".join(argv))
                elif after & clear:
                    problem = "ACS Control still reads 0x%04x after setpci (read-only bits?) [%s]" % (after, " ".join(argv))
                else:
                    log("%s: ACS Control 0x%04x -> 0x%04x [%s]" % (bdf, before, after, " ".join(argv)))
        except (OSError, ValueError) as err:
            problem = "cannot be read: %s" % err
        if problem:
            failed += 1
            log("error: %s ACS %s" % (bdf, problem))
    return failed


def main(argv=None):
    parser = argparse.ArgumentParser(description="Re-apply PCIe settings recorded by gpufleet.inference.")
    parser.add_argument("--root", default="/", help="directory standing for / (tests); default /")
    parser.add_argument("--setpci", default=None, help="setpci binary; default: from PATH")
    parser.add_argument("config")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)
    sysfs = (root.rstrip("/") + "/sys/bus/pci") if root != "/" else "/sys/bus/pci"
    setpci = args.setpci or shutil.which("setpci") or "/usr/bin/setpci"
    try:
        with open(args.config) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as err:
        log("error: cannot read %s: %s" % (args.config, err))
        return 2
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        log("error: %s is not a %s file" % (args.config, FORMAT))
        return 2
    if not os.path.isdir(os.path.join(sysfs, "devices")):
        log("error: %s/devices does not exist: no PCI sysfs tree to apply to" % sysfs)
        return 2
    failed = 0
    done = {}  # hierarchy -> [(dev, shift, mask, old)]
    broken = set()
    for entry in data.get("devices", []):
        bdf, hier = entry.get("bdf"), entry.get("hierarchy")
        if hier in broken:
            log("%s: skipped, an earlier write below %s failed" % (bdf, hier))
            continue
        dev = Device(sysfs, bdf)
        problem = None
        try:
            problem = check_ids(dev, entry)
            if problem is None:
                devcap, devctl = dev.regs()
        except (OSError, ValueError) as err:
            problem = "cannot be read: %s" % err
        for name, shift, mask, label in FIELDS:
            if problem:
                break
            want = entry.get(name)
            if want is None:
                continue
            if want not in SIZES:
                problem = "%s %r is not a PCIe payload size" % (label, want)
                break
            if name == "mps" and want > 128 << (devcap & 7):
                problem = "%s %d is above what it supports (%d)" % (label, want, 128 << (devcap & 7))
                break
            old = value_of(devctl, shift, mask)
            if old == want:
                log("%s: %s %d already set" % (bdf, label, want))
                continue
            cmd, problem = write(setpci, sysfs, dev, shift, mask, want)
            if problem:
                problem = "%s %d: %s [%s]" % (label, want, problem, cmd)
                break
            log("%s: %s %d -> %d [%s]" % (bdf, label, old, want, cmd))
            done.setdefault(hier, []).append((dev, shift, mask, old, label))
            devcap, devctl = dev.regs()
        if problem:
            failed += 1
            broken.add(hier)
            log("error: %s %s" % (bdf, problem))
            for rdev, shift, mask, old, label in reversed(done.pop(hier, [])):
                cmd, rproblem = write(setpci, sysfs, rdev, shift, mask, old)
                log("%s: %s rolled back to %d%s" % (rdev.bdf, label, old, (": FAILED, " + rproblem) if rproblem else ""))
    acs = data.get("acs", [])
    acs_failed = apply_acs(setpci, sysfs, acs)
    if acs:
        log("gpufleet-pcie-payload-apply: ACS on %d bridge(s), %d failed" % (len(acs), acs_failed))
    failed += acs_failed
    log("gpufleet-pcie-payload-apply: %d device(s), %d failed" % (len(data.get("devices", [])), failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
'''

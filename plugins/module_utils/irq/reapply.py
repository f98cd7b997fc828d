# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Re-apply gpufleet.inference IRQ pinning from /etc/gpufleet/irq_affinity.json, outside a module run.

The irq_affinity role installs ``/usr/local/libexec/gpufleet-irq-affinity-apply``, which carries this
file and its import closure (_host/bundle.py: irq/affinity.py, _pci/topology.py, _pci/config.py,
_host/files.py, _host/device_apply.py), so the boot-time and rebind-time pinning is the module's own code. Three things run
it: gpufleet-irq-affinity.service at boot, gpufleet-irq-affinity@<bdf>.service, which a udev rule
starts when a driver binds one of the pinned PCI functions again, and the optional timer. The kernel
resets affinity whenever a driver re-requests its vectors, and the vectors come back with new IRQ
numbers. So the script waits until the function's set of vectors has settled, then recomputes the
spread from the current numbers. Exit status: 0 when every vector is pinned or kernel-managed, 1 when
a write failed (the vectors it changed are put back), 2 for unusable configuration.
"""

from __future__ import annotations

import argparse
import json
import sys

from ansible_collections.gpufleet.inference.plugins.module_utils.irq import affinity as ia
from ansible_collections.gpufleet.inference.plugins.module_utils._host import bundle as reapply_bundle
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import PciWalker, normalize_bdf

ENTRY = "irq.reapply"  # this file, under plugins/module_utils
PROG = "gpufleet-irq-affinity-apply"
HEADER = (
    "Installed by Ansible (the gpufleet.inference.irq_affinity role). Run by gpufleet-irq-affinity.service at",
    "boot, by gpufleet-irq-affinity@<bdf>.service when a driver binds a pinned function, and by the timer:",
    "  " + PROG + " [--device BDF]... [--wait S] [--settle S] [--root DIR] [--config FILE]",
    "Pins the MSI/MSI-X vectors of the functions in /etc/gpufleet/irq_affinity.json as the module does,",
    "reads every write back and puts back what it changed when one fails.",
)
REINSTALL = "Run the gpufleet.inference.irq_affinity role again to reinstall them."
PYTHON_HINT = "Set irq_affinity_python to a Python 3.7 or later and run the gpufleet.inference.irq_affinity role again."


# The re-apply script as the role installs it: ``#!python``, this module_utils and its closure (_host/bundle.py).
render_script = reapply_bundle.entry_renderer(ENTRY, HEADER, REINSTALL, PYTHON_HINT)


def say(msg: str, err: bool = False) -> None:
    """A line of output (stderr for problems and warnings); the units' journal keeps both."""
    stream = sys.stderr if err else sys.stdout
    stream.write(msg + "\n")
    stream.flush()


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=PROG, description="Re-apply the IRQ pinning of gpufleet.inference irq_affinity.")
    parser.add_argument("--device", action="append", default=[],
                        help="PCI function to re-apply (repeatable); default: every function in the configuration")
    parser.add_argument("--wait", type=float, default=30.0,
                        help="seconds to wait for each function's vectors to appear and settle (default 30)")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds the set of vectors must stay unchanged (default 1)")
    parser.add_argument("--root", default="/", help="directory that stands for / (tests)")
    parser.add_argument("--lib", help="ignored: earlier versions read their module_utils from there; this script carries them")
    parser.add_argument("--config", help="configuration file (default /etc/gpufleet/irq_affinity.json under --root)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    fs = HostFS(args.root)
    walker = PciWalker(fs)
    config_path = args.config or ia.CONFIG_FILE
    config = ia.load_json(fs, config_path)
    devices = config.get("devices") or {}
    if not isinstance(devices, dict):
        say(f"{PROG}: {config_path} has no devices mapping; nothing to do.", err=True)
        return 2
    wanted = []
    for raw in args.device or sorted(devices):
        bdf = normalize_bdf(raw)
        if bdf is None:
            say(f"{PROG}: '{raw}' is not a PCI address.", err=True)
            return 2
        if bdf not in devices:
            say(f"{bdf}: not in {config_path}; nothing to do.")
            continue
        wanted.append(bdf)
    if not wanted:
        return 0
    present = set(walker.functions())
    for bdf in wanted:
        if bdf in present and args.wait > 0:
            ia.wait_for_irqs(walker, bdf, args.wait, args.settle)
    resolved, warnings = ia.resolve_cpus(walker, devices, strict=set())
    only = [b for b in wanted if b in resolved]
    cache = ia.load_json(fs, ia.MANAGED_CACHE)
    try:
        entries, plan_warnings = ia.plan(walker, resolved, only, "present", cache, allow_no_irqs=True)
        ia.apply(fs, entries)
    except ia.IrqError as err:
        say(f"{PROG}: {err}", err=True)
        return 1
    warnings += plan_warnings
    new_cache = ia.managed_cache_after(cache, walker, entries)
    if new_cache != cache:
        try:
            fs.write_atomic(ia.MANAGED_CACHE, json.dumps(new_cache, sort_keys=True) + "\n")
        except HostFSError as err:
            warnings.append(f"cannot remember managed vectors in {ia.MANAGED_CACHE}: {err}")
    for e in entries:
        if e["status"] == "changed":
            say(f"{e['bdf']} IRQ {e['irq']}: {e['before']} -> {e['after']}")
    for msg in warnings:
        say(f"warning: {msg}", err=True)
    counts = {s: sum(1 for e in entries if e["status"] == s) for s in ("changed", "ok", "managed")}
    say(json.dumps(dict({"devices": only}, **counts), sort_keys=True))
    return 0

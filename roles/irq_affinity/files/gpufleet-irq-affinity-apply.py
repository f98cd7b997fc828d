# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Re-apply gpufleet.inference IRQ pinning from /etc/gpufleet/irq_affinity.json.

The irq_affinity role installs this as /usr/local/libexec/gpufleet-irq-affinity-apply, with a shebang for the
host's Python 3 (irq_affinity_python) put in front. Two things run it:
gpufleet-irq-affinity.service at boot, and gpufleet-irq-affinity@<bdf>.service, which a udev rule starts
when a driver binds one of the pinned PCI functions again. The kernel resets affinity whenever a driver
re-requests its vectors, and the vectors come back with new IRQ numbers. So the script waits until the
function's set of vectors has settled, then recomputes the spread from the current numbers.

It imports the irq_affinity module's own module_utils (irq_affinity, pci_topology, pci_config, hostfs;
stdlib only). The role copies them from the collection to /usr/local/lib/gpufleet/python, so this
script and the module compute the same pinning. Exit status: 0 when every vector is pinned or
kernel-managed, 1 when a write failed (the vectors it changed are put back), 2 for unusable
configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

LIB = "/usr/local/lib/gpufleet/python"


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Re-apply the IRQ pinning of gpufleet.inference irq_affinity.")
    parser.add_argument("--device", action="append", default=[],
                        help="PCI function to re-apply (repeatable); default: every function in the configuration")
    parser.add_argument("--wait", type=float, default=30.0,
                        help="seconds to wait for each function's vectors to appear and settle (default 30)")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds the set of vectors must stay unchanged (default 1)")
    parser.add_argument("--root", default="/", help="directory that stands for / (tests)")
    parser.add_argument("--lib", default=os.environ.get("GPUFLEET_PYTHONPATH", LIB),
                        help="where the collection's module_utils are installed (default %(default)s)")
    parser.add_argument("--config", help="configuration file (default /etc/gpufleet/irq_affinity.json under --root)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, args.lib)
    try:
        from ansible_collections.gpufleet.inference.plugins.module_utils import irq_affinity as ia
        from ansible_collections.gpufleet.inference.plugins.module_utils.hostfs import HostFS, HostFSError
        from ansible_collections.gpufleet.inference.plugins.module_utils.pci_topology import PciWalker, normalize_bdf
    except ImportError as err:
        print(f"gpufleet-irq-affinity-apply: cannot import the collection's module_utils from {args.lib}: {err}. "
              "Run the gpufleet.inference.irq_affinity role again to reinstall them.", file=sys.stderr)
        return 2

    fs = HostFS(args.root)
    walker = PciWalker(fs)
    config_path = args.config or ia.CONFIG_FILE
    config = ia.load_json(fs, config_path)
    devices = config.get("devices") or {}
    if not isinstance(devices, dict):
        print(f"gpufleet-irq-affinity-apply: {config_path} has no devices mapping; nothing to do.", file=sys.stderr)
        return 2
    wanted = []
    for raw in args.device or sorted(devices):
        bdf = normalize_bdf(raw)
        if bdf is None:
            print(f"gpufleet-irq-affinity-apply: '{raw}' is not a PCI address.", file=sys.stderr)
            return 2
        if bdf not in devices:
            print(f"{bdf}: not in {config_path}; nothing to do.")
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
        print(f"gpufleet-irq-affinity-apply: {err}", file=sys.stderr)
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
            print(f"{e['bdf']} IRQ {e['irq']}: {e['before']} -> {e['after']}")
    for msg in warnings:
        print(f"warning: {msg}", file=sys.stderr)
    counts = {s: sum(1 for e in entries if e["status"] == s) for s in ("changed", "ok", "managed")}
    print(json.dumps({"devices": only, **counts}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

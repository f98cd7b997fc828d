#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark (not a timed test): site.yml over 1, 5, 10 and 20 podman container hosts.

Each host is a Debian 12 systemd container (the Molecule image, tests/containers/build-image)
reached through the containers.podman connection. Containers have no kernel of their own, so the
host-level stages are off (gpufleet_host_tuning: false) and no vLLM is deployed: what runs is the
config-only part of site.yml on every host (the audit with pcie_facts, of the NICs since this
machine has no GPU, and its fleet report; the nccl_env files; the final verify), which is the controller-side cost that grows with the fleet.
For each size it reports the wall time of the first run (converge) and of the second run
(idempotent: every host must report changed=0), and the time per host; per-host overhead is the
slope between sizes; and the controller's CPU seconds of each run (user + system of the
``ansible-playbook`` process tree: the workers and the podman exec clients it waited for, not the
hosts' processes, which podman's conmon runs outside the tree), per host. Prints a Markdown table for
docs/performance.md; exit status 0 unless a run fails (figures are recorded, not asserted).

    . scripts/lib.sh; gpufleet_env; python tests/benchmarks/bench_site_scale.py [--sizes 1 5 10 20] [--forks 20]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tests.lab.labutil import play_recap as recap  # noqa: E402  (the same PLAY RECAP parser as the lab tests)
IMAGE = "localhost/gpufleet-debian-systemd:bookworm"
PREFIX = "gpufleet-scale-"


def sh(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kw)


def start(n: int) -> list[str]:
    names = [f"{PREFIX}{i:02d}" for i in range(1, n + 1)]
    for name in names:
        if sh(["podman", "container", "exists", name]).returncode == 0:
            continue
        r = sh(["podman", "run", "-d", "--name", name, "--systemd=always", IMAGE, "/sbin/init"])
        if r.returncode != 0:
            raise SystemExit(f"podman run {name} failed: {r.stderr.strip()}")
    return names


def stop_all() -> None:
    r = sh(["podman", "ps", "-a", "--format", "{{.Names}}"])
    names = [n for n in r.stdout.split() if n.startswith(PREFIX)]
    if names:
        sh(["podman", "rm", "-f", "-t", "0", *names])


def inventory(path: str, names: list[str]) -> None:
    doc = {"all": {"children": {"scale": {"hosts": {n: {} for n in names}, "vars": {
        "ansible_connection": "containers.podman.podman", "ansible_python_interpreter": "/usr/bin/python3",
        "gpufleet_host_tuning": False, "gpufleet_site_benchmark": "never",
        # no GPU on this machine: audit its NIC (class 02), as the audit Molecule scenario does
        "audit_class_prefix": "02"}}}}}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)


def children_cpu() -> float:
    """User + system CPU seconds of every finished child process tree of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def site(inv: str, forks: int, report_dir: str) -> tuple[float, float, dict]:
    """One site.yml run: wall seconds, controller CPU seconds (the ansible-playbook tree) and the recap."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    cpu0 = children_cpu()
    start_t = time.monotonic()
    r = sh(["ansible-playbook", "-i", inv, "site.yml", "--forks", str(forks), "-e", f"gpufleet_report_dir={report_dir}"],
           cwd=REPO, env=env)
    took = time.monotonic() - start_t
    cpu = children_cpu() - cpu0
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-6000:] + r.stderr[-2000:])
        raise SystemExit(f"site.yml failed (rc {r.returncode})")
    return took, cpu, recap(r.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 5, 10, 20])
    parser.add_argument("--forks", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
    if sh(["podman", "image", "exists", IMAGE]).returncode != 0:
        sh([os.path.join(REPO, "tests", "containers", "build-image"), "bookworm"])
    rows = []
    stop_all()
    try:
        for n in sorted(args.sizes):
            names = start(n)
            with tempfile.TemporaryDirectory() as tmp:
                inv = os.path.join(tmp, "hosts.json")
                inventory(inv, names)
                first, cpu1, rec1 = site(inv, args.forks, os.path.join(tmp, "reports"))
                second, cpu2, rec2 = site(inv, args.forks, os.path.join(tmp, "reports"))
            changed2 = {h: v.get("changed", 0) for h, v in rec2.items() if h in names}
            rows.append({"hosts": n, "forks": args.forks, "converge_s": round(first, 1), "rerun_s": round(second, 1),
                         "per_host_s": round(first / n, 2), "rerun_changed_max": max(changed2.values()),
                         "tasks_ok_per_host": max(v.get("ok", 0) for h, v in rec1.items() if h in names),
                         "converge_cpu_s": round(cpu1, 1), "rerun_cpu_s": round(cpu2, 1),
                         "rerun_cpu_per_host_s": round(cpu2 / n, 2)})
            print(f"{n:3d} hosts: converge {first:6.1f} s ({cpu1:.1f} CPU-s), re-run {second:6.1f} s ({cpu2:.1f} CPU-s, "
                  f"changed max {max(changed2.values())})", flush=True)
    finally:
        stop_all()
    print("\n| hosts | forks | converge (s) | per host (s) | idempotent re-run (s) | re-run changed (max per host) | "
          "controller CPU-s: converge | re-run | re-run per host |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['hosts']} | {row['forks']} | {row['converge_s']} | {row['per_host_s']} | {row['rerun_s']} | "
              f"{row['rerun_changed_max']} | {row['converge_cpu_s']} | {row['rerun_cpu_s']} | {row['rerun_cpu_per_host_s']} |")
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        slope = (b["converge_s"] - a["converge_s"]) / (b["hosts"] - a["hosts"])
        print(f"\nmarginal cost per added host: {slope:.2f} s (from {a['hosts']} to {b['hosts']} hosts, forks {args.forks})")
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

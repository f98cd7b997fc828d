# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The boot-time applier of the CPU settings that gpufleet.inference.cpu_tuning persists in
``/etc/gpufleet/cpu_tuning.json``: what ``gpufleet-cpu-tuning.service`` runs once per boot.

It runs as ``/usr/local/libexec/gpufleet-cpu-tuning-apply``, which the module writes with this file and its
import closure (_host/bundle.py), so the boot plans, writes and reads back with the module's own code
(cpu/knobs.py). A knob the host lacks is logged as skipped with the reason; a value the host refuses is
logged and the others go on. Exit status 0, 1 when a write failed or a value is not offered, 2 when the file
cannot be used.
"""

from __future__ import annotations

import argparse
import os

from ansible_collections.gpufleet.inference.plugins.module_utils._host import bundle as reapply_bundle
from ansible_collections.gpufleet.inference.plugins.module_utils._host.bundle import log
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils.cpu import knobs
from ansible_collections.gpufleet.inference.plugins.module_utils.cpu.boot import PERSIST_FORMAT, UNIT_NAME, load_persist

ENTRY = "cpu.reapply"  # this file, under plugins/module_utils
PROG = "gpufleet-cpu-tuning-apply"
HEADER = (
    "Installed by Ansible (gpufleet.inference.cpu_tuning). Run at boot by " + UNIT_NAME + ":",
    "  " + PROG + " [--root DIR] CONFIG.json",
    "Sets the CPU governor, energy-performance preference, C-state limit and transparent-hugepage policy",
    "recorded in CONFIG.json, reads every write back, and logs a knob this host lacks as skipped.",
)
REINSTALL = "Run gpufleet.inference.cpu_tuning again to rewrite this script."
PYTHON_HINT = ("The module writes the interpreter it runs under: run it again with ansible_python_interpreter set to a "
               "Python 3.7 or later.")


# The applier as the module installs it: ``#!python``, this module_utils and its closure (_host/bundle.py).
render_script = reapply_bundle.entry_renderer(ENTRY, HEADER, REINSTALL, PYTHON_HINT)


def apply_settings(fs: HostFS, settings: dict) -> int:
    """Plan and apply ``settings`` on ``fs``, logging each change, skip and failure; the number of failures."""
    try:
        steps, skips = knobs.plan(knobs.read_tree(fs), knobs.check_settings(settings), {})
    except (knobs.CpuTuningError, HostFSError) as err:
        log(f"error: {err}")
        return 1
    for knob, why in skips.items():
        log(f"{knob}: skipped, {why}")
    outcome = knobs.apply(fs, steps, keep_going=True)
    for attempt in outcome["journal"]:
        if attempt["ok"]:
            log(f"{attempt['step']['path']}: {attempt['step']['before']} -> {attempt['value']}")
    failed = outcome["failures"] + outcome["ignored"]
    if failed:
        log(f"error: {knobs.failure_text(outcome)}")
    log(f"{PROG}: {len(steps)} change(s), {len(skips)} knob(s) skipped, {len(failed)} failed")
    return len(failed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="Re-apply the CPU settings of gpufleet.inference.cpu_tuning.")
    parser.add_argument("--root", default="/", help="directory standing for / (tests); default /")
    parser.add_argument("config")
    args = parser.parse_args(argv)
    try:
        text = HostFS("/").read_exact(os.path.abspath(args.config))
    except HostFSError as err:
        log(f"error: {err}")
        return 2
    settings = load_persist(text) if text is not None else None
    if settings is None:
        log(f"error: {args.config} is missing or not a {PERSIST_FORMAT} file")
        return 2
    return 1 if apply_settings(HostFS(os.path.abspath(args.root)), settings) else 0

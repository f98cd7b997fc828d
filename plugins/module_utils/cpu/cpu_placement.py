# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.cpu_placement executes (``execute``): the vLLM unit's ``CPUAffinity``, ``NUMAPolicy``
and ``NUMAMask`` on the CPUs of its GPUs' NUMA nodes, away from the CPUs that serve the pinned interrupts.

Read: each GPU's ``numa_node`` (``/sys/bus/pci/devices/BDF/numa_node``), each node's ``cpulist``
(``/sys/devices/system/node/nodeN/cpulist``) within the online CPUs, and the CPUs the interrupts of the
functions irq_affinity pinned (``/etc/gpufleet/irq_affinity.json``) are allowed on
(``/proc/irq/N/smp_affinity_list`` of their ``msi_irqs``). Decide: the nodes' CPUs less the IRQ CPUs, the NUMA
policy over those nodes. Apply: one systemd drop-in of the unit
(``/etc/systemd/system/UNIT.d/50-gpufleet-cpu-placement.conf``), read back, then ``daemon-reload`` and what
systemd now shows for the unit. A drop-in is a file, so it survives a reboot; ``state: absent`` removes it. The
service runs with the new placement once restarted (``restart_needed``; the role's handler does it).
"""

from __future__ import annotations

import json
import re

from ansible_collections.gpufleet.inference.plugins.module_utils._host import managed_files
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.managed_files import wanted_absent, wanted_file
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import (
    NODES, PCI_DEVICES, PciWalker, TopologyError, format_cpulist, parse_cpulist, select_targets,
)

IRQ_CONFIG = "/etc/gpufleet/irq_affinity.json"  # what the irq_affinity role pinned (irq/affinity.py CONFIG_FILE)
CPU_ONLINE = "/sys/devices/system/cpu/online"
DROPIN_NAME = "50-gpufleet-cpu-placement.conf"
UNIT_RE = re.compile(r"^[A-Za-z0-9:_.@-]{1,200}\.service$")
POLICIES = ("preferred", "bind", "interleave")


class PlacementError(Exception):
    """A placement that cannot be decided; the message says why and what to do."""


def dropin_path(unit: str) -> str:
    return f"/etc/systemd/system/{unit}.d/{DROPIN_NAME}"


def gpu_nodes(fs, bdfs: list[str], node_list: list[int]) -> dict[str, int | None]:
    """{bdf: its NUMA node} (None: the firmware gives none, ``-1``)."""
    out = {}
    for bdf in bdfs:
        text = (fs.read_optional(f"{PCI_DEVICES}/{bdf}/numa_node") or "").strip()
        out[bdf] = int(text) if text.lstrip("-").isdigit() and int(text) >= 0 else None
        if out[bdf] is not None and out[bdf] not in node_list:
            raise PlacementError(f"{bdf} reports NUMA node {out[bdf]}, which {NODES} does not list ({node_list}).")
    return out


def irq_cpus(fs, walker: PciWalker) -> tuple[list[int], list[str]]:
    """(the CPUs the pinned functions' interrupts may run on, those functions) from irq_affinity's configuration."""
    text = fs.read_optional(IRQ_CONFIG)
    try:
        devices = (json.loads(text) if text else {}).get("devices") or {}
    except (ValueError, AttributeError):
        raise PlacementError(f"{fs.path(IRQ_CONFIG)} is not irq_affinity's JSON configuration: run the irq_affinity role "
                             "again, or set exclude_irq_cpus: false.") from None
    cpus: set[int] = set()
    present = set(walker.functions())
    for bdf in sorted(b for b in devices if b in present):
        for irq in walker.irqs(walker.sysfs_path(bdf)):
            cpus.update(parse_cpulist(irq["smp_affinity_list"]))
    return sorted(cpus), sorted(b for b in devices if b in present)


def decide(params: dict, fs) -> dict:
    """The placement: GPUs and their nodes, the nodes' online CPUs, the IRQ CPUs left out, the unit settings."""
    walker = PciWalker(fs)
    node_list = sorted(walker.numa_nodes())
    online = set(parse_cpulist(fs.read_optional(CPU_ONLINE))) if fs.exists(CPU_ONLINE) else None
    try:
        gpus = select_targets(walker, devices=params.get("gpus") or None)
    except TopologyError as err:
        raise PlacementError(str(err)) from None
    nodes_of = gpu_nodes(fs, gpus, node_list)
    nodes = sorted(set(params.get("nodes") or []) or {n for n in nodes_of.values() if n is not None})
    if not nodes:
        if len(node_list) != 1:
            raise PlacementError(f"{', '.join(gpus)} report no NUMA node (numa_node -1) on a host of {len(node_list)} nodes: "
                                 "the firmware gives no proximity (ACPI _PXM). Give nodes: the node the GPUs sit on.")
        nodes = node_list
    if set(nodes) - set(node_list):
        raise PlacementError(f"nodes {sorted(set(nodes) - set(node_list))} are not NUMA nodes of this host ({node_list}).")
    cpus = set()
    for node in nodes:
        cpus.update(parse_cpulist(fs.read_optional(f"{NODES}/node{node}/cpulist")))
    cpus = cpus & online if online is not None else cpus
    excluded, pinned = irq_cpus(fs, walker) if params.get("exclude_irq_cpus", True) else ([], [])
    left = sorted(cpus - set(excluded))
    if not left:
        raise PlacementError(f"Every CPU of node(s) {format_cpulist(nodes)} ({format_cpulist(cpus) or 'none online'}) serves the "
                             f"interrupts irq_affinity pinned ({format_cpulist(excluded)}, of {', '.join(pinned)}): none is left "
                             "for vLLM. Give irq_affinity fewer CPUs (irq_affinity_cpus), or set exclude_irq_cpus: false.")
    policy = params.get("numa_policy") or "preferred"
    if policy == "preferred" and len(nodes) > 1:
        raise PlacementError(f"NUMAPolicy=preferred takes one node, and the GPUs sit on nodes {format_cpulist(nodes)}: use "
                             "numa_policy bind or interleave, or give nodes: one node.")
    settings = {"CPUAffinity": format_cpulist(left), "NUMAPolicy": policy, "NUMAMask": format_cpulist(nodes)}
    return {"gpus": {b: nodes_of[b] for b in gpus}, "nodes": nodes, "cpus": format_cpulist(left),
            "irq_cpus": format_cpulist(excluded), "irq_devices": pinned, "unit_settings": settings}


def render_dropin(unit: str, settings: dict, why: str) -> str:
    lines = [f"# Managed by gpufleet.inference cpu_placement: {why}.",
             f"# Removed by its state=absent. Takes effect when {unit} restarts.", "[Service]"]
    return "\n".join(lines + [f"{k}={v}" for k, v in settings.items()]) + "\n"


def unit_reads(host: Host, unit: str) -> dict:
    """What systemd shows for the unit now (after daemon-reload), on the live host only."""
    rc, out, err = host.cmd.run(host.cmd.systemctl("show", "-p", "LoadState", "-p", "CPUAffinity", "-p", "NUMAPolicy",
                                                   "-p", "NUMAMask", unit))
    if rc != 0:
        raise Failed(f"'systemctl show {unit}' exited {rc}: {err.strip()}. The drop-in is written; check systemd.", changed=True)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _check_reads(reads: dict, settings: dict, unit: str) -> str | None:
    """Why systemd's view of a loaded unit differs from the drop-in (None when it matches, or the unit is not loaded)."""
    if reads.get("LoadState") != "loaded":
        return None
    shown = parse_cpulist(reads.get("CPUAffinity", "").replace(" ", ","))
    if shown != parse_cpulist(settings["CPUAffinity"]):
        return (f"systemd shows CPUAffinity={reads.get('CPUAffinity')} for {unit}, not {settings['CPUAffinity']}: a drop-in "
                f"that sorts after {DROPIN_NAME} sets it too (systemctl cat {unit})")
    return None


def execute(params: dict, host: Host, check_mode: bool) -> dict:
    """The cpu_placement module's run (see the file's docstring). Raises PlacementError (nothing changed) or Failed."""
    unit = params["unit"]
    if not UNIT_RE.match(unit or ""):
        raise PlacementError(f"unit={unit!r} is not a systemd service name (NAME.service). Nothing was changed.")
    path = dropin_path(unit)
    result = {"unit": unit, "dropin": path, "gpus": {}, "nodes": [], "cpus": "", "irq_cpus": "", "irq_devices": [],
              "unit_settings": {}}
    if params["state"] == "present":
        placed = decide(params, host.fs)
        result.update(placed)
        why = (f"vLLM on the CPUs of NUMA node(s) {format_cpulist(placed['nodes'])}, near GPUs {', '.join(placed['gpus'])}"
               + (f", away from the IRQ CPUs {placed['irq_cpus']}" if placed["irq_cpus"] else ""))
        files = [wanted_file(path, render_dropin(unit, placed["unit_settings"], why))]
        own = host.fs.read_optional(f"/etc/systemd/system/{unit}") or ""
        if re.search(r"^\s*(CPUAffinity|NUMAPolicy|NUMAMask)=", own, re.M):
            host.warn(f"cpu_placement: /etc/systemd/system/{unit} sets CPUAffinity/NUMAPolicy itself (vllm_service_unit_settings); "
                      f"the drop-in {path} overrides it.")
    else:
        files = [wanted_absent(path)]
    actions, diff = managed_files.plan(host.fs, [], files)
    if actions and not host.cmd.chrooted:
        actions.append({"action": "daemon_reload", "argv": host.cmd.systemctl("daemon-reload")})
    if actions and not check_mode:
        file_actions = [a for a in actions if a["action"] != "daemon_reload"]
        managed_files.apply(host.fs, [], files, file_actions)
        problems = managed_files.unlike(files, managed_files.read_back(host.fs, files))
        if problems:
            raise Failed(f"The drop-in does not read back: {'; '.join(problems)}.", changed=True, actions=actions)
        if not host.cmd.chrooted:
            problem = host.cmd.unit_step(host.cmd.systemctl("daemon-reload"), f"{path} is written",
                                         "Run systemctl daemon-reload by hand.")
            if problem:
                raise Failed(problem.pop("msg"), changed=True, **problem)
    if not host.cmd.chrooted and not check_mode:
        result["systemd_reads"] = unit_reads(host, unit)
    if params["state"] == "present" and "systemd_reads" in result:
        mismatch = _check_reads(result["systemd_reads"], result["unit_settings"], unit)
        if mismatch:
            raise Failed(mismatch + ".", changed=bool(actions), actions=actions)
    result.update(changed=bool(actions), actions=actions, restart_needed=bool(actions), diff=diff)
    return result

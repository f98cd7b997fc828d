# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Huge page reservations per NUMA node: reading, the memory guard, plans and persistence.

2 MiB pages are reserved at runtime through ``/sys/devices/system/node/nodeN/hugepages/``; 1 GiB
pages normally need the kernel command line (``hugepagesz=1G hugepages=...``), because a running
system seldom has 1 GiB of contiguous free memory. The guard refuses any request that would leave a
node with less than ``100 - max_memory_percent`` percent of its memory for everything else. ``execute`` is the
hugepages module's executor.
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import bounded
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import NODES, parse_cpulist, parse_meminfo

GLOBAL = "/sys/kernel/mm/hugepages"
# The most pages of one size a run asks for on a node (the memory guard refuses far fewer): a larger count is a typo.
MAX_PAGES = 2 ** 32
SIZES = {"2M": 2048, "1G": 1048576}  # page sizes this module manages, in kB
NAMES = {v: k for k, v in SIZES.items()}
MEMINFO_KEYS = ("MemTotal", "HugePages_Total", "HugePages_Free", "HugePages_Rsvd", "HugePages_Surp", "Hugepagesize", "Hugetlb")
NODE_LINE = re.compile(r"^Node\s+\d+\s+([A-Za-z_()]+):\s+(\d+)")


class HugepagesError(Exception):
    """The request cannot be done; the message says what, where, why and what to do."""


def parse_node_meminfo(text: str | None) -> dict[str, int]:
    """``/sys/devices/system/node/nodeN/meminfo`` (``Node 0 MemTotal:  131890012 kB``) -> {key: value}."""
    out = {}
    for line in (text or "").splitlines():
        m = NODE_LINE.match(line.strip())
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def gib(kb: int | float) -> str:
    return f"{kb / 1048576:.1f} GiB"


def size_path(node: int | None, kb: int) -> str:
    """The sysfs directory of one page size, per node or (without NUMA) global."""
    if node is None:
        return f"{GLOBAL}/hugepages-{kb}kB"
    return f"{NODES}/node{node}/hugepages/hugepages-{kb}kB"


def _int(text: str | None) -> int | None:
    return int(text) if (text or "").strip().isdigit() else None


def read_layout(fs: HostFS) -> dict[str, Any]:
    """Nodes with their memory and reservations, supported sizes, default size, the running command line.

    Without NUMA sysfs (CONFIG_NUMA off) there is one pseudo node ``0`` that uses the global files.
    """
    meminfo = parse_meminfo(fs.read_optional("/proc/meminfo") or "")
    supported = sorted(int(n[10:-2]) for n in fs.listdir(GLOBAL) if n.startswith("hugepages-") and n.endswith("kB")
                       and n[10:-2].isdigit())
    node_names = sorted(int(n[4:]) for n in fs.listdir(NODES) if n.startswith("node") and n[4:].isdigit())
    has_memory_text = fs.read_optional(f"{NODES}/has_memory")
    with_memory = set(parse_cpulist(has_memory_text)) if has_memory_text is not None else set(node_names)
    nodes: dict[int, dict[str, Any]] = {}
    numa = bool(node_names)
    for node in node_names or [0]:
        if numa:
            mem = parse_node_meminfo(fs.read_optional(f"{NODES}/node{node}/meminfo")).get("MemTotal")
        else:
            mem = meminfo.get("MemTotal")
        sizes = {}
        for kb in supported:
            base = size_path(node if numa else None, kb)
            nr = _int(fs.read_optional(base + "/nr_hugepages"))
            if nr is None:
                continue
            sizes[kb] = {"nr": nr, "free": _int(fs.read_optional(base + "/free_hugepages")),
                         "surplus": _int(fs.read_optional(base + "/surplus_hugepages"))}
        nodes[node] = {"mem_total_kb": mem or 0, "has_memory": (node in with_memory) if numa else True, "sizes": sizes}
    return {
        "numa": numa,
        "nodes": nodes,
        "supported_kb": supported,
        "default_kb": meminfo.get("Hugepagesize"),
        "cmdline": fs.read_optional("/proc/cmdline") or "",
        "meminfo": {k: meminfo.get(k) for k in MEMINFO_KEYS},
    }


def desired(layout: dict[str, Any], pages: dict[int, int | None], nodes: list[int] | None,
            per_node: dict[int, dict[int, int]] | None) -> dict[int, dict[int, int]]:
    """{node: {size_kb: pages}} for the sizes that are managed.

    ``pages`` is {size_kb: pages per node or None (not managed)}; they apply to ``nodes`` (default:
    every node with memory); ``per_node`` overrides single nodes. Raises HugepagesError for unknown
    nodes, memoryless nodes, unsupported sizes and negative counts.
    """
    known = layout["nodes"]
    targets = list(nodes) if nodes else [n for n, info in known.items() if info["has_memory"]]
    for n in list(targets) + list((per_node or {}).keys()):
        if n not in known:
            raise HugepagesError(f"NUMA node {n} does not exist on this host (nodes: {', '.join(str(k) for k in sorted(known))}); "
                                 "see /sys/devices/system/node.")
        if not known[n]["has_memory"]:
            raise HugepagesError(f"NUMA node {n} has no memory of its own (not in /sys/devices/system/node/has_memory): "
                                 "huge pages cannot be reserved there. Leave it out of nodes.")
    out: dict[int, dict[int, int]] = {}
    for kb, count in pages.items():
        if count is None:
            continue
        for n in targets:
            out.setdefault(n, {})[kb] = count
    for n, sizes in (per_node or {}).items():
        for kb, count in sizes.items():
            if count is not None:
                out.setdefault(n, {})[kb] = count
    for n, sizes in out.items():
        for kb, count in sizes.items():
            if count < 0:
                raise HugepagesError(f"{NAMES[kb]} pages on node {n}: {count} is negative (pages_2m, pages_1g, per_node); "
                                     "give a count of 0 or more.")
            if kb not in layout["supported_kb"]:
                raise HugepagesError(
                    f"This kernel has no {NAMES[kb]} huge pages ({GLOBAL}/hugepages-{kb}kB is missing)"
                    f"{': the CPU lacks pdpe1gb (1 GiB pages), or the kernel was built without them' if kb == 1048576 else ''}. "
                    f"Drop the {NAMES[kb]} request.")
    return out


def guard(layout: dict[str, Any], want: dict[int, dict[int, int]], max_percent: int) -> list[str]:
    """Refusals for every node where the reservation would exceed ``max_percent`` of its memory.

    The sizes not managed count at what the node holds now.
    """
    problems = []
    for node, sizes in sorted(want.items()):
        info = layout["nodes"][node]
        total = info["mem_total_kb"]
        if not total:
            problems.append(f"NUMA node {node}: MemTotal is unknown (no /sys/devices/system/node/node{node}/meminfo), so the "
                            f"memory guard cannot work; refusing to reserve pages there.")
            continue
        limit = total * max_percent // 100
        kept = {kb: s["nr"] for kb, s in info["sizes"].items()}
        kept.update(sizes)
        used = sum(kb * n for kb, n in kept.items())
        if used > limit:
            parts = ", ".join(f"{n} x {NAMES.get(kb, str(kb) + 'kB')}" for kb, n in sorted(kept.items()) if n)
            fit = {kb: max(0, (limit - (used - kb * kept[kb])) // kb) for kb in sizes}
            fits = ", ".join(f"{n} pages of {NAMES[kb]}" for kb, n in sorted(fit.items()))
            problems.append(
                f"Refusing to reserve huge pages on NUMA node {node}: {parts} is {gib(used)}, {used * 100 / total:.0f}% of the "
                f"node's {gib(total)}, above max_memory_percent {max_percent} ({gib(limit)}). At most {fits} fit with the "
                f"rest as it is. Lower the request (pages_2m, pages_1g, per_node), or raise max_memory_percent if the host can "
                "really spare the memory.")
    return problems


def plan(layout: dict[str, Any], want: dict[int, dict[int, int]], runtime_sizes: set) -> list[dict[str, Any]]:
    """Writes to nr_hugepages, decreases first (they free memory the increases may need)."""
    actions = []
    for node, sizes in sorted(want.items()):
        for kb, count in sorted(sizes.items()):
            if kb not in runtime_sizes:
                continue
            current = layout["nodes"][node]["sizes"].get(kb, {}).get("nr")
            if current != count:
                actions.append({"node": node, "size_kb": kb, "before": current, "after": count,
                                "path": size_path(node if layout["numa"] else None, kb) + "/nr_hugepages"})
    return sorted(actions, key=lambda a: (a["after"] > (a["before"] or 0), a["node"], a["size_kb"]))


def _even(counts: dict[int, int], layout: dict[str, Any]) -> int | None:
    """Pages per node when every node with memory gets the same count, else None."""
    memory_nodes = [n for n, info in layout["nodes"].items() if info["has_memory"]]
    values = {counts.get(n) for n in memory_nodes}
    return values.pop() if len(values) == 1 and None not in values else None


def boot_args(layout: dict[str, Any], want: dict[int, dict[int, int]], kb: int) -> list[str]:
    """``hugepagesz=1G hugepages=N`` (even over every memory node: the kernel spreads boot pages evenly)
    or the per-node form ``hugepages=0:N,1:M`` (kernel 5.16 and later)."""
    counts = {n: sizes[kb] for n, sizes in want.items() if kb in sizes}
    if not counts or not any(counts.values()):
        return []
    even = _even(counts, layout)
    memory_nodes = [n for n, info in layout["nodes"].items() if info["has_memory"]]
    if even is not None:
        value = str(even * len(memory_nodes))
    else:
        value = ",".join(f"{n}:{counts.get(n, 0)}" for n in sorted(layout["nodes"]) if n in counts or n in memory_nodes)
    return [f"hugepagesz={NAMES[kb]}", f"hugepages={value}"]


def persistence(layout: dict[str, Any], want: dict[int, dict[int, int]]) -> dict[str, Any]:
    """How the reservation survives a reboot.

    2 MiB pages: the sysctl ``vm.nr_hugepages`` (the kernel spreads it evenly over the nodes) when
    every memory node gets the same count and 2 MiB is the default size; otherwise kernel arguments.
    1 GiB pages: always kernel arguments. Returns {sysctl: {name: value} or None, cmdline_args: [...]}.
    """
    args: list[str] = []
    sysctl = None
    counts_2m = {n: sizes[2048] for n, sizes in want.items() if 2048 in sizes}
    if counts_2m:
        even = _even(counts_2m, layout)
        if even is not None and layout["default_kb"] in (2048, None):
            memory_nodes = [n for n, info in layout["nodes"].items() if info["has_memory"]]
            sysctl = {"vm.nr_hugepages": even * len(memory_nodes)}
        else:
            args += boot_args(layout, want, 2048)
    args = boot_args(layout, want, 1048576) + args
    return {"sysctl": sysctl, "cmdline_args": args}


def booted_with(cmdline: str, args: list[str]) -> bool:
    """The running kernel was booted with these arguments: each ``hugepagesz=`` and the ``hugepages=`` after it
    appear next to each other in /proc/cmdline."""
    tokens = cmdline.split()
    pairs = [args[i:i + 2] for i in range(0, len(args), 2)]
    return bool(args) and all(any(tokens[i:i + 2] == pair for i in range(len(tokens) - 1)) for pair in pairs)


def _per_node(raw: dict) -> dict[int, dict[int, int]]:
    out: dict[int, dict[int, int]] = {}
    for key, value in (raw or {}).items():
        if not str(key).isdigit():
            raise HugepagesError(f"per_node: '{key}' is not a NUMA node number; use keys like 0 and 1.")
        if not isinstance(value, dict) or set(value) - {"pages_2m", "pages_1g"}:
            raise HugepagesError(f"per_node[{key}]: give a dictionary with pages_2m and/or pages_1g, got {value!r}.")
        sizes = {}
        for name, kb in (("pages_2m", 2048), ("pages_1g", 1048576)):
            if value.get(name) is not None:
                count = value[name]
                if isinstance(count, str) and count.strip().isdigit():
                    count = int(count)
                sizes[kb] = bounded(f"per_node[{key}].{name}", count, 0, MAX_PAGES, "pages")
        out[int(key)] = sizes
    return out


def _render(layout: dict) -> str:
    lines = []
    for node, info in sorted(layout["nodes"].items()):
        for kb, s in sorted(info["sizes"].items()):
            lines.append(f"node {node} {NAMES.get(kb, str(kb) + 'kB')}: {s['nr']}\n")
    return "".join(lines)


def execute(params: dict, host: Host, check_mode: bool) -> dict:
    """The hugepages module's run: read, guard, plan, write, read back (on the Host's files, warnings to
    ``host.warn``). Raises HugepagesError with the reason, Failed (bounded()) for a count out of range."""
    fs, warn = host.fs, host.warn
    pct = params["max_memory_percent"]
    _check_counts(params)
    layout = read_layout(fs)
    if not layout["supported_kb"]:
        raise HugepagesError("This kernel offers no huge pages (/sys/kernel/mm/hugepages is empty or missing): it was built "
                             "without CONFIG_HUGETLBFS, or /sys is not mounted.")
    pages = {2048: params.get("pages_2m"), 1048576: params.get("pages_1g")}
    want = desired(layout, pages, params.get("nodes") or [], _per_node(params.get("per_node") or {}))
    problems = guard(layout, want, pct)
    if problems:
        raise HugepagesError(" ".join(problems) + " Nothing was changed.")
    runtime = {2048} | ({1048576} if params["method_1g"] == "runtime" else set())
    actions = plan(layout, want, runtime)
    if params["method_1g"] == "cmdline":  # at runtime 1 GiB pages are only given back
        actions += [a for a in plan(layout, want, {1048576}) if a["after"] < (a["before"] or 0)]
    persist = persistence(layout, want)
    got: dict[tuple, int | None] = {}
    shortfall: list[str] = []
    if not check_mode:
        got, shortfall = _write(fs, actions, params["allow_partial"], warn)
    after = read_layout(fs) if not check_mode else layout
    reboot_pending = _check_boot_pages(layout, after, want, params, shortfall)
    if shortfall:
        warn(f"Fewer huge pages than asked (allow_partial): {'; '.join(shortfall)}.")
    shown = [{"action": "set", "path": a["path"], "node": a["node"], "size": NAMES[a["size_kb"]], "before": a["before"],
              "after": a["after"]} for a in actions]
    return {
        "changed": bool(actions),
        "actions": shown,
        "nodes": _nodes_report(layout, after, want, pct),
        "cmdline_args": persist["cmdline_args"],
        "sysctl": persist["sysctl"],
        "reboot_pending": reboot_pending,
        "partial": bool(shortfall),
        "shortfall": shortfall,
        "supported_sizes": [NAMES.get(kb, f"{kb}kB") for kb in layout["supported_kb"]],
        "meminfo": after["meminfo"],
        "diff": _diff(layout, actions, got),
    }


def _check_counts(params: dict) -> None:
    """max_memory_percent from 1 to 100 (HugepagesError), page counts from 0 to MAX_PAGES (Failed), before any read."""
    pct = params["max_memory_percent"]
    if not 1 <= pct <= 100:
        raise HugepagesError(f"max_memory_percent must be between 1 and 100, got {pct}.")
    for name in ("pages_2m", "pages_1g"):
        if params.get(name) is not None:
            bounded(name, params[name], 0, MAX_PAGES, "pages")


def _write(fs: HostFS, actions: list[dict], allow_partial: bool, warn) -> tuple[dict, list[str]]:
    """Write each count and read it back: ``({(node, size_kb): count read back}, shortfall)``. A page count that stays
    higher (pages in use) is a warning; a write the kernel refuses, or fewer pages than asked without
    ``allow_partial``, puts every count back and raises HugepagesError."""
    got: dict[tuple, int | None] = {}
    shortfall: list[str] = []
    done = []
    for a in actions:
        try:
            fs.write_text(a["path"], str(a["after"]))
        except HostFSError as err:
            # the kernel refuses a count it cannot give with ENOMEM on some versions; read back below tells
            if err.errno not in (12,):
                _restore(fs, done)
                raise HugepagesError(f"Failed to set {a['path']} to {a['after']}: {err}. {_restored(done)}") from None
        value = fs.read_optional(a["path"])
        key = (a["node"], a["size_kb"])
        got[key] = int(value) if (value or "").isdigit() else None
        done.append(a)
        if a["after"] < (a["before"] or 0) and (got[key] or 0) > a["after"]:
            warn(f"node {a['node']}: {NAMES[a['size_kb']]} pages stay at {got[key]}, not {a['after']}: "
                 f"pages in use cannot be given back until their users free them.")
        elif (got[key] or 0) < a["after"]:
            shortfall.append(f"node {a['node']}: {NAMES[a['size_kb']]} pages {got[key]} of "
                             f"{a['after']} (free memory is fragmented or short)")
    if shortfall and not allow_partial:
        _restore(fs, done)
        raise HugepagesError(
            f"The kernel gave fewer huge pages than asked: {'; '.join(shortfall)}. {_restored(done)} Free memory on that "
            f"node (stop what uses it, or 'echo 1 > /proc/sys/vm/compact_memory'), reserve the pages at boot through "
            f"the kernel command line, or set allow_partial: true to keep what the kernel can give.")
    return got, shortfall


def _check_boot_pages(layout: dict, after: dict, want: dict, params: dict, shortfall: list[str]) -> bool:
    """The 1 GiB pages the command line should bring (method_1g cmdline): True when they wait for a reboot (the
    kernel was not booted with the arguments yet); a boot that gave fewer is added to ``shortfall``, and fails
    (HugepagesError) without allow_partial."""
    args_1g = boot_args(layout, want, 1048576)
    booted = booted_with(layout["cmdline"], args_1g)
    reboot_pending = False
    for node, sizes in sorted(want.items()):
        if 1048576 not in sizes or params["method_1g"] != "cmdline":
            continue
        have = after["nodes"][node]["sizes"].get(1048576, {}).get("nr") or 0
        if have < sizes[1048576]:
            if booted:
                shortfall.append(f"node {node}: 1G pages {have} of {sizes[1048576]} given at boot (memory short or fragmented "
                                 f"at boot time)")
            else:
                reboot_pending = True
    boot_short = [s for s in shortfall if "given at boot" in s]
    if boot_short and not params["allow_partial"]:
        raise HugepagesError(
            f"The kernel was booted with {' '.join(args_1g)} but gave fewer 1 GiB pages: {'; '.join(boot_short)}. Lower "
            f"pages_1g, check 'dmesg | grep -i hugetlb', or set allow_partial: true to accept what it gave.")
    return reboot_pending


def _nodes_report(layout: dict, after: dict, want: dict, pct: int) -> dict:
    """Per node (by its number as a string): its memory, the guard's limit, and each page size's count before,
    wanted, after and free."""
    nodes_out = {}
    for node, info in sorted(after["nodes"].items()):
        before_sizes = layout["nodes"][node]["sizes"]
        nodes_out[str(node)] = {
            "mem_total_kb": info["mem_total_kb"], "limit_kb": info["mem_total_kb"] * pct // 100,
            "has_memory": info["has_memory"],
            "pages": {NAMES.get(kb, f"{kb}kB"): {"before": before_sizes.get(kb, {}).get("nr"), "wanted": want.get(node, {}).get(kb),
                                                 "after": s["nr"], "free": s["free"]}
                      for kb, s in sorted(info["sizes"].items())},
        }
    return nodes_out


def _diff(layout: dict, actions: list[dict], got: dict) -> dict:
    """The counts per node and size before, and after (as read back, or as planned in check mode); empty when
    nothing changes."""
    if not actions:
        return {}
    predicted = {"numa": layout["numa"], "nodes": {n: {"sizes": {kb: dict(s) for kb, s in i["sizes"].items()}}
                                                   for n, i in layout["nodes"].items()}}
    for a in actions:
        predicted["nodes"][a["node"]]["sizes"][a["size_kb"]]["nr"] = got.get((a["node"], a["size_kb"]), a["after"])
    return {"before": _render(layout), "after": _render(predicted)}


def _restore(fs: HostFS, done: list) -> None:
    for a in reversed(done):
        try:
            fs.write_text(a["path"], str(a["before"]))
            a["restored"] = fs.read_optional(a["path"]) == str(a["before"])
        except HostFSError:
            a["restored"] = False


def _restored(done: list) -> str:
    if not done:
        return "Nothing had been changed."
    bad = [f"node {a['node']} {NAMES[a['size_kb']]}" for a in done if not a.get("restored")]
    return "The counts were put back as they were." if not bad else f"Could not put back: {', '.join(bad)}; check them by hand."

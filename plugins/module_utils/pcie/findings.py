# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure judgement of the PCIe model built by _pci/topology.py's build_model().

find(model, vfio_wanted) returns findings, each ``{code, severity, device, devices, message,
fix}``, severity one of critical/warning/info, most severe first. No I/O.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.link_samples import classify_link_samples
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.config import link_bandwidth_gbps, link_generation
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import format_cpulist, parse_cpulist
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.p2p import find_groups, find_nvml_p2p

SEVERITIES = ("critical", "warning", "info")
NVIDIA = "0x10de"


def _finding(code: str, severity: str, device: str | None, message: str, fix: str, devices=None) -> dict[str, Any]:
    return {"code": code, "severity": severity, "device": device,
            "devices": list(devices) if devices else ([device] if device else []), "message": message, "fix": fix}


def _pcie(dev: dict | None) -> dict | None:
    return ((dev or {}).get("config") or {}).get("pcie")


def _link_text(speed, width) -> str:
    gen = link_generation(speed)
    return f"{speed:g} GT/s (Gen{gen}) x{width}" if speed and gen else f"{speed} GT/s x{width}"


def path_links(model: dict, bdf: str) -> list[dict[str, Any]]:
    """The physical links on the path of ``bdf``, each seen from its downstream function.

    The partner is the parent port when it is a root or downstream port; links inside a switch
    (downstream port below its upstream port) are virtual and skipped. A function straight on a
    root bus (VMs, integrated endpoints) is judged against its own capability.
    """
    devices = model["devices"]
    links = []
    for gpu in model["gpus"]:
        if gpu["bdf"] != bdf:
            continue
        for hop in gpu["path"]:
            pcie = _pcie(devices.get(hop))
            if not pcie or "link_cap" not in pcie or pcie["port_type"] == "root_port":
                continue
            parent = devices.get(devices[hop]["parent"]) if devices[hop]["parent"] else None
            ppcie = _pcie(parent)
            if ppcie and ppcie.get("port_type") == "upstream_port":
                continue  # internal switch link
            partner = ppcie if ppcie and "link_cap" in ppcie and ppcie["port_type"] in ("root_port", "downstream_port") else None
            links.append({"device": hop, "partner": parent["bdf"] if partner else None, "cap": pcie["link_cap"],
                          "partner_cap": partner["link_cap"] if partner else None, "sta": pcie["link_sta"]})
    return links


def _min(*vals):
    vals = [v for v in vals if v]
    return min(vals) if vals else None


def find_links(model: dict) -> list[dict[str, Any]]:
    out = []
    seen = set()
    devices = model["devices"]
    for gpu in model["gpus"]:
        for link in path_links(model, gpu["bdf"]):
            dev = link["device"]
            if dev in seen:
                continue
            seen.add(dev)
            cap, pcap, sta = link["cap"], link["partner_cap"] or {}, link["sta"]
            exp_speed = _min(cap["speed_gts"], pcap.get("speed_gts"))
            exp_width = _min(cap["width"], pcap.get("width"))
            if not sta["speed_gts"] or not sta["width"] or not exp_speed or not exp_width:
                continue
            where = f"link {link['partner']} -> {dev}" if link["partner"] else f"link of {dev}"
            slow_speed, slow_width = sta["speed_gts"] < exp_speed, sta["width"] < exp_width
            now = link_bandwidth_gbps(sta["speed_gts"], sta["width"]) or 0
            if slow_speed or slow_width:
                is_gpu = devices[dev].get("role") == "target" and devices[dev].get("vendor_id") == NVIDIA
                note = (" NVIDIA GPUs drop the link speed when idle, so re-check under load (nvidia-smi -q -d PCIE) before acting."
                        if is_gpu and not slow_width else "")
                lost = link_bandwidth_gbps(exp_speed, exp_width) or 0
                out.append(_finding(
                    "link_below_capability", "critical" if slow_width else "warning", dev,
                    f"{where} runs at {_link_text(sta['speed_gts'], sta['width'])}; both ends can do "
                    f"{_link_text(exp_speed, exp_width)} ({now:g} of {lost:g} GB/s per direction).{note}",
                    "Reseat the card or riser, check the slot's bifurcation and speed settings in the BIOS and the "
                    "AER counters for signal errors; a width below capability does not recover without a retrain or reboot.",
                    [d for d in (link["partner"], dev) if d]))
            if not pcap:
                continue
            if not pcap.get("speed_gts") or not pcap.get("width"):
                # Speed unknown / Width x0 (seen on QEMU's XIO3130 downstream ports): no capability to judge by
                out.append(_finding(
                    "link_cap_unknown", "info", link["partner"],
                    f"{link['partner']}, the port above {dev}, reports no link capability "
                    f"(LnkCap {_link_text(pcap.get('speed_gts'), pcap.get('width'))}); the link to {dev} runs at "
                    f"{_link_text(sta['speed_gts'], sta['width'])} and is judged by {dev}'s own capability only.",
                    "Nothing to fix on the host; a firmware or emulator that reports a real LnkCap lets the audit "
                    "check this link fully.", [link["partner"], dev]))
                continue
            if (cap["speed_gts"] or 0) > pcap["speed_gts"] or cap["width"] > pcap["width"]:
                out.append(_finding(
                    "link_capped", "warning", dev,
                    f"{dev} can do {_link_text(cap['speed_gts'], cap['width'])} but the port above it ({link['partner']}) "
                    f"allows only {_link_text(pcap['speed_gts'], pcap['width'])}.",
                    "Move the card to a slot whose port matches its capability, or check the slot's speed and "
                    "bifurcation settings in the BIOS.", [link["partner"], dev]))
            elif (pcap["speed_gts"] > (cap["speed_gts"] or 0) or pcap["width"] > cap["width"]) and \
                    not (slow_speed or slow_width):
                out.append(_finding(
                    "link_limited_by_device", "info", dev,
                    f"{link['partner']} can do {_link_text(pcap['speed_gts'], pcap['width'])} but {dev} only "
                    f"{_link_text(cap['speed_gts'], cap['width'])}, so the link runs at {_link_text(sta['speed_gts'], sta['width'])} "
                    f"(the port's LnkSta is below its LnkCap; {now:g} of {link_bandwidth_gbps(pcap['speed_gts'], pcap['width']) or 0:g} "
                    "GB/s per direction the slot offers).",
                    "Nothing is degraded: the device is the limit. Put a device of this class in a slot that matches it, "
                    "and keep the wide slots for the GPUs.", [link["partner"], dev]))
    return out


def find_mps(model: dict) -> list[dict[str, Any]]:
    out = []
    devices = model["devices"]
    for gpu in model["gpus"]:
        hops = [(h, _pcie(devices[h])) for h in gpu["path"]]
        hops = [(h, p) for h, p in hops if p and "mps" in p]
        if not hops:
            continue
        supported = min(p["mps_supported"] for _h, p in hops)
        below = [(h, p["mps"]) for h, p in hops if p["mps"] < supported]
        above = [(h, p["mps"]) for h, p in hops if p["mps"] > supported]
        detail = ", ".join(f"{h} MPS {m}" for h, m in (below or above))
        if above:
            out.append(_finding(
                "mps_above_path", "critical", gpu["bdf"],
                f"On the path to {gpu['bdf']} the smallest MaxPayload supported is {supported} B but {detail}: "
                "larger TLPs than a hop accepts cause malformed-TLP errors.",
                f"Set MaxPayload to {supported} on every hop (kernel: pci=pcie_bus_safe, or the collection's MPS tuning).",
                [h for h, _m in above]))
        elif below:
            out.append(_finding(
                "mps_below_path", "warning", gpu["bdf"],
                f"Every hop on the path to {gpu['bdf']} supports MaxPayload {supported} B, but {detail}: "
                "smaller payloads cost PCIe bandwidth.",
                f"Set MaxPayload to {supported} on every hop of the path (kernel: pci=pcie_bus_perf, or the "
                "collection's MPS tuning, which reads every value back).", [h for h, _m in below]))
    return out


def find_aspm(model: dict) -> list[dict[str, Any]]:
    out = []
    devices = model["devices"]
    policy = model.get("aspm_policy")
    for gpu in model["gpus"]:
        on = [(h, _pcie(devices[h])["link_ctl"]["aspm"]) for h in gpu["path"]
              if _pcie(devices[h]) and "link_ctl" in _pcie(devices[h]) and _pcie(devices[h])["link_ctl"]["aspm"] != "disabled"]
        if on:
            out.append(_finding(
                "aspm_enabled", "warning", gpu["bdf"],
                f"ASPM is on along the path to {gpu['bdf']}: " + ", ".join(f"{h} {a}" for h, a in on)
                + f" (kernel ASPM policy: {policy or 'unknown'}). Link power states add wake-up latency to GPU traffic.",
                "Set the ASPM policy to performance (the pcie_link role: at runtime and as pcie_aspm.policy=performance on "
                "the kernel command line), or clear the ASPM Control bits in LnkCtl on these functions; also disable ASPM "
                "for the slots in the BIOS. pcie_aspm=off does not turn ASPM off: it leaves the firmware's setting as it is "
                "(docs/tuning_myths.md).", [h for h, _a in on]))
    return out


def find_pairs(model: dict, vfio_wanted: bool) -> list[dict[str, Any]]:
    out = []
    for pair in model["pairs"]:
        a, b = pair["a"], pair["b"]
        if pair["acs_redirect"]:
            out.append(_finding(
                "acs_redirect", "info" if vfio_wanted else "warning", a,
                f"{a} and {b} share a PCIe switch ({pair['level']}), but ACS P2P redirect (RR/CR) is on at "
                f"{', '.join(pair['acs_redirect'])}: peer traffic goes up to the root complex instead of across the switch"
                + ("; with vfio wanted this isolation is what keeps the GPUs in separate IOMMU groups." if vfio_wanted else
                   ", which cuts P2P bandwidth and has hung NCCL all-reduce on PCIe-only GPUs."),
                f"If the GPUs stay on this host, clear RR/CR/EC on exactly {', '.join(pair['acs_redirect'])} with "
                "gpufleet.inference.pcie_acs (runtime, re-applied at boot before the GPU driver; its kernel_args give "
                "pci=disable_acs_redir=<ports> for the kernel command line). pci=noacs does not exist in mainline Linux "
                "(docs/tuning_myths.md). Keep ACS on when the GPUs are passed to separate VMs.",
                [a, b] + pair["acs_redirect"]))
        if pair["level"] == "PHB":
            ports = [_root_port_redirecting(model, g) for g in (a, b)]
            ports = [p for p in ports if p]
            if ports:
                out.append(_finding(
                    "acs_redirect", "info", a,
                    f"{a} and {b} sit below two root ports of one host bridge (PHB), and ACS P2P redirect (RR/CR/EC) is on "
                    f"at {', '.join(ports)}: their peer requests go up to the root complex for IOMMU translation"
                    + ("; with vfio wanted this isolation is what keeps the GPUs in separate IOMMU groups." if vfio_wanted
                       else "."),
                    f"If the GPUs stay on this host and the platform routes peer traffic between root ports, clear RR/CR/EC on "
                    f"exactly {', '.join(ports)} with gpufleet.inference.pcie_acs (pci=disable_acs_redir=<ports> at boot); "
                    "pci=noacs does not exist in mainline Linux (docs/tuning_myths.md).", [a, b] + ports))
        if pair["level"] == "SYS":
            out.append(_finding(
                "pair_sys_level", "warning", a,
                f"{a} and {b} are on different NUMA nodes ({pair['numa_nodes'][0]} and {pair['numa_nodes'][1]}): "
                "peer traffic crosses the inter-socket link (SYS).",
                "Keep tensor-parallel groups within one socket (CUDA_VISIBLE_DEVICES / vLLM placement), or expect "
                "lower all-reduce bandwidth for this pair.", [a, b]))
    return out


def _root_port_redirecting(model: dict, bdf: str) -> str | None:
    """The GPU's root port when its ACS redirects peer traffic (RR, CR or EC on), else None."""
    for gpu in model["gpus"]:
        if gpu["bdf"] == bdf and gpu.get("root_port"):
            acs = ((model["devices"].get(gpu["root_port"]) or {}).get("config") or {}).get("acs") or {}
            if acs.get("ctrl_raw", 0) & 0x2C:
                return gpu["root_port"]
    return None


def find_iommu_groups(model: dict, vfio_wanted: bool) -> list[dict[str, Any]]:
    out = []
    devices = model["devices"]
    for gpu in model["gpus"]:
        dev = devices[gpu["bdf"]]
        if dev["iommu_group"] is None:
            continue
        slot = gpu["bdf"].rsplit(".", 1)[0]
        others = [m for m in dev["iommu_group_members"] if m["bdf"] != gpu["bdf"] and not m["is_bridge"]]
        foreign = [m for m in others if not m["bdf"].startswith(slot + ".")]
        siblings = [m for m in others if m["bdf"].startswith(slot + ".")]
        if foreign:
            names = ", ".join(f"{m['bdf']} ({m['class_name']})" for m in foreign)
            out.append(_finding(
                "iommu_group_shared", "warning" if vfio_wanted else "info", gpu["bdf"],
                f"IOMMU group {dev['iommu_group']} of {gpu['bdf']} also holds {names}: they can only be passed "
                "through together.",
                "Move the card to a slot behind a port with ACS, or pass the whole group to one VM; do not rely on "
                "pcie_acs_override.", [gpu["bdf"]] + [m["bdf"] for m in foreign]))
        elif siblings and vfio_wanted:
            out.append(_finding(
                "iommu_group_functions", "info", gpu["bdf"],
                f"IOMMU group {dev['iommu_group']} of {gpu['bdf']} also holds its other functions "
                + ", ".join(m["bdf"] for m in siblings) + ".",
                "Bind those functions to vfio-pci together with the GPU.", [gpu["bdf"]] + [m["bdf"] for m in siblings]))
    return out


def find_irqs(model: dict) -> list[dict[str, Any]]:
    out = []
    devices = model["devices"]
    multi_node = len(model.get("numa_nodes") or {}) > 1
    for gpu in model["gpus"]:
        dev = devices[gpu["bdf"]]
        node = dev["numa_node"]
        if node is None or node < 0:
            if multi_node:
                out.append(_finding(
                    "numa_node_unknown", "info", gpu["bdf"],
                    f"{gpu['bdf']} reports NUMA node -1 on a host with {len(model['numa_nodes'])} nodes: the firmware "
                    "does not say which socket the slot belongs to, so IRQ and memory placement cannot be checked.",
                    "Enable NUMA/SRAT proximity reporting for PCIe in the BIOS.", [gpu["bdf"]]))
            continue
        local = set(parse_cpulist(dev["local_cpulist"] or (model["numa_nodes"].get(node) or {}).get("cpulist")))
        if not local:
            continue
        remote = []
        for irq in dev["irqs"]:
            cpus = set(parse_cpulist(irq["effective_affinity_list"] or irq["smp_affinity_list"]))
            if cpus - local:
                remote.append((irq["irq"], cpus - local))
        if remote:
            cpus = set().union(*(c for _i, c in remote))
            out.append(_finding(
                "irq_remote_numa", "warning", gpu["bdf"],
                f"{len(remote)} of {len(dev['irqs'])} MSI/MSI-X IRQs of {gpu['bdf']} (NUMA node {node}) are served on "
                f"CPUs {format_cpulist(cpus)} outside its node's CPUs {format_cpulist(local)}: "
                + ", ".join(str(i) for i, _c in remote[:16]) + (" ..." if len(remote) > 16 else "") + ".",
                f"Pin these IRQs to CPUs {format_cpulist(local)} (smp_affinity_list), and keep irqbalance off them "
                "(IRQBALANCE_BANNED_CPULIST or --banirq), re-applied when the driver reloads.", [gpu["bdf"]]))
    return out


def find_host(model: dict, vfio_wanted: bool) -> list[dict[str, Any]]:
    out = []
    huge = model["hugepages"]
    if not huge.get("reserved_pages"):
        out.append(_finding(
            "no_hugepages", "warning" if vfio_wanted else "info", None,
            "No huge pages are reserved (HugePages_Total is 0 for every size).",
            "Reserve 2 MiB pages with vm.nr_hugepages, or 1 GiB pages with hugepagesz=1G hugepages=N on the kernel "
            "command line, where the workload (vfio guests, RDMA/DPDK, pinned host buffers) uses them.", None))
    iommu = model["iommu"]
    if vfio_wanted and not iommu["enabled"]:
        out.append(_finding(
            "iommu_disabled", "critical", None,
            "vfio is wanted but the IOMMU is off: /sys/kernel/iommu_groups is empty.",
            "Enable VT-d/AMD-Vi in the BIOS and boot with intel_iommu=on (Intel) or amd_iommu=on (AMD) plus iommu=pt.", None))
    elif vfio_wanted and not iommu["passthrough"]:
        out.append(_finding(
            "iommu_pt_missing", "warning", None,
            "vfio is wanted but iommu=pt is not on the kernel command line: devices left to host drivers pay for "
            "DMA translation.",
            "Add iommu=pt to the kernel command line (the collection's cmdline role) and reboot.", None))
    return out


def find_errors(model: dict) -> list[dict[str, Any]]:
    out = []
    for bdf, dev in sorted(model["devices"].items()):
        counters = dev.get("aer_counters") or {}
        totals = {k: (counters.get(k) or {}).get(t, 0) for k, t in
                  (("correctable", "TOTAL_ERR_COR"), ("nonfatal", "TOTAL_ERR_NONFATAL"), ("fatal", "TOTAL_ERR_FATAL"))}
        aer = (dev.get("config") or {}).get("aer") or {}
        status_unc, status_cor = aer.get("uncorrectable") or [], aer.get("correctable") or []
        if any(totals.values()) or status_unc or status_cor:
            uncorrectable = totals["nonfatal"] or totals["fatal"] or status_unc
            parts = [f"{k} {v}" for k, v in totals.items() if v]
            if status_unc or status_cor:
                parts.append("status bits " + ", ".join(status_unc + status_cor))
            out.append(_finding(
                "aer_errors", "warning" if uncorrectable else "info", bdf,
                f"{bdf} has logged PCIe errors: {'; '.join(parts)}.",
                "Watch whether the counters grow (signal integrity: reseat, riser, slot); growing correctable errors "
                "often come with a link below capability.", [bdf]))
        replays = ((model.get("nvml") or {}).get("gpus") or {}).get(bdf, {}).get("pcie_replay_counter")
        if replays:
            out.append(_finding(
                "pcie_replays", "warning", bdf,
                f"NVML counts {replays} PCIe replays on {bdf}: the link retransmits packets.",
                "Check the slot, riser and cabling; replays that keep growing cost bandwidth and precede link errors.", [bdf]))
    return out


def privilege_hint(privileges: dict | None) -> str:
    """What to do about a config space cut to 64 bytes, for the process that read it.

    ``privileges``: ``{'euid': int, 'cap_sys_admin': bool, 'hostname': str}`` of the auditing process
    (None: unknown). sysfs hands the whole config space only to a reader with CAP_SYS_ADMIN, so
    "run as root" is the fix for a non-root reader, and no fix at all for a root without it."""
    priv = privileges or {}
    where = f" on {priv['hostname']}" if priv.get("hostname") else ""
    if priv.get("euid") == 0 and priv.get("cap_sys_admin") is False:
        return (f"The module already runs as root{where}, but without CAP_SYS_ADMIN (an unprivileged container, or a "
                "capability bounding set that drops it): sysfs gives such a reader the first 64 bytes only. Audit "
                "the machine itself (its own root, not a container on it); this host's findings are incomplete.")
    return (f"Run the module as root{where} (become: true) with CAP_SYS_ADMIN: sysfs gives the first 64 bytes only "
            "to other users and to root without it (an unprivileged container: audit the host itself).")


def find_config(model: dict) -> list[dict[str, Any]]:
    out = []
    hint = privilege_hint(model.get("privileges"))
    for bdf, dev in sorted(model["devices"].items()):
        cfg = dev.get("config")
        if dev.get("config_error"):
            out.append(_finding("config_unreadable", "warning", bdf, f"Config space of {bdf} is unreadable: {dev['config_error']}.",
                                "Run the module as root (become: true); the findings for this function are incomplete.", [bdf]))
        elif cfg and (not cfg["capabilities_complete"] or cfg["extended_readable"] is False):
            out.append(_finding(
                "config_short", "warning", bdf,
                f"Only {cfg['size']} bytes of the config space of {bdf} are readable"
                + (": the capability list is cut off." if not cfg["capabilities_complete"] else ": the extended capabilities (ACS, AER) are hidden."),
                hint, [bdf]))
    return out


# ---- links under load -------------------------------------------------------------------------
def judge_under_load(finding: dict[str, Any], samples: list, cap: dict, context: str) -> dict[str, Any]:
    """A GPU's ``link_below_capability`` finding read again with ``samples`` taken under load (``context`` says
    which load): an idle downclock becomes ``link_idle_downclock`` (info), a link that stays down keeps its code
    with the loaded reading in the message, a link that changed during the load is ``link_flapping`` (critical)."""
    verdict = classify_link_samples(samples, cap)
    state, top = verdict["state"], verdict["top"]
    if state == "no_samples":
        return finding
    seen = ", ".join(_link_text(s, w) for s, w in samples[:12]) + (" ..." if len(samples) > 12 else "")
    if state == "flapping":
        return dict(finding, code="link_flapping", severity="critical", link_under_load=verdict,
                    message=f"{finding['device']}'s link changed speed or width under load ({context}): {seen}. A link that "
                            "retrains under load drops throughput and points at a marginal slot, riser or cable.",
                    fix="Check the AER counters and dmesg for link retraining, reseat the card or riser, and try another "
                        "slot; keep the host out of serving until the link holds its speed and width under load.")
    if state == "at_capability":
        return dict(finding, code="link_idle_downclock", severity="info", link_under_load=verdict,
                    message=f"{finding['device']}'s link read below capability at rest and trained up to "
                            f"{_link_text(*top)} under load ({context}): the GPU's idle power saving, not a fault.",
                    fix="Nothing to fix.")
    return dict(finding, link_under_load=verdict,
                message=f"{finding['message']} Under load ({context}) it stays at {_link_text(*top)}: not an idle downclock.")


def find(model: dict, vfio_wanted: bool = False, tp_groups=None) -> list[dict[str, Any]]:
    """Every finding for the model, most severe first. ``tp_groups``: lists of GPU BDFs, one per tensor-parallel group."""
    findings = (find_config(model) + find_links(model) + find_mps(model) + find_aspm(model)
                + find_pairs(model, vfio_wanted) + find_iommu_groups(model, vfio_wanted) + find_irqs(model)
                + find_errors(model) + find_host(model, vfio_wanted) + find_nvml_p2p(model) + find_groups(model, tp_groups))
    return sorted(findings, key=lambda f: (SEVERITIES.index(f["severity"]), f["code"], f["device"] or ""))


def summary(findings: list[dict[str, Any]]) -> dict[str, int]:
    counts = {s: 0 for s in SEVERITIES}
    for f in findings:
        counts[f["severity"]] += 1
    counts["total"] = len(findings)
    return counts

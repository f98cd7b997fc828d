# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Peer-to-peer judgement of the PCIe model: NVML's P2P status per GPU pair, tensor-parallel groups
that span sockets, GPUs behind the chipset (PCH) instead of CPU-attached lanes. Pure;
pcie/findings.py's find() adds these findings.
"""

from __future__ import annotations

from typing import Any

# Status -> (why, fix) for a PCIe-only pair that NVML says cannot do P2P.
P2P_FIXES = {
    "CHIPSET_NOT_SUPPORTED": (
        "the root complex between them does not forward peer-to-peer traffic",
        "Keep each tensor-parallel group below one PCIe switch (or on one root port pair the platform supports), or let "
        "NCCL go through host memory (nccl_env profile p2p_off; the NCCL A/B measures both)."),
    "IOH_TOPOLOGY_NOT_SUPPORTED": (
        "the path crosses host bridges (IOH/socket) that do not carry peer-to-peer traffic",
        "Place the group's GPUs under one socket's root complex, ideally one switch; across sockets NCCL must stage "
        "through host memory (nccl_env profile p2p_off)."),
    "GPU_NOT_SUPPORTED": (
        "the GPU model does not do PCIe peer-to-peer (consumer GPUs)",
        "Nothing to change on the host: NCCL uses host memory (SHM) for this pair; use data-center GPUs for P2P."),
    "DISABLED_BY_REGKEY": (
        "the NVIDIA driver has P2P disabled by a registry key",
        "Remove the RMP2P / PeerMapping setting from NVreg_RegistryDwords in /etc/modprobe.d and reload the driver."),
    "NOT_SUPPORTED": (
        "the driver found no working P2P path (ACS redirect through the IOMMU, or a platform without P2P support)",
        "Check acs_redirect for these GPUs (pcie_acs clears it on exactly the bridges between them), iommu=pt, and the "
        "BIOS settings for PCIe peer-to-peer; until then the pair goes through host memory."),
    "UNKNOWN": (
        "the driver could not tell",
        "Check acs_redirect, iommu=pt and the BIOS P2P settings; measure with the NCCL A/B."),
}
# Chipset links: Intel PCH root ports sit on bus 0 at these device numbers; AMD's chipset is a switch
# whose ports carry these device IDs (Promontory and its successors).
INTEL = "0x8086"
PCH_DEVICE_NUMBERS = (0x1B, 0x1C, 0x1D)
AMD = "0x1022"
AMD_CHIPSET_IDS = ("0x43c6", "0x43c7", "0x43ee", "0x43f4", "0x43f5", "0x57a3", "0x57a4", "0x57ad")


def _finding(code, severity, device, message, fix, devices) -> dict[str, Any]:
    return {"code": code, "severity": severity, "device": device, "devices": list(devices), "message": message, "fix": fix}


def pcie_p2p_status(pair: dict) -> str | None:
    """NVML's PCIe P2P status of a pair: the first of read, write and pci (PCIe) that is not OK; OK when
    every reported one is; None when NVML reported none."""
    p2p = pair.get("p2p") or {}
    seen = [p2p.get(cap) for cap in ("read", "write", "pci") if p2p.get(cap) is not None]
    bad = [s for s in seen if s != "OK"]
    return bad[0] if bad else ("OK" if seen else None)


def find_nvml_p2p(model: dict) -> list[dict[str, Any]]:
    out = []
    for pair in model["pairs"]:
        if pair.get("nvlinks"):
            continue  # NVLink/NVSwitch pairs: PCIe P2P NOT_SUPPORTED is expected there
        status = pcie_p2p_status(pair)
        if status in (None, "OK"):
            continue
        why, fix = P2P_FIXES.get(status, P2P_FIXES["UNKNOWN"])
        out.append(_finding(
            "p2p_not_supported", "warning", pair["a"],
            f"NVML reports PCIe peer-to-peer between {pair['a']} and {pair['b']} ({pair['level']}) as {status}: {why}. "
            "Their all-reduce traffic is staged through host memory.", fix, [pair["a"], pair["b"]]))
    return out


def chipset_hop(devices: dict, path: list[str]) -> str | None:
    """The first hop of a path that is the chipset (PCH) rather than a CPU root port, or None."""
    for hop in path[:-1]:
        dev = devices.get(hop) or {}
        slot = hop.split(":")[-1].split(".")[0]
        if dev.get("vendor_id") == INTEL and hop.split(":")[1] == "00" and int(slot, 16) in PCH_DEVICE_NUMBERS:
            return hop
        if dev.get("vendor_id") == AMD and (dev.get("device_id") or "").lower() in AMD_CHIPSET_IDS:
            return hop
    return None


def find_groups(model: dict, tp_groups=None) -> list[dict[str, Any]]:
    """Tensor-parallel groups whose GPUs sit on different sockets, and GPUs behind the chipset.

    ``tp_groups``: lists of GPU BDFs; without them every GPU is judged for the chipset and no
    socket finding is made (pair_sys_level covers pairs across sockets)."""
    out = []
    gpus = {g["bdf"]: g for g in model["gpus"]}
    devices = model["devices"]
    groups = [[b for b in g if b in gpus] for g in (tp_groups or [])]
    for group in groups:
        nodes = sorted({gpus[b]["numa_node"] for b in group if gpus[b]["numa_node"] is not None and gpus[b]["numa_node"] >= 0})
        if len(nodes) > 1:
            per = "; ".join(f"node {n}: {', '.join(b for b in group if gpus[b]['numa_node'] == n)}" for n in nodes)
            out.append(_finding(
                "tp_group_spans_sockets", "warning", group[0],
                f"The tensor-parallel group {', '.join(group)} spans NUMA nodes {', '.join(map(str, nodes))} ({per}): every "
                "all-reduce crosses the inter-socket link, and P2P across sockets is rarely supported.",
                "Regroup so that each tensor-parallel group sits on one socket (CUDA_VISIBLE_DEVICES / vLLM placement); "
                "use pipeline parallelism across sockets.", group))
    judged = sorted({b for g in groups for b in g}) if groups else sorted(gpus)
    for bdf in judged:
        hop = chipset_hop(devices, gpus[bdf]["path"])
        if hop:
            out.append(_finding(
                "gpu_behind_chipset", "warning", bdf,
                f"{bdf} hangs off {hop}, a chipset (PCH) port, not CPU-attached lanes: its traffic shares the chipset's "
                "uplink (DMI or its AMD equivalent, x4-x8) with storage, USB and networking, and P2P with GPUs on CPU "
                "lanes is not supported.",
                "Move the card to a CPU-attached slot (the board manual marks which slots hang off the CPU); keep it out of "
                "tensor-parallel groups until then.", [bdf, hop]))
    return out

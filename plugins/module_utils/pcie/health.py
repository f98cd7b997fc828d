# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Health between changes: a host's audit compared with its previous audit, and GPU Xid errors.

Pure functions over two pcie_facts results (``pcie`` documents, as the audit role keeps them) and
the kernel log lines since the previous run. Each finding has the audit's shape (``code``,
``severity``, ``device``, ``devices``, ``message``, ``fix``), so it joins the fleet report:

* ``gpu_missing`` (critical): a GPU of the previous audit is not on the bus any more;
* ``link_degraded`` (critical) / ``link_changed`` (info): a device's current link speed or width
  is below (above) what the previous audit read;
* ``link_cap_reduced`` (critical) / ``link_cap_changed`` (info): what a device's link can do (LnkCap:
  its maximum speed or width) is below (above) the previous audit's: a BIOS bifurcation or speed
  setting, another slot, riser or retimer. The current link cannot train above it, and where the
  current link reads the same (a port whose link status is fixed, as in QEMU) this is the only sign;
* ``aer_new`` (warning; critical for fatal): AER counters that grew, or status bits newly set;
* ``irq_off_numa`` (warning): a GPU interrupt whose effective CPUs left the GPU's NUMA-local CPUs;
* ``cmdline_changed`` (warning) and ``kernel_changed`` (info);
* ``xid`` (critical for the Xids that mean a lost or broken GPU, warning otherwise), from NVRM lines.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.audit_report import _fmt_gts, _link, link_text

# Xids that mean the GPU or its link is gone or corrupt (NVIDIA's Xid catalogue).
XID_CRITICAL = {48: "double-bit ECC error", 62: "internal micro-controller halt", 63: "ECC page retirement failure",
                64: "ECC page retirement or row remap failure", 74: "NVLink error", 79: "GPU has fallen off the bus",
                92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
                119: "GSP RPC timeout", 120: "GSP error"}
XID_RE = re.compile(r"NVRM: Xid \(PCI:(?P<bdf>[0-9a-fA-F:.]+)\): (?P<xid>\d+),?(?P<rest>.*)")


def _finding(code: str, severity: str, device: str | None, message: str, fix: str,
             devices: Sequence[str] | None = None) -> dict[str, Any]:
    return {"code": code, "severity": severity, "device": device, "devices": list(devices or ([device] if device else [])),
            "message": message, "fix": fix, "source": "health"}


def parse_xids(lines: Sequence[str] | str) -> list[dict[str, Any]]:
    """NVRM Xid lines of a kernel log -> [{bdf, xid, text, line}]."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    out = []
    for line in lines:
        m = XID_RE.search(line)
        if m:
            bdf = m.group("bdf").lower()
            if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}", bdf):  # NVRM prints domain:bus:device
                bdf += ".0"
            out.append({"bdf": bdf, "xid": int(m.group("xid")), "text": m.group("rest").strip(" ,"), "line": line.strip()})
    return out


def _cpus(text: str | None) -> set[int]:
    out: set[int] = set()
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            if a.isdigit() and b.isdigit():
                out.update(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.add(int(part))
    return out


def _irqs_off_node(dev: dict[str, Any]) -> set[int]:
    local = _cpus(dev.get("local_cpulist"))
    if not local:
        return set()
    off = set()
    for irq in dev.get("irqs") or []:
        eff = _cpus(irq.get("effective_affinity_list") or irq.get("smp_affinity_list"))
        if eff and not eff <= local:
            off.add(int(irq["irq"]))
    return off


def _aer_total(dev: dict[str, Any]) -> dict[str, int]:
    out = {}
    for kind, counters in (dev.get("aer_counters") or {}).items():
        for name, value in (counters or {}).items():
            if not name.startswith("TOTAL_"):
                out[f"{kind}.{name}"] = int(value)
    return out


def _aer_bits(dev: dict[str, Any]) -> set[str]:
    aer = ((dev.get("config") or {}).get("aer")) or {}
    return {f"uncorrectable.{b}" for b in aer.get("uncorrectable") or []} | \
        {f"correctable.{b}" for b in aer.get("correctable") or []}


def _speed(link: dict[str, Any] | None) -> tuple[float, int]:
    return (float((link or {}).get("cur_gts") or 0), int((link or {}).get("cur_width") or 0))


def _cap(link: dict[str, Any] | None) -> tuple[float, int]:
    return (float((link or {}).get("max_gts") or 0), int((link or {}).get("max_width") or 0))


def _cap_text(cap: tuple[float, int]) -> str:
    return f"{_fmt_gts(cap[0])} x{cap[1] or '?'}"


def _cap_finding(bdf: str, role: str, old: tuple[float, int], new: tuple[float, int]) -> dict[str, Any]:
    lower = new[0] < old[0] or new[1] < old[1]
    return _finding(
        "link_cap_reduced" if lower else "link_cap_changed", "critical" if lower else "info", bdf,
        f"{role} {bdf} link capability is {_cap_text(new)} now, was {_cap_text(old)} at the previous audit"
        + (": nothing below it can train faster or wider" if lower else ""),
        "A port or card that offers less than before: the BIOS's PCIe bifurcation or link-speed setting changed, "
        "the card moved to another slot, or a riser, cable or retimer was swapped. Compare lspci -vv LnkCap of the "
        "port with the previous audit (reports/health), restore the BIOS slot setting (x16, the slot's Gen) or move "
        "the card back, and run health.yml again." if lower else
        "The link can do more than before (a BIOS change, another slot or riser): check that the current link "
        "follows (the audit's link_below_capability) and re-benchmark to refresh the baseline.")


def compare(previous: dict[str, Any] | None, current: dict[str, Any], kernel_log: Sequence[str] | str = (),
            previous_kernel: str | None = None, current_kernel: str | None = None) -> list[dict[str, Any]]:
    """Findings of ``current`` against ``previous`` (pcie_facts ``pcie`` documents) and the log since then, the most
    severe first."""
    findings = _xid_findings(kernel_log)
    if previous:
        findings += _gpu_set_findings(previous, current)
        prev_devs, cur_devs = previous.get("devices") or {}, current.get("devices") or {}
        cur_gpus = {g["bdf"] for g in current.get("gpus") or []}
        for bdf in sorted(set(prev_devs) & set(cur_devs)):
            findings += _device_findings(bdf, prev_devs[bdf], cur_devs[bdf], bdf in cur_gpus)
        findings += _host_findings(previous, current, previous_kernel, current_kernel)
    order = {"critical": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: order.get(f["severity"], 3))


def _xid_findings(kernel_log: Sequence[str] | str) -> list[dict[str, Any]]:
    """A finding for each Xid event in the kernel log: critical for the Xids of XID_CRITICAL."""
    findings = []
    for x in parse_xids(kernel_log):
        name = XID_CRITICAL.get(x["xid"])
        sev = "critical" if name else "warning"
        findings.append(_finding(
            "xid", sev, x["bdf"], f"GPU {x['bdf']} reported Xid {x['xid']}" + (f" ({name})" if name else "")
            + f" since the last health check: {x['text'] or x['line']}",
            "Look the Xid up in NVIDIA's Xid catalogue; for 79 (fallen off the bus) reseat or replace the card and check "
            "its slot's link and power; for ECC Xids drain the host and run the vendor's diagnostics (nvidia-smi -q -d "
            "ECC, dcgmi diag -r 3); a repeat on one GPU means an RMA."))
    return findings


def _gpu_set_findings(previous: dict[str, Any], current: dict[str, Any]) -> list[dict[str, Any]]:
    """GPUs gone from the bus, and GPUs new on it, since the previous audit."""
    findings = []
    prev_devs, cur_devs = previous.get("devices") or {}, current.get("devices") or {}
    prev_gpus = {g["bdf"] for g in previous.get("gpus") or []}
    cur_gpus = {g["bdf"] for g in current.get("gpus") or []}
    for bdf in sorted(prev_gpus - cur_gpus):
        old = prev_devs.get(bdf) or {}
        findings.append(_finding(
            "gpu_missing", "critical", bdf,
            f"GPU {bdf} ({old.get('device_name') or old.get('device_id') or '?'}) was in the previous audit but is not "
            "on the PCI bus now" + (" (nor in sysfs at all)" if bdf not in cur_devs else f" (now {cur_devs[bdf].get('driver')})"),
            "Read the kernel log for the moment it went (Xid 79, AER fatal errors, pciehp link down); reseat the card "
            "or replace the riser, and check its power cables; a rescan (echo 1 > /sys/bus/pci/rescan) only helps "
            "after a hot-reset recovery."))
    for bdf in sorted(cur_gpus - prev_gpus):
        findings.append(_finding("gpu_new", "info", bdf, f"GPU {bdf} is new since the previous audit",
                                 "Nothing to do if it was installed on purpose; tune it (site.yml) and re-benchmark."))
    return findings


def _device_findings(bdf: str, old: dict[str, Any], new: dict[str, Any], gpu: bool) -> list[dict[str, Any]]:
    """One device seen by both audits: its link speed or capability changed, new AER errors, (a GPU's) IRQs moved."""
    findings = []
    lo, ln = _link(old), _link(new)
    role = "GPU" if gpu else "device"
    if lo and ln and _speed(lo) != _speed(ln):
        worse = _speed(ln)[0] < _speed(lo)[0] or _speed(ln)[1] < _speed(lo)[1]
        findings.append(_finding(
            "link_degraded" if worse else "link_changed", "critical" if worse else "info", bdf,
            f"{role} {bdf} link is {link_text(ln)} now, was {link_text(lo)} at the previous audit",
            "A link that trained lower than before points at the slot, riser or cable (or a BIOS setting): reseat "
            "the card, check the slot's lane setting in the BIOS, and compare with lspci -vv LnkSta; the audit's "
            "link_below_capability finding says how far below capability it is." if worse else
            "The link trained faster or wider than before (a reseat or BIOS change); re-benchmark to refresh the "
            "baseline."))
    cap_old, cap_new = _cap(lo), _cap(ln)
    if lo and ln and all(cap_old) and all(cap_new) and cap_old != cap_new:
        findings.append(_cap_finding(bdf, role, cap_old, cap_new))
    grown = {k: v - _aer_total(old).get(k, 0) for k, v in _aer_total(new).items() if v > _aer_total(old).get(k, 0)}
    bits = sorted(_aer_bits(new) - _aer_bits(old))
    if grown or bits:
        fatal = any(k.startswith("fatal.") for k in grown) or any(b.startswith("uncorrectable.") for b in bits)
        what = ", ".join([f"{k} +{v}" for k, v in sorted(grown.items())] + bits)
        findings.append(_finding(
            "aer_new", "critical" if fatal else "warning", bdf, f"{bdf} logged new AER errors since the previous "
            f"audit: {what}",
            "Correctable errors that keep growing (BadTLP, BadDLLP, Rollover, Timeout) mean a marginal link: reseat, "
            "check the riser and cable, try a lower link speed in the BIOS to confirm; uncorrectable or fatal errors "
            "need the card or slot replaced."))
    newly_off = sorted(_irqs_off_node(new) - _irqs_off_node(old)) if gpu else []
    if newly_off:
        findings.append(_finding(
            "irq_off_numa", "warning", bdf, f"GPU {bdf} interrupts {', '.join(map(str, newly_off))} moved off its "
            f"NUMA node's CPUs ({new.get('local_cpulist')}) since the previous audit",
            "irqbalance or a tool moved them: run the irq_affinity role again (its reapply timer keeps them), or "
            "set irq_affinity_irqbalance: policyscript so irqbalance leaves GPU interrupts alone."))
    return findings


def _host_findings(previous: dict[str, Any], current: dict[str, Any], previous_kernel: str | None,
                   current_kernel: str | None) -> list[dict[str, Any]]:
    """The kernel command line or the kernel changed since the previous audit."""
    findings = []
    if (previous.get("cmdline") or "") != (current.get("cmdline") or "") and previous.get("cmdline") is not None:
        a, b = set((previous.get("cmdline") or "").split()), set((current.get("cmdline") or "").split())
        changes = [f"-{t}" for t in sorted(a - b)] + [f"+{t}" for t in sorted(b - a)]
        findings.append(_finding(
            "cmdline_changed", "warning", None, "The kernel command line changed since the previous audit: "
            + " ".join(changes),
            "If nobody meant to change it (a kernel package's postinst, a hand edit of /etc/default/grub), run "
            "site.yml again: kernel_cmdline owns the collection's arguments and the reboot contract applies them."))
    if previous_kernel and current_kernel and previous_kernel != current_kernel:
        findings.append(_finding("kernel_changed", "info", None,
                                 f"The kernel is {current_kernel} now, was {previous_kernel}",
                                 "Compare the short benchmark with the history report; a drop after a kernel change "
                                 "is what playbooks/kernel_upgrade.yml's gate is for."))
    return findings


# The findings that make a change unstable (issue 33, "stability in the verdict"): the path to a GPU got worse while
# the change was in force. A faster link, a moved IRQ, a changed command line or kernel are not instability: the
# first is good news, the others are what a change under test is expected to do.
UNSTABLE_CODES = ("gpu_missing", "link_degraded", "link_cap_reduced", "aer_new", "xid")


def stability(before: dict[str, Any] | None, after: dict[str, Any] | None, kernel_log: Sequence[str] | str = (),
              requests: dict[str, Any] | None = None, gpu_findings: Sequence[dict[str, Any]] | None = None
              ) -> dict[str, Any]:
    """The stability part of the serving verdict: ``stable``, ``unstable`` or ``not measured``.

    ``before``/``after``: the audit's ``pcie`` documents taken before the change and with it in force; ``kernel_log``:
    the kernel log lines since ``before``; ``requests``: each side's failed and sent requests
    (``{"baseline": {"failed": F, "requests": N}, "candidate": {...}}``). Unstable when compare() finds one of
    UNSTABLE_CODES, or when the candidate failed a larger share of its requests than the baseline. Without an audit
    on either side the host part is ``not measured``; the request part still counts. ``gpu_findings``: the GPU health
    read with the change in force (gpu_health's ``unstable`` findings, gpu/checks.py's unstable()): each one makes the
    change unstable (a list, even empty, counts as the ``gpu`` part measured; None: not measured)."""
    reasons: list[str] = []
    findings: list[dict[str, Any]] = []
    measured = []
    if before and after:
        measured.append("host")
        findings = [f for f in compare(before, after, kernel_log) if f["code"] in UNSTABLE_CODES]
        reasons += [f["message"] for f in findings]
    if gpu_findings is not None:
        measured.append("gpu")
        findings += list(gpu_findings)
        reasons += [str(f.get("message", f.get("code"))) for f in gpu_findings]
    rates = _failure_rates(requests)
    if rates:
        measured.append("requests")
        if rates[1] > rates[0]:
            reasons.append(f"the candidate failed {rates[1]:.1%} of its requests, the baseline {rates[0]:.1%}")
    if not measured:
        return {"status": "not measured", "findings": [],
                "reason": "no audit before and after the change, no GPU health, no request counts"}
    status = "unstable" if reasons else "stable"
    reason = "; ".join(reasons) if reasons else f"nothing got worse ({' and '.join(measured)} checked)"
    return {"status": status, "findings": findings, "measured": measured, "reason": reason}


def _failure_rates(requests: dict[str, Any] | None) -> tuple[float, float] | None:
    """(baseline, candidate) failed share of requests; None when either side's counts are missing. Counts must be
    whole numbers with 0 <= failed <= requests: anything else is a ValueError naming the side."""
    if not requests or not requests.get("baseline") or not requests.get("candidate"):
        return None
    out = []
    for side in ("baseline", "candidate"):
        failed, sent = requests[side].get("failed"), requests[side].get("requests")
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (failed, sent)) and 0 <= failed <= sent
        if not ok:
            raise ValueError(f"{side} request counts must be whole numbers with 0 <= failed <= requests, got "
                             f"failed={failed!r}, requests={sent!r}")
        out.append(failed / sent if sent else 0.0)
    return out[0], out[1]

"""The audit in the lab VMs agrees with each VM's own `lspci -vv` and sysfs, for every hop of
every GPU path, and flags what the lab's topology holds: links below capability (QEMU trains
every link at 2.5GT/s x1 under root ports of 8-16GT/s) and the GPUs behind the switch sharing
one IOMMU group. `lspci` text is parsed here as the independent oracle; the module itself
decodes config space and never reads lspci.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.lab.labutil import ansible_env, lab_ssh, run

pytestmark = pytest.mark.vmlab


_DEV = re.compile(r"^([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ")
_SPEED = re.compile(r"Speed ([0-9.]+)GT/s|Speed unknown")
_WIDTH = re.compile(r"Width x(\d+)")
_CAP = re.compile(r"^Capabilities: \[([0-9a-f]+)(?: v\d+)?\] (.*)$")
_EXPRESS = re.compile(r"^Express \(v(\d+)\) (.+?)(?: \(Slot[+-]\))?, (?:MSI|IntMsgNum) ")
# lspci's names -> pci_config's (port types, ASPM states, ACS and AER bits)
LSPCI_PORT_TYPES = {"Endpoint": "endpoint", "Legacy Endpoint": "legacy_endpoint", "Root Port": "root_port",
                    "Upstream Port": "upstream_port", "Downstream Port": "downstream_port",
                    "PCI-Express to PCI/PCI-X Bridge": "pcie_to_pci_bridge", "PCI/PCI-X to PCI-Express Bridge": "pci_to_pcie_bridge",
                    "Root Complex Integrated Endpoint": "rc_integrated_endpoint", "Root Complex Event Collector": "rc_event_collector"}
LSPCI_ACS = {"SrcValid": "SV", "TransBlk": "TB", "ReqRedir": "RR", "CmpltRedir": "CR", "UpstreamFwd": "UF",
             "EgressCtrl": "EC", "DirectTrans": "DT"}
LSPCI_AER_UNCOR = {"DLP": "DLP", "SDES": "SDES", "TLP": "PoisonedTLP", "FCP": "FCP", "CmpltTO": "CmpltTO",
                   "CmpltAbrt": "CmpltAbrt", "UnxCmplt": "UnxCmplt", "RxOF": "RxOF", "MalfTLP": "MalfTLP", "ECRC": "ECRC",
                   "UnsupReq": "UnsupReq", "ACSViol": "ACSViol", "UncorrIntErr": "UncorrIntErr", "BlockedTLP": "BlockedTLP",
                   "AtomicOpBlocked": "AtomicOpBlocked", "TLPBlockedErr": "TLPPrefixBlocked", "PoisonTLPBlocked": "PoisonTLPBlocked"}
LSPCI_AER_COR = {"RxErr": "RxErr", "BadTLP": "BadTLP", "BadDLLP": "BadDLLP", "Rollover": "Rollover", "Timeout": "Timeout",
                 "AdvNonFatalErr": "AdvNonFatalErr", "CorrIntErr": "CorrIntErr", "HeaderOF": "HeaderOF"}


NO_LINK = ("rc_integrated_endpoint", "rc_event_collector")


def _flags(text: str, table: dict) -> dict[str, bool]:
    """``SrcValid+ TransBlk-`` -> {SV: True, TB: False} for the names in ``table``."""
    return {table[m.group(1)]: m.group(2) == "+" for m in re.finditer(r"([A-Za-z]+)([+-])", text) if m.group(1) in table}


def parse_lspci_vv(text: str) -> dict[str, dict]:
    """Per device, from ``lspci -vv`` (or ``-vvv``) text: LnkCap/LnkSta speed+width, DevCap MPS,
    DevCtl MPS/MRRS, MSI-X count/enable; and where lspci shows them: the standard and extended
    capability offsets in list order, the PCIe port type and version, LnkCap ASPM support,
    LnkCtl ASPM, LnkCtl2 target speed, MSI, ACSCap/ACSCtl bits, AER UESta/CESta bits set."""
    out: dict[str, dict] = {}
    cur: dict | None = None
    devctl = False
    for line in text.splitlines():
        m = _DEV.match(line)
        if m:
            cur = out.setdefault(m.group(1), {})
            devctl = False
            continue
        if cur is None:
            continue
        s = line.strip()
        cap = _CAP.match(s)
        if cap:
            off, what = int(cap.group(1), 16), cap.group(2)
            if what.startswith("<chain"):
                cur["chain_end"] = what
                continue
            cur.setdefault("ext_caps" if off >= 0x100 else "caps", []).append(off)
            ex = _EXPRESS.match(what)
            if ex:
                cur["pcie_version"], cur["port_type"] = int(ex.group(1)), LSPCI_PORT_TYPES.get(ex.group(2), ex.group(2))
            m4 = re.match(r"MSI: Enable([+-]) Count=(\d+)/(\d+)", what)
            if m4:
                cur["msi"] = {"enabled": m4.group(1) == "+", "vectors_enabled": int(m4.group(2)),
                              "vectors_capable": int(m4.group(3))}
        if s.startswith(("LnkCap:", "LnkSta:")):
            key = "link_cap" if s.startswith("LnkCap:") else "link_sta"
            sp, wd = _SPEED.search(s), _WIDTH.search(s)
            cur[key] = {"speed_gts": float(sp.group(1)) if sp and sp.group(1) else None,
                        "width": int(wd.group(1)) if wd else None}
            if key == "link_cap":
                asp = re.search(r"ASPM (not supported|L0s L1|L0s|L1)", s)
                if asp:
                    cur["aspm_support"] = "disabled" if asp.group(1) == "not supported" else asp.group(1)
        elif s.startswith("LnkCtl:"):
            asp = re.search(r"ASPM (Disabled|L0s L1 Enabled|L0s Enabled|L1 Enabled)", s)
            if asp:
                cur["aspm"] = "disabled" if asp.group(1) == "Disabled" else asp.group(1).replace(" Enabled", "")
        elif s.startswith("LnkCtl2:"):
            t = re.search(r"Target Link Speed: ([0-9.]+)GT/s", s)
            cur["target_gts"] = float(t.group(1)) if t else None
        elif s.startswith(("ACSCap:", "ACSCtl:")):
            cur["acs_cap" if s.startswith("ACSCap:") else "acs_ctrl"] = _flags(s, LSPCI_ACS)
        elif s.startswith("UESta:"):
            cur["aer_uncorrectable"] = sorted(k for k, v in _flags(s, LSPCI_AER_UNCOR).items() if v)
        elif s.startswith("CESta:"):
            cur["aer_correctable"] = sorted(k for k, v in _flags(s, LSPCI_AER_COR).items() if v)
        elif s.startswith("DevCap:"):
            cur["mps_supported"] = int(re.search(r"MaxPayload (\d+) bytes", s).group(1))
        elif s.startswith("DevCtl:"):
            devctl = True
        elif devctl and s.startswith("MaxPayload"):
            m2 = re.match(r"MaxPayload (\d+) bytes, MaxReadReq (\d+) bytes", s)
            cur["mps"], cur["mrrs"] = int(m2.group(1)), int(m2.group(2))
            devctl = False
        elif "MSI-X: Enable" in s:
            m3 = re.search(r"MSI-X: Enable([+-]) Count=(\d+)", s)
            cur["msix"] = {"enabled": m3.group(1) == "+", "table_size": int(m3.group(2))}
    return out


def test_lspci_parser_reads_a_real_capture() -> None:
    sample = """0000:04:00.0 PCI bridge: Texas Instruments XIO3130 PCI Express Switch (Downstream) (rev 01)
\tCapabilities: [90] Express (v2) Downstream Port (Slot+), MSI 00
\t\tDevCap:\tMaxPayload 128 bytes, PhantFunc 0
\t\tDevCtl:\tCorrErr+ NonFatalErr+ FatalErr+ UnsupReq+
\t\t\tMaxPayload 128 bytes, MaxReadReq 512 bytes
\t\tLnkCap:\tPort #0, Speed unknown, Width x0, ASPM L0s, Exit Latency L0s <64ns
\t\tLnkSta:\tSpeed 2.5GT/s (overdriven), Width x1 (overdriven)
\tCapabilities: [48] MSI-X: Enable+ Count=1 Masked-
"""
    dev = parse_lspci_vv(sample)["0000:04:00.0"]
    assert dev == {"mps_supported": 128, "mps": 128, "mrrs": 512,
                   "link_cap": {"speed_gts": None, "width": 0}, "link_sta": {"speed_gts": 2.5, "width": 1},
                   "msix": {"enabled": True, "table_size": 1}, "caps": [0x90, 0x48], "pcie_version": 2,
                   "port_type": "downstream_port", "aspm_support": "L0s"}


def _ssh(name: str, cmd: str) -> str:
    return lab_ssh(name, cmd, timeout=120)


@pytest.fixture(scope="module")
def audits(lab_vms: list[str], tmp_path_factory) -> dict[str, dict]:
    """playbooks/audit.yml over the lab, for real; returns each host's JSON."""
    report_dir = tmp_path_factory.mktemp("audit")
    r = run(["ansible-playbook", "-i", "inventories/lab", "playbooks/audit.yml",
             "-e", f"gpufleet_report_dir={report_dir}"], timeout=900, env=ansible_env())
    assert r.returncode == 0, f"audit.yml failed:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
    out = {}
    for name in lab_vms:
        with open(report_dir / f"{name}.json", encoding="utf-8") as fh:
            out[name] = json.load(fh)
    assert (report_dir / "fleet.md").read_text().count("| lab") >= len(lab_vms)
    assert "<table>" in (report_dir / "fleet.html").read_text()
    return out


def assert_config_matches_lspci(where: str, dev: dict, ref: dict) -> None:
    """One audited function's decoded config space against its parse_lspci_vv() entry: link
    capability and status, MaxPayload supported and set, MaxReadReq, MSI-X; and, for every field
    the lspci text shows, the capability lists, port type, ASPM support and control, target link
    speed, MSI, ACS capability and control bits, AER status bits."""
    config = dev["config"]
    cfg = config["pcie"]
    if cfg is not None or "mps" in ref:
        assert cfg is not None, f"{where}: lspci shows a PCI Express capability"
        # lspci shows no link registers for root complex integrated endpoints and event collectors
        for key in ("link_cap", "link_sta") if "link_cap" in ref or cfg["port_type"] not in NO_LINK else ():
            assert {"speed_gts": cfg[key]["speed_gts"], "width": cfg[key]["width"]} == ref[key], f"{where} {key}"
        assert (cfg["mps_supported"], cfg["mps"], cfg["mrrs"]) == (ref["mps_supported"], ref["mps"], ref["mrrs"]), \
            f"{where} MPS/MRRS"
    msix = config["msix"]
    if "msix" in ref:
        assert {"enabled": msix["enabled"], "table_size": msix["table_size"]} == ref["msix"], f"{where} MSI-X"
    else:
        assert msix is None, f"{where}: lspci shows no MSI-X"
    if "caps" in ref or "ext_caps" in ref or "chain_end" in ref:  # lspci -vv lists every capability it walks
        assert [c["offset"] for c in config["capabilities"]] == ref.get("caps", []), f"{where} capability list"
        assert [c["offset"] for c in config["extended_capabilities"]] == ref.get("ext_caps", []), \
            f"{where} extended capability list"
    if "port_type" in ref:
        assert (cfg["port_type"], cfg["version"]) == (ref["port_type"], ref["pcie_version"]), f"{where} port type"
    if "aspm_support" in ref:
        assert cfg["link_cap"]["aspm_support"] == ref["aspm_support"], f"{where} LnkCap ASPM"
    if "aspm" in ref:
        assert cfg["link_ctl"]["aspm"] == ref["aspm"], f"{where} LnkCtl ASPM"
    if "target_gts" in ref:
        assert (cfg.get("link_ctl2") or {}).get("target", {}).get("speed_gts") == ref["target_gts"], f"{where} target speed"
    if "msi" in ref:
        msi = config["msi"]
        assert {k: msi[k] for k in ("enabled", "vectors_enabled", "vectors_capable")} == ref["msi"], f"{where} MSI"
    if "acs_cap" in ref:
        acs = config["acs"]
        assert (acs["cap"], acs["ctrl"]) == (ref["acs_cap"], ref["acs_ctrl"]), f"{where} ACS"
    elif "caps" in ref:
        assert config["acs"] is None, f"{where}: lspci shows no ACS"
    if "aer_uncorrectable" in ref:
        aer = config["aer"]
        assert sorted(aer["uncorrectable"]) == ref["aer_uncorrectable"], f"{where} AER UESta"
        assert sorted(aer["correctable"]) == ref["aer_correctable"], f"{where} AER CESta"
    elif "caps" in ref:
        assert config["aer"] is None, f"{where}: lspci shows no AER"


def test_audit_agrees_with_lspci_and_sysfs(lab_vms: list[str], audits: dict[str, dict]) -> None:
    for name in lab_vms:
        pcie = audits[name]["pcie"]
        lspci = parse_lspci_vv(_ssh(name, "lspci -vv -D"))
        gpus = {g["bdf"] for g in pcie["gpus"]}
        assert gpus == {"0000:01:00.0", "0000:05:00.0", "0000:06:00.0"}, f"{name}: GPUs found {sorted(gpus)}"
        hops = set(pcie["devices"])
        # every hop of the three paths: rp1, rp3 + switch up/down ports, and the GPUs
        assert {"0000:00:04.0", "0000:00:06.0", "0000:03:00.0", "0000:04:00.0", "0000:04:01.0"} <= hops
        for bdf, dev in pcie["devices"].items():
            assert_config_matches_lspci(f"{name} {bdf}", dev, lspci[bdf])
            sysfs = f"/sys/bus/pci/devices/{bdf}"
            group = _ssh(name, f"basename $(readlink {sysfs}/iommu_group)").strip()
            assert str(dev["iommu_group"]) == group, f"{name} {bdf} IOMMU group"
            members = set(_ssh(name, f"ls /sys/kernel/iommu_groups/{group}/devices").split())
            assert {m["bdf"] for m in dev["iommu_group_members"]} == members, f"{name} {bdf} group members"
            irqs = set(_ssh(name, f"ls {sysfs}/msi_irqs 2>/dev/null || true").split())
            assert {str(i["irq"]) for i in dev["irqs"]} == irqs, f"{name} {bdf} MSI vectors"


def test_audit_flags_the_lab_topology(lab_vms: list[str], audits: dict[str, dict]) -> None:
    """The lab's links below capability: rp1 and rp3 (LnkCap 16GT/s x16) run at 2.5GT/s x1, their
    LnkSta below their LnkCap, because the device below each can do no more: flagged as
    device-limited (info), not as degraded. QEMU's switch downstream ports report no link
    capability at all (LnkCap "Speed unknown, Width x0"): said as such, never as a link capped at
    nothing. And the two GPU stand-ins behind the switch share one IOMMU group."""
    for name in lab_vms:
        pcie = audits[name]["pcie"]
        codes: dict[str, set] = {}
        for f in pcie["findings"]:
            codes.setdefault(f["code"], set()).update(f.get("devices") or [f.get("device")])
        limited = {tuple(f["devices"]) for f in pcie["findings"] if f["code"] == "link_limited_by_device"}
        assert {("0000:00:04.0", "0000:01:00.0"), ("0000:00:06.0", "0000:03:00.0")} <= limited, \
            f"{name}: root ports running below their capability not flagged: {sorted(codes)}"
        assert {"0000:04:00.0", "0000:04:01.0"} <= codes.get("link_cap_unknown", set()), sorted(codes)
        assert "link_capped" not in codes, f"{name}: a port without LnkCap taken for a cap: {codes['link_capped']}"
        assert "iommu_group_shared" in codes, f"{name}: shared IOMMU group not flagged: {sorted(codes)}"
        assert {"0000:05:00.0", "0000:06:00.0"} <= codes["iommu_group_shared"]
        pair = next(p for p in pcie["pairs"] if {p["a"], p["b"]} == {"0000:05:00.0", "0000:06:00.0"})
        assert pair["level"] == "PIX", pair  # one switch between them, as nvidia-smi topo -m says

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pciutils' `lspci -vv` text as the independent oracle of the config-space decoder: a parser of
its output and the field-by-field comparison with what pcie_facts decodes. Shared by the unit tests
(`lspci -F <dump>` on captures and synthetic dumps) and the VM lab's audit test (lspci in the VMs)."""

from __future__ import annotations

import re


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

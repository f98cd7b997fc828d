# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The PCIe audit of gpufleet.inference.pcie_facts: targets, the topology model, NVML, the optional
copy-bandwidth probe and the findings, gathered through a HostFS (``gather``). The probe runs in
another interpreter (one that may hold PyTorch or CuPy) through a ``run(argv, environ_update)``, in a module run
the Host's HostCmd.run (``execute``); nothing here imports AnsibleModule.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys

from ansible_collections.gpufleet.inference.plugins.module_utils.lint import host_lint
from ansible_collections.gpufleet.inference.plugins.module_utils._host import managed_files
from ansible_collections.gpufleet.inference.plugins.module_utils._pci import users as pcie_users
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.nvml import (
    HAS_PYNVML, PYNVML_IMPORT_ERROR, NvmlUnavailable, collect as nvml_collect, merge as nvml_merge,
)
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.config import link_bandwidth_gbps
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import (
    BMC_VENDORS, PciWalker, TopologyError, build_model, normalize_bdf, select_targets,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.findings import (
    SEVERITIES, find, judge_under_load, path_links, privilege_hint, summary)


NVIDIA = "0x10de"


# Runs in the probe interpreter (which may hold PyTorch or CuPy but not Ansible): stdlib only,
# prints one JSON line. argv[1] is {"size_mb", "repeats", "bdfs"}. While the pinned copies run, the GPU's link
# (sysfs current_link_speed/width) is read after each copy: its state under load, in "link_samples".
PROBE_SCRIPT = r'''
import json, sys, time
args = json.loads(sys.argv[1])
size, reps, wanted = int(args["size_mb"]) << 20, int(args["repeats"]), set(args["bdfs"])


def link(bdf):
    base = "/sys/bus/pci/devices/%s/" % bdf
    try:
        with open(base + "current_link_speed") as fh:
            speed = float(fh.read().split()[0])
        with open(base + "current_link_width") as fh:
            width = int(fh.read().split()[0])
        return [speed, width]
    except (OSError, ValueError, IndexError):
        return None


def rate(copy, sync, samples=None, bdf=None):
    copy()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        copy()
        sync()
        times.append(time.perf_counter() - t0)
        state = link(bdf) if samples is not None else None
        if state:
            samples.append(state)
    return round(size / sorted(times)[len(times) // 2] / 1e9, 2)


def with_torch():
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("torch %s sees no CUDA device" % torch.__version__)
    out = {}
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        bdf = "%04x:%02x:%02x.0" % (p.pci_domain_id, p.pci_bus_id, p.pci_device_id)
        if bdf not in wanted:
            continue
        with torch.cuda.device(i):
            dev = torch.empty(size, dtype=torch.uint8, device="cuda")
            pinned = torch.ones(size, dtype=torch.uint8).pin_memory()
            pageable = torch.ones(size, dtype=torch.uint8)
            sync = torch.cuda.synchronize
            samples = []
            out[bdf] = {"h2d_pinned_gbps": rate(lambda: dev.copy_(pinned, non_blocking=True), sync, samples, bdf),
                        "d2h_pinned_gbps": rate(lambda: pinned.copy_(dev, non_blocking=True), sync, samples, bdf),
                        "h2d_pageable_gbps": rate(lambda: dev.copy_(pageable), sync),
                        "d2h_pageable_gbps": rate(lambda: pageable.copy_(dev), sync), "link_samples": samples}
            del dev, pinned, pageable
            torch.cuda.empty_cache()
    return "torch " + torch.__version__, out


def with_cupy():
    import cupy
    import numpy
    out = {}
    for i in range(cupy.cuda.runtime.getDeviceCount()):
        dom, bus, rest = cupy.cuda.runtime.deviceGetPCIBusId(i).lower().split(":")
        bdf = "%04x:%s:%s" % (int(dom, 16), bus, rest)
        if bdf not in wanted:
            continue
        with cupy.cuda.Device(i):
            dev = cupy.empty(size, dtype=cupy.uint8)
            mem = cupy.cuda.alloc_pinned_memory(size)
            pinned = numpy.frombuffer(mem, dtype=numpy.uint8, count=size)
            pinned[:] = 1
            pageable = numpy.ones(size, dtype=numpy.uint8)
            sync = cupy.cuda.runtime.deviceSynchronize
            samples = []
            out[bdf] = {"h2d_pinned_gbps": rate(lambda: dev.set(pinned), sync, samples, bdf),
                        "d2h_pinned_gbps": rate(lambda: dev.get(out=pinned), sync, samples, bdf),
                        "h2d_pageable_gbps": rate(lambda: dev.set(pageable), sync),
                        "d2h_pageable_gbps": rate(lambda: dev.get(out=pageable), sync), "link_samples": samples}
            del dev, mem, pinned, pageable
    return "cupy " + cupy.__version__, out


def main():
    errors = []
    for probe in (with_torch, with_cupy):
        try:
            backend, gpus = probe()
        except Exception as err:
            errors.append("%s: %s: %s" % (probe.__name__[5:], type(err).__name__, err))
            continue
        return {"backend": backend, "gpus": gpus, "error": None if gpus else "no CUDA device matches %s" % sorted(wanted)}
    return {"backend": None, "gpus": {}, "error": "; ".join(errors)}


print(json.dumps(main()))
'''


def path_bandwidth(model: dict, bdf: str) -> float | None:
    """The slowest link's theoretical GB/s on the path, from both ends' capabilities."""
    rates = []
    for link in path_links(model, bdf):
        pcap = link["partner_cap"] or {}
        speeds = [s for s in (link["cap"]["speed_gts"], pcap.get("speed_gts")) if s]
        widths = [w for w in (link["cap"]["width"], pcap.get("width")) if w]
        rate = link_bandwidth_gbps(min(speeds), min(widths)) if speeds and widths else None
        if rate:
            rates.append(rate)
    return min(rates) if rates else None


def bandwidth(model: dict, params: dict, run) -> dict:
    """Run the copy probe through ``run(argv, environ_update) -> (rc, out, err)`` and score it."""
    python = params["probe_python"] or sys.executable
    bdfs = [g["bdf"] for g in model["gpus"] if model["devices"][g["bdf"]]["vendor_id"] == NVIDIA]
    result = {"backend": None, "python": python, "size_mb": params["probe_size_mb"], "gpus": {}, "error": None}
    if not bdfs:
        result["error"] = "no NVIDIA GPU among the targets"
        return result
    if model["root"] != "/":
        result["error"] = f"the probe measures the live host, not the tree under root {model['root']}"
        return result
    if run is None:
        result["error"] = "no command runner was given to run the probe"
        return result
    args = json.dumps({"size_mb": params["probe_size_mb"], "repeats": 5, "bdfs": bdfs})
    rc, out, err = run([python, "-c", PROBE_SCRIPT, args], {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    lines = [ln for ln in (out or "").splitlines() if ln.startswith("{")]
    try:
        data = json.loads(lines[-1])
    except (IndexError, ValueError):
        result["error"] = f"probe with {python} exited {rc} without a result: {(err or out or '').strip()[-400:]}"
        return result
    result.update(backend=data.get("backend"), error=data.get("error"))
    for bdf, rates in (data.get("gpus") or {}).items():
        theory = path_bandwidth(model, bdf)
        rates = dict(rates)
        samples = rates.pop("link_samples", None)
        entry = dict(rates, theoretical_gbps=theory)
        for key, value in rates.items():
            entry[key.replace("_gbps", "_pct")] = round(100.0 * value / theory, 1) if theory and value else None
        if samples is not None:
            entry["link_samples"] = samples
        result["gpus"][bdf] = entry
    return result


def serving(fs: HostFS, bdfs: list[str]) -> list[str]:
    """Which processes hold the GPUs now (_pci/users.py's lines), empty when none does: the audit wakes a GPU with
    the copy probe only on a host that is not serving."""
    if fs.root != "/" or not bdfs:
        return []
    return pcie_users.users(PciWalker(fs), bdfs)["lines"]


def reread_under_load(model: dict, findings: list[dict]) -> list[dict]:
    """Each GPU's ``link_below_capability`` judged again with the link read during the copy probe (the GPU woken
    by the load): an idle downclock, a link that stays down, or one that changes under load (pcie/findings.py)."""
    gpus = ((model.get("bandwidth") or {}).get("gpus")) or {}
    out = []
    for finding in findings:
        samples = (gpus.get(finding["device"]) or {}).get("link_samples") if finding["code"] == "link_below_capability" else None
        link = next((lk for lk in path_links(model, finding["device"]) if lk["device"] == finding["device"]), None) if samples else None
        if link:
            pcap = link["partner_cap"] or {}
            cap = {"speed_gts": min(v for v in (link["cap"]["speed_gts"], pcap.get("speed_gts")) if v),
                   "width": min(v for v in (link["cap"]["width"], pcap.get("width")) if v)}
            finding = judge_under_load(finding, samples, cap, "the audit's copy probe")
        out.append(finding)
    return sorted(out, key=lambda f: (SEVERITIES.index(f["severity"]), f["code"], f["device"] or ""))


def process_privileges() -> dict:
    """This process's effective uid, whether it holds CAP_SYS_ADMIN (bit 21 of CapEff) and the host name."""
    cap = None
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    cap = bool(int(line.split()[1], 16) >> 21 & 1)
    except (OSError, ValueError, IndexError):
        pass
    return {"euid": os.geteuid(), "cap_sys_admin": cap, "hostname": socket.gethostname()}


def gather(fs: HostFS, params: dict, nvml_lib=None, run=None) -> tuple[dict, list[str]]:
    """The whole audit: targets, model, NVML, probe and findings. Returns (facts, warnings).

    Raises TopologyError or NvmlUnavailable with a message fit for fail_json.
    """
    warnings: list[str] = []
    params = dict({"devices": [], "vendor": None, "device": None, "class_prefix": "03", "exclude_vendors": list(BMC_VENDORS),
                   "include_nvml": "auto", "vfio_wanted": False, "bandwidth_probe": False, "probe_python": None,
                   "probe_size_mb": 256, "tp_groups": [], "host_lint": False, "host_lint_units": ["vllm"]}, **params)
    targets = select_targets(PciWalker(fs), devices=params["devices"], vendor=params["vendor"], device=params["device"],
                             class_prefix=params["class_prefix"], exclude_vendors=params["exclude_vendors"])
    model = build_model(fs, targets)
    model["privileges"] = params.get("privileges") or process_privileges()
    check_config_spaces(model, targets, warnings)
    nvml_merge(model, read_nvml(fs, model, targets, params["include_nvml"], nvml_lib, warnings))
    model["bandwidth"] = None
    if params["bandwidth_probe"]:
        model["bandwidth"] = probe_unless_serving(fs, model, params, run)
        if model["bandwidth"]["error"]:
            warnings.append(f"Bandwidth probe: {model['bandwidth']['error']}")
    groups = tp_groups_of(params["tp_groups"], model)
    model["findings"] = reread_under_load(model, find(model, vfio_wanted=params["vfio_wanted"], tp_groups=groups))
    if params["host_lint"]:
        model["host_lint"], lint_findings = lint_host(fs, params, [g["bdf"] for g in model["gpus"]])
        order = {s: i for i, s in enumerate(host_lint.SEVERITIES)}
        model["findings"] = sorted(model["findings"] + lint_findings, key=lambda f: order[f["severity"]])
    del model["privileges"]  # who audited is for the messages, not part of the host's facts
    model["findings_summary"] = summary(model["findings"])
    return model, warnings


def check_config_spaces(model: dict, targets: list[str], warnings: list[str]) -> None:
    """A target whose config space cannot be read stops the audit (TopologyError, with what to do); a function on a
    target's path that cannot be read, or whose config space is readable only in part, is a warning."""
    short: list[tuple[str, int]] = []
    for bdf in targets:
        dev = model["devices"][bdf]
        if dev["config_error"]:
            raise TopologyError(
                f"Cannot audit {bdf} ({dev['class_name']} [{(dev['vendor_id'] or '?')[2:]}:{(dev['device_id'] or '?')[2:]}]): "
                f"{dev['config_error']}. The link, MaxPayload, ASPM and ACS checks decode this file: run the module as root "
                f"(become: true), and check that the function still exists (lspci -D -s {bdf}).")
    for bdf, dev in model["devices"].items():
        cfg = dev["config"]
        if dev["config_error"]:
            warnings.append(f"{bdf} (on the path of a target): {dev['config_error']}; its checks are skipped.")
        elif cfg and cfg["size"] < 256:
            short.append((bdf, cfg["size"]))
    if short:
        who = model["privileges"].get("hostname") or "this host"
        shown = ", ".join(f"{bdf} ({size} bytes)" for bdf, size in short[:4]) + (" ..." if len(short) > 4 else "")
        warnings.append(f"{who}: only part of the config space is readable for {len(short)} function(s): {shown}. "
                        + privilege_hint(model["privileges"]))


def read_nvml(fs: HostFS, model: dict, targets: list[str], mode: str, nvml_lib, warnings: list[str]) -> dict:
    """NVML's view for ``include_nvml`` ``mode``, or the empty view with ``error`` saying why it was not read (a
    warning when NVML failed in auto mode; NvmlUnavailable, with what to do, in always mode)."""
    has_nvidia = any(model["devices"][b]["vendor_id"] == NVIDIA for b in targets)
    nvml = {"available": False, "error": None, "gpus": {}, "pairs": []}
    if mode == "never":
        nvml["error"] = "include_nvml is never"
    elif mode == "auto" and not (HAS_PYNVML or nvml_lib):
        nvml["error"] = "nvidia-ml-py (pynvml) is not installed for this interpreter"
    elif mode == "auto" and not has_nvidia:
        nvml["error"] = "no NVIDIA function among the targets"
    elif mode == "auto" and fs.root != "/" and nvml_lib is None:
        nvml["error"] = f"NVML describes the live host, not the tree under root {fs.root}"
    else:
        try:
            nvml = nvml_collect(nvml_lib)
        except NvmlUnavailable as err:
            if mode == "always":
                raise NvmlUnavailable(
                    f"NVML could not be read on this host (include_nvml=always): {err}. Install the NVIDIA driver and "
                    "nvidia-ml-py for the interpreter that runs the module, or set include_nvml: auto.") from None
            nvml["error"] = str(err)
            warnings.append(f"NVML not read: {err}; topology levels come from sysfs.")
    return nvml


def probe_unless_serving(fs: HostFS, model: dict, params: dict, run) -> dict:
    """The copy probe's result (bandwidth()), or, while processes hold the GPUs, the empty result saying why it did
    not run (the probe would compete with the service)."""
    busy = serving(fs, [g["bdf"] for g in model["gpus"]])
    if not busy:
        return bandwidth(model, params, run)
    return {"backend": None, "python": None, "size_mb": params["probe_size_mb"], "gpus": {},
            "error": f"not run: the GPUs are in use ({'; '.join(busy[:3])}); the probe would compete with the service"}


def tp_groups_of(texts: list | None, model: dict) -> list[list[str]]:
    """The ``tp_groups`` option as lists of PCI addresses, each one of the audited GPUs (else TopologyError, naming
    the entry and the GPUs there are)."""
    audited = [g["bdf"] for g in model["gpus"]]
    groups = []
    for text in texts or []:
        group = []
        for raw in str(text).replace(" ", ",").split(","):
            if raw:
                bdf = normalize_bdf(raw)
                if bdf is None or bdf not in audited:
                    raise TopologyError(f"tp_groups: '{raw}' is not one of the audited GPUs "
                                        f"({', '.join(audited)}); list each group as its GPUs' PCI "
                                        "addresses, comma-separated, for example '0000:17:00.0,0000:18:00.0'.")
                group.append(bdf)
        groups.append(group)
    return groups


def lint_host(fs: HostFS, params: dict, gpus: list[str]) -> tuple[dict, list[dict]]:
    """The host lint in the audit's run: ``({files, service_user}, findings)``, each finding in the audit's shape
    (``devices`` added) with the lint's ``file``, ``line`` and ``source``.
    With vfio_wanted every audited GPU may be on vfio-pci."""
    result = host_lint.run(fs, {"units": params["host_lint_units"], "passthrough_devices": gpus if params["vfio_wanted"] else []})
    findings = [dict(f, devices=[f["device"]] if f["device"] else []) for f in result["findings"]]
    return {"files": result["files"], "service_user": result["service_user"]}, findings


def render_report(host: str, kernel: str, facts: dict) -> str:
    """The audit JSON the audit role keeps on the host and on the controller (the audit_controller_files filter
    calls this too): ``{host, kernel, pcie}`` as Ansible's ``to_nice_json(sort_keys=true)`` writes it (ASCII, other
    characters escaped), after the JSON round trip a module result makes (integer keys become strings as the
    controller sees them), plus a newline."""
    doc = json.loads(json.dumps({"host": host, "kernel": kernel, "pcie": facts}))
    return json.dumps(doc, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"


def keep_report(fs: HostFS, dest: str, text: str, check_mode: bool, owner: tuple[int, int] = (0, 0)) -> tuple[list, list]:
    """Write the audit JSON to ``dest`` (root-owned 0644, its directory 0755 created), as the role's
    file and copy tasks did; only outside check mode. Returns (actions, diff).

    Raises managed_files.ManagedFilesError when the path cannot hold the file."""
    dirs = [managed_files.wanted_dir(os.path.dirname(dest) or "/", 0o755, owner)]
    files = [managed_files.wanted_file(dest, text, 0o644, owner)]
    return managed_files.converge(fs, dirs, files, check_mode)


# What execute() raises as the module's message, nothing changed.
KNOWN_ERRORS = (TopologyError, NvmlUnavailable, managed_files.ManagedFilesError, ValueError)


def missing_pynvml() -> Failed:
    """The failure of include_nvml=always where nvidia-ml-py cannot be imported: Ansible's missing_required_lib()
    message (which names this host and its interpreter), with the import error as the result's ``exception``."""
    return Failed(f"Failed to import the required Python library (nvidia-ml-py (include_nvml=always)) on {platform.node()}'s "
                  f"Python {sys.executable}. Please read the module documentation and install it in the appropriate location."
                  " If the required library is installed, but Ansible is using the wrong Python interpreter,"
                  " please consult the documentation on ansible_python_interpreter", exception=PYNVML_IMPORT_ERROR)


def execute(params: dict, host: Host, check_mode: bool) -> dict:
    """The pcie_facts module's run: the audit (gather(), the copy probe run through ``host.cmd``) and, with ``dest``,
    its JSON kept on the host (keep_report(), behind check mode); warnings go to ``host.warn``. Raises Failed when
    include_nvml=always finds no nvidia-ml-py, one of KNOWN_ERRORS for input or a topology the audit cannot read,
    HostFSError for a path it cannot read or write."""
    if params.get("include_nvml") == "always" and not HAS_PYNVML:
        raise missing_pynvml()
    if not 1 <= params.get("probe_size_mb", 256) <= 65536:
        raise ValueError(f"probe_size_mb must be from 1 to 65536 (MiB), got {params['probe_size_mb']}")
    audit_params = {k: v for k, v in params.items() if k not in ("root", "dest", "dest_host", "dest_kernel")}
    facts, warnings = gather(host.fs, audit_params, run=host.cmd.run)
    actions, diff = [], []
    if params.get("dest"):
        actions, diff = keep_report(host.fs, params["dest"], render_report(params.get("dest_host") or "",
                                                                           params.get("dest_kernel") or "", facts), check_mode)
    for warning in warnings:
        host.warn(warning)
    return {"changed": bool(actions), "actions": actions, "findings_summary": facts["findings_summary"], "pcie": facts,
            "ansible_facts": {"gpufleet_pcie": facts}, "diff": diff}

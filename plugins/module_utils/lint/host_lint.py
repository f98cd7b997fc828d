# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host lint: copied GPU tuning that does nothing or harms, found in the files a host already has.

``gather(fs, params)`` reads, through the HostFS seam, the kernel command line (``/proc/cmdline``), the GRUB defaults
and drop-ins, ``/etc/nccl.conf`` and the ``~/.nccl.conf`` of root and of the service user, the vLLM units'
``Environment=`` lines and ``EnvironmentFile=`` files, ``/etc/modprobe.d``, ``/etc/sysctl.d`` and ``/etc/sysctl.conf``,
and the drivers bound to the GPUs. Every setting read is a ``Setting`` (its file and line); ``lint(host)`` runs the
pure rules over them and returns findings, each ``{code, severity, file, line, message, fix, source}``, most severe
first. The rules' claims are the sources' (``SOURCES``), quoted in docs/tuning_myths.md. ``execute`` is the
gpufleet.inference.host_lint module's run: ``run()`` over the Host's files; it never changes the host.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Any, NamedTuple

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host

SEVERITIES = ("critical", "warning", "info")

NCCL_SRC = "NVIDIA/nccl@5067397c"
NVREG_SRC = "NVIDIA/open-gpu-kernel-modules@df1c9a3d kernel-open/nvidia/nv-reg.h"
KPARAMS = "Linux Documentation/admin-guide/kernel-parameters.txt"
# What proves each rule; the myths page (docs/tuning_myths.md) says the same with the quotes.
SOURCES = {
    "pci_noacs": f"{KPARAMS} (pci= lists no 'noacs'); drivers/pci/pci.c pci_setup(): \"PCI: Unknown option `%s'\"",
    "pcie_acs_override": f"{KPARAMS} has no pcie_acs_override= (an out-of-tree ACS override patch)",
    "pcie_aspm_off": f"{KPARAMS} pcie_aspm=off: \"Don't touch ASPM configuration at all. Leave any configuration done by "
                     "firmware unchanged\"; drivers/pci/pcie/aspm.c (aspm_disabled)",
    "pcie_port_pm_off": f"{KPARAMS} pcie_port_pm=off: \"Disable power management of all PCIe ports\" (runtime D3 of the "
                        "ports, drivers/pci/pcie/portdrv), not ASPM",
    "swiotlb_slabs": f"{KPARAMS} swiotlb=<int>: \"Number of I/O TLB slabs\"; include/linux/swiotlb.h IO_TLB_SHIFT 11 "
                     "(2 KiB slabs)",
    "nr_hugepages_default_size": "Linux Documentation/admin-guide/mm/hugetlbpage.rst: /proc/sys/vm/nr_hugepages is the "
                                 "pool of default-size huge pages; other sizes under /sys/kernel/mm/hugepages/hugepages-<size>kB",
    "io_uring_disabled": "Linux Documentation/admin-guide/sysctl/kernel.rst io_uring_disabled: 0 all, 1 only "
                         "io_uring_group members and CAP_SYS_ADMIN, 2 nobody",
    "use_hugepages": "no reader: not an environment variable of vLLM (vllm/envs.py), PyTorch, NCCL (src/misc/param.cc) "
                     "or the CUDA driver",
    "nccl_p2p_level_unknown": f"{NCCL_SRC} src/graph/paths.cc ncclGetLevel(): a value that is neither a level name "
                              "(src/graph/topo.cc topoPathTypeStr) nor a number leaves the level unset, without a warning",
    "nccl_proto_forced": f"{NCCL_SRC} src/graph/tuning.cc (NCCL_PROTO parsed by parseList() into protoEnable); "
                         "src/include/device.h union ncclLLFifoLine (LL carries 8 data bytes in a 16-byte line)",
    "nccl_algo_forced": f"{NCCL_SRC} src/graph/tuning.cc (NCCL_ALGO parsed by parseList() into algoEnable: the tuner "
                        "chooses among the listed algorithms only)",
    "nccl_nthreads": f"{NCCL_SRC} src/graph/tuning.cc getNthreads() and ncclTopoTuneModel(); src/include/device.h "
                     "WARP_SIZE 32, NCCL_SIMPLE_MAX_NTHREADS 512, NCCL_LL_MAX_NTHREADS 512",
    "nccl_conf_syntax": f"{NCCL_SRC} src/misc/param.cc setEnvFile(): '#' only in column 1 starts a comment; the name is "
                        "everything before '=' and the value everything after it, spaces and quotes included",
    "nvreg_unknown": f"{NVREG_SRC} (NV_DEFINE_REG_ENTRY / NV_DEFINE_REG_STRING_ENTRY: the module's NVreg_* parameters); "
                     "Linux kernel/module/main.c unknown_module_param_cb(): \"unknown parameter '%s' ignored\"",
    "gpu_bound_to_vfio": "Linux Documentation/driver-api/vfio.rst: a device bound to vfio-pci is driven from user space "
                         "(a VM); the host's NVIDIA driver, CUDA and vLLM cannot use it",
    "gpu_in_vfio_ids": "Linux drivers/vfio/pci/vfio_pci.c (ids= module parameter): vfio-pci claims every device of those "
                       "IDs when it loads",
    "setting_conflict": "NCCL: src/misc/param.cc + src/os/linux.cc (setenv(..., 0): the environment wins, then "
                        "~/.nccl.conf, then /etc/nccl.conf); systemd.exec(5) EnvironmentFile= overrides Environment=; "
                        "procps sysctl --system reads /etc/sysctl.conf last; GRUB appends the drop-ins after /etc/default/grub",
    "setting_duplicate": "the same as setting_conflict: only the last one read takes effect",
}

NCCL_LEVELS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")  # src/graph/topo.cc topoPathTypeStr
WARP_SIZE = 32
NTHREADS_MIN, NTHREADS_MAX = 2 * WARP_SIZE, 512
# kernel-open/nvidia/nv-reg.h, NV_DEFINE_REG_ENTRY* lines (module parameters NVreg_<name>)
NVREG_NAMES = frozenset((
    "ResmanDebugLevel", "RmLogonRC", "ModifyDeviceFiles", "DeviceFileUID", "DeviceFileGID", "DeviceFileMode",
    "InitializeSystemMemoryAllocations", "UsePageAttributeTable", "EnablePCIeGen3", "EnableMSI", "EnableStreamMemOPs",
    "RestrictProfilingToAdminUsers", "PreserveVideoMemoryAllocations", "EnableS0ixPowerManagement",
    "S0ixPowerManagementVideoMemoryThreshold", "DynamicPowerManagement", "DynamicPowerManagementVideoMemoryThreshold",
    "EnableGpuFirmware", "EnableGpuFirmwareLogs", "OpenRmEnableUnsupportedGpus", "EnableUserNUMAManagement",
    "MemoryPoolSize", "KMallocHeapMaxSize", "VMallocHeapMaxSize", "IgnoreMMIOCheck", "NvLinkDisable",
    "EnablePCIERelaxedOrderingMode", "RegisterPCIDriver", "RegisterPlatformDeviceDriver", "EnableResizableBar",
    "EnableDbgBreakpoint", "TegraGpuPgMask", "EnableNonblockingOpen", "ExcludeAllGpus", "GpuInitOnProbe",
    "CoherentGPUMemoryMode", "RegistryDwords", "RegistryDwordsPerDevice", "RmMsg", "GpuBlacklist", "TemporaryFilePath",
    "ExcludedGpus", "DmaRemapPeerMmio", "RmNvlinkBandwidth", "RmNvlinkBandwidthLinkCount", "ImexChannelCount",
    "CreateImexChannel0", "GrdmaPciTopoCheckOverride", "EnableSystemMemoryPools", "UseKernelSuspendNotifiers",
))

GRUB_DEFAULTS = "/etc/default/grub"
GRUB_DROPINS = "/etc/default/grub.d"
NCCL_CONF = "/etc/nccl.conf"
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
# Kernel arguments that may appear more than once with different values on purpose.
REPEATABLE_ARGS = frozenset(("pci", "hugepagesz", "hugepages", "console", "BOOT_IMAGE", "initrd"))


class Setting(NamedTuple):
    """One setting as a file has it: ``scope`` kernel, env, modprobe or sysctl; ``origin`` the kind of file
    (cmdline, grub, nccl_conf, unit, env_file, modprobe, sysctl); ``rank`` its precedence inside its scope (the
    highest wins); ``comment`` the comment text on or just above its line (what the author meant)."""
    scope: str
    key: str
    value: str
    file: str
    line: int | None
    origin: str
    rank: int = 0
    comment: str = ""


# ---- parsers (pure) ------------------------------------------------------------------------
def kernel_args(text: str, file: str, line: int | None, origin: str, rank: int = 0) -> list[Setting]:
    """The arguments of a kernel command line, each ``key`` (before the first ``=``) and ``value``."""
    out = []
    for token in text.split():
        key, _sep, value = token.partition("=")
        out.append(Setting("kernel", key, value, file, line, origin, rank))
    return out


_GRUB_LINE = re.compile(r"^\s*(?:export\s+)?(GRUB_CMDLINE_LINUX(?:_DEFAULT)?)\s*=(.*)$")


def grub_args(text: str, file: str, rank: int = 0) -> list[Setting]:
    """Kernel arguments from GRUB_CMDLINE_LINUX[_DEFAULT]= lines; ``$GRUB_CMDLINE_LINUX`` references are dropped."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        match = _GRUB_LINE.match(line)
        if not match:
            continue
        try:
            words = shlex.split(match.group(2), comments=True)
        except ValueError:
            words = match.group(2).strip().strip("\"'").split()
        value = " ".join(w for w in " ".join(words).split() if not w.startswith("$"))
        out += kernel_args(value, file, number, "grub", rank)
    return out


def _comment_above(lines: list[str], index: int) -> str:
    """The comment on a line (after ``#``) and on the comment lines right above it."""
    notes = []
    if "#" in lines[index]:
        notes.append(lines[index].split("#", 1)[1])
    j = index - 1
    while j >= 0 and lines[j].lstrip().startswith(("#", ";")):
        notes.insert(0, lines[j].lstrip()[1:])
        j -= 1
    return " ".join(n.strip() for n in notes)


def nccl_conf(text: str, file: str, rank: int) -> list[Setting]:
    """``NAME=value`` lines as NCCL's setEnvFile() reads them: '#' in column 1 is a comment, no other parsing."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.rstrip("\r")
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        out.append(Setting("env", key, value, file, number, "nccl_conf", rank))
    return out


def env_file(text: str, file: str, rank: int) -> list[Setting]:
    """A systemd EnvironmentFile: ``NAME=value`` lines, ``#``/``;`` comments, quotes removed, ``export`` allowed."""
    out = []
    lines = text.splitlines()
    for number, key, value in _assignments(lines):
        if key.startswith("export "):
            key = key[len("export "):].strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out.append(Setting("env", key, value, file, number, "env_file", rank, _comment_above(lines, number - 1)))
    return out


def _assignments(lines: list[str]):
    """(line number, key, value) of each ``key = value`` line, blank lines and ``#``/``;`` comments skipped, both
    sides stripped: the shape EnvironmentFile= and sysctl.d files share."""
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")) or "=" not in stripped:
            continue
        key, value = stripped.split("=", 1)
        yield number, key.strip(), value.strip()


def unit_settings(text: str, file: str, rank: int) -> tuple[list[Setting], list[str], str | None]:
    """From a unit or drop-in: its Environment= assignments, its EnvironmentFile= paths (without the optional
    leading '-') and its User= (None when not set)."""
    env, files, user = [], [], None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        key, sep, value = stripped.partition("=")
        if not sep:
            continue
        key = key.strip()
        if key == "Environment":
            try:
                words = shlex.split(value)
            except ValueError:
                words = value.split()
            for word in words:
                name, eq, val = word.partition("=")
                if eq:
                    env.append(Setting("env", name, val, file, number, "unit", rank))
        elif key == "EnvironmentFile":
            files += [p.lstrip("-") for p in value.split() if p.lstrip("-").startswith("/")]
        elif key == "User":
            user = value.strip() or None
    return env, files, user


def modprobe_options(text: str, file: str, rank: int) -> list[Setting]:
    """``options <module> name=value ...`` lines; key ``<module>.<name>``."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if len(words) < 3 or words[0] != "options":
            continue
        module = words[1].replace("-", "_")
        for word in words[2:]:
            name, _eq, value = word.partition("=")
            out.append(Setting("modprobe", f"{module}.{name}", value, file, number, "modprobe", rank))
    return out


def sysctl_lines(text: str, file: str, rank: int) -> list[Setting]:
    """``key = value`` lines of a sysctl.d file (``/`` in keys read as ``.``, a leading ``-`` dropped)."""
    lines = text.splitlines()
    return [Setting("sysctl", key.lstrip("-").replace("/", "."), value, file, number, "sysctl", rank,
                    _comment_above(lines, number - 1))
            for number, key, value in _assignments(lines)]


def passwd_home(text: str, user: str) -> str | None:
    """The home directory of ``user`` in /etc/passwd text."""
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 6 and fields[0] == user:
            return fields[5]
    return None


# ---- gathering (through the seam) ----------------------------------------------------------
def _conf_files(fs: HostFS, directory: str, suffix: str = ".conf") -> list[str]:
    return [posixpath.join(directory, n) for n in fs.listdir(directory) if n.endswith(suffix)]


def _read(fs: HostFS, path: str, read: list[str]) -> str | None:
    text = fs.read_optional(path)
    if text is not None:
        read.append(path)
    return text


def _unit_files(fs: HostFS, unit: str) -> list[str]:
    """The unit file systemd uses (the first of UNIT_DIRS that holds it) and its drop-ins, in order."""
    name = unit if "." in unit else unit + ".service"
    main = next((posixpath.join(d, name) for d in UNIT_DIRS if fs.exists(posixpath.join(d, name))), None)
    dropins = sorted(p for d in UNIT_DIRS for p in _conf_files(fs, posixpath.join(d, name + ".d")))
    return ([main] if main else []) + dropins


def _gather_units(fs: HostFS, units: list[str], read: list[str]) -> tuple[list[Setting], str | None]:
    settings: list[Setting] = []
    user = None
    for unit in units:
        env_paths: list[str] = []
        for path in _unit_files(fs, unit):
            env, files, unit_user = unit_settings(_read(fs, path, read) or "", path, 2)
            settings += env
            env_paths += files
            user = unit_user or user
        for path in env_paths:
            text = _read(fs, path, read)
            if text is not None:
                settings += env_file(text, path, 3)
    return settings, user


def _gather_gpus(fs: HostFS) -> list[dict[str, Any]]:
    gpus = []
    for bdf in fs.listdir("/sys/bus/pci/devices"):
        base = f"/sys/bus/pci/devices/{bdf}"
        if not (fs.read_optional(f"{base}/class") or "").startswith("0x03"):
            continue
        link = fs.readlink(f"{base}/driver")
        gpus.append({"bdf": bdf, "vendor": fs.read_optional(f"{base}/vendor"), "device": fs.read_optional(f"{base}/device"),
                     "driver": posixpath.basename(link) if link else None, "file": f"{base}/driver"})
    return gpus


def gather(fs: HostFS, params: dict) -> dict[str, Any]:
    """Every setting the rules judge, with the files read: ``{settings, gpus, files, service_user, passthrough}``."""
    read: list[str] = []
    settings: list[Setting] = []
    cmdline = _read(fs, "/proc/cmdline", read)
    if cmdline is not None:
        settings += kernel_args(cmdline, "/proc/cmdline", 1, "cmdline")
    for rank, path in enumerate([GRUB_DEFAULTS] + _conf_files(fs, GRUB_DROPINS, ".cfg")):
        text = _read(fs, path, read)
        if text is not None:
            settings += grub_args(text, path, rank)
    unit_env, unit_user = _gather_units(fs, params.get("units") or [], read)
    user = params.get("service_user") or unit_user or "root"
    homes = {"root": "/root"}
    passwd = fs.read_optional("/etc/passwd") or ""
    for name in sorted({user, "root"}):
        homes[name] = passwd_home(passwd, name) or homes.get(name)
    text = _read(fs, NCCL_CONF, read)
    settings += nccl_conf(text, NCCL_CONF, 0) if text is not None else []
    for name in sorted({user, "root"}, key=lambda n: n != user):
        if homes.get(name):
            path = posixpath.join(homes[name], ".nccl.conf")
            text = _read(fs, path, read)
            # another user's file is read but not in effect for the service (rank -1: never the winner)
            settings += nccl_conf(text, path, 1 if name == user else -1) if text is not None else []
    settings += unit_env
    for rank, path in enumerate(_conf_files(fs, "/etc/modprobe.d")):
        settings += modprobe_options(_read(fs, path, read) or "", path, rank)
    sysctl_paths = _conf_files(fs, "/etc/sysctl.d") + ["/etc/sysctl.conf"]
    for rank, path in enumerate(sysctl_paths):
        text = _read(fs, path, read)
        if text is not None and not any(fs.realpath(path) == fs.realpath(p) for p in sysctl_paths[:rank]):
            settings += sysctl_lines(text, path, rank)
    return {"settings": settings, "gpus": _gather_gpus(fs), "files": read, "service_user": user,
            "passthrough": [b.lower() for b in params.get("passthrough_devices") or []]}


# ---- rules (pure) ---------------------------------------------------------------------------
def finding(code: str, severity: str, where: Setting | dict, message: str, fix: str) -> dict[str, Any]:
    file = where.file if isinstance(where, Setting) else where["file"]
    line = where.line if isinstance(where, Setting) else where.get("line")
    device = None if isinstance(where, Setting) else where.get("bdf")
    return {"code": code, "severity": severity, "file": file, "line": line, "device": device, "message": message, "fix": fix,
            "source": SOURCES[code]}


def _at(s: Setting) -> str:
    return f"{s.file}:{s.line}" if s.line else s.file


def effective_kernel_args(settings: list[Setting]) -> list[Setting]:
    """The kernel arguments to judge: every one the GRUB files set, and those of /proc/cmdline that no GRUB file
    sets (put there another way: grubby, BLS entries, the firmware)."""
    grub = [s for s in settings if s.scope == "kernel" and s.origin == "grub"]
    in_grub = {(s.key, s.value) for s in grub}
    live = [s for s in settings if s.origin == "cmdline" and (s.key, s.value) not in in_grub]
    return grub + live


def _live(settings: list[Setting], arg: Setting) -> str:
    on = any(s.origin == "cmdline" and s.key == arg.key and s.value == arg.value for s in settings)
    return "it is on the running kernel's command line" if on else "it is not on the running kernel's command line yet"


def rule_kernel(settings: list[Setting]) -> list[dict[str, Any]]:
    out = []
    for arg in effective_kernel_args(settings):
        text = f"{arg.key}={arg.value}" if arg.value else arg.key
        if arg.key == "pci" and "noacs" in arg.value.split(","):
            out.append(finding(
                "pci_noacs", "warning", arg,
                f"{_at(arg)} sets '{text}': noacs is not an option of mainline Linux's pci= (the kernel logs \"PCI: "
                f"Unknown option `noacs'\" and ACS stays on); {_live(settings, arg)}, which proves nothing.",
                "Remove noacs; clear ACS redirect on exactly the bridges between the GPUs with gpufleet.inference.pcie_acs "
                "(pci=disable_acs_redir=<ports> at boot)."))
        elif arg.key == "pcie_acs_override":
            out.append(finding(
                "pcie_acs_override", "warning", arg,
                f"{_at(arg)} sets '{text}': mainline Linux has no such option (only kernels carrying the out-of-tree ACS "
                "override patch); elsewhere it does nothing.",
                "Remove it; use gpufleet.inference.pcie_acs for P2P between GPUs (pci=disable_acs_redir=<ports>)."))
        elif arg.key == "pcie_aspm" and arg.value == "off":
            out.append(finding(
                "pcie_aspm_off", "warning", arg,
                f"{_at(arg)} sets 'pcie_aspm=off': the kernel then leaves ASPM as the firmware configured it, so a link "
                "the firmware put in L1 stays in L1.",
                "Use pcie_aspm.policy=performance (and the runtime policy, the pcie_link role) so that the kernel disables "
                "ASPM on every link it manages; check the audit's aspm_enabled finding."))
        elif arg.key == "pcie_port_pm" and arg.value == "off":
            out.append(finding(
                "pcie_port_pm_off", "info", arg,
                f"{_at(arg)} sets 'pcie_port_pm=off': it turns off runtime power management (D3) of the PCIe ports, "
                "not ASPM; link power states are unchanged by it.",
                "Remove it unless a port's runtime suspend is the problem; for ASPM use pcie_aspm.policy=performance."))
        elif arg.key == "swiotlb" and arg.value.split(",")[0].isdigit():
            slabs = int(arg.value.split(",")[0])
            out.append(finding(
                "swiotlb_slabs", "info", arg,
                f"{_at(arg)} sets 'swiotlb={arg.value}': the number counts 2 KiB I/O TLB slabs, not KB, so this is "
                f"{slabs * 2048 / 1048576:g} MiB of bounce buffer.",
                "Leave swiotlb= out on a GPU server with 64-bit DMA; where an IOMMU is on, iommu=pt keeps host DMA untranslated."))
        elif arg.key.startswith("nvidia.NVreg_") and arg.key[len("nvidia.NVreg_"):] not in NVREG_NAMES:
            out.append(_nvreg(arg, arg.key[len("nvidia."):]))
    return out


def _nvreg(where: Setting, name: str) -> dict[str, Any]:
    return finding(
        "nvreg_unknown", "warning", where,
        f"{_at(where)} sets '{name}={where.value}' for the nvidia module, which has no such parameter: the kernel logs "
        "\"nvidia: unknown parameter ... ignored\" and the option does nothing.",
        "Remove it, or use a parameter the driver defines (kernel-open/nvidia/nv-reg.h, or modinfo -p nvidia).")


def _nccl_value(setting: Setting) -> str:
    return setting.value.strip().strip("\"'")


def rule_nccl(settings: list[Setting]) -> list[dict[str, Any]]:
    out = []
    for s in (s for s in settings if s.scope == "env"):
        key, value = s.key, _nccl_value(s)
        if s.origin == "nccl_conf" and (key != key.strip() or s.value != s.value.strip() or s.value[:1] in "\"'"
                                        or " #" in s.value):
            out.append(finding(
                "nccl_conf_syntax", "warning", s,
                f"{_at(s)} reads as name '{key}' and value '{s.value}': NCCL's nccl.conf reader takes everything before "
                "'=' as the name and everything after it as the value (spaces, quotes, a trailing comment).",
                f"Write it as {key.strip()}={value.split(' #')[0].strip()} with no spaces, quotes or trailing comment."))
        key = key.strip()
        if key == "USE_HUGEPAGES":
            out.append(finding(
                "use_hugepages", "warning", s,
                f"{_at(s)} sets USE_HUGEPAGES={value}: no program in the serving stack (vLLM, PyTorch, NCCL, the CUDA "
                "driver) reads it.",
                "Remove it; reserve huge pages with gpufleet.inference.hugepages where a workload uses them."))
        elif key == "NCCL_P2P_LEVEL" and value and not value[0].isdigit() and value not in NCCL_LEVELS:
            out.append(finding(
                "nccl_p2p_level_unknown", "warning", s,
                f"{_at(s)} sets NCCL_P2P_LEVEL={value}: not a level name, so NCCL leaves the level unset and uses its "
                "default, without a warning.",
                f"Use one of {', '.join(NCCL_LEVELS)} (the nccl_env role validates it), or remove the line."))
        elif key == "NCCL_PROTO" and value and "simple" not in value.lower() and not value.startswith("^"):
            out.append(finding(
                "nccl_proto_forced", "warning", s,
                f"{_at(s)} sets NCCL_PROTO={value}: NCCL may use only {value} for every size; LL moves 8 bytes of data in "
                "each 16-byte line, so large all-reduces (prefill, weight loading) run at half the bus bandwidth or less.",
                "Remove it and let NCCL's tuner choose per size; keep a protocol only where the nccl_env A/B measured a gain."))
        elif key == "NCCL_ALGO" and value:
            out.append(finding(
                "nccl_algo_forced", "warning", s,
                f"{_at(s)} sets NCCL_ALGO={value}: NCCL's tuner may only choose among these algorithms for every "
                "collective and size.",
                "Remove it; keep it only where the nccl_env A/B measured a gain on this host."))
        elif key == "NCCL_NTHREADS":
            out += _nthreads(s, value)
    return out


def _nthreads(s: Setting, value: str) -> list[dict[str, Any]]:
    try:
        number = int(value, 0)
    except ValueError:
        number = None
    if number is None or number <= 0:
        what = "not a positive number: NCCL keeps its defaults"
    elif number % WARP_SIZE:
        what = f"not a multiple of {WARP_SIZE}: NCCL ignores it and uses its maximum, {NTHREADS_MAX}"
    elif number > NTHREADS_MAX:
        what = f"above the maximum: NCCL uses {NTHREADS_MAX}"
    elif number < NTHREADS_MIN:
        what = f"below the minimum: NCCL raises it to {NTHREADS_MIN}"
    elif number == NTHREADS_MAX:
        what = "NCCL's default already on most hosts (512; 256 for the Simple ring only where it is as slow as Gen3 x16)"
    else:
        what = (f"below NCCL's defaults (512 threads per block, 256 for the Simple ring only where the ring is as slow as "
                f"PCIe Gen3 x16): it caps every Simple and LL kernel at {number} threads")
    severity = "info" if number == NTHREADS_MAX else "warning"
    return [finding("nccl_nthreads", severity, s, f"{_at(s)} sets NCCL_NTHREADS={value}: {what}.",
                    "Remove it; NCCL chooses per protocol and topology. Keep a value only where an A/B measured a gain.")]


def rule_modprobe(settings: list[Setting]) -> list[dict[str, Any]]:
    return [_nvreg(s, s.key.split(".", 1)[1]) for s in settings
            if s.scope == "modprobe" and s.key.startswith("nvidia.NVreg_") and s.key[len("nvidia.NVreg_"):] not in NVREG_NAMES]


_ONE_GIB = re.compile(r"\b1\s*gi?b?\b|\bgigabyte|\b1g\b|1 ?gib|1048576", re.IGNORECASE)


def rule_sysctl(settings: list[Setting]) -> list[dict[str, Any]]:
    out = []
    default_1g = any(s.key == "default_hugepagesz" and s.value.upper() in ("1G", "1024M") for s in effective_kernel_args(settings))
    for s in (s for s in settings if s.scope == "sysctl"):
        if s.key == "vm.nr_hugepages" and s.value.isdigit() and int(s.value) > 0 and not default_1g:
            meant_1g = bool(_ONE_GIB.search(s.comment))
            out.append(finding(
                "nr_hugepages_default_size", "warning" if meant_1g else "info", s,
                f"{_at(s)} sets vm.nr_hugepages={s.value}: that is {s.value} pages of the default size (2 MiB on x86), "
                f"{int(s.value) * 2} MiB, not {s.value} GiB{' as its comment says' if meant_1g else ''}.",
                "For 1 GiB pages write /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages (gpufleet.inference.hugepages) "
                "or boot with hugepagesz=1G hugepages=N."))
        elif s.key == "kernel.io_uring_disabled" and s.value in ("1", "2"):
            out.append(finding(
                "io_uring_disabled", "warning", s,
                f"{_at(s)} sets kernel.io_uring_disabled={s.value}: "
                + ("io_uring is disabled for every process." if s.value == "2" else
                   "io_uring is allowed only to members of kernel.io_uring_group and CAP_SYS_ADMIN; this does not "
                   "'enable' it."),
                "Set it to 0 (or remove the line) where the service uses io_uring; nothing in GPU all-reduce or vLLM's "
                "GPU path depends on it."))
    return out


def rule_vfio(host: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    gpus = [g for g in host["gpus"] if g["bdf"].lower() not in host["passthrough"]]
    for gpu in gpus:
        if gpu["driver"] == "vfio-pci":
            out.append(finding(
                "gpu_bound_to_vfio", "critical", gpu,
                f"GPU {gpu['bdf']} is bound to vfio-pci: the host's NVIDIA driver cannot use it, so vLLM on this host cannot.",
                "Bind it back to nvidia (the vfio role's state: absent), or list it in passthrough_devices if a VM owns it."))
    ids = {f"{(g['vendor'] or '')[2:]}:{(g['device'] or '')[2:]}".lower(): g["bdf"] for g in gpus}
    for s in host["settings"]:
        if s.key in ("vfio-pci.ids", "vfio_pci.ids"):
            for pair in s.value.split(","):
                if pair.lower() in ids:
                    out.append(finding(
                        "gpu_in_vfio_ids", "critical", s,
                        f"{_at(s)} gives vfio-pci the IDs {pair}, those of GPU {ids[pair.lower()]}: vfio-pci claims it "
                        "when it loads, before the NVIDIA driver.",
                        "Remove the ID, or bind only pass-through devices by address with gpufleet.inference.vfio_bind."))
    return out


def _describe(s: Setting) -> str:
    return f"{_at(s)} ({s.value})"


def rule_conflicts(settings: list[Setting]) -> list[dict[str, Any]]:
    """The same setting in several places of one scope: different values are a conflict, equal ones a duplicate.
    The finding points at the one that takes effect (highest rank, then last read)."""
    groups: dict[tuple[str, str], list[Setting]] = {}
    for s in settings:
        if s.rank < 0 or s.origin == "cmdline" or (s.scope == "kernel" and s.key in REPEATABLE_ARGS):
            continue
        groups.setdefault((s.scope, s.key.strip()), []).append(s)
    out = []
    for (scope, key), found in groups.items():
        if len(found) < 2:
            continue
        winner = sorted(found, key=lambda s: s.rank)[-1]
        others = [s for s in found if s is not winner]
        if len({_nccl_value(s) for s in found}) > 1:
            out.append(finding(
                "setting_conflict", "warning", winner,
                f"{key} ({scope}) is set to different values in {len(found)} places: {'; '.join(_describe(s) for s in found)}. "
                f"{_at(winner)} takes effect; the others only mislead.",
                "Keep one setting in the file its owner manages and remove the others."))
        else:
            out.append(finding(
                "setting_duplicate", "info", winner,
                f"{key} ({scope}) is set to the same value in {len(found)} places: "
                f"{', '.join(_at(s) for s in others)} and {_at(winner)}.",
                "Keep it in one file, the one its owner manages."))
    return out


def lint(host: dict[str, Any]) -> list[dict[str, Any]]:
    """Every finding over ``host`` (from gather()), most severe first, then by file and line."""
    settings = host["settings"]
    found = (rule_kernel(settings) + rule_nccl(settings) + rule_modprobe(settings) + rule_sysctl(settings)
             + rule_vfio(host) + rule_conflicts(settings))
    return sorted(found, key=lambda f: (SEVERITIES.index(f["severity"]), f["file"], f["line"] or 0, f["code"]))


def run(fs: HostFS, params: dict) -> dict[str, Any]:
    """gather() then lint(): ``{findings, findings_summary, files, service_user}``."""
    host = gather(fs, params)
    findings = lint(host)
    return {"findings": findings, "findings_summary": {sev: sum(f["severity"] == sev for f in findings) for sev in SEVERITIES},
            "files": host["files"], "service_user": host["service_user"]}


def execute(params: dict, host: Host, check_mode: bool) -> dict[str, Any]:  # pylint: disable=unused-argument  # read-only
    """The module's result: run() over the host's files, ``changed`` false and no ``actions`` (it never writes)."""
    return dict(changed=False, actions=[], **run(host.fs, params))

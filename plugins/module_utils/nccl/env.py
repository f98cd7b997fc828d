# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NCCL settings for PCIe GPU hosts: known keys with value checks, profiles, the two files that
carry them (/etc/nccl.conf and a systemd EnvironmentFile) and the P2P on/off A/B decision.

Pure functions, no I/O. Every error is an NcclEnvError whose message names the key, the value,
why it is wrong and what is accepted.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re

# NVLink multicast (NVLS) stays off on every host this collection manages: a program that uses
# it can take a shared host's GPUs out of service, and PCIe-only hosts gain nothing from it.
FORCED = {"NCCL_NVLS_ENABLE": "0"}

# Every profile starts from these; CUDA numbers GPUs in PCI bus order, as nvidia-smi does.
BASELINE = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NCCL_NVLS_ENABLE": "0"}

PROFILES = {
    # The tuning guides' conservative set for PCIe-only hosts: P2P only between GPUs under one
    # PCIe switch (not through the root complex, where ACS redirect and weak CPU P2P bridges make
    # it slow or hang it, NVIDIA/nccl#2079), no InfiniBand probing on single-node serving hosts,
    # no LL128 (meant for NVLink), warnings only in the logs.
    "pcie_safe": {
        "NCCL_P2P_LEVEL": "PXB",
        "NCCL_IB_DISABLE": "1",
        "NCCL_PROTO": "^LL128",
        "NCCL_DEBUG": "WARN",
    },
    # The same with peer-to-peer off entirely: all GPU traffic through host memory.
    "p2p_off": {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_IB_DISABLE": "1",
        "NCCL_PROTO": "^LL128",
        "NCCL_DEBUG": "WARN",
    },
    # Only the baseline; the user's settings say the rest.
    "custom": {},
}

P2P_MODES = ("p2p_on", "p2p_off")


class NcclEnvError(ValueError):
    """Invalid NCCL settings; the message says which key, why, and what is accepted."""


# ---- value checks: each returns the normalised text, or raises ValueError(reason) -------------
def _text(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, (str, int)):
        raise ValueError(f"expected a string or an integer, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise ValueError("empty value")
    if re.search(r"[\s\"'\\$`#]", text):
        raise ValueError("whitespace, quotes, '$', '`', '#' and backslashes are not allowed")
    return text


def _switch(value) -> str:
    text = _text(value).lower()
    if text in ("0", "false", "no", "off"):
        return "0"
    if text in ("1", "true", "yes", "on"):
        return "1"
    raise ValueError("expected 0 or 1 (or true/false)")


def _int_range(low: int, high: int):
    def check(value) -> str:
        text = _text(value)
        if not re.fullmatch(r"-?\d+", text):
            raise ValueError(f"expected an integer from {low} to {high}")
        number = int(text)
        if not low <= number <= high:
            raise ValueError(f"{number} is outside {low}..{high}")
        return str(number)
    return check


def _one_of(choices, case_insensitive: bool = True, numbers: tuple | None = None):
    canon = {c.upper() if case_insensitive else c: c for c in choices}

    def check(value) -> str:
        text = _text(value)
        if numbers and re.fullmatch(r"\d+", text):
            if not numbers[0] <= int(text) <= numbers[1]:
                raise ValueError(f"{text} is outside {numbers[0]}..{numbers[1]}")
            return str(int(text))
        key = text.upper() if case_insensitive else text
        if key not in canon:
            extra = f" or an integer {numbers[0]}..{numbers[1]}" if numbers else ""
            raise ValueError(f"expected one of {', '.join(choices)}{extra}")
        return canon[key]
    return check


def _name_list(choices):
    """`A,B` or `^A,B` (all but), names case-insensitive, as NCCL_ALGO/NCCL_PROTO take them."""
    canon = {c.upper(): c for c in choices}

    def check(value) -> str:
        text = _text(value)
        neg = text.startswith("^")
        names = [n.strip() for n in (text[1:] if neg else text).split(",")]
        if not all(names):
            raise ValueError("empty name in the list")
        bad = [n for n in names if n.upper() not in canon]
        if bad:
            raise ValueError(f"unknown {', '.join(bad)}; expected a comma list of {', '.join(choices)}, "
                             "optionally prefixed with ^ to exclude them")
        return ("^" if neg else "") + ",".join(canon[n.upper()] for n in names)
    return check


ALGOS = ("Ring", "Tree", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
PROTOS = ("Simple", "LL", "LL128")
COLLECTIVES = ("allreduce", "broadcast", "reduce", "allgather", "reducescatter", "sendrecv", "alltoall")
_algo_list = _name_list(ALGOS)


def _algo(value) -> str:
    """NCCL_ALGO: `Ring,Tree`, `^NVLS`, or per collective `allreduce:tree,ring;broadcast:ring` (NCCL 2.24+)."""
    text = _text(value)
    if ":" not in text:
        out = _algo_list(text)
    else:
        parts = []
        for part in text.split(";"):
            func, sep, algos = part.partition(":")
            if not sep or func.strip().lower() not in COLLECTIVES:
                raise ValueError(f"'{part}' is not <collective>:<algorithms>; collectives are {', '.join(COLLECTIVES)}")
            parts.append(f"{func.strip().lower()}:{_algo_list(algos)}")
        out = ";".join(parts)
    if "NVLS" in out.replace("^", "").split(",") and not out.startswith("^"):
        raise ValueError("NVLS and NVLSTree use NVLink multicast, which stays off (NCCL_NVLS_ENABLE=0)")
    return out


_SIZE = re.compile(r"(\d+)\s*([KMG]?)(I?B)?", re.IGNORECASE)


def parse_bytes(value) -> int:
    """4194304, '4M', '4MiB', '512K' -> bytes (K/M/G are powers of 1024, as NCCL sizes are)."""
    if isinstance(value, bool):
        raise ValueError("expected a byte size")
    if isinstance(value, int):
        number = value
    else:
        match = _SIZE.fullmatch(_text(value))
        if not match:
            raise ValueError("expected bytes as an integer or with a K/M/G suffix (4194304, 4M, 4MiB)")
        number = int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2).upper()]
    if number <= 0:
        raise ValueError("must be positive")
    return number


def _bytes(low: int, high: int):
    def check(value) -> str:
        number = parse_bytes(value)
        if not low <= number <= high:
            raise ValueError(f"{number} bytes is outside {low}..{high}")
        return str(number)
    return check


_IFNAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")


def _ifnames(value) -> str:
    """NCCL_SOCKET_IFNAME: `eth` (prefixes), `^docker,lo` (all but), `=eth0` (exact), `^=eth0`."""
    text = _text(value)
    body = text
    if body.startswith("^"):
        body = body[1:]
    if body.startswith("="):
        body = body[1:]
    names = body.split(",")
    bad = [n for n in names if not _IFNAME.fullmatch(n)]
    if bad:
        raise ValueError(f"bad interface name(s) {', '.join(repr(b) for b in bad)}; expected a comma list of names "
                         "(up to 15 characters), optionally prefixed with ^ (exclude) and/or = (exact match)")
    return text


def _hca_list(value) -> str:
    """NCCL_IB_HCA: `mlx5`, `^mlx5_1`, `=mlx5_0:1,mlx5_1:1`."""
    text = _text(value)
    body = text.lstrip("^").lstrip("=")
    bad = [n for n in body.split(",") if not re.fullmatch(r"[A-Za-z0-9_.-]+(:\d+)?", n)]
    if bad:
        raise ValueError(f"bad HCA name(s) {', '.join(repr(b) for b in bad)}; expected NAME or NAME:PORT, comma separated, "
                         "optionally prefixed with ^ and/or =")
    return text


def _subsys(value) -> str:
    names = ("INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "CALL", "PROXY", "NVLS",
             "BOOTSTRAP", "REG", "PROFILE", "RAS", "ALL")
    return _name_list(names)(value)


def _abs_path(value) -> str:
    text = _text(value)
    if not text.startswith("/"):
        raise ValueError("expected an absolute path")
    return text


def _devices(value) -> str:
    """CUDA_VISIBLE_DEVICES: indexes or GPU UUIDs (GPU-..., MIG-...), comma separated."""
    text = _text(value)
    bad = [d for d in text.split(",") if not re.fullmatch(r"\d+|(GPU|MIG)-[0-9A-Fa-f-]+", d)]
    if bad:
        raise ValueError(f"bad device(s) {', '.join(repr(b) for b in bad)}; expected indexes or GPU-/MIG- UUIDs")
    return text


# The level names NCCL_P2P_LEVEL and NCCL_NET_GDR_LEVEL take, nearest first: ncclGetLevel() (src/graph/paths.cc)
# compares the value, case-sensitively, with topoPathTypeStr[0..PATH_SYS] (src/graph/topo.cc), else maps a legacy
# integer 0-5. NVB since NCCL 2.8.3, PXN 2.12.7, C2C 2.26.2, P2C 2.27.3: an older NCCL ignores a name it does not
# know, silently, as it ignores PCI. Written upper-case (the canonical form), since NCCL's comparison is exact.
LEVELS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")
LEVEL_SINCE = {"NVB": "2.8.3", "PXN": "2.12.7", "C2C": "2.26.2", "P2C": "2.27.3"}

# key -> (check, what it does). Keys not here are refused unless the caller allows them.
KNOWN = {
    "NCCL_P2P_DISABLE": (_switch, "1 turns GPU peer-to-peer (PCIe or NVLink) off; traffic goes through host memory"),
    "NCCL_P2P_LEVEL": (_one_of(LEVELS, numbers=(0, 5)), "farthest topology level at which P2P is used (NVB needs "
                       "NCCL 2.8.3+, PXN 2.12.7+, C2C 2.26.2+, P2C 2.27.3+: older ones ignore the name)"),
    "NCCL_P2P_READ_ENABLE": (_switch, "P2P read instead of write"),
    "NCCL_P2P_USE_CUDA_MEMCPY": (_switch, "copy engines for P2P"),
    "NCCL_SHM_DISABLE": (_switch, "1 turns the shared-memory transport off"),
    "NCCL_SHM_USE_CUDA_MEMCPY": (_switch, "copy engines for shared-memory transfers"),
    "NCCL_ALGO": (_algo, "algorithms NCCL may use"),
    "NCCL_PROTO": (_name_list(PROTOS), "protocols NCCL may use"),
    "NCCL_BUFFSIZE": (_bytes(1 << 16, 1 << 30), "buffer size per channel and peer, bytes"),
    "NCCL_NTHREADS": (_one_of(("64", "128", "256", "512")), "CUDA threads per block"),
    "NCCL_MAX_NCHANNELS": (_int_range(1, 64), "most channels (CTAs) NCCL uses"),
    "NCCL_MIN_NCHANNELS": (_int_range(1, 64), "fewest channels NCCL uses"),
    "NCCL_MAX_CTAS": (_int_range(1, 64), "most CTAs (NCCL 2.17+ name)"),
    "NCCL_MIN_CTAS": (_int_range(1, 64), "fewest CTAs (NCCL 2.17+ name)"),
    "NCCL_IB_DISABLE": (_switch, "1 turns InfiniBand/RoCE off"),
    "NCCL_IB_HCA": (_hca_list, "which HCAs (and ports) to use"),
    "NCCL_IB_TIMEOUT": (_int_range(1, 31), "InfiniBand verbs timeout exponent"),
    "NCCL_IB_RETRY_CNT": (_int_range(0, 7), "InfiniBand retry count"),
    "NCCL_NET_GDR_LEVEL": (_one_of(LEVELS, numbers=(0, 5)), "farthest level for GPUDirect RDMA"),
    "NCCL_NET_GDR_READ": (_switch, "GPUDirect RDMA for sends"),
    "NCCL_CROSS_NIC": (_int_range(0, 2), "rings/trees across NICs"),
    "NCCL_SOCKET_IFNAME": (_ifnames, "interfaces for bootstrap and socket transport"),
    "NCCL_SOCKET_FAMILY": (_one_of(("AF_INET", "AF_INET6")), "address family for sockets"),
    "NCCL_SOCKET_NTHREADS": (_int_range(1, 16), "socket helper threads"),
    "NCCL_NSOCKS_PERTHREAD": (_int_range(1, 64), "sockets per helper thread"),
    "NCCL_DEBUG": (_one_of(("VERSION", "WARN", "INFO", "TRACE")), "log level"),
    "NCCL_DEBUG_SUBSYS": (_subsys, "log subsystems"),
    "NCCL_DEBUG_FILE": (_abs_path, "log file pattern (%h host, %p pid)"),
    "NCCL_NVLS_ENABLE": (_switch, "NVLink multicast; always 0 here"),
    "NCCL_CUMEM_ENABLE": (_switch, "cuMem* allocations"),
    "NCCL_COLLNET_ENABLE": (_switch, "CollNet (SHARP)"),
    "NCCL_IGNORE_CPU_AFFINITY": (_switch, "ignore the process's CPU affinity"),
    "NCCL_LAUNCH_MODE": (_one_of(("PARALLEL", "GROUP")), "kernel launch mode"),
    "NCCL_TOPO_FILE": (_abs_path, "XML topology to load"),
    "NCCL_TOPO_DUMP_FILE": (_abs_path, "where to dump the detected topology"),
    "NCCL_GRAPH_DUMP_FILE": (_abs_path, "where to dump the search graphs"),
    "NCCL_NET_PLUGIN": (_text, "network plugin name"),
    "NCCL_TUNER_PLUGIN": (_text, "tuner plugin name"),
    "NCCL_ASYNC_ERROR_HANDLING": (_switch, "(PyTorch) abort on NCCL errors; prefer TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": (_int_range(0, 3), "PyTorch: what to do on NCCL errors"),
    "CUDA_DEVICE_ORDER": (_one_of(("PCI_BUS_ID", "FASTEST_FIRST")), "CUDA device numbering"),
    "CUDA_VISIBLE_DEVICES": (_devices, "which GPUs processes see"),
}


def is_nccl_key(key: str) -> bool:
    """NCCL reads NCCL_* keys from nccl.conf; the rest (CUDA_*, TORCH_*) only work from the environment."""
    return key.startswith("NCCL_")


_KEY = re.compile(r"[A-Z][A-Z0-9_]*")


def validate(settings: dict, allow_unknown=()) -> dict:
    """Check every key and value; returns {KEY: normalised text}. None values are dropped.

    Raises NcclEnvError listing every problem at once.
    """
    if not isinstance(settings, dict):
        raise NcclEnvError(f"NCCL settings must be a mapping of KEY: value, got {type(settings).__name__}")
    allowed = set(allow_unknown or ())
    problems, out = [], {}
    for key in sorted(settings, key=str):
        value = settings[key]
        if value is None:
            continue
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            problems.append(f"{key!r}: not an environment variable name (upper case letters, digits, _)")
            continue
        if key in KNOWN:
            check = KNOWN[key][0]
        elif key in allowed:
            check = _text
        else:
            close = difflib.get_close_matches(key, list(KNOWN), n=1, cutoff=0.75)
            hint = f"did you mean {close[0]}? " if close else ""
            problems.append(f"{key}: unknown key; {hint}known keys are the NCCL_*/CUDA_* settings listed in the "
                            "nccl_env role's documentation, or list a newer NCCL key in nccl_env_allow_unknown")
            continue
        try:
            out[key] = check(value)
        except ValueError as err:
            problems.append(f"{key}={value!r}: {err}")
    for key, forced in FORCED.items():
        if out.get(key, forced) != forced:
            problems.append(f"{key}={out[key]}: NVLink multicast stays off on these hosts (it can take a shared host's "
                            f"GPUs out of service); remove the key or set it to {forced}")
    if problems:
        raise NcclEnvError("Invalid NCCL settings: " + "; ".join(problems))
    return out


def resolve(profile: str, settings: dict | None = None, allow_unknown=(), p2p: str | None = None, pair_levels=None) -> dict:
    """Baseline + profile + the user's settings (a None value removes a profile key), then the P2P
    mode of an A/B winner when given, validated. NCCL_NVLS_ENABLE is always 0."""
    if profile not in PROFILES:
        raise NcclEnvError(f"Unknown NCCL profile {profile!r}: expected one of {', '.join(PROFILES)}")
    merged = dict(BASELINE)
    merged.update(PROFILES[profile])
    for key, value in (settings or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    out = validate(merged, allow_unknown)
    if p2p is not None:
        out = with_p2p(out, p2p, pair_levels)
    out.update(FORCED)
    return dict(sorted(out.items()))


# nvidia-smi / sysfs pair level -> the NCCL_P2P_LEVEL that lets NCCL use P2P for it. NODE (two host
# bridges of one socket) is PHB in NCCL's own topology: both root complexes hang off one CPU node.
NCCL_LEVEL_OF = {"NVL": "NVL", "PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}


def p2p_allow_level(pair_levels) -> str | None:
    """The NCCL_P2P_LEVEL that allows P2P between every pair of ``pair_levels`` (the farthest one);
    None without levels."""
    mapped = [NCCL_LEVEL_OF[lv] for lv in pair_levels or () if lv in NCCL_LEVEL_OF]
    return max(mapped, key=LEVELS.index) if mapped else None


def with_p2p(settings: dict, mode: str, pair_levels=None) -> dict:
    """The settings with peer-to-peer on or off.

    ``p2p_on`` removes NCCL_P2P_DISABLE and, given the pair levels of the GPUs that talk (the
    tensor-parallel group), raises NCCL_P2P_LEVEL to the farthest of them, so that P2P is really
    allowed for every pair (a PXB level on PHB pairs would leave both arms without P2P). A level
    already farther is kept. ``p2p_off`` sets NCCL_P2P_DISABLE=1 and drops the level.
    """
    if mode not in P2P_MODES:
        raise NcclEnvError(f"Unknown P2P mode {mode!r}: expected one of {', '.join(P2P_MODES)}")
    out = {k: v for k, v in settings.items() if k != "NCCL_P2P_DISABLE"}
    if mode == "p2p_off":
        out.pop("NCCL_P2P_LEVEL", None)
        out["NCCL_P2P_DISABLE"] = "1"
    else:
        need = p2p_allow_level(pair_levels)
        have = str(out.get("NCCL_P2P_LEVEL", "")).upper()
        if need and (have not in LEVELS or LEVELS.index(have) < LEVELS.index(need)):
            out["NCCL_P2P_LEVEL"] = need
    return dict(sorted(out.items()))


def ab_candidates(settings: dict, pair_levels=None) -> dict:
    """The two environments the A/B measures; the p2p_on arm allows P2P for every pair level given."""
    return {mode: with_p2p(settings, mode, pair_levels) for mode in P2P_MODES}


def group_pair_levels(pcie: dict | None, gpus=None) -> list[str]:
    """The pair levels among ``gpus`` (PCI addresses; default every GPU) from the pcie_facts result."""
    wanted = {str(g).lower() for g in gpus or ()}
    out = []
    for pair in (pcie or {}).get("pairs") or []:
        if wanted and not {pair["a"], pair["b"]} <= wanted:
            continue
        out.append(pair.get("level"))
    return [lv for lv in out if lv]


def ab_key(candidates: dict, bench: dict | None = None) -> str:
    """Identifies an A/B: a stored result is reused while the candidates and bench parameters match."""
    blob = json.dumps({"candidates": candidates, "bench": bench or {}}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


# The name of no setting at all (settings_id).
NONE_ID = "nccl-none"


def settings_id(settings: dict) -> str:
    """The name of a set of settings: ``nccl-`` and 12 hex digits of the SHA-256 of its keys and values (as text),
    ``nccl-none`` when empty. The NCCL change's journal, records and history name settings by it."""
    if not settings:
        return NONE_ID
    blob = json.dumps({str(k): str(v) for k, v in settings.items()}, sort_keys=True, separators=(",", ":"))
    return "nccl-" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]


HEADER = "# Managed by Ansible (gpufleet.inference.nccl_env, profile {profile}); local edits are overwritten.\n"


def render_conf(settings: dict, profile: str = "custom", note: str = "") -> str:
    """/etc/nccl.conf: the NCCL_* keys as KEY=VALUE lines (NCCL reads them when the environment has not set them)."""
    lines = [HEADER.format(profile=profile)]
    if note:
        lines.append(f"# {note}\n")
    lines += [f"{k}={v}\n" for k, v in sorted(settings.items()) if is_nccl_key(k)]
    return "".join(lines)


def render_envfile(settings: dict, profile: str = "custom", note: str = "") -> str:
    """The systemd EnvironmentFile: every key (NCCL_*, CUDA_*, TORCH_*) as KEY=VALUE lines."""
    lines = [HEADER.format(profile=profile)]
    if note:
        lines.append(f"# {note}\n")
    lines += [f"{k}={v}\n" for k, v in sorted(settings.items())]
    return "".join(lines)


# ---- the A/B decision ---------------------------------------------------------------------------
def _score(busbw: dict, sizes: list) -> float:
    """Geometric mean of bus bandwidth over the sizes: every size counts the same."""
    values = [max(float(busbw[s]), 1e-9) for s in sizes]
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _busbw(result: dict) -> dict:
    out = {}
    for size, value in (result.get("busbw_gbps") or {}).items():
        try:
            out[int(size)] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def _times(result: dict) -> dict:
    out = {}
    for size, value in (result.get("time_us") or {}).items():
        try:
            if float(value) > 0:
                out[int(size)] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def _decide_two(decision: dict, busbw: dict, times: dict, small: list, large: list, prefer: str, other: str,
                margin_pct: float) -> dict:
    """The decision rule with both figures (docs/multi_gpu.md): the small all-reduces of decode (8 KiB to
    1 MiB, geometric mean of the time per all-reduce) and the bus bandwidth of the large ones (geometric
    mean over the sizes above 1 MiB). The other mode wins only when it is better than the preferred one by
    more than the margin in one figure and not worse by more than the margin in the other."""
    m = margin_pct / 100.0
    lat = {mode: _score(times[mode], small) for mode in P2P_MODES}
    bw = {mode: _score(busbw[mode], large) for mode in P2P_MODES}
    lat_ratio = lat[prefer] / lat[other]  # > 1: the other mode's small all-reduces are faster
    bw_ratio = bw[other] / bw[prefer]      # > 1: the other mode moves more bytes
    decision.update(sizes=small + large, small_sizes=small, large_sizes=large, ratio=round(bw_ratio, 4),
                    latency_ratio=round(lat_ratio, 4), scores={mo: round(v, 3) for mo, v in bw.items()},
                    latency_us={mo: round(v, 2) for mo, v in lat.items()})
    figures = (f"small all-reduces {lat[other]:.1f} vs {lat[prefer]:.1f} us, bus bandwidth {bw[other]:.2f} vs "
               f"{bw[prefer]:.2f} GB/s ({other} vs {prefer}; margin {margin_pct:g}%)")
    if (bw_ratio > 1 + m and lat_ratio >= 1 - m) or (lat_ratio > 1 + m and bw_ratio >= 1 - m):
        decision.update(winner=other, reason=f"{other} wins: {figures}")
    elif (bw_ratio > 1 + m) or (lat_ratio > 1 + m):
        decision.update(winner=prefer, reason=f"{prefer} kept: mixed result, {other} is better in one figure and worse in "
                                              f"the other beyond the margin: {figures}")
    else:
        decision.update(winner=prefer, reason=f"{prefer} kept: {other} is not better beyond the margin: {figures}")
    return decision


def ab_decide(results: dict, prefer: str = "p2p_on", margin_pct: float = 5.0, min_bytes: int = 0,
              small_max_bytes: int = 1 << 20) -> dict:
    """Pick the P2P mode from measured all-reduces.

    When both runs measured the time per all-reduce (``time_us``) of small messages (<=
    ``small_max_bytes``) and bus bandwidth above them, both figures decide (_decide_two). Otherwise:

    ``results`` maps each mode to ``{ok, error, busbw_gbps: {bytes: GB/s}}``. The score of a mode is
    the geometric mean of its bus bandwidth over the message sizes (>= min_bytes) both modes
    measured. The other mode wins only when it beats ``prefer`` by more than ``margin_pct``
    (noise must not flip a host's setting); a mode that failed (error, hang) loses.
    Returns {winner, reason, scores, ratio, sizes, margin_pct, prefer}; winner is None when
    neither mode gave a figure.
    """
    if prefer not in P2P_MODES:
        raise NcclEnvError(f"Unknown preferred P2P mode {prefer!r}: expected one of {', '.join(P2P_MODES)}")
    if margin_pct < 0:
        raise NcclEnvError(f"The A/B margin must be >= 0 percent, got {margin_pct}")
    other = [m for m in P2P_MODES if m != prefer][0]
    decision = {"winner": None, "reason": "", "scores": {}, "ratio": None, "sizes": [], "margin_pct": margin_pct,
                "prefer": prefer}
    usable = {}
    failures = []
    for mode in P2P_MODES:
        res = results.get(mode) or {}
        bw = {s: v for s, v in _busbw(res).items() if s >= min_bytes}
        if res.get("ok") and bw and any(v > 0 for v in bw.values()):
            usable[mode] = bw
        else:
            failures.append(f"{mode} gave no figure ({res.get('error') or 'no bus bandwidth measured'})")
    if not usable:
        decision["reason"] = "; ".join(failures)
        return decision
    if len(usable) == 1:
        mode = list(usable)[0]
        sizes = sorted(usable[mode])
        decision.update(winner=mode, sizes=sizes, scores={mode: round(_score(usable[mode], sizes), 3)},
                        reason=f"{mode} kept: " + "; ".join(failures))
        return decision
    sizes = sorted(set(usable[prefer]) & set(usable[other]))
    if not sizes:
        decision.update(winner=prefer, reason=f"{prefer} kept: the two runs share no message size to compare")
        return decision
    times = {m: _times(results.get(m) or {}) for m in P2P_MODES}
    small = sorted(s for s in set(times[prefer]) & set(times[other]) if s <= small_max_bytes)
    large = [s for s in sizes if s > small_max_bytes]
    if small and large:
        return _decide_two(decision, usable, times, small, large, prefer, other, margin_pct)
    scores = {m: _score(usable[m], sizes) for m in P2P_MODES}
    ratio = scores[other] / scores[prefer]
    decision.update(sizes=sizes, scores={m: round(s, 3) for m, s in scores.items()}, ratio=round(ratio, 4))
    if ratio > 1.0 + margin_pct / 100.0:
        decision.update(winner=other, reason=f"{other} is {100.0 * (ratio - 1):.1f}% faster than {prefer} "
                                             f"(geometric mean bus bandwidth over {len(sizes)} sizes; margin {margin_pct:g}%)")
    else:
        if ratio < 1.0:
            how = f"{other} is {100.0 * (1 - ratio):.1f}% slower"
        else:
            how = f"{other} is only {100.0 * (ratio - 1):.1f}% faster, within the {margin_pct:g}% margin"
        decision.update(winner=prefer, reason=f"{prefer} kept: {how} (geometric mean bus bandwidth over "
                                              f"{len(sizes)} sizes)")
    return decision

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which start of the inference server a benchmark measured: an identity of the server process's start, recorded in
every inference_benchmark result (``server.start``) so that the throughput history can group runs by server start and
estimate the gate's between-start noise (bench/history.py ``start_noise_estimate()``).

Two sources, the first that answers:

- ``proc``: the server runs on this host. The process that holds the TCP socket listening on the URL's port (the
  oldest holder: vLLM's API server, whose workers inherit the socket) is found as ``ss -ltnp`` finds it, from
  ``/proc/net/tcp`` and ``tcp6`` (the listening socket's inode) and ``/proc/PID/fd`` (who holds it); its start is the
  boot (``/proc/sys/kernel/random/boot_id``) and the process's start time in clock ticks since that boot
  (``/proc/PID/stat`` field 22). The id ``BOOT_ID/PID/TICKS`` names one process start and no other. Reading other
  users' ``/proc/PID/fd`` needs root (``become: true``).
- ``metrics``: vLLM's ``/metrics`` carries prometheus_client's ``process_start_time_seconds`` (the API server's start,
  seconds since the epoch, to the clock tick) when one API server serves it; the id is ``metrics/SECONDS``.

Anything else is unknown: ``id`` null and ``reason`` saying why, never a guess. All reads go through the HostFS seam
(``root``), so tests build a fake ``/proc``; the parsers are pure.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import sys
import time
from typing import Any, Callable, Iterable

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError

LISTEN = "0A"  # the TCP state column of /proc/net/tcp: TCP_LISTEN
METRIC = "process_start_time_seconds"
NO_METRIC = f"the server's /metrics has no {METRIC} (several API servers, or not vLLM)"
_METRIC_RE = re.compile(r"^process_start_time_seconds(?:\{[^}]*\})?\s+([-+0-9.eE]+)(?:\s+\d+)?$")
_SOCKET_RE = re.compile(r"^socket:\[(\d+)\]$")
MAX_PROCESSES = 65536  # /proc/[0-9]* entries scanned at most (a bound on the walk, far above a real host's count)


def unknown(reason: str) -> dict[str, Any]:
    """A start that is not known, and why."""
    return {"id": None, "source": None, "reason": reason}


def _address(field: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address of a ``/proc/net/tcp{,6}`` column (``0100007F`` or 32 hex digits): 32-bit words in the host's byte
    order, as the kernel prints them."""
    try:
        raw = bytes.fromhex(field)
    except ValueError:
        return None
    if len(raw) not in (4, 16):
        return None
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw)


def parse_sockets(text: str | None) -> list[dict[str, Any]]:
    """The sockets of a ``/proc/net/tcp`` or ``tcp6`` text: local address and port, state and inode; lines that do not
    parse are left out."""
    out = []
    for line in (text or "").splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10 or ":" not in cols[1]:
            continue
        addr, _sep, port = cols[1].rpartition(":")
        local = _address(addr)
        if local is None or not re.fullmatch(r"[0-9A-Fa-f]{4}", port) or not cols[9].isdigit():
            continue
        out.append({"address": local, "port": int(port, 16), "state": cols[3].upper(), "inode": int(cols[9])})
    return out


def parse_stat_start(text: str | None) -> int | None:
    """Field 22 of ``/proc/PID/stat``, the process's start in clock ticks after boot (the fields after the command
    name, which may hold spaces and parentheses, counted from its last ``)``)."""
    if not text or ")" not in text:
        return None
    fields = text[text.rindex(")") + 1:].split()
    # fields[0] is field 3 (state), so field 22 is fields[19]
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def parse_metrics_start(text: str | None) -> float | None:
    """``process_start_time_seconds`` of a Prometheus text (vLLM's ``/metrics``), None without it (a server with
    several API servers exports no process metrics)."""
    for line in (text or "").splitlines():
        m = _METRIC_RE.match(line.strip())
        if m:
            try:
                value = float(m.group(1))
            except ValueError:
                return None
            return value if 0 < value < 1e11 else None
    return None


def _same(a, b) -> bool:
    """Whether listening address ``a`` takes connections to ``b`` (the same, a wildcard of b's family, IPv6's
    wildcard for IPv4 too, or b as an IPv4-mapped IPv6 address)."""
    if a == b or (a.is_unspecified and (a.version == b.version or a.version == 6)):
        return True
    return a.version == 6 and b.version == 4 and getattr(a, "ipv4_mapped", None) == b


def resolve(host: str, port: int) -> list[Any]:
    """The addresses a URL's host name stands for (the client connects to one of them)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    if host.lower() == "localhost":
        return [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]


def listener_inodes(sockets: list[dict[str, Any]], addresses: list[Any], port: int) -> tuple[list[int], str | None]:
    """The inodes of the listening sockets that take connections to one of ``addresses`` at ``port``, or why none is
    this host's: an address that is neither loopback nor the local address of one of this host's sockets is not
    known to be this host's (the server may be elsewhere), and nothing of /proc is trusted then."""
    if not addresses:
        return [], "the URL's host name did not resolve here"
    mine = {s["address"] for s in sockets}
    local = [a for a in addresses if a.is_loopback or a in mine or any(_same(m, a) and not m.is_unspecified for m in mine)]
    if not local:
        return [], (f"the server's address {', '.join(map(str, addresses))} is not known to be this host's (not "
                    "loopback, no socket of this host has it): the server may run elsewhere")
    inodes = sorted({s["inode"] for s in sockets if s["state"] == LISTEN and s["port"] == port and s["inode"]
                     and any(_same(s["address"], a) for a in local)})
    if not inodes:
        return [], f"no socket of this host listens on {', '.join(map(str, local))} port {port}"
    return inodes, None


def holders(fs: HostFS, inodes: Iterable[int]) -> tuple[list[int], int]:
    """The processes holding one of the sockets ``inodes`` (from ``/proc/PID/fd``), and how many processes' file
    descriptors could not be read (other users' without root)."""
    wanted = {f"socket:[{i}]" for i in inodes}
    found, unreadable = [], 0
    for name in fs.listdir("/proc")[:MAX_PROCESSES]:
        if not name.isdigit():
            continue
        try:
            fds = fs.listdir(f"/proc/{name}/fd")
        except HostFSError:
            unreadable += 1
            continue
        if any(fs.readlink(f"/proc/{name}/fd/{fd}") in wanted for fd in fds if fd.isdigit()):
            found.append(int(name))
    return found, unreadable


def proc_start(fs: HostFS, host: str, port: int, clk_tck: int | None = None,
               resolver: Callable[[str, int], list[Any]] = resolve) -> dict[str, Any]:
    """The start of the process listening on ``host``:``port`` when it runs on this host (module doc), else unknown
    with the reason."""
    try:
        sockets = parse_sockets(fs.read_optional("/proc/net/tcp")) + parse_sockets(fs.read_optional("/proc/net/tcp6"))
        inodes, why = listener_inodes(sockets, resolver(host, port), port)
        if why:
            return unknown(why)
        pids, unreadable = holders(fs, inodes)
        boot_id = (fs.read_optional("/proc/sys/kernel/random/boot_id") or "").strip()
    except HostFSError as err:
        return unknown(f"/proc could not be read: {err}")
    starts = sorted((tick, pid) for pid in pids
                    for tick in [parse_stat_start(fs.read_optional(f"/proc/{pid}/stat"))] if tick is not None)
    if not starts:
        more = (f" ({unreadable} processes' file descriptors were not readable: run the task as root, become: true)"
                if unreadable else "")
        return unknown(f"the process listening on port {port} was not found{more}")
    if not re.fullmatch(r"[0-9a-f-]{36}", boot_id):
        return unknown(f"the boot id (/proc/sys/kernel/random/boot_id) is {boot_id or 'missing'!r}: a process start "
                       "time is only unique within one boot")
    tick, pid = starts[0]
    out = {"id": f"{boot_id}/{pid}/{tick}", "source": "proc", "reason": None, "pid": pid, "boot_id": boot_id,
           "start_ticks": tick, "process": (fs.read_optional(f"/proc/{pid}/comm") or "").strip() or None}
    btime = next((int(line.split()[1]) for line in (fs.read_optional("/proc/stat") or "").splitlines()
                  if line.startswith("btime ") and line.split()[1:2] and line.split()[1].isdigit()), None)
    ticks = clk_tck or os.sysconf("SC_CLK_TCK")
    if btime is not None and ticks > 0:
        out["started_at"] = _iso(btime + tick / ticks)
    return out


def metrics_start(value: float | None, why: str = "") -> dict[str, Any]:
    """The start vLLM's ``process_start_time_seconds`` names, or unknown."""
    if value is None:
        return unknown(why or NO_METRIC)
    return {"id": f"metrics/{value:.2f}", "source": "metrics", "reason": None, "started_at": _iso(value)}


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def restarted(before: dict[str, Any], after: dict[str, Any] | None) -> bool:
    """Whether the reads before and after a benchmark name two different starts (the server restarted during it)."""
    return after is not None and None not in (before.get("id"), after.get("id")) and after["id"] != before["id"]


def identify(before: dict[str, Any], after: dict[str, Any] | None = None) -> dict[str, Any]:
    """The start of a benchmark from the reads before and after it: the one start both name; unknown when they differ
    (the server restarted during the benchmark: its runs belong to two starts) or the second read found none."""
    if after is None or before.get("id") is None:
        return before
    if after.get("id") is None:
        return unknown(f"the server's start read at the start of the benchmark ({before['id']}) could not be read at "
                       f"its end ({after.get('reason')})")
    if restarted(before, after):
        return unknown(f"the server restarted during the benchmark ({before['id']} at its start, {after['id']} at its "
                       "end): its runs belong to two starts")
    return before


def choose(proc: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """The process's own start when /proc gives it, else /metrics', else unknown with both reasons."""
    if proc.get("id") is not None:
        return proc
    if metrics.get("id") is not None:
        return dict(metrics, proc_reason=proc.get("reason"))
    return unknown(f"{proc.get('reason')}; and {metrics.get('reason')}")

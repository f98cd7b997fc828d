# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks before the vLLM unit starts, for gpufleet.inference.vllm_preflight: is the model directory
readable by the service user (with ProtectHome in mind), and is the port free, or held by our own
unit? Parsers of ``/proc/net/tcp{,6}`` and of the sockets of ``/proc/<pid>/fd``, read through a HostFS;
``execute`` is the module's run over the Host's files and its HostCmd (``systemctl show``).
"""

from __future__ import annotations

import errno
import os
import posixpath
import pwd
import socket
import stat

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed


LISTEN = "0A"


HIDDEN_BY_PROTECT_HOME = ("/home", "/root", "/run/user")


# ---- /proc/net/tcp{,6} -----------------------------------------------------------------------
def _addr(hexaddr: str, v6: bool) -> str:
    raw = bytes.fromhex(hexaddr)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # four 32-bit words, each in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def parse_proc_net(text: str, v6: bool) -> list[dict]:
    """Listening sockets from /proc/net/tcp or tcp6: [{address, port, uid, inode}]."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN:
            continue
        local = fields[1]
        host, _sep, port = local.partition(":")
        try:
            out.append({"address": _addr(host, v6), "port": int(port, 16), "uid": int(fields[7]), "inode": int(fields[9])})
        except (ValueError, OSError):
            continue
    return out


def _plain(address: str) -> str:
    """::ffff:a.b.c.d (an IPv4 address on an IPv6 socket) -> a.b.c.d."""
    return address[7:] if address.startswith("::ffff:") and "." in address else address


def overlaps(listener: str, wanted: str) -> bool:
    """Would binding ``wanted`` clash with a socket listening on ``listener`` (same port)?

    '::' counts as both families (a dual-stack socket takes the IPv4 port too)."""
    listener, wanted = _plain(listener), _plain(wanted)
    if listener == wanted or "::" in (listener, wanted):
        return True
    v6_l, v6_w = ":" in listener, ":" in wanted
    if v6_l != v6_w:
        return False
    return (listener == "0.0.0.0" or wanted == "0.0.0.0") if not v6_l else False


def unit_of(cgroup_text: str) -> str | None:
    """The systemd unit from /proc/PID/cgroup (v1 name=systemd or v2 line), e.g. vllm.service."""
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or parts[1] not in ("", "name=systemd"):
            continue
        for comp in reversed(parts[2].split("/")):
            if comp.endswith((".service", ".scope")):
                return comp
    return None


def socket_pids(fs: HostFS, inodes: set) -> tuple[dict, bool]:
    """{inode: [pid, ...]} from /proc/*/fd links; the flag says some fd tables could not be read."""
    found: dict = {}
    hidden = False
    for pid in fs.listdir("/proc"):
        if not pid.isdigit():
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fs.path(fd_dir))
        except OSError:
            hidden = True
            continue
        for fd in fds:
            target = fs.readlink(f"{fd_dir}/{fd}")
            if target is None:
                hidden = True
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in inodes:
                    found.setdefault(inode, []).append(int(pid))
    return found, hidden


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def listeners(fs: HostFS, port: int) -> list[dict]:
    """Sockets listening on ``port``, each with its holder's pids, command line, unit and user."""
    socks = []
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        text = fs.read_optional(path)
        if text:
            socks += [s for s in parse_proc_net(text, v6) if s["port"] == port]
    pids, hidden = socket_pids(fs, {s["inode"] for s in socks})
    for sock in socks:
        sock["user"] = _user(sock["uid"])
        sock["pids"] = sorted(pids.get(sock["inode"], []))
        sock["hidden"] = hidden and not sock["pids"]
        sock["unit"] = None
        sock["command"] = None
        for pid in sock["pids"]:
            sock["unit"] = sock["unit"] or unit_of(fs.read_optional(f"/proc/{pid}/cgroup") or "")
            cmd = (fs.read_optional(f"/proc/{pid}/cmdline") or "").replace("\0", " ").strip()
            sock["command"] = sock["command"] or (cmd[:200] or None)
    return socks


def bind_probe(host: str, port: int) -> int:
    """0 when ``host:port`` can be bound now, else the errno (the socket is closed at once)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return errno.EADDRNOTAVAIL
    family, kind, proto, _canon, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        return 0
    except OSError as err:
        return err.errno or errno.EADDRINUSE
    finally:
        sock.close()


def _holder(sock: dict) -> str:
    who = f"pid {', '.join(str(p) for p in sock['pids'])}" if sock["pids"] else f"a process of user {sock['user']}"
    extra = []
    if sock["command"]:
        extra.append(sock["command"])
    if sock["unit"]:
        extra.append(f"unit {sock['unit']}")
    return f"{who} ({'; '.join(extra)})" if extra else who


def check_port(fs: HostFS, host: str, port: int, unit: str, user: str | None, unit_active: bool,
               expect_ours: bool = False, probe=bind_probe) -> tuple[dict, str | None]:
    """(port facts, error message or None)."""
    result = {"free": None, "ours": False, "listeners": []}
    err = probe(host, port) if probe else None
    if err == errno.EADDRNOTAVAIL:
        return result, (f"Cannot bind {host}:{port}: the address is not on this host. Set vllm_service_host to an "
                        "address of this host, 127.0.0.1 or 0.0.0.0.")
    if err not in (None, 0, errno.EADDRINUSE, errno.EACCES):
        return result, f"Cannot bind {host}:{port}: {os.strerror(err)}."
    socks = [s for s in listeners(fs, port) if overlaps(s["address"], host)]
    result["listeners"] = socks
    result["free"] = err == 0 if err is not None else not socks
    for sock in socks:
        sock["ours"] = sock["unit"] == unit or (sock["hidden"] and user is not None and sock["user"] == user and unit_active)
    others = [s for s in socks if not s["ours"]]
    result["ours"] = bool(socks) and not others
    if expect_ours and not result["ours"]:
        held = "; ".join(_holder(s) for s in socks) or "nothing listens on it"
        return result, f"Port {port} on {host} is not held by {unit}: {held}. Is the service running on another port?"
    if result["free"] is False and not socks:
        return result, (f"Port {port} on {host} cannot be bound (in use), but no listening socket was found on it "
                        f"in /proc/net/tcp: another network namespace or a non-listening socket holds it. "
                        f"Pick another vllm_service_port. {unit} was left as it is.")
    if others:
        held = "; ".join(_holder(s) for s in others)
        return result, (f"Port {port} on {host} is already in use by {held}, not by {unit}. Pick another "
                        f"vllm_service_port or stop that process. {unit} was left as it is.")
    return result, None


# ---- the model ------------------------------------------------------------------------------------
def _can(st: os.stat_result, uid: int | None, gids: set, bits: tuple) -> bool:
    """bits: (user, group, other) masks for the access wanted."""
    if uid == 0:
        return True
    if uid is not None and st.st_uid == uid:
        return bool(st.st_mode & bits[0])
    if st.st_gid in gids:
        return bool(st.st_mode & bits[1])
    return bool(st.st_mode & bits[2])


R = (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH)


X = (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)


def check_model(fs: HostFS, model: str, user: str | None, protect_home: bool) -> tuple[dict, str | None]:
    facts = {"path": model, "kind": None, "config": False, "readable_by": None}
    hidden = [p for p in HIDDEN_BY_PROTECT_HOME if model == p or model.startswith(p + "/")]
    if protect_home and hidden:
        return facts, (f"Model path {model} is under {hidden[0]}, which the unit's ProtectHome=yes hides from the "
                       "service. Move the model (e.g. to /srv/models) or set vllm_service_protect_home: false.")
    real = fs.path(model)
    if not os.path.lexists(real):
        parent = posixpath.dirname(model)
        while parent != "/" and not os.path.exists(fs.path(parent)):
            parent = posixpath.dirname(parent)
        return facts, (f"Model path {model} does not exist on this host (the deepest existing directory is {parent}). "
                       "Copy the model there first or fix vllm_service_model. The service was left as it is.")
    if os.path.isdir(real):
        facts["kind"] = "directory"
        facts["config"] = os.path.isfile(os.path.join(real, "config.json"))
        if not facts["config"] and not any(n.endswith(".gguf") for n in os.listdir(real)):
            return facts, (f"Model directory {model} has no config.json: vLLM loads a Hugging Face model directory "
                           "(config.json, tokenizer files, *.safetensors) or a .gguf file. Point vllm_service_model at it.")
    elif model.endswith(".gguf"):
        facts["kind"] = "gguf"
    else:
        return facts, f"Model path {model} is a file but not a .gguf: point vllm_service_model at the model directory."

    uid, gids = None, set()
    if user:
        try:
            entry = pwd.getpwnam(user)
            uid = entry.pw_uid
            gids = {entry.pw_gid} | set(os.getgrouplist(user, entry.pw_gid))
        except KeyError:
            uid = None  # not created yet: judge by the permissions for others
    who = user if uid is not None else "others"
    path = "/"
    for comp in [c for c in model.split("/") if c]:
        path = posixpath.join(path, comp)
        st = os.stat(fs.path(path))
        if stat.S_ISDIR(st.st_mode) and not _can(st, uid, gids, X):
            return facts, (f"Model path {model} is not reachable by {who}: {path} (mode {stat.filemode(st.st_mode)}, "
                           f"owner {st.st_uid}:{st.st_gid}) lacks search (x) permission. chmod o+x or chgrp it to the "
                           "service group.")
    target = os.path.join(real, "config.json") if facts["config"] else real
    st = os.stat(target)
    if not _can(st, uid, gids, R) or (facts["kind"] == "directory" and not _can(os.stat(real), uid, gids, R)):
        return facts, (f"Model {model} is not readable by {who} ({stat.filemode(st.st_mode)}, owner "
                       f"{st.st_uid}:{st.st_gid}). chmod -R o+rX it or give it to the service group.")
    facts["readable_by"] = who
    return facts, None


def unit_active(cmds, unit: str) -> bool:
    """Is ``unit`` active (or on its way) in the live systemd, through the module's runner (C locale)."""
    systemctl = cmds.find_live("systemctl")
    if not systemctl:
        return False
    rc, out, _err = cmds.run([systemctl, "show", "--property=ActiveState", "--value", unit])
    return rc == 0 and out.strip() in ("active", "reloading", "activating")


def execute(p: dict, host: Host, check_mode: bool) -> dict:
    """The module's run: the model readable by the service user, the port free or the unit's own. Changes nothing;
    Failed with the model's and the port's facts when a check fails. In check mode with ``model_pending``, a model
    path that does not exist yet (an earlier task of the run creates it) is reported as pending, with a warning."""
    fs, cmds = host.fs, host.cmd
    if not 1 <= p["port"] <= 65535:
        raise Failed(f"port {p['port']} is outside 1..65535", actions=[])
    model = {"path": p["model"], "kind": "hub id", "config": None, "readable_by": None}
    if p["model_is_path"] and check_mode and p.get("model_pending") and not fs.exists(p["model"]):
        model = {"path": p["model"], "kind": "pending", "config": None, "readable_by": None}
        host.warn(f"Model path {p['model']} does not exist yet; an earlier task of this run puts it in place "
                  "(model_pending), which check mode only previewed. The real run checks it.")
    elif p["model_is_path"]:
        model, err = check_model(fs, p["model"], p["user"], p["protect_home"])
        if err:
            raise Failed(err, model=model, actions=[])
    address = p["host"]
    if fs.root == "/":
        try:
            address = socket.getaddrinfo(address, p["port"], type=socket.SOCK_STREAM)[0][4][0]
        except socket.gaierror as exc:
            raise Failed(f"Cannot resolve vllm_service_host {address!r} on this host: {exc}", model=model,
                         actions=[]) from None
    probe = bind_probe if fs.root == "/" else None
    port, err = check_port(fs, address, p["port"], p["unit"], p["user"], unit_active(cmds, p["unit"]),
                           expect_ours=p["expect_ours"], probe=probe)
    if err:
        raise Failed(err, model=model, port=port, actions=[])
    return {"changed": False, "actions": [], "model": model, "port": port, "diff": {}}

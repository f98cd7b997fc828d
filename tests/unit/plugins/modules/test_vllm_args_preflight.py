# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_preflight (the vllm_service role's check before a restart): /proc/net/tcp parsing, who
holds a port (a fake /proc tree and a real socket on this machine), address overlap, the model
path checks, and main() with its messages."""

from __future__ import annotations

import json
import os
import socket

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.modules import vllm_preflight as vp
from tests.unit.plugins.modules.uthelper import UTHelper, run_module

# /proc/net/tcp and tcp6 as a Debian 12 container showed them (a python3 -m http.server on
# 127.0.0.1:8123 owned by uid 997, sshd on 0.0.0.0:22 and [::]:22, an established connection).
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1FBB 00000000:0000 0A 00000000:00000000 00:00000000 00000000   997        0 145363 1 0000000006b03603 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 20311 1 00000000a1b2c3d4 100 0 0 10 0
   2: 0100007F:1FBB 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000   997        0 0 1 0000000011111111 20 4 30 10 -1
"""
TCP6_HEAD = ("  sl  local_address                         remote_address                        st tx_queue rx_queue "
             "tr tm->when retrnsmt   uid  timeout inode")
TCP6_ROWS = [  # local, uid, inode; remote all zeros, state 0A (LISTEN)
    ("00000000000000000000000000000000:0016", 0, 20313),
    ("0000000000000000FFFF00000100007F:1F40", 999, 30001),
    ("00000000000000000000000001000000:1F41", 999, 30002),
]
TCP6 = "\n".join([TCP6_HEAD] + [
    f"   {i}: {local} 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 "
    f"{uid:>5}        0 {inode} 1 0000000022222222 100 0 0 10 0" for i, (local, uid, inode) in enumerate(TCP6_ROWS)]) + "\n"
# cgroup v1 (the hybrid hierarchy of this CI machine, seen inside a podman container) and v2
CGROUP_V1 = ("9:name=systemd:/libpod_parent/libpod-53a8/system.slice/probe.service\n"
             "8:pids:/libpod_parent/libpod-53a8\n1:cpu:/libpod_parent/libpod-53a8\n0::/libpod_parent/libpod-53a8\n")
CGROUP_V2 = "0::/system.slice/vllm.service\n"


def test_parse_proc_net_listeners_only():
    socks = vp.parse_proc_net(TCP, v6=False)
    assert socks == [{"address": "127.0.0.1", "port": 8123, "uid": 997, "inode": 145363},
                     {"address": "0.0.0.0", "port": 22, "uid": 0, "inode": 20311}]


def test_parse_proc_net_v6_and_v4_mapped():
    socks = vp.parse_proc_net(TCP6, v6=True)
    assert [(s["address"], s["port"]) for s in socks] == [("::", 22), ("::ffff:127.0.0.1", 8000), ("::1", 8001)]


@pytest.mark.parametrize("listener, wanted, clash", [
    ("127.0.0.1", "127.0.0.1", True),
    ("0.0.0.0", "127.0.0.1", True),
    ("127.0.0.1", "0.0.0.0", True),
    ("10.0.0.5", "127.0.0.1", False),
    ("::", "127.0.0.1", True),
    ("127.0.0.1", "::", True),
    ("::1", "127.0.0.1", False),
    ("::1", "0.0.0.0", False),
    ("::ffff:127.0.0.1", "127.0.0.1", True),
    ("fd00::1", "fd00::1", True),
    ("fd00::1", "fd00::2", False),
])
def test_overlaps(listener, wanted, clash):
    assert vp.overlaps(listener, wanted) is clash


def test_unit_of():
    assert vp.unit_of(CGROUP_V1) == "probe.service"
    assert vp.unit_of(CGROUP_V2) == "vllm.service"
    assert vp.unit_of("0::/user.slice/user-0.slice/session-3.scope\n") == "session-3.scope"
    assert vp.unit_of("0::/\n") is None and vp.unit_of("") is None


# ---- a fake /proc -------------------------------------------------------------------------------------
def fake_proc(root, procs, tcp=TCP, tcp6=TCP6):
    """procs: {pid: {"inodes": [...], "cgroup": text, "cmdline": [...], "hidden": bool}}"""
    net = root / "proc" / "net"
    net.mkdir(parents=True)
    (net / "tcp").write_text(tcp)
    (net / "tcp6").write_text(tcp6)
    for pid, spec in procs.items():
        d = root / "proc" / str(pid)
        d.mkdir(parents=True)
        if spec.get("hidden"):
            # an fd table that cannot be listed (EACCES in a container; here a file: ENOTDIR)
            (d / "fd").write_text("")
        else:
            (d / "fd").mkdir()
            for i, inode in enumerate(spec.get("inodes", [])):
                os.symlink(f"socket:[{inode}]", d / "fd" / str(i + 3))
            os.symlink("/dev/null", d / "fd" / "0")
        (d / "cgroup").write_text(spec.get("cgroup", ""))
        (d / "cmdline").write_text("\0".join(spec.get("cmdline", [])) + "\0")
    (root / "proc" / "self").mkdir()
    return HostFS(str(root))


def test_listeners_name_pid_command_and_unit(tmp_path):
    fs = fake_proc(tmp_path, {4242: {"inodes": [145363], "cgroup": CGROUP_V1,
                                     "cmdline": ["/usr/bin/python3", "-m", "http.server", "8123"]}})
    [sock] = vp.listeners(fs, 8123)
    assert sock["pids"] == [4242] and sock["unit"] == "probe.service"
    assert sock["command"] == "/usr/bin/python3 -m http.server 8123" and not sock["hidden"]


def test_port_held_by_another_unit_is_a_clear_error(tmp_path):
    fs = fake_proc(tmp_path, {4242: {"inodes": [145363], "cgroup": CGROUP_V1,
                                     "cmdline": ["/usr/bin/python3", "-m", "http.server", "8123"]}})
    port, err = vp.check_port(fs, "127.0.0.1", 8123, "vllm.service", "vllm", unit_active=True, probe=None)
    assert err == ("Port 8123 on 127.0.0.1 is already in use by pid 4242 (/usr/bin/python3 -m http.server 8123; "
                   "unit probe.service), not by vllm.service. Pick another vllm_service_port or stop that process. "
                   "vllm.service was left as it is.")
    assert port["free"] is False and port["ours"] is False


def test_port_held_by_our_unit_is_fine(tmp_path):
    fs = fake_proc(tmp_path, {77: {"inodes": [30001], "cgroup": CGROUP_V2, "cmdline": ["/opt/v/bin/python", "-m", "vllm"]}})
    port, err = vp.check_port(fs, "127.0.0.1", 8000, "vllm.service", "vllm", unit_active=True, probe=None)
    assert err is None and port["ours"] is True and port["listeners"][0]["ours"]


def test_wildcard_listener_blocks_a_specific_address(tmp_path):
    fs = fake_proc(tmp_path, {1: {"inodes": [20311, 20313], "cgroup": "0::/system.slice/ssh.service\n",
                                  "cmdline": ["sshd: /usr/sbin/sshd -D"]}})
    _port, err = vp.check_port(fs, "10.1.2.3", 22, "vllm.service", "vllm", unit_active=False, probe=None)
    assert "Port 22 on 10.1.2.3 is already in use by pid 1" in err and "unit ssh.service" in err


def test_other_address_on_the_same_port_is_free(tmp_path):
    fs = fake_proc(tmp_path, {})
    port, err = vp.check_port(fs, "127.0.0.1", 8001, "vllm.service", "vllm", unit_active=False, probe=None)
    assert err is None and port["free"] is True and port["listeners"] == []  # only ::1:8001 listens


def test_hidden_fd_tables_fall_back_to_the_socket_user(tmp_path):
    """Unprivileged containers hide other users' /proc/PID/fd even from root."""
    fs = fake_proc(tmp_path, {77: {"inodes": [30001], "cgroup": CGROUP_V2, "hidden": True}})
    # uid 999 does not resolve here: name it for the test
    port, err = vp.check_port(fs, "127.0.0.1", 8000, "vllm.service", "999", unit_active=True, probe=None)
    assert err is None and port["ours"]
    port, err = vp.check_port(fs, "127.0.0.1", 8000, "vllm.service", "999", unit_active=False, probe=None)
    assert "already in use by a process of user 999" in err


def test_expect_ours(tmp_path):
    fs = fake_proc(tmp_path, {})
    _port, err = vp.check_port(fs, "127.0.0.1", 9999, "vllm.service", "vllm", unit_active=True, expect_ours=True,
                               probe=None)
    assert err == "Port 9999 on 127.0.0.1 is not held by vllm.service: nothing listens on it. Is the service running on another port?"


def test_bind_refused_without_a_listener(tmp_path):
    fs = fake_proc(tmp_path, {})
    _port, err = vp.check_port(fs, "127.0.0.1", 9999, "vllm.service", "vllm", False, probe=lambda h, p: 98)
    assert "cannot be bound (in use), but no listening socket was found" in err


def test_address_not_on_this_host(tmp_path):
    fs = fake_proc(tmp_path, {})
    _port, err = vp.check_port(fs, "192.0.2.7", 8000, "vllm.service", "vllm", False, probe=lambda h, p: 99)
    assert err.startswith("Cannot bind 192.0.2.7:8000: the address is not on this host")


def test_a_real_listener_on_this_machine():
    """A socket this test opens, found through the real /proc and refused by a real bind."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        assert vp.bind_probe("127.0.0.1", port) != 0
        result, err = vp.check_port(HostFS("/"), "127.0.0.1", port, "vllm.service", "vllm", False)
        assert result["free"] is False
        assert f"Port {port} on 127.0.0.1 is already in use by pid {os.getpid()}" in err
    finally:
        srv.close()
    assert vp.bind_probe("127.0.0.1", port) == 0


# ---- the model ---------------------------------------------------------------------------------------------
def model_dir(root, name="tiny", files=("config.json", "model.safetensors"), mode=0o755):
    d = root / "srv" / "models" / name
    d.mkdir(parents=True)
    for f in files:
        (d / f).write_text("{}")
        os.chmod(d / f, 0o644)
    os.chmod(d, mode)
    os.chmod(root / "srv" / "models", 0o755)
    os.chmod(root / "srv", 0o755)
    os.chmod(root, 0o755)
    return d


def test_model_directory_ok(tmp_path):
    model_dir(tmp_path)
    facts, err = vp.check_model(HostFS(str(tmp_path)), "/srv/models/tiny", "nobody", True)
    assert err is None and facts == {"path": "/srv/models/tiny", "kind": "directory", "config": True, "readable_by": "nobody"}


def test_model_missing_names_the_deepest_existing_directory(tmp_path):
    model_dir(tmp_path)
    _facts, err = vp.check_model(HostFS(str(tmp_path)), "/srv/models/big/v3", "vllm", True)
    assert err == ("Model path /srv/models/big/v3 does not exist on this host (the deepest existing directory is "
                   "/srv/models). Copy the model there first or fix vllm_service_model. The service was left as it is.")


def test_model_without_config(tmp_path):
    model_dir(tmp_path, files=("weights.bin",))
    _facts, err = vp.check_model(HostFS(str(tmp_path)), "/srv/models/tiny", None, True)
    assert err.startswith("Model directory /srv/models/tiny has no config.json")


def test_gguf_file_and_other_files(tmp_path):
    d = model_dir(tmp_path, files=("m.gguf", "notes.txt"))
    facts, err = vp.check_model(HostFS(str(tmp_path)), "/srv/models/tiny/m.gguf", None, True)
    assert err is None and facts["kind"] == "gguf"
    _facts, err = vp.check_model(HostFS(str(tmp_path)), "/srv/models/tiny/notes.txt", None, True)
    assert "is a file but not a .gguf" in err
    assert d.exists()


def test_protect_home(tmp_path):
    _facts, err = vp.check_model(HostFS(str(tmp_path)), "/root/models/tiny", "vllm", True)
    assert err.startswith("Model path /root/models/tiny is under /root, which the unit's ProtectHome=yes hides")
    _facts, err = vp.check_model(HostFS(str(tmp_path)), "/home/ai/m", "vllm", False)
    assert "does not exist" in err


def test_model_not_readable_by_the_service_user(tmp_path):
    model_dir(tmp_path, mode=0o700)
    _facts, err = vp.check_model(HostFS(str(tmp_path)), "/srv/models/tiny", "nobody", True)
    assert "is not reachable by nobody: /srv/models/tiny (mode drwx------" in err
    _facts, err = vp.check_model(HostFS(str(tmp_path)), "/srv/models/tiny", "root", True)
    assert err is None


def test_unknown_user_is_judged_as_others(tmp_path):
    d = model_dir(tmp_path)
    os.chmod(d / "config.json", 0o600)
    _facts, err = vp.check_model(HostFS(str(tmp_path)), "/srv/models/tiny", "no-such-user-here", True)
    assert "is not readable by others (-rw-------" in err


# ---- main() -------------------------------------------------------------------------------------------------


def test_main_ok_and_read_only(tmp_path, capsys):
    model_dir(tmp_path)
    fake_proc(tmp_path, {})
    result = run_module(vp, {"model": "/srv/models/tiny", "port": 8002, "unit": "vllm.service", "user": "nobody",
                             "root": str(tmp_path)}, capsys)
    assert result["changed"] is False and result["actions"] == []
    assert result["model"]["config"] is True and result["port"]["free"] is True


def test_main_missing_model_fails_without_traceback(tmp_path, capsys):
    fake_proc(tmp_path, {})
    result = run_module(vp, {"model": "/srv/models/none", "port": 8000, "unit": "vllm.service", "root": str(tmp_path)}, capsys)
    assert result["failed"] and "Model path /srv/models/none does not exist" in result["msg"]
    assert "Traceback" not in json.dumps(result)


def test_main_port_conflict(tmp_path, capsys):
    model_dir(tmp_path)
    fake_proc(tmp_path, {4242: {"inodes": [145363], "cgroup": CGROUP_V1, "cmdline": ["/usr/bin/python3", "-m", "http.server"]}})
    result = run_module(vp, {"model": "/srv/models/tiny", "port": 8123, "unit": "vllm.service", "user": "nobody",
                             "root": str(tmp_path)}, capsys)
    assert result["failed"] and "already in use by pid 4242" in result["msg"]
    assert result["port"]["listeners"][0]["unit"] == "probe.service"


def test_main_hub_id_is_not_checked(tmp_path, capsys):
    fake_proc(tmp_path, {})
    result = run_module(vp, {"model": "Qwen/Qwen3-8B", "model_is_path": False, "port": 8002, "unit": "vllm.service",
                             "root": str(tmp_path)}, capsys)
    assert not result.get("failed") and result["model"]["kind"] == "hub id"


def test_main_bad_port(tmp_path, capsys):
    result = run_module(vp, {"model": "/m", "port": 0, "unit": "vllm.service", "root": str(tmp_path)}, capsys)
    assert result["failed"] and result["msg"] == "port 0 is outside 1..65535"


# ---- main() through the YAML command cases (test_vllm_preflight.yaml): systemctl show and its C locale ----
def build_proc(root, hidden_pid: int) -> None:
    fake_proc(root, {hidden_pid: {"hidden": True, "cmdline": ["/opt/gpufleet/vllm/current/bin/python", "-m", "vllm"]}})


test_vllm_preflight_case = UTHelper(vp, os.path.join(os.path.dirname(__file__), "test_vllm_preflight.py"),
                                    builders={"proc": build_proc}).test_function()

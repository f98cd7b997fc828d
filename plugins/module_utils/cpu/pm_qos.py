# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The C-state limit through the kernel's CPU latency QoS: a holder of ``/dev/cpu_dma_latency``.

The kernel's documented interface (Documentation/power/pm_qos_interface.rst): a process opens
``/dev/cpu_dma_latency``, writes a 32-bit latency in µs and keeps the file open; the request lasts until the file is
closed (the process ends), and cpuidle's governors then pick no idle state whose exit latency is above the lowest
request, on every CPU. A read of the file gives that value in force (the lowest of all holders) as a 32-bit number.
It is what tuned's ``force_latency`` does, and it works where the cpuidle sysfs ``disable`` files do not help (a
driver that exposes no states, a state list that changes with the firmware) without touching any of them.

gpufleet.inference.cpu_tuning with ``cstate_method: pm_qos`` installs the holder as a service,
``gpufleet-pm-qos.service`` (``Type=notify``: the holder says READY only after its write was read back, so
``systemctl start`` returns with the limit in force), running ``/usr/local/libexec/gpufleet-pm-qos-hold LATENCY``: this
file, carried by _host/bundle.py, whose main() is the holder. The module reads it back (the unit active, the value
it holds, the value the device gives), enables it for the boot, and on revert stops, disables and removes it.

Standard library only, no I/O in the pure part; hold() and main() are the holder's process.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import socket
import struct
import sys

from ansible_collections.gpufleet.inference.plugins.module_utils._host import units

DEVICE = "/dev/cpu_dma_latency"
HOLD_SCRIPT = "/usr/local/libexec/gpufleet-pm-qos-hold"
UNIT_NAME = "gpufleet-pm-qos.service"
UNIT_PATH = "/etc/systemd/system/" + UNIT_NAME
UNIT_WANTS = "/etc/systemd/system/multi-user.target.wants/" + UNIT_NAME
ENTRY = "cpu.pm_qos"  # this file, under plugins/module_utils: the holder's script carries it
PROG = "gpufleet-pm-qos-hold"
# The kernel's default (no request): PM_QOS_CPU_LATENCY_DEFAULT_VALUE, 2000 s in µs; a request is an s32.
NO_LIMIT_US = 2_000_000_000
HEADER = (
    "Installed by Ansible (gpufleet.inference.cpu_tuning, cstate_method pm_qos). Run by " + UNIT_NAME + ":",
    "  " + PROG + " [--device PATH] LATENCY_US",
    "Writes LATENCY_US to " + DEVICE + " as a 32-bit value and holds the file open, so no CPU enters an idle",
    "state whose exit latency is above it; the limit ends when this process does.",
)
REINSTALL = "Run gpufleet.inference.cpu_tuning again to rewrite this script."
PYTHON_HINT = ("The module writes the interpreter it runs under: run it again with ansible_python_interpreter set to a "
               "Python 3.7 or later.")


class PmQosError(Exception):
    """A latency or a device that cannot be used; the message says which, where and what to do."""


# ---- pure ----------------------------------------------------------------------------------------
def check_latency(value, where: str = "cstate_max_latency_us") -> int:
    """The latency in µs as an int from 0 to NO_LIMIT_US - 1; PmQosError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < NO_LIMIT_US:
        raise PmQosError(f"{where}={value!r} is out of range: give a whole number of µs from 0 to {NO_LIMIT_US - 1} "
                         f"({DEVICE} takes a 32-bit value). Nothing was changed.")
    return value


def encode(latency_us: int) -> bytes:
    """The 4 bytes the holder writes: a native-endian s32, as the kernel's write handler reads it."""
    return struct.pack("=i", latency_us)


def decode(data: bytes | None) -> int | None:
    """The value in force from a read of the device (a native-endian s32); None for anything but 4 bytes."""
    if not data or len(data) != 4:
        return None
    return struct.unpack("=i", data)[0]


def render_unit(latency_us: int, script: str = HOLD_SCRIPT) -> str:
    return units.render_unit(
        ["Installed by Ansible (gpufleet.inference.cpu_tuning, cstate_method pm_qos); removed by its state=absent.",
         f"Holds {DEVICE} open with {latency_us} us: no CPU enters an idle state whose exit latency is above it",
         f"while this service runs. The value in force (the lowest of all holders) is what a read of {DEVICE} gives.",
         f"Its log: journalctl -u {UNIT_NAME}"],
        [f"Description=Hold the CPU latency limit of gpufleet.inference ({latency_us} us, PM QoS)",
         "After=systemd-modules-load.service"],
        ["Type=notify", f"ExecStart={script} {latency_us}", "Restart=on-failure", "RestartSec=5"], "multi-user.target")


def held_of(unit_text: str | None) -> int | None:
    """The latency an installed unit holds (its ExecStart's last word), None without a unit or a number there."""
    m = re.search(r"^ExecStart=(.+)$", unit_text or "", re.M)
    if not m:
        return None
    words = shlex.split(m.group(1))
    return int(words[-1]) if len(words) == 2 and words[-1].isdigit() else None


def wanted_files(script: str, latency_us: int | None) -> list[tuple[str, str | None, int]]:
    """(path, content or None for absent, mode) of the holder's script and unit: there while a latency is held."""
    return [(HOLD_SCRIPT, script if latency_us is not None else None, 0o755),
            (UNIT_PATH, render_unit(latency_us) if latency_us is not None else None, 0o644)]


def readback_problem(latency_us: int, active: str | None, in_force: int | None) -> str | None:
    """Why a holder of ``latency_us`` is not in force (None when it is): its unit not ``active``, or the device giving
    a value above it (a lower one is another holder's stricter request, which the kernel honours: fine)."""
    if active is not None and active != "active":
        return f"{UNIT_NAME} is {active or 'not running'} (systemctl is-active), so nothing holds {DEVICE}"
    if in_force is not None and in_force > latency_us:
        return f"{DEVICE} gives {in_force} us in force, above the {latency_us} us the holder asked for"
    return None


# ---- the holder's process ------------------------------------------------------------------------
def notify(message: str, environ=None) -> bool:
    """sd_notify(3): ``message`` to systemd's NOTIFY_SOCKET; False when there is none (not run by a Type=notify unit)."""
    address = (environ if environ is not None else os.environ).get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(message.encode())
    return True


def read_in_force(device: str = DEVICE) -> int | None:
    """The value in force, from a read of the device (the kernel gives the lowest request, whoever holds it)."""
    with open(device, "rb") as fh:
        return decode(fh.read(4))


def hold(device: str, latency_us: int, wait=signal.pause, environ=None, out=sys.stdout) -> int:
    """Write ``latency_us`` to ``device``, read the value in force back, tell systemd READY and hold the file open until
    ``wait`` returns (never, for the service: SIGTERM ends the process and the kernel drops the request). Exit status
    0, 1 when the value does not take (above the request), 2 when the device cannot be opened or written."""
    try:
        fd = os.open(device, os.O_WRONLY)
    except OSError as err:
        out.write(f"{PROG}: cannot open {device}: {err.strerror}. The kernel has no CPU latency QoS device here "
                  "(or this is not root); use cstate_method cpuidle.\n")
        return 2
    try:
        if os.write(fd, encode(latency_us)) != 4:
            out.write(f"{PROG}: short write to {device}\n")
            return 2
        in_force = read_in_force(device)
        if in_force is None or in_force > latency_us:
            out.write(f"{PROG}: wrote {latency_us} us to {device} but it reads back {in_force}: the request did not take\n")
            return 1
        out.write(f"{PROG}: holding {device} at {latency_us} us (in force: {in_force} us)\n")
        out.flush()
        notify(f"READY=1\nSTATUS=holding {latency_us} us (in force {in_force} us)", environ)
        wait()
        return 0
    except OSError as err:
        out.write(f"{PROG}: {device}: {err.strerror}\n")
        return 2
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="Hold a CPU latency limit through " + DEVICE + ".")
    parser.add_argument("--device", default=DEVICE, help="the device to hold (tests); default " + DEVICE)
    parser.add_argument("latency_us", type=int)
    args = parser.parse_args(argv)
    try:
        latency = check_latency(args.latency_us, "LATENCY_US")
    except PmQosError as err:
        sys.stdout.write(f"{PROG}: {err}\n")
        return 2
    signal.signal(signal.SIGTERM, _stop)
    try:
        return hold(args.device, latency)
    except Stopped:  # systemctl stop: the file is closed (hold's finally) and the kernel drops the request
        return 0


class Stopped(Exception):
    """SIGTERM arrived: the holder ends."""


def _stop(_signum, _frame):
    raise Stopped()

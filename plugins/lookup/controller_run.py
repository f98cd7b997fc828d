# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: controller_run
short_description: This ansible-playbook run's identity on the controller, and whether a lease's holder still lives
version_added: 0.2.0
description:
  - V(identity) returns this run's controller process - C(controller) (the controller's host name), C(pid) and C(pid_start)
    (the ansible-playbook process and its start time in clock ticks since boot, from C(/proc)), C(user).
    C(gpufleet.inference.host_lease) keeps it in the lease as the holder.
  - V(dead_holder) with O(lease) returns the lease's C(run_id) when its holder ran on this controller and its process is
    gone (an ansible-playbook killed with SIGKILL), so that a plain re-run may take the lease over; an empty string
    otherwise (no lease, a live holder, or a holder on another controller, which only expiry and an explicit break free).
options:
  _terms:
    description: V(identity) or V(dead_holder).
    required: true
    type: list
    elements: str
  lease:
    description: The lease as C(gpufleet.inference.host_lease) returns it (for V(dead_holder)).
    type: dict
    default: {}
author:
  - gpufleet.inference contributors (@gpufleet)
"""

EXAMPLES = r"""
- name: Take the host's lease, over a dead run of this controller if there is one
  gpufleet.inference.host_lease:
    run_id: "{{ run_id }}"
    holder: "{{ lookup('gpufleet.inference.controller_run', 'identity') }}"
    take_over: "{{ lookup('gpufleet.inference.controller_run', 'dead_holder', lease=current.lease) }}"
"""

RETURN = r"""
_raw:
  description: The identity (a dict) or the run id of a dead holder (a string, empty when none).
  type: raw
"""

import getpass
import os
import socket

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.gpufleet.inference.plugins.module_utils.lease.host_lease import holder_status, proc_start


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return None


def playbook_process() -> int:
    """The topmost ancestor that runs ansible-playbook (workers are forks with the same command line)."""
    pid = os.getpid()
    for _depth in range(16):
        parent = os.getppid() if pid == os.getpid() else _ppid(pid)
        if not parent or "ansible" not in (_read(f"/proc/{parent}/cmdline") or ""):
            return pid
        pid = parent
    return pid


def _ppid(pid: int) -> int | None:
    stat = _read(f"/proc/{pid}/stat")
    if not stat or ")" not in stat:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return None


def controller_name() -> str:
    """The host name and the start of /etc/machine-id: two controllers both called localhost differ."""
    machine = (_read("/etc/machine-id") or "").strip()[:12]
    return f"{socket.gethostname()}/{machine}" if machine else socket.gethostname()


def identity() -> dict:
    pid = playbook_process()
    return {"controller": controller_name(), "pid": pid, "pid_start": proc_start(_read(f"/proc/{pid}/stat")),
            "user": getpass.getuser()}


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        unknown = set(kwargs) - {"lease"}
        if unknown:
            raise AnsibleLookupError(f"controller_run: unknown options {sorted(unknown)}: only lease")
        out = []
        for term in terms:
            if term == "identity":
                out.append(identity())
            elif term == "dead_holder":
                lease = kwargs.get("lease") or {}
                status = holder_status(lease, identity(), lambda pid: _read(f"/proc/{pid}/stat"))
                out.append(lease.get("run_id", "") if status == "dead" else "")
            else:
                raise AnsibleLookupError(f"controller_run: unknown term {term!r}: use identity or dead_holder")
        return out

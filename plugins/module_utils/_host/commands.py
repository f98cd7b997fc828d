# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one command runner of the collection, next to HostFS (the one file seam).

A HostCmd finds a host's tool under the HostFS ``root`` (``get_bin_path`` on ``/``; the sbin and
bin directories of the tree otherwise), wraps a command in ``chroot ROOT`` when the root is not
``/``, and runs every command with the C locale, so that the parsers read the English, unlocalised
output they were written for. It takes the AnsibleModule as an object with ``get_bin_path`` and
``run_command`` (this file never imports AnsibleModule); a missing tool is a ToolMissing, which the
module's ``main()`` turns into its failure.
"""

from __future__ import annotations

import os
import sys

# The locale of every command a module runs (LC_ALL wins over the rest; the others are for tools
# that read one of them directly).
C_LOCALE = {"LANG": "C", "LC_ALL": "C", "LC_MESSAGES": "C", "LC_CTYPE": "C"}
# Where a tool is looked for inside a root other than / (there is no PATH of that tree to search).
SBIN_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


class ToolMissing(Exception):
    """A required tool is not installed under the root; the message names it, the root and where it looked."""


class HostCmd:
    """Find, wrap and run the host's commands for one module run under ``fs.root``."""

    def __init__(self, module, fs):
        self.module = module
        self.fs = fs
        self._systemctl: str | None = None
        # Also for commands a module runs through module.run_command directly.
        module.run_command_environ_update = dict(C_LOCALE)

    @property
    def chrooted(self) -> bool:
        return self.fs.root != "/"

    def find(self, name: str, required: bool = False, hint: str = "") -> str | None:
        """The path of tool ``name`` (a host path), or None when it is not there and not ``required``.

        On ``/`` this is ``get_bin_path`` (which fails the module itself for a required tool); under
        another root the tree's sbin and bin directories, and ToolMissing (with ``hint``: what to
        install) for a required tool that is not there."""
        if not self.chrooted:
            return self.module.get_bin_path(name, required=required)
        found = next((f"{d}/{name}" for d in SBIN_DIRS if self.fs.exists(f"{d}/{name}")), None)
        if found is None and required:
            raise ToolMissing(f"{name} is not installed under root {self.fs.root} (looked in {', '.join(SBIN_DIRS)})"
                              + (f": {hint}" if hint else "") + ".")
        return found

    def find_live(self, name: str, required: bool = False) -> str | None:
        """The path of tool ``name`` on the machine the module runs on, whatever the root: for tools that are pointed
        at the tree by an option of their own (``setpci -O sysfs.path=ROOT/sys/bus/pci``), never chrooted."""
        return self.module.get_bin_path(name, required=required)

    def systemctl(self, *args: str) -> list[str]:
        """``systemctl ARGS`` for this root: the live one, with ``--root=ROOT`` for a tree other than ``/``
        (systemctl then enables and disables units offline, in the tree)."""
        if self._systemctl is None:
            self._systemctl = self.find_live("systemctl", required=True)
        return [self._systemctl] + ([f"--root={self.fs.root}"] if self.chrooted else []) + list(args)

    def script_python(self) -> str:
        """The interpreter a boot-time re-apply script names in its #! line: the one running this module, which runs
        the module_utils the script carries, by its stable name /usr/bin/python3 when that is the same interpreter (on
        EL 8, /usr/bin/python3 may be a 3.6 beside the 3.11 Ansible uses). Under a tree: the tree's /usr/bin/python3
        if it has one, else this one."""
        running = sys.executable or "/usr/bin/python3"
        if self.chrooted:
            return "/usr/bin/python3" if self.fs.exists("/usr/bin/python3") else running
        try:
            return "/usr/bin/python3" if os.path.samefile("/usr/bin/python3", running) else running
        except OSError:
            return running

    def unit_step(self, argv: list[str], in_place: str, fix: str, wants: str | None = None, unit: str = "") -> dict | None:
        """Run one systemctl step of installing a boot-time re-apply (enable, disable, daemon-reload, start) and check
        that it took: after an enable, that ``wants`` (the unit's link in its target's .wants) exists. None when it
        did; else ``{msg, rc, stderr}`` for the caller's failure (changed: the step ran), the message saying what
        failed, what is in place all the same (``in_place``) and what to do (``fix``)."""
        rc, out, err = self.run(argv)
        cmd = " ".join(argv)
        if rc != 0:
            return {"msg": f"'{cmd}' exited {rc}: {(err or out).strip()}. {in_place}. {fix}", "rc": rc, "stderr": err}
        if wants and not self.fs.exists(wants):
            name = unit or os.path.basename(wants)
            return {"msg": f"'{cmd}' succeeded but {wants} does not exist: {name} will not run at boot. {in_place}. Look "
                           f"for an [Install] section systemd rejected (systemctl cat {name}).", "rc": rc, "stderr": err}
        return None

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` as it runs on the host: as is on ``/``, through ``chroot ROOT`` otherwise."""
        if not self.chrooted:
            return list(argv)
        return [self.module.get_bin_path("chroot", required=True), self.fs.root] + list(argv)

    def run(self, argv: list[str], environ: dict | None = None) -> tuple[int, str, str]:
        """Run ``argv`` as given (already wrapped where needed), in the C locale with ``environ`` added (a probe's
        CUDA_DEVICE_ORDER, ...): (rc, stdout, stderr)."""
        return self.module.run_command(argv, environ_update=dict(C_LOCALE, **(environ or {})))

    def run_in_root(self, argv: list[str]) -> tuple[int, str, str]:
        """Run a command of the tree under root (``argv`` wrapped by argv())."""
        return self.run(self.argv(argv))

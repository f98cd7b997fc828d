# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one shape of every module: ``main()`` calls ``run_module()`` with its argument spec and its executor.

``run_module()`` parses the options (AnsibleModule), builds the ``Host`` an executor may touch (the files under
``root``, the commands, the warnings), calls the executor of the module, ``<topic>/<module>.py``'s
``execute(params, host, check_mode)``, and ends the run through ``finish()``: a path option no run can use is
refused first, the executor's errors become ``fail_json`` with what to do, the diff is returned in diff mode only.
Executors never see the AnsibleModule object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils._host.commands import HostCmd, ToolMissing
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import finish


@dataclass(frozen=True)
class ModuleSpec:
    """A module's name (for messages), its options, what it reads and writes (said when a host I/O error stops it), the
    errors its executor raises with a message fit for the user, and AnsibleModule's other checks
    (``required_if``, ``mutually_exclusive``, ...)."""

    name: str
    argument_spec: Mapping
    does: str
    errors: tuple = ()
    checks: Mapping = field(default_factory=dict)


def run_module(spec: ModuleSpec, execute: Callable[[dict, Host, bool], dict]) -> None:
    """Run one module: parse, build the Host, call ``execute(params, host, check_mode)``, finish."""
    module = AnsibleModule(argument_spec=dict(spec.argument_spec), supports_check_mode=True, **spec.checks)
    fs = HostFS(module.params.get("root", "/"))
    host = Host(fs=fs, cmd=HostCmd(module, fs), warn=module.warn)
    finish(module, spec.name, spec.does, lambda: execute(module.params, host, module.check_mode),
           tuple(spec.errors) + (ToolMissing,))

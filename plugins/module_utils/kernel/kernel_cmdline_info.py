# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.kernel_cmdline_info executes: kernel/cmdline.py's gather() of the owners' arguments (the
drop-in or the state file kernel_cmdline keeps) against /proc/cmdline, read through the Host's files. Never writes."""

from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.cmdline import gather


def execute(params: dict, host: Host, check_mode: bool) -> dict:  # pylint: disable=unused-argument  # read-only
    """The owners' arguments against the running kernel's; ``actions`` always empty. Raises CmdlineError."""
    return dict(changed=False, actions=[], **gather(host.fs, params["owner"]))

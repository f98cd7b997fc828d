# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``Host``: what an executor, ``<topic>/<module>.py``'s ``execute(params, host, check_mode)``, touches on the host.
Standard library only, so that executors (imported by filters on the controller, and by re-apply scripts) never
load AnsibleModule; ``_host/module.py``'s run_module() builds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ansible_collections.gpufleet.inference.plugins.module_utils._host.commands import HostCmd
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS


@dataclass(frozen=True)
class Host:
    """What an executor touches on the host: its files under ``root`` (``fs``), its commands (``cmd``), and where its
    warnings go (``warn``, the module's)."""

    fs: HostFS
    cmd: HostCmd
    warn: Callable[[str], None]

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether health.yml drains a host, as a filter (logic in module_utils/maintenance/drain.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.inference.plugins.module_utils.maintenance.drain import DrainError, health_drain as decide


def health_drain(findings, history=None, host="", margin=0.1):
    try:
        return decide(findings, history or None, str(host), margin)
    except DrainError as err:
        raise AnsibleFilterError(f"health_drain: {err}") from None


class FilterModule:
    """Drain filters."""

    def filters(self):
        return {"health_drain": health_drain}

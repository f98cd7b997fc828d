# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The health comparison as a filter (logic in module_utils/pcie/health)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.health import compare


def health_compare(current, previous=None, kernel_log="", previous_kernel=None, current_kernel=None):
    if not isinstance(current, dict) or "devices" not in current:
        raise AnsibleFilterError("health_compare: the input must be a pcie_facts result's pcie document (with devices)")
    if previous is not None and previous != {} and (not isinstance(previous, dict) or "devices" not in previous):
        raise AnsibleFilterError("health_compare: previous must be the pcie document of the previous audit, or empty")
    try:
        return compare(previous or None, current, kernel_log or "", previous_kernel or None, current_kernel or None)
    except (KeyError, TypeError, ValueError) as err:
        raise AnsibleFilterError(f"health_compare: cannot compare the audits ({err})") from err


class FilterModule:
    """Health filters."""

    def filters(self):
        return {"health_compare": health_compare}

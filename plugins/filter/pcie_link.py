# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the pcie_link and reboot roles (logic in module_utils, tested there)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.payload import payload_mismatches
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.reboot_contract import reboot_plan


def _reboot_plan(names, required, allowed=None):
    try:
        return reboot_plan(names, required, allowed)
    except (TypeError, ValueError) as err:
        raise AnsibleFilterError(f"reboot_plan: {err}; pass the <role>_reboot_required names, their values and the "
                                 "<role>_reboot_ok values in the same order") from err


def _payload_mismatches(devices, facts):
    if not isinstance(devices, dict) or not isinstance(facts, dict):
        raise AnsibleFilterError("payload_mismatches: expects the devices of a pcie_payload result and the pcie of a "
                                 "pcie_facts result (two dicts)")
    return payload_mismatches(devices, facts)


class FilterModule:
    """Reboot contract and payload verification filters."""

    def filters(self):
        return {"reboot_plan": _reboot_plan, "payload_mismatches": _payload_mismatches}

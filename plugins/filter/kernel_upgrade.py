# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fleet report filters of the kernel_upgrade and vllm_upgrade roles (logic in module_utils/change/report.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.inference.plugins.module_utils.change.report import (
    fleet_report, gate_summary, render_markdown,
)


def kernel_upgrade_report(records, hosts, run_id=""):
    """Per-host records of one rollout plus the hosts not reached -> the fleet report."""
    try:
        return fleet_report(list(records or []), list(hosts or []), str(run_id or ""))
    except (TypeError, ValueError, KeyError) as err:
        raise AnsibleFilterError(f"kernel_upgrade_report: {err}") from err


def kernel_upgrade_markdown(report):
    """The fleet report as Markdown."""
    try:
        return render_markdown(report)
    except (TypeError, ValueError, KeyError) as err:
        raise AnsibleFilterError(f"kernel_upgrade_markdown: {err}") from err


def kernel_upgrade_gate_summary(gate):
    """The parts of a throughput_gate result a host record keeps."""
    return gate_summary(gate or {})


class FilterModule:
    """Kernel upgrade report filters."""

    def filters(self):
        return {"kernel_upgrade_report": kernel_upgrade_report, "kernel_upgrade_markdown": kernel_upgrade_markdown,
                "kernel_upgrade_gate_summary": kernel_upgrade_gate_summary}

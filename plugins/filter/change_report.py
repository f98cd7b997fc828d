# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet report filters of every change kind's rollout (playbooks/tasks/change_record.yml; logic in
module_utils/change/report.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.inference.plugins.module_utils.change.report import (
    fleet_report, gate_summary, render_markdown,
)


def change_report(records, hosts, run_id=""):
    """Per-host records of one rollout plus the hosts not reached -> the fleet report."""
    try:
        return fleet_report(list(records or []), list(hosts or []), str(run_id or ""))
    except (TypeError, ValueError, KeyError) as err:
        raise AnsibleFilterError(f"change_report: {err}") from err


def change_report_markdown(report):
    """The fleet report as Markdown."""
    try:
        return render_markdown(report)
    except (TypeError, ValueError, KeyError) as err:
        raise AnsibleFilterError(f"change_report_markdown: {err}") from err


def change_gate_summary(gate):
    """The parts of a throughput_gate result a host record keeps."""
    return gate_summary(gate or {})


class FilterModule:
    """Change rollout report filters."""

    def filters(self):
        return {"change_report": change_report, "change_report_markdown": change_report_markdown,
                "change_gate_summary": change_gate_summary}

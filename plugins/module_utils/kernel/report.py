# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet report of a kernel rollout: the change flow's fleet report (change/report.py), whose records of the
kernel_upgrade role (format ``gpufleet.kernel_upgrade/1``) are of kind ``kernel``."""

from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils.change.report import (
    FORMAT, ORDER, fleet_report, gate_summary, host_row, render_markdown, verdict_parts,
)

__all__ = ["FORMAT", "ORDER", "fleet_report", "gate_summary", "host_row", "render_markdown", "verdict_parts"]

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that render measured-tuning states as the stage table (logic in module_utils/tuning/stage_table)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.inference.plugins.module_utils.tuning.stage_table import render_html, render_markdown
from ansible_collections.gpufleet.inference.plugins.module_utils.tuning.tune_measured import FORMAT


def _states(value):
    states = value if isinstance(value, list) else [value]
    for i, s in enumerate(states):
        if not isinstance(s, dict) or s.get("format") != FORMAT:
            raise AnsibleFilterError(f"stage table: item {i} is not a measured-tuning state ({FORMAT}); pass the "
                                     "state returned by gpufleet.inference.tune_measured (or a list of them)")
    return states


def stage_table_markdown(value, title="Measured tuning", note=""):
    return render_markdown(_states(value), title=str(title), note=str(note))


def stage_table_html(value, title="Measured tuning", note=""):
    return render_html(_states(value), title=str(title), note=str(note))


class FilterModule:
    """Stage table filters."""

    def filters(self):
        return {"stage_table_markdown": stage_table_markdown, "stage_table_html": stage_table_html}

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The change kinds' gate settings carry between_start_sd from the roles (<prefix>_gate_between_start_sd) to decide()."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.change import flow


class _Kind:
    var_prefix = "kernel_upgrade"


@pytest.mark.parametrize("given,passed", [(0.008, 0.008), ("0.008", 0.008), (None, None), ("", None), (0, 0.0)])
def test_gate_settings_pass_between_start_sd(given, passed):
    got = flow.gate_settings(_Kind, {"settings": {"gate": {"between_start_sd": given}}})
    assert got.get("between_start_sd") == passed
    assert flow.settings_problem(_Kind, {"settings": {"gate": {"between_start_sd": given}}}) == ""


def test_a_between_start_sd_out_of_range_is_a_settings_problem_naming_it():
    why = flow.settings_problem(_Kind, {"settings": {"gate": {"between_start_sd": 0.5}}})
    assert "between_start_sd must be" in why and "kernel_upgrade_gate_*" in why

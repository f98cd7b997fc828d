# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every change kind's role hands its step the same gate settings, each from its own `<prefix>_gate_*` variable with a
default and an argument spec, and the defaults are the gate's own (bench/gate_settings.py): a setting added to the gate
reaches every kind or this fails."""

from __future__ import annotations

import os

import pytest
import yaml

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import gate_settings as gs
from tests.helpers import REPO

KINDS = {"kernel_upgrade": "kernel_rollout_step", "vllm_upgrade": "vllm_upgrade_step",
         "driver_upgrade": "driver_upgrade_step", "nccl_change": "nccl_change_step"}
GATE_KEYS = {"threshold", "alpha", "pass_alpha", "min_runs", "max_runs", "max_baseline_runs", "candidate_min_runs",
             "requests_per_run", "latency_margins", "latency_alpha", "between_start_sd"}


def _yaml(*parts):
    with open(os.path.join(REPO, "roles", *parts), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _step_gate(role: str) -> dict:
    module = f"gpufleet.inference.{KINDS[role]}"
    tasks = [t for t in _yaml(role, "tasks", "step.yml") if module in t]
    assert len(tasks) == 1, f"roles/{role}/tasks/step.yml must call {module} once"
    return tasks[0][module]["gate"]


@pytest.mark.parametrize("role", sorted(KINDS))
def test_every_kind_passes_every_gate_setting_from_its_own_variables(role):
    gate = _step_gate(role)
    assert set(gate) == GATE_KEYS
    defaults = _yaml(role, "defaults", "main.yml")
    spec = _yaml(role, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    for key, value in gate.items():
        if key == "requests_per_run":
            continue  # the benchmark's own request count, not a gate variable of the role
        var = f"{role}_gate_{key}"
        assert value == "{{ " + var + " }}", (role, key, value)
        assert var in defaults and var in spec, f"{var} needs a default and an argument spec"


@pytest.mark.parametrize("role", sorted(KINDS))
def test_every_kinds_gate_defaults_are_the_gates_own(role):
    defaults = _yaml(role, "defaults", "main.yml")
    assert defaults[f"{role}_gate_threshold"] == gs.GATE.threshold
    assert defaults[f"{role}_gate_alpha"] == gs.GATE.alpha and defaults[f"{role}_gate_pass_alpha"] == gs.GATE.pass_alpha
    assert (defaults[f"{role}_gate_min_runs"], defaults[f"{role}_gate_max_runs"]) == (gs.GATE.min_runs, gs.GATE.max_runs)
    assert defaults[f"{role}_gate_latency_alpha"] == gs.LATENCY_ALPHA
    assert defaults[f"{role}_gate_between_start_sd"] is None

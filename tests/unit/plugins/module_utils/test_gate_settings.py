# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gate's settings are defined once (bench/gate_settings.py GATE): the places that keep their own copy for the
reader (the kernel_upgrade role's defaults and argument specs, the module's and the filter's documentation) say the
same values, and every Python reader takes them from GATE."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.inference.plugins.filter import throughput_gate as gate_filter
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import throughput_gate as tg
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import gate_settings
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import stats as gate_stats
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.gate_settings import (
    GATE, NO_FACTS, GateSettings, RunFacts, gate_inputs,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.tuning import tune_measured
from ansible_collections.gpufleet.inference.plugins.modules import bench_history
from ansible_collections.gpufleet.inference.plugins.modules import throughput_gate as gate_module

REPO = Path(__file__).resolve().parents[4]
ROLE = REPO / "roles" / "kernel_upgrade"
# kernel_upgrade_gate_<name>: the GateSettings field of that name
ROLE_SETTINGS = ("threshold", "alpha", "pass_alpha", "min_runs", "max_runs", "max_baseline_runs", "candidate_min_runs",
                 "latency_alpha")


def test_the_defaults_are_sound():
    GATE.check()
    assert GATE.latency_in_force() == gate_settings.DEFAULT_LATENCY_MARGINS
    assert (GATE.threshold, GATE.alpha, GATE.pass_alpha, GATE.min_runs, GATE.max_runs) == (0.95, 0.01, 0.005, 5, 15)


def test_the_kernel_upgrade_roles_defaults_are_the_gates():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text(encoding="utf-8"))
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))
    options = specs["argument_specs"]["main"]["options"]
    for name in ROLE_SETTINGS:
        var = f"kernel_upgrade_gate_{name}"
        assert defaults[var] == getattr(GATE, name), var
        assert options[var]["default"] == getattr(GATE, name), var
    assert defaults["kernel_upgrade_gate_latency_margins"] == {}  # {}: the gate's own margins
    assert GATE.latency_margins is None


def test_the_modules_options_and_documentation_are_the_gates():
    spec = gate_module.ARGUMENT_SPEC
    doc = yaml.safe_load(gate_module.DOCUMENTATION)["options"]
    option_of = {"bootstrap": "bootstrap_resamples"}
    for name in tg.MODULE_SETTINGS:
        option = option_of.get(name, name)
        assert spec[option].get("default") == getattr(GATE, name), option
        assert doc[option].get("default") == getattr(GATE, name), option
    history = bench_history.ARGUMENT_SPEC
    assert (history["threshold"]["default"], history["alpha"]["default"], history["min_runs"]["default"]) == (
        GATE.threshold, GATE.alpha, GATE.min_runs)


def test_the_filters_documented_defaults_are_the_gates():
    doc = yaml.safe_load((REPO / "plugins" / "filter" / "throughput_gate.yml").read_text(encoding="utf-8"))
    for name, option in doc["DOCUMENTATION"]["options"].items():
        if "default" in option:
            assert option["default"] == getattr(GATE, name), name
    assert gate_filter.throughput_gate([1000.0] * 5, [])["threshold"] == GATE.threshold


def test_measured_tuning_takes_the_gates_defaults():
    for name in ("threshold", "alpha", "pass_alpha", "min_runs", "max_runs", "latency_alpha"):
        assert tune_measured.GATE_DEFAULTS[name] == getattr(GATE, name), name


def test_options_go_to_settings_or_facts_and_an_unknown_one_is_a_type_error():
    settings, facts = gate_inputs(None, None, {"threshold": 0.9, "candidate_failed": 3})
    assert settings == GateSettings(threshold=0.9) and facts == RunFacts(candidate_failed=3)
    assert gate_inputs(None, None, {}) == (GATE, NO_FACTS)
    with pytest.raises(TypeError, match="unexpected keyword argument 'thresold'"):
        tg.decide([1000.0] * 5, [], thresold=0.9)


@pytest.mark.parametrize("change, message", [
    ({"threshold": 1.0}, "threshold must be in (0, 1)"),
    ({"pass_alpha": 0.5}, "pass_alpha must be in (0, 0.5)"),
    ({"max_runs": 4}, "max_runs (4) must be at least min_runs (5)"),
    ({"bootstrap": -1}, "bootstrap_resamples must be a whole number"),
    ({"order": "paired"}, "order must be one of sequential, interleaved"),
    ({"detect": 0.01}, "detect must be a drop larger than the margin"),
    ({"latency_alpha": 0.7}, "latency_alpha must be in (0, 0.5)"),
])
def test_settings_are_checked_in_one_place(change, message):
    settings = GateSettings(**change)
    with pytest.raises(gate_stats.GateError) as err:
        settings.check()
        settings.latency_in_force()
    assert message in str(err.value)
    with pytest.raises(gate_stats.GateError):
        tg.check_all_settings(settings)

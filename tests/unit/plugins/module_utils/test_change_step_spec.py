# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""change/step.py's step_argument_spec(): the options every kind's step module shares, defined once; a module may add
its own but not redefine a shared one; the doc fragment change_step documents each shared option."""

from __future__ import annotations

import pytest
import yaml

from ansible_collections.gpufleet.inference.plugins.doc_fragments.change_step import ModuleDocFragment
from ansible_collections.gpufleet.inference.plugins.module_utils.change.step import step_argument_spec
from ansible_collections.gpufleet.inference.plugins.modules import driver_upgrade_step, kernel_rollout_step, vllm_upgrade_step

MODULES = {"kernel": kernel_rollout_step, "vllm": vllm_upgrade_step, "driver": driver_upgrade_step}


@pytest.mark.parametrize("kind", sorted(MODULES))
def test_each_step_module_is_built_on_the_shared_spec(kind):
    spec = MODULES[kind].ARGUMENT_SPEC
    shared = step_argument_spec(("start",), "/j")
    for name, option in shared.items():
        if name in ("event", "journal", "verify_pcie"):  # the kind's events, journal path and PCIe default
            assert spec[name]["type"] == option["type"], (kind, name)
            continue
        assert spec[name] == option, (kind, name)
    assert spec["event"]["choices"][0] == "start" and spec["journal"]["default"].endswith("/journal.json")


def test_a_module_cannot_redefine_a_shared_option():
    with pytest.raises(ValueError, match="lease_ttl is a shared option"):
        step_argument_spec(("start",), "/j", lease_ttl=dict(type="int", default=60))
    assert step_argument_spec(("start",), "/j", mine=dict(type="str"))["mine"] == {"type": "str"}


def test_the_fragment_documents_every_shared_option_but_root():
    documented = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]
    shared = step_argument_spec(("start",), "/j")
    assert set(documented) == set(shared) - {"root"}  # root is the common fragment's
    for name, doc in documented.items():
        assert doc["type"] == shared[name]["type"], name
        if "default" in doc:
            assert doc["default"] == shared[name]["default"], name

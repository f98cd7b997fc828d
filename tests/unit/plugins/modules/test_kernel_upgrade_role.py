# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""roles/kernel_upgrade: argument specs, defaults and README agree; the modules' options it passes exist;
the playbook keeps the canary ladder and the fail-fast default."""

from __future__ import annotations

import os
import re

import yaml

from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.upgrade import SAVED_DROPIN
from tests.helpers import REPO

ROLE = os.path.join(REPO, "roles", "kernel_upgrade")
PREFIX = "kernel_upgrade_"


def load(rel: str):
    with open(os.path.join(ROLE, rel), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def test_specs_defaults_and_readme_agree():
    spec = load("meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    defaults = load("defaults/main.yml")
    required = {name for name, option in spec.items() if option.get("required")}
    assert required == {PREFIX + "target"}
    assert set(spec) - required == set(defaults)
    for name, option in spec.items():
        assert name.startswith(PREFIX)
        assert option.get("description"), name
        if name not in required:
            assert option.get("default") == defaults[name], name  # no default in the spec: null
    with open(os.path.join(ROLE, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    for name in spec:
        assert f"| `{name}` |" in readme, f"{name} is not in the role README's table"


def test_every_variable_the_tasks_use_is_documented():
    spec = load("meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    used = set()
    not_variables = {"kernel_upgrade_record", "kernel_upgrade_preflight", "kernel_upgrade_report", "kernel_upgrade_markdown",
                     "kernel_upgrade_gate_summary"}  # the exported record, a module and the deprecated filter names
    for name in os.listdir(os.path.join(ROLE, "tasks")):
        with open(os.path.join(ROLE, "tasks", name), encoding="utf-8") as fh:
            text = fh.read()
        used |= set(re.findall(r"(?<![_\w])(kernel_upgrade_[a-z_]+)", text))
    assert used - not_variables <= set(spec), sorted(used - not_variables - set(spec))


def test_the_fix_dropin_is_named_in_the_docs():
    spec = load("meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert SAVED_DROPIN in spec[PREFIX + "fix_grub_default"]["description"]


def test_playbook_canary_ladder_and_fail_fast():
    with open(os.path.join(REPO, "playbooks", "kernel_upgrade.yml"), encoding="utf-8") as fh:
        plays = yaml.safe_load(fh)
    rollout = plays[0]
    assert rollout["serial"] == "{{ kernel_upgrade_serial | default([1, '10%', '25%']) }}"
    assert rollout["max_fail_percentage"] == "{{ kernel_upgrade_max_fail_percentage | default(0) }}"
    assert rollout["become"] is True

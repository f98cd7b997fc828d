"""Module tests run modules in this process, as they run on a target host."""

from __future__ import annotations

import pytest

from tests.unit.plugins.modules.uthelper import target_side


@pytest.fixture(autouse=True)
def _as_on_a_target(monkeypatch):
    """Once any test imports controller code (a filter plugin, ansible.errors), ansible-core 2.19
    treats the process as the controller and AnsibleModule.warn() prints instead of returning the
    warning in the result; every module test here gets the target-side behaviour back."""
    target_side(monkeypatch)

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every unit test starts and ends with ansible's process-wide warning lists empty."""

from __future__ import annotations

import pytest

from tests.unit.plugins.modules.uthelper import forget_module_warnings


@pytest.fixture(autouse=True)
def _no_warnings_of_other_tests():
    """A warning one test left behind (module_utils code calls warn() directly) would otherwise show up in the
    result of the next module run in this process, whichever test makes it."""
    forget_module_warnings()
    yield
    forget_module_warnings()

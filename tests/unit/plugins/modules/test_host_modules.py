# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""host_lease, kernel_rollout_step and kernel_boot_health through their real main() on fake trees
(YAML cases in test_host_lease.yaml, test_kernel_rollout_step.yaml, test_kernel_boot_health.yaml)."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.gpufleet.inference.plugins.modules import host_lease, kernel_boot_health, kernel_rollout_step
from tests.unit.plugins.modules.test_kernel_upgrade_modules import BUILDERS as GRUB_BUILDERS
from tests.unit.plugins.modules.uthelper import UTHelper

HERE = Path(__file__).resolve().parent


def dpkg(root: Path, packages=()) -> None:
    path = root / "var/lib/dpkg/status"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"Package: {p}\nStatus: install ok installed\nVersion: 1\n\n" for p in packages)
                    + "Package: removed-one\nStatus: deinstall ok config-files\n\n")


def boot(root: Path, boot_id: str = "boot-a") -> None:
    path = root / "proc/sys/kernel/random/boot_id"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(boot_id + "\n")


def json_file(root: Path, path: str, **data) -> None:
    real = root / path.lstrip("/")
    real.parent.mkdir(parents=True, exist_ok=True)
    real.write_text(json.dumps(data))


def journal_is(root: Path, expected: dict, result: dict) -> None:
    journal = json.loads((root / "var/lib/gpufleet/kernel_upgrade/journal.json").read_text())
    for key, value in expected.items():
        assert journal[key] == value, (key, journal[key])


def history_has(root: Path, expected: dict, result: dict) -> None:
    files = sorted((root / "var/lib/gpufleet/kernel_upgrade/history").glob("*.json"))
    assert [f.name for f in files] == [expected["name"]], files
    journal = json.loads(files[0].read_text())
    assert journal["stage"] == expected["stage"] and journal["finished"] is True


BUILDERS = dict(GRUB_BUILDERS, dpkg=dpkg, boot=boot, json_file=json_file)
CHECKS = {"journal_is": journal_is, "history_has": history_has}

test_host_lease_case = UTHelper(host_lease, str(HERE / "test_host_lease.py"), builders=BUILDERS).test_function()
test_kernel_rollout_step_case = UTHelper(kernel_rollout_step, str(HERE / "test_kernel_rollout_step.py"),
                                         builders=BUILDERS, checks=CHECKS).test_function()
test_kernel_boot_health_case = UTHelper(kernel_boot_health, str(HERE / "test_kernel_boot_health.py"),
                                        builders=BUILDERS).test_function()

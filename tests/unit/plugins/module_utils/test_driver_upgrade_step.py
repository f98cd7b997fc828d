# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""driver_upgrade_step's executor on a host tree under tmp_path: the loaded driver read from its /proc file, the
installed one from dpkg-query (answered with what it printed on a lab VM, fixtures/driver/dpkg-query.out), the journal
written durably by the shared step (change/step.py), and refusals that write nothing."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.gpufleet.inference.plugins.module_utils._host.commands import HostCmd
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils.driver import driver_upgrade_step as step_mod
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.upgrade import JOURNAL

FIX = Path(__file__).resolve().parent / "fixtures" / "driver"
NOW = 1_796_000_000.0
VERSION_FILE = "/proc/driver/gpufleet_nvidia/version"


class Dpkg:
    """The AnsibleModule surface HostCmd uses; dpkg-query answers with the lab VM's capture."""

    run_command_environ_update: dict = {}

    def get_bin_path(self, name, required=False):
        return f"/usr/bin/{name}"

    def run_command(self, argv, environ_update=None):
        assert argv[2:4] == ["/usr/bin/dpkg-query", "-W"], argv
        return 0, (FIX / "dpkg-query.out").read_text(), ""


def tree(root: Path) -> Host:
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/dpkg-query").write_text("")
    (root / "proc/driver/gpufleet_nvidia").mkdir(parents=True)
    (root / VERSION_FILE.lstrip("/")).write_text((FIX / "proc-version-1.0.out").read_text())
    fs = HostFS(str(root))
    return Host(fs=fs, cmd=HostCmd(Dpkg(), fs), warn=lambda m: None)


def params(**over) -> dict:
    p = {"target": "1.1", "packages": ["gpufleet-nvidia-standin-utils", "gpufleet-nvidia-standin-dkms"],
         "event": "start", "data": {}, "run_id": "run1", "activate": "reload", "reboot_ok": False, "lock": True,
         "hold_packages": [], "verify_pcie": False, "outputs": False, "stability": False,
         "gate": {"min_runs": 5, "max_runs": 15}, "version_file": VERSION_FILE, "state": None, "journal": JOURNAL,
         "lease_run_id": "", "take_over": "", "lease_ttl": 7200, "preflight": {"ok": True}}
    p.update(over)
    return p


def test_the_start_reads_the_loaded_and_installed_driver_and_locks_its_packages(tmp_path):
    host = tree(tmp_path)
    result = step_mod.execute(params(), host, False, now=NOW)
    installed = {"gpufleet-nvidia-standin-utils": "1.0", "gpufleet-nvidia-standin-dkms": "1.0"}
    assert result["running"] == "1.0" and result["installed"] == installed
    lock = result["next_action"]
    # both named packages, the user space too although no driver name pattern matches it
    assert lock["name"] == "lock" and lock["hold"] == ["gpufleet-nvidia-standin-dkms", "gpufleet-nvidia-standin-utils"]
    assert '"^gpufleet-nvidia-standin-dkms$";' in lock["unattended_upgrades"]["content"]
    assert result["actions"] == [] and not (tmp_path / JOURNAL.lstrip("/")).exists()
    bench = step_mod.execute(params(event="locked"), host, False, now=NOW)["next_action"]
    assert (bench["name"], bench["label"]) == ("benchmark", "baseline")


def test_a_baseline_opens_the_journal_durably_and_check_mode_writes_nothing(tmp_path):
    host = tree(tmp_path)
    data = {"label": "baseline", "samples": [1000.0, 1012.0, 995.0, 1004.0, 998.0], "driver": "1.0",
            "files": ["/b.json"], "contaminated": [], "requests": 160}
    planned = step_mod.execute(params(event="benchmarked", data=data), host, True, now=NOW)
    assert planned["next_action"]["decision"] == "refused" and planned["actions"] == []  # check mode: the plan only
    assert "install gpufleet-nvidia-standin-utils, gpufleet-nvidia-standin-dkms at 1.1, activate it by a module reload" \
        in planned["next_action"]["reason"]
    assert not (tmp_path / JOURNAL.lstrip("/")).exists()
    result = step_mod.execute(params(event="benchmarked", data=data), host, False, now=NOW)
    journal = json.loads((tmp_path / JOURNAL.lstrip("/")).read_text())
    assert journal["format"] == "gpufleet.driver_upgrade_journal/1" and journal["stage"] == "installing"
    assert (journal["old"], journal["target"], journal["package_version"]) == ("1.0", "1.1", "1.1")
    assert journal["old_packages"] == {"gpufleet-nvidia-standin-utils": "1.0", "gpufleet-nvidia-standin-dkms": "1.0"}
    assert result["next_action"] == {"name": "install", "version": "1.1", "packages": {
        "gpufleet-nvidia-standin-utils": "1.1", "gpufleet-nvidia-standin-dkms": "1.1"}}


def test_a_journal_that_cannot_be_trusted_is_refused_and_nothing_is_written(tmp_path):
    host = tree(tmp_path)
    path = tmp_path / JOURNAL.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text('{"format": "gpufleet.driver_upgrade_journal/1", "stage": "installing"')
    result = step_mod.execute(params(), host, False, now=NOW)
    assert result["next_action"]["decision"] == "refused" and result["actions"] == [] and not result["changed"]
    assert path.read_text().endswith('"installing"')

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kernel_rollout_step renews the host's lease through host_lease's lock and read-back: a run whose lease
another run broke between the step's decision and its write is refused and writes nothing (neither the
lease nor the journal)."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.gpufleet.inference.plugins.module_utils.kernel import kernel_rollout_step as rollout_step
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from tests.unit.plugins.modules.test_host_modules import BUILDERS

LEASE = "/var/lib/gpufleet/lease.json"
JOURNAL = "/var/lib/gpufleet/kernel_upgrade/journal.json"
PRE_OK = {"ok": True, "msg": "preflight passed", "package": "linux-image-6.1.0-56-cloud-amd64",
          "running_entry": "gnulinux-advanced-e5dd2c0a-b16b-46de-9f7a-806e3ce0ca85>"
                           "gnulinux-6.1.0-50-cloud-amd64-advanced-e5dd2c0a-b16b-46de-9f7a-806e3ce0ca85"}


class BrokenAfterRead(HostFS):
    """Another run breaks this run's expired lease right after the step has read it."""

    def __init__(self, root: str):
        super().__init__(root)
        self.lease_reads = 0

    def read_text(self, host_path, default=None):
        text = super().read_text(host_path, default)
        if host_path == LEASE:
            self.lease_reads += 1
            if self.lease_reads == 1:
                Path(self.path(LEASE)).write_text(json.dumps({"run_id": "other", "operator": "carol", "play": "tune",
                                                              "taken_at": 3999990000, "renewed_at": 3999990000,
                                                              "expires_at": 4000000000, "ttl": 7200}))
        return text


def on(fs: HostFS) -> Host:
    """The Host of an executor that touches files only (no command, no warning)."""
    return Host(fs=fs, cmd=None, warn=None)


def params(root: Path) -> dict:
    return {"root": str(root), "target": "6.1.0-56-cloud-amd64", "event": "benchmarked", "run_id": "run1",
            "data": {"label": "baseline", "kernel": "6.1.0-50-cloud-amd64", "samples": [1000.0, 1001.0, 999.0, 1002.0, 998.0],
                     "files": ["/b.json"]},
            "reboot_ok": True, "lock": True, "lock_packages": [], "verify_pcie": True, "headers": "auto",
            "commit_timeout": 1800, "gate": {}, "journal": JOURNAL, "lease_run_id": "run1", "take_over": "",
            "lease_ttl": 900, "preflight": PRE_OK}


def host(root: Path) -> None:
    BUILDERS["debian_host"](root, kernels=("6.1.0-50-cloud-amd64", "6.1.0-56-cloud-amd64"))
    BUILDERS["grub_cfg"](root, "two-kernels")
    BUILDERS["grubenv"](root, saved_entry=PRE_OK["running_entry"])
    BUILDERS["boot"](root, boot_id="boot-a")
    BUILDERS["dpkg"](root, packages=["linux-image-6.1.0-50-cloud-amd64", "linux-image-6.1.0-56-cloud-amd64",
                                     "linux-image-cloud-amd64", "nvidia-kernel-dkms"])
    BUILDERS["json_file"](root, LEASE, run_id="run1", expires_at=4000000000, taken_at=3999990000)


def test_the_step_renews_under_the_lock_and_writes_the_journal(tmp_path):
    host(tmp_path)
    result = rollout_step.execute(params(tmp_path), on(HostFS(str(tmp_path))), False, now=3999995000.0)
    assert result["next_action"]["name"] == "audit", result["next_action"]
    assert json.loads((tmp_path / LEASE.lstrip("/")).read_text())["ttl"] == 900
    assert (tmp_path / (LEASE.lstrip("/") + ".lock")).exists()  # taken through host_lease's lock
    assert (tmp_path / JOURNAL.lstrip("/")).exists()


def test_a_lease_broken_between_decision_and_write_is_not_overwritten_and_no_journal_is_written(tmp_path):
    host(tmp_path)
    fs = BrokenAfterRead(str(tmp_path))
    result = rollout_step.execute(params(tmp_path), on(fs), False, now=3999995000.0)
    assert result["next_action"]["decision"] == "refused", result["next_action"]
    assert "other" in result["next_action"]["reason"] + result["next_action"].get("msg", "")
    assert json.loads((tmp_path / LEASE.lstrip("/")).read_text())["run_id"] == "other"  # the other run's lease stands
    assert not (tmp_path / JOURNAL.lstrip("/")).exists()
    assert result["changed"] is False and result["actions"] == []

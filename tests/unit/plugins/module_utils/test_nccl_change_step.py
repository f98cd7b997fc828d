# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nccl_change_step's executor on a host tree under tmp_path: the two NCCL files read byte for byte with their mode and
owner, the unit's main process from systemctl (answered as systemctl prints it) and its environment from
/proc/PID/environ (NUL-separated, as the kernel writes it), the journal written durably by the shared step
(change/step.py), and refusals that write nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ansible_collections.gpufleet.inference.plugins.module_utils._host.commands import HostCmd
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils.nccl import nccl_change_step as step_mod
from ansible_collections.gpufleet.inference.plugins.module_utils.nccl.change import JOURNAL
from ansible_collections.gpufleet.inference.plugins.module_utils.nccl.env import (
    render_conf, render_envfile, resolve, settings_id,
)

NOW = 1_796_000_000.0
OLD, NEW = resolve("pcie_safe"), resolve("p2p_off")


class Systemctl:
    """The AnsibleModule surface HostCmd uses; ``systemctl show --property=MainPID --value UNIT`` prints the pid."""

    run_command_environ_update: dict = {}

    def __init__(self, pid: str = "4242"):
        self.pid = pid
        self.calls: list[list[str]] = []

    def get_bin_path(self, name, required=False):
        return f"/usr/bin/{name}"

    def run_command(self, argv, environ_update=None):
        self.calls.append(argv)
        assert argv == ["/usr/bin/systemctl", "show", "--property=MainPID", "--value", "vllm.service"], argv
        return 0, self.pid + "\n", ""


def tree(root: Path, settings: dict | None | str = "pcie_safe", environ: dict | None = None, pid: str = "4242") -> Host:
    """The files of ``settings`` (a profile's name, the settings, or None: no files at all) and a process that started
    with ``environ`` (the settings')."""
    settings = resolve(settings) if isinstance(settings, str) else settings
    if settings is not None:
        (root / "etc/gpufleet").mkdir(parents=True)
        (root / "etc/nccl.conf").write_text(render_conf(settings, "pcie_safe"))
        (root / "etc/gpufleet/nccl.env").write_text(render_envfile(settings, "pcie_safe"))
        os.chmod(root / "etc/nccl.conf", 0o640)
    env = {"PATH": "/usr/bin", "HOME": "/var/lib/vllm", **(settings or {} if environ is None else environ)}
    (root / f"proc/{pid}").mkdir(parents=True)
    (root / f"proc/{pid}/environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
    fs = HostFS(str(root))
    return Host(fs=fs, cmd=HostCmd(Systemctl(pid), fs), warn=lambda m: None)


def params(**over) -> dict:
    p = {"target": settings_id(NEW), "settings": NEW, "allow_unknown": [], "allow_findings": [], "unit": "vllm.service", "conf_path": "/etc/nccl.conf",
         "env_file": "/etc/gpufleet/nccl.env", "event": "start", "data": {}, "run_id": "run1", "restart_ok": True,
         "lock": True, "verify_pcie": False, "outputs": False, "stability": False, "findings": "fail",
         "gate": {"min_runs": 5, "max_runs": 15}, "journal": JOURNAL, "lease_run_id": "", "take_over": "",
         "lease_ttl": 7200, "preflight": {}}
    p.update(over)
    return p


def baseline(host: Host) -> dict:
    data = {"label": "baseline", "samples": [1000.0, 1012.0, 995.0, 1004.0, 998.0], "nccl": settings_id(OLD),
            "files": ["/b.json"], "contaminated": [], "requests": 160}
    return step_mod.execute(params(event="benchmarked", data=data), host, False, now=NOW)


def test_the_start_reads_the_process_environment_and_the_files_and_locks(tmp_path):
    host = tree(tmp_path, environ={**OLD, "CUDA_VISIBLE_DEVICES": "0,1"})
    result = step_mod.execute(params(), host, False, now=NOW)
    assert result["next_action"]["name"] == "lock", result["next_action"]
    assert (result["running"], result["target"], result["pid"]) == (settings_id(OLD), settings_id(NEW), 4242)
    assert result["environ"] == OLD  # CUDA_VISIBLE_DEVICES, PATH and HOME are not NCCL settings of either side
    assert result["actions"] == [] and not result["changed"]


def test_the_baseline_keeps_the_original_bytes_mode_and_owner_in_a_durable_journal(tmp_path):
    host = tree(tmp_path)
    result = baseline(host)
    path = tmp_path / JOURNAL.lstrip("/")
    journal = json.loads(path.read_text())
    assert journal["format"] == "gpufleet.nccl_change_journal/1" and oct(path.stat().st_mode & 0o777) == "0o600"
    conf = journal["original"]["conf"]
    assert conf["text"] == (tmp_path / "etc/nccl.conf").read_text() and conf["mode"] == "0640" and conf["exists"]
    assert conf["uid"] == os.getuid() and len(conf["sha256"]) == 64
    assert journal["old_settings"] == OLD and journal["target_settings"] == NEW and journal["old_p2p"].startswith("p2p_on")
    # no audit and no outputs here: the baseline ready, the journal is written at installing before the write
    assert result["actions"][-1] == {"action": "write_journal", "path": JOURNAL, "stage": "installing"}
    assert result["next_action"] == {"name": "install", "version": settings_id(NEW), "settings": NEW}
    assert result["record"]["kind"] == "nccl"


def test_absent_files_are_recorded_as_absent(tmp_path):
    host = tree(tmp_path, settings=None)
    baseline_data = {"label": "baseline", "samples": [1000.0, 1012.0, 995.0, 1004.0, 998.0], "files": ["/b.json"],
                     "contaminated": [], "requests": 160}
    step_mod.execute(params(event="benchmarked", data=baseline_data), host, False, now=NOW)
    journal = json.loads((tmp_path / JOURNAL.lstrip("/")).read_text())
    assert journal["old"] == "nccl-none"
    assert {n: f["exists"] for n, f in journal["original"].items()} == {"conf": False, "env": False}


def test_a_unit_without_a_main_process_and_a_restart_pending_are_refused_and_nothing_is_written(tmp_path):
    host = tree(tmp_path, pid="0")
    result = step_mod.execute(params(), host, False, now=NOW)
    assert result["next_action"]["decision"] == "refused" and "has no main process" in result["next_action"]["reason"]
    host = tree(tmp_path / "b", environ=NEW)  # the files say OLD, the process runs NEW: restarted by hand?
    result = step_mod.execute(params(event="locked"), host, False, now=NOW)
    assert result["next_action"]["decision"] == "refused" and "a restart is pending" in result["next_action"]["reason"]
    assert not (tmp_path / "b" / JOURNAL.lstrip("/")).exists()


def test_a_symlinked_file_cannot_be_put_back_byte_for_byte_and_is_refused(tmp_path):
    host = tree(tmp_path)
    (tmp_path / "etc/nccl.conf").unlink()
    os.symlink("/etc/gpufleet/nccl.env", tmp_path / "etc/nccl.conf")
    result = step_mod.execute(params(), host, False, now=NOW)
    assert result["next_action"]["decision"] == "refused"
    assert "/etc/nccl.conf cannot be recorded: it is not a plain file" in result["next_action"]["reason"]


def test_an_invalid_candidate_and_a_corrupt_journal_are_refused_and_nothing_is_written(tmp_path):
    host = tree(tmp_path)
    bad = dict(NEW, NCCL_SOCKET_IFNAME="eth 0")
    result = step_mod.execute(params(settings=bad, target=settings_id(bad)), host, False, now=NOW)
    assert result["next_action"]["decision"] == "refused" and "NCCL_SOCKET_IFNAME" in result["next_action"]["reason"]
    path = tmp_path / JOURNAL.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    result = step_mod.execute(params(), host, False, now=NOW)
    assert result["next_action"]["decision"] == "refused" and f"mv {JOURNAL} {JOURNAL}.broken" in result["next_action"]["reason"]
    assert path.read_text() == "{not json"


def test_other_settings_while_a_change_is_open_are_refused_naming_both(tmp_path):
    host = tree(tmp_path)
    baseline(host)
    other = dict(NEW, NCCL_DEBUG="INFO")
    result = step_mod.execute(params(settings=other, target=settings_id(other)), host, False, now=NOW)
    reason = result["next_action"]["reason"]
    assert result["next_action"]["decision"] == "refused" and "is in progress at stage installing" in reason
    assert '"NCCL_DEBUG": "INFO"' in reason and "nccl_change_settings" in reason


def test_check_mode_plans_and_writes_nothing(tmp_path):
    host = tree(tmp_path)
    result = step_mod.execute(params(event="locked"), host, True, now=NOW)
    assert result["next_action"]["decision"] == "planned" and not (tmp_path / "var/lib/gpufleet").exists()
    assert "NCCL_P2P_DISABLE is not set in the running settings (want 1)" in result["next_action"]["reason"]


def test_a_target_that_does_not_name_the_settings_is_refused(tmp_path):
    host = tree(tmp_path)
    result = step_mod.execute(params(target=settings_id(OLD)), host, False, now=NOW)
    assert result["next_action"]["decision"] == "refused"
    assert f"target '{settings_id(OLD)}' is not the name of the settings given ({settings_id(NEW)})" in \
        result["next_action"]["reason"]

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.nccl_change_step executes: read the two NCCL files (their bytes, mode and owner, and the
settings of the EnvironmentFile), the unit's main process and its environment (``systemctl show -p MainPID``, then
``/proc/PID/environ``) and the journal, then take one step of the NCCL change's flow the way every kind does
(change/step.py: the lease, the take-over, the step, the durable journal write). A refused step is a result
(``next_action`` finish/refused), not an error, and writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils.change.flow import FlowError
from ansible_collections.gpufleet.inference.plugins.module_utils.change.journal import load_journal
from ansible_collections.gpufleet.inference.plugins.module_utils.change.step import take_step
from ansible_collections.gpufleet.inference.plugins.module_utils.lint.host_lint import env_file
from ansible_collections.gpufleet.inference.plugins.module_utils.nccl.env import settings_id
from ansible_collections.gpufleet.inference.plugins.module_utils.nccl.change import (
    EVENTS as FLOW_EVENTS, HISTORY_DIR, MAX_FILE_BYTES, NCCL, check_journal, names,
)

EVENTS = list(FLOW_EVENTS)
# What /proc/PID/environ may hold at most (the kernel caps a process's environment far below this).
MAX_ENVIRON_BYTES = 1 << 20


def read_file(fs: HostFS, path: str) -> dict[str, Any]:
    """A settings file as the journal keeps it: path, exists, text (exact), sha256, mode, uid, gid; ``error`` when it
    cannot be kept and put back byte for byte (not a plain file, too large, not UTF-8 text)."""
    st = fs.lstat(path)
    out: dict[str, Any] = {"path": path, "exists": st is not None, "text": None, "sha256": None, "mode": None,
                           "uid": None, "gid": None}
    if st is None:
        return out
    out.update(mode=f"{st.st_mode & 0o7777:04o}", uid=st.st_uid, gid=st.st_gid)
    if fs.readlink(path) is not None or not fs.exists(path) or fs.isdir(path):
        return dict(out, error="it is not a plain file (a symbolic link or a directory)")
    data = fs.read_bytes(path, MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        return dict(out, error=f"it holds more than {MAX_FILE_BYTES} bytes")
    try:
        out["text"] = data.decode("utf-8")
    except UnicodeDecodeError:
        return dict(out, error="it is not UTF-8 text")
    out["sha256"] = hashlib.sha256(data).hexdigest()
    return out


def file_settings(env: dict[str, Any]) -> dict[str, str]:
    """The settings of the EnvironmentFile as systemd reads it (the host lint's parser); {} when it does not exist."""
    if not env.get("text"):
        return {}
    return {s.key: s.value for s in env_file(env["text"], env["path"], 0)}


def main_environ(host: Host, unit: str) -> tuple[int | None, dict[str, str] | None, str]:
    """(MainPID, its environment, why not): the environment of the unit's main process as it started
    (``/proc/PID/environ``: what systemd gave it, the EnvironmentFiles included)."""
    argv = [host.cmd.find_live("systemctl", required=True), "show", "--property=MainPID", "--value", unit]
    rc, out, err = host.cmd.run(argv)
    pid = out.strip()
    if rc != 0 or not pid.isdigit():
        return None, None, f"'{' '.join(argv)}' answered rc {rc}: {(err or out).strip() or 'nothing'}"
    if pid == "0":
        return None, None, f"{unit} has no main process (not running)"
    try:
        raw = host.fs.read_bytes(f"/proc/{pid}/environ", MAX_ENVIRON_BYTES)
    except HostFSError as err:
        return int(pid), None, f"/proc/{pid}/environ of {unit} cannot be read: {err}"
    env = dict(e.split("=", 1) for e in raw.decode("utf-8", "replace").split("\0") if "=" in e)
    return int(pid), env, ""


def observe(p: dict, check_mode: bool, now: float, seen: dict[str, Any]) -> dict[str, Any]:
    return {"event": p["event"], "data": p["data"] or {}, "preflight": p["preflight"] or {}, "running": seen["running"],
            "default": seen["default"], "target": seen["target"], "candidate": seen["candidate"], "now": now,
            "run_id": p["run_id"], "unit": p["unit"], "pid": seen["pid"], "environ": seen["environ"],
            "environ_error": seen["environ_error"], "files": seen["files"], "file_settings": seen["file_settings"],
            "settings": {"restart_ok": p["restart_ok"], "check_mode": check_mode, "lock": p["lock"],
                         "verify_pcie": p["verify_pcie"], "outputs": p["outputs"], "stability": p["stability"],
                         "findings": p["findings"], "gate": p["gate"] or {}, "allow_unknown": p["allow_unknown"],
                         "allow_findings": p["allow_findings"]}}


def read_host(p: dict, host: Host, journal: dict[str, Any] | None) -> dict[str, Any]:
    """What the step sees: the files, the settings they hold, the unit's environment, and the name of each."""
    files = {"conf": read_file(host.fs, p["conf_path"]), "env": read_file(host.fs, p["env_file"])}
    candidate = {str(k): str(v) for k, v in (p["settings"] or {}).items() if v is not None}
    pid, environ, why = main_environ(host, p["unit"])
    return dict(names(candidate, file_settings(files["env"]), environ, journal), files=files, candidate=candidate,
                pid=pid, environ_error=why)


def execute(p: dict, host: Host, check_mode: bool, now: float | None = None) -> dict[str, Any]:
    """One step of the NCCL change; ``now``: the clock, for tests."""
    fs = host.fs
    now = time.time() if now is None else now
    seen: dict[str, Any] = {}

    def load() -> dict[str, Any] | None:
        journal = load_journal(fs, p["journal"], NCCL)
        journal = check_journal(journal, p["journal"]) if journal is not None else None
        seen.update(read_host(p, host, journal))
        if p["target"] != settings_id(seen["candidate"]):
            raise FlowError(f"target {p['target']!r} is not the name of the settings given "
                            f"({settings_id(seen['candidate'])}): pass the gpufleet.inference.nccl_env filter's id and "
                            "settings of one resolution; nothing was changed")
        if journal is not None and not journal.get("finished") and journal["target"] != seen["target"]:
            raise FlowError(
                f"an NCCL change to {journal['target']} ({json.dumps(journal['target_settings'], sort_keys=True)}; run "
                f"{journal.get('run_id') or '?'}) is in progress at stage {journal['stage']}, but this run asks for "
                f"{seen['target']} ({json.dumps(seen['candidate'], sort_keys=True)}): nothing is changed. Run again with "
                "nccl_change_profile and nccl_change_settings giving that change's settings to finish (or roll back) "
                "it first.")
        return journal

    result = take_step(NCCL, p, fs, check_mode, now, {}, load, lambda: observe(p, check_mode, now, seen), HISTORY_DIR)
    result.update(running=seen.get("running"), target=seen.get("target"), pid=seen.get("pid"),
                  environ=seen.get("environ"), files=[p["conf_path"], p["env_file"]])
    return result

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_service role's files on the host, in one module run: the configuration directory, the
service's environment file, the secret environment file (root only; removed when no secret is wanted;
its text never shown) and the systemd unit, all read back after writing.

The unit comes rendered by the role (templates/vllm.service.j2) with one stamp line,
``# NCCL environment PATH:``, that this module completes with the checksum of the NCCL EnvironmentFile
as it is on the host (``sha1 HEX``, or ``absent``): a change of the NCCL settings changes the unit, and
so restarts the service once, even when the nccl_env role ran in another play. The same read gives the
role's verify the NCCL settings the live process must have, and the unit's presence before the run
says whether check mode can preview the service. ``execute`` is the gpufleet.inference.vllm_service_files
module's run over the Host's files (``_host/managed_files.py`` converges them).
"""

from __future__ import annotations

import hashlib
import posixpath
import re

from ansible_collections.gpufleet.inference.plugins.module_utils._host import managed_files as mf
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed

UNIT_DIR = "/etc/systemd/system"
STAMP = "# NCCL environment {path}:"
# A unit name systemd takes (systemd.unit(5): ASCII letters, digits, ':', '-', '_', '.', '@'; 255 bytes with '.service'),
# not starting with a dot or a dash.
UNIT_NAME = re.compile(r"[A-Za-z0-9_:@][A-Za-z0-9_:@.-]{0,246}")


class VllmFilesError(Exception):
    """Input that cannot make the files (no stamp line, a path that cannot hold a file); nothing was written."""


def paths(params: dict) -> dict:
    """The environment, secret and unit paths of the service ``name``."""
    config_dir, name = params["config_dir"], params["name"]
    return {"env": posixpath.join(config_dir, f"{name}.env"), "secret": posixpath.join(config_dir, f"{name}.secret.env"),
            "unit": posixpath.join(params.get("unit_dir") or UNIT_DIR, f"{name}.service")}


def nccl_state(fs: HostFS, path: str) -> dict:
    """The NCCL EnvironmentFile: whether it is there, its sha1 (what Ansible's stat calls checksum) and its
    setting lines (neither blank nor comments)."""
    if not fs.exists(path):
        return {"path": path, "exists": False, "sha1": None, "lines": []}
    data = fs.read_bytes(path)
    text = data.decode("utf-8", errors="replace")
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return {"path": path, "exists": True, "sha1": hashlib.sha1(data).hexdigest(), "lines": lines}  # nosec B324 - a change stamp


def stamp_unit(unit: str, nccl: dict) -> str:
    """``unit`` with its one stamp line completed by the NCCL file's checksum."""
    stamp = STAMP.format(path=nccl["path"])
    lines = unit.split("\n")
    hits = [i for i, line in enumerate(lines) if line == stamp]
    if len(hits) != 1:
        raise VllmFilesError(
            f"unit_content holds {len(hits)} lines '{stamp}' where the module completes exactly one with the checksum of "
            f"{nccl['path']} (so that a change of the NCCL settings restarts the service): render the role's "
            "templates/vllm.service.j2, or put that one line in the unit. Nothing was written.")
    lines[hits[0]] = f"{stamp} {'sha1 ' + nccl['sha1'] if nccl['exists'] else 'absent'}"
    return "\n".join(lines)


def execute(params: dict, host: Host, check_mode: bool, owner: tuple[int, int] = (0, 0)) -> dict:
    """Write (outside check mode) and read back the directory and the three files, or say what would change.
    ``owner``: the files' uid and gid (tests run as a user)."""
    fs = host.fs
    name = params["name"]
    if not UNIT_NAME.fullmatch(name) or name.endswith(".service"):
        raise VllmFilesError(f"name={name!r} is not a service name: give the unit's name without '.service' (vllm_service_name, "
                             "say 'vllm'): up to 247 ASCII letters, digits and :_.@-, no leading dot or dash, no space, "
                             "newline or '/'. Nothing was written.")
    for key in ("config_dir", "nccl_env_file", "unit_dir"):
        if not posixpath.isabs(params.get(key) or UNIT_DIR):
            raise VllmFilesError(f"{key}={params[key]!r} is not an absolute path: give the full path on the host. Nothing was written.")
    where = paths(params)
    nccl = nccl_state(fs, params["nccl_env_file"])
    unit = stamp_unit(params["unit_content"], nccl)
    secret = params.get("secret_content") or ""
    dirs = [mf.wanted_dir(params["config_dir"], 0o755, owner)]
    files = [mf.wanted_file(where["env"], params["env_content"], 0o644, owner),
             mf.wanted_file(where["secret"], secret, 0o600, owner, shown=False) if secret
             else mf.wanted_absent(where["secret"], shown=False),
             mf.wanted_file(where["unit"], unit, 0o644, owner)]
    unit_existed = fs.exists(where["unit"])
    try:
        actions, diff = mf.converge(fs, dirs, files, check_mode)
    except mf.ManagedFilesError as err:
        raise VllmFilesError(f"{err} Nothing was written.") from None
    if not check_mode:
        problems = mf.unlike(files, mf.read_back(fs, files))
        if problems:
            raise Failed(f"The vLLM service's files do not hold what was just written (changed by another tool meanwhile?): "
                         f"{'; '.join(problems)}. Run the role again; the service was not restarted.",
                         changed=bool(actions), actions=actions)
    return {"changed": bool(actions), "actions": actions, "files": [where["env"], where["unit"]] + ([where["secret"]] if secret else []),
            "secret_file": bool(secret), "unit_existed": unit_existed, "nccl_env": nccl, "read_back": not check_mode,
            "diff": diff}

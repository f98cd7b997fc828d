# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The nccl_env role's files on the host, in one module run: the directory of the EnvironmentFile,
the file NCCL reads and the EnvironmentFile (written whole, root-owned, 0644), both read back and
checked against the resolved settings, and the per-user file that would override them for root.

The contents come rendered (the ``nccl_env`` filter, ``module_utils/nccl/env.py``); ``execute`` is the
gpufleet.inference.nccl_env_files module's run over the Host's files (``_host/managed_files.py`` converges them).
"""

from __future__ import annotations

import json
import platform
import posixpath

from ansible_collections.gpufleet.inference.plugins.module_utils._host import managed_files as mf
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host

USER_CONF = "/root/.nccl.conf"


class NcclFilesError(Exception):
    """The files do not hold what was written, or a path cannot hold a file; the message says which."""


def check_contents(params: dict) -> None:
    """Before anything is written: raise NcclFilesError unless the rendered contents turn NVLink multicast off in the file
    NCCL reads and set CUDA_DEVICE_ORDER as resolved in the EnvironmentFile."""
    problems = _lacks(params, params["conf_content"], params["env_content"])
    if problems:
        raise NcclFilesError(f"conf_content or env_content does not carry the settings: {'; '.join(problems)}. Render them "
                             f"with the gpufleet.inference.nccl_env filter. Nothing was written.")


def _lacks(params: dict, conf_text: str | None, env_text: str | None) -> list[str]:
    """What the two texts lack of the settings: NCCL_NVLS_ENABLE=0 in the conf, the resolved CUDA_DEVICE_ORDER in the env."""
    settings = params.get("settings") or {}
    problems = []
    if "NCCL_NVLS_ENABLE=0" not in (conf_text or "").splitlines():
        problems.append(f"{params['conf_path']} lacks NCCL_NVLS_ENABLE=0")
    order = f"CUDA_DEVICE_ORDER={settings.get('CUDA_DEVICE_ORDER')}"
    if order not in (env_text or "").splitlines():
        problems.append(f"{params['env_file']} lacks {order}")
    return problems


def check_read_back(params: dict, texts: dict) -> None:
    """Raise NcclFilesError unless both files hold exactly what was written (check_contents() vouched for what that is)."""
    conf_path, env_path = params["conf_path"], params["env_file"]
    problems = mf.unlike([mf.wanted_file(conf_path, params["conf_content"]), mf.wanted_file(env_path, params["env_content"])],
                         texts)
    problems += _lacks(params, texts.get(conf_path), texts.get(env_path))
    if problems:
        raise NcclFilesError(
            f"{conf_path} or {env_path} does not hold the settings just written (changed by hand or by another tool?): "
            f"{'; '.join(problems)}. Expected: {json.dumps(params.get('settings') or {})}")


def execute(params: dict, host: Host, check_mode: bool, owner: tuple[int, int] = (0, 0)) -> dict:
    """Write (outside check mode) and read back the two files; warn about the per-user override (naming the host:
    ``host_name`` of ``params``, else this machine's name). ``owner``: the files' uid and gid (tests run as a user)."""
    fs = host.fs
    check_contents(params)
    env_dir = posixpath.dirname(params["env_file"]) or "/"
    dirs = [mf.wanted_dir(env_dir, 0o755, owner)]
    files = [mf.wanted_file(params["conf_path"], params["conf_content"], 0o644, owner),
             mf.wanted_file(params["env_file"], params["env_content"], 0o644, owner)]
    user_conf = params.get("user_conf") or USER_CONF
    user_conf_exists = fs.exists(user_conf)  # read before any write: a path it cannot read fails with nothing written
    try:
        actions, diff = mf.converge(fs, dirs, files, check_mode)
        if not check_mode:
            check_read_back(params, mf.read_back(fs, files))
    except mf.ManagedFilesError as err:
        raise NcclFilesError(str(err)) from None
    if user_conf_exists:
        name = params.get("host_name") or platform.node()
        where = f" on {name}" if name else ""
        host.warn(f"{user_conf} exists{where}: NCCL reads it instead of {params['conf_path']} for processes of root. "
                  "Remove it or fold its keys into nccl_env_settings.")
    return {"changed": bool(actions), "actions": actions, "files": [params["conf_path"], params["env_file"]],
            "user_conf_exists": user_conf_exists, "read_back": not check_mode, "diff": diff}

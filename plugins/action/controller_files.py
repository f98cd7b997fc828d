# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet.inference.controller_files: write whole report files on the controller, in the
controller's own process (no module run, no connection), with module_utils/_host/managed_files."""

from __future__ import annotations

import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.inference.plugins.module_utils._host import managed_files as mf
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError

ARGUMENT_SPEC = {
    "files": {"type": "list", "elements": "dict", "default": [], "options": {
        "path": {"type": "path", "required": True},
        "content": {"type": "str", "required": True},
        "mode": {"type": "str", "default": "0644"},
    }},
    "directories": {"type": "list", "elements": "path", "default": []},
    "directory_mode": {"type": "str", "default": "0755"},
}


def _octal(value: str, what: str) -> int:
    try:
        return int(str(value), 8)
    except ValueError:
        raise AnsibleActionFail(f"controller_files: {what} {value!r} is not an octal mode such as '0644'") from None


def write(files: list[dict], directories: list[str], directory_mode: str, check_mode: bool) -> dict:
    """Plan and (outside check mode) write; the result without the diff filtering of diff mode."""
    # a relative path is relative to the directory ansible-playbook runs in, as for a copy delegated to localhost
    dirs = [mf.wanted_dir(os.path.abspath(path), _octal(directory_mode, "directory_mode"), owner=None) for path in directories]
    wanted = [mf.wanted_file(os.path.abspath(f["path"]), f["content"], _octal(f["mode"], f"mode of {f['path']}"), owner=None)
              for f in files]
    fs = HostFS("/")
    try:
        actions, diff = mf.converge(fs, dirs, wanted, check_mode)
    except (mf.ManagedFilesError, HostFSError) as err:
        raise AnsibleActionFail(f"controller_files: {err}. The files are written on the controller, as the user "
                                "that runs ansible-playbook: check that it may write there.") from None
    return {"changed": bool(actions), "actions": actions, "diff": diff}


class ActionModule(ActionBase):
    """Write report files on the controller without a module run."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # tmp no longer has any effect
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]  # raises on wrong arguments
        outcome = write(args["files"], args["directories"], args["directory_mode"], bool(self._task.check_mode))
        diff = outcome.pop("diff")
        result.update(outcome)
        if self._task.diff and diff:
            result["diff"] = diff
        return result

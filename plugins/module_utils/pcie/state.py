# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The shared shape of the modules that change PCIe config space and keep it across boots
(``pcie_payload``, ``pcie_acs``).

Both record the original register values under their ``state_dir`` before the first write, write
through setpci, persist what they set into the one boot unit of ``pcie/boot.py`` (its applier is
``pcie/reapply.py``) and undo all of it on ``state: default``. PcieState holds what they share: the
file readers, the record action, the systemctl command under ``root``, the commands in the C locale
(the Host's HostCmd), the file and unit steps, and putting the record back after a rolled-back write.
Failures are raised (StepFailed carries the extra result keys), never ``fail_json``-ed here:
``finish()`` (_host/result.py) turns them into the module's result.
"""

from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils._host.managed_files import text_diff
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.boot import UNIT_WANTS, render_json
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.reapply import render_script


# The file steps of the record and persistence plans: those that write a file, those that remove one.
WRITES = ("record_originals", "write_file")
REMOVES = ("remove_record", "remove_file")


class StepFailed(Failed):
    """A step failed after the module began to change the host; ``fields`` are extra result keys."""


def shown_actions(actions: list[dict]) -> list[dict]:
    """The actions as the result shows them: file contents left out (the diff has them)."""
    return [{k: v for k, v in a.items() if k != "content"} for a in actions]


class PcieState:
    """Readers of the record and persistence files, and the file and unit changers, of one module run."""

    # What is in place when only the boot persistence fails (for the failure message).
    SET_WHAT = "The register values are set"

    def __init__(self, host, setpci: str, record_file: str, state_dir: str, check_mode: bool):
        """``host``: the run's Host (files, commands, warnings); the record is ``state_dir/record_file``."""
        self.fs = host.fs
        self.cmds = host.cmd
        self.warn = host.warn
        self.check_mode = check_mode
        self.setpci = setpci
        self.record_path = state_dir.rstrip("/") + "/" + record_file
        # each file's text before this run's first change of it (do_file_actions), for the diff
        self.texts_before: dict[str, str | None] = {}

    # ---- readers ----------------------------------------------------------------------------
    def read(self, path: str) -> str | None:
        """Exact file content (HostFS.read_text strips the last newline), None when absent."""
        return self.fs.read_exact(path)

    def python(self) -> str:
        """The interpreter the boot script names (HostCmd.script_python)."""
        return self.cmds.script_python()

    def script(self) -> str:
        """The boot applier (pcie/reapply.py's render_script) for this host's interpreter."""
        return render_script(self.python())

    def systemctl_argv(self, *args: str) -> list[str]:
        """systemctl on the host; ``--root=ROOT`` for a tree other than ``/`` (HostCmd.systemctl)."""
        return self.cmds.systemctl(*args)

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        return self.cmds.run(argv)

    def record_action(self, before_text: str | None, record: dict) -> list[dict]:
        """The step that makes the record file hold ``record`` (removed when it holds no device)."""
        text = render_json(record) if record["devices"] else None
        if text == before_text:
            return []
        if text is None:
            return [{"action": "remove_record", "path": self.record_path}]
        return [{"action": "record_originals", "path": self.record_path, "content": text}]

    # ---- changers -----------------------------------------------------------------------------
    def file_diffs(self, actions: list[dict]) -> list[dict]:
        """The --diff entries of the file steps among ``actions``: each file's text before this run (read now
        in check mode, remembered by do_file_actions otherwise) and after it (empty when removed)."""
        return [text_diff(a["path"], self.texts_before[a["path"]] if a["path"] in self.texts_before else self.read(a["path"]),
                          a.get("content"), removed=a["action"] in REMOVES)
                for a in actions if a["action"] in WRITES + REMOVES]

    def put_record_back(self, record_text: str | None) -> None:
        """After a write that was rolled back: the record as it was, so it claims no change."""
        if record_text is None:
            self.fs.remove(self.record_path)
        else:
            self.fs.write_atomic(self.record_path, record_text, 0o644)

    def do_file_actions(self, actions: list[dict]) -> None:
        """Run the file and unit steps in order; each written file is read back, an enabled unit checked."""
        for action in actions:
            kind = action["action"]
            if kind in WRITES + REMOVES and action["path"] not in self.texts_before:
                self.texts_before[action["path"]] = self.read(action["path"])
            if kind in WRITES:
                self.fs.write_atomic(action["path"], action["content"], int(action.get("mode", "0644"), 8))
                if self.read(action["path"]) != action["content"]:
                    raise StepFailed(f"{action['path']} does not read back what was written; another process writes it.")
            elif kind in REMOVES:
                self.fs.remove(action["path"])
            elif kind in ("enable_unit", "disable_unit", "daemon_reload"):
                problem = self.cmds.unit_step(action["argv"], f"{self.SET_WHAT}; only the boot persistence failed",
                                              "Check that systemd manages this host, or set persist: false.",
                                              wants=UNIT_WANTS if kind == "enable_unit" else None)
                if problem:
                    raise StepFailed(problem.pop("msg"), changed=True, **problem)

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fuzz suite's harness (issue 31): one call of a module's real main() on a fake root, judged.

``Call.run(args)`` runs ``module.main()`` through AnsibleModule as uthelper does (run_command answered by a fake that runs
nothing, get_bin_path finding every tool as /testbin/NAME), under a per-call time limit, from a working directory outside
the root; it snapshots the tree around the root before and after, and ``judge()`` lists what is wrong with the call:

- a traceback (any exception out of main() but SystemExit, or a result with ``exception`` or a Traceback in its message);
- a hang (the call ran past LIMIT_S seconds);
- a write outside the root (anything under the root's parent but the root changed);
- a partial write (a failure that says nothing changed, and the tree did change);
- a failure whose message does not name the parameter that was made bad (when the unchanged call succeeds).

COUNTS keeps the number of calls and of problems found per module; conftest.py prints it at the end of the run.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
from contextlib import contextmanager
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from tests.unit.plugins.modules.uthelper import forget_module_warnings

# Seconds one module call may take: every module here answers in well under a second on a fake root.
LIMIT_S = 8
COUNTS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
PROBLEMS: dict[str, list[str]] = collections.defaultdict(list)


class Hang(Exception):
    """The call ran past LIMIT_S."""


@contextmanager
def time_limit(seconds: float):
    def expired(_signum, _frame):
        raise Hang(f"the call ran past {seconds} s")
    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def snapshot(top: Path) -> dict[str, tuple]:
    """Every path under ``top`` (relative) -> (kind, mode, content digest or link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[os.path.relpath(path, top)] = ("link", 0, os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    digest = hashlib.sha1(fh.read()).hexdigest()  # nosec B324 - a change detector
                out[os.path.relpath(path, top)] = ("file", stat.S_IMODE(st.st_mode), digest)
            else:
                out[os.path.relpath(path, top)] = ("dir" if stat.S_ISDIR(st.st_mode) else "other", stat.S_IMODE(st.st_mode), "")
    return out


def fake_run_command(module, args, check_rc=False, **_kw):
    """Runs nothing but setpci on the fake tree (``-O sysfs.path=ROOT/...``: the real one, as the YAML cases' ``real: true``);
    every other command (systemctl, update-grub, modprobe, chroot ...) succeeds with no output."""
    if not isinstance(args, (list, tuple)):
        module.fail_json(msg=f"a shell string, not an argv list: {args!r}")
    argv = [str(a) for a in args]
    setpci = shutil.which("setpci")
    if setpci and os.path.basename(argv[0]) == "setpci" and any(a.startswith("sysfs.path=/") for a in argv):
        proc = subprocess.run([setpci] + argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, LC_ALL="C", LANG="C"), check=False, timeout=LIMIT_S)
        return proc.returncode, proc.stdout, proc.stderr
    return 0, "", ""


def fake_get_bin_path(_module, arg, required=False, opt_dirs=None):  # pylint: disable=unused-argument
    return f"/testbin/{arg}"


class Call:
    """Runs one module's main() with arguments on the tree ``top/root`` and judges the call."""

    def __init__(self, module, name: str, top: Path, monkeypatch, capsys):
        self.module = module
        self.name = name
        self.top = top
        self.root = top / "root"
        self.monkeypatch = monkeypatch
        self.capsys = capsys
        monkeypatch.setattr(AnsibleModule, "run_command", fake_run_command)
        monkeypatch.setattr(AnsibleModule, "get_bin_path", fake_get_bin_path)
        (top / "cwd").mkdir(exist_ok=True)
        monkeypatch.chdir(top / "cwd")  # a relative path a module writes to lands outside the root: seen

    def run(self, args: dict) -> tuple[dict | None, list[str]]:
        """(the result, or None; the problems of the call)."""
        outside = {k: v for k, v in snapshot(self.top).items() if not k.startswith("root" + os.sep) and k != "root"}
        before = snapshot(self.root)
        problems: list[str] = []
        result = None
        COUNTS[self.name]["calls"] += 1
        try:
            with patch_module_args(args), time_limit(LIMIT_S):
                self.module.main()
            problems.append("main() returned without exit_json/fail_json")
        except SystemExit:
            out = self.capsys.readouterr().out
            try:
                result = json.loads(out)
            except ValueError:
                problems.append(f"the module printed no JSON result: {out[:300]!r}")
        except Hang as err:
            problems.append(f"hang: {err}")
        except Exception as err:  # pylint: disable=broad-except  # any exception out of main() is the finding
            problems.append(f"traceback: {type(err).__name__}: {err}")
        self.capsys.readouterr()
        forget_module_warnings()
        if result is not None:
            msg = str(result.get("msg", ""))
            if "exception" in result or "Traceback" in msg:
                problems.append(f"traceback in the result: {msg[:300]}")
        after_outside = {k: v for k, v in snapshot(self.top).items() if not k.startswith("root" + os.sep) and k != "root"}
        if after_outside != outside:
            changed = sorted(set(after_outside.items()) ^ set(outside.items()))
            problems.append(f"wrote outside the root: {[c[0] for c in changed][:5]}")
        if result is not None and result.get("failed") and not result.get("changed"):
            after = snapshot(self.root)
            if after != before:
                changed = sorted(k for k in set(after) | set(before) if after.get(k) != before.get(k))
                problems.append(f"partial write: failed with changed=false but changed {changed[:5]}")
        return result, problems

    def record(self, problems: list[str]) -> None:
        if problems:
            COUNTS[self.name]["problems"] += len(problems)
            PROBLEMS[self.name].extend(problems)


def names_param(result: dict, names) -> bool:
    """Whether a failure message names one of ``names`` (a parameter and its aliases)."""
    msg = str(result.get("msg", ""))
    return any(n in msg for n in names)

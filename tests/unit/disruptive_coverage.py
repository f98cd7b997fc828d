# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which disruptive tasks of a collection's playbooks run outside the drain hooks and the maintenance window.

A disruptive task is a reboot (``ansible.builtin.reboot``, a ``reboot``/``shutdown`` command), a restart of a
service (``state: restarted`` of ``systemd_service``/``systemd``/``service``, ``systemctl restart`` in a command), or a
benchmark (the ``inference_benchmark`` role or module, a command or script that runs a ``*bench*`` script or
``all_reduce_perf``). It is covered when it runs as the step of ``playbooks/tasks/disruptive.yml`` (the gate, then the
drain hooks, the step, the undrain hooks): included, at any depth, through an include of that file whose
``__gpufleet_step_tasks`` or ``__gpufleet_step_role`` leads to it.

``uncovered(root)`` walks every playbook of ``root/playbooks`` the way Ansible would reach the tasks: plays' pre_tasks,
roles, tasks, post_tasks and handlers; blocks; ``include_tasks``/``import_tasks``; ``include_role``/``import_role``
(``tasks_from``, and the role's handlers, which run wherever they are flushed, so never count as covered by where the
role was included). An include whose target is a template the walker cannot resolve (other than ``{{ role_path }}``)
is reported as well where it is not covered: what it runs cannot be told. A template that names a variable the
includes above it set to a plain value (``__gpufleet_change_role: gpufleet.inference.kernel_upgrade`` in a playbook's
``vars:``, used as ``name: "{{ __gpufleet_change_role }}"`` in a shared task file) is followed with that value. Pure
reading of YAML; run it over a checkout with ``python -m tests.unit.disruptive_coverage [ROOT]``.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field

import yaml

PREFIX = "gpufleet.inference."
SHARED = os.path.join("playbooks", "tasks", "disruptive.yml")
# the tasks file disruptive.yml includes for its gate and hooks: reached only through disruptive.yml
GATED = os.path.join("playbooks", "tasks", "disruptive_gated.yml")
# one drain or undrain hook (the user's own command, HTTP call or task file): what takes the host out, not a step
HOOK = os.path.join("playbooks", "tasks", "hook.yml")

TASK_KEYWORDS = {
    "name", "when", "tags", "vars", "register", "loop", "loop_control", "notify", "listen", "become", "become_user",
    "become_method", "become_flags", "delegate_to", "delegate_facts", "run_once", "changed_when", "failed_when",
    "check_mode", "diff", "ignore_errors", "ignore_unreachable", "no_log", "environment", "timeout", "until", "retries",
    "delay", "args", "any_errors_fatal", "throttle", "module_defaults", "collections", "debugger", "connection",
    "remote_user", "port", "async", "poll", "local_action", "action",
}
INCLUDE_TASKS = {"include_tasks", "import_tasks", "ansible.builtin.include_tasks", "ansible.builtin.import_tasks",
                 "ansible.legacy.include_tasks", "ansible.legacy.import_tasks"}
INCLUDE_ROLE = {"include_role", "import_role", "ansible.builtin.include_role", "ansible.builtin.import_role",
                "ansible.legacy.include_role", "ansible.legacy.import_role"}
REBOOT_MODULES = {"reboot", "ansible.builtin.reboot", "ansible.legacy.reboot", "community.general.shutdown"}
SERVICE_MODULES = {"service", "systemd", "systemd_service", "ansible.builtin.service", "ansible.builtin.systemd",
                   "ansible.builtin.systemd_service", "ansible.legacy.service", "ansible.legacy.systemd",
                   "ansible.legacy.systemd_service"}
COMMAND_MODULES = {"command", "shell", "script", "raw", "ansible.builtin.command", "ansible.builtin.shell",
                   "ansible.builtin.script", "ansible.builtin.raw"}
BENCHMARK_MODULES = {PREFIX + "inference_benchmark", "inference_benchmark"}
BENCHMARK_ROLES = {"inference_benchmark"}
COMMAND_RE = re.compile(r"(^|[\s/;|&])(reboot|shutdown|poweroff)(\s|$)|systemctl\s+(\S+\s+)*(restart|reboot|kexec)\b"
                        r"|\w*bench\w*\.py|all_reduce_perf")
JINJA = re.compile(r"{{.*?}}")
PLAIN_VAR = re.compile(r"{{\s*(\w+)\s*}}")


def bind(bound: dict, task: dict) -> dict:
    """The variables an include passes down: the ones above it, and its own ``vars:`` that are plain values."""
    own = {k: v for k, v in (task.get("vars") or {}).items() if isinstance(v, str) and not JINJA.search(v)}
    return {**bound, **own} if own else bound


def expand(text: str, bound: dict) -> str:
    """``text`` with each ``{{ name }}`` of a bound variable replaced by its value."""
    return PLAIN_VAR.sub(lambda m: bound.get(m.group(1), m.group(0)), text)


# Restarts that do not interrupt serving, each with why; the key is "<file>: <task name>".
NOT_DISRUPTIVE = {
    "roles/irq_affinity/tasks/main.yml: Restart irqbalance (only if it runs)":
        "irqbalance only moves interrupts: serving goes on while it restarts",
}


@dataclass
class Walk:
    root: str
    found: list = field(default_factory=list)  # (where, what, trail) of uncovered disruptive tasks
    seen: set = field(default_factory=set)

    def rel(self, path: str) -> str:
        return os.path.relpath(path, self.root)

    def load(self, path: str):
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f) or []

    # ---- what a task is
    @staticmethod
    def action(task: dict) -> tuple[str, object]:
        for key, value in task.items():
            if key not in TASK_KEYWORDS and not key.startswith("with_") and key not in ("block", "rescue", "always"):
                return key, value
        if "action" in task or "local_action" in task:
            spec = task.get("action") or task.get("local_action")
            if isinstance(spec, dict):
                return spec.get("module", ""), spec
            return str(spec).split()[0], str(spec)
        return "", None

    def disruptive(self, task: dict, module: str, args) -> str | None:
        if module in REBOOT_MODULES:
            return "reboot"
        if module in BENCHMARK_MODULES:
            return "benchmark"
        if module in SERVICE_MODULES and isinstance(args, dict) and re.search(r"restarted", str(args.get("state", ""))):
            return "restart"
        if module in COMMAND_MODULES:
            parts = [args.get("cmd"), args.get("_raw_params"), args.get("argv")] if isinstance(args, dict) else [args]
            text = " ".join(" ".join(map(str, v)) if isinstance(v, list) else str(v) for v in parts if v)
            if COMMAND_RE.search(text):
                return "command " + text.strip()[:60]
        return None

    # ---- where an include goes
    def resolve(self, target: str, here: str, role: str | None, bound: dict) -> str | None:
        """The file an include names, or None when it is a template the walker cannot follow."""
        target = expand(target, bound)
        if role is not None:
            target = re.sub(r"{{\s*role_path\s*}}", role, target)
        if JINJA.search(target):
            return None
        if os.path.isabs(target):
            return os.path.normpath(target)
        candidates = [os.path.join(here, target)]
        if role is not None:
            candidates.append(os.path.join(role, "tasks", target))
        candidates.append(os.path.join(self.root, "playbooks", target))
        candidates.append(os.path.join(self.root, "playbooks", "tasks", target))
        for c in candidates:
            if os.path.isfile(c):
                return os.path.normpath(c)
        raise FileNotFoundError(f"{self.rel(here)}: include of {target} found nowhere ({candidates})")

    def role_dir(self, name: str, bound: dict) -> str | None:
        """This collection's role directory; None for a template or another collection's role."""
        name = expand(name, bound)
        if JINJA.search(name):
            return None
        short = name[len(PREFIX):] if name.startswith(PREFIX) else name
        path = os.path.join(self.root, "roles", short)
        if os.path.isdir(path):
            return path
        if name.count(".") == 2 and not name.startswith(PREFIX):
            return None  # another collection's role: what it runs cannot be told from here
        raise FileNotFoundError(f"role {name} is not in {self.rel(os.path.join(self.root, 'roles'))}")

    # ---- the walk
    def tasks(self, tasks, covered: bool, here: str, role: str | None, trail: tuple, bound: dict) -> None:
        for task in tasks or []:
            if not isinstance(task, dict):
                continue
            if "block" in task:
                for part in ("block", "rescue", "always"):
                    self.tasks(task.get(part), covered, here, role, trail, bind(bound, task))
                continue
            self.task(task, covered, here, role, trail, bound)

    def task(self, task: dict, covered: bool, here: str, role: str | None, trail: tuple, bound: dict) -> None:
        module, args = self.action(task)
        name = task.get("name", module)
        where = f"{trail[-1]}: {name}"  # trail[-1]: this file, relative to the root
        if module in INCLUDE_TASKS:
            target = args.get("file") if isinstance(args, dict) else args
            bound = bind(bound, task)
            path = self.resolve(str(target), here, role, bound)
            if path is None:
                if not covered:
                    self.found.append((where, f"includes {target}, which cannot be told", trail))
                return
            if os.path.normpath(path) == os.path.normpath(os.path.join(self.root, SHARED)):
                self.step(task, here, role, trail + (where,), bound)
                return
            if path == os.path.join(self.root, HOOK):
                return
            if os.path.normpath(path) == os.path.normpath(os.path.join(self.root, GATED)):
                self.found.append((where, f"includes {GATED} directly (include {SHARED})", trail))
                return
            self.file(path, covered, role, trail + (where,), bound)
            return
        if module in INCLUDE_ROLE:
            spec = args if isinstance(args, dict) else {"name": args}
            self.role(str(spec.get("name", "")), spec.get("tasks_from", "main"), covered, trail + (where,), where,
                      bind(bound, task))
            return
        what = self.disruptive(task, module, args)
        if what is None or covered:
            return
        if where in NOT_DISRUPTIVE:
            return
        self.found.append((where, what, trail))

    def step(self, task: dict, here: str, role: str | None, trail: tuple, bound: dict) -> None:
        """An include of disruptive.yml: its step is covered."""
        step_vars = task.get("vars") or {}
        tasks_file, step_role = step_vars.get("__gpufleet_step_tasks"), step_vars.get("__gpufleet_step_role")
        if tasks_file is None and step_role is None:
            self.found.append((trail[-1], f"includes {SHARED} with no __gpufleet_step_tasks or __gpufleet_step_role",
                               trail))
            return
        if tasks_file is not None:
            path = self.resolve(str(tasks_file), os.path.join(self.root, "playbooks", "tasks"), role, bound)
            if path is not None:
                self.file(path, True, role, trail, bound)
        if step_role is not None:
            self.role(str(step_role), "main", True, trail, trail[-1], bound)

    def role(self, name: str, tasks_from: str, covered: bool, trail: tuple, where: str, bound: dict) -> None:
        name = expand(name, bound)
        if name.split(".")[-1] in BENCHMARK_ROLES:
            if not covered:
                self.found.append((where, f"benchmark (role {name})", trail))
            return
        path = self.role_dir(name, bound)
        if path is None:
            if not covered:
                self.found.append((where, f"includes the role {name}, which cannot be told", trail))
            return
        tasks_file = os.path.join(path, "tasks", tasks_from if tasks_from.endswith((".yml", ".yaml")) else tasks_from + ".yml")
        self.file(tasks_file, covered, path, trail, {})  # a role's own files see its variables, not the includer's
        handlers = os.path.join(path, "handlers", "main.yml")
        if os.path.isfile(handlers):
            # handlers run where they are flushed, maybe after the step: never covered by the role's place
            self.file(handlers, False, path, trail, {})

    def file(self, path: str, covered: bool, role: str | None, trail: tuple, bound: dict) -> None:
        key = (path, covered, tuple(sorted(bound.items())))
        if key in self.seen:
            return
        self.seen.add(key)
        self.tasks(self.load(path), covered, os.path.dirname(path), role, trail + (self.rel(path),), bound)

    def playbook(self, path: str) -> None:
        trail = (self.rel(path),)
        for play in self.load(path):
            if not isinstance(play, dict) or "import_playbook" in play or "ansible.builtin.import_playbook" in play:
                continue  # each playbook is walked on its own
            here = os.path.dirname(path)
            for part in ("pre_tasks", "tasks", "post_tasks"):
                self.tasks(play.get(part), False, here, None, trail, {})
            for entry in play.get("roles") or []:
                name = entry if isinstance(entry, str) else entry.get("role") or entry.get("name")
                self.role(str(name), "main", False, trail, f"{trail[-1]}: role {name}", {})
            self.tasks(play.get("handlers"), False, here, None, trail, {})


def playbooks(root: str) -> list[str]:
    top = os.path.join(root, "playbooks")
    return sorted(os.path.join(top, f) for f in os.listdir(top) if f.endswith((".yml", ".yaml")))


def uncovered(root: str) -> list[str]:
    """Every disruptive task (or include that cannot be told) a playbook reaches outside disruptive.yml's step, as
    'WHERE: WHAT (via A -> B -> ...)'; empty when every one is covered."""
    root = os.path.abspath(root)
    walk = Walk(root)
    for path in playbooks(root):
        walk.playbook(path)
    out = []
    for where, what, trail in walk.found:
        line = f"{where}: {what} (via {' -> '.join(trail)})"
        if line not in out:
            out.append(line)
    return out


if __name__ == "__main__":
    found = uncovered(sys.argv[1] if len(sys.argv) > 1 else os.getcwd())
    print("\n".join(found) or "every restart, reboot and benchmark runs between the drain hooks, inside the window")
    sys.exit(1 if found else 0)

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host and a controller for kernel_upgrade_flow.step(), in memory: the host keeps its kernel,
GRUB default (and a pending one-shot entry), boot id, uptime, journal, history and the boot-health
unit; the controller executes each action task by task, in the order of the role's own task file
(roles/kernel_upgrade/tasks/action_<name>.yml, read here), and reports the event that file reports.

A kill stops the controller after any task of any action (the host keeps what those tasks did) and a
new run starts with event start; a controller ``lost`` for good lets the boot-health unit act first,
as it does on a host nobody contacts: it reverts an armed, uncommitted candidate."""

from __future__ import annotations

import copy
import functools
import os

import yaml

from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.flow import step
from tests.helpers import REPO

TASKS = os.path.join(REPO, "roles", "kernel_upgrade", "tasks")
INCLUDES = {"lock.yml": "lock", "benchmark.yml": "benchmark", "step.yml": "report", "vllm_check.yml": "vllm"}

OLD = "6.1.0-50-cloud-amd64"
NEW = "6.1.0-56-cloud-amd64"
BASE_RUNS = [1000.0, 1012.0, 995.0, 1004.0, 998.0, 1008.0, 1001.0, 993.0, 1010.0, 1003.0, 997.0, 1006.0, 999.0, 1002.0,
             1005.0]
SETTINGS = {"reboot_ok": True, "check_mode": False, "lock": True, "lock_packages": [], "verify_pcie": True,
            "commit_timeout": 1800, "outputs": True, "stability": True,
            "gate": {"threshold": 0.95, "alpha": 0.01, "pass_alpha": 0.005, "min_runs": 5, "max_runs": 15}}
PACKAGES = [f"linux-image-{OLD}", "linux-image-cloud-amd64", "nvidia-driver", "nvidia-kernel-dkms", "gpufleet-lab-dkms",
            "openssh-server"]


def task_effect(task: dict) -> str:
    """What a task of the role does to the simulated host: boot_default/boot_once (kernel_boot_entry),
    unit_present/unit_absent (kernel_boot_health), reboot, install (apt), lock, benchmark, report,
    vllm, or other (reads: pcie_facts, preflight checks, copies)."""
    if "gpufleet.inference.kernel_boot_entry" in task:
        return "boot_" + task["gpufleet.inference.kernel_boot_entry"]["boot"]
    if "gpufleet.inference.kernel_boot_health" in task:
        return "unit_" + task["gpufleet.inference.kernel_boot_health"].get("state", "present")
    if "ansible.builtin.reboot" in task:
        return "reboot"
    if "ansible.builtin.apt" in task:
        return "install"
    include = (task.get("ansible.builtin.include_tasks") or {}).get("file")
    return INCLUDES.get(include, "other") if include else "other"


@functools.lru_cache(maxsize=None)
def role_steps(action: str) -> tuple[dict, ...]:
    """The tasks of roles/kernel_upgrade/tasks/action_<action>.yml, in order: effect, its ``when``
    (the flow's reboot flag is the only condition the simulated host evaluates) and, for the report,
    the event it sends."""
    with open(os.path.join(TASKS, f"action_{action}.yml"), encoding="utf-8") as fh:
        tasks = yaml.safe_load(fh)
    return tuple({"name": t.get("name", "?"), "effect": task_effect(t), "when": str(t.get("when") or ""),
                  "event": (t.get("vars") or {}).get("__kernel_upgrade_event")} for t in tasks)


class Host:
    def __init__(self, speed_new: float = 1.0, boots: bool = True, verify_ok: bool = True, post_ok: bool = True,
                 foreign_load: str = "", inconclusive_speeds: list[float] | None = None,
                 base_pattern: list[float] | None = None, cand_pattern: list[float] | None = None,
                 cand_failed: int = 0, workloads: dict | None = None, outputs_new: str = "equivalent",
                 gpus_new: int = 2):
        self.running = OLD
        self.default = OLD
        self.once: str | None = None  # a pending one-shot GRUB entry (grub-reboot)
        self.unit: str | None = None  # the boot-health unit: the candidate it guards, or None
        self.health: dict | None = None  # the unit's last result (a revert)
        self.boot = 0
        self.boot_at = 1_795_990_000.0
        self.journal = None
        self.history: list[dict] = []
        self.held: list[str] = []
        self.installed = {OLD}
        self.speed_new = speed_new
        self.boots = boots
        self.verify_ok = verify_ok
        self.post_ok = post_ok
        self.foreign_load = foreign_load  # "baseline" or "candidate": every run of that side is contaminated
        self.inconclusive_speeds = inconclusive_speeds
        # per-run multipliers (cyclic over the side's runs so far): a noisy baseline or candidate
        self.patterns = {"baseline": base_pattern or [1.0], "candidate": cand_pattern or [1.0]}
        self.cand_failed = cand_failed  # failed requests or short outputs of every candidate benchmark
        # per label, the model and concurrency level the benchmark ran (the role sends the result's server and
        # config); a label mapped to None sends neither, as the role did before workload fingerprints
        self.workloads = {"baseline": ("Qwen/Qwen2.5-7B-Instruct", 4), "candidate": ("Qwen/Qwen2.5-7B-Instruct", 4),
                          **(workloads or {})}
        self.outputs_new = outputs_new  # output_equivalence's verdict on the new kernel
        self.gpus_new = gpus_new  # GPUs on the bus under the new kernel (2 before: fewer is a GPU gone)
        self.references: list[str] = []  # the kernel each output reference was recorded on
        self.benchmarks: list[dict] = []  # every benchmark: label, kernel, default at the time
        self.reboots = 0
        self.runs_done: dict = {}
        self.pre: dict = {}
        self.now = 1_796_000_000.0

    def observe(self, event: str, data: dict, settings: dict | None = None) -> dict:
        self.now += 10
        return {"event": event, "data": data, "preflight": self.pre, "running": self.running, "default": self.default,
                "boot_id": f"boot-{self.boot}", "uptime": self.now - self.boot_at, "now": self.now, "target": NEW,
                "run_id": "run1", "installed_packages": sorted(PACKAGES + [f"linux-image-{v}" for v in self.installed]),
                "health": self.health, "settings": settings or SETTINGS}

    def write(self, journal):
        if journal is None:
            return
        if journal.get("finished"):
            self.history.append(copy.deepcopy(journal))
            self.journal = None
        else:
            self.journal = copy.deepcopy(journal)

    def reboot(self):
        """GRUB boots the pending one-shot entry once (the saved default when that kernel does not come
        up), else the saved default."""
        once, self.once = self.once, None
        self.boot += 1
        self.reboots += 1
        self.boot_at = self.now
        self.running = once if once and (once != NEW or self.boots) else self.default

    def unguarded(self) -> bool:
        """The candidate runs uncommitted (not the saved default) and no boot-health unit guards it."""
        return self.running == NEW and self.default != NEW and self.unit != NEW

    def unit_fires(self) -> bool:
        """The boot-health unit on a host no controller contacts: an armed, uncommitted candidate is
        rebooted into the saved default, with the result file the next run reads."""
        if self.running != NEW or self.default == NEW or self.unit != NEW:
            return False
        self.health = {"action": "revert", "target": NEW, "old": OLD, "reasons": ["not committed (simulated)"]}
        self.reboot()
        return True

    def preflight(self) -> dict:
        return {"ok": True, "msg": "preflight passed", "running_entry": f"adv>{self.running}",
                "package": f"linux-image-{NEW}", "target_installed": NEW in self.installed}

    def benchmark(self, action: dict) -> dict:
        label = action["label"]
        self.benchmarks.append({"label": label, "kernel": self.running, "default": self.default})
        speed = self.speed_new if self.running == NEW else 1.0
        done = self.runs_done.get((label, self.running), 0)
        pattern = self.patterns[label]
        runs = [BASE_RUNS[(done + i) % len(BASE_RUNS)] * pattern[(done + i) % len(pattern)]
                for i in range(action["runs"])]
        self.runs_done[(label, self.running)] = done + len(runs)
        if self.running == NEW and self.inconclusive_speeds:
            speed = self.inconclusive_speeds.pop(0) if len(self.inconclusive_speeds) > 1 else self.inconclusive_speeds[0]
        contaminated = list(range(len(runs))) if self.foreign_load == label else []
        self.benchmarks[-1].update(runs=action["runs"], measured_only=action.get("measured_only", False),
                                   concurrency=action.get("concurrency"))
        data = {"label": label, "samples": [v * speed for v in runs], "kernel": self.running,
                "files": [f"/var/lib/gpufleet/benchmarks/{label}-{len(self.benchmarks)}.json"],
                "concurrency": 4, "contaminated": contaminated,
                "failed": self.cand_failed if label == "candidate" else 0, "requests": 32 * len(runs)}
        if self.workloads.get(label):
            model, level = self.workloads[label]
            data.update(samples={str(level): data["samples"]}, concurrency=0,
                        server={"model": model, "root": f"/models/{model}", "max_model_len": 4096},
                        config={"model": None, "prompt_tokens": 1024, "output_tokens": 128, "concurrency": [level],
                                "requests": 32, "seed": action["seed"], "ignore_eos": True,
                                "prompt_mode": "token_ids", "token_id_range": [1000, 4000],
                                "measured_only": action.get("measured_only", False)})
        return data

    def report(self, action: dict, measured: dict | None) -> dict:
        """The data the action's report sends."""
        name = action["name"]
        findings = [{"code": "link_downgraded", "device": "0000:01:00.0"}]
        if name == "benchmark":
            return measured
        if name == "audit":
            return {"findings": findings, "pcie": self.health_doc()}
        if name == "outputs":
            self.references.append(self.running)
            return {"reference": "/var/lib/gpufleet/kernel_upgrade/outputs-reference.json", "model": "Qwen/Qwen2.5-7B-Instruct",
                    "band": {"top1_agreement_min": 1.0, "mean_abs_logprob_diff_max": 0.0, "p99_abs_logprob_diff_max": 0.0},
                    "aa": {"top1_agreement": 1.0}}
        if name == "check":
            verdict = self.outputs_new if self.running == NEW else "equivalent"
            outputs = {"verdict": verdict, "reason": f"{verdict} (simulated)", "figures": {"top1_agreement": 0.8}}
            return {"outputs": outputs if action.get("outputs") else None,
                    "pcie": self.health_doc() if action.get("stability") else None, "kernel_log": []}
        if name == "install":
            return {"preflight": {"ok": self.post_ok, "msg": "ok" if self.post_ok else "driver: no nvidia module"}}
        if name == "verify":
            if not self.verify_ok:
                findings.append({"code": "aer_errors", "device": "0000:01:00.0"})
            return {"cmdline_missing": [], "findings_after": findings, "vllm": {"checked": True, "ok": True, "msg": ""}}
        if name in ("commit", "rollback"):
            return {"locked": self.held, **({"server": "serving"} if name == "rollback" else {})}
        return {}

    def health_doc(self) -> dict:
        """The audit's document as the stability part reads it: the GPUs on the bus (one fewer under the new kernel
        with ``gpus_new=1``)."""
        n = self.gpus_new if self.running == NEW else 2
        bdfs = ["0000:01:00.0", "0000:41:00.0"][:n]
        return {"gpus": [{"bdf": b} for b in bdfs], "devices": {b: {"bdf": b, "driver": "nvidia"} for b in bdfs}}

    def apply(self, effect: str, action: dict) -> None:
        if effect == "boot_default":  # kernel_boot_entry boot: default also drops a pending one-shot entry
            self.default, self.once = action["version"], None
        elif effect == "boot_once":
            self.once = action["version"]
        elif effect == "unit_present":  # the module also removes the unit's previous result
            self.unit, self.health = action["version"], None
        elif effect == "unit_absent":
            self.unit = None
        elif effect == "reboot":
            self.reboot()
        elif effect == "install":
            self.installed.add(NEW)
        elif effect == "lock":
            self.held = list(action["hold"])

    def execute(self, action: dict, tasks: int | None = None) -> tuple[str, dict] | None:
        """Do what the role's task file of ``action`` does, task by task; the event and data it reports.
        With ``tasks`` the controller dies after that many tasks (None is returned; the report is the
        last task, so ``tasks`` below the count of tasks)."""
        measured = None
        for i, task in enumerate(role_steps(action["name"])):
            if tasks is not None and i == tasks:
                return None
            if "next_action.reboot" in task["when"] and not action.get("reboot"):
                continue
            if task["effect"] == "benchmark":
                measured = measured or self.benchmark(action)  # two includes, one of them runs (measured_only)
            elif task["effect"] == "report":
                return task["event"], self.report(action, measured)
            else:
                self.apply(task["effect"], action)
        raise AssertionError(f"action_{action['name']}.yml reports nothing")


def drive(host: Host, crash_after: int | None = None, max_steps: int = 80, kill: tuple[int, int] | None = None,
          lost: bool = False) -> dict:
    """Run the flow to its finish. With ``crash_after`` the controller dies after that many executed
    actions, before their report (the host keeps what they did); with ``kill`` (action number, tasks
    done) it dies after that many tasks of that action. A new run then starts with event start; with
    ``lost`` the boot-health unit acts first (the controller came back too late). Returns the last
    finish action, every action seen, and ``unguarded``: whether the host was left running an
    uncommitted candidate that no boot-health unit guards when the controller died."""
    actions_done = 0
    seen: list[dict] = []
    event, data = "start", {}
    host.pre = host.preflight()
    crashed = unguarded = fired = False
    for _step in range(max_steps):
        journal, action = step(host.journal, host.observe(event, data))
        host.write(journal)
        seen.append(action)
        if action["name"] == "finish":
            return {"finish": action, "actions": seen, "crashed": crashed, "unguarded": unguarded, "fired": fired}
        actions_done += 1
        if crash_after is not None and not crashed and actions_done == crash_after:
            kill = (actions_done, len(role_steps(action["name"])) - 1)
        if kill is not None and not crashed and actions_done == kill[0]:
            host.execute(action, tasks=kill[1])
            crashed, unguarded = True, host.unguarded()
            fired = lost and host.unit_fires()
            host.now += 10_000 if lost else 0
            event, data = "start", {}
            host.pre = host.preflight()
            continue
        event, data = host.execute(action)
    raise AssertionError(f"no finish after {max_steps} steps: {seen[-5:]}")

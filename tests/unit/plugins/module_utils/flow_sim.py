# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host and a controller for kernel_upgrade_flow.step(), in memory: the host keeps its kernel,
GRUB default, boot id, journal and history; the controller executes each action as the role does
and reports the event. A crash drops the controller's memory between an action and its report."""

from __future__ import annotations

import copy

from ansible_collections.gpufleet.inference.plugins.module_utils.kernel_upgrade_flow import step

OLD = "6.1.0-50-cloud-amd64"
NEW = "6.1.0-56-cloud-amd64"
BASE_RUNS = [1000.0, 1012.0, 995.0, 1004.0, 998.0, 1008.0, 1001.0, 993.0, 1010.0, 1003.0, 997.0, 1006.0, 999.0, 1002.0,
             1005.0]
SETTINGS = {"reboot_ok": True, "check_mode": False, "lock": True, "lock_packages": [], "verify_pcie": True,
            "commit_timeout": 1800,
            "gate": {"threshold": 0.95, "alpha": 0.01, "pass_alpha": 0.005, "min_runs": 5, "max_runs": 15}}
PACKAGES = [f"linux-image-{OLD}", "linux-image-cloud-amd64", "nvidia-driver", "nvidia-kernel-dkms", "gpufleet-lab-dkms",
            "openssh-server"]


class Host:
    def __init__(self, speed_new: float = 1.0, boots: bool = True, verify_ok: bool = True, post_ok: bool = True,
                 foreign_load: str = "", inconclusive_speeds: list[float] | None = None,
                 base_pattern: list[float] | None = None, cand_pattern: list[float] | None = None,
                 cand_failed: int = 0, workloads: dict | None = None):
        self.running = OLD
        self.default = OLD
        self.boot = 0
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
        self.benchmarks: list[dict] = []  # every benchmark: label, kernel, default at the time
        self.reboots = 0
        self.runs_done: dict = {}
        self.pre: dict = {}
        self.now = 1_796_000_000.0

    def observe(self, event: str, data: dict, settings: dict | None = None) -> dict:
        self.now += 10
        return {"event": event, "data": data, "preflight": self.pre, "running": self.running, "default": self.default,
                "boot_id": f"boot-{self.boot}", "now": self.now, "target": NEW, "run_id": "run1",
                "installed_packages": sorted(PACKAGES + [f"linux-image-{v}" for v in self.installed]),
                "health": None, "settings": settings or SETTINGS}

    def write(self, journal):
        if journal is None:
            return
        if journal.get("finished"):
            self.history.append(copy.deepcopy(journal))
            self.journal = None
        else:
            self.journal = copy.deepcopy(journal)

    def reboot(self, once: str | None = None):
        self.boot += 1
        self.reboots += 1
        if once and not self.boots:
            self.running = self.default
        else:
            self.running = once or self.default

    def preflight(self) -> dict:
        return {"ok": True, "msg": "preflight passed", "running_entry": f"adv>{self.running}",
                "package": f"linux-image-{NEW}", "target_installed": NEW in self.installed}

    def execute(self, action: dict) -> tuple[str, dict]:
        """Do what the role does for ``action``; the event and data to report."""
        name = action["name"]
        if name == "lock":
            self.held = list(action["hold"])
            return "locked", {}
        if name == "benchmark":
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
                    "failed": self.cand_failed if label == "candidate" else 0,
                    "requests": 32 * len(runs)}
            if self.workloads.get(label):
                model, level = self.workloads[label]
                data.update(samples={str(level): data["samples"]}, concurrency=0,
                            server={"model": model, "root": f"/models/{model}", "max_model_len": 4096},
                            config={"model": None, "prompt_tokens": 1024, "output_tokens": 128, "concurrency": [level],
                                    "requests": 32, "seed": action["seed"], "ignore_eos": True,
                                    "prompt_mode": "token_ids", "token_id_range": [1000, 4000],
                                    "measured_only": action.get("measured_only", False)})
            return "benchmarked", data
        if name == "audit":
            return "audited", {"findings": [{"code": "link_downgraded", "device": "0000:01:00.0"}]}
        if name == "pin":
            self.default = action["version"]
            return "pinned", {}
        if name == "install":
            self.installed.add(NEW)
            return "installed", {"preflight": {"ok": self.post_ok, "msg": "ok" if self.post_ok else "driver: no nvidia module"}}
        if name == "boot_once":
            self.reboot(once=action["version"])
            return "rebooted", {}
        if name == "verify":
            findings = [{"code": "link_downgraded", "device": "0000:01:00.0"}]
            if not self.verify_ok:
                findings.append({"code": "aer_errors", "device": "0000:01:00.0"})
            return "verified", {"cmdline_missing": [], "findings_after": findings,
                                "vllm": {"checked": True, "ok": True, "msg": ""}}
        if name == "commit":
            self.default = action["version"]
            self.held = list(action["hold"])
            return "committed", {"locked": self.held}
        if name == "rollback":
            self.default = action["version"]
            if self.running != action["version"]:
                self.reboot()
            self.held = list(action["hold"])
            return "rolled_back", {"locked": self.held, "server": "serving"}
        raise AssertionError(f"unknown action {action}")


def drive(host: Host, crash_after: int | None = None, max_steps: int = 80) -> dict:
    """Run the flow to its finish; with ``crash_after`` the controller dies after that many executed
    actions (the host keeps what they did) and a new run starts with event start. Returns the last
    finish action and every action seen."""
    actions_done = 0
    seen: list[dict] = []
    event, data = "start", {}
    host.pre = host.preflight()
    crashed = False
    for _step in range(max_steps):
        journal, action = step(host.journal, host.observe(event, data))
        host.write(journal)
        seen.append(action)
        if action["name"] == "finish":
            return {"finish": action, "actions": seen, "crashed": crashed}
        event, data = host.execute(action)
        actions_done += 1
        if crash_after is not None and actions_done == crash_after and not crashed:
            crashed = True
            event, data = "start", {}
            host.pre = host.preflight()
    raise AssertionError(f"no finish after {max_steps} steps: {seen[-5:]}")

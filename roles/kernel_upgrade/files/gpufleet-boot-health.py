# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Host-local commit or revert of a candidate kernel (installed by gpufleet.inference.kernel_upgrade).

Run by gpufleet-boot-health.timer every 30 s after boot. Under the candidate kernel, and as long as
the controller has not committed it (made it the saved GRUB default), it reboots the host, and so
GRUB boots the saved default (the old kernel), when:

* the commit deadline passed: the later of the journal's ``commit_deadline`` (pushed by the
  controller at every contact) and boot time + ``commit_timeout``; a host the controller cannot
  reach returns to the known-good kernel by itself;
* the GPU driver module is not loaded for this kernel where the old kernel used it;
* ``nvidia-smi`` does not answer where a GPU driver is used;
* the inference server's unit failed, or is not active after ``vllm_grace`` seconds.

Under any other kernel, or once committed, it does nothing. Before rebooting it writes why to the
result file, which the controller's next run reads. Only the standard library; no Ansible needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

CONFIG = "/etc/gpufleet/boot-health.json"
ENV = {"LANG": "C", "LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def entry_boots(entry: str | None, version: str) -> bool:
    """Whether a GRUB saved_entry (``submenu>entry`` id form, as kernel_boot_entry writes it) boots ``version``."""
    leaf = (entry or "").rsplit(">", 1)[-1]
    return bool(leaf) and (f"-{version}-" in leaf or leaf.endswith(f"-{version}") or f" {version}" in leaf)


def assess(state: dict, cfg: dict) -> dict:
    """The decision, from what was read: {action: none|committed|wait|revert, reasons}.

    ``state``: running, uptime, now, saved_entry, journal (dict or None), loaded (module names),
    nvidia_smi_rc (None: not installed), vllm_state (systemctl is-active output, or None).
    """
    target = cfg["target"]
    if state["running"] != target:
        return {"action": "none", "reasons": [f"running {state['running']}, not the candidate {target}"]}
    if entry_boots(state.get("saved_entry"), target):
        return {"action": "committed", "reasons": [f"the saved default boots {target}: committed"]}
    reasons = []
    journal = state.get("journal") or {}
    boot_epoch = state["now"] - state["uptime"]
    deadline = max(float(journal.get("commit_deadline") or 0), boot_epoch + float(cfg["commit_timeout"]))
    if state["now"] > deadline:
        reasons.append(f"not committed by the controller within {int(cfg['commit_timeout'])} s of its last contact "
                       f"(deadline passed {int(state['now'] - deadline)} s ago)")
    modules = cfg.get("driver_modules") or []
    if cfg.get("gpu_required") and modules:
        if not set(modules) & set(state.get("loaded") or []):
            reasons.append(f"GPU driver module {'/'.join(modules)} is not loaded under {target}")
        elif state.get("nvidia_smi_rc") not in (None, 0):
            reasons.append(f"nvidia-smi exited {state['nvidia_smi_rc']} under {target}: NVML does not answer")
    unit = cfg.get("vllm_unit")
    vllm = state.get("vllm_state")
    if unit and vllm is not None:
        if vllm == "failed":
            reasons.append(f"{unit} failed under {target}")
        elif vllm != "active" and state["uptime"] > float(cfg.get("vllm_grace", 900)):
            reasons.append(f"{unit} is {vllm}, not active, {int(state['uptime'])} s after boot")
    if reasons:
        return {"action": "revert", "reasons": reasons}
    return {"action": "wait", "reasons": [f"healthy, uncommitted; reverting at {int(deadline)} unless committed"]}


# ---- reads and the reboot (root: the host tree, for tests) -------------------------------------------------
def read(root: str, path: str) -> str | None:
    try:
        with open(root + path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def grubenv_var(text: str | None, key: str) -> str | None:
    for line in (text or "").splitlines():
        if line.startswith(key + "="):
            return line.split("=", 1)[1]
    return None


def run(argv: list[str]) -> tuple[int | None, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=ENV, check=False)
    except FileNotFoundError:
        return None, ""
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    return proc.returncode, proc.stdout.strip()


def gather(cfg: dict, root: str = "") -> dict:
    journal = None
    text = read(root, cfg.get("journal") or "/var/lib/gpufleet/kernel_upgrade/journal.json")
    if text:
        try:
            journal = json.loads(text)
        except ValueError:
            journal = None
    uptime = float((read(root, "/proc/uptime") or "0").split()[0])
    modules = cfg.get("driver_modules") or []
    smi = None
    if cfg.get("gpu_required") and modules:
        smi, _out = run([cfg.get("nvidia_smi") or "nvidia-smi", "-L"])
    vllm = None
    if cfg.get("vllm_unit"):
        _rc, vllm = run(["systemctl", "is-active", cfg["vllm_unit"]])
    return {"running": (read(root, "/proc/sys/kernel/osrelease") or "").strip(), "uptime": uptime, "now": time.time(),
            "saved_entry": grubenv_var(read(root, cfg.get("grubenv") or "/boot/grub/grubenv"), "saved_entry"),
            "journal": journal if isinstance(journal, dict) else None,
            "loaded": [m for m in modules if os.path.isdir(f"{root}/sys/module/{m}")],
            "nvidia_smi_rc": smi, "vllm_state": vllm or None}


def write_durable(path: str, data: str) -> None:
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".gpufleet-", dir=parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dfd = os.open(parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def main(argv: list[str]) -> int:
    config = argv[1] if len(argv) > 1 else CONFIG
    root = os.environ.get("GPUFLEET_BOOT_HEALTH_ROOT", "")
    try:
        with open(root + config, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError) as err:
        print(f"gpufleet-boot-health: cannot read {config}: {err}; nothing done", file=sys.stderr)
        return 1
    state = gather(cfg, root)
    verdict = assess(state, cfg)
    print(f"gpufleet-boot-health: {verdict['action']}: {'; '.join(verdict['reasons'])}")
    if verdict["action"] == "revert":
        result = {"action": "revert", "target": cfg["target"], "old": cfg.get("old"), "reasons": verdict["reasons"],
                  "at": state["now"], "boot_id": (read(root, "/proc/sys/kernel/random/boot_id") or "").strip()}
        write_durable(root + (cfg.get("result") or "/var/lib/gpufleet/kernel_upgrade/boot-health.json"),
                      json.dumps(result, indent=2, sort_keys=True) + "\n")
        if not root:
            rc, _out = run(["systemctl", "reboot"])
            return 0 if rc == 0 else 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

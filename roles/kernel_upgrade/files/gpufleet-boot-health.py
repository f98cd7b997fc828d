# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Host-local commit or revert of a candidate kernel (installed by gpufleet.inference.kernel_upgrade).

Run by gpufleet-boot-health.timer every 30 s after boot. Under the candidate kernel, and as long as
the controller has not committed it (made it the saved GRUB default), it reboots the host, and so
GRUB boots the saved default (the old kernel), when:

* the commit deadline passed. The deadline is measured on this boot's own clock (seconds since boot,
  /proc/uptime), never on the wall clock, which may jump: the journal's ``deadline`` record
  (``boot_id``, ``uptime``: seconds since that boot), pushed by the controller at every contact, counts
  when it was stamped during this boot (``boot_id`` is this boot's); a record from another boot (the
  arming, done on the old kernel before the one-shot boot, or any earlier boot) says nothing about
  this boot's clock, and the deadline is then ``commit_timeout`` seconds after this boot, as it is at
  least in any case. A host the controller cannot reach returns to the known-good kernel by itself;
* the deadline cannot be read (no journal, no record, a value that is not a finite number, a record
  farther ahead than any ``commit_timeout``, a ``commit_timeout`` outside 120..86400 s, /proc/uptime
  unreadable, a configuration field of the wrong type): the check fails closed, exactly as if the
  deadline had passed;
* the GPU driver module is not loaded for this kernel where the old kernel used it;
* ``nvidia-smi`` does not answer where a GPU driver is used;
* the inference server's unit failed, or is not active after ``vllm_grace`` seconds.

Under any other kernel, or once committed, it does nothing. Before rebooting it writes why to the
result file, which the controller's next run reads. Only the standard library; no Ansible needed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time

CONFIG = "/etc/gpufleet/boot-health.json"
ENV = {"LANG": "C", "LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
# Seconds: kernel_upgrade_flow.COMMIT_TIMEOUT_S (the script runs without the collection; a unit test keeps them equal).
COMMIT_TIMEOUT_S = (120, 86400)


def entry_boots(entry: str | None, version: str) -> bool:
    """Whether a GRUB saved_entry (``submenu>entry`` id form, as kernel_boot_entry writes it) boots ``version``."""
    leaf = (entry or "").rsplit(">", 1)[-1]
    return bool(leaf) and (f"-{version}-" in leaf or leaf.endswith(f"-{version}") or f" {version}" in leaf)


def finite(value) -> float | None:
    """A finite number (not a bool, not text), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def config_problem(cfg: dict) -> str:
    """What makes the configuration unusable (a field of the wrong type), or ''."""
    for key, kind in (("driver_modules", list), ("journal", str), ("result", str), ("grubenv", str),
                      ("nvidia_smi", str), ("vllm_unit", str), ("old", str)):
        if cfg.get(key) is not None and not isinstance(cfg[key], kind):
            return f"{key} {cfg[key]!r} is not a {kind.__name__}"
    if not all(isinstance(m, str) for m in cfg.get("driver_modules") or []):
        return f"driver_modules {cfg['driver_modules']!r} are not names"
    return ""


def deadline(state: dict, cfg: dict) -> tuple[float | None, str]:
    """(the commit deadline in seconds since this boot, where it comes from); None: it cannot be read."""
    low, high = COMMIT_TIMEOUT_S
    if cfg.get("problem"):
        return None, f"the configuration cannot be used: {cfg['problem']}"
    timeout = finite(cfg.get("commit_timeout"))
    if timeout is None or not low <= timeout <= high:
        return None, f"commit_timeout {cfg.get('commit_timeout')!r} of the configuration is not {low} to {high} s"
    if state.get("uptime") is None:
        return None, "/proc/uptime cannot be read"
    record = (state.get("journal") or {}).get("deadline")
    if state.get("journal") is None or not isinstance(record, dict):
        return None, "the upgrade journal is missing, unreadable or holds no deadline record"
    boot, until = record.get("boot_id"), finite(record.get("uptime"))
    if not isinstance(boot, str) or not boot or until is None:
        return None, f"the journal's deadline record {record!r} is not a boot id with seconds since that boot"
    if boot != state.get("boot_id"):
        return timeout, f"{int(timeout)} s after this boot (the journal's record is from boot {boot})"
    if until - state["uptime"] > high:
        return None, f"the journal's deadline, {int(until)} s after boot, is more than {high} s ahead"
    return max(until, timeout), "the controller's last contact + commit_timeout"


def assess(state: dict, cfg: dict) -> dict:
    """The decision, from what was read: {action: none|committed|wait|revert, reasons}.

    ``state``: running, uptime (seconds since boot, None: unreadable), boot_id, saved_entry, journal
    (dict or None), loaded (module names), nvidia_smi_rc (None: not installed), vllm_state
    (systemctl is-active output, or None).
    """
    target = cfg["target"]
    if state["running"] != target:
        return {"action": "none", "reasons": [f"running {state['running']}, not the candidate {target}"]}
    if entry_boots(state.get("saved_entry"), target):
        return {"action": "committed", "reasons": [f"the saved default boots {target}: committed"]}
    reasons = []
    until, source = deadline(state, cfg)
    uptime = state.get("uptime")
    if until is None:
        reasons.append(f"the commit deadline cannot be read ({source}): failing closed, as if it had passed")
    elif uptime > until:
        reasons.append(f"not committed by the controller within {int(until)} s after boot ({source}; "
                       f"{int(uptime)} s after boot now, deadline passed {int(uptime - until)} s ago)")
    modules = cfg.get("driver_modules") or []
    if cfg.get("gpu_required") and modules:
        if not set(modules) & set(state.get("loaded") or []):
            reasons.append(f"GPU driver module {'/'.join(modules)} is not loaded under {target}")
        elif state.get("nvidia_smi_rc") not in (None, 0):
            reasons.append(f"nvidia-smi exited {state['nvidia_smi_rc']} under {target}: NVML does not answer")
    unit = cfg.get("vllm_unit")
    vllm = state.get("vllm_state")
    grace = finite(cfg.get("vllm_grace"))
    if unit and vllm is not None:
        if vllm == "failed":
            reasons.append(f"{unit} failed under {target}")
        elif vllm != "active" and uptime is not None and uptime > (900.0 if grace is None else grace):
            reasons.append(f"{unit} is {vllm}, not active, {int(uptime)} s after boot")
    if reasons:
        return {"action": "revert", "reasons": reasons}
    return {"action": "wait", "reasons": [f"healthy, uncommitted; reverting {int(until)} s after boot ({source}) "
                                          "unless committed"]}


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


def number(text: str | None) -> float | None:
    """The first field of /proc/uptime as a number; None when absent or not a number."""
    try:
        return float((text or "").split()[0])
    except (IndexError, ValueError):
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
        except (ValueError, RecursionError):
            journal = None
    uptime = finite(number(read(root, "/proc/uptime")))
    modules = cfg.get("driver_modules") or []
    smi = None
    if cfg.get("gpu_required") and modules:
        smi, _out = run([cfg.get("nvidia_smi") or "nvidia-smi", "-L"])
    vllm = None
    if cfg.get("vllm_unit"):
        _rc, vllm = run(["systemctl", "is-active", cfg["vllm_unit"]])
    return {"running": (read(root, "/proc/sys/kernel/osrelease") or "").strip(), "uptime": uptime, "now": time.time(),
            "boot_id": (read(root, "/proc/sys/kernel/random/boot_id") or "").strip(),
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
    if not isinstance(cfg, dict) or not isinstance(cfg.get("target"), str):
        print(f"gpufleet-boot-health: {config} is not a JSON object with a target; nothing done", file=sys.stderr)
        return 1
    if config_problem(cfg):  # under the candidate (ConditionKernelVersion): judge nothing else, fail closed
        cfg = {"target": cfg["target"], "problem": config_problem(cfg)}
    state = gather(cfg, root)
    verdict = assess(state, cfg)
    print(f"gpufleet-boot-health: {verdict['action']}: {'; '.join(verdict['reasons'])}")
    if verdict["action"] == "revert":
        result = {"action": "revert", "target": cfg["target"], "old": cfg.get("old"), "reasons": verdict["reasons"],
                  "at": state["now"], "boot_id": state["boot_id"], "uptime": state["uptime"]}
        write_durable(root + (cfg.get("result") or "/var/lib/gpufleet/kernel_upgrade/boot-health.json"),
                      json.dumps(result, indent=2, sort_keys=True) + "\n")
        if not root:
            rc, _out = run(["systemctl", "reboot"])
            return 0 if rc == 0 else 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_boot_health
short_description: Install or remove the host-local commit-or-revert unit of a candidate kernel
version_added: 0.1.0
description:
  - With O(state=present), before the one-shot boot into O(target), writes C(/etc/gpufleet/boot-health.json),
    C(gpufleet-boot-health.service) and C(gpufleet-boot-health.timer) (both with C(ConditionKernelVersion=<target>)) and
    enables the timer. Under the candidate kernel the check script (C(/usr/local/libexec/gpufleet-boot-health), which the
    role copies first) reboots the host into the saved GRUB default when the controller has not committed within
    O(commit_timeout) of its last contact, when the GPU driver module is not loaded, when C(nvidia-smi) fails, or when
    the inference server's unit failed. A host the controller cannot reach thus returns to the old kernel by itself.
  - O(state=present) also removes the previous check's result file, so that an earlier revert is never read as this one.
  - With O(state=absent) (after the commit and after a rollback), disables the timer and removes the files.
  - Files are written durably (temp file, fsync, rename, fsync of the directory).
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  state:
    description: V(present) installs the unit, V(absent) removes it.
    type: str
    choices: [present, absent]
    default: present
  target:
    description: The candidate kernel release (required with O(state=present)).
    type: str
  old:
    description: The old kernel release (the saved default the host returns to), for the record.
    type: str
    default: ""
  commit_timeout:
    description: Seconds after the controller's last contact (or after boot, whichever is later) before an uncommitted
      candidate reverts. At least 120.
    type: int
    default: 1800
  driver_modules:
    description: GPU driver modules that must be loaded under the candidate when O(gpu_required).
    type: list
    elements: str
    default: [nvidia]
  gpu_required:
    description: The host uses a GPU driver module (the old kernel had one loaded); then the module and C(nvidia-smi) are checked.
    type: bool
    default: false
  vllm_unit:
    description:
      - The inference server's systemd unit that must be healthy (empty - not checked). A name that is no unit file on the
        host is left out of the check, with a warning.
    type: str
    default: ""
  vllm_grace:
    description: Seconds after boot the unit may take to become active.
    type: int
    default: 900
"""

EXAMPLES = r"""
- name: Install the boot-health unit before the one-shot boot
  gpufleet.inference.kernel_boot_health:
    target: 6.1.0-56-cloud-amd64
    old: 6.1.0-50-cloud-amd64
    commit_timeout: 1800
    gpu_required: true
    vllm_unit: vllm.service

- name: Remove it after the commit
  gpufleet.inference.kernel_boot_health:
    state: absent
"""

RETURN = r"""
files:
  description: The files the unit consists of.
  returned: success
  type: list
  elements: str
  sample: [/etc/gpufleet/boot-health.json, /etc/systemd/system/gpufleet-boot-health.service]
actions:
  description: What was done (or would be done in check mode).
  returned: always
  type: list
  elements: dict
  sample: [{action: write, path: /etc/systemd/system/gpufleet-boot-health.timer}, {action: run, argv: [systemctl, daemon-reload]}]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils.boot_health import (
    CONFIG, FILES, SCRIPT, TIMER_NAME, render_all,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.hostcmd import C_LOCALE
from ansible_collections.gpufleet.inference.plugins.module_utils.hostfs import HostFS, finish
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel_upgrade_journal import HEALTH_RESULT, JOURNAL

WANTS = "/etc/systemd/system/timers.target.wants/" + TIMER_NAME


class BootHealthError(Exception):
    pass


UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system",
             "/lib/systemd/system")


def unit_exists(fs: HostFS, unit: str) -> bool:
    return any(fs.exists(f"{d}/{unit}") for d in UNIT_DIRS)


def systemctl(module: AnsibleModule, fs: HostFS, *args: str) -> list[str]:
    if fs.root == "/":
        return [module.get_bin_path("systemctl", required=True), *args]
    return [module.get_bin_path("chroot", required=True), fs.root, "systemctl", *args]


def run(module: AnsibleModule, fs: HostFS) -> dict:
    p = module.params
    actions: list[dict] = []
    before = {path: fs.read_optional(path) for path in FILES}
    if p["state"] == "present":
        if not p["target"]:
            raise BootHealthError("target is required with state=present: the candidate kernel release")
        if not fs.exists(SCRIPT):
            raise BootHealthError(f"the check script {SCRIPT} is not on the host: copy "
                                  "roles/kernel_upgrade/files/gpufleet-boot-health.py there first (the role does)")
        vllm_unit = p["vllm_unit"]
        if vllm_unit and not unit_exists(fs, vllm_unit):
            # a server that is not this unit (a container, another name) must not make the candidate revert
            module.warn(f"{vllm_unit} is not a systemd unit on this host ({', '.join(UNIT_DIRS)}): the boot-health check "
                        "leaves the inference server out; set kernel_upgrade_vllm_unit to the server's unit to include it")
            vllm_unit = ""
        try:
            wanted = render_all(p["target"], old=p["old"], commit_timeout=p["commit_timeout"],
                                driver_modules=p["driver_modules"], gpu_required=p["gpu_required"],
                                vllm_unit=vllm_unit, vllm_grace=p["vllm_grace"], journal=JOURNAL,
                                result=HEALTH_RESULT)
        except ValueError as err:
            raise BootHealthError(str(err)) from None
        writes = [path for path, text in wanted.items() if before[path] != text.rstrip("\n")]
        actions += [{"action": "write", "path": path} for path in writes]
        if fs.exists(HEALTH_RESULT):
            actions.append({"action": "remove", "path": HEALTH_RESULT})
        commands = []
        if writes:
            commands.append(systemctl(module, fs, "daemon-reload"))
        if writes or not fs.exists(WANTS):
            commands.append(systemctl(module, fs, "enable", TIMER_NAME))
        actions += [{"action": "run", "argv": argv} for argv in commands]
        after = {path: wanted[path].rstrip("\n") for path in FILES}
    else:
        present = [path for path in FILES if before[path] is not None]
        commands = []
        if fs.exists(WANTS):
            commands.append(systemctl(module, fs, "disable", TIMER_NAME))
        actions += [{"action": "run", "argv": argv} for argv in commands]
        actions += [{"action": "remove", "path": path} for path in present]
        if present:
            actions.append({"action": "run", "argv": systemctl(module, fs, "daemon-reload")})
        after = {path: None for path in FILES}
    if actions and not module.check_mode:
        for action in actions:
            if action["action"] == "write":
                fs.write_durable(action["path"], wanted[action["path"]], 0o644)
            elif action["action"] == "remove":
                fs.remove(action["path"])
            else:
                rc, out, err = module.run_command(action["argv"])
                if rc != 0:
                    raise BootHealthError(f"'{' '.join(action['argv'])}' exited {rc}: {(err or out).strip()[-400:]}; the "
                                          "boot-health unit is not in place as asked: fix systemd on the host and run again")
    return {"changed": bool(actions), "files": list(FILES), "actions": actions,
            "diff": {"before": "".join(f"# {k}\n{v}\n" for k, v in before.items() if v is not None),
                     "after": "".join(f"# {k}\n{v}\n" for k, v in after.items() if v is not None),
                     "before_header": CONFIG, "after_header": CONFIG}}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["present", "absent"], default="present"),
            target=dict(type="str"),
            old=dict(type="str", default=""),
            commit_timeout=dict(type="int", default=1800),
            driver_modules=dict(type="list", elements="str", default=["nvidia"]),
            gpu_required=dict(type="bool", default=False),
            vllm_unit=dict(type="str", default=""),
            vllm_grace=dict(type="int", default=900),
            root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    module.run_command_environ_update = C_LOCALE
    fs = HostFS(module.params["root"])
    finish(module, "kernel_boot_health", "writes systemd units under /etc/systemd/system and runs systemctl",
           lambda: run(module, fs), BootHealthError)


if __name__ == "__main__":
    main()

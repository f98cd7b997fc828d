#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cpu_tuning
short_description: Set the CPU governor, energy-performance preference, C-state limit and transparent-hugepage policy
version_added: 0.3.0
description:
  - Sets the cpufreq governor (O(governor)) and energy-performance preference (O(energy_performance_preference)) of
    every cpufreq policy, disables the cpuidle states whose exit latency is above O(cstate_max_latency_us) on every online
    CPU, and sets the transparent-hugepage policy (O(thp_enabled), O(thp_defrag)); each write is read back.
  - Every value is checked against what the host offers (C(scaling_available_governors),
    C(energy_performance_available_preferences), the THP files' word lists) before the first write, so a bad value
    changes nothing. A write that does not take undoes the others.
  - A knob the host lacks (no cpufreq driver or no EPP, as in most VMs; no cpuidle driver, as under QEMU TCG; no THP) is
    skipped with the reason in RV(unavailable) and a warning, never faked.
  - The original value of every file is recorded in O(state_dir) before its first change; O(state=absent) writes
    exactly those back (for the knobs in O(restore)) and forgets them.
  - With O(persist), a systemd oneshot unit (C(gpufleet-cpu-tuning.service)) re-applies the kept settings at every boot
    with this module's code (C(/usr/local/libexec/gpufleet-cpu-tuning-apply), settings in
    C(/etc/gpufleet/cpu_tuning.json)); O(state=absent) removes it when no setting is left.
  - Knobs that are not given are left alone, on the host and in the boot file.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  state:
    description:
      - V(present) sets the knobs given; V(absent) restores the recorded originals of the knobs in O(restore).
    type: str
    choices: [present, absent]
    default: present
  governor:
    description: The cpufreq governor of every policy, for example V(performance). Unset leaves it alone.
    type: str
  energy_performance_preference:
    description:
      - The energy-performance preference of every policy (intel_pstate, amd_pstate), for example V(performance).
      - intel_pstate refuses anything but V(performance) under the V(performance) governor; the module says so before
        writing.
    type: str
  cstate_max_latency_us:
    description:
      - Disable every cpuidle state whose exit latency is above this many microseconds, on every online CPU. V(0) leaves
        only polling. States within the limit are left as they are, or put back to their recorded original when an
        earlier, lower limit disabled them.
      - With O(cstate_method=pm_qos), the limit is held through the kernel's CPU latency QoS instead (see there).
    type: int
  cstate_method:
    description:
      - How O(cstate_max_latency_us) is applied.
      - V(cpuidle) writes the cpuidle sysfs C(disable) file of every state above the limit (re-applied at boot by the
        boot unit).
      - V(pm_qos) installs C(gpufleet-pm-qos.service), which writes the limit to C(/dev/cpu_dma_latency) as a 32-bit
        value and holds the file open (the kernel's documented interface, what tuned's C(force_latency) does). The
        governors then pick no idle state above it, on every CPU, and no sysfs file is changed. The module starts it,
        reads it back (the unit active, the value a read of the device gives in force) and enables it for the boot
        (with O(persist)); cpuidle states an earlier V(cpuidle) run disabled are put back. A host without the device
        is skipped with the reason.
      - Either method removes what the other installed; O(state=absent) with V(cstate) in O(restore) stops and removes
        the holder.
    type: str
    choices: [cpuidle, pm_qos]
    default: cpuidle
  thp_enabled:
    description: The transparent-hugepage policy (C(/sys/kernel/mm/transparent_hugepage/enabled)).
    type: str
    choices: [always, madvise, never]
  thp_defrag:
    description: The transparent-hugepage defrag policy (C(/sys/kernel/mm/transparent_hugepage/defrag)).
    type: str
    choices: [always, defer, defer+madvise, madvise, never]
  restore:
    description: With O(state=absent), the knobs to restore (default all).
    type: list
    elements: str
    choices: [governor, energy_performance_preference, cstate, thp_enabled, thp_defrag]
  persist:
    description: Keep the settings across reboots with the boot unit. V(false) removes the unit and its files.
    type: bool
    default: true
  state_dir:
    description: Where the record of original values (C(cpu_tuning.json)) is kept.
    type: path
    default: /var/lib/gpufleet
"""

EXAMPLES = r"""
- name: Performance governor, no C-state deeper than 10 us, THP only where asked
  gpufleet.inference.cpu_tuning:
    governor: performance
    cstate_max_latency_us: 10
    thp_enabled: madvise
    thp_defrag: defer+madvise
  become: true

- name: No C-state deeper than 99 us, held through /dev/cpu_dma_latency (tuned's force_latency)
  gpufleet.inference.cpu_tuning:
    cstate_max_latency_us: 99
    cstate_method: pm_qos
  become: true

- name: Put the governor back as it was, keep the rest
  gpufleet.inference.cpu_tuning:
    state: absent
    restore: [governor, energy_performance_preference]
  become: true
"""

RETURN = r"""
actions:
  description: The sysfs writes, file changes and systemctl steps done, or that would be done in check mode.
  returned: always
  type: list
  elements: dict
  sample:
    - {action: set_value, knob: governor, path: /sys/devices/system/cpu/cpufreq/policy0/scaling_governor, before: powersave,
       after: performance}
    - {action: enable_unit, unit: gpufleet-cpu-tuning.service, argv: [/usr/bin/systemctl, enable, gpufleet-cpu-tuning.service]}
    - {action: restart_unit, unit: gpufleet-pm-qos.service, argv: [/usr/bin/systemctl, restart, gpufleet-pm-qos.service]}
unavailable:
  description: The knobs given that this host lacks, each with the reason.
  returned: success
  type: dict
  sample: {governor: "no cpufreq policy under /sys/devices/system/cpu/cpufreq: this host has no cpufreq driver ..."}
before:
  description: >-
    What was in force before the run: C(governor) and C(energy_performance_preference) per policy, C(cstates_disabled)
    per CPU, C(cpuidle_driver), C(thp_enabled), C(thp_defrag), and C(pm_qos), the holder of O(cstate_method=pm_qos):
    its unit C(installed) and C(enabled), C(active) (C(systemctl is-active); null under another O(root)), the latency
    it C(holds_us) and the value C(/dev/cpu_dma_latency) gives C(in_force_us) (the lowest of all holders; null without
    the device).
  returned: success
  type: dict
  sample: {governor: {policy0: powersave}, energy_performance_preference: {}, cstates_disabled: {cpu0: []},
           cpuidle_driver: intel_idle, thp_enabled: always, thp_defrag: madvise,
           pm_qos: {installed: false, enabled: false, active: inactive, holds_us: null, in_force_us: 2000000000}}
after:
  description: The same after the run, read back (predicted in check mode).
  returned: success
  type: dict
  sample: {governor: {policy0: performance}, energy_performance_preference: {}, cstates_disabled: {cpu0: ["state3 (C6, 170 us)"]},
           cpuidle_driver: intel_idle, thp_enabled: madvise, thp_defrag: madvise,
           pm_qos: {installed: false, enabled: false, active: inactive, holds_us: null, in_force_us: 2000000000}}
persisted:
  description: The settings the boot unit re-applies (empty without O(persist)).
  returned: success
  type: dict
  sample: {governor: performance, cstate_max_latency_us: 10}
originals:
  description: The recorded original value of every file changed so far (what O(state=absent) writes back).
  returned: success
  type: dict
  sample: {/sys/devices/system/cpu/cpufreq/policy0/scaling_governor: powersave}
diff:
  description: The sysfs values and the files before and after, in diff mode.
  returned: when diff mode is on
  type: list
  elements: dict
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.cpu.cpu_tuning import execute
from ansible_collections.gpufleet.inference.plugins.module_utils.cpu.knobs import CpuTuningError

ARGUMENT_SPEC = dict(
    state=dict(type="str", choices=["present", "absent"], default="present"),
    governor=dict(type="str"),
    energy_performance_preference=dict(type="str"),
    cstate_max_latency_us=dict(type="int"),
    cstate_method=dict(type="str", choices=["cpuidle", "pm_qos"], default="cpuidle"),
    thp_enabled=dict(type="str", choices=["always", "madvise", "never"]),
    thp_defrag=dict(type="str", choices=["always", "defer", "defer+madvise", "madvise", "never"]),
    restore=dict(type="list", elements="str",
                 choices=["governor", "energy_performance_preference", "cstate", "thp_enabled", "thp_defrag"]),
    persist=dict(type="bool", default=True),
    state_dir=dict(type="path", default="/var/lib/gpufleet"),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("cpu_tuning", ARGUMENT_SPEC, "reads and writes the CPU knobs in sysfs and its boot unit",
                          (CpuTuningError,)), execute)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health
short_description: Read each GPU's health through NVML and DCGM's quick diagnostic, as findings with their fixes
version_added: 0.3.0
description:
  - Reads, for every GPU NVML sees, the ECC mode and its volatile (since the driver loaded) and aggregate (lifetime)
    corrected and uncorrected error counts, retired pages (by cause, and whether a retirement is pending) or, on
    Ampere and later, remapped rows (pending, failed), the active clock throttle reasons, the current against the
    maximum graphics, SM and memory clocks, the power limit against its default, persistence mode, the temperature
    and the PCIe replay counter.
  - Runs C(dcgmi diag -r 1 -j) (DCGM's quick deployment checks, seconds) where C(dcgmi) is installed, under
    C(timeout); where it is not, the diagnostic is skipped and the C(note) of RV(dcgm) says so.
  - Turns both into findings with the audit's shape (code, severity, device, message, fix), the most severe first;
    C(docs/health.md) lists each code with its fix.
  - Every NVML call may be unsupported (a VM, an older GPU, retired pages on a GPU that remaps rows); such a field is
    null and named in the GPU's C(unsupported) list, never a failure.
  - Xid events since the last check come from the kernel log (C(playbooks/health.yml) reads them with the PCIe
    comparison), not from this module.
  - Never changes the host or a GPU.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes_readonly
options:
  include_nvml:
    description:
      - C(auto) reads NVML where nvidia-ml-py and the driver are there and reports why not otherwise; C(always) fails
        without them; C(never) skips it.
    type: str
    choices: [auto, always, never]
    default: auto
  dcgm_diag:
    description:
      - C(auto) runs C(dcgmi diag -r 1) where C(dcgmi) is installed and skips it with a note where not; C(always)
        fails without C(dcgmi); C(never) skips it.
    type: str
    choices: [auto, always, never]
    default: auto
  dcgm_timeout:
    description: Seconds the diagnostic may take before it is stopped (10 to 7200); a stopped run is a warning.
    type: int
    default: 300
  previous:
    description:
      - The previous check's result (or its RV(gpus)); the PCIe replay counter is a warning only when it grew since
        then.
    type: dict
  clock_ratio:
    description:
      - The SM clock's least share of its maximum (0.1 to 1.0) while a throttling reason other than idle, the
        application clock setting or the software power cap holds it; below it is C(clocks_below_max).
    type: float
    default: 0.9
  corrected_warn:
    description: Corrected ECC errors since the driver loaded above which C(ecc_corrected) is a warning, not info.
    type: int
    default: 1000
"""

EXAMPLES = r"""
- name: Read GPU health
  gpufleet.inference.gpu_health:
    previous: "{{ previous_record.gpu_health | default(omit) }}"
  register: gpu

- name: Stop on a critical GPU finding
  ansible.builtin.assert:
    that: gpu.summary.critical == 0
    fail_msg: "{{ gpu.findings | selectattr('severity', '==', 'critical') | map(attribute='message') | join('; ') }}"
"""

RETURN = r"""
available:
  description: Whether NVML was read.
  returned: always
  type: bool
  sample: true
error:
  description: Why NVML was not read (null when it was).
  returned: always
  type: str
  sample: null
gpus:
  description:
    - Each GPU's readings by PCI address, in NVML's units (clocks in MHz, power in milliwatts), with the fields NVML did
      not answer listed in C(unsupported).
  returned: always
  type: dict
  sample:
    "0000:18:00.0": {index: 0, name: NVIDIA H200, persistence_mode: 1, ecc_mode: {current: 1, pending: 1},
                     ecc: {volatile: {corrected: 0, uncorrected: 0}, aggregate: {corrected: 0, uncorrected: 0}},
                     retired_pages: null, retired_pages_pending: null,
                     remapped_rows: {correctable: 0, uncorrectable: 0, pending: false, failure: false},
                     throttle_reasons: [gpu_idle], clocks_mhz: {graphics: 345, sm: 345, memory: 3201},
                     max_clocks_mhz: {graphics: 1980, sm: 1980, memory: 3201}, power_limit_mw: 700000,
                     power_default_limit_mw: 700000, power_enforced_limit_mw: 700000, power_usage_mw: 76000,
                     temperature_c: 31, pcie_replay_counter: 0, unsupported: [retired_pages_single_bit]}
dcgm:
  description: The DCGM diagnostic - whether it ran, its exit status, each test's result, and a note when it did not run.
  returned: always
  type: dict
  sample: {ran: false, rc: null, results: [], note: "dcgmi is not installed: DCGM's diagnostic skipped"}
findings:
  description: The findings (code, severity, device, devices, message, fix, source), the most severe first.
  returned: always
  type: list
  elements: dict
  sample: [{code: persistence_off, severity: warning, device: "0000:18:00.0", devices: ["0000:18:00.0"],
            message: "GPU 0000:18:00.0 runs without persistence mode", fix: "Enable nvidia-persistenced", source: gpu_health}]
summary:
  description: How many findings of each severity.
  returned: always
  type: dict
  sample: {critical: 0, warning: 1, info: 0}
unstable:
  description: The findings that make a change unstable in the serving verdict (throughput_gate's candidate_gpu_health).
  returned: always
  type: list
  elements: dict
  sample: []
actions:
  description: Always empty - the module only reads.
  returned: always
  type: list
  elements: dict
  sample: []
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.gpu.gpu_health import execute

ARGUMENT_SPEC = dict(
    include_nvml=dict(type="str", choices=["auto", "always", "never"], default="auto"),
    dcgm_diag=dict(type="str", choices=["auto", "always", "never"], default="auto"),
    dcgm_timeout=dict(type="int", default=300),
    previous=dict(type="dict"),
    clock_ratio=dict(type="float", default=0.9),
    corrected_warn=dict(type="int", default=1000),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("gpu_health", ARGUMENT_SPEC, "reads NVML and runs dcgmi diag"), execute)


if __name__ == "__main__":
    main()

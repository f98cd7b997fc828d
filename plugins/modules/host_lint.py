#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_lint
short_description: Find copied GPU tuning on a host that does nothing or harms, with the file and line that set it
version_added: 0.2.0
description:
  - Reads the kernel command line (C(/proc/cmdline)), C(/etc/default/grub) and C(/etc/default/grub.d/*.cfg),
    C(/etc/nccl.conf) and the C(~/.nccl.conf) of root and of the service user, the C(Environment=) lines and
    C(EnvironmentFile=) files of the units in O(units) (and their drop-ins), C(/etc/modprobe.d/*.conf),
    C(/etc/sysctl.d/*.conf) and C(/etc/sysctl.conf), and the drivers bound to the GPUs (PCI class C(03xx)).
  - Reports what does nothing or harms, each finding with the file and line that set it, the fix, and the source
    that proves it (kernel documentation, NCCL or NVIDIA driver source); see C(docs/tuning_myths.md).
  - "Rules: C(pci=noacs) and C(pcie_acs_override=) (not mainline options), C(pcie_aspm=off) (leaves firmware's ASPM as
    it is), C(pcie_port_pm=off) (port runtime PM, not ASPM), C(swiotlb=) (2 KiB slabs, not KB), C(NCCL_P2P_LEVEL)
    that is no level name (NCCL ignores it silently), forced C(NCCL_PROTO) or C(NCCL_ALGO), C(NCCL_NTHREADS) out of
    range or below the defaults, C(USE_HUGEPAGES) (nothing reads it), C(vm.nr_hugepages) meant as 1 GiB pages,
    C(kernel.io_uring_disabled), C(nvidia) C(NVreg_*) options the driver does not define, a GPU bound to vfio-pci or
    named in C(vfio-pci.ids), nccl.conf lines NCCL reads differently from how they look, and a setting duplicated or in
    conflict between files."
  - Never changes the host.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes_readonly
options:
  units:
    description:
      - The systemd units whose environment is read (C(Environment=), C(EnvironmentFile=), drop-ins), by name
        (C(vllm) means C(vllm.service)); the first of C(/etc/systemd/system), C(/run/systemd/system),
        C(/usr/lib/systemd/system) and C(/lib/systemd/system) that holds the unit is used.
      - Their C(User=) is the service user whose C(~/.nccl.conf) NCCL reads, unless O(service_user) is set.
    type: list
    elements: str
    default: [vllm]
  service_user:
    description: The user the service runs as, for its C(~/.nccl.conf); by default the units' C(User=), else root.
    type: str
  passthrough_devices:
    description: PCI addresses of GPUs meant for vfio passthrough; they are not reported when bound to vfio-pci.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Lint the host's existing tuning
  gpufleet.inference.host_lint:
  become: true
  register: lint

- name: Show each finding with the file and line that set it
  ansible.builtin.debug:
    msg: "{{ item.severity }} {{ item.code }} {{ item.file }}:{{ item.line }}: {{ item.message }} Fix: {{ item.fix }}"
  loop: "{{ lint.findings }}"

- name: A host whose GPUs 0000:3b:00.0 is passed to a VM
  gpufleet.inference.host_lint:
    units: [vllm, vllm-embed]
    passthrough_devices: ["0000:3b:00.0"]
  become: true
"""

RETURN = r"""
actions:
  description: Always empty; the module changes nothing.
  returned: always
  type: list
  elements: dict
  sample: []
findings:
  description:
    - Most severe first. C(code) names the rule, C(severity) is C(critical), C(warning) or C(info), C(file) and C(line)
      say where the setting is (C(line) is null for a sysfs attribute), C(device) the GPU's PCI address where the rule
      is about one (else null), C(fix) what to do, C(source) what proves it.
  returned: success
  type: list
  elements: dict
  sample:
    - code: nccl_p2p_level_unknown
      severity: warning
      file: /etc/nccl.conf
      line: 3
      device: null
      message: "/etc/nccl.conf:3 sets NCCL_P2P_LEVEL=PCI: not a level name, so NCCL leaves the level unset and uses its
        default, without a warning."
      fix: Use one of LOC, NVL, NVB, C2C, PIX, PXB, P2C, PXN, PHB, SYS (the nccl_env role validates it), or remove the line.
      source: NVIDIA/nccl@5067397c src/graph/paths.cc ncclGetLevel() ...
findings_summary:
  description: The number of findings per severity.
  returned: success
  type: dict
  sample: {critical: 0, warning: 1, info: 0}
files:
  description: The files that were read (host paths).
  returned: success
  type: list
  elements: str
  sample: [/proc/cmdline, /etc/default/grub, /etc/nccl.conf, /etc/systemd/system/vllm.service]
service_user:
  description: The user whose C(~/.nccl.conf) was judged as the service's.
  returned: success
  type: str
  sample: vllm
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.lint.host_lint import execute

ARGUMENT_SPEC = dict(
    root=dict(type="path", default="/"),
    units=dict(type="list", elements="str", default=["vllm"]),
    service_user=dict(type="str"),
    passthrough_devices=dict(type="list", elements="str", default=[], no_log=False),
)


def main():
    run_module(ModuleSpec("host_lint", ARGUMENT_SPEC, "reads the kernel command line, the GRUB, NCCL, systemd, modprobe "
                          "and sysctl files and the GPUs' drivers"), execute)


if __name__ == "__main__":
    main()

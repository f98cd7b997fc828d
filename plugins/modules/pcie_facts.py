#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pcie_facts
short_description: Audit the PCIe path of every GPU, from config space, sysfs and NVML
version_added: 0.1.0
description:
  - Finds the GPUs (PCI class C(03xx)), or the functions named in O(devices), and walks each one's path up to its root port.
  - For every function on those paths it decodes the config space read from sysfs (not C(lspci) text) into link capability
    and status, MaxPayload supported and set, MaxReadReq, ASPM control, ACS capability and control, and AER status; and reads
    the driver, IOMMU group and its members, NUMA node and local CPUs, MSI/MSI-X IRQs with their affinity, and the
    kernel's AER counters.
  - For every pair of targets it gives the topology level as C(nvidia-smi topo -m) names it (PIX, PXB, PHB, NODE, SYS),
    derived from the sysfs path, and from NVML (with P2P status and NVLink) where the NVIDIA driver and nvidia-ml-py exist.
  - Judges the result into findings, each with a severity and the fix in words (link below capability, MaxPayload below
    what the path supports, ASPM on a GPU path, ACS redirect between GPUs, GPU pairs across sockets, shared IOMMU groups,
    IRQs on a remote NUMA node, no huge pages, missing C(iommu=pt) when vfio is wanted, AER errors).
  - Optionally measures host to device copy bandwidth with PyTorch or CuPy and reports it against the link's theoretical rate.
  - Never changes the host's devices or settings. Facts land in C(ansible_facts.gpufleet_pcie) and in RV(pcie).
  - With O(dest) it also keeps the audit as JSON on the host (C({host, kernel, pcie}), root-owned, mode C(0644), its
    directory created with C(0755)), written only when it differs, in the same module run.
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - Linux with sysfs. Run as root (C(become)) for the full config space; other users get 64 bytes and partial findings.
  - nvidia-ml-py on the target's Python for the NVML data (optional).
  - pyudev for vendor and model names from the udev hardware database (optional; C(pci.ids) is the fallback).
  - PyTorch or CuPy with CUDA for O(bandwidth_probe) (optional).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes.facts
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
attributes:
  facts:
    support: full
options:
  devices:
    description:
      - PCI addresses (C(0000:3b:00.0), or C(3b:00.0) for domain 0) of the functions to audit.
      - When set, O(vendor), O(device), O(class_prefix) and O(exclude_vendors) are not used.
    type: list
    elements: str
    default: []
  vendor:
    description: Audit only functions of this PCI vendor ID, for example C(10de) for NVIDIA.
    type: str
  device:
    description: Audit only functions with this PCI device ID, for example C(2335).
    type: str
  class_prefix:
    description:
      - Audit functions whose class code (six hex digits) starts with this. C(03) is every display controller; C(0302) is 3D
        controllers only. Set it to an empty string to match any class (with O(vendor) or O(device)).
    type: str
    default: '03'
  exclude_vendors:
    description:
      - Vendor IDs left out of class matching when O(vendor) is not set. The default drops the BMC display controllers that
        most servers carry (ASPEED C(1a03), Matrox C(102b)).
    type: list
    elements: str
    default: ['1a03', '102b']
  include_nvml:
    description:
      - Whether to read NVML. V(auto) reads it when nvidia-ml-py imports, an NVIDIA function is among the targets and O(root)
        is C(/), and notes why when it does not. V(always) fails when NVML cannot be read. V(never) skips it.
    type: str
    choices: [auto, always, never]
    default: auto
  vfio_wanted:
    description:
      - The GPUs are meant for vfio passthrough. Turns on the C(iommu=pt) and IOMMU checks, raises shared IOMMU groups and
        missing huge pages to warnings, and lowers ACS redirect to info (ACS is what isolates the groups).
    type: bool
    default: false
  tp_groups:
    description:
      - The tensor-parallel groups, one list item per group, each the PCI addresses of its GPUs, comma-separated
        (C(0000:17:00.0,0000:18:00.0)). A group whose GPUs sit on different sockets is flagged (C(tp_group_spans_sockets)),
        and a GPU of a group behind the chipset (C(gpu_behind_chipset)). Without groups every GPU is judged for the chipset.
    type: list
    elements: str
    default: []
  bandwidth_probe:
    description:
      - Measure host to device and device to host copy bandwidth, from pinned and from pageable memory, for every NVIDIA
        target, in a subprocess of O(probe_python) that uses PyTorch or else CuPy.
      - Allocates O(probe_size_mb) MiB on each GPU and twice that in host memory for a few seconds; changes no setting.
      - Fails soft. Without PyTorch/CuPy or CUDA the module warns and RV(pcie.bandwidth.error) says why.
    type: bool
    default: false
  probe_python:
    description: Python interpreter for the bandwidth probe. Defaults to the interpreter running the module.
    type: path
  probe_size_mb:
    description: Size of each copy in the bandwidth probe, in MiB.
    type: int
    default: 256
  host_lint:
    description:
      - Also lint the tuning the host already carries, in the same module run, as M(gpufleet.inference.host_lint) does
        (kernel command line, GRUB, C(nccl.conf), the units' environment, C(modprobe.d), C(sysctl.d), the GPUs'
        drivers); its findings join RV(pcie.findings) with their C(file), C(line) and C(source).
      - With O(vfio_wanted), GPUs bound to vfio-pci are not reported.
    type: bool
    default: false
  host_lint_units:
    description: The systemd units whose environment the host lint reads (the C(units) option of M(gpufleet.inference.host_lint)).
    type: list
    elements: str
    default: [vllm]
  dest:
    description:
      - Keep the audit on the host in this file (under O(root)), as JSON with the keys C(host) (O(dest_host)), C(kernel)
        (O(dest_kernel)) and C(pcie) (RV(pcie)), indented by 4 with sorted keys and a final newline. Its directory is
        created. Not set, nothing is written.
    type: path
  dest_host:
    description: The C(host) field of the JSON in O(dest); the audit role passes C(inventory_hostname).
    type: str
    default: ''
  dest_kernel:
    description: The C(kernel) field of the JSON in O(dest); the audit role passes C(ansible_facts.kernel).
    type: str
    default: ''
notes:
  - Config space is read from C(/sys/bus/pci/devices/*/config); the module never runs C(lspci) or C(setpci).
  - NVIDIA GPUs lower their link speed when idle, so a speed (not width) below capability on an idle GPU is a warning to
    re-check under load, not proof of a fault. With O(bandwidth_probe) the link is read during the probe's copies and
    the finding judged again (C(link_idle_downclock), C(link_flapping)); the probe does not run while a process holds
    the GPUs.
  - Without NVML the topology level comes from the sysfs path. Functions below one switch are PIX, below nested switches
    PXB, on one host bridge PHB, on different host bridges NODE, or SYS when their NUMA nodes differ.
seealso:
  - name: nvidia-smi topo
    description: The topology levels this module reproduces.
    link: https://docs.nvidia.com/deploy/nvidia-smi/index.html
"""

EXAMPLES = r"""
- name: Audit every GPU's PCIe path
  gpufleet.inference.pcie_facts:
  become: true

- name: Show what needs attention
  ansible.builtin.debug:
    msg: "{{ item.severity }} {{ item.code }} on {{ item.device }}: {{ item.message }} Fix: {{ item.fix }}"
  loop: "{{ ansible_facts.gpufleet_pcie.findings }}"
  when: item.severity != 'info'

- name: Fail a host whose GPUs run on a degraded link
  ansible.builtin.assert:
    that: ansible_facts.gpufleet_pcie.findings | selectattr('code', 'eq', 'link_below_capability')
          | selectattr('severity', 'eq', 'critical') | list | length == 0
    fail_msg: "PCIe link width below capability on {{ inventory_hostname }}"

- name: Audit NVIDIA GPUs meant for vfio passthrough, NVML required
  gpufleet.inference.pcie_facts:
    vendor: '10de'
    vfio_wanted: true
    include_nvml: always
  become: true

- name: Audit a NIC next to the GPUs (GPUDirect RDMA placement)
  gpufleet.inference.pcie_facts:
    devices: ['0000:3b:00.0', '0000:3c:00.0']
  become: true

- name: Measure host<->device copy bandwidth with the venv that holds PyTorch
  gpufleet.inference.pcie_facts:
    bandwidth_probe: true
    probe_python: /opt/vllm/.venv/bin/python
  become: true
  register: pcie

- name: Audit, and keep the audit on the host as JSON
  gpufleet.inference.pcie_facts:
    dest: /var/lib/gpufleet/audit/pcie.json
    dest_host: "{{ inventory_hostname }}"
    dest_kernel: "{{ ansible_facts.kernel }}"
  become: true

- name: Audit a captured tree instead of the live host
  gpufleet.inference.pcie_facts:
    root: /tmp/capture/gpu-host
  delegate_to: localhost
"""

RETURN = r"""
actions:
  description: What was done, or would be done in check mode, to keep the audit in O(dest); empty without O(dest).
  returned: always
  type: list
  elements: dict
  sample: [{action: create_directory, path: /var/lib/gpufleet/audit, after: "0755"},
           {action: create, path: /var/lib/gpufleet/audit/pcie.json, after: "0644"}]
diff:
  description: The JSON in O(dest) before and after (and its directory's state when it is created), in diff mode.
  returned: when diff mode is on and O(dest) changes
  type: list
  elements: dict
  sample: [{before: "", after: "{\n    \"host\": \"gpu1\",\n    ...}\n", before_header: /var/lib/gpufleet/audit/pcie.json,
           after_header: /var/lib/gpufleet/audit/pcie.json}]
findings_summary:
  description: Number of findings per severity, and in total.
  returned: success
  type: dict
  sample: {critical: 0, warning: 2, info: 1, total: 3}
pcie:
  description: The audit, the same as C(ansible_facts.gpufleet_pcie).
  returned: success
  type: dict
  contains:
    root:
      description: The O(root) the host was read under.
      type: str
      sample: /
    devices:
      description:
        - Every function on the targets' paths, keyed by PCI address.
        - C(config) holds the decoded config space, with C(pcie) (C(port_type), C(mps_supported), C(mps), C(mrrs) in bytes,
          C(link_cap), C(link_sta) with C(speed_gts), C(gen), C(width), C(link_ctl.aspm), C(link_speeds_supported)),
          C(acs) (C(cap) and C(ctrl) bits SV, TB, RR, CR, UF, EC, DT, and C(p2p_redirect)), C(aer) (status registers and
          the names of the bits set), C(msi), C(msix) (C(table_size)), the capability lists, C(capabilities_complete) and
          C(extended_readable).
      type: dict
      sample:
        "0000:00:06.0":
          bdf: "0000:00:06.0"
          role: target
          sysfs_path: /sys/devices/pci0000:00/0000:00:06.0
          host_bridge: pci0000:00
          parent: null
          class: "0x030200"
          class_name: 3D controller
          vendor_id: "0x10de"
          device_id: "0x2335"
          vendor_name: NVIDIA Corporation
          device_name: GH100 [H200 SXM 141GB]
          driver: nvidia
          numa_node: -1
          local_cpulist: 0-15
          iommu_group: null
          iommu_group_type: null
          iommu_group_members: []
          irqs: [{irq: 42, mode: msix, smp_affinity_list: 0-15, effective_affinity_list: "14"}]
          link_sysfs: {current_speed_gts: 32.0, current_width: 16, max_speed_gts: 32.0, max_width: 16}
          aer_counters: null
          config_error: null
          config:
            size: 4096
            class: "0x030200"
            is_bridge: false
            pcie:
              port_type: endpoint
              mps_supported: 256
              mps: 256
              mrrs: 4096
              link_cap: {speed_gts: 32.0, gen: 5, width: 16, aspm_support: L1, port_number: 0}
              link_sta: {speed_gts: 32.0, gen: 5, width: 16, training: false, dll_active: false}
              link_ctl: {aspm: disabled, common_clock: false, link_disabled: false}
              link_speeds_supported: [2.5, 5.0, 8.0, 16.0, 32.0]
            msix: {offset: 176, table_size: 9, enabled: true, function_masked: false}
            acs: null
            aer: {offset: 440, uncorrectable_status: 0, correctable_status: 0, uncorrectable: [], correctable: []}
            extended_readable: true
    gpus:
      description: The audited functions, each with its path of PCI addresses from the top of the tree down to it.
      type: list
      elements: dict
      contains:
        bdf:
          description: PCI address.
          type: str
        host_bridge:
          description: The sysfs host bridge directory (C(pci0000:00)) the path starts from.
          type: str
        path:
          description: PCI addresses from the root port (or the first function under the host bridge) down to the target.
          type: list
          elements: str
        root_port:
          description: First function of the path when the target is not directly on a root bus.
          type: str
        numa_node:
          description: NUMA node from sysfs, C(-1) when the firmware does not say.
          type: int
        name:
          description: Model name from the udev database or C(pci.ids), when known.
          type: str
      sample: [{bdf: "0000:03:00.0", host_bridge: pci0000:00, path: ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"],
                root_port: "0000:00:01.0", numa_node: 0, name: null}]
    pairs:
      description: Every pair of targets.
      type: list
      elements: dict
      contains:
        a:
          description: First PCI address.
          type: str
        b:
          description: Second PCI address.
          type: str
        level:
          description: Topology level as C(nvidia-smi topo -m) names it (C(NV<n>), PIX, PXB, PHB, NODE, SYS).
          type: str
        level_source:
          description: C(nvml) when NVML gave the level, else C(sysfs).
          type: str
        sysfs_level:
          description: The level derived from the sysfs path.
          type: str
        nvml_level:
          description: The level NVML reports, or null.
          type: str
        common_ancestor:
          description: Deepest function both paths share (a switch upstream port), or null.
          type: str
        bridges_between:
          description: Bridges between the two below the common ancestor.
          type: list
          elements: str
        acs_redirect:
          description: Bridges between the two with ACS P2P Request or Completion Redirect on.
          type: list
          elements: str
        numa_nodes:
          description: NUMA nodes of a and b.
          type: list
          elements: int
        p2p:
          description: NVML P2P status per capability (read, write, nvlink, atomics, pci), C(OK) or the reason; null without NVML.
          type: dict
        nvlinks:
          description:
            - NVLinks between the two GPUs (0 without NVLink or NVML); through an NVSwitch fabric the smaller of the two
              GPUs' fabric link counts, as C(nvidia-smi topo -m) counts them.
          type: int
        nvlink_via:
          description: C(direct), C(nvswitch), or null when the pair has no NVLink.
          type: str
      sample: [{a: "0000:03:00.0", b: "0000:04:00.0", level: PIX, level_source: sysfs, sysfs_level: PIX, nvml_level: null,
                common_ancestor: "0000:01:00.0", bridges_between: ["0000:02:00.0", "0000:02:01.0"],
                acs_redirect: ["0000:02:00.0", "0000:02:01.0"], numa_nodes: [0, 0], p2p: null}]
    findings:
      description: What needs attention, most severe first.
      type: list
      elements: dict
      contains:
        code:
          description: >-
            One of link_below_capability, link_capped, mps_below_path, mps_above_path, aspm_enabled, acs_redirect,
            pair_sys_level, iommu_group_shared, iommu_group_functions, irq_remote_numa, numa_node_unknown, no_hugepages,
            iommu_disabled, iommu_pt_missing, aer_errors, pcie_replays, config_unreadable, config_short, p2p_not_supported,
            tp_group_spans_sockets, gpu_behind_chipset; with O(bandwidth_probe), link_idle_downclock and
            link_flapping (a GPU link below capability at rest, read again under the probe's load); with O(host_lint),
            also the codes of M(gpufleet.inference.host_lint).
          type: str
        severity:
          description: C(critical), C(warning) or C(info).
          type: str
        device:
          description: The function the finding is about; null for host-wide findings.
          type: str
        devices:
          description: Every function involved.
          type: list
          elements: str
        message:
          description: What was found, where.
          type: str
        fix:
          description: What to do about it, in words.
          type: str
        file:
          description: The host lint's findings only (O(host_lint)); the file that holds the setting.
          type: str
        line:
          description: The host lint's findings only; the line of RV(pcie.findings[].file), null for a sysfs attribute.
          type: int
        source:
          description: The host lint's findings only; what proves the finding (documentation or source file).
          type: str
      sample: [{code: acs_redirect, severity: warning, device: "0000:03:00.0", devices: ["0000:03:00.0", "0000:04:00.0"],
                message: "0000:03:00.0 and 0000:04:00.0 share a PCIe switch (PIX), but ACS P2P redirect ...",
                fix: "If the GPUs stay on this host, clear RR/CR/EC on exactly 0000:02:00.0, 0000:02:01.0 with gpufleet.inference.pcie_acs ..."}]
    findings_summary:
      description: Number of findings per severity, and in total.
      type: dict
    host_lint:
      description: The files the host lint read and the service user it judged; only with O(host_lint).
      type: dict
      sample: {files: [/proc/cmdline, /etc/default/grub, /etc/nccl.conf], service_user: vllm}
    hugepages:
      description: Huge page reservations from C(/proc/meminfo) and C(/sys/kernel/mm/hugepages).
      type: dict
      sample: {total: 0, free: 0, size_kb: 2048, hugetlb_kb: 0, reserved_pages: 0,
               sizes: {2048kB: {nr_hugepages: 0, free_hugepages: 0}, 1048576kB: {nr_hugepages: 0, free_hugepages: 0}}}
    cmdline:
      description: The kernel command line.
      type: str
    iommu:
      description: IOMMU state; C(passthrough) is true with C(iommu=pt) on the command line or identity-mapped target groups.
      type: dict
      sample: {groups: 11, enabled: true, passthrough: false, passthrough_cmdline: false}
    numa_nodes:
      description: NUMA nodes with their CPU lists.
      type: dict
      sample: {"0": {cpulist: 0-1, cpus: 2}}
    aspm_policy:
      description: The kernel's ASPM policy (C(default), C(performance), C(powersave), C(powersupersave)), null if unknown.
      type: str
    names_source:
      description: Where vendor and model names came from (C(udev), C(pci.ids)), or null.
      type: str
    nvml:
      description:
        - NVML's view; C(available) false with C(error) saying why when it was not read.
        - C(gpus) is keyed by PCI address with C(link_gen_current), C(link_gen_max) (this system), C(link_gen_gpu_max),
          C(link_width_current), C(link_width_max), C(pcie_replay_counter), C(numa_node), C(name), C(uuid),
          C(nvlink_peers) (links to another GPU of this host, by its address), C(nvswitch_links) (links into an NVSwitch
          fabric), C(nvlink_remote_types);
          C(unsupported) lists the calls the driver refused.
      type: dict
      sample: {available: true, error: null, driver_version: 580.159.04, unsupported: [],
               gpus: {"0000:00:06.0": {index: 0, name: NVIDIA H200, link_gen_current: 5, link_gen_max: 5, link_gen_gpu_max: 5,
                                       link_width_current: 16, link_width_max: 16, pcie_replay_counter: 0, numa_node: null,
                                       unsupported: [numa_node], nvlink_peers: {}, nvswitch_links: 18,
                                       nvlink_remote_types: {"ffffffff:ff:ff.0": unknown}}}, pairs: []}
    bandwidth:
      description:
        - Copy bandwidth per GPU in GB/s (10^9 bytes per second), and as a percentage of what the path's link
          capabilities allow (C(theoretical_gbps)); null unless O(bandwidth_probe).
      type: dict
      contains:
        backend:
          description: C(torch <version>) or C(cupy <version>), null when neither could run.
          type: str
        python:
          description: The interpreter the probe ran in.
          type: str
        size_mb:
          description: Size of each copy in MiB.
          type: int
        error:
          description: Why the probe gave no figures (no PyTorch/CuPy, no CUDA, no NVIDIA target), or null.
          type: str
        gpus:
          description:
            - Per PCI address, C(h2d_pinned_gbps), C(d2h_pinned_gbps), C(h2d_pageable_gbps), C(d2h_pageable_gbps) (median of
              5 copies after a warm-up), C(theoretical_gbps) and the matching C(*_pct).
            - C(link_samples), the GPU's link as C([speed GT/s, width]) read after each pinned copy.
          type: dict
      sample: {backend: torch 2.11.0, python: /usr/bin/python3, size_mb: 256, error: null,
               gpus: {"0000:00:06.0": {h2d_pinned_gbps: 55.22, d2h_pinned_gbps: 55.05, h2d_pageable_gbps: 8.37,
                                       d2h_pageable_gbps: 13.56, theoretical_gbps: 63.02, h2d_pinned_pct: 87.6,
                                       d2h_pinned_pct: 87.4, h2d_pageable_pct: 13.3, d2h_pageable_pct: 21.5}}}
ansible_facts:
  description: The audit as a fact.
  returned: success
  type: complex
  contains:
    gpufleet_pcie:
      description: Same as RV(pcie).
      type: dict
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.nvml import (  # noqa: F401 pylint: disable=unused-import
    HAS_PYNVML, PYNVML_IMPORT_ERROR, NvmlUnavailable,
)
# The audit lives in module_utils/pcie/pcie_facts.py; its names stay importable from here (tests, callers).
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.pcie_facts import (  # noqa: F401 pylint: disable=unused-import
    KNOWN_ERRORS, NVIDIA, PROBE_SCRIPT, bandwidth, execute, gather, keep_report, path_bandwidth, process_privileges,
    render_report,
)
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import (  # noqa: F401 pylint: disable=unused-import
    BMC_VENDORS, TopologyError,
)

ARGUMENT_SPEC = dict(
    root=dict(type="path", default="/"),
    devices=dict(type="list", elements="str", default=[]),
    vendor=dict(type="str"),
    device=dict(type="str"),
    class_prefix=dict(type="str", default="03"),
    exclude_vendors=dict(type="list", elements="str", default=list(BMC_VENDORS)),
    include_nvml=dict(type="str", choices=["auto", "always", "never"], default="auto"),
    vfio_wanted=dict(type="bool", default=False),
    bandwidth_probe=dict(type="bool", default=False),
    probe_python=dict(type="path"),
    probe_size_mb=dict(type="int", default=256),
    tp_groups=dict(type="list", elements="str", default=[]),
    host_lint=dict(type="bool", default=False),
    host_lint_units=dict(type="list", elements="str", default=["vllm"]),
    dest=dict(type="path"),
    dest_host=dict(type="str", default=""),
    dest_kernel=dict(type="str", default=""),
)


def main():
    run_module(ModuleSpec("PCIe audit", ARGUMENT_SPEC, "reads sysfs and procfs, and writes the report to dest when given", KNOWN_ERRORS),
               execute)


if __name__ == "__main__":
    main()

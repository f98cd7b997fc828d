#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: metrics_textfile
short_description: Write an audit, health check, benchmark, verdict or tuning state as Prometheus metrics for node_exporter
version_added: 0.3.0
description:
  - Turns one result of the collection into Prometheus metrics and writes them, in the text exposition format, to
    C(DIRECTORY/NAME.prom) on the host, where node_exporter's textfile collector serves them with the host's own metrics.
  - Give exactly one of O(audit) (M(gpufleet.inference.pcie_facts)' RV(gpufleet.inference.pcie_facts#module:pcie)),
    O(health) (the health check's findings), O(benchmark) (an M(gpufleet.inference.inference_benchmark) result),
    O(verdict) (an M(gpufleet.inference.throughput_gate) result), O(tuning) (M(gpufleet.inference.tune_measured)'s
    RV(gpufleet.inference.tune_measured#module:state)) or O(changes) (the tuning roles' changes of a run).
  - The names, types and labels are fixed (every series has C(host) first; then, as the metric has them, C(gpu) and
    C(link) PCI addresses, C(stage), the C(change) a verdict judged and the C(kind) of a tuning change, C(profile),
    C(concurrency), C(code) and C(severity)); docs/fleet_operations.md lists them all, and the collection's Grafana
    dashboard (C(extras/grafana/gpufleet-fleet.json)) shows them.
  - The file is replaced atomically (a temp file in the same directory, fsync, rename) and only when its text changes; a
    value the result does not hold is left out, never written as 0.
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes
options:
  audit:
    description: The PCIe audit, M(gpufleet.inference.pcie_facts)' RV(gpufleet.inference.pcie_facts#module:pcie) (or its whole result).
    type: dict
  health:
    description: The health check's findings (the C(gpufleet.inference.health_compare) filter's list, as in C(playbooks/health.yml)).
    type: list
    elements: dict
  benchmark:
    description: A benchmark result document of M(gpufleet.inference.inference_benchmark) (or its whole result).
    type: dict
  verdict:
    description: The result of M(gpufleet.inference.throughput_gate) (its serving verdict, ratio, p-value and runs needed).
    type: dict
  tuning:
    description: The state of M(gpufleet.inference.tune_measured) (RV(gpufleet.inference.tune_measured#module:state), or its whole result).
    type: dict
  changes:
    description: The tuning roles' changes of a run (C([{role, what, actions}]), the audit report's C(tuning_changes) filter).
    type: list
    elements: dict
  host:
    description: The C(host) label of every series; default the machine's node name. Give C(inventory_hostname).
    type: str
  stage:
    description: The C(stage) label of a O(verdict) (the tuning stage, C(kernel_upgrade), C(site)).
    type: str
    default: default
  change:
    description:
      - The C(change) label of a O(verdict), what the candidate changed (M(gpufleet.inference.throughput_gate)'s
        O(gpufleet.inference.throughput_gate#module:change)).
    type: str
    choices: [none, kernel, host, driver, nccl, vllm_flags, vllm_version]
    default: none
  profile:
    description: The C(profile) label of a O(benchmark); default the result's C(label), else C(default).
    type: str
  timestamp:
    description: When the O(audit) or O(health) check ran, in seconds since the epoch (C(ansible_facts.date_time.epoch)); left out when not given.
    type: float
  directory:
    description:
      - node_exporter's textfile directory (C(--collector.textfile.directory)). Debian's prometheus-node-exporter reads
        C(/var/lib/prometheus/node-exporter). Created when missing.
    type: path
    default: /var/lib/prometheus/node-exporter
  name:
    description:
      - The file's name without C(.prom); default C(gpufleet_SOURCE) (C(gpufleet_audit), C(gpufleet_verdict), ...).
      - Give one name per series set that must not replace another (for example C(gpufleet_verdict_kernel_upgrade)).
    type: str
notes:
  - The module runs on the host whose node_exporter serves the file. Every O(root)-relative path stays under O(root).
seealso:
  - name: node_exporter textfile collector
    description: How node_exporter reads C(*.prom) files.
    link: https://github.com/prometheus/node_exporter#textfile-collector
  - module: gpufleet.inference.pcie_facts
  - module: gpufleet.inference.throughput_gate
"""

EXAMPLES = r"""
- name: Audit the PCIe path
  gpufleet.inference.pcie_facts:
  register: audit

- name: Publish the audit for Prometheus
  gpufleet.inference.metrics_textfile:
    audit: "{{ audit.pcie }}"
    host: "{{ inventory_hostname }}"
    timestamp: "{{ ansible_facts.date_time.epoch }}"

- name: Publish the kernel upgrade's verdict in a file of its own
  gpufleet.inference.metrics_textfile:
    verdict: "{{ gate }}"
    stage: kernel_upgrade
    change: kernel
    name: gpufleet_verdict_kernel_upgrade
    host: "{{ inventory_hostname }}"
"""

RETURN = r"""
actions:
  description: The file written (or that would be, in check mode), C(action=write) with its C(path), the C(source) and the number of C(series).
  returned: always
  type: list
  elements: dict
  sample: [{action: write, path: /var/lib/prometheus/node-exporter/gpufleet_audit.prom, source: audit, series: 42}]
path:
  description: The metrics file.
  returned: success
  type: str
  sample: /var/lib/prometheus/node-exporter/gpufleet_audit.prom
source:
  description: Which result was given (V(audit), V(health), V(benchmark), V(verdict), V(tuning) or V(changes)).
  returned: success
  type: str
  sample: audit
series:
  description: The number of series in the file.
  returned: success
  type: int
  sample: 42
metrics:
  description: The metric names in the file.
  returned: success
  type: list
  elements: str
  sample: [gpufleet_audit_findings, gpufleet_pcie_link_current_speed_transfers_per_second]
diff:
  description: The file before and after.
  returned: success
  type: dict
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.workload import CHANGES
from ansible_collections.gpufleet.inference.plugins.module_utils.metrics.metrics_textfile import (
    DEFAULT_DIR, MetricsError, execute)
from ansible_collections.gpufleet.inference.plugins.module_utils.metrics.textfile import SOURCES

ARGUMENT_SPEC = dict(
    audit=dict(type="dict"),
    health=dict(type="list", elements="dict"),
    benchmark=dict(type="dict"),
    verdict=dict(type="dict"),
    tuning=dict(type="dict"),
    changes=dict(type="list", elements="dict"),
    host=dict(type="str"),
    stage=dict(type="str", default="default"),
    change=dict(type="str", choices=list(CHANGES), default="none"),
    profile=dict(type="str"),
    timestamp=dict(type="float"),
    directory=dict(type="path", default=DEFAULT_DIR),
    name=dict(type="str"),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("metrics_textfile", ARGUMENT_SPEC, "writes the metrics file in directory", (MetricsError,),
                          checks={"required_one_of": [SOURCES], "mutually_exclusive": [SOURCES]}), execute)


if __name__ == "__main__":
    main()

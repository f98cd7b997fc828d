#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_history
short_description: Keep every benchmark result in one throughput history (SQLite or PostgreSQL) and report on it
version_added: 0.2.0
description:
  - Stores benchmark result documents of M(gpufleet.inference.inference_benchmark) in an SQLite file (O(path)) or a
    PostgreSQL database (O(url)), with the host, time,
    kernel, GPU driver, vLLM version, model, tuning state, benchmark profile, the tuning stage and the full result JSON.
    Meant to run on the controller (C(delegate_to=localhost)); the site benchmark, measured tuning, the kernel upgrade,
    the health check and on-demand runs all feed the same file.
  - The schema is versioned; an older file or database is migrated in place, with the same schema and migrations on
    both back ends. The same document stored twice is kept once, also when several controllers store it at once.
  - SQLite is the embedded default. A fleet run from AWX or Ansible Automation Platform (a fresh execution environment
    container per job, whose files are gone after it) or from several controllers keeps its history in PostgreSQL
    instead; the reports read either and come out the same for the same history.
  - O(state=report) renders per-host curves over time, annotated with what changed between runs (kernel, driver, vLLM,
    tuning), and flags drops between consecutive runs of the same configuration (the throughput gate against the previous
    run) and downward level shifts (E-divisive means with a permutation test), as Markdown and a self-contained HTML page
    with inline SVG charts.
  - With each run it stores the PCIe link findings of its measured runs (M(gpufleet.inference.inference_benchmark)'s
    O(gpufleet.inference.inference_benchmark#module:monitor_links)), that is a link of a GPU or of a bridge above it that
    changed speed or width during a run (C(link_flapping), critical) or stayed below what both ends can do under load
    (C(link_below_capability)), with that run's output tokens/s. The report shows them next to the run's tok/s, and
    says C(not sampled) for runs whose links were not sampled.
  - O(state=query) returns the series without writing anything.
  - Each stored run keeps the server start it measured (M(gpufleet.inference.inference_benchmark)'s C(server.start)).
    O(state=start_noise) groups the per-run tok/s of each series by server start and estimates the throughput gate's
    C(between_start_sd) from the host's own history (RV(start_noise)); the report shows the figure under each series
    where two or more starts give one.
author:
  - gpufleet.inference contributors (@gpufleet)
requirements:
  - Python 3.8 or later with the standard library's sqlite3.
  - For O(url), the Python library pg8000 (pure Python) on the controller or in the execution environment, and a
    PostgreSQL 12 or later database the user may create tables in.
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: In check mode nothing is stored or written; RV(actions) lists what would be.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
options:
  path:
    description:
      - The SQLite history file (created with its directory when missing, for O(state=append)).
      - One of O(path) and O(url) is required.
    type: path
  url:
    description:
      - The PostgreSQL history instead of a file, C(postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE), optionally with
        C(?sslmode=disable|prefer|require|verify-ca|verify-full) (libpq's meanings, default V(prefer)),
        C(sslrootcert=FILE) and C(connect_timeout=SECONDS) (default 10).
      - The tables are created (and migrated) in the database's default schema on first use.
      - Kept out of Ansible's output and logs (C(no_log)); actions and messages name the database, host, port and user
        only.
    type: str
  password:
    description:
      - The PostgreSQL user's password, when the O(url) does not hold it (for example from Ansible Vault or an AWX
        credential); it wins over one in the URL.
    type: str
  state:
    description:
      - V(append) stores results, V(report) writes the report, V(query) returns the series.
      - V(start_noise) (version 0.3.0) returns the between-start noise of each series of O(hosts), O(config_key) and
        O(concurrency) (RV(start_noise)); it reads only, in check mode too.
    type: str
    choices: [append, report, query, start_noise]
    default: append
  results:
    description: Result files (JSON written by M(gpufleet.inference.inference_benchmark)) to store, on the machine the module runs on.
    type: list
    elements: path
    default: []
  skip_invalid:
    description:
      - Skip, with a warning, result files that are not benchmark results (other JSON in a results directory) instead
        of failing.
    type: bool
    default: false
  documents:
    description: Result documents to store as they are (the module's RV(gpufleet.inference.inference_benchmark#module:benchmark) return).
    type: list
    elements: dict
    default: []
  host:
    description: Host the results belong to; default the document's own C(host) (the target's host name).
    type: str
  source:
    description: What ran the benchmark.
    type: str
    choices: [site, tune_measured, kernel_upgrade, vllm_upgrade, driver_upgrade, nccl_change, health, on_demand]
    default: on_demand
  gpu_driver:
    description: GPU driver version during the benchmark (for example C(/sys/module/nvidia/version)).
    type: str
  vllm_version:
    description: vLLM version of the server (its C(GET /version)).
    type: str
  profile:
    description:
      - Benchmark profile name (V(serving), V(latency), V(long_context) or your own); part of the configuration.
      - Apart from it, a result of another request profile or an open loop (the C(profile) and C(arrivals) of its
        C(config), see M(gpufleet.inference.inference_benchmark)) is a series of its own; unique random prompts in a
        closed loop continue the series of results stored before profiles.
    type: str
    default: ""
  stage:
    description: The measured-tuning stage the run measured (empty for other runs).
    type: str
    default: ""
  verdicts:
    description:
      - For O(state=append), serving verdicts to store (a kernel upgrade's, a tuning stage's) - each with C(verdict)
        (V(pass), V(unstable), V(diverged), V(regression) or V(inconclusive)), C(reason), C(parts) (throughput, latency,
        outputs, stability - each with what it C(says) and its figures and reason), C(stage) (the change) and
        C(decided_at). Stored with O(host) (required with them) and O(source); the same verdict twice is stored once.
    type: list
    elements: dict
    default: []
    version_added: 0.3.0
  hosts:
    description: For O(state=report), O(state=query) and O(state=start_noise), only these hosts (empty for all).
    type: list
    elements: str
    default: []
  config_key:
    description:
      - For O(state=start_noise), only the series of this configuration (the C(config_key) of RV(series) and of
        RV(start_noise), a hash of the model, prompt and output tokens, requests per run, prompt mode, ignore_eos,
        profile and request profile); every configuration when not given.
    type: str
    version_added: 0.3.0
  concurrency:
    description: For O(state=start_noise), only the series of this concurrency level; every level when not given.
    type: int
    version_added: 0.3.0
  dest:
    description: Directory for C(history.md) and C(history.html), for O(state=report).
    type: path
  title:
    description: Title of the report.
    type: str
    default: GPU fleet throughput history
  threshold:
    description: Median ratio below which a significant drop between consecutive runs is flagged.
    type: float
    default: 0.95
  alpha:
    description: Significance level of the consecutive-drop test (one-sided Mann-Whitney U).
    type: float
    default: 0.01
  min_runs:
    description: Per-run samples each of two consecutive runs needs before the drop test judges them.
    type: int
    default: 5
  cp_alpha:
    description: Significance level of the E-divisive change-point permutation test.
    type: float
    default: 0.05
notes:
  - A configuration is what was measured (model, prompt and output tokens, requests per run, prompt mode, ignore_eos,
    profile); a series is one host, configuration and concurrency level. docs/measured_tuning.md explains the rules.
seealso:
  - module: gpufleet.inference.inference_benchmark
  - module: gpufleet.inference.throughput_gate
"""

EXAMPLES = r"""
- name: Store the fetched site benchmark in the history
  gpufleet.inference.bench_history:
    path: "{{ playbook_dir }}/../reports/history.sqlite"
    results: ["{{ fetched.dest }}"]
    host: "{{ inventory_hostname }}"
    source: site
    vllm_version: "{{ vllm_version.json.version | default(omit) }}"
  delegate_to: localhost
  become: false

- name: Store it in the fleet's PostgreSQL history instead (AWX/AAP, several controllers)
  gpufleet.inference.bench_history:
    url: "postgresql://gpufleet@db.example.com/gpufleet?sslmode=verify-full"
    password: "{{ vault_gpufleet_history_password }}"
    results: ["{{ fetched.dest }}"]
    host: "{{ inventory_hostname }}"
    source: site
  delegate_to: localhost
  become: false

- name: Estimate the gate's between-start noise of gpu-01's serving configuration at c=64 from its history
  gpufleet.inference.bench_history:
    path: reports/history.sqlite
    state: start_noise
    hosts: [gpu-01]
    config_key: 3f2a9c0d1e4b5a6f
    concurrency: 64
  delegate_to: localhost
  run_once: true
  register: noise

- name: Set it on the kernel upgrade's gate where the history gives it (three or more starts)
  ansible.builtin.set_fact:
    kernel_upgrade_gate_between_start_sd: "{{ noise.start_noise[0].between_start_sd }}"
  when: noise.start_noise[0].between_start_sd is not none

- name: Render the per-host curves and the flagged drops
  gpufleet.inference.bench_history:
    path: reports/history.sqlite
    state: report
    dest: reports/history
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
actions:
  description:
    - What was or would be stored or written. A document stored is C(action=store) with the C(path) of the history, the
      C(host), C(source) and C(finished_at) of the run and (not in check mode) its C(run_id); a serving verdict stored
      is C(action=store_verdict) with the C(path), C(host), C(source), C(stage), C(verdict) and (not in check mode) its
      C(verdict_id); a report file is C(action=write) with its C(path).
  returned: always
  type: list
  elements: dict
  sample: [{action: store, path: reports/history.sqlite, host: gpu-01, source: site, finished_at: "2026-12-01T20:00:00Z",
            run_id: 12},
           {action: write, path: /srv/fleet/reports/history/history.html}]
added:
  description: Run ids stored now (documents already in the history are not stored again).
  returned: state=append
  type: list
  elements: int
  sample: [12]
run_ids:
  description: Run id of every given result, new or already stored, in the order given.
  returned: state=append
  type: list
  elements: int
verdicts_added:
  description: Ids of the serving verdicts stored now (one already in the history is not stored again).
  returned: state=append
  type: list
  elements: int
  version_added: 0.3.0
verdicts:
  description: The stored serving verdicts of the hosts asked for, oldest first, each whole with its C(host) and C(source).
  returned: state=query
  type: list
  elements: dict
  version_added: 0.3.0
schema_version:
  description: Schema version of the file after the call.
  returned: always
  type: int
  sample: 5
drops:
  description:
    - Flagged drops (consecutive-run regressions and downward change points), with host, series, time, ratio, p-value,
      what changed, and the PCIe link findings of the run at that time (C(links), as in RV(link_findings)).
  returned: state=report or state=query
  type: list
  elements: dict
link_findings:
  description:
    - The PCIe link findings of the stored runs, one per measured run and device, with the C(host), C(series),
      C(finished_at), the level's C(median), the C(concurrency), C(repetition), C(device), C(code), C(severity), the
      highest reading (C(top_speed_gts), C(top_width)), the number of C(changes) seen and the run's C(output_tps).
  returned: state=report or state=query
  type: list
  elements: dict
  sample: [{host: gpu-01, series: "serving c=8 (1024/128 tok)", finished_at: "2026-12-01T20:00:00Z", median: 1001.5,
            concurrency: 8, repetition: 2, device: "0000:01:00.0", code: link_flapping, severity: critical,
            top_speed_gts: 32.0, top_width: 16, changes: 7, output_tps: 812.3}]
series:
  description:
    - Per host, configuration and concurrency level, the runs in time order with their medians and samples, whether
      their links were sampled (C(links_sampled)), their C(link_findings) at that level and the C(server_start) each
      measured (null where unknown).
  returned: state=query
  type: list
  elements: dict
start_noise:
  description:
    - For O(state=start_noise), per series (C(host), C(config_key), C(config), C(concurrency)) the noise of its
      per-run output tok/s within and between server starts, the runs grouped by the start each stored result measured
      (one-way random effects on log tok/s, as the C(gpufleet.inference.start_noise) filter computes it).
    - C(starts), C(runs) and C(results), what the figures rest on; C(per_start), each start's id, C(runs), C(results),
      geometric C(mean) tok/s and C(first_at)/C(last_at).
    - C(sd_within) (about the runs' CV), C(sd_between) (the sd of a start's own level), C(sd_between_ci) (its
      C(ci_level) confidence interval from the F distribution), C(f), C(df) and C(p_between) (the F test of no
      between-start variance); null with fewer than two starts.
    - C(between_start_sd), the figure to set as the gate's C(between_start_sd) (the change kinds' roles'
      C(*_gate_between_start_sd)), C(sd_between) when C(min_starts) (3) or more starts give it, else null.
    - C(reason) says what the figure rests on, or how many more starts to measure, and what was left out, that is results
      that name no server start (C(unknown_results), C(unknown_runs), stored before inference_benchmark recorded it,
      or the start was not known), starts of one run (C(single_run_starts)) and starts whose runs ran under several
      tuning states or stages (C(mixed_starts)). C(stacks) counts the kernel/driver/vLLM/tuning states the starts ran
      under; above 1 their differences count as between-start noise (a figure on the wide side).
  returned: state=start_noise
  type: list
  elements: dict
  version_added: 0.3.0
  sample: [{host: gpu-01, config_key: 3f2a9c0d1e4b5a6f, concurrency: 64, starts: 4, runs: 32, results: 4,
            unknown_results: 1, unknown_runs: 5, single_run_starts: 0, mixed_starts: 0, stacks: 1, sd_within: 0.0300,
            sd_between: 0.0139, sd_between_ci: [0.0, 0.0648], ci_level: 0.95, f: 2.71, df: [3, 28], p_between: 0.064,
            min_starts: 3, between_start_sd: 0.0139,
            per_start: [{start: 0b9d2e6c-3f7a-4a57-9d8e-5c2f1a0e4b11/2273/41117, runs: 8, results: 1, mean: 9452.7,
                         first_at: "2026-12-04T20:01:57Z", last_at: "2026-12-04T20:01:57Z"}],
            reason: "4 server starts of 32 runs: between_start_sd is their sd_between (1.39%, 95% interval
                     0.00%-6.48%, F test p=0.064); 1 stored results (5 runs) name no server start ... and are left out"}]
between_start_sd:
  description:
    - For O(state=start_noise), the figure a gate can take when exactly one series matched and it gives one (its
      C(between_start_sd)), else null.
  returned: state=start_noise
  type: float
  version_added: 0.3.0
  sample: 0.0139
reason:
  description:
    - For O(state=start_noise), why RV(between_start_sd) is what it is - the one series' C(reason), or how many series
      matched and that O(config_key) and O(concurrency) pick one.
  returned: state=start_noise
  type: str
  version_added: 0.3.0
  sample: "4 server starts of 32 runs: between_start_sd is their sd_between (1.39%, 95% interval 0.00%-6.48%, F test p=0.064)"
files:
  description: The report files written.
  returned: state=report
  type: list
  elements: str
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.bench_history import execute
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.changepoint import CP_ALPHA
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.gate_settings import GATE
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.history import SOURCES

ARGUMENT_SPEC = dict(
    path=dict(type="path"),
    url=dict(type="str", no_log=True),
    password=dict(type="str", no_log=True),
    state=dict(type="str", choices=["append", "report", "query", "start_noise"], default="append"),
    results=dict(type="list", elements="path", default=[]),
    skip_invalid=dict(type="bool", default=False),
    documents=dict(type="list", elements="dict", default=[]),
    host=dict(type="str"),
    source=dict(type="str", choices=list(SOURCES), default="on_demand"),
    gpu_driver=dict(type="str"),
    vllm_version=dict(type="str"),
    profile=dict(type="str", default=""),
    stage=dict(type="str", default=""),
    verdicts=dict(type="list", elements="dict", default=[]),
    hosts=dict(type="list", elements="str", default=[]),
    config_key=dict(type="str", no_log=False),  # a hash of what was measured, no secret
    concurrency=dict(type="int"),
    dest=dict(type="path"),
    title=dict(type="str", default="GPU fleet throughput history"),
    threshold=dict(type="float", default=GATE.threshold),
    alpha=dict(type="float", default=GATE.alpha),
    min_runs=dict(type="int", default=GATE.min_runs),
    cp_alpha=dict(type="float", default=CP_ALPHA),
)


def main():
    run_module(ModuleSpec("bench_history", ARGUMENT_SPEC,
                          "keeps the history (the SQLite file at path, or the PostgreSQL database at url) and writes its report under dest",
                          checks={"required_if": [("state", "report", ["dest"])], "required_one_of": [("path", "url")],
                                  "mutually_exclusive": [("path", "url")]}), execute)


if __name__ == "__main__":
    main()

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """The options every change kind's step module shares (kernel_rollout_step, vllm_upgrade_step, driver_upgrade_step;
    docs/change_flow.md): their argument spec is change/step.py's step_argument_spec(). A module documents its own
    options, and adds the choices of O(event), the default of O(journal) and its own words where a kind says more."""

    DOCUMENTATION = r"""
notes:
  - The journal is written durably (temp file, fsync, rename, fsync of the directory) before the module answers; a
    controller lost at any point resumes on the next run from the recorded stage, or executes the recorded verdict.
  - With O(lease_run_id) set, every step renews the host's lease (C(gpufleet.inference.host_lease)) and refuses when this
    run no longer holds it; with it empty no lease is written, but a live lease of another run still refuses the step.
    A refused step writes nothing.
  - The journal belongs to the run that started it. Another run resumes it only at its V(start), when it holds the
    host's lease under its own run id or names the journal's run in O(take_over).
  - A journal that is not valid JSON or not of the expected shape, and event data of the wrong shape, are refused with
    the file and the field named; nothing is changed.
options:
  target:
    description: The version to move to (each kind says how it is spelled).
    type: str
    required: true
  event:
    description: What the controller just did (V(start) at the beginning of a run).
    type: str
    default: start
  data:
    description: The event's data (each kind lists what each event carries).
    type: dict
    default: {}
  run_id:
    description: The rollout's id, kept in the journal.
    type: str
    default: ""
  lock:
    description: Answer the V(lock) action at the start (each kind says what it holds).
    type: bool
    default: true
  verify_pcie:
    description: Audit the PCIe path before the upgrade (the stability part audits it in any case); each kind sets the
      default.
    type: bool
  outputs:
    description:
      - The outputs part of the serving verdict - record an output reference on the old version before any change (the
        V(outputs) action, gpufleet.inference.output_equivalence C(mode=record)), compare the candidate with it once the
        gate's answer is final (the V(check) action); a V(diverged) candidate is rolled back (decision V(diverged)).
      - V(false) leaves the part out, and the verdict names it as not measured.
    type: bool
    default: true
  stability:
    description:
      - The stability part of the serving verdict - keep the PCIe audit's document before the change and audit again
        after the candidate's benchmark (with the kernel log); a GPU gone, a link trained down, new AER errors, Xid
        events or more failed requests roll back (decision V(unstable)).
      - V(false) leaves the host's health out (the verdict names it as not measured; the failed requests still count).
    type: bool
    default: true
  gate:
    description: The gate's settings (C(threshold), C(alpha), C(pass_alpha), C(min_runs), C(max_runs), and optionally
      C(max_baseline_runs), C(candidate_min_runs) (the first look, default 4), C(requests_per_run), C(latency_margins)
      (TTFT/TPOT p50/p90 and ITL p99 margins; missing keys keep the gate's defaults), C(latency_alpha) and
      C(between_start_sd) (the noise between two server starts; null counts the runs' own noise only)), checked before
      any run.
    type: dict
    default: {}
  journal:
    description: The journal's path on the host.
    type: path
  lease_run_id:
    description: Renew the host's lease for this run at every step (empty - no lease is written; a live lease of another
      run still refuses).
    type: str
    default: ""
  take_over:
    description:
      - The run id of an unfinished journal this run takes over although it did not start it (that run must be gone).
        Not needed where this run holds the host's lease (O(lease_run_id) = O(run_id)).
    type: str
    default: ""
  lease_ttl:
    description: Seconds each renewal extends the lease.
    type: int
    default: 7200
  preflight:
    description: This run's go or no-go before an upgrade starts (C(ok), C(msg)); empty - go.
    type: dict
    default: {}
"""

"""Prefix caching judged on the profile that can see it, for real, in one VM of the lab (issue 35).

``playbooks/tune_measured.yml`` on lab1, the lab inference server (extras/lab_inference_server.py) under the
vllm_service unit without its prefix cache, with the lab's arguments but a prefill that costs what a real one does
(``--prefill-work 8``, SERVER_ARGS: with the lab's ``1`` a 512-token prefill was lost in TCG's per-request overhead, a
first run on 2026-12-04 saw TTFT 98 -> 81 ms and tok/s inside the noise); one vLLM flag stage,
``vllm_service_enable_prefix_caching: true``, measured on two profiles:

* ``shared_prefix``: 480 tokens of system prompt shared by every request, then 32 of its own; the cache computes the
  shared part once, so the stage must pass there, and it is the profile the stage is judged on (``judged_on``);
* ``unique``: 512-token prompts of their own (the ``random`` profile); they never hit the cache, so the stage must be
  neutral there: no regression (which would revert it whatever shared_prefix says), a ratio near 1.

The stage is kept; on the VM over SSH: the state file's verdicts, the unit's live command line with
``--enable-prefix-caching`` (it had none before), and the server's own counters of prompt tokens found in its cache.
Figures go to .lab/profiles_vm/figures.json, the report and the logs beside it.

    . scripts/lib.sh; gpufleet_env
    flock /work/lab.lock env GPUFLEET_LAB_BASE_PORT=2821 python -m pytest -m e2e -x -v tests/lab/test_profiles_vm.py
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.lab.labutil import LAB_DIR, lab_ssh, play_recap
from tests.lab.test_serving_verdict_vm import VM, exec_start, ok, playbook, serving, single_vm

# e2e: about 20-30 min under TCG (one boot, four benchmarks of two profiles, the output reference); opt-in
pytestmark = [pytest.mark.vmlab, pytest.mark.e2e]

WORK = LAB_DIR / "profiles_vm"
FLAG = "--enable-prefix-caching"
STATE = "/var/lib/gpufleet/tune_measured/state.json"
# The lab's server arguments (inventories/lab/group_vars/lab_vms.yml) with 8 KiB of hashing per prompt token computed
SERVER_ARGS = ["--work", "4", "--step-work", "32", "--prefill-work", "8"]
# TTFT and TPOT under TCG vary by 60-90% run to run (test_serving_verdict_vm.py): the latency part judges TTFT at
# +100%, so that only a real change says no. What the cache saves is prefill (tok/s and TTFT); TPOT is left out (null):
# the first run's TPOT p50/p90 could not be decided at +100% in 3 rounds, and the stage was reverted as inconclusive.
MARGINS = {"ttft_p50": 1.0, "ttft_p90": 1.0, "tpot_p50": None, "tpot_p90": None, "itl_p99": None}
# c=4, 32 requests of 16 output tokens, five runs a look; the warm-up fills the cache as a serving host's would be
SHAPE = {"concurrency": [4], "output_tokens": 16, "requests": 32, "repetitions": 5, "warmup": 8, "settle_runs": 0,
         "latency_margins": MARGINS}
PROFILES = [{"name": "unique", **SHAPE, "prompt_tokens": 512},
            {"name": "shared_prefix", **SHAPE, "prompt_tokens": 32, "profile_options": {"prefix_tokens": 480}}]
STAGE = {"name": "prefix_caching", "description": "vLLM's automatic prefix caching (--enable-prefix-caching)",
         "vars": {"vllm_service_enable_prefix_caching": True}}
OUTPUTS = {"tune_measured_outputs_prompt_lengths": ["short"], "tune_measured_outputs_max_tokens": 8}


@pytest.fixture(scope="module")
def vm():
    """lab1 alone, serving the lab server without its prefix cache; powered off at the module's end."""
    yield from single_vm(WORK, {"vllm_service_extra_args": SERVER_ARGS})


def figures(**kw) -> None:
    path = WORK / "figures.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(kw)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def cache_counters() -> dict[str, float]:
    """The lab server's prompt tokens looked up in its prefix cache and found there, from its /metrics on the VM."""
    text = lab_ssh(VM, "python3 -c \"import urllib.request;print(urllib.request.urlopen("
                       "'http://127.0.0.1:8000/metrics').read().decode())\"")
    got = {}
    for name in ("queries", "hits"):
        m = re.search(rf"^gpufleet_lab_prefix_cache_{name}_total(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
        got[name] = float(m.group(1)) if m else 0.0
    return got


def test_prefix_caching_is_kept_on_shared_prefix_and_neutral_on_unique_prompts(vm):
    before = exec_start()
    assert FLAG not in before and "--prefill-work 8" in before and serving(), before
    settings = WORK / "tune.json"
    report = WORK / "tune_measured"
    settings.write_text(json.dumps({
        "vllm_service_extra_args": SERVER_ARGS,
        "tune_measured_stages": [], "tune_measured_profiles": PROFILES, "tune_measured_vllm_profiles": [STAGE],
        "tune_measured_gate": {"threshold": 0.40}, "tune_measured_more_rounds": 2, **OUTPUTS,
        "tune_measured_served_model_name": "lab", "tune_measured_report_dir": str(report),
        "gpufleet_history_db": str(WORK / "history.sqlite"), "tune_measured_ready_timeout": 600}, indent=1))
    t0 = time.time()
    r = playbook("playbooks/tune_measured.yml", "-e", f"@{settings}", timeout=3600, work=WORK)
    wall = round(time.time() - t0)
    ok(r, "tune_measured.yml")

    # on the VM: the state file's stage, the unit's live command line, the server's cache counters
    state = json.loads(lab_ssh(VM, f"cat {STATE}"))
    stage = next(s for s in state["stages"] if s["name"] == "prefix_caching")
    shared, unique = stage["verdicts"]["shared_prefix"]["4"], stage["verdicts"]["unique"]["4"]
    base = next(s for s in state["stages"] if s["name"] == "baseline")
    medians = {name: {side: {k: e["measurements"][name]["levels"]["4"][k] for k in ("median", "ttft_p50_ms")}
                      for side, e in (("baseline", base), ("caching", stage))} for name in ("shared_prefix", "unique")}
    after = exec_start()
    counters = cache_counters()
    figures(tune_measured_s=wall, recap=play_recap(r.stdout)[VM], status=stage["status"], verdict=stage["verdict"],
            reason=stage["reason"], judged_by=stage["judged_by"], rounds=stage["rounds"],
            shared_prefix={k: shared[k] for k in ("decision", "ratio", "ci", "reason")},
            unique={k: unique[k] for k in ("decision", "ratio", "ci", "reason")},
            median_tok_s=medians, cache=counters, parts={k: p["says"] for k, p in stage["serving"]["parts"].items()})
    print(f"\nprefix caching on the VM: shared_prefix {shared['decision']} x{shared['ratio']:.3f}, unique prompts "
          f"{unique['decision']} x{unique['ratio']:.3f}, median tok/s {medians}; {stage['status']} in {wall} s: "
          f"{stage['reason']}; cache {counters}")

    # judged on shared_prefix, where the cache saves the shared prefill: kept, with a several-fold figure
    assert stage["judged_on"] == stage["judged_by"] == ["shared_prefix"], stage
    assert stage["status"] == "kept" and stage["verdict"] == "pass", stage["reason"]
    assert shared["decision"] == "pass" and shared["ratio"] > 1.3, shared
    assert "(judged on shared_prefix; no regression on the other profiles)" in stage["reason"]
    # neutral on unique prompts: no regression (which would have reverted it), and none of the shared win
    assert unique["decision"] != "regression", unique
    assert unique["ratio"] < shared["ratio"] / 1.2, (unique, shared)
    # the flag is on in the unit and in the live server, which found prompt tokens in its cache
    assert FLAG in after and serving(), after
    assert lab_ssh(VM, "systemctl is-active vllm.service").strip() == "active"
    assert counters["hits"] > 0 and counters["hits"] <= counters["queries"], counters
    md = (report / "stages.md").read_text()
    assert "kept (judged on shared_prefix)" in md, md[:3000]

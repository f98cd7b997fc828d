# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tune_measured keeps a stage only on a passing serving verdict (issue 33, item 5): the baseline records the output
reference when a stage will compare with it, a vLLM flag stage with diverged outputs is reverted at an equal tok/s, a
stage after which a GPU is gone is unstable and reverted, a latency regression at an equal tok/s names the latency part
(throughput yes), parts left out or not asked of a stage are named not measured, checks of a shape no part has are
refused, a state from before the verdict resumes; the stage table shows each part. Driven through main() over a fake
root."""

from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils.tuning import stage_table
from ansible_collections.gpufleet.inference.plugins.modules import tune_measured
from tests.unit.plugins.modules.test_tune_measured_latency import BASE, PROFILE, SAME, STAGE, document
from tests.unit.plugins.modules.uthelper import run_module

HOST_STAGE = {"name": "aspm", "role": "gpufleet.inference.pcie_link", "vars": {"pcie_link_aspm_policy": "performance"},
              "revert": [{"role": "gpufleet.inference.pcie_link", "vars": {"pcie_link_state": "absent"}}]}
REFERENCE = {"reference": "/var/lib/gpufleet/tune_measured/outputs-reference.json", "model": "m", "verdict": None,
             "band": {"top1_agreement_min": 1.0}, "aa": {"top1_agreement": 1.0}}


def health(gpus=("0000:01:00.0", "0000:41:00.0")):
    return {"gpus": [{"bdf": b} for b in gpus], "devices": {b: {"bdf": b, "driver": "nvidia"} for b in gpus}}


def compared(verdict):
    return {"verdict": verdict, "reason": f"{verdict}: top-1 agreement 0.61 (simulated)",
            "figures": {"top1_agreement": 0.61, "mean_abs_logprob_diff": 0.4, "p99_abs_logprob_diff": 3.1}}


def run(tmp_path, capsys, stage_doc, stage=STAGE, base_checks=None, stage_checks=None, **start):
    """Start, the baseline (with its checks), apply, the stage's benchmark (with its checks); each answer."""
    common = {"root": str(tmp_path), "state_file": "/state.json"}
    result = run_module(tune_measured, {**common, "op": "start", "profiles": [PROFILE], "stages": [stage],
                                        "vllm_defaults": {"vllm_service_max_num_seqs": 0}, **start}, capsys)
    answers = [result]
    for docs, checks in (([document(BASE)], base_checks), ([], None), ([stage_doc], stage_checks)):
        if result.get("failed"):
            break
        result = run_module(tune_measured, {**common, "op": "complete", "action_id": result["next"]["id"],
                                            "results": docs, "checks": checks or {}}, capsys)
        answers.append(result)
    return answers


def the_stage(result, name="seqs"):
    return next(s for s in result["state"]["stages"] if s["name"] == name)


def test_the_baseline_records_the_reference_and_a_flag_stage_compares_once(tmp_path, capsys):
    answers = run(tmp_path, capsys, document(SAME), base_checks={"outputs": REFERENCE, "health": health()},
                  stage_checks={"outputs": compared("equivalent"), "health": health()})
    reference = "/var/lib/gpufleet/tune_measured/outputs-reference.json"
    assert answers[0]["next"]["checks"] == {"audit": True, "outputs": "record", "reference": reference}
    assert answers[2]["next"]["action"] == "benchmark" and answers[2]["next"]["checks"]["outputs"] == "compare"
    s = the_stage(answers[-1])
    assert s["status"] == "kept" and s["verdict"] == "pass", s["reason"]
    assert {k: p["says"] for k, p in s["serving"]["parts"].items()} == {
        "throughput": "yes", "latency": "yes", "outputs": "yes", "stability": "yes"}
    assert answers[-1]["stages"][1]["parts"]["outputs"] == "yes"


def test_a_flag_stage_with_diverged_outputs_is_reverted_at_an_equal_tok_s(tmp_path, capsys):
    answers = run(tmp_path, capsys, document(SAME), base_checks={"outputs": REFERENCE},
                  stage_checks={"outputs": compared("diverged")})
    s = the_stage(answers[-1])
    assert s["verdict"] == "diverged" and s["status"] == "reverting" and s["gate_verdict"] == "pass"
    assert s["reason"].startswith("a no from the serving verdict: diverged: top-1 agreement 0.61")
    assert s["serving"]["parts"]["outputs"]["figures"]["top1_agreement"] == 0.61
    table = stage_table.render_markdown([answers[-1]["state"]])
    assert "| seqs | diverged | yes 1.00" in table and "no (diverged) top-1 0.610" in table
    assert "- **seqs** outputs: no (diverged): diverged: top-1 agreement 0.61 (simulated)" in table
    assert "<h3>Serving verdict</h3>" in stage_table.render_html([answers[-1]["state"]])


def test_a_gpu_gone_after_a_host_stage_is_unstable_and_reverted(tmp_path, capsys):
    answers = run(tmp_path, capsys, document(SAME), stage=HOST_STAGE, base_checks={"health": health()},
                  stage_checks={"health": health(["0000:01:00.0"]), "kernel_log": [
                      "NVRM: Xid (PCI:0000:41:00): 79, pid=1, GPU has fallen off the bus.", "eth0: link up"]})
    assert answers[0]["next"]["checks"]["outputs"] is None  # no stage compares outputs: nothing recorded
    s = the_stage(answers[-1], "aspm")
    assert s["verdict"] == "unstable" and s["status"] == "reverting", s["reason"]
    assert s["kernel_log"] == ["NVRM: Xid (PCI:0000:41:00): 79, pid=1, GPU has fallen off the bus."]
    codes = {f["code"] for f in s["serving"]["parts"]["stability"]["findings"]}
    assert {"gpu_missing", "xid"} <= codes
    # a host stage is not asked for its outputs, and says so
    assert s["serving"]["parts"]["outputs"]["reason"].startswith("not asked of this stage")


def test_a_latency_regression_at_equal_tok_s_names_the_latency_part(tmp_path, capsys):
    answers = run(tmp_path, capsys, document(SAME, ttft=100.0), base_checks={"outputs": REFERENCE},
                  stage_checks={"outputs": compared("equivalent")})
    s = the_stage(answers[-1])
    parts = s["serving"]["parts"]
    assert s["verdict"] == "regression" and s["status"] == "reverting"
    assert parts["throughput"]["says"] == "yes" and parts["latency"]["says"] == "no" and parts["outputs"]["says"] == "yes"
    assert "serving c=32 ttft_p50" in s["serving"]["parts"]["latency"]["reason"] or "TTFT p50" in parts["latency"]["reason"]


def test_parts_left_out_are_named_and_never_asked_for(tmp_path, capsys):
    answers = run(tmp_path, capsys, document(SAME), verdict={"outputs": False, "stability": False})
    assert answers[0]["next"]["checks"] == {"audit": False, "outputs": None, "reference": None}
    s = the_stage(answers[-1])
    assert s["status"] == "kept"
    assert s["serving"]["parts"]["outputs"]["reason"] == "left out (verdict outputs: false)"
    assert "outputs, stability not measured" in s["serving"]["reason"]


def test_checks_of_a_shape_no_part_has_are_refused(tmp_path, capsys):
    bad = run(tmp_path, capsys, document(SAME), base_checks={"outputs": REFERENCE},
              stage_checks={"outputs": {"verdict": "same"}})
    assert bad[-1]["failed"] and "has verdict 'same'" in bad[-1]["msg"]
    unasked = run(tmp_path / "u", capsys, document(SAME), stage=HOST_STAGE, base_checks={"outputs": REFERENCE})
    assert unasked[1]["failed"] and "was not asked for" in unasked[1]["msg"]
    wrong = run(tmp_path / "w", capsys, document(SAME), base_checks={"health": {"devices": []}})
    assert wrong[1]["failed"] and "not a pcie_facts document" in wrong[1]["msg"]
    settings = run(tmp_path / "s", capsys, document(SAME), verdict={"outputs": "yes"})
    assert settings[0]["failed"] and "verdict outputs must be true or false" in settings[0]["msg"]


def test_a_state_from_before_the_verdict_resumes(tmp_path, capsys):
    common = {"root": str(tmp_path), "state_file": "/state.json"}
    first = run_module(tune_measured, {**common, "op": "start", "profiles": [PROFILE], "stages": [STAGE],
                                       "vllm_defaults": {"vllm_service_max_num_seqs": 0}}, capsys)
    import json
    path = tmp_path / "state.json"
    state = json.loads(path.read_text())
    del state["verdict"]  # written by the release before the serving verdict
    for e in state["stages"]:
        e.pop("outputs", None)
    state["pending"].pop("checks")
    path.write_text(json.dumps(state))
    again = run_module(tune_measured, {**common, "op": "start", "profiles": [PROFILE], "stages": [STAGE],
                                       "vllm_defaults": {"vllm_service_max_num_seqs": 0}}, capsys)
    assert not again.get("failed") and again["next"]["id"] == first["next"]["id"]
    done = run_module(tune_measured, {**common, "op": "complete", "action_id": again["next"]["id"],
                                      "results": [document(BASE)]}, capsys)
    assert not done.get("failed"), done.get("msg")

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet.inference.output_equivalence against the real lab server (extras/lab_inference_server.py) started here:
record, an A/A compare (equivalent), a server with --output-noise 0.2 (diverged), a small noise within a tolerance
(drifted), a reference of another model, prompt set or tokenizer (errors), check mode and bad options."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.equivalence import wilson
from ansible_collections.gpufleet.inference.plugins.modules import output_equivalence
from tests.unit.plugins.modules.uthelper import patch_module_args, run_module
from tests.unit.test_lab_inference_server import LabServer

FAST = ("--work", "1", "--step-work", "1", "--prefill-work", "0")
REF = "/var/lib/gpufleet/output-reference.json"


def run_main(args, capsys):
    return run_module(output_equivalence, args, capsys)


def args_for(server: LabServer, root, **extra) -> dict:
    args = {"url": server.url, "model": "lab", "api_key": "eq-key", "reference": REF, "root": str(root), "max_tokens": 8}
    args.update(extra)
    return args


def lab(model_dir, *extra: str, name: str = "lab") -> LabServer:
    return LabServer(model_dir, *FAST, *extra, name=name, env={"VLLM_API_KEY": "eq-key"})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture(scope="module")
def recorded(model_dir, tmp_path_factory):
    """A reference recorded once from a clean server (its root copied by the tests that use it), and the record's result."""
    root = tmp_path_factory.mktemp("root")
    out = io.StringIO()
    with lab(model_dir) as server:
        with patch_module_args(args_for(server, root, mode="record")), contextlib.redirect_stdout(out), \
                pytest.raises(SystemExit):
            output_equivalence.main()
    return root, json.loads(out.getvalue())


def copy_root(recorded, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(recorded[0], root)
    return root


def test_record_writes_the_reference_with_its_aa_band(recorded):
    root, result = recorded
    assert result["changed"] is True and not result.get("failed"), result
    assert result["actions"] == [{"action": "write", "path": REF, "model": "lab"}]
    doc = json.loads((root / REF.lstrip("/")).read_text())
    assert doc["model"] == "lab" and len(doc["prompts"]) == 64
    assert all(len(p["token_ids"]) == 8 and len(p["token_logprobs"]) == 8 for p in doc["prompts"])
    assert max(len(p["prompt_token_ids"]) for p in doc["prompts"]) > 2000  # the long prompts went through
    # the lab server is deterministic: the A/A is exact, and the band is the margins around it
    assert doc["aa"]["top1_agreement"] == 1.0 and doc["aa"]["mean_abs_logprob_diff"] == 0.0
    assert doc["aa"]["prompts_forked"] == 0
    # 512 of 512 tokens agree: the band reaches down to the Wilson interval's low end, wider than the 0.005 margin
    assert doc["band"]["top1_agreement_min"] == pytest.approx(wilson(512, 512)[0]) and wilson(512, 512)[0] < 0.995
    assert doc["band"]["mean_abs_logprob_diff_max"] == pytest.approx(0.01)
    assert result["verdict"] is None and result["aa"] == doc["aa"] and not result.get("warnings"), result.get("warnings")


def test_record_keeps_an_existing_reference_unless_overwrite(recorded, model_dir, tmp_path, capsys):
    root = copy_root(recorded, tmp_path)
    before = (root / REF.lstrip("/")).read_text()
    with lab(model_dir) as server:
        kept = run_main(args_for(server, root, mode="record"), capsys)
        checked = run_main(args_for(server, root, mode="record", overwrite=True, _ansible_check_mode=True), capsys)
    assert kept["changed"] is False and kept["verdict"] is None and "kept" in kept["reason"]
    assert checked["changed"] is True and checked["actions"][0]["action"] == "write"
    assert (root / REF.lstrip("/")).read_text() == before


def test_compare_after_a_restart_is_equivalent(recorded, model_dir, tmp_path, capsys):
    root = copy_root(recorded, tmp_path)
    with lab(model_dir) as server:
        result = run_main(args_for(server, root), capsys)
    assert result["verdict"] == "equivalent", result["reason"]
    assert result["changed"] is False and result["actions"] == []
    assert result["figures"]["top1_agreement"] == 1.0 and result["figures"]["p99_abs_logprob_diff"] == 0.0
    assert len(result["per_prompt"]) == 64 and all(p["first_divergence"] is None for p in result["per_prompt"])


def test_output_noise_02_is_diverged(recorded, model_dir, tmp_path, capsys):
    root = copy_root(recorded, tmp_path)
    with lab(model_dir, "--output-noise", "0.2") as server:
        result = run_main(args_for(server, root), capsys)
    assert result["verdict"] == "diverged", result["reason"]
    fig = result["figures"]
    low, high = fig["top1_agreement_ci95"]
    assert low < 0.8 < high or abs(fig["top1_agreement"] - 0.8) < 0.05  # a share 0.2 of positions lose their argmax
    assert fig["prompts_forked"] > 20
    assert "beyond the tolerance" in result["reason"]


def test_small_noise_within_tolerance_is_drifted(recorded, model_dir, tmp_path, capsys):
    root = copy_root(recorded, tmp_path)
    with lab(model_dir, "--output-noise", "0.02") as server:
        result = run_main(args_for(server, root), capsys)  # the default tolerance
        strict = run_main(args_for(server, root, tolerance_top1=0.995), capsys)
    assert result["verdict"] == "drifted", result["reason"]
    assert 0.9 < result["figures"]["top1_agreement"] < result["band"]["top1_agreement_min"]
    assert strict["verdict"] == "diverged" and "top-1 agreement" in strict["reason"]


def test_another_model_seed_under_the_same_name_is_diverged(recorded, model_dir, tmp_path, capsys):
    root = copy_root(recorded, tmp_path)
    with lab(model_dir, "--model-seed", "7") as server:
        result = run_main(args_for(server, root), capsys)
    assert result["verdict"] == "diverged"
    assert result["figures"]["top1_agreement"] < 0.1


@pytest.mark.parametrize("change, fragment", [
    ("name", "was recorded for model 'lab', not 'other'"),
    ("root", "another model under the same name"),
    ("prompt_set", "recorded with prompt set"),
    ("tokenizer", "tokenizes the prompt differently"),
])
def test_a_reference_of_another_model_is_refused(recorded, model_dir, tmp_path, capsys, change, fragment):
    root = copy_root(recorded, tmp_path)
    path = root / REF.lstrip("/")
    doc = json.loads(path.read_text())
    served, name = model_dir, "lab"
    if change == "name":
        name = "other"
    elif change == "root":
        served = tmp_path / "other-model"
        served.mkdir()
    elif change == "prompt_set":
        doc["prompt_set"]["sha256"] = "0" * 64
    else:
        doc["prompts"][3]["prompt_token_ids"][0] += 1
    path.write_text(json.dumps(doc))
    with lab(served, name=name) as server:
        result = run_main(args_for(server, root, model=name), capsys)
    assert result["failed"] and fragment in result["msg"], result["msg"]


def test_missing_logprobs_and_a_refused_prompt_are_errors(recorded, model_dir, tmp_path, capsys):
    root = copy_root(recorded, tmp_path)
    with lab(model_dir, "--max-model-len", "512") as server:
        refused = run_main(args_for(server, tmp_path / "fresh", mode="record"), capsys)
        short = run_main(args_for(server, tmp_path / "fresh", mode="record", prompt_lengths=["short"]), capsys)
    assert refused["failed"] and "refused the request" in refused["msg"] and "maximum context length" in refused["msg"]
    assert "prompt long-completion-00" in refused["msg"] and "prompt_lengths: [short, medium]" in refused["msg"]
    assert short["changed"] and len(json.loads((tmp_path / "fresh" / REF.lstrip("/")).read_text())["prompts"]) == 32
    path = root / REF.lstrip("/")
    doc = json.loads(path.read_text())
    doc["prompts"][0]["token_logprobs"].pop()
    path.write_text(json.dumps(doc))
    with lab(model_dir) as server:
        damaged = run_main(args_for(server, root), capsys)
    assert damaged["failed"] and "damaged" in damaged["msg"]


@pytest.mark.parametrize("extra, fragment", [
    ({"tolerance_top1": 1.5}, "tolerance_top1 must be between 0 and 1"),
    ({"max_tokens": 0}, "max_tokens must be between 1 and 1024"),
    ({"timeout": 0.0}, "timeout must be between 1 and 3600"),
    ({"reference": "relative.json"}, "reference='relative.json' is refused: a relative path"),
    ({"url": "ftp://x"}, "url 'ftp://x' is not usable"),
    ({"model": "nope"}, "does not serve model 'nope'"),
    ({"api_key": "wrong"}, "refused the API key"),
])
def test_bad_options_fail_before_any_write(recorded, model_dir, tmp_path, capsys, extra, fragment):
    with lab(model_dir) as server:
        result = run_main(args_for(server, tmp_path, mode="record", **extra), capsys)
    assert result["failed"] and fragment in result["msg"], result["msg"]
    assert not (tmp_path / REF.lstrip("/")).exists()


def test_a_band_wider_than_the_tolerance_is_a_warning(recorded, model_dir, tmp_path, capsys):
    root = copy_root(recorded, tmp_path)
    with lab(model_dir) as server:
        result = run_main(args_for(server, root, tolerance_top1=0.999), capsys)
    assert result["verdict"] == "equivalent"
    warnings = [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]
    assert any("wider than the tolerance in top1_agreement_min" in w for w in warnings), warnings


def test_compare_without_a_reference_says_to_record_one(model_dir, tmp_path, capsys):
    with lab(model_dir) as server:
        result = run_main(args_for(server, tmp_path), capsys)
    assert result["failed"] and "does not exist: record one first" in result["msg"]

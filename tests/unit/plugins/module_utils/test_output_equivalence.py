# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""output_equivalence's pure scoring over synthetic data, and the shipped prompt set (output_prompts)."""

from __future__ import annotations

from collections import Counter

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import equivalence as oe
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import prompts as op


def ref(token_ids, logprobs, pid="p"):
    return {"id": pid, "token_ids": token_ids, "token_logprobs": logprobs}


# ---- parsing ---------------------------------------------------------------------------------------
def generation(**over):
    choice = {"prompt_token_ids": [5, 6], "token_ids": [7, 8], "logprobs": {"token_logprobs": [-0.5, -1.25]}}
    choice.update(over)
    return choice


def test_parse_generation_reads_ids_and_logprobs():
    assert oe.parse_generation(generation(), "p") == {"prompt_token_ids": [5, 6], "token_ids": [7, 8],
                                                      "token_logprobs": [-0.5, -1.25]}


@pytest.mark.parametrize("over, fragment", [
    ({"logprobs": None}, "has no logprobs"),
    ({"logprobs": {"token_logprobs": [-0.5]}}, "1 logprobs for 2 generated tokens"),
    ({"logprobs": {"token_logprobs": [-0.5, None]}}, "generated token 1 has no logprob"),
    ({"logprobs": {"token_logprobs": [-0.5, 0.3]}}, "must be <= 0"),
    ({"logprobs": {"token_logprobs": [-0.5, float("nan")]}}, "must be <= 0"),
    ({"prompt_token_ids": None}, "prompt_token_ids is not a list"),
    ({"prompt_token_ids": []}, "no prompt_token_ids"),
    ({"token_ids": [7, True]}, "token_ids is not a list of token IDs"),
])
def test_parse_generation_refuses_bad_or_missing_logprobs(over, fragment):
    with pytest.raises(oe.EquivalenceError, match=fragment):
        oe.parse_generation(generation(**over), "p")


def test_parse_scores_reads_the_continuation_positions_and_floors_minus_infinity():
    choice = {"prompt_logprobs": [None, {"6": {"logprob": -2.0, "rank": 3}},
                                  {"7": {"logprob": -0.1, "rank": 1}, "9": {"logprob": -3.0, "rank": 2}},
                                  {"8": {"logprob": -1e9, "rank": 4000}}]}
    assert oe.parse_scores(choice, 2, [7, 8], "p") == [(-0.1, 1), (-9999.0, 4000)]


@pytest.mark.parametrize("choice, fragment", [
    ({}, "no prompt_logprobs"),
    ({"prompt_logprobs": [None, {}, {}]}, "has 3 positions"),
    ({"prompt_logprobs": [None, {}, {"9": {"logprob": -1.0, "rank": 1}}, {}]}, "no entry for reference token 7"),
    ({"prompt_logprobs": [None, {}, {"7": {"logprob": -1.0}}, {}]}, "has no rank"),
])
def test_parse_scores_refuses_missing_scores(choice, fragment):
    with pytest.raises(oe.EquivalenceError, match=fragment):
        oe.parse_scores(choice, 2, [7, 8], "p")


# ---- figures ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("reference, candidate, expected", [
    ([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 9, 3], 1), ([1, 2, 3], [4, 2, 3], 0), ([1, 2, 3], [1, 2], 2),
])
def test_first_divergence(reference, candidate, expected):
    assert oe.first_divergence(reference, candidate) == expected


def test_prompt_figures_agreement_differences_and_fork():
    fig = oe.prompt_figures(ref([1, 2, 3, 4], [-0.5, -1.0, -0.2, -2.0]), [(-0.5, 1), (-1.5, 2), (-0.2, 1), (-1.0, 1)],
                            [1, 2, 5, 6])
    assert (fig["tokens"], fig["top1_agree"], fig["top1_agreement"]) == (4, 3, 0.75)
    assert fig["mean_abs_logprob_diff"] == pytest.approx((0 + 0.5 + 0 + 1.0) / 4)
    assert (fig["max_abs_logprob_diff"], fig["first_divergence"]) == (1.0, 2)


def test_wilson_interval_brackets_the_proportion_and_narrows_with_n():
    low, high = oe.wilson(90, 100)
    assert low < 0.9 < high and (low, high) == pytest.approx((0.8256, 0.9448), abs=1e-3)  # the textbook values
    assert oe.wilson(900, 1000)[1] - oe.wilson(900, 1000)[0] < high - low
    assert oe.wilson(10, 10)[1] == 1.0 and oe.wilson(10, 10)[0] < 1.0


def synthetic(n_prompts: int, tokens: int, flip: float, shift: float) -> list[dict]:
    """Prompts whose candidate disagrees on a share ``flip`` of tokens and moves every logprob by ``shift``."""
    out = []
    for p in range(n_prompts):
        lps = [-0.1 * (1 + (p + i) % 7) for i in range(tokens)]
        scores = [(lp - shift * (1 + (i % 3)) / 2, 2 if (p * tokens + i) % round(1 / flip) == 0 else 1) if flip else
                  (lp - shift * (1 + (i % 3)) / 2, 1) for i, lp in enumerate(lps)]
        out.append(oe.prompt_figures(ref(list(range(tokens)), lps, f"p{p}"), scores, list(range(tokens))))
    return out


def test_overall_figures_with_their_intervals():
    fig = oe.overall(synthetic(16, 32, 0.1, 0.02))
    assert fig["tokens"] == 512 and fig["prompts"] == 16
    assert fig["top1_agreement"] == pytest.approx(1 - 52 / 512)  # every 10th token of 512
    low, high = fig["top1_agreement_ci95"]
    assert low < fig["top1_agreement"] < high
    assert fig["mean_abs_logprob_diff"] == pytest.approx(0.02, rel=0.05)
    low, high = fig["mean_abs_logprob_diff_ci95"]
    assert low - 1e-12 <= fig["mean_abs_logprob_diff"] <= high + 1e-12 and high - low < 0.01
    assert fig["p99_abs_logprob_diff"] == pytest.approx(0.03) and fig["prompts_forked"] == 0


def test_mean_interval_is_the_t_interval_over_prompts():
    values = [0.1, 0.2, 0.3, 0.4]  # mean 0.25, sd 0.1291, t(0.975, 3) = 3.1824
    low, high = oe.mean_ci(values)
    assert (low, high) == pytest.approx((0.25 - 3.1824 * 0.1291 / 2, 0.25 + 3.1824 * 0.1291 / 2), abs=1e-3)
    assert oe.mean_ci([0.0, 0.0, 0.3]) == pytest.approx([0.0, 0.1 + 4.3027 * 0.17321 / 3 ** 0.5], abs=1e-3)  # floored at 0


def test_overall_refuses_nothing_scored():
    with pytest.raises(oe.EquivalenceError, match="no prompt was scored"):
        oe.overall([])


# ---- band and verdict ------------------------------------------------------------------------------
TOLERANCE = {"top1_agreement_min": 0.9, "mean_abs_logprob_diff_max": 0.1, "p99_abs_logprob_diff_max": 1.0}


def test_band_is_the_aa_widened_by_the_larger_of_margin_and_interval():
    aa = oe.overall(synthetic(16, 32, 0.02, 0.001))
    band = oe.band_from_aa(aa, 0.005, 0.01)
    assert band["top1_agreement_min"] == pytest.approx(aa["top1_agreement_ci95"][0])  # the interval is wider than 0.005
    assert band["mean_abs_logprob_diff_max"] == pytest.approx(aa["mean_abs_logprob_diff"] + 0.01)
    assert band["p99_abs_logprob_diff_max"] == pytest.approx(aa["p99_abs_logprob_diff"] + 0.01)
    wide = oe.band_from_aa(aa, 0.2, 0.01)
    assert wide["top1_agreement_min"] == pytest.approx(aa["top1_agreement"] - 0.2)


@pytest.mark.parametrize("flip, shift, expected", [
    (0.0, 0.0, "equivalent"),       # an exact repeat
    (0.05, 0.0, "drifted"),         # 5% of argmaxes lost: beyond an exact A/A, within 0.9
    (0.0, 0.06, "drifted"),         # every logprob moved 0.06 nats on average
    (0.25, 0.0, "diverged"),        # a quarter of the argmaxes lost
    (0.0, 0.5, "diverged"),         # logprobs moved by half a nat
])
def test_verdict(flip, shift, expected):
    band = oe.band_from_aa(oe.overall(synthetic(16, 32, 0.0, 0.0)), 0.005, 0.01)
    figures = oe.overall(synthetic(16, 32, flip, shift))
    verdict, reason = oe.verdict(figures, band, TOLERANCE)
    assert verdict == expected, reason
    if expected != "equivalent":
        assert ("beyond the tolerance" in reason) == (expected == "diverged")


def test_check_reference_and_same_model():
    doc = {"format": oe.REFERENCE_FORMAT, "model": "m", "root": "/models/m", "prompt_set": {}, "sampling": {},
           "prompts": [{"token_ids": [1], "token_logprobs": [-1.0]}], "band": {}}
    assert oe.check_reference(doc, "/r") is doc
    oe.check_same_model(doc, "/r", "m", "/models/m")
    with pytest.raises(oe.EquivalenceError, match="recorded for model 'm', not 'n'"):
        oe.check_same_model(doc, "/r", "n", "/models/m")
    with pytest.raises(oe.EquivalenceError, match="another model under the same name"):
        oe.check_same_model(doc, "/r", "m", "/models/other")
    with pytest.raises(oe.EquivalenceError, match="not an output reference"):
        oe.check_reference({"format": "x"}, "/r")
    with pytest.raises(oe.EquivalenceError, match="has no 'band'"):
        oe.check_reference({k: v for k, v in doc.items() if k != "band"}, "/r")


# ---- the prompt set --------------------------------------------------------------------------------
def test_prompt_set_is_the_pinned_one():
    """The text is pinned: change the generator or the word list and this fails until PROMPT_SET_ID is raised (a
    reference recorded with the old set is refused then) and the digest below is updated."""
    assert op.PROMPT_SET_ID == "gpufleet-equiv-1"
    assert op.PROMPT_SET_SHA256 == "e894bd56ffbb16dffc70ae061c07762e6fdaa5b3f513eb4b40745140c10d7a43"


def test_prompt_set_shape():
    assert len(op.PROMPTS) == 64 and len({p["id"] for p in op.PROMPTS}) == 64
    assert Counter(p["length"] for p in op.PROMPTS) == {"short": 32, "medium": 28, "long": 4}
    assert Counter(p["kind"] for p in op.PROMPTS) == {"completion": 34, "chat": 30}
    words = {p["length"]: [] for p in op.PROMPTS}
    for p in op.PROMPTS:
        words[p["length"]].append(len(p["text"].split()))
    assert max(words["short"]) < 60 and 100 < min(words["medium"]) and max(words["medium"]) < 600
    assert all(2000 <= n <= 2900 for n in words["long"])
    assert all(p["text"].endswith("Assistant:") for p in op.PROMPTS if p["kind"] == "chat")
    assert [p["id"] for p in op.select(["long"])] == ["long-completion-00", "long-completion-01", "long-chat-00", "long-chat-01"]
    assert op.digest(op.select(["short"])) != op.PROMPT_SET_SHA256 == op.digest(op.select(["short", "medium", "long"]))

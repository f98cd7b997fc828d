# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Output equivalence, the pure part: parse a server's generation and teacher-forced scores, score a candidate against
a reference, measure the A/A band, judge ``equivalent`` / ``drifted`` / ``diverged`` (docs/benchmark.md, "Output
equivalence"). No I/O here: bench/output_equivalence.py makes the HTTP calls and writes the reference.

Greedy text may fork after a near-tie without anything being wrong, so the judgement is not string equality: the
reference continuation is scored under the candidate (teacher-forced, vLLM's ``prompt_logprobs``) and the verdict
rests on the top-1 agreement on the reference tokens and the absolute logprob differences. The first divergence of
the candidate's own greedy text is reported, not judged.
"""

from __future__ import annotations

import math
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import percentile, t_quantile

REFERENCE_FORMAT = "gpufleet-output-reference-1"
VERDICTS = ("equivalent", "drifted", "diverged")
Z95 = 1.959964
LOGPROB_SLACK = 1e-4  # a logprob above 0 by less than this is rounding, not a bad value


class EquivalenceError(Exception):
    """A refusal with its reason: bad or missing logprobs, a reference of another model, a bad reference file."""


def _ints(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise EquivalenceError(f"{what} is not a list of token IDs")
    return value


def check_logprob(value: Any, what: str) -> float:
    """A logprob as a float; EquivalenceError for a missing, non-finite or positive one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EquivalenceError(f"{what} has no logprob (got {value!r})")
    if math.isnan(value) or value > LOGPROB_SLACK:
        raise EquivalenceError(f"{what} has a logprob of {value!r}, which no distribution gives (it must be <= 0)")
    return max(float(value), -9999.0)  # vLLM's own floor for -inf


def parse_generation(choice: Any, where: str) -> dict:
    """prompt_token_ids, token_ids and their logprobs from one /v1/completions choice asked with ``logprobs`` and
    ``return_token_ids``."""
    if not isinstance(choice, dict):
        raise EquivalenceError(f"{where}: the answer has no choice")
    prompt_ids = _ints(choice.get("prompt_token_ids"), f"{where}: prompt_token_ids")
    token_ids = _ints(choice.get("token_ids"), f"{where}: token_ids")
    if not prompt_ids:
        raise EquivalenceError(f"{where}: the server returned no prompt_token_ids (return_token_ids needs vLLM 0.10.2 or later)")
    logprobs = choice.get("logprobs")
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(values, list):
        raise EquivalenceError(f"{where}: the answer has no logprobs (the request asked for them: the server ignores "
                               "`logprobs`, or a proxy strips them)")
    if len(values) != len(token_ids):
        raise EquivalenceError(f"{where}: {len(values)} logprobs for {len(token_ids)} generated tokens")
    parsed = [check_logprob(v, f"{where}: generated token {i}") for i, v in enumerate(values)]
    return {"prompt_token_ids": prompt_ids, "token_ids": token_ids, "token_logprobs": parsed}


def parse_scores(choice: Any, n_prompt: int, tokens: list[int], where: str) -> list[tuple[float, int]]:
    """(logprob, rank) of each of ``tokens`` at positions n_prompt.. of the choice's ``prompt_logprobs``."""
    entries = choice.get("prompt_logprobs") if isinstance(choice, dict) else None
    if not isinstance(entries, list):
        raise EquivalenceError(f"{where}: the answer has no prompt_logprobs (the server does not support vLLM's "
                               "prompt_logprobs parameter)")
    if len(entries) < n_prompt + len(tokens):
        raise EquivalenceError(f"{where}: prompt_logprobs has {len(entries)} positions, the scored text {n_prompt + len(tokens)}")
    out = []
    for i, token in enumerate(tokens):
        entry = entries[n_prompt + i]
        item = entry.get(str(token)) if isinstance(entry, dict) else None
        if not isinstance(item, dict):
            raise EquivalenceError(f"{where}: prompt_logprobs has no entry for reference token {token} at position {i}")
        rank = item.get("rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise EquivalenceError(f"{where}: reference token {token} at position {i} has no rank (got {rank!r})")
        out.append((check_logprob(item.get("logprob"), f"{where}: reference token {i}"), rank))
    return out


def first_divergence(reference: list[int], candidate: list[int]) -> int | None:
    """The first position where the candidate's greedy tokens differ from the reference's, None if they never do."""
    for i, (a, b) in enumerate(zip(reference, candidate)):
        if a != b:
            return i
    return None if len(reference) == len(candidate) else min(len(reference), len(candidate))


def prompt_figures(ref: dict, scores: list[tuple[float, int]], greedy: list[int]) -> dict:
    """One prompt's figures: tokens scored, top-1 agreement, mean / max |logprob difference|, first divergence."""
    diffs = [abs(lp - ref_lp) for (lp, _rank), ref_lp in zip(scores, ref["token_logprobs"])]
    agree = sum(1 for _lp, rank in scores if rank == 1)
    n = len(scores)
    return {"id": ref["id"], "tokens": n, "top1_agree": agree, "top1_agreement": agree / n if n else 1.0,
            "mean_abs_logprob_diff": sum(diffs) / n if n else 0.0, "max_abs_logprob_diff": max(diffs, default=0.0),
            "first_divergence": first_divergence(ref["token_ids"], greedy), "diffs": diffs}


def wilson(k: int, n: int) -> list[float]:
    """The 95% Wilson score interval of a proportion k/n."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    denom = 1 + Z95 ** 2 / n
    centre = (p + Z95 ** 2 / (2 * n)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / denom
    return [0.0 if k == 0 else max(0.0, centre - half), 1.0 if k == n else min(1.0, centre + half)]


def mean_ci(values: list[float]) -> list[float]:
    """The 95% t interval of the mean of per-prompt values (prompts are the independent units)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return [mean, mean]
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.025, n - 1) * sd / math.sqrt(n)  # the upper 2.5% point
    return [max(0.0, mean - half), mean + half]


def overall(per_prompt: list[dict]) -> dict:
    """The figures over all prompts, each with its 95% interval where it has one. Top-1 agreement is over tokens
    (Wilson; tokens of one prompt are not independent, so the interval is optimistic); the mean |logprob difference|
    is the mean over tokens with a t interval over the per-prompt means; p99 over all tokens."""
    if not per_prompt:
        raise EquivalenceError("no prompt was scored")
    tokens = sum(p["tokens"] for p in per_prompt)
    agree = sum(p["top1_agree"] for p in per_prompt)
    diffs = sorted(d for p in per_prompt for d in p["diffs"])
    if not diffs:
        raise EquivalenceError("no reference token was scored (max_tokens 0?)")
    forks = [p["first_divergence"] for p in per_prompt if p["first_divergence"] is not None]
    return {"prompts": len(per_prompt), "tokens": tokens, "top1_agreement": agree / tokens, "top1_agreement_ci95": wilson(agree, tokens),
            "mean_abs_logprob_diff": sum(diffs) / len(diffs),
            "mean_abs_logprob_diff_ci95": mean_ci([p["mean_abs_logprob_diff"] for p in per_prompt]),
            "p99_abs_logprob_diff": percentile(diffs, 99.0), "max_abs_logprob_diff": diffs[-1],
            "prompts_forked": len(forks), "first_divergence_min": min(forks) if forks else None}


def band_from_aa(aa: dict, margin_top1: float, margin_logprob: float) -> dict:
    """The A/A band a later comparison must stay within to be ``equivalent``: the A/A figures widened by the larger of
    the margin and the A/A figure's own 95% interval."""
    low, high = aa["top1_agreement_ci95"][0], aa["mean_abs_logprob_diff_ci95"][1]
    return {"top1_agreement_min": max(0.0, aa["top1_agreement"] - max(margin_top1, aa["top1_agreement"] - low)),
            "mean_abs_logprob_diff_max": aa["mean_abs_logprob_diff"] + max(margin_logprob, high - aa["mean_abs_logprob_diff"]),
            "p99_abs_logprob_diff_max": aa["p99_abs_logprob_diff"] + margin_logprob}


def _misses(figures: dict, limits: dict) -> list[str]:
    out = []
    if figures["top1_agreement"] < limits["top1_agreement_min"]:
        out.append(f"top-1 agreement {figures['top1_agreement']:.4f} < {limits['top1_agreement_min']:.4f}")
    for name in ("mean_abs_logprob_diff", "p99_abs_logprob_diff"):
        if figures[name] > limits[name + "_max"]:
            out.append(f"{name.replace('_', ' ')} {figures[name]:.4f} > {limits[name + '_max']:.4f}")
    return out


def verdict(figures: dict, band: dict, tolerance: dict) -> tuple[str, str]:
    """(verdict, reason): ``equivalent`` within the A/A band, ``drifted`` beyond it but within the user's tolerance,
    ``diverged`` beyond both."""
    beyond_band = _misses(figures, band)
    if not beyond_band:
        return "equivalent", "within the A/A band stored with the reference"
    beyond_tolerance = _misses(figures, tolerance)
    if not beyond_tolerance:
        return "drifted", "beyond the A/A band (" + "; ".join(beyond_band) + ") but within the tolerance"
    return "diverged", "beyond the tolerance: " + "; ".join(beyond_tolerance)


def check_reference(doc: Any, path: str) -> dict:
    """A reference document read back, checked enough for compare to trust its fields."""
    if not isinstance(doc, dict) or doc.get("format") != REFERENCE_FORMAT:
        raise EquivalenceError(f"{path} is not an output reference of this collection (format {REFERENCE_FORMAT}): "
                               "record one with mode=record")
    for key in ("model", "root", "prompt_set", "sampling", "prompts", "band"):
        if key not in doc:
            raise EquivalenceError(f"{path}: the reference has no {key!r}; record it again with mode=record")
    for entry in doc["prompts"]:
        if not isinstance(entry, dict) or len(entry.get("token_ids", [])) != len(entry.get("token_logprobs", [None])):
            raise EquivalenceError(f"{path}: a prompt entry is damaged (token_ids and token_logprobs differ in length); "
                                   "record the reference again")
    return doc


def check_same_model(doc: dict, path: str, model: str, root: str | None) -> None:
    """Refuse a reference recorded for another model (served name, or the model path the server reports)."""
    if doc["model"] != model:
        raise EquivalenceError(f"{path} was recorded for model {doc['model']!r}, not {model!r}: a reference of another "
                               "model cannot judge this one; record a reference for it")
    if root is not None and doc["root"] is not None and doc["root"] != root:
        raise EquivalenceError(f"{path} was recorded for model {model!r} served from {doc['root']!r}, the server now serves "
                               f"it from {root!r}: another model under the same name; record a reference for it")

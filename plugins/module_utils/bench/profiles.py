# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark's workload profiles: what requests a run sends, when, and which of them count as good; pure.

* make_prompt(): a fixed-seed prompt of token IDs or words (the same (seed, key) gives the same prompt everywhere);
* check_profile(): a profile name and its options -> the profile's spec (a dict, stored in the results' config and
  compared by the workload fingerprint): ``random`` (a unique prompt of ``prompt_tokens`` per request, the default),
  ``shared_prefix`` (a shared system prompt of ``prefix_tokens`` plus a unique suffix; ``turns`` > 1 makes multi-turn
  conversations whose every turn extends the one before), ``mixed_lengths`` (prompt and output lengths drawn per
  request from seeded log-normal distributions, ``chat`` and ``document`` presets), ``long_context`` (prompts of
  ``context_tokens``, capped by the server's max_model_len: fit_to_server());
* requests(): the (prompt, max_tokens) of one run's requests, a function of the spec, the seed and the run's key only;
* check_arrivals() and arrival_offsets(): closed loop (the default) or open loop at ``rate`` requests/s with gamma
  inter-arrival gaps (``burstiness`` 1 is Poisson; below 1 burstier, above 1 more regular), seeded, or evenly spaced
  (``constant``);
* check_goodput() and goodput(): the requests that met both latency targets (TTFT and TPOT) and their tok/s.

docs/benchmark.md, "Workload profiles", is the reference. Standard library only.
"""

from __future__ import annotations

import math
import random
from typing import Any, Sequence

# Token IDs drawn for prompts: ordinary BPE tokens in every common vocabulary (special tokens sit
# at the very start or the end of the ID space); half-open [low, high).
DEFAULT_TOKEN_ID_RANGE = (1000, 4000)

# Words for text prompts: short and common, so most BPE tokenizers give about one token per word.
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there one all we their can has been if more when will would who so no out up into "
    "do time only new some could these two may first then any like other than use now see way many get made "
    "over did down only way find work part take place made live where after back little round year came show "
    "every good give under name very through just form great think say help low line turn cause much mean "
    "before move right boy old too same tell does set three want air well also play small end put home read "
    "hand port large spell add even land here must big high such follow act why ask men change went light "
    "kind off need house picture try again animal point mother world near build self earth father head stand "
    "own page should country found answer school grow study still learn plant cover food sun four thought let "
    "keep eye never last door between city tree cross since hard start might story saw far sea draw left late "
    "run while press close night real life few stop open seem together next white children begin got walk "
    "example ease paper often always music those both mark book letter until mile river car feet care second "
    "group carry took rain eat room friend began idea fish mountain north once base hear horse cut sure watch "
    "color face wood main enough plain girl usual young ready above ever red list though feel talk bird soon "
    "body dog family direct pose leave song measure state product black short numeral class wind question"
).split()

PROFILES = ("random", "shared_prefix", "mixed_lengths", "long_context")
# Each profile's options and their defaults (profile_options); numbers are bounded by LIMITS.
PROFILE_OPTIONS: dict[str, dict[str, Any]] = {
    "random": {},
    "shared_prefix": {"prefix_tokens": 1024, "turns": 1},
    "mixed_lengths": {"preset": "chat", "prompt": None, "output": None},
    "long_context": {"context_tokens": 32768},
}
# Log-normal length distributions (median, sigma of the log, clipped to [min, max]), the shapes of chat traffic
# (ShareGPT-like: short questions, answers of a few hundred tokens, a long tail) and of document processing (long
# inputs, short outputs: summaries, extraction).
PRESETS: dict[str, dict[str, dict[str, float]]] = {
    "chat": {"prompt": {"median": 256, "sigma": 0.8, "min": 16, "max": 2048},
             "output": {"median": 192, "sigma": 0.6, "min": 16, "max": 1024}},
    "document": {"prompt": {"median": 3072, "sigma": 0.5, "min": 512, "max": 8192},
                 "output": {"median": 256, "sigma": 0.5, "min": 32, "max": 1024}},
}
DIST_KEYS = ("median", "sigma", "min", "max")
ARRIVALS = ("closed", "poisson", "gamma", "constant")
LIMITS = {"tokens": 2 ** 20, "turns": 64, "rate": 1e5, "burstiness": (0.05, 100.0), "sigma": 3.0,
          "target_ms": 3.6e6}


class ProfileError(ValueError):
    """A profile, arrival or goodput setting that cannot be used, saying which and why."""


def make_prompt(seed: int, key: str, n_tokens: int, mode: str = "token_ids",
                id_range: Sequence[int] = DEFAULT_TOKEN_ID_RANGE) -> list[int] | str:
    """A fixed-seed prompt: the same (seed, key) gives the same prompt on every host and Python.

    ``token_ids`` gives exactly ``n_tokens`` IDs in [low, high); ``text`` gives ``n_tokens`` words
    (about that many tokens: the server's usage.prompt_tokens tells the exact count).
    """
    rng = random.Random(f"gpufleet/{seed}/{key}")
    if mode == "token_ids":
        low, high = int(id_range[0]), int(id_range[1])
        return [rng.randrange(low, high) for _i in range(n_tokens)]
    if mode == "text":
        return " ".join(rng.choice(WORDS) for _i in range(n_tokens))
    raise ValueError(f"prompt mode must be token_ids or text, got {mode!r}")


# ---- checking -------------------------------------------------------------------------------------
def _int(where: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ProfileError(f"{where} must be an integer from {low} to {high}, got {value!r}")
    return value


def _number(where: str, value: Any, low: float, high: float, low_open: bool = True) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value > high or value < low or (low_open and value == low):
        raise ProfileError(f"{where} must be a number {'above' if low_open else 'from'} {low:g} and at most "
                           f"{high:g}, got {value!r}")
    return float(value)


def _distribution(where: str, base: dict[str, float], given: Any) -> dict[str, Any]:
    """A length distribution: the preset's, with the keys ``given`` sets (median, sigma, min, max)."""
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise ProfileError(f"{where} must be a dict of {', '.join(DIST_KEYS)}, got {given!r}")
    unknown = sorted(set(given) - set(DIST_KEYS))
    if unknown:
        raise ProfileError(f"{where} has unknown keys {', '.join(map(str, unknown))}; known: {', '.join(DIST_KEYS)}")
    dist = dict(base, **given)
    out = {"min": _int(f"{where}.min", dist["min"], 1, LIMITS["tokens"]),
           "max": _int(f"{where}.max", dist["max"], 1, LIMITS["tokens"]),
           "median": _number(f"{where}.median", dist["median"], 1, LIMITS["tokens"], low_open=False),
           "sigma": _number(f"{where}.sigma", dist["sigma"], 0, LIMITS["sigma"], low_open=False)}
    if not out["min"] <= out["median"] <= out["max"]:
        raise ProfileError(f"{where} needs min <= median <= max, got min {out['min']}, median {out['median']:g}, "
                           f"max {out['max']}")
    out["median"] = int(out["median"]) if out["median"].is_integer() else out["median"]
    out["sigma"] = int(out["sigma"]) if out["sigma"].is_integer() else out["sigma"]
    return out


def check_profile(name: Any, options: Any = None) -> dict[str, Any]:
    """The profile's spec: ``{"name": name, ...its options with defaults}``; ProfileError naming the bad setting."""
    if name is None:
        name = "random"
    if name not in PROFILES:
        raise ProfileError(f"profile must be one of {', '.join(PROFILES)}, got {name!r}")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise ProfileError(f"profile_options must be a dict, got {options!r}")
    known = PROFILE_OPTIONS[name]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ProfileError(f"profile_options {', '.join(map(str, unknown))} do not apply to profile {name!r}; it takes "
                           f"{', '.join(known) or 'none'}")
    given = dict(known, **{k: v for k, v in options.items() if v is not None})
    spec: dict[str, Any] = {"name": name}
    if name == "shared_prefix":
        spec["prefix_tokens"] = _int("profile_options.prefix_tokens", given["prefix_tokens"], 1, LIMITS["tokens"])
        spec["turns"] = _int("profile_options.turns", given["turns"], 1, LIMITS["turns"])
    elif name == "mixed_lengths":
        preset = given["preset"]
        if preset not in PRESETS:
            raise ProfileError(f"profile_options.preset must be one of {', '.join(PRESETS)}, got {preset!r}")
        spec["preset"] = preset
        for part in ("prompt", "output"):
            spec[part] = _distribution(f"profile_options.{part}", PRESETS[preset][part], given[part])
    elif name == "long_context":
        spec["context_tokens"] = _int("profile_options.context_tokens", given["context_tokens"], 1, LIMITS["tokens"])
    return spec


def longest(spec: dict[str, Any], prompt_tokens: int, output_tokens: int) -> tuple[int, int]:
    """The longest prompt and the longest output any request of the profile can have."""
    name = spec["name"]
    if name == "shared_prefix":
        turns = spec["turns"]
        return spec["prefix_tokens"] + turns * prompt_tokens + (turns - 1) * output_tokens, output_tokens
    if name == "mixed_lengths":
        return spec["prompt"]["max"], spec["output"]["max"]
    if name == "long_context":
        return spec.get("prompt_tokens", spec["context_tokens"]), output_tokens
    return prompt_tokens, output_tokens


def fit_to_server(spec: dict[str, Any], prompt_tokens: int, output_tokens: int,
                  max_model_len: int | None) -> tuple[dict[str, Any], str]:
    """The spec for a server of ``max_model_len`` (None: not said) and a warning ('' if none); ProfileError when a
    request cannot fit.

    long_context prompts are capped at max_model_len - output_tokens (the spec records ``prompt_tokens`` sent and the
    ``context_tokens`` asked for, so a capped run is never compared with an uncapped one); every other profile must
    fit whole: its longest prompt and output (longest()) within max_model_len."""
    spec = dict(spec)
    if spec["name"] == "long_context":
        asked = spec["context_tokens"]
        spec["prompt_tokens"] = asked
        if max_model_len is None:
            return spec, (f"The server does not say its max_model_len in /v1/models: the long_context prompts of {asked} "
                          "tokens were not checked against it and may be rejected.")
        if asked + output_tokens <= max_model_len:
            return spec, ""
        capped = max_model_len - output_tokens
        if capped < 1:
            raise ProfileError(f"output_tokens {output_tokens} leaves no room for a prompt in the server's "
                               f"max_model_len {max_model_len}: lower output_tokens")
        spec["prompt_tokens"] = capped
        return spec, (f"long_context asked for {asked}-token prompts, but the server's max_model_len is {max_model_len}: "
                      f"the prompts were capped to {capped} tokens ({max_model_len} - {output_tokens} output). To measure "
                      f"{asked} tokens, start the server with --max-model-len {asked + output_tokens} or more (the "
                      f"model's own limit permitting). This result is a {capped}-token one and is compared only with "
                      "others capped the same way.")
    prompt, output = longest(spec, prompt_tokens, output_tokens)
    if max_model_len is not None and prompt + output > max_model_len:
        raise ProfileError(f"the {spec['name']} profile's longest request ({prompt} prompt + {output} output tokens = "
                           f"{prompt + output}) exceeds the server's max_model_len {max_model_len}: "
                           f"{_shorten_hint(spec)}, or raise --max-model-len")
    return spec, ""


def _shorten_hint(spec: dict[str, Any]) -> str:
    return {"shared_prefix": "lower prefix_tokens, turns, prompt_tokens or output_tokens",
            "mixed_lengths": "lower the distributions' max (profile_options.prompt.max, profile_options.output.max)",
            }.get(spec["name"], "shorten prompt_tokens or output_tokens")


# ---- the requests ---------------------------------------------------------------------------------
def _join(parts: list[Any], mode: str) -> list[int] | str:
    if mode == "text":
        return " ".join(parts)
    return [t for part in parts for t in part]


def _draw(rng: random.Random, dist: dict[str, Any]) -> int:
    value = rng.lognormvariate(math.log(dist["median"]), dist["sigma"]) if dist["sigma"] else dist["median"]
    return int(min(dist["max"], max(dist["min"], round(value))))


def lengths(spec: dict[str, Any], seed: int, key: str, n: int, prompt_tokens: int,
            output_tokens: int) -> list[tuple[int, int]]:
    """The (prompt tokens, max_tokens) of the run's ``n`` requests, without building the prompts."""
    name = spec["name"]
    if name == "mixed_lengths":
        out = []
        for i in range(n):
            rng = random.Random(f"gpufleet/{seed}/{key}/{i}/lengths")
            out.append((_draw(rng, spec["prompt"]), _draw(rng, spec["output"])))
        return out
    if name == "shared_prefix":
        convs = math.ceil(n / spec["turns"])
        return [(spec["prefix_tokens"] + (i // convs + 1) * prompt_tokens + (i // convs) * output_tokens, output_tokens)
                for i in range(n)]
    if name == "long_context":
        return [(spec.get("prompt_tokens", spec["context_tokens"]), output_tokens)] * n
    return [(prompt_tokens, output_tokens)] * n


def requests(spec: dict[str, Any], seed: int, key: str, n: int, prompt_tokens: int, output_tokens: int,
             mode: str = "token_ids", id_range: Sequence[int] = DEFAULT_TOKEN_ID_RANGE) -> list[tuple[Any, int]]:
    """The (prompt, max_tokens) of one run's ``n`` requests, keyed ``key`` (the run: ``c8/r0``): a function of the
    spec, ``seed`` and ``key`` only, so the same profile always sends the same requests.

    random: request i is make_prompt(seed, key/i) as the client always sent. shared_prefix: one prefix for every run
    of the seed (a system prompt: the warm-up requests compute it, as production traffic has), then request i's own
    suffix; with ``turns`` > 1 the run holds ceil(n / turns) conversations, sent turn by turn (every first turn, then
    every second one, ...), each turn the whole conversation so far (prefix, the earlier user turns and stand-in
    answers of ``output_tokens``) plus a new user turn. mixed_lengths: lengths(), then make_prompt(). long_context:
    prompts of the spec's ``prompt_tokens`` (fit_to_server()) or ``context_tokens``."""
    def prompt(k: str, size: int) -> Any:
        return make_prompt(seed, k, size, mode, id_range)

    name = spec["name"]
    sizes = lengths(spec, seed, key, n, prompt_tokens, output_tokens)
    if name != "shared_prefix":
        return [(prompt(f"{key}/{i}", p), o) for i, (p, o) in enumerate(sizes)]
    prefix = prompt("shared_prefix", spec["prefix_tokens"])
    if spec["turns"] == 1:
        return [(_join([prefix, prompt(f"{key}/{i}", prompt_tokens)], mode), output_tokens) for i in range(n)]
    convs = math.ceil(n / spec["turns"])
    out = []
    for i in range(n):
        conv, turn = i % convs, i // convs
        parts = [prefix]
        for j in range(turn + 1):
            parts.append(prompt(f"{key}/conv{conv}/user{j}", prompt_tokens))
            if j < turn:
                parts.append(prompt(f"{key}/conv{conv}/answer{j}", output_tokens))
        out.append((_join(parts, mode), output_tokens))
    return out


# ---- arrivals -------------------------------------------------------------------------------------
def check_arrivals(arrivals: Any) -> dict[str, Any]:
    """``{"mode": "closed"}``, ``{"mode": "poisson"|"gamma", "rate": r, "burstiness": b}`` or ``{"mode": "constant",
    "rate": r}``; ProfileError."""
    if arrivals is not None and not isinstance(arrivals, dict):
        raise ProfileError(f"arrivals must be a dict (mode, rate, burstiness), got {arrivals!r}")
    arrivals = dict(arrivals or {})
    mode = arrivals.get("mode") or "closed"
    if mode not in ARRIVALS:
        raise ProfileError(f"arrivals.mode must be one of {', '.join(ARRIVALS)}, got {mode!r}")
    unknown = sorted(set(arrivals) - {"mode", "rate", "burstiness"})
    if unknown:
        raise ProfileError(f"arrivals has unknown keys {', '.join(map(str, unknown))}; known: mode, rate, burstiness")
    if mode == "closed":
        if arrivals.get("rate") is not None or arrivals.get("burstiness") is not None:
            raise ProfileError("arrivals.rate and arrivals.burstiness apply to an open loop: set arrivals.mode to "
                               "poisson or gamma, or leave them out")
        return {"mode": "closed"}
    if arrivals.get("rate") is None:
        raise ProfileError(f"arrivals.mode {mode} needs arrivals.rate, the mean requests per second to send")
    rate = _number("arrivals.rate", arrivals["rate"], 0, LIMITS["rate"])
    low, high = LIMITS["burstiness"]
    burst = arrivals.get("burstiness")
    if mode in ("poisson", "constant"):
        if burst is not None and (mode == "constant" or burst != 1):
            raise ProfileError(f"arrivals.burstiness does not apply to {mode} arrivals ({'1' if mode == 'poisson' else 'no spread'}): "
                               "use mode gamma for another burstiness")
        if mode == "constant":
            return {"mode": mode, "rate": rate}
        burst = 1.0
    burst = _number("arrivals.burstiness", 1.0 if burst is None else burst, low, high, low_open=False)
    return {"mode": mode, "rate": rate, "burstiness": burst}


def arrival_offsets(arrivals: dict[str, Any], seed: int, key: str, n: int) -> list[float] | None:
    """Seconds from the run's start at which each of its ``n`` requests is sent (the first at 0), or None for a
    closed loop. Constant: every 1/``rate``. Otherwise gaps are gamma-distributed with shape ``burstiness`` and mean 1/``rate`` (shape 1: exponential,
    a Poisson process), drawn from a generator seeded by (seed, key): the same run always has the same schedule."""
    if arrivals.get("mode", "closed") == "closed":
        return None
    if arrivals["mode"] == "constant":
        return [i / arrivals["rate"] for i in range(n)]
    rng = random.Random(f"gpufleet/{seed}/{key}/arrivals")
    shape = arrivals["burstiness"]
    scale = 1.0 / (arrivals["rate"] * shape)
    out, now = [], 0.0
    for i in range(n):
        if i:
            now += rng.gammavariate(shape, scale)
        out.append(now)
    return out


# ---- goodput --------------------------------------------------------------------------------------
def check_goodput(targets: Any) -> dict[str, float]:
    """The latency targets a good request meets (``ttft_ms``, ``tpot_ms``; at least one), or {} for none."""
    if targets is not None and not isinstance(targets, dict):
        raise ProfileError(f"goodput must be a dict (ttft_ms, tpot_ms), got {targets!r}")
    targets = {k: v for k, v in dict(targets or {}).items() if v is not None}
    unknown = sorted(set(targets) - {"ttft_ms", "tpot_ms"})
    if unknown:
        raise ProfileError(f"goodput has unknown keys {', '.join(map(str, unknown))}; known: ttft_ms, tpot_ms")
    return {k: _number(f"goodput.{k}", targets[k], 0, LIMITS["target_ms"]) for k in sorted(targets)}


def goodput(results: Sequence[tuple[bool, int, float | None, float | None]], targets: dict[str, float],
            window: float) -> dict[str, Any]:
    """Goodput of one run: ``results`` is (ok, output tokens, TTFT s, TPOT s) per request sent; a request is good
    when it succeeded and met every target (a one-token answer has no TPOT and meets that target). The share is
    of every request sent (a failed one is not good); goodput tok/s is the good requests' output tokens over the
    run's window, as output tok/s is all of them."""
    good = 0
    tokens = 0
    for ok, out_tokens, ttft, tpot in results:
        if not ok:
            continue
        if "ttft_ms" in targets and (ttft is None or ttft * 1000.0 > targets["ttft_ms"]):
            continue
        if "tpot_ms" in targets and tpot is not None and tpot * 1000.0 > targets["tpot_ms"]:
            continue
        good += 1
        tokens += out_tokens
    window = max(window, 1e-9)
    sent = len(results)
    return {"targets": dict(targets), "good_requests": good, "requests": sent,
            "good_share": round(good / sent, 5) if sent else None, "goodput_tps": round(tokens / window, 3),
            "request_goodput": round(good / window, 4)}


def arrival_stats(starts: Sequence[float], schedule: Sequence[float], arrivals: dict[str, Any]) -> dict[str, Any]:
    """How an open-loop run kept its schedule: the target and achieved send rates (requests after the first over the
    time from the first send to the last) and each request's lag behind its planned send time, in ms (the first
    request's send is the run's time 0). A lag that grows means the concurrency cap or the client held requests
    back: the run was partly a closed loop."""
    n = min(len(starts), len(schedule))
    lags = [max(0.0, (starts[i] - starts[0]) - schedule[i]) * 1000.0 for i in range(n)] if n else []
    span = (max(starts[:n]) - starts[0]) if n > 1 else 0.0
    ordered = sorted(lags)
    return {"mode": arrivals["mode"], "target_rate": arrivals["rate"], "burstiness": arrivals.get("burstiness"),
            "achieved_rate": round((n - 1) / span, 4) if span > 0 else None,
            "lag_p50_ms": round(ordered[len(ordered) // 2], 3) if ordered else None,
            "lag_max_ms": round(ordered[-1], 3) if ordered else None}

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Output equivalence, what the module executes (``execute()``): the HTTP calls (through bench/transport.py's seam), the
record and compare runs, and the reference file written atomically through the host's files (_host/files.py HostFS).
The scoring is bench/equivalence.py's.

Requests go one at a time, so the server runs every prompt at batch 1 in record and compare alike (batch shape changes
the arithmetic of a real engine). Per prompt: a greedy generation (temperature 0, a fixed seed, ``ignore_eos``, the
generated token IDs and their logprobs) and a teacher-forced scoring of the reference continuation (the prompt's and
the reference's token IDs as the prompt, ``prompt_logprobs``).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import equivalence as oe
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.transport import (
    ConnectionPool, ProtocolError, connect_error_text, http_json, parse_endpoint,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.prompts import PROMPT_SET_ID, digest, select

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host

# Option bounds, defined once: (low, high) inclusive.
BOUNDS = {"max_tokens": (1, 1024), "seed": (0, 2 ** 31 - 1), "timeout": (1.0, 3600.0), "tolerance_top1": (0.0, 1.0),
          "tolerance_mean_logprob": (0.0, 100.0), "tolerance_p99_logprob": (0.0, 100.0), "aa_margin_top1": (0.0, 1.0),
          "aa_margin_logprob": (0.0, 100.0)}


@dataclass
class Settings:
    """The module's options (their defaults are the module's, defined once in its argument_spec)."""
    url: str
    model: str
    api_key: str | None
    mode: str
    reference: str
    max_tokens: int
    seed: int
    lengths: list[str]
    timeout: float
    tolerance: dict
    aa_margin_top1: float
    aa_margin_logprob: float
    validate_certs: bool
    overwrite: bool


def check_settings(s: Settings) -> None:
    """Validate every option before any request or write."""
    for name, (low, high) in BOUNDS.items():
        value = s.tolerance.get(name[len("tolerance_"):]) if name.startswith("tolerance_") else getattr(s, name)
        if value is not None and not low <= value <= high:
            raise oe.EquivalenceError(f"{name} must be between {low:g} and {high:g}, got {value!r}")
    if not s.model.strip():
        raise oe.EquivalenceError("model must name the served model (the server's --served-model-name)")
    if not s.reference.startswith("/") or "\0" in s.reference:
        raise oe.EquivalenceError(f"reference must be an absolute path on the host, got {s.reference!r}")
    if not s.lengths or any(x not in ("short", "medium", "long") for x in s.lengths):
        raise oe.EquivalenceError(f"prompt_lengths must be a non-empty list of short, medium, long; got {s.lengths!r}")
    try:
        parse_endpoint(s.url)
    except ValueError as err:
        raise oe.EquivalenceError(f"url {s.url!r} is not usable: {err}") from None


def tolerance_limits(tolerance: dict) -> dict:
    return {"top1_agreement_min": tolerance["top1"], "mean_abs_logprob_diff_max": tolerance["mean_logprob"],
            "p99_abs_logprob_diff_max": tolerance["p99_logprob"]}


class Client:
    """One keep-alive connection pool to the server; every call bounded by the timeout, every failure an
    EquivalenceError that names the server and the prompt."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        endpoint = parse_endpoint(s.url)
        context = None
        if endpoint.scheme == "https":
            context = ssl.create_default_context()
            if not s.validate_certs:
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        self.pool = ConnectionPool(endpoint, context)
        self.headers = {"Authorization": f"Bearer {s.api_key}"} if s.api_key else {}

    async def call(self, method: str, path: str, body: dict | None, what: str):
        try:
            status, answer, error = await asyncio.wait_for(http_json(self.pool, method, path, self.headers, body), self.s.timeout)
        except asyncio.TimeoutError:
            raise oe.EquivalenceError(f"{what}: the server at {self.s.url} gave no answer in {self.s.timeout:g} s "
                                      "(raise timeout, or check that the server is not overloaded)") from None
        except (OSError, asyncio.IncompleteReadError, ProtocolError, ssl.SSLError) as err:
            raise oe.EquivalenceError(f"{what}: cannot reach the server at {self.s.url} ({connect_error_text(err)}); check "
                                      "that it runs and that url names its scheme, host and port") from None
        if status in (401, 403):
            raise oe.EquivalenceError(f"{what}: the server at {self.s.url} refused the API key ({error}); set api_key")
        if error:
            raise oe.EquivalenceError(f"{what}: the server at {self.s.url} refused the request: {error}")
        return answer

    async def served(self) -> dict:
        """The /v1/models entry of the model; EquivalenceError if the server does not serve it."""
        answer = await self.call("GET", "/v1/models", None, "GET /v1/models")
        entries = answer.get("data") if isinstance(answer, dict) else None
        names = [e.get("id") for e in entries or [] if isinstance(e, dict)]
        for entry in entries or []:
            if isinstance(entry, dict) and entry.get("id") == self.s.model:
                return entry
        raise oe.EquivalenceError(f"the server at {self.s.url} does not serve model {self.s.model!r} (it serves "
                                  f"{', '.join(map(str, names)) or 'nothing'}); set model to its --served-model-name")

    async def generate(self, prompt: dict, max_tokens: int, seed: int) -> dict:
        where = f"prompt {prompt['id']}"
        body = {"model": self.s.model, "prompt": prompt["text"], "max_tokens": max_tokens, "temperature": 0.0,
                "seed": seed, "logprobs": 1, "ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True}
        try:
            answer = await self.call("POST", "/v1/completions", body, f"{where} ({len(prompt['text'].split())} words, {prompt['kind']})")
        except oe.EquivalenceError as err:
            if prompt["length"] != "long":
                raise
            raise oe.EquivalenceError(f"{err}. The long prompts need a context of about 4.5k tokens: raise the server's "
                                      "--max-model-len, or leave them out with prompt_lengths: [short, medium]") from None
        parsed = oe.parse_generation(_choice(answer), f"{where}, generation")
        if len(parsed["token_ids"]) != max_tokens:
            raise oe.EquivalenceError(f"{where}: the server generated {len(parsed['token_ids'])} tokens, not {max_tokens} "
                                      "(it ignores ignore_eos or stops early)")
        return parsed

    async def score(self, entry: dict, seed: int) -> list[tuple[float, int]]:
        where = f"prompt {entry['id']}"
        body = {"model": self.s.model, "prompt": entry["prompt_token_ids"] + entry["token_ids"], "max_tokens": 1,
                "temperature": 0.0, "seed": seed, "prompt_logprobs": 1}
        answer = await self.call("POST", "/v1/completions", body, f"{where}, teacher-forced scoring")
        return oe.parse_scores(_choice(answer), len(entry["prompt_token_ids"]), entry["token_ids"], f"{where}, scoring")

    def close(self) -> None:
        self.pool.close()


def _choice(answer) -> dict | None:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    return choices[0] if isinstance(choices, list) and choices else None


async def _against(client: Client, entries: list[dict], prompts: dict, sampling: dict) -> list[dict]:
    """Score a server against reference entries: a greedy generation (the first divergence, and the tokenization
    checked) and the teacher-forced scores of the reference tokens, per prompt."""
    out = []
    for entry in entries:
        greedy = await client.generate(prompts[entry["id"]], sampling["max_tokens"], sampling["seed"])
        if greedy["prompt_token_ids"] != entry["prompt_token_ids"]:
            raise oe.EquivalenceError(f"prompt {entry['id']}: the server tokenizes the prompt differently from the "
                                      "reference (another tokenizer, so another model): record a reference for it")
        out.append(oe.prompt_figures(entry, await client.score(entry, sampling["seed"]), greedy["token_ids"]))
    return out


async def _record(client: Client, s: Settings, served: dict) -> dict:
    prompts = select(s.lengths)
    entries = []
    for prompt in prompts:
        gen = await client.generate(prompt, s.max_tokens, s.seed)
        entries.append({"id": prompt["id"], "length": prompt["length"], "kind": prompt["kind"], **gen})
    sampling = {"temperature": 0.0, "seed": s.seed, "max_tokens": s.max_tokens, "ignore_eos": True}
    per_prompt = await _against(client, entries, {p["id"]: p for p in prompts}, sampling)
    aa = oe.overall(per_prompt)
    return {"format": oe.REFERENCE_FORMAT, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "url": s.url, "model": s.model, "root": served.get("root"), "max_model_len": served.get("max_model_len"),
            "prompt_set": {"id": PROMPT_SET_ID, "sha256": digest(prompts), "lengths": s.lengths},
            "sampling": sampling, "aa": aa, "aa_per_prompt": [_public(p) for p in per_prompt],
            "band": oe.band_from_aa(aa, s.aa_margin_top1, s.aa_margin_logprob), "prompts": entries}


def _public(fig: dict) -> dict:
    return {k: v for k, v in fig.items() if k != "diffs"}


def read_reference(fs: HostFS, path: str) -> dict:
    text = fs.read_exact(path)
    if text is None:
        raise oe.EquivalenceError(f"reference {path} does not exist: record one first (mode=record) against the server "
                                  "before the change")
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise oe.EquivalenceError(f"reference {path} is not JSON ({err}); record it again") from None
    doc = oe.check_reference(doc, path)
    prompts = select(doc["prompt_set"].get("lengths", []))
    if doc["prompt_set"].get("id") != PROMPT_SET_ID or doc["prompt_set"].get("sha256") != digest(prompts):
        raise oe.EquivalenceError(f"reference {path} was recorded with prompt set {doc['prompt_set'].get('id')!r}, this "
                                  f"collection ships {PROMPT_SET_ID!r} with other text; record the reference again")
    return doc


async def _compare(client: Client, s: Settings, served: dict, doc: dict) -> dict:
    oe.check_same_model(doc, s.reference, s.model, served.get("root"))
    prompts = {p["id"]: p for p in select(doc["prompt_set"]["lengths"])}
    per_prompt = await _against(client, doc["prompts"], prompts, doc["sampling"])
    figures = oe.overall(per_prompt)
    verdict, reason = oe.verdict(figures, doc["band"], tolerance_limits(s.tolerance))
    return {"verdict": verdict, "reason": reason, "figures": figures, "per_prompt": [_public(p) for p in per_prompt],
            "band": doc["band"], "aa": doc["aa"], "tolerance": tolerance_limits(s.tolerance)}


async def _session(s: Settings, fs: HostFS, check_mode: bool) -> dict:
    client = Client(s)
    try:
        served = await client.served()
        if s.mode == "compare":
            return await _compare(client, s, served, read_reference(fs, s.reference))
        if fs.exists(s.reference) and not s.overwrite:
            return {"verdict": None, "kept": True, "actions": [],
                    "reason": f"reference {s.reference} exists and overwrite is false: kept as it is"}
        action = {"action": "write", "path": s.reference, "model": s.model}
        if check_mode:
            return {"verdict": None, "actions": [action], "reason": "check mode: nothing recorded or written"}
        doc = await _record(client, s, served)
        fs.write_atomic(s.reference, json.dumps(doc, sort_keys=True) + "\n", 0o644)
        return {"verdict": None, "reason": f"recorded {len(doc['prompts'])} prompts; the A/A against the same server is "
                                           "the band stored with them", "figures": doc["aa"],
                "per_prompt": doc["aa_per_prompt"], "band": doc["band"], "aa": doc["aa"], "actions": [action]}
    finally:
        client.close()


def band_warning(band: dict, tolerance: dict) -> str | None:
    """A warning when the A/A band reaches beyond the tolerance somewhere: there, nothing can be ``drifted``."""
    wider = [name for name, value in band.items()
             if (value < tolerance[name] if name.endswith("_min") else value > tolerance[name])]
    if not wider:
        return None
    return (f"the A/A band is wider than the tolerance in {', '.join(wider)}: this server's own run-to-run spread "
            "exceeds what the tolerance allows a change, so a change within the spread is equivalent and one beyond "
            "it diverged (never drifted); loosen the tolerance or find the source of the spread (docs/benchmark.md)")


def run(s: Settings, fs: HostFS, check_mode: bool, warn) -> dict:
    """The module's whole run: validate, then record or compare; the result for exit_json (``warn`` for warnings)."""
    check_settings(s)
    result = asyncio.run(_session(s, fs, check_mode))
    if result.get("band"):
        message = band_warning(result["band"], tolerance_limits(s.tolerance))
        if message:
            warn(message)
    result.setdefault("actions", [])
    result["changed"] = bool(result["actions"])
    result.update({"mode": s.mode, "reference": s.reference, "model": s.model})
    return result


def settings(params: dict) -> Settings:
    """The Settings of the module's options."""
    return Settings(url=params["url"], model=params["model"], api_key=params["api_key"], mode=params["mode"],
                    reference=params["reference"], max_tokens=params["max_tokens"], seed=params["seed"],
                    lengths=params["prompt_lengths"], timeout=params["timeout"], validate_certs=params["validate_certs"],
                    overwrite=params["overwrite"], aa_margin_top1=params["aa_margin_top1"],
                    aa_margin_logprob=params["aa_margin_logprob"],
                    tolerance={"top1": params["tolerance_top1"], "mean_logprob": params["tolerance_mean_logprob"],
                               "p99_logprob": params["tolerance_p99_logprob"]})


def execute(params: dict, host: Host, check_mode: bool) -> dict:
    """What gpufleet.inference.output_equivalence executes: run() over the module's options, the reference file under
    the host's root, warnings as the task's."""
    return run(settings(params), host.fs, check_mode, host.warn)

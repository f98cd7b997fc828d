# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fixed prompt set of the output-equivalence check (docs/benchmark.md, "Output equivalence").

64 prompts: 32 short, 28 medium and 4 long (about 2-3k words, 2-4k tokens with a BPE tokenizer); completion prompts
and chat-shaped ones (a system line and user/assistant turns rendered as plain text, so that both go through
/v1/completions and can be scored teacher-forced with ``prompt_logprobs``: the chat endpoint cannot echo or score a
given continuation). The text is generated here, at import, from a seeded word list by a SHA-256 counter: the data
ships inside this module_utils file (Ansible sends it with the module, so it is in the Galaxy tarball and on the host
without a data file), and the same code gives the same 64 prompts on every Python. ``PROMPT_SET_SHA256`` pins the
text: a unit test fails if the generator or the word list changes without a new ``PROMPT_SET_ID`` (a reference
recorded with another set is refused by the comparison).
"""

from __future__ import annotations

import hashlib
import json

PROMPT_SET_ID = "gpufleet-equiv-1"
LENGTHS = ("short", "medium", "long")

WORDS = """
the of and to in is that for it as with was on be by at this from or have an they which one you were her all she
there would their we him been has when who will more no if out so said what up its about into than them can only
other new some could time these two may then do first any my now such like our over man me even most made after also
did many before must through back years where much your way well down should because each just those people how too
little state good very make world still own see men work long get here between both life being under never day same
another know while last might us great old year off come since against go came right used take three river mountain
harbor lantern engine valley signal bridge orchard winter summer garden market station letter window forest island
measure careful quiet bright narrow gentle distant heavy early late ancient modern simple steady silver golden
wooden stone copper paper water light sound voice story answer question reason pattern number system method result
""".split()

SYSTEM = "System: You are a careful assistant. Answer plainly and completely."
# (length class, kind, how many, words from, words to)
LAYOUT = (("short", "completion", 18, 12, 40), ("short", "chat", 14, 12, 40),
          ("medium", "completion", 14, 120, 480), ("medium", "chat", 14, 120, 480),
          ("long", "completion", 2, 2000, 2800), ("long", "chat", 2, 2000, 2800))


class _Stream:
    """Deterministic integers from SHA-256 over (seed, counter): the same on every platform and Python."""

    def __init__(self, seed: str) -> None:
        self.seed = seed.encode("utf-8")
        self.counter = 0

    def below(self, n: int) -> int:
        self.counter += 1
        digest = hashlib.sha256(self.seed + self.counter.to_bytes(8, "big")).digest()
        return int.from_bytes(digest[:8], "big") % n

    def between(self, low: int, high: int) -> int:
        return low + self.below(high - low + 1)


def _sentences(stream: _Stream, nwords: int) -> str:
    """About ``nwords`` words as sentences of 6-14 words."""
    out: list[str] = []
    left = nwords
    while left > 0:
        size = min(left, stream.between(6, 14))
        words = [WORDS[stream.below(len(WORDS))] for _i in range(size)]
        out.append(words[0].capitalize() + " " + " ".join(words[1:]) + "." if size > 1 else words[0].capitalize() + ".")
        left -= size
    return " ".join(out)


def _chat(stream: _Stream, nwords: int) -> str:
    """A chat-shaped prompt: the system line, user and assistant turns, ending on the assistant's cue."""
    turns = 1 if nwords < 100 else 3
    per = max(6, nwords // (2 * turns - 1))
    lines = [SYSTEM]
    for turn in range(turns):
        lines.append("User: " + _sentences(stream, per))
        if turn < turns - 1:
            lines.append("Assistant: " + _sentences(stream, per))
    lines.append("Assistant:")
    return "\n".join(lines)


def _build() -> list[dict]:
    prompts = []
    for length, kind, count, low, high in LAYOUT:
        for index in range(count):
            pid = f"{length}-{kind}-{index:02d}"
            stream = _Stream(f"{PROMPT_SET_ID}/{pid}")
            nwords = stream.between(low, high)
            text = _chat(stream, nwords) if kind == "chat" else _sentences(stream, nwords)
            prompts.append({"id": pid, "length": length, "kind": kind, "text": text})
    return prompts


PROMPTS: list[dict] = _build()


def digest(prompts: list[dict]) -> str:
    """SHA-256 of the prompts' ids and texts, as stored in a reference."""
    return hashlib.sha256(json.dumps([[p["id"], p["text"]] for p in prompts], separators=(",", ":")).encode("utf-8")).hexdigest()


PROMPT_SET_SHA256 = digest(PROMPTS)


def select(lengths: list[str]) -> list[dict]:
    """The prompts of the given length classes, in the set's order."""
    return [p for p in PROMPTS if p["length"] in lengths]

# A word-level tokenizer that really encodes, for the random-weight models made on the device (make_qwen7b.py,
# make_dsv2lite.py). IDs 3.. are the words w3 .. w<V-1>, except the top of the range, which holds every word and
# punctuation mark of the collection's output-equivalence prompt set (plugins/module_utils/bench/prompts.py), so
# that the module's text prompts encode to real IDs (no <unk>) and random token-ID prompts still decode.
# The tokenizer goes into a folder of its own WITHOUT config.json and is passed to vLLM with --tokenizer: loaded from
# the model folder, under model_type qwen2, transformers makes it a Qwen2Tokenizer that encodes every word to nothing.
# check() loads it the way vLLM does (AutoTokenizer from the folder) and refuses a tokenizer that does not round-trip
# IDs or that maps any prompt-set word to <unk>.
from __future__ import annotations

import os
import re
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

SPECIALS = ["<unk>", "<s>", "</s>"]
ROUNDTRIP = "w5 w77 w31999 w100000"   # IDs every vocabulary here holds as wN (the prompt words sit above 101000)
SPLIT = re.compile(r"\w+|[^\w\s]")     # what WhitespaceSplit + Punctuation(isolated) cut a text into


def prompt_set() -> list[dict]:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "..", "plugins", "module_utils", "bench"))
    import prompts  # the module_utils file is plain Python (hashlib, json): importable without Ansible
    return prompts.PROMPTS


def prompt_words() -> list[str]:
    return sorted({w for p in prompt_set() for w in SPLIT.findall(p["text"])})


def make(folder: str, vocab_size: int, max_len: int) -> dict:
    words = prompt_words()
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    top = vocab_size - len(words)
    vocab.update({f"w{i}": i for i in range(len(SPECIALS), top)})
    vocab.update({w: top + j for j, w in enumerate(words)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins the words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.model_max_length = max_len
    fast.save_pretrained(folder)
    assert not os.path.exists(os.path.join(folder, "config.json")), "the tokenizer folder must not hold a config.json"
    return check(folder, top)


def check(folder: str, first_word_id: int) -> dict:
    loaded = AutoTokenizer.from_pretrained(folder)
    ids = loaded(ROUNDTRIP, add_special_tokens=False).input_ids
    back = loaded.decode(ids)
    unk = loaded.convert_tokens_to_ids("<unk>")
    texts = prompt_set()
    counts = [len(loaded(p["text"], add_special_tokens=False).input_ids) for p in texts]
    unknown = sum(loaded(p["text"], add_special_tokens=False).input_ids.count(unk) for p in texts)
    out = {"tokenizer_class": type(loaded).__name__, "prompt": ROUNDTRIP, "ids": ids, "decoded": back,
           "prompt_set_words": len(prompt_words()), "first_word_id": first_word_id,
           "prompt_set_tokens": {"min": min(counts), "max": max(counts), "sum": sum(counts)}, "prompt_set_unknown": unknown}
    out["ok"] = ids == [5, 77, 31999, 100000] and back == ROUNDTRIP and unknown == 0 and min(counts) > 0
    return out

# A random-weight model with DeepSeek-R1-Distill-Qwen-7B's architecture, and a word-level tokenizer that encodes.
#   python3 make_qwen7b.py MODEL_DIR TOKENIZER_DIR     (on the device: about 30 s, 15 GB of safetensors)
# Qwen2ForCausalLM: hidden 3584, intermediate 18944, 28 layers, 28 heads, 4 KV heads, vocab 152064, bf16, rope theta
# 10000, tied embeddings off (the distill's config.json). Weights are random (std 0.02): the figures are the
# architecture's speed, never a model's quality.
# The tokenizer (wordtok.py) goes into its own folder WITHOUT config.json and is passed to vLLM with --tokenizer; its
# vocabulary covers every model ID (w3 .. and, at the top, the words of the collection's output-equivalence prompt
# set), so random token-ID prompts decode and the prompt set's text encodes. The script ends non-zero unless the
# tokenizer, loaded the way vLLM loads it, round-trips IDs and encodes every prompt-set word.
import json
import os
import sys
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wordtok  # noqa: E402

OUT, TOK = sys.argv[1], sys.argv[2]
V = 152064
t0 = time.time()
check = wordtok.make(TOK, V, 4096)
print("tokenizer round trip", json.dumps(check))
if not check["ok"]:
    sys.exit("tokenizer round trip failed: refusing to make a model nobody can benchmark")

cfg = Qwen2Config(vocab_size=V, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                  num_key_value_heads=4, max_position_embeddings=131072, max_window_layers=28, rope_theta=10000.0,
                  rms_norm_eps=1e-6, sliding_window=None, use_sliding_window=False, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16", initializer_range=0.02)
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = Qwen2ForCausalLM(cfg)
n = sum(p.numel() for p in model.parameters())
model.save_pretrained(OUT, safe_serialization=True, max_shard_size="5GB")
size = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
summary = {"architecture": "Qwen2ForCausalLM", "parameters": n, "bytes": size, "files": sorted(os.listdir(OUT)),
           "seconds": round(time.time() - t0, 1), "tokenizer": check,
           "config": {k: getattr(cfg, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                   "num_attention_heads", "num_key_value_heads", "vocab_size")}}
with open(os.path.join(OUT, "..", os.path.basename(OUT.rstrip("/")) + ".made.json"), "w", encoding="utf-8") as fh:
    json.dump(summary, fh, indent=1)
print("model", json.dumps(summary))

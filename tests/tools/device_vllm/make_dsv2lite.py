# DeepSeek-V2-Lite's architecture at full depth, for vLLM's --load-format dummy (random weights drawn by vLLM at
# load: no 31 GB of safetensors to write), and a word-level tokenizer that encodes (wordtok.py).
#   python3 make_dsv2lite.py MODEL_DIR TOKENIZER_DIR     (seconds; needs the image's transformers and tokenizers)
# DeepseekV2ForCausalLM as in DeepSeek-V2-Lite's config.json (without its auto_map: vLLM and transformers carry the
# architecture): hidden 2048, 27 layers (the first dense, intermediate 10944), MLA with kv_lora_rank 512, no q LoRA,
# qk_nope 128 + qk_rope 64, v 128, 16 heads; MoE from layer 1: 64 routed experts of 1408, 6 per token, 2 shared,
# greedy top-k, softmax scoring; YaRN rope (factor 40 over 4096); vocab 102400; bf16. 15.7 B parameters, 2.7 B
# active per token (embeddings and head counted; parameters() below). The figures measured on it are the
# architecture's speed, never a model's quality.
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wordtok  # noqa: E402

CONFIG = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "torch_dtype": "bfloat16",
    "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
    "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
    "n_shared_experts": 2, "n_routed_experts": 64, "num_experts_per_tok": 6, "routed_scaling_factor": 1.0,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
    "norm_topk_prob": False, "scoring_func": "softmax", "aux_loss_alpha": 0.001, "seq_aux": True,
    "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "attention_bias": False, "attention_dropout": 0.0,
    "max_position_embeddings": 163840, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "use_cache": True, "initializer_range": 0.02,
}


def parameters(c: dict) -> dict:
    """Parameter counts from the config (embeddings, MLA attention, dense and MoE MLPs, norms, head)."""
    h, L, nh = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    attn = (h * nh * qk + h * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) + c["kv_lora_rank"]
            + c["kv_lora_rank"] * nh * (c["qk_nope_head_dim"] + c["v_head_dim"]) + nh * c["v_head_dim"] * h)
    dense = 3 * h * c["intermediate_size"]
    expert = 3 * h * c["moe_intermediate_size"]
    moe = (c["n_routed_experts"] + c["n_shared_experts"]) * expert + h * c["n_routed_experts"]
    active = (c["num_experts_per_tok"] + c["n_shared_experts"]) * expert
    k = c["first_k_dense_replace"]
    emb = 2 * c["vocab_size"] * h
    total = emb + L * (attn + 2 * h) + k * dense + (L - k) * moe + h
    act = emb + L * (attn + 2 * h) + k * dense + (L - k) * active + h
    return {"total": total, "active_per_token": act}


def main() -> int:
    out, tok = sys.argv[1], sys.argv[2]
    t0 = time.time()
    check = wordtok.make(tok, CONFIG["vocab_size"], 4096)
    print("tokenizer round trip", json.dumps(check))
    if not check["ok"]:
        sys.exit("tokenizer round trip failed: refusing to make a model nobody can benchmark")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(CONFIG, fh, indent=1)
    from transformers import AutoConfig  # the config must load as vLLM will load it
    loaded = AutoConfig.from_pretrained(out)
    shown = ("hidden_size", "num_hidden_layers", "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
             "kv_lora_rank", "vocab_size")
    summary = {"architecture": CONFIG["architectures"][0], "config_class": type(loaded).__name__,
               "parameters": parameters(CONFIG), "weights": "vLLM --load-format dummy", "seconds": round(time.time() - t0, 1),
               "tokenizer": check, "config": {k: CONFIG[k] for k in shown}}
    with open(os.path.join(out, "..", os.path.basename(out.rstrip("/")) + ".made.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    print("model", json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Writes a benchmark checkpoint of a given shape with random bf16 weights,
fast (PyTorch on the GPU draws them; `agentkv model synth` draws them on one
CPU core, minutes for 8B parameters). The config and tokenizer come from a
tiny `agentkv model synth` checkpoint of the same architecture (TEMPLATE), so
every field agentkv reads is as synth writes it; only the shape changes.

  python3 tools/device/synth_shape.py --template /tmp/tiny --out /tmp/llama1b \
      --layers 16 --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 8 \
      --vocab 128256 [--tie|--no-tie]
"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file

ap = argparse.ArgumentParser()
ap.add_argument("--template", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--layers", type=int, required=True)
ap.add_argument("--hidden", type=int, required=True)
ap.add_argument("--intermediate", type=int, required=True)
ap.add_argument("--heads", type=int, required=True)
ap.add_argument("--kv-heads", type=int, required=True)
ap.add_argument("--head-dim", type=int, default=0)
ap.add_argument("--vocab", type=int, required=True)
ap.add_argument("--tie", dest="tie", action="store_true", default=True)
ap.add_argument("--no-tie", dest="tie", action="store_false")
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()

os.makedirs(a.out, exist_ok=True)
for f in os.listdir(a.template):
    if f.endswith(".json") and f != "config.json" and "index" not in f:
        shutil.copy(os.path.join(a.template, f), a.out)
cfg = json.load(open(os.path.join(a.template, "config.json")))
D = a.head_dim or a.hidden // a.heads
cfg.update(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
           num_hidden_layers=a.layers, num_attention_heads=a.heads,
           num_key_value_heads=a.kv_heads, head_dim=D, tie_word_embeddings=a.tie,
           max_position_embeddings=max(cfg.get("max_position_embeddings", 0), 32768))
if "max_window_layers" in cfg:
    cfg["max_window_layers"] = a.layers
json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)

dev = "cuda" if torch.cuda.is_available() else "cpu"
g = torch.Generator(device=dev).manual_seed(a.seed)
qk_norm = cfg.get("model_type") in ("qwen3", "gemma3_text")


def rnd(*shape, scale=0.02):
    return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * scale).to(
        torch.bfloat16).cpu()


def ones(n):
    return torch.ones(n, dtype=torch.bfloat16)


H, I, nq, nkv = a.hidden, a.intermediate, a.heads * D, a.kv_heads * D
t = {"model.embed_tokens.weight": rnd(a.vocab, H), "model.norm.weight": ones(H)}
if not a.tie:
    t["lm_head.weight"] = rnd(a.vocab, H)
for l in range(a.layers):
    p = f"model.layers.{l}."
    t[p + "input_layernorm.weight"] = ones(H)
    t[p + "post_attention_layernorm.weight"] = ones(H)
    t[p + "self_attn.q_proj.weight"] = rnd(nq, H)
    t[p + "self_attn.k_proj.weight"] = rnd(nkv, H)
    t[p + "self_attn.v_proj.weight"] = rnd(nkv, H)
    t[p + "self_attn.o_proj.weight"] = rnd(H, nq)
    if qk_norm:
        t[p + "self_attn.q_norm.weight"] = ones(D)
        t[p + "self_attn.k_norm.weight"] = ones(D)
    t[p + "mlp.gate_proj.weight"] = rnd(I, H)
    t[p + "mlp.up_proj.weight"] = rnd(I, H)
    t[p + "mlp.down_proj.weight"] = rnd(H, I)
save_file(t, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
n = sum(v.numel() for v in t.values())
print(f"wrote {a.out}: {n / 1e9:.2f}B parameters")

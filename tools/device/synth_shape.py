#!/usr/bin/env python3
"""Writes a benchmark checkpoint of a given shape with random weights, fast
(PyTorch on the GPU draws and quantizes them; `agentkv model synth` draws them
on one CPU core, minutes for 8B parameters). The config and tokenizer come
from a tiny `agentkv model synth` checkpoint of the same architecture
(TEMPLATE), so every field agentkv reads is as synth writes it; only the
shape (and the quantization) changes.

  python3 tools/device/synth_shape.py --template /tmp/tiny --out /tmp/llama1b \\
      --layers 16 --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 8 \\
      --vocab 128256 [--tie|--no-tie]

Architectures (the template's model_type): dense (llama, qwen2, qwen3,
mistral, gemma3_text), gpt_oss and qwen3_moe (--experts, --experts-per-token,
--moe-intermediate for qwen3_moe; gpt_oss's experts use --intermediate).

--quant stores weights as published checkpoints do:
  fp8    e4m3 with 128x128 block scales (`X.weight` F8_E4M3 and
         `X.weight_scale_inv` F32): attention and MLP / expert projections;
         never embeddings, norms, routers or the LM head (dense, qwen3_moe).
  mxfp4  GPT-OSS's experts as `*_blocks` / `*_scales` U8, [out, in] order,
         gate and up rows interleaved; the rest bf16 (gpt_oss).
  fp8-experts  fp8 as above for qwen3_moe's experts only, attention bf16
         (config: modules_to_not_convert self_attn): the experts' share of
         an fp8 model's time, apart.

--preset fills the shapes of bench/RESULTS.md's quantized rows (explicit
flags override): gpt-oss-20b (MXFP4 experts), qwen3-30b-a3b (FP8),
qwen3-8b (FP8).

--dry-run lists what would be written (tensor bytes, file size, bytes one
decode step reads) without writing; it needs neither torch nor numpy, nor
the template unless given.
"""
import argparse
import json
import math
import os
import shutil

from quant_pack import BLOCK, MX, cdiv, quantization_config  # this folder (plain Python)

PRESETS = {
    "gpt-oss-20b": dict(arch="gpt_oss", layers=24, hidden=2880, intermediate=2880, heads=64,
                        kv_heads=8, head_dim=64, vocab=201088, experts=32,
                        experts_per_token=4, tie=False, quant="mxfp4"),
    "qwen3-30b-a3b": dict(arch="qwen3_moe", layers=48, hidden=2048, intermediate=6144,
                          heads=32, kv_heads=4, head_dim=128, vocab=151936, experts=128,
                          experts_per_token=8, moe_intermediate=768, tie=False, quant="fp8"),
    "qwen3-8b": dict(arch="qwen3", layers=36, hidden=4096, intermediate=12288, heads=32,
                     kv_heads=8, head_dim=128, vocab=151936, tie=False, quant="fp8"),
}
DENSE = ("llama", "qwen2", "qwen3", "mistral", "gemma3_text")

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--template", help="tiny `agentkv model synth` checkpoint (not for --dry-run)")
ap.add_argument("--out")
ap.add_argument("--preset", choices=sorted(PRESETS))
ap.add_argument("--arch", help="model_type; default: the template's")
ap.add_argument("--layers", type=int)
ap.add_argument("--hidden", type=int)
ap.add_argument("--intermediate", type=int)
ap.add_argument("--heads", type=int)
ap.add_argument("--kv-heads", type=int)
ap.add_argument("--head-dim", type=int, default=0)
ap.add_argument("--vocab", type=int)
ap.add_argument("--experts", type=int)
ap.add_argument("--experts-per-token", type=int)
ap.add_argument("--moe-intermediate", type=int)
ap.add_argument("--tie", dest="tie", action="store_true", default=None)
ap.add_argument("--no-tie", dest="tie", action="store_false")
ap.add_argument("--quant", choices=["none", "fp8", "fp8-experts", "mxfp4"])
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--dry-run", action="store_true")
a = ap.parse_args()

defaults = dict(head_dim=0, tie=True, quant="none")
for k, v in (PRESETS[a.preset] if a.preset else {}).items():
    if getattr(a, k, None) in (None, 0):
        setattr(a, k, v)
for k, v in defaults.items():
    if getattr(a, k) is None:
        setattr(a, k, v)
cfg = {}
if a.template:
    with open(os.path.join(a.template, "config.json")) as f:
        cfg = json.load(f)
    a.arch = a.arch or cfg.get("model_type")
    if a.arch != cfg.get("model_type"):
        ap.error(f"--arch {a.arch} but the template is {cfg.get('model_type')}")
elif not a.dry_run:
    ap.error("--template is required unless --dry-run")
if not a.dry_run and not a.out:
    ap.error("--out is required unless --dry-run")
if a.arch is None:
    ap.error("--arch (or --preset, or --template) is required")
moe = a.arch in ("gpt_oss", "qwen3_moe")
need = ["layers", "hidden", "heads", "kv_heads", "vocab"] + (["intermediate"] if a.arch != "qwen3_moe" else [])
need += ["experts", "experts_per_token"] if moe else []
need += ["moe_intermediate"] if a.arch == "qwen3_moe" else []
for k in need:
    if not getattr(a, k):
        ap.error(f"--{k.replace('_', '-')} is required for {a.arch}")
if a.arch not in DENSE + ("gpt_oss", "qwen3_moe"):
    ap.error(f"unknown architecture {a.arch}")
if a.quant == "mxfp4" and a.arch != "gpt_oss":
    ap.error("--quant mxfp4 is for gpt_oss (its experts)")
if a.quant == "fp8-experts" and a.arch != "qwen3_moe":
    ap.error("--quant fp8-experts is for qwen3_moe (its experts)")
if a.quant == "fp8" and a.arch == "gpt_oss":
    ap.error("--quant fp8: gpt_oss checkpoints are published with MXFP4 experts; use mxfp4")
if a.arch == "qwen3_moe" and not a.intermediate:
    a.intermediate = 3 * a.hidden  # dense layers' size; none are dense here

D = a.head_dim or a.hidden // a.heads
H, V, L = a.hidden, a.vocab, a.layers
nq, nkv = a.heads * D, a.kv_heads * D
E, K = a.experts or 0, a.experts_per_token or 0
I = a.moe_intermediate if a.arch == "qwen3_moe" else a.intermediate
if a.quant == "mxfp4" and (H % MX or I % MX):
    ap.error(f"--quant mxfp4 needs hidden and intermediate in multiples of {MX}")


# The checkpoint as a list of (name, kind, shape): kind "bf16" (a float
# tensor), "lin" (a linear weight [.., out, in] that --quant fp8 stores
# quantized), "mx" (a GPT-OSS expert matrix: bf16 [E, in, out], or MXFP4
# [E, out, in]), "one" (a norm weight, ones), "ones" likewise.
def spec():
    qk_norm = a.arch in ("qwen3", "qwen3_moe", "gemma3_text")
    s = [("model.embed_tokens.weight", "bf16", (V, H))]
    for l in range(L):
        p = f"model.layers.{l}."
        s += [(p + "input_layernorm.weight", "one", (H,)),
              (p + "post_attention_layernorm.weight", "one", (H,))]
        if a.arch == "gemma3_text":
            s += [(p + "pre_feedforward_layernorm.weight", "one", (H,)),
                  (p + "post_feedforward_layernorm.weight", "one", (H,))]
        s += [(p + "self_attn.q_proj.weight", "lin", (nq, H)),
              (p + "self_attn.k_proj.weight", "lin", (nkv, H)),
              (p + "self_attn.v_proj.weight", "lin", (nkv, H)),
              (p + "self_attn.o_proj.weight", "lin", (H, nq))]
        if a.arch in ("qwen2", "gpt_oss"):
            s += [(p + "self_attn.q_proj.bias", "bf16", (nq,)),
                  (p + "self_attn.k_proj.bias", "bf16", (nkv,)),
                  (p + "self_attn.v_proj.bias", "bf16", (nkv,))]
        if qk_norm:
            s += [(p + "self_attn.q_norm.weight", "one", (D,)),
                  (p + "self_attn.k_norm.weight", "one", (D,))]
        if a.arch == "gpt_oss":
            s += [(p + "self_attn.o_proj.bias", "bf16", (H,)),
                  (p + "self_attn.sinks", "bf16", (a.heads,)),
                  (p + "mlp.router.weight", "bf16", (E, H)),
                  (p + "mlp.router.bias", "bf16", (E,)),
                  (p + "mlp.experts.gate_up_proj", "mx", (E, H, 2 * I)),
                  (p + "mlp.experts.gate_up_proj_bias", "bf16", (E, 2 * I)),
                  (p + "mlp.experts.down_proj", "mx", (E, I, H)),
                  (p + "mlp.experts.down_proj_bias", "bf16", (E, H))]
        elif a.arch == "qwen3_moe":
            s.append((p + "mlp.gate.weight", "bf16", (E, H)))  # the router: never quantized
            for e in range(E):
                q = f"{p}mlp.experts.{e}."
                s += [(q + "gate_proj.weight", "lin", (I, H)), (q + "up_proj.weight", "lin", (I, H)),
                      (q + "down_proj.weight", "lin", (H, I))]
        else:
            s += [(p + "mlp.gate_proj.weight", "lin", (a.intermediate, H)),
                  (p + "mlp.up_proj.weight", "lin", (a.intermediate, H)),
                  (p + "mlp.down_proj.weight", "lin", (H, a.intermediate))]
    s.append(("model.norm.weight", "one", (H,)))
    if not a.tie:
        s.append(("lm_head.weight", "bf16", (V, H)))
    return s


def fp8(name, kind):
    """Whether linear weight `name` is stored fp8."""
    return kind == "lin" and (a.quant == "fp8" or
                              (a.quant == "fp8-experts" and ".mlp.experts." in name))


def stored(name, kind, shape):
    """The tensors (name, dtype, shape, bytes) `name` is written as."""
    n = math.prod(shape)
    if fp8(name, kind):
        out, inn = shape[-2], shape[-1]
        sc = (cdiv(out, BLOCK), cdiv(inn, BLOCK))
        return [(name, "F8_E4M3", shape, n), (name + "_scale_inv", "F32", sc, 4 * math.prod(sc))]
    if kind == "mx" and a.quant == "mxfp4":
        e, inn, out = shape
        return [(name + "_blocks", "U8", (e, out, inn // MX, MX // 2), n // 2),
                (name + "_scales", "U8", (e, out, inn // MX), n // MX)]
    return [(name, "BF16", shape, 2 * n)]


def report(s):
    total = params = 0
    per_step = 0.0  # bytes one decode step reads: all but the embedding and unchosen experts
    for name, kind, shape in s:
        b = sum(x[3] for x in stored(name, kind, shape))
        total += b
        params += math.prod(shape)
        if name == "model.embed_tokens.weight":
            per_step += b if a.tie else 0  # tied: read as the LM head
        elif ".mlp.experts." in name and not name.endswith("_bias"):
            per_step += b * K / E
        else:
            per_step += b
    print(f"{a.arch} {L} layers, hidden {H}, {a.heads}/{a.kv_heads} heads x {D}, vocab {V}" +
          (f", {E} experts ({K} per token) x {I}" if moe else "") + f", quant {a.quant}")
    print(f"{len(s)} weights, {params / 1e9:.2f}B parameters; file {total / 1e9:.2f} GB; "
          f"a decode step reads {per_step / 1e9:.2f} GB of weights")
    return total


specs = spec()
if a.dry_run:
    report(specs)
    raise SystemExit(0)

import torch  # noqa: E402 (not needed for --dry-run)
from safetensors.torch import save_file  # noqa: E402

from quant_pack import fp8_block, mxfp4  # noqa: E402 (this folder; shared with hf_compare)

os.makedirs(a.out, exist_ok=True)
for f in os.listdir(a.template):
    if (f.endswith(".json") or f.endswith(".jinja")) and f != "config.json" and "index" not in f:
        shutil.copy(os.path.join(a.template, f), a.out)
cfg.update(vocab_size=V, hidden_size=H, intermediate_size=a.intermediate, num_hidden_layers=L,
           num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=D,
           tie_word_embeddings=a.tie,
           max_position_embeddings=max(cfg.get("max_position_embeddings", 0), 32768))
if "max_window_layers" in cfg:
    cfg["max_window_layers"] = L
cfg.pop("quantization_config", None)
if a.arch == "gpt_oss":
    cfg.update(num_local_experts=E, experts_per_token=K, num_experts_per_tok=K,
               layer_types=["sliding_attention" if l % 2 == 0 else "full_attention"
                            for l in range(L)])
if a.arch == "qwen3_moe":
    cfg.pop("num_experts", None)
    cfg.update(num_local_experts=E, num_experts_per_tok=K, moe_intermediate_size=I,
               decoder_sparse_step=1, mlp_only_layers=[])
if a.quant in ("fp8", "fp8-experts"):
    cfg["quantization_config"] = quantization_config("fp8")
    if a.quant == "fp8-experts":
        cfg["quantization_config"]["modules_to_not_convert"] = ["self_attn", "lm_head"]
elif a.quant == "mxfp4":
    cfg["quantization_config"] = quantization_config("mxfp4")
with open(os.path.join(a.out, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)

dev = "cuda" if torch.cuda.is_available() else "cpu"
g = torch.Generator(device=dev).manual_seed(a.seed)


def rnd(*shape, scale=0.02):
    return torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * scale


t = {}
nbytes = 0
for name, kind, shape in specs:
    if kind == "one":
        t[name] = torch.ones(shape, dtype=torch.bfloat16)
    elif fp8(name, kind):
        codes, s = fp8_block(rnd(*shape))
        t[name], t[name + "_scale_inv"] = codes.cpu(), s.cpu()
    elif kind == "mx" and a.quant == "mxfp4":
        blocks, scales = mxfp4(rnd(*shape).transpose(1, 2))  # [E, in, out] -> [E, out, in]
        t[name + "_blocks"], t[name + "_scales"] = blocks.cpu(), scales.cpu()
    else:
        t[name] = rnd(*shape).to(torch.bfloat16).cpu()
save_file(t, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
total = report(specs)
print(f"wrote {a.out}: {total / 1e9:.2f} GB")

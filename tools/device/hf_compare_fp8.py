#!/usr/bin/env python3
"""FP8 checkpoints: agentkv's forward pass against Hugging Face transformers.

agentkv keeps FP8 weights quantized in memory and dequantizes them inside
its matmuls (engine/model/quant_format.h). This compares it, on small random
dense Qwen3 models, with transformers in float32 on the dequantized weights:

  1. a random Qwen3 (3 layers, q 128 rows, k/v 64 rows, intermediate 200:
     ragged 128x128 tiles both ways) is built with transformers and saved in
     bf16; its linear layers (q/k/v/o, gate/up/down) are quantized here with
     torch's float8_e4m3fn cast (quant_pack.py's packers), one scale per
     128x128 tile (scale_inv = amax / 448), and written as a Qwen3-FP8-style checkpoint (`X.weight`
     F8_E4M3, `X.weight_scale_inv` F32, quantization_config {quant_method:
     fp8, fmt: e4m3, weight_block_size: [128, 128]}); with --channel also a
     compressed-tensors per-channel checkpoint (`X.weight_scale` [out, 1]);
  2. or (--from-synth DIR, repeatable) a checkpoint `agentkv model synth
     --quant fp8|fp8-channel` wrote;
  3. the reference: the checkpoint's codes decoded by this script's own
     numpy e4m3 decode, times the scales, loaded into the transformers model
     in float32;
  4. for 5 prompts of 1 to 300 tokens: `agentkv logits` (the final
     position's logits) against the reference: relative L2 error below
     --threshold (default 1e-3 on cpu: the same weights in fp32 on both
     sides; 2e-2 on cuda, bf16 activations) and the same argmax.
  With --hf-fp8, transformers' own loader of the FP8 checkpoint
  (FineGrainedFP8Config(dequantize=True)) is compared too, as a check of the
  checkpoint format itself (reported; a failure to load is reported, not
  fatal).

Run on the GPU machine (PyTorch, transformers, numpy, safetensors):
  python3 tools/device/hf_compare_fp8.py --agentkv .devcarry/bin/agentkv --device cpu \
      --work /tmp/hfcmp_fp8 --out results_fp8_weights.md [--channel] [--hf-fp8]
  build/agentkv model synth --arch qwen3 --tokenizer data/tokenizers/qwen3 \
      --out /tmp/q8 --quant fp8 --hidden 256 --layers 2
  python3 tools/device/hf_compare_fp8.py --agentkv build/agentkv --from-synth /tmp/q8
Exits non-zero if any comparison fails.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

# This folder's packers, shared with synth_shape.py and hf_compare.py.
from quant_pack import fp8_block, fp8_channel, quantization_config

PROMPT_LENS = [1, 7, 64, 129, 300]
VOCAB = 2048
BLOCK = 128
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def e4m3_decode(codes):
    """uint8 e4m3fn codes -> float32, from the format's fields (not torch's cast)."""
    c = codes.astype(np.int32)
    sign = np.where(c >> 7, -1.0, 1.0)
    exp = (c >> 3) & 15
    mant = c & 7
    normal = np.ldexp(1.0 + mant / 8.0, exp - 7)
    sub = mant / 512.0
    v = sign * np.where(exp == 0, sub, normal)
    v = np.where((exp == 15) & (mant == 7), np.nan, v)
    return v.astype(np.float32)


def build_bf16(d, seed):
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=160, intermediate_size=200, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1.0 + 0.1 * torch.randn_like(p)) if "norm" in name
                    else 0.08 * torch.randn_like(p))
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)


def write_fp8(src, dst, channel):
    """The bf16 checkpoint `src` with its linear layers in FP8, written to `dst`."""
    os.makedirs(dst, exist_ok=True)
    tensors = {}
    with safe_open(os.path.join(src, "model.safetensors"), "pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            if k.endswith(".weight") and k.split(".")[-2] in LINEAR:
                q, s = (fp8_channel if channel else fp8_block)(t.float())
                tensors[k] = q
                tensors[k + ("_scale" if channel else "_scale_inv")] = s
            else:
                tensors[k] = t
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["quantization_config"] = quantization_config("fp8-channel" if channel else "fp8")
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(src, extra)):
            shutil.copy(os.path.join(src, extra), dst)


def dequantized_state(d):
    """Every tensor of checkpoint `d` as float32; F8 weights decoded by e4m3_decode x scales."""
    state, names = {}, []
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        names = list(f.keys())
        raw = {k: f.get_tensor(k) for k in names}
    for k, t in raw.items():
        if k.endswith("_scale_inv") or k.endswith("_scale") or k.endswith("input_scale"):
            continue
        if t.dtype != torch.float8_e4m3fn:
            state[k] = t.float()
            continue
        w = e4m3_decode(t.view(torch.uint8).numpy())
        if k + "_scale_inv" in raw:
            s = raw[k + "_scale_inv"].float().numpy()
            s = np.repeat(np.repeat(s, BLOCK, axis=0), BLOCK, axis=1)[:w.shape[0], :w.shape[1]]
        else:
            s = raw[k + "_scale"].float().numpy().reshape(-1, 1)
        state[k] = torch.from_numpy(w * s)
    return state


def reference_model(d, dev):
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg.pop("quantization_config", None)
    config = transformers.Qwen3Config(**{k: v for k, v in cfg.items()
                                         if k not in ("architectures", "model_type")})
    config._attn_implementation = "eager"
    model = transformers.Qwen3ForCausalLM(config)
    missing, unexpected = model.load_state_dict(dequantized_state(d), strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]  # tied
    if missing or unexpected:
        raise RuntimeError(f"{d}: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.float().to(dev).eval()


def run_agentkv(binary, args):
    r = subprocess.run([binary] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"agentkv {' '.join(args[:3])}... failed: {r.stderr.strip()[-2000:]}")
    return r.stdout


def compare(name, d, ref, vocab, a, dev, rows, hf_note=""):
    g = torch.Generator().manual_seed(77)
    failures = 0
    for n in PROMPT_LENS:
        ids = torch.randint(3, vocab, (n,), generator=g).tolist()
        with torch.no_grad():
            want = ref(torch.tensor([ids], device=dev)).logits[0, -1].float().cpu()
        got = torch.tensor(json.loads(run_agentkv(
            a.agentkv, ["logits", "--model", d, "--ids", ",".join(map(str, ids)),
                        "--device", a.device])))
        rel = float(torch.linalg.norm(got - want) / torch.linalg.norm(want))
        same = int(torch.argmax(got)) == int(torch.argmax(want))
        ok = rel < a.threshold and same
        failures += 0 if ok else 1
        rows.append((name + hf_note, n, rel, same, ok))
        print(f"{name}{hf_note} len={n:4d} rel_err={rel:.2e} argmax={'same' if same else 'DIFF'} "
              f"{'ok' if ok else 'FAIL'}", flush=True)
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agentkv", required=True)
    ap.add_argument("--device", default="cpu", help="agentkv backend: cpu or cuda")
    ap.add_argument("--work", default="/tmp/hfcmp_fp8")
    ap.add_argument("--out", default=None)
    ap.add_argument("--channel", action="store_true",
                    help="also a compressed-tensors per-channel checkpoint")
    ap.add_argument("--from-synth", action="append", default=[],
                    help="compare a checkpoint from `agentkv model synth --quant` instead")
    ap.add_argument("--hf-fp8", action="store_true",
                    help="also compare transformers' own FP8 loader (FineGrainedFP8Config)")
    ap.add_argument("--threshold", type=float, default=None)
    a = ap.parse_args()
    if a.threshold is None:
        a.threshold = 1e-3 if a.device == "cpu" else 2e-2
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows, failures = [], 0
    cases = []
    if a.from_synth:
        cases = [(os.path.basename(os.path.normpath(d)), d) for d in a.from_synth]
    else:
        bf16 = os.path.join(a.work, "bf16")
        build_bf16(bf16, seed=5)
        cases.append(("fp8-block", os.path.join(a.work, "fp8")))
        write_fp8(bf16, cases[-1][1], channel=False)
        if a.channel:
            cases.append(("fp8-channel", os.path.join(a.work, "fp8_channel")))
            write_fp8(bf16, cases[-1][1], channel=True)
    for name, d in cases:
        vocab = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
        failures += compare(name, d, reference_model(d, dev), min(vocab, VOCAB), a, dev, rows)
        if a.hf_fp8 and name == "fp8-block":
            try:
                hf = transformers.AutoModelForCausalLM.from_pretrained(
                    d, quantization_config=transformers.FineGrainedFP8Config(dequantize=True),
                    dtype=torch.float32, attn_implementation="eager").to(dev).eval()
                failures += compare(name, d, hf, min(vocab, VOCAB), a, dev, rows,
                                    " (transformers FP8 loader)")
            except Exception as e:  # reported, not fatal: the loader needs what it needs
                print(f"transformers FP8 loader: {type(e).__name__}: {e}", flush=True)
    lines = [f"transformers {transformers.__version__}, torch {torch.__version__}, reference on "
             f"{dev} in float32 on the dequantized weights; agentkv --device {a.device}; "
             f"logits threshold {a.threshold:g}", "",
             "| checkpoint | prompt tokens | logits rel. error | argmax | result |",
             "| --- | --- | --- | --- | --- |"]
    for name, n, rel, same, ok in rows:
        lines.append(f"| {name} | {n} | {rel:.2e} | {'same' if same else 'differs'} | "
                     f"{'pass' if ok else 'FAIL'} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(f"{len(rows) - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

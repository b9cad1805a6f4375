#!/usr/bin/env python3
"""Puts `agentkv bench engine --json` results beside their rooflines.

Decode (output tok/s at concurrency c): each step reads every weight once
(the tied embedding once, as the LM head) plus each sequence's K and V so
far; the floor of one step is those bytes over the measured copy bandwidth,
at the mean context of a run (prompt + output / 2). The bench's tok/s also
pays the prompts' prefill, so its % is of the decode floor alone: an upper
bound the run cannot reach. Prefill (prompt tok/s, --output 1 run): floor =
2 * parameters FLOP per token over the measured bf16 matmul rate; the
memory floor (weights once per step) is far below it. Mixtures of
experts count the experts a step's tokens touch and the active parameters;
quantized weights their stored bytes.
Prints a Markdown table."""
import argparse
import json
import os

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--peak", required=True)
ap.add_argument("--bench", required=True)
ap.add_argument("--prefill")
ap.add_argument("--nographs")
a = ap.parse_args()
cfg = json.load(open(os.path.join(a.model, "config.json")))
peak = json.load(open(a.peak))
bw = peak["copy_bw_GBps"] * 1e9
H, I, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
D = cfg.get("head_dim") or H // cfg["num_attention_heads"]
nq, nkv = cfg["num_attention_heads"] * D, cfg["num_key_value_heads"] * D
attn = H * (nq + 2 * nkv) + nq * H
# Dense fp8 checkpoints read their projections at a byte a value.
# Mixtures of experts (gpt_oss, qwen3_moe): a step reads the experts its
# tokens touch, E * (1 - (1 - k/E)^c) of them per layer at c tokens
# (routing taken as uniform). Quantized weights count their stored bytes:
# fp8 blocks a byte a value (+ a 4-byte scale per 128 x 128), mxfp4 half a
# byte (+ a byte per 32); with fp8, attention too unless the config leaves
# self_attn out (modules_to_not_convert).
E = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
K = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0
EI = cfg.get("moe_intermediate_size") or I
q = (cfg.get("quantization_config") or {})
qm = q.get("quant_method", "none")
fp8_attn = qm == "fp8" and not any("self_attn" in m for m in q.get("modules_to_not_convert") or [])
BYTES = {"none": 2.0, "fp8": 1.0 + 4.0 / (128 * 128), "mxfp4": 0.5 + 1.0 / 32}
attn_b = BYTES["fp8"] if fp8_attn else 2.0
expert_b = BYTES.get(qm, 2.0)
expert = 3 * H * EI  # values of one expert
if E:
    layer = attn + E * H + E * expert  # parameters (router included)
    active = attn + E * H + K * expert
else:
    layer = attn + 3 * H * I
    active = layer
params = L * layer + V * H * (1 if cfg.get("tie_word_embeddings") else 2)
# The prefill compute floor's FLOPs per token (as for dense models, the
# untied embedding counted too).
flops_per_tok = 2 * (L * active + V * H * (1 if cfg.get("tie_word_embeddings") else 2))


def wbytes(c=1):
    """What a decode step of c tokens reads (embedding rows: negligible)."""
    if not E:
        mlp_b = BYTES["fp8"] if qm == "fp8" else 2.0
        return L * (attn * attn_b + 3 * H * I * mlp_b) + 2 * V * H
    touched = E * (1 - (1 - K / E) ** c)
    return L * (attn * attn_b + 2 * E * H + touched * expert * expert_b) + 2 * V * H


kv_per_tok = L * 2 * nkv * 2
b = json.load(open(a.bench))
P, O = b["prompt_tokens"], b["output_tokens"]
ctx = P + O / 2
rows = [f"model {a.model}: {params / 1e9:.2f}B parameters" +
        (f" ({E} experts, {K} per token, quant {qm})" if E else "") +
        f", {wbytes() / 1e9:.2f} GB read per single-token decode "
        f"step + {kv_per_tok / 1024:.0f} KiB KV per context token; {peak['device']}: copy "
        f"{peak['copy_bw_GBps']:.0f} GB/s" +
        (f", bf16 matmul {peak['matmul_tflops']:.0f} TFLOP/s" if "matmul_tflops" in peak else ""),
        "", "| run | output tok/s | decode floor tok/s | % of floor | steps | mean TTFT ms |",
        "| --- | --- | --- | --- | --- | --- |"]
ng = {}
if a.nographs:
    for lv in json.load(open(a.nographs))["levels"]:
        ng[lv["concurrency"]] = lv
for lv in b["levels"]:
    c = lv["concurrency"]
    floor = c / ((wbytes(c) + c * ctx * kv_per_tok) / bw)
    rows.append(f"| c{c} | {lv['output_tok_s']:.0f} | {floor:.0f} | {100 * lv['output_tok_s'] / floor:.0f}% "
                f"| {lv['steps']} | {lv['mean_ttft_ms']:.1f} |")
    if c in ng:
        rows.append(f"| c{c} no graphs | {ng[c]['output_tok_s']:.0f} | {floor:.0f} | "
                    f"{100 * ng[c]['output_tok_s'] / floor:.0f}% | {ng[c]['steps']} | {ng[c]['mean_ttft_ms']:.1f} |")
if a.prefill:
    p = json.load(open(a.prefill))
    for lv in p["levels"]:
        n = lv["requests"] * p["prompt_tokens"]
        tps = n / lv["seconds"]
        line = f"prefill: {n} prompt tokens (c{lv['concurrency']}, 1 output token each) in {lv['seconds']:.3f} s = {tps:.0f} tok/s"
        if "matmul_tflops" in peak:
            cfloor = peak["matmul_tflops"] * 1e12 / flops_per_tok
            line += f"; compute floor {cfloor:.0f} tok/s ({100 * tps / cfloor:.0f}%)"
        mfloor = bw / wbytes(8192) * 8192
        line += f"; memory floor (weights once per 8192-token step) {mfloor:.0f} tok/s ({100 * tps / mfloor:.1f}%)"
        rows += ["", line]
print("\n".join(rows))

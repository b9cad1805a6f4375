#!/usr/bin/env python3
"""Turns a random checkpoint (tools/device/synth_shape.py, `agentkv model
synth`) into a cycle model, in place: its greedy output is a fixed function
of the last token that walks cycles of --cycle tokens, so once a reply has
gone round its cycle it repeats text already in its context, and n-gram
drafts (`serve --speculative ngram`) are accepted from then on. For
measuring speculative decoding at full acceptance on any shape
(tools/specbench/specbench.py).

  python3 tools/specbench/cycle_model.py --model /tmp/qwen3_8b_cycle --cycle 32

How: the LM head's rows become the embedding's rows permuted (row pi(x) =
embedding row x, pi a random permutation made of cycles of --cycle
tokens), and every layer's input and post-attention norm weights become
--gain (2^-10 by default), so the layers add almost nothing to the
residual stream: the final hidden state is about the embedding of the
last token x, whose best match among the LM head's rows is row pi(x) by a
wide margin (for hidden sizes of a few hundred and more). Every weight
matrix keeps its random values and every kernel still runs at full size,
so a step costs what the shape's step costs. Needs an untied LM head
(synth_shape.py --no-tie, `model synth --no-tie`); dense architectures
without Gemma's (1 + w) norms (llama, qwen2, qwen3, mistral). Writes
cycle.json beside the weights saying what was done.

Standard library only: edits the safetensors file in place (the LM head
and the norm weights), reading the embedding once.
"""
import argparse
import json
import os
import random
import struct
import sys

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4}


def encode(value, dtype):
    f32 = struct.pack("<f", value)
    if dtype == "F32":
        return f32
    if dtype == "BF16":
        return f32[2:]  # value is a power of two: exact in bf16
    if dtype == "F16":
        return struct.pack("<e", value)
    raise ValueError(dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("--model", required=True, help="checkpoint directory (edited in place)")
    ap.add_argument("--cycle", type=int, default=32, help="tokens per cycle")
    ap.add_argument("--gain", type=float, default=2.0 ** -10,
                    help="the layers' norm weights (a power of two)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.cycle < 2:
        ap.error("--cycle must be at least 2")
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    arch = cfg.get("model_type")
    if arch not in ("llama", "qwen2", "qwen3", "mistral"):
        ap.error(f"model_type {arch}: only llama, qwen2, qwen3 and mistral")
    if cfg.get("tie_word_embeddings", arch != "mistral"):
        ap.error("the LM head is tied to the embedding: make the checkpoint with --no-tie")
    path = os.path.join(a.model, "model.safetensors")
    if not os.path.exists(path):
        ap.error(f"{path}: not found (one-file checkpoints only)")
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        emb, head = header.get("model.embed_tokens.weight"), header.get("lm_head.weight")
        if emb is None or head is None:
            sys.exit("error: needs model.embed_tokens.weight and lm_head.weight")
        if emb["dtype"] != head["dtype"] or emb["shape"] != head["shape"]:
            sys.exit("error: embedding and LM head differ in dtype or shape")
        if emb["dtype"] not in DTYPE_BYTES:
            sys.exit(f"error: embedding dtype {emb['dtype']}")
        V, H = emb["shape"]
        row = H * DTYPE_BYTES[emb["dtype"]]
        # pi: the vocabulary shuffled and cut into cycles of a.cycle (the
        # last one shorter), each token mapped to the next of its cycle.
        order = list(range(V))
        random.Random(a.seed).shuffle(order)
        nxt = [0] * V
        for s in range(0, V, a.cycle):
            m = min(a.cycle, V - s)
            for i in range(m):
                nxt[order[s + i]] = order[s + (i + 1) % m]
        f.seek(base + emb["data_offsets"][0])
        e = f.read(V * row)
        out = bytearray(V * row)
        for x in range(V):
            y = nxt[x]
            out[y * row:(y + 1) * row] = e[x * row:(x + 1) * row]
        f.seek(base + head["data_offsets"][0])
        f.write(out)
        norms = 0
        for name, t in header.items():
            if not (name.endswith(".input_layernorm.weight") or
                    name.endswith(".post_attention_layernorm.weight")):
                continue
            if t["dtype"] not in DTYPE_BYTES:
                sys.exit(f"error: {name} dtype {t['dtype']}")
            count = 1
            for d in t["shape"]:
                count *= d
            f.seek(base + t["data_offsets"][0])
            f.write(encode(a.gain, t["dtype"]) * count)
            norms += 1
    with open(os.path.join(a.model, "cycle.json"), "w") as f:
        json.dump({"cycle": a.cycle, "gain": a.gain, "seed": a.seed,
                   "what": "tools/specbench/cycle_model.py: LM head = embedding rows permuted "
                           "into cycles; layer norms scaled to the gain"}, f, indent=1)
    print(f"{a.model}: LM head permuted into cycles of {a.cycle} over {V} tokens, "
          f"{norms} norm weights set to {a.gain}")


if __name__ == "__main__":
    main()

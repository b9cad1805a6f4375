#!/usr/bin/env python3
"""Tests of tools/device/quant_pack.py's plain-Python part (no torch, no
numpy): the fp8 (e4m3) and MXFP4 (e2m1) codecs, and, with --agentkv BINARY,
the checkpoints hf_compare.py --quant writes against agentkv itself:
  - names, dtypes, shapes and quantization_config as `agentkv model synth
    --quant` writes them, for every tensor of a small qwen3 (fp8,
    fp8-channel) and gpt_oss (mxfp4) model;
  - a checkpoint quantized here loads (`agentkv logits --device cpu`) and
    gives the logits of the float32 checkpoint of its dequantized weights
    (what hf_compare's reference loads): the same values multiplied.

  python3 tests/reference/quant_pack_test.py [--agentkv build/agentkv]
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools", "device"))
import quant_pack as qp  # noqa: E402

AGENTKV = None  # --agentkv
TOKENIZER = os.path.join(ROOT, "data", "tokenizers", "qwen3")


# ---- safetensors in plain Python ---------------------------------------------

def read_st(path):
    """{name: (dtype, shape, raw bytes)} and the header's metadata."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    return {k: (v["dtype"], tuple(v["shape"]), data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}, meta


def write_st(path, tensors):
    """tensors: {name: (dtype, shape, raw bytes)}."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for k, (dt, shape, raw) in tensors.items():
        header[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, raw in tensors.values():
            f.write(raw)


def bf16_values(raw):
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0]
            for (h,) in struct.iter_unpack("<H", raw)]


def f32_bytes(values):
    return struct.pack(f"<{len(values)}f", *values)


def rows(values, shape):
    """Flat values as a list of rows of the last dimension."""
    n = shape[-1]
    return [values[i:i + n] for i in range(0, len(values), n)]


# ---- codecs -------------------------------------------------------------------

class Codecs(unittest.TestCase):
    def test_e4m3_fields(self):
        self.assertEqual(qp.e4m3_value(0x7E), 448.0)
        self.assertEqual(qp.e4m3_value(0xFE), -448.0)
        self.assertEqual(qp.e4m3_value(0x38), 1.0)
        self.assertEqual(qp.e4m3_value(0x08), 2.0 ** -6)   # smallest normal
        self.assertEqual(qp.e4m3_value(0x01), 2.0 ** -9)   # smallest subnormal
        self.assertEqual(qp.e4m3_value(0x07), 7 / 8 * 2.0 ** -6)
        self.assertTrue(math.isnan(qp.e4m3_value(0x7F)))
        self.assertTrue(math.isnan(qp.e4m3_value(0xFF)))

    def test_e4m3_round_trip_every_code(self):
        for c in range(256):
            if c & 0x7F == 0x7F:
                continue
            self.assertEqual(qp.e4m3_encode(qp.e4m3_value(c)), c, hex(c))

    def test_e4m3_rounds_to_nearest_even(self):
        # 1.0 (0x38) and 1.125 (0x39): the midpoint goes to the even code.
        self.assertEqual(qp.e4m3_encode(1.0625), 0x38)
        self.assertEqual(qp.e4m3_encode(1.0626), 0x39)
        # 1.125 (0x39) and 1.25 (0x3A): the midpoint goes up, to the even code.
        self.assertEqual(qp.e4m3_encode(1.1875), 0x3A)
        self.assertEqual(qp.e4m3_encode(-1.1875), 0xBA)
        self.assertEqual(qp.e4m3_encode(2.0 ** -10), 0x00)  # half the smallest subnormal
        self.assertEqual(qp.e4m3_encode(1e-12), 0x00)
        self.assertRaises(ValueError, qp.e4m3_encode, 449.0)
        self.assertRaises(ValueError, qp.e4m3_encode, math.nan)

    def test_fp8_block_round_trip(self):
        # 130 x 200: ragged tiles both ways; one all-zero tile (scale 1).
        w = [[(0.0 if r >= 128 else math.sin(r * 7.1 + c * 0.37) * (1 + (c >= 128) * 50))
              for c in range(200)] for r in range(130)]
        codes, scales = qp.fp8_block_py(w)
        self.assertEqual((len(scales), len(scales[0])), (2, 2))
        self.assertEqual(scales[1], [1.0, 1.0])
        self.assertEqual(qp.stored_tensors("x.weight", (130, 200), "fp8")[1],
                         ("x.weight_scale_inv", "F32", (2, 2)))
        deq = qp.fp8_dequant_py(codes, scales, block=True)
        for r in range(130):
            for c in range(200):
                s = scales[r // 128][c // 128]
                # e4m3 keeps 3 mantissa bits: within 1/16 relative, or half
                # the smallest subnormal step near zero.
                self.assertLessEqual(abs(deq[r][c] - w[r][c]),
                                     max(abs(w[r][c]) / 16, 2.0 ** -10 * s) * 1.0001, (r, c))
        # Each tile's largest magnitude is exactly 448 codes' worth.
        self.assertEqual(max(abs(qp.e4m3_value(codes[r][c])) for r in range(128)
                             for c in range(128)), 448.0)

    def test_fp8_channel_round_trip(self):
        w = [[math.cos(r + c * 1.3) * (r + 1) for c in range(40)] for r in range(5)] + [[0.0] * 40]
        codes, scales = qp.fp8_channel_py(w)
        self.assertEqual(len(scales), 6)
        self.assertEqual(scales[5], [1.0])
        deq = qp.fp8_dequant_py(codes, scales, block=False)
        for r in range(6):
            for c in range(40):
                self.assertLessEqual(abs(deq[r][c] - w[r][c]), abs(w[r][c]) / 16 + 1e-30)

    def test_e2m1(self):
        for n in range(16):
            if n == 8:
                continue  # -0 encodes as +0's magnitude with the sign bit
            self.assertEqual(qp.e2m1_encode(qp.e2m1_value(n)), n)
        self.assertEqual(qp.e2m1_encode(0.25), 0)   # 0 | 0.5: to 0 (even)
        self.assertEqual(qp.e2m1_encode(0.75), 2)   # 0.5 | 1: to 1 (even)
        self.assertEqual(qp.e2m1_encode(5.0), 6)    # 4 | 6: to 4 (even)
        self.assertEqual(qp.e2m1_encode(-5.1), 15)

    def test_mxfp4_row(self):
        # Representable values come back exactly; the low nibble is the first.
        row = [qp.E2M1[i % 8] * (-1 if i % 3 == 0 else 1) * 4 for i in range(64)]
        blocks, scales = qp.mxfp4_row_py(row)
        self.assertEqual(len(blocks), 32)
        self.assertEqual(list(scales), [129, 129])  # amax 24 = 6 x 2^2
        self.assertEqual(qp.mxfp4_row_dequant_py(blocks, scales), row)
        self.assertEqual(blocks[0] & 15, qp.e2m1_encode(row[0] / 4))
        self.assertEqual(blocks[0] >> 4, qp.e2m1_encode(row[1] / 4))
        # amax / 6 rounded up to a power of two: 7 / 6 -> 2, so 7 -> 3.5 ->
        # 4 (the even code); an all-zero group has scale 2^0.
        blocks, scales = qp.mxfp4_row_py([7.0] + [0.0] * 31 + [0.0] * 32)
        self.assertEqual(list(scales), [128, 127])
        self.assertEqual(qp.mxfp4_row_dequant_py(blocks, scales)[0], 8.0)

    def test_names_and_configs(self):
        self.assertTrue(qp.quantizes("model.layers.3.self_attn.q_proj.weight", "fp8"))
        self.assertTrue(qp.quantizes("model.layers.0.mlp.experts.5.down_proj.weight", "fp8"))
        for name in ("model.layers.0.mlp.gate.weight", "model.embed_tokens.weight",
                     "lm_head.weight", "model.layers.0.self_attn.q_proj.bias",
                     "model.layers.0.input_layernorm.weight", "model.norm.weight"):
            self.assertFalse(qp.quantizes(name, "fp8"), name)
        self.assertTrue(qp.quantizes("model.layers.0.mlp.experts.gate_up_proj", "mxfp4"))
        self.assertFalse(qp.quantizes("model.layers.0.mlp.experts.gate_up_proj_bias", "mxfp4"))
        self.assertFalse(qp.quantizes("model.layers.0.self_attn.q_proj.weight", "mxfp4"))
        self.assertEqual(qp.stored_tensors("e", (8, 64, 256), "mxfp4"),
                         [("e_blocks", "U8", (8, 256, 2, 16)), ("e_scales", "U8", (8, 256, 2))])
        self.assertRaises(ValueError, qp.stored_tensors, "e", (8, 48, 256), "mxfp4")
        self.assertEqual(qp.quantization_config("fp8")["weight_block_size"], [128, 128])
        self.assertRaises(ValueError, qp.quantization_config, "int4")


# ---- against agentkv ----------------------------------------------------------

def agentkv(*args):
    r = subprocess.run([AGENTKV] + list(args), capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"agentkv {' '.join(args[:3])}: {r.stderr.strip()[-1500:]}")
    return r.stdout


def synth(d, arch, quant):
    agentkv("model", "synth", "--arch", arch, "--tokenizer", TOKENIZER, "--out", d,
            "--quant", quant, "--hidden", "64", "--layers", "1", "--intermediate",
            "160" if arch == "qwen3" else "64", "--seed", "3")
    return read_st(os.path.join(d, "model.safetensors"))[0]


def quantize_here(src, dst, ref, quant):
    """The bf16 checkpoint `src` stored as `quant` by quant_pack's plain
    packers in `dst`, and its dequantized weights as float32 in `ref`."""
    tensors, _ = read_st(os.path.join(src, "model.safetensors"))
    out, deq = {}, {}
    for k, (dt, shape, raw) in tensors.items():
        if not qp.quantizes(k, quant):
            out[k] = (dt, shape, raw)
            deq[k] = ("F32", shape, f32_bytes(bf16_values(raw)))
            continue
        assert dt == "BF16", (k, dt)
        v = bf16_values(raw)
        if quant == "mxfp4":
            e, inn, o = shape  # [E, in, out]: rows of the transposed matrix
            blocks, scales, values = bytearray(), bytearray(), [0.0] * len(v)
            for x in range(e):
                for r in range(o):
                    b, s = qp.mxfp4_row_py([v[(x * inn + i) * o + r] for i in range(inn)])
                    blocks += b
                    scales += s
                    for i, y in enumerate(qp.mxfp4_row_dequant_py(b, s)):
                        values[(x * inn + i) * o + r] = y
            names = qp.stored_tensors(k, shape, quant)
            out[names[0][0]] = ("U8", names[0][2], bytes(blocks))
            out[names[1][0]] = ("U8", names[1][2], bytes(scales))
        else:
            w = rows(v, shape)
            codes, scales = (qp.fp8_block_py if quant == "fp8" else qp.fp8_channel_py)(w)
            values = [y for row in qp.fp8_dequant_py(codes, scales, block=quant == "fp8")
                      for y in row]
            (cn, _, _), (sn, _, ss) = qp.stored_tensors(k, shape, quant)
            out[cn] = ("F8_E4M3", shape, bytes(c for row in codes for c in row))
            out[sn] = ("F32", ss, f32_bytes([s for row in scales for s in row]))
        deq[k] = ("F32", shape, f32_bytes(values))
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    for d, t, q in ((dst, out, qp.quantization_config(quant)), (ref, deq, None)):
        shutil.copytree(src, d)
        write_st(os.path.join(d, "model.safetensors"), t)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(dict(cfg, **({"quantization_config": q} if q else {})), f)


def logits(d, ids):
    return json.loads(agentkv("logits", "--model", d, "--ids", ids, "--device", "cpu"))


def rel(a, b):
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)) / sum(y * y for y in b))


@unittest.skipUnless(os.path.isdir(TOKENIZER), "no data/tokenizers/qwen3")
class AgainstAgentkv(unittest.TestCase):
    CASES = (("qwen3", "fp8"), ("qwen3", "fp8-channel"), ("gpt_oss", "mxfp4"))

    def setUp(self):
        if not AGENTKV:
            self.skipTest("no --agentkv")
        self.tmp = tempfile.mkdtemp(prefix="quant_pack_test_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_layout_as_agentkv_synth_writes(self):
        for arch, quant in self.CASES:
            with self.subTest(arch=arch, quant=quant):
                plain = synth(os.path.join(self.tmp, f"{arch}_none"), arch, "none")
                d = os.path.join(self.tmp, f"{arch}_{quant}")
                theirs = synth(d, arch, quant)
                want = {}
                for k, (dt, shape, _) in plain.items():
                    if qp.quantizes(k, quant):
                        want.update({n: (t, s) for n, t, s in qp.stored_tensors(k, shape, quant)})
                    else:
                        want[k] = (dt, shape)
                self.assertEqual(want, {k: (dt, s) for k, (dt, s, _) in theirs.items()})
                self.assertGreater(sum(qp.quantizes(k, quant) for k in plain), 0)
                with open(os.path.join(d, "config.json")) as f:
                    got = json.load(f)["quantization_config"]
                mine = qp.quantization_config(quant)
                for key in ("quant_method", "fmt", "weight_block_size", "format"):
                    self.assertEqual(mine.get(key), got.get(key), key)
                if quant == "fp8-channel":
                    self.assertEqual(mine["config_groups"]["group_0"]["weights"]["strategy"],
                                     got["config_groups"]["group_0"]["weights"]["strategy"])

    def test_loads_and_multiplies_the_dequantized_values(self):
        ids = "5,17,300,2,99,1000,42"
        for arch, quant in self.CASES:
            with self.subTest(arch=arch, quant=quant):
                src = os.path.join(self.tmp, f"{arch}_src")
                if not os.path.isdir(src):
                    synth(src, arch, "none")
                q, r = (os.path.join(self.tmp, f"{arch}_{quant}_{x}") for x in ("q", "ref"))
                quantize_here(src, q, r, quant)
                got, want, orig = logits(q, ids), logits(r, ids), logits(src, ids)
                self.assertTrue(all(math.isfinite(x) for x in got))
                # The same float32 weights on agentkv's CPU backend.
                self.assertLess(rel(got, want), 1e-5)
                # And they are quantized: not the bf16 model's logits.
                self.assertGreater(rel(got, orig), 1e-4)


if __name__ == "__main__":
    if "--agentkv" in sys.argv:
        i = sys.argv.index("--agentkv")
        AGENTKV = os.path.abspath(sys.argv[i + 1])
        del sys.argv[i:i + 2]
    unittest.main()

"""Quantized weights as published checkpoints store them, for the Python tools
(tools/device/synth_shape.py, tests/reference/hf_compare.py --quant).

Formats (what agentkv's loader reads, src/engine/model/quant_format.h):
  fp8 block    `X.weight` F8_E4M3 [out, in] and `X.weight_scale_inv` F32
               [ceil(out/128), ceil(in/128)]; W = code * scale_inv of its tile
               (Qwen3-*-FP8, DeepSeek). Scale = the tile's amax / 448.
  fp8 channel  compressed-tensors: `X.weight` F8_E4M3 and `X.weight_scale`
               F32 [out, 1]; W = code * scale of its row.
  mxfp4        GPT-OSS experts: `X_blocks` U8 [.., out, in/32, 16] and
               `X_scales` U8 [.., out, in/32]; two e2m1 values a byte, the low
               nibble first; W = LUT[nibble] * 2^(scale - 127). Scale = amax /
               6 rounded up to a power of two; a value on a midpoint between
               two e2m1 magnitudes goes to the even code (agentkv's packer).

The first part is plain Python (no torch, no numpy), so that the formats'
rules and a reference codec can be tested anywhere
(tests/reference/quant_pack_test.py); the torch part, for real sizes, imports
torch when called and must give the same codes (hf_compare checks its
dequantization against the plain decoders).
"""
import math
import struct

BLOCK = 128  # fp8 block tile (rows and columns)
MX = 32      # MXFP4 values per scale, along the input dimension
FP8_MAX = 448.0
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
# Midpoints between neighbouring e2m1 magnitudes, and whether a value exactly
# on one rounds up (to the even code).
MIDS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
UP_ON_TIE = [False, True, False, True, False, True, False]
# Linear layers a published fp8 checkpoint quantizes (attention, MLP and
# experts); embeddings, norms, routers (`mlp.gate`, `mlp.router`) and the LM
# head stay unquantized.
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# GPT-OSS's expert matrices, stored [E, in, out] in bf16 by transformers.
MX_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
QUANTS = ("fp8", "fp8-channel", "mxfp4")


def cdiv(x, y):
    return (x + y - 1) // y


def f32(x):
    """x rounded to float32 (round to nearest even), as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


# ---- which tensors, named and shaped how -------------------------------------

def quantizes(name, quant):
    """Whether checkpoint tensor `name` (as transformers saves the bf16 model)
    is stored quantized under `quant`."""
    if quant in ("fp8", "fp8-channel"):
        parts = name.split(".")
        return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in LINEAR
    if quant == "mxfp4":
        return any(name.endswith(m) for m in MX_EXPERTS)
    return False


def stored_tensors(name, shape, quant):
    """The tensors (name, safetensors dtype, shape) quantized weight `name` of
    bf16 `shape` is written as: fp8 [.., out, in]; mxfp4 [E, in, out] (the bf16
    layout of GPT-OSS's experts, stored transposed)."""
    shape = tuple(shape)
    if quant == "fp8":
        *lead, out, inn = shape
        return [(name, "F8_E4M3", shape),
                (name + "_scale_inv", "F32", tuple(lead) + (cdiv(out, BLOCK), cdiv(inn, BLOCK)))]
    if quant == "fp8-channel":
        *lead, out, _ = shape
        return [(name, "F8_E4M3", shape), (name + "_scale", "F32", tuple(lead) + (out, 1))]
    if quant == "mxfp4":
        e, inn, out = shape
        if inn % MX:
            raise ValueError(f"{name}: {inn} input features are not a multiple of {MX}")
        return [(name + "_blocks", "U8", (e, out, inn // MX, MX // 2)),
                (name + "_scales", "U8", (e, out, inn // MX))]
    raise ValueError(quant)


def quantization_config(quant):
    """config.json's quantization_config for `quant`, as published checkpoints
    of the format have it."""
    if quant == "fp8":
        return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": [BLOCK, BLOCK]}
    if quant == "fp8-channel":
        return {"quant_method": "compressed-tensors", "format": "float-quantized",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                    "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
                    "dynamic": False}}},
                "ignore": ["lm_head"], "quantization_status": "compressed"}
    if quant == "mxfp4":
        return {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"],
                "quant_method": "mxfp4"}
    raise ValueError(quant)


# ---- plain-Python codecs (reference; small tensors) ---------------------------

def e4m3_value(code):
    """The value of e4m3fn byte `code`, from the format's fields."""
    sign = -1.0 if code & 0x80 else 1.0
    exp, mant = (code >> 3) & 15, code & 7
    if exp == 15 and mant == 7:
        return math.nan
    if exp == 0:
        return sign * mant / 8.0 * 2.0 ** -6
    return sign * (1.0 + mant / 8.0) * 2.0 ** (exp - 7)


_E4M3_POS = [e4m3_value(c) for c in range(0x7F)]  # finite non-negative, ascending


def e4m3_encode(x):
    """x (|x| <= 448) -> the nearest e4m3fn code, ties to the even code (what a
    float32 -> float8_e4m3fn cast does)."""
    if math.isnan(x) or abs(x) > FP8_MAX:
        raise ValueError(f"{x} is outside e4m3's range")
    a, lo, hi = abs(x), 0, 0x7E
    while hi - lo > 1:  # _E4M3_POS[lo] <= a <= _E4M3_POS[hi]
        mid = (lo + hi) // 2
        if _E4M3_POS[mid] <= a:
            lo = mid
        else:
            hi = mid
    if a >= _E4M3_POS[hi]:
        c = hi
    else:
        dl, dh = a - _E4M3_POS[lo], _E4M3_POS[hi] - a
        c = lo if dl < dh else hi if dh < dl else (lo if lo % 2 == 0 else hi)
    return c | (0x80 if x < 0 or (x == 0 and math.copysign(1, x) < 0) else 0)


def fp8_block_py(w):
    """w: rows of floats [out][in] -> (codes [out][in] ints, scale_inv
    [ceil(out/128)][ceil(in/128)] float32 values)."""
    out, inn = len(w), len(w[0])
    scales = [[1.0] * cdiv(inn, BLOCK) for _ in range(cdiv(out, BLOCK))]
    codes = [[0] * inn for _ in range(out)]
    for ti in range(len(scales)):
        rows = range(ti * BLOCK, min(out, (ti + 1) * BLOCK))
        for tj in range(len(scales[0])):
            cols = range(tj * BLOCK, min(inn, (tj + 1) * BLOCK))
            amax = max(abs(w[r][c]) for r in rows for c in cols)
            s = f32(amax / FP8_MAX) if amax > 0 else 1.0
            scales[ti][tj] = s
            for r in rows:
                for c in cols:
                    codes[r][c] = e4m3_encode(max(-FP8_MAX, min(FP8_MAX, f32(w[r][c] / s))))
    return codes, scales


def fp8_channel_py(w):
    """w [out][in] -> (codes [out][in], scale [out][1] float32 values)."""
    codes, scales = [], []
    for row in w:
        amax = max(abs(v) for v in row)
        s = f32(amax / FP8_MAX) if amax > 0 else 1.0
        scales.append([s])
        codes.append([e4m3_encode(max(-FP8_MAX, min(FP8_MAX, f32(v / s)))) for v in row])
    return codes, scales


def fp8_dequant_py(codes, scales, block):
    """codes [out][in] and block (scale_inv [.][.]) or channel (scale [out][1])
    scales -> float32 values code * scale, as agentkv's CPU decoding gives."""
    out = []
    for r, row in enumerate(codes):
        if block:
            srow = scales[r // BLOCK]
            out.append([f32(e4m3_value(c) * srow[j // BLOCK]) for j, c in enumerate(row)])
        else:
            s = scales[r][0]
            out.append([f32(e4m3_value(c) * s) for c in row])
    return out


def e2m1_encode(x):
    """x (|x| <= 6) -> e2m1 nibble, midpoints to the even code."""
    a, code = abs(x), 0
    for m, up in zip(MIDS, UP_ON_TIE):
        code += (a > m) + (up and a == m)
    return code | (8 if x < 0 else 0)


def e2m1_value(nibble):
    return (-1.0 if nibble & 8 else 1.0) * E2M1[nibble & 7]


def mxfp4_row_py(row):
    """One output row's inputs (len a multiple of 32) -> (16 bytes per group,
    concatenated, and one E8M0 scale byte per group)."""
    blocks, scales = bytearray(), bytearray()
    for g in range(0, len(row), MX):
        grp = row[g:g + MX]
        amax = max(abs(v) for v in grp)
        e = math.ceil(math.log2(f32(amax / 6.0))) if amax > 0 else 0
        e = max(-127, min(127, e))
        # Exact in float32 (a power of two), as torch's exp2 division.
        nib = [e2m1_encode(f32(v / 2.0 ** e)) for v in grp]
        blocks += bytes(nib[k] | (nib[k + 1] << 4) for k in range(0, MX, 2))
        scales.append(e + 127)
    return bytes(blocks), bytes(scales)


def mxfp4_row_dequant_py(blocks, scales):
    """The inverse of mxfp4_row_py: the row's values."""
    out = []
    for g, s in enumerate(scales):
        for b in blocks[g * MX // 2:(g + 1) * MX // 2]:
            out += [e2m1_value(b & 15) * 2.0 ** (s - 127), e2m1_value(b >> 4) * 2.0 ** (s - 127)]
    return out


# ---- torch (real sizes) -------------------------------------------------------

def fp8_block(w):
    """w [.., out, in] float32 tensor -> (e4m3 codes as float8_e4m3fn, scale_inv
    [.., ceil(out/128), ceil(in/128)] float32)."""
    import torch
    *lead, out, inn = w.shape
    po, pi = cdiv(out, BLOCK) * BLOCK, cdiv(inn, BLOCK) * BLOCK
    p = torch.nn.functional.pad(w, (0, pi - inn, 0, po - out))
    t = p.reshape(*lead, po // BLOCK, BLOCK, pi // BLOCK, BLOCK)
    amax = t.abs().amax(dim=(-3, -1))
    s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (t / s[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    q = q.reshape(*lead, po, pi)[..., :out, :inn]
    return q.to(torch.float8_e4m3fn).contiguous(), s.float().contiguous()


def fp8_channel(w):
    """w [.., out, in] float32 -> (e4m3 codes, scale [.., out, 1] float32)."""
    import torch
    amax = w.abs().amax(dim=-1, keepdim=True)
    s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax)).float()
    return (w / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).contiguous(), s.contiguous()


def fp8_dequant(codes, scale):
    """codes [.., out, in] float8_e4m3fn with block scale_inv [.., ceil/128,
    ceil/128] or channel scale [.., out, 1] -> float32 code * scale (the
    product rounded to float32 once, as agentkv's CPU decoding)."""
    import torch
    w = codes.float()
    s = scale.float()
    if s.shape[-1] == 1 and s.shape[-2] == w.shape[-2]:
        return w * s
    s = s.repeat_interleave(BLOCK, dim=-2).repeat_interleave(BLOCK, dim=-1)
    return w * s[..., :w.shape[-2], :w.shape[-1]]


def mxfp4(w):
    """w [E, out, in] float32 -> (blocks [E, out, in/32, 16], scales [E, out,
    in/32]) uint8."""
    import torch
    e, out, inn = w.shape
    t = w.reshape(e, out, inn // MX, MX)
    amax = t.abs().amax(dim=-1)
    exp = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6.0)), torch.zeros_like(amax))
    exp = exp.clamp(-127, 127)
    x = (t / torch.exp2(exp)[..., None]).abs()
    code = torch.zeros_like(x, dtype=torch.uint8)
    for m, up in zip(MIDS, UP_ON_TIE):
        code += (x > m).to(torch.uint8)
        if up:
            code += (x == m).to(torch.uint8)
    code |= (t < 0).to(torch.uint8) << 3
    code = code.reshape(e, out, inn // MX, MX // 2, 2)
    blocks = code[..., 0] | (code[..., 1] << 4)
    return blocks.contiguous(), (exp + 127).to(torch.uint8).contiguous()


def mxfp4_dequant(blocks, scales):
    """blocks [.., out, in/32, 16] and scales [.., out, in/32] uint8 -> float32
    [.., out, in] (exact: e2m1 times a power of two)."""
    import torch
    lut = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float32, device=blocks.device)
    lo, hi = (blocks & 15).long(), (blocks >> 4).long()
    v = torch.stack([lut[lo], lut[hi]], dim=-1).reshape(*blocks.shape[:-1], MX)
    v = v * torch.exp2(scales.float() - 127.0)[..., None]
    return v.reshape(*blocks.shape[:-2], blocks.shape[-2] * MX)

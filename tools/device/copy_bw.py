#!/usr/bin/env python3
"""The GPU's device-to-device copy bandwidth (bytes read + bytes written per
second), the memory roofline the CUDA benchmarks are stated against: a
2 GiB tensor copied 20 times after 3 warm-ups, timed with CUDA events,
median; and the bf16 matmul rate of an 8192^3 product. Prints one JSON object."""
import json
import statistics

import torch

n = 1 << 30  # 1 Gi bf16 = 2 GiB
src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
dst = torch.empty_like(src)
for _ in range(3):
    dst.copy_(src)
times = []
for _ in range(20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    dst.copy_(src)
    e.record()
    e.synchronize()
    times.append(s.elapsed_time(e) / 1e3)
t = statistics.median(times)
del src, dst
# bf16 matmul rate (random data), for the prefill (compute) floor.
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ b
mm = []
for _ in range(10):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    a @ b
    e.record()
    e.synchronize()
    mm.append(s.elapsed_time(e) / 1e3)
print(json.dumps({"device": torch.cuda.get_device_name(), "copy_bytes": 2 * 2 * n,
                  "median_s": t, "copy_bw_GBps": 2 * 2 * n / t / 1e9,
                  "matmul_tflops": 2 * 8192 ** 3 / statistics.median(mm) / 1e12}))

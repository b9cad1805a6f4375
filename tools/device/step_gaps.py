#!/usr/bin/env python3
"""Reads tools/device/kernel_trace.cc's output and prints, per engine step
(a step starts at each Embed kernel), its kernels' span, the idle time
before the next step's first kernel and the copies that ran in that gap;
then, for the steps that ran cuBLAS kernels (prompt steps), the time of
each kernel kind summed over those steps.
  step_gaps.py TRACE [--steps N]   (N: how many steps to list one by one)"""
import argparse
import collections
import statistics

from kernel_names import short, split_steps

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--steps", type=int, default=12)
a = ap.parse_args()

kernels, copies = [], []
for line in open(a.trace):
    p = line.split(" ", 6)
    r = (int(p[0]), int(p[1]), short(p[6].strip())[:60], (int(p[3]), int(p[4])))
    (copies if r[2].startswith("memcpy") else kernels).append(r)

steps = split_steps(kernels, lambda r: r[2])
# The warm-up and graph capture come first; keep the last run's steps:
# from the last step whose gap before it exceeds 50 ms.
start = 0
for i in range(1, len(steps)):
    if steps[i][0][0] - max(k[1] for k in steps[i - 1]) > 50e6:
        start = i
steps = steps[start:]

rows = []
for i, s in enumerate(steps):
    end = max(k[1] for k in s)
    nxt = steps[i + 1][0][0] if i + 1 < len(steps) else None
    cs = [c for c in copies if c[0] >= end and (nxt is None or c[0] < nxt)]
    prompt = any("Kernel" not in k[2] for k in s)
    rows.append((i, len(s), (end - s[0][0]) / 1e3, (nxt - end) / 1e3 if nxt else 0.0, prompt, cs))
print(f"{len(steps)} steps in the last run")
print("| step | kernels | span us | gap to next us | prompt | copies in the gap (kind:bytes:us) |")
print("| --- | --- | --- | --- | --- | --- |")
for i, n, span, gap, prompt, cs in (rows if len(rows) <= a.steps + 3 else rows[:a.steps] + rows[-3:]):
    cd = " ".join(f"{c[2][6:]}:{c[3][0]}:{(c[1] - c[0]) / 1e3:.1f}" for c in cs)
    print(f"| {i} | {n} | {span:.1f} | {gap:.1f} | {'y' if prompt else ''} | {cd} |")
dec = [r for r in rows if not r[4] and r[3] > 0]
if dec:
    print(f"decode steps: {len(dec)}, span median {statistics.median(r[2] for r in dec):.1f} us, "
          f"gap median {statistics.median(r[3] for r in dec):.1f} us "
          f"(min {min(r[3] for r in dec):.1f}, max {max(r[3] for r in dec):.1f})")
pr = [steps[r[0]] for r in rows if r[4]]
if pr:
    tot = sum((max(k[1] for k in s) - s[0][0]) for s in pr) / 1e3
    kinds = collections.defaultdict(lambda: [0, 0.0])
    for s in pr:
        for k in s:
            kk = kinds[k[2][:50]]
            kk[0] += 1
            kk[1] += (k[1] - k[0]) / 1e3
    print(f"\nprompt steps: {len(pr)}, {tot:.0f} us in all; kernel time by kind:")
    print("| kernel | launches | us | % of the prompt steps |\n| --- | --- | --- | --- |")
    for name, (c, us) in sorted(kinds.items(), key=lambda kv: -kv[1][1])[:20]:
        print(f"| {name} | {c} | {us:.0f} | {100 * us / tot:.1f} |")

#!/usr/bin/env python3
"""Reads tools/device/kernel_trace.cc's output and prints where the decode
steps of one batch size go: per kernel of the step (median over steps),
its duration (start to end), its marginal time (its end minus the previous
kernel's end: what the step would save were it free) and how early it
started (previous end minus its start: overlap under programmatic launch).
A step starts at each Embed kernel; steps are kept whose attention grid has
--tiles tiles and that run no cuBLAS kernel."""
import argparse
import collections
import statistics

from kernel_names import short, split_steps

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--tiles", type=int, default=64)
ap.add_argument("--layer", type=int, default=5, help="layer whose kernels are listed one by one")
a = ap.parse_args()

rows = []
for line in open(a.trace):
    p = line.split(" ", 6)
    if p[6].startswith("memcpy"):  # copies (kernel_trace.cc): not kernels of a step
        continue
    name = short(p[6].strip())
    rows.append((int(p[0]), int(p[1]), (int(p[3]), int(p[4]), int(p[5])), name[:60]))

steps = split_steps(rows, lambda r: r[3])

def keep(s):
    # Ours are all named ...Kernel; cuBLAS's (nvjet_*, *gemm*) are not.
    return (any("Attention" in r[3] and r[2][1] == a.tiles for r in s) and
            all("Kernel" in r[3] for r in s))

good = [s for s in steps if keep(s)]
n = collections.Counter(len(s) for s in good).most_common(1)[0][0]
good = [s for s in good if len(s) == n]
print(f"{len(good)} steps of {n} kernels (of {len(steps)} steps)")
tot = [(s[-1][1] - s[0][0]) / 1e3 for s in good]
print(f"step: median {statistics.median(tot):.1f} us (first start to last end)")
per = []
for i in range(n):
    d = [(s[i][1] - s[i][0]) / 1e3 for s in good]
    m = [(s[i][1] - (s[i - 1][1] if i else s[i][0])) / 1e3 for s in good]
    e = [((s[i - 1][1] - s[i][0]) / 1e3 if i else 0.0) for s in good]
    per.append((good[0][i][3], good[0][i][2], statistics.median(d), statistics.median(m),
                statistics.median(e)))
kinds = collections.defaultdict(lambda: [0, 0.0, 0.0])
for name, grid, d, m, e in per:
    k = kinds[name + " " + "x".join(map(str, grid))]
    k[0] += 1
    k[1] += d
    k[2] += m
print("| kernel grid | per step | duration us | marginal us |\n| --- | --- | --- | --- |")
for k, (c, d, m) in sorted(kinds.items(), key=lambda kv: -kv[1][2]):
    print(f"| {k} | {c} | {d:.1f} | {m:.1f} |")
# One layer's kernels: find the layer'th attention and list from the kernel after the one before it.
att = [i for i, p in enumerate(per) if "Attention" in p[0]]
if len(att) > a.layer + 1:
    lo, hi = att[a.layer] - 2, att[a.layer + 1] - 2
    print(f"\nlayer {a.layer}: kernels {lo}..{hi - 1}")
    print("| kernel | grid | duration | marginal | started before previous end |\n| --- | --- | --- | --- | --- |")
    for name, grid, d, m, e in per[lo:hi]:
        print(f"| {name} | {'x'.join(map(str, grid))} | {d:.1f} | {m:.1f} | {e:.1f} |")

#!/usr/bin/env python3
"""Sums `ncu --csv --metrics gpu__time_duration.sum` output by kernel name:
per-step time of each kernel kind (pass --steps, the decode steps the
profiled window covers). Prints a Markdown table, largest first."""
import argparse
import collections
import csv
import re

ap = argparse.ArgumentParser()
ap.add_argument("csv")
ap.add_argument("--steps", type=float, default=1.0)
ap.add_argument("--by-grid", action="store_true", help="one line per kernel and grid size")
a = ap.parse_args()
lines = open(a.csv).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
tot = collections.Counter()
cnt = collections.Counter()
for row in csv.DictReader(lines[start:]):
    if row.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = re.sub(r"\(.*", "", row["Kernel Name"])[:70]
    if a.by_grid:
        name += " " + row.get("Grid Size", "")
    v = float(row["Metric Value"].replace(",", ""))
    unit = row.get("Metric Unit", "ns")
    v *= {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}.get(unit, 1e-3)
    tot[name] += v
    cnt[name] += 1
print(f"| kernel | us per step | launches per step |\n| --- | --- | --- |")
for k, v in tot.most_common():
    print(f"| {k} | {v / a.steps:.1f} | {cnt[k] / a.steps:.1f} |")
print(f"| total | {sum(tot.values()) / a.steps:.1f} | {sum(cnt.values()) / a.steps:.1f} |")

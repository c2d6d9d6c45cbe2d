"""Compares two runs' metrics JSONL files step by step, ignoring timings.

  python scripts/compare_metrics.py RUN_A/metrics.jsonl RUN_B/metrics.jsonl [--rtol 1e-4]

Prints one table row per (step, metric) with both values and exits 1 when a non-timing metric
differs beyond the tolerance (or a step / metric is missing on one side).
"""

import argparse
import json
import math
import sys


def load(path):
  with open(path, encoding="utf-8") as f:
    return {int(r["step"]): r for r in map(json.loads, filter(str.strip, f))}


def is_timing(key: str) -> bool:
  return key.startswith("time_") or key.endswith("_s") or "latency" in key


def compare(a: dict, b: dict, rtol: float, atol: float) -> list[str]:
  """Names of the differing (step, metric) pairs."""
  bad = []
  for step in sorted(set(a) | set(b)):
    ra, rb = a.get(step), b.get(step)
    if ra is None or rb is None:
      bad.append(f"step {step}: only in {'B' if ra is None else 'A'}")
      continue
    for k in sorted(set(ra) | set(rb)):
      if is_timing(k):
        continue
      va, vb = ra.get(k), rb.get(k)
      if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
        if not math.isclose(va, vb, rel_tol=rtol, abs_tol=atol):
          bad.append(f"step {step} {k}: {va} vs {vb}")
      elif va != vb:
        bad.append(f"step {step} {k}: {va!r} vs {vb!r}")
  return bad


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("a")
  p.add_argument("b")
  p.add_argument("--rtol", type=float, default=1e-4)
  p.add_argument("--atol", type=float, default=1e-6)
  p.add_argument("--keys", default="", help="comma-separated metrics to print (default: all)")
  args = p.parse_args()
  a, b = load(args.a), load(args.b)
  keys = [k for k in args.keys.split(",") if k]
  for step in sorted(set(a) & set(b)):
    for k in keys or sorted(a[step]):
      print(f"step {step:3d} {k:32s} {a[step].get(k)!s:>24s} {b[step].get(k)!s:>24s}")
  bad = compare(a, b, args.rtol, args.atol)
  for line in bad:
    print("DIFF", line)
  print("match" if not bad else f"{len(bad)} differences")
  sys.exit(1 if bad else 0)


if __name__ == "__main__":
  main()

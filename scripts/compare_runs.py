"""Checks that two demo runs are the same run: per-step metrics equal exactly (timings aside) and
the final weights byte-identical (the RL phase's HF export).

  python scripts/compare_runs.py WORKDIR_A WORKDIR_B

Timings are the keys `compare_metrics.is_timing` names plus the asynchronous source's idle
fractions and learner wait (wall-clock shares); the supervisor's ``restarts`` count is left out
too (the run's history). Exits 1 on any difference.

``--ignore KEY`` (repeatable) leaves a metric out and says so. Use it only for a key that two
runs of the SAME code already disagree on: e.g. ``sampler_logprob_drift`` (the embedded
sampler's log-probs move in the last bits with how requests happened to share decode batches,
i.e. with machine load; the sampled tokens, rewards and weights do not). Show that noise floor
by comparing two runs of the old code first.
"""

import argparse
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_metrics  # noqa: E402

WEIGHTS = ("rl/hf/model.safetensors",)


# What a run went through rather than what it computed: ``restarts`` (the supervisor's count,
# docs/metrics.md) is 0 in an undisturbed run and >0 in one whose learner was killed.
RUN_HISTORY = ("restarts",)


def is_wall_clock(key: str) -> bool:
  return compare_metrics.is_timing(key) or key.endswith("idle_frac") or "wait" in key


def digest(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("a")
  p.add_argument("b")
  p.add_argument("--ignore", action="append", default=[], metavar="KEY")
  args = p.parse_args()
  a, b = (compare_metrics.load(os.path.join(d, "rl", "metrics.jsonl")) for d in (args.a, args.b))
  for runs in (a, b):
    for row in runs.values():
      for k in [k for k in row if is_wall_clock(k) or k in RUN_HISTORY or k in args.ignore]:
        del row[k]
  bad = compare_metrics.compare(a, b, rtol=0.0, atol=0.0)
  keys = sum(len(r) for r in a.values())
  for rel in WEIGHTS:
    da, db = (digest(os.path.join(d, rel)) for d in (args.a, args.b))
    print(f"{rel}: {da[:16]} vs {db[:16]}")
    if da != db:
      bad.append(f"{rel} differs")
  for line in bad:
    print("DIFF", line)
  print(f"{len(a)} steps, {keys} metric values compared exactly")
  if args.ignore:
    print(f"left out (run-to-run noise of the same code): {', '.join(args.ignore)}")
  print("identical" if not bad else f"{len(bad)} differences")
  sys.exit(1 if bad else 0)


if __name__ == "__main__":
  main()

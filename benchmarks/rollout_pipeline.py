"""Rollout pipeline benchmark: the async agent loop vs a per-turn-barrier loop.

Simulated engine and code tool (no model, no sandbox): each generate call sleeps for a latency
drawn from a log-normal (continuous batching: up to `--slots` requests in flight), each tool
call sleeps for a heavy-tailed log-normal latency, and each trajectory makes a random number of
tool calls before answering. Latencies depend only on (trajectory, turn), so both loops see
exactly the same work. The barrier loop is the synchronous pattern rStar2-Agent removed (paper §3.2; docs/reference.md §5):
every active trajectory generates turn k, then all their tool calls run, then turn k + 1.

    python benchmarks/rollout_pipeline.py [--trajectories 64] [--slots 32]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import math
import os
import sys
import time

from rstar_jax.rollout.agent_loop import RolloutSettings, run_agent_loop
from rstar_jax.rollout.types import GenerateRequest, GenerateResult, SamplingParams
from rstar_jax.tokenization import chat_format as cf
from rstar_jax.tokenization.bpe import train_bpe_tokenizer
from rstar_jax.tools.code_pool import ExecResult

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/json_stdout.py
import json_stdout  # noqa: E402


def _u(*key) -> float:
  h = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
  return (int.from_bytes(h, "little") + 0.5) / 2**64


def _lognormal(mean: float, sigma: float, *key) -> float:
  u = min(max(_u(*key), 1e-9), 1 - 1e-9)
  z = math.sqrt(2) * _erfinv(2 * u - 1)
  return mean * math.exp(sigma * z - sigma**2 / 2)


def _erfinv(y: float) -> float:  # Newton on erf; fine for a benchmark
  x = 0.0
  for _ in range(60):
    x -= (math.erf(x) - y) / (2 / math.sqrt(math.pi) * math.exp(-x * x))
  return x


@dataclasses.dataclass
class Sim:
  gen_mean_s: float = 0.08
  gen_sigma: float = 0.6
  tool_mean_s: float = 0.15
  tool_sigma: float = 1.0
  max_calls: int = 6


class SimEngine:
  def __init__(self, tok, sim: Sim, slots: int):
    self.tok, self.sim, self.slots = tok, sim, asyncio.Semaphore(slots)
    self.im_end = cf.stop_token_id(tok)
    self.final = tok.encode("done</reason><answer>\\boxed{1}</answer>", add_special_tokens=False)

  weight_version = 0

  async def generate(self, reqs):
    return list(await asyncio.gather(*[self._one(r) for r in reqs]))

  async def _one(self, r: GenerateRequest):
    tid, turn = r.rid.rsplit(":", 1)
    pi = tid.split("-p")[1]  # problem index from "...-p{pi}-s{si}"
    turn = int(turn)
    async with self.slots:
      await asyncio.sleep(_lognormal(self.sim.gen_mean_s, self.sim.gen_sigma, pi, turn, "g"))
    n_calls = 1 + int(_u(pi, "calls") * self.sim.max_calls)
    if turn < n_calls:
      ids = self.tok.encode(
        "run" + cf.format_tool_call(f"print({turn}+{len(pi)})", pi), add_special_tokens=False
      )
    else:
      ids = list(self.final)
    ids = (ids + [self.im_end])[: r.sampling.max_new_tokens]
    return GenerateResult(ids, [0.0] * len(ids), "stop", 0)


class SimPool:
  def __init__(self, sim: Sim):
    self.sim = sim

  async def execute(self, code, stdin="", timeout_s=None, session_id=None):
    d = _lognormal(self.sim.tool_mean_s, self.sim.tool_sigma, code, stdin, "t")
    await asyncio.sleep(d)
    return ExecResult("ok", "1\n", "", d)


async def barrier_loop(engine, tok, pool, problems, n, cfg: RolloutSettings):
  """Per-turn barrier: all trajectories generate, then all tools run, then the next turn."""
  live = []
  for pi, q in enumerate(problems):
    for si in range(n):
      live.append(
        {
          "tid": f"b-p{pi}-s{si}",
          "prompt": cf.prompt_ids(tok, "rstar2", q),
          "resp": [],
          "turns": 0,
          "done": False,
        }
      )
  while any(not t["done"] for t in live):
    act = [t for t in live if not t["done"]]
    reqs = [
      GenerateRequest(
        t["prompt"] + t["resp"],
        SamplingParams(
          cfg.response_budget - len(t["resp"]), stop_token_ids=(cf.stop_token_id(tok),)
        ),
        rid=f"{t['tid']}:{t['turns']}",
      )
      for t in act
    ]
    results = await engine.generate(reqs)
    jobs = []
    for t, r in zip(act, results):
      t["resp"] += r.output_ids
      t["turns"] += 1
      calls = cf.parse_tool_calls(tok.decode(r.output_ids, skip_special_tokens=False))
      if not calls or t["turns"] >= cfg.max_turns:
        t["done"] = True
      else:
        jobs.append((t, calls))
    outs = await asyncio.gather(
      *[asyncio.gather(*[pool.execute(c.code, c.stdin) for c in cs]) for _, cs in jobs]
    )
    for (t, _), rs in zip(jobs, outs):
      t["resp"] += cf.tool_turn_ids(tok, "rstar2", [r.stdout for r in rs])
  return live


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--trajectories", type=int, default=64)
  ap.add_argument("--slots", type=int, default=32)
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
  args = ap.parse_args()
  emit = json_stdout.reserve(args.json)  # --json: stdout holds the JSON only
  tok = train_bpe_tokenizer(
    [cf.SYSTEM_PROMPT, cf.TOOLS_BLOCK, cf.USER_PREFIX, cf.format_tool_call("print(1+2)", "x")] * 4,
    512,
  )
  sim = Sim()
  cfg = RolloutSettings(max_turns=10, response_budget=8192)
  problems = [f"problem {i}" for i in range(args.trajectories)]
  rows = []
  for name, fn in [("per-turn barrier", barrier_loop), ("async agent loop", run_agent_loop)]:
    best = float("inf")
    for _ in range(args.repeats):
      eng, pool = SimEngine(tok, sim, args.slots), SimPool(sim)
      t0 = time.perf_counter()
      kw = {"render": lambda r, n: r.stdout} if fn is run_agent_loop else {}
      out = asyncio.run(fn(eng, tok, pool, problems, 1, cfg, **kw))
      best = min(best, time.perf_counter() - t0)
      assert len(out) == args.trajectories
    rows.append((name, best, args.trajectories / best))
  ref = rows[0][2]
  print(
    f"simulated: gen lognormal(mean {sim.gen_mean_s}s, sigma {sim.gen_sigma}) x "
    f"{args.slots} slots; tool lognormal(mean {sim.tool_mean_s}s, sigma {sim.tool_sigma}); "
    f"1-{sim.max_calls} tool calls per trajectory; {args.trajectories} trajectories"
  )
  print(f"{'loop':<20} {'wall s':>8} {'traj/s':>8} {'vs barrier':>10}")
  for name, wall, tps in rows:
    print(f"{name:<20} {wall:8.2f} {tps:8.2f} {tps / ref:9.2f}x")
  if args.json:
    emit(
      {
        "trajectories": args.trajectories,
        "slots": args.slots,
        "rows": [
          {"loop": n, "wall_s": w, "traj_per_s": t, "vs_barrier": t / ref} for n, w, t in rows
        ],
      }
    )


if __name__ == "__main__":
  main()

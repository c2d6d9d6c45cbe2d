"""Issue 39: what replaying a re-prefill's routes does to the earlier turn's tokens.

A JaxSampler turn whose kept prefix was evicted prefills the earlier turns again and reports
their routes a second time; in bf16 some near-ties flip between that prefill and the decode
that sampled the tokens. This samples N two-turn trajectories on a tiny Qwen3-MoE (bf16
sampler, random weights scaled to make a peaked model), drops each one's kept prefix before
turn 2 (what an eviction leaves), and compares the f32 learner's log-probs with the sampler's
under three route choices: the re-prefill's report winning ("newest", the rule before the
fix), the first report winning ("first", `routes.write_routes` now), and the learner's own
routing ("own").

  PYTHONPATH=$PWD python scripts/route_reprefill_effect.py --scale 20 --trajectories 8
"""

import argparse
import asyncio
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from rstar_jax.models import qwen3, qwen3_moe  # noqa: E402
from rstar_jax.models import routes as routes_lib  # noqa: E402
from rstar_jax.models.qwen3_config import Qwen3MoeConfig  # noqa: E402
from rstar_jax.rollout.jax_sampler import JaxSampler  # noqa: E402
from rstar_jax.rollout.types import GenerateRequest, SamplingParams  # noqa: E402

A = argparse.ArgumentParser()
A.add_argument("--scale", type=float, default=20.0, help="weights x this (init std 0.02)")
A.add_argument("--trajectories", type=int, default=8)
A.add_argument("--experts", type=int, default=16)
ARGS = A.parse_args()

CONFIG = Qwen3MoeConfig(
  vocab_size=64,
  hidden_size=32,
  intermediate_size=40,
  moe_intermediate_size=16,
  num_hidden_layers=3,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=8,
  num_experts=ARGS.experts,
  num_experts_per_tok=2,
  moe_implementation="dense",
)
PROMPT = [3, 9, 27, 17, 51, 1, 8, 33, 12, 40]
TOOL = [5, 6, 7]
p0 = qwen3.init_params(CONFIG, jax.random.key(0))
params = jax.tree_util.tree_map_with_path(
  lambda k, x: x if "scale" in jax.tree_util.keystr(k) else x * ARGS.scale, p0
)
fwd = jax.jit(qwen3_moe.forward, static_argnames=("config",))
eng = JaxSampler(
  CONFIG, params, max_batch=8, max_len=256, page_size=8, decode_chunk=8, return_routes=True,
  dtype="bfloat16",
)  # fmt: skip


async def one(s):
  tid = f"t{s}"
  async with eng.trajectory_lease(tid):
    sp = SamplingParams(150, seed=s, temperature=1.0)
    (a,) = await eng.generate([GenerateRequest(PROMPT, sp, rid=f"{tid}:0")])
    async with eng._lock:  # what an eviction by another admission leaves: no kept prefix
      eng._free.extend(eng._kept.pop(tid).pages)
    sp = SamplingParams(30, seed=s + 100, temperature=1.0)
    (b,) = await eng.generate([GenerateRequest(PROMPT + a.output_ids + TOOL, sp, rid=f"{tid}:1")])
  return a, b


async def main():
  return await asyncio.gather(*[one(s) for s in range(ARGS.trajectories)])


stats = {f"{r} {t}": [] for t in ("turn 1", "turn 2") for r in ("newest", "first", "own")}
flips = pairs = 0
for a, b in asyncio.run(main()):
  P = len(PROMPT)
  seq = PROMPT + a.output_ids + TOOL + b.output_ids
  shape = routes_lib.layout_of(CONFIG).shape
  # The rule before the fix (the newest report wins) is today's rule (the first wins) fed
  # the reports in reverse order.
  newest = routes_lib.empty_routes(len(seq), shape)
  routes_lib.write_routes(newest, b.routes_start, b.routes)
  routes_lib.write_routes(newest, a.routes_start, a.routes)
  first = routes_lib.empty_routes(len(seq), shape)
  routes_lib.write_routes(first, a.routes_start, a.routes)
  routes_lib.write_routes(first, b.routes_start, b.routes)
  n1 = len(a.output_ids)
  d = np.sort(newest[P - 1 : P - 1 + n1], -1) != np.sort(first[P - 1 : P - 1 + n1], -1)
  flips += int(d.any(-1).sum())
  pairs += int(d.any(-1).size)
  t1 = [P - 1 + i for i in range(n1)]
  t2 = [len(seq) - len(b.output_ids) - 1 + i for i in range(len(b.output_ids))]
  for name, r in (("newest", newest), ("first", first), ("own", None)):
    logits = fwd(
      params, CONFIG, jnp.asarray([seq]), routes=None if r is None else jnp.asarray(r[None])
    )
    lp = np.asarray(jax.nn.log_softmax(logits[0], -1))
    stats[f"{name} turn 1"].append(np.array([lp[c, seq[c + 1]] for c in t1]) - a.logprobs)
    stats[f"{name} turn 2"].append(np.array([lp[c, seq[c + 1]] for c in t2]) - b.logprobs)
print(
  f"scale {ARGS.scale}, {ARGS.trajectories} trajectories: turn-1 decode (token, layer) pairs "
  f"the re-prefill reported with other experts: {flips} of {pairs}"
)
for k, v in stats.items():
  v = np.abs(np.concatenate(v))
  print(f"  {k}: max |log r| {v.max():.4f}, mean {v.mean():.5f} (n {v.size})")

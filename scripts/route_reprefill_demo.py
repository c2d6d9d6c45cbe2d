"""Issue 39 at demo scale: one RL step's rollouts of configs/demo.py:moe (bf16 JaxSampler, routes
recorded, tool turns) from an SFT checkpoint; counts kept-prefix evictions, the later turns that
re-prefilled earlier turns, the (token, layer) routes such a re-prefill reported with other
experts, and what replaying them (newest wins, the rule before the fix) vs the sampled-with
ones (first wins) does to the f32 learner's log-prob of the generated tokens they precede.

  PYTHONPATH=$PWD python scripts/route_reprefill_demo.py <workdir with tokenizer/ and
      sft/ckpt/<step>/> <step> <prompts per step> <rollout.max_batch>
"""

import asyncio
import collections
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from configs import demo as demo_cfg
from rstar_jax import cli
from rstar_jax.models import qwen3_moe
from rstar_jax.models import routes as routes_lib
from rstar_jax.pipelines import demo, rl_loop, wiring
from rstar_jax.rollout import jax_sampler
from rstar_jax.tokenization import bpe

W, STEP = sys.argv[1], int(sys.argv[2])
cfg = demo_cfg.get_config("moe")
cfg.rl.routing_replay = "rollout"
cfg.train.seed = 0
cfg.train.batch_prompts = int(sys.argv[3])
cfg.rollout.max_batch = int(sys.argv[4])
run = cli.typed_config(cfg, "rl", "demo_evict")
rcfg = demo._derived(run, "rl")
mc = rcfg.model.qwen3_config()
raw = ocp.StandardCheckpointer().restore(os.path.join(W, "sft", "ckpt", str(STEP), "state"))
params = jax.tree.map(jnp.asarray, raw["params"])
tok = bpe.load_tokenizer(os.path.join(W, "tokenizer"))
train, _ = demo.problems_for(run)
learner = wiring.build_learner(rcfg, params=params)
reports = collections.defaultdict(list)  # tid -> [(turn, input len, routes_start, routes)]
_gen = jax_sampler.JaxSampler.generate
engines = []


async def spy(self, requests):
  engines.append(self)
  out = await _gen(self, requests)
  for req, res in zip(requests, out):
    tid, turn = req.rid.rsplit(":", 1)
    reports[tid].append(
      (
        int(turn),
        len(req.input_ids),
        res.routes_start,
        res.routes,
        list(res.output_ids),
        list(res.logprobs),
      )
    )
  return out


jax_sampler.JaxSampler.generate = spy


async def collect():
  async with wiring.open_runner(rcfg, learner.model_config, learner.params_copy(), tok) as runner:
    loop = rl_loop.RLLoop(
      rcfg, learner, runner, tempfile.mkdtemp(), problems=train, eval_problems=[]
    )
    loop._make_iterator(None)
    ro = await loop.rollout(loop.stages[0])
    await loop.source.close()
    return ro


ro = asyncio.run(collect())
trajs = [t for g in ro.groups for t in g]
eng = engines[0]
multi = [t for t, r in reports.items() if len(r) > 1]
print(
  f"{len(trajs)} trajectories, {len(multi)} multi-turn; sampler evictions {eng.evictions}",
  flush=True,
)
reprefilled = replaced = pairs_overlap = 0
cases = []
for tid in multi:
  r = sorted(reports[tid])
  shape = r[0][3].shape[1:]
  n = r[-1][1] + len(r[-1][4])
  first = routes_lib.empty_routes(n, shape)
  newest = routes_lib.empty_routes(n, shape)
  for _, _, s, rt, _, _ in r:
    routes_lib.write_routes(first, s, rt)
  for _, _, s, rt, _, _ in r[::-1]:
    routes_lib.write_routes(newest, s, rt)
  for k in range(1, len(r)):
    prev_end = r[k - 1][1] + len(r[k - 1][4]) - 1  # positions reported by turn k-1: < prev_end
    if r[k][2] < prev_end:
      reprefilled += 1
  d = (np.sort(first, -1) != np.sort(newest, -1)).any(-1) & routes_lib.has_route(first)[:, None]
  replaced += int(d.sum())
  if d.any():
    cases.append((tid, r, first, newest, d))
print(
  f"later turns that re-prefilled an earlier turn's positions: {reprefilled}; (token, layer) routes a re-prefill reported with other experts: {replaced} in {len(cases)} trajectories",
  flush=True,
)
fwd = jax.jit(qwen3_moe.forward, static_argnames=("config",))
worst = []
for tid, r, first, newest, d in cases:
  # the sequence and the sampled tokens with their sampler log-probs, from the reports
  last = r[-1]
  tr = (
    next(
      (
        t
        for t in trajs
        if len(t.prompt_ids) + len(t.response_ids) == last[1] + len(last[4])
        and list(t.response_ids[-len(last[4]) :] if last[4] else []) == last[4]
      ),
      None,
    )
    if last[4]
    else None
  )
  if tr is None:
    continue
  seq = list(tr.prompt_ids) + list(tr.response_ids)
  P = len(tr.prompt_ids)
  lm = np.zeros(len(seq), bool)
  lm[P:] = np.asarray(tr.loss_mask) > 0
  samp = np.zeros(len(seq))
  samp[P:] = np.asarray(tr.logprobs)
  out = {}
  for name, rt in (("first", first), ("newest", newest), ("own", None)):
    logits = fwd(
      params, mc, jnp.asarray([seq]), routes=None if rt is None else jnp.asarray(rt[None])
    )
    lp = np.asarray(jax.nn.log_softmax(logits[0], -1))
    out[name] = np.array([lp[j - 1, seq[j]] for j in range(1, len(seq))])
  hit = d.any(-1)  # positions c with a replaced route: token c + 1 directly affected
  for c in np.flatnonzero(hit):
    j = c + 1
    if j < len(seq) and lm[j]:
      worst.append(
        tuple(round(float(out[k][j - 1] - samp[j]), 4) for k in ("newest", "first", "own"))
      )
print(
  "directly affected generated tokens: log ratio (newest-wins replay, first-wins replay, own routing):"
)
for w in sorted(worst, key=lambda x: -abs(x[0])):
  print("  ", w)

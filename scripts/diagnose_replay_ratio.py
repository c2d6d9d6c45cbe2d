"""Issue 39: why routing replay sometimes pushes a token's importance ratio further out.

Loads the MoE demo's final policy, samples multi-turn rollouts through the RL loop's own
source (bf16 JaxSampler recording routes), builds the host RL batch as the loop does, and
compares the learner's f32 log-probs with forced and with own routes against the sampler's.
Prints agreement by token class (alignment check) and, for the worst replayed tokens, the
per-layer engine vs learner top-k and the learner's f32 router probabilities (tie margin).

  PYTHONPATH=$PWD python scripts/diagnose_replay_ratio.py --run=/work/runs/moe_full_replay
"""

import argparse
import asyncio
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from configs import demo as demo_cfg  # noqa: E402
from rstar_jax import cli  # noqa: E402
from rstar_jax.learner import batch as batch_lib  # noqa: E402
from rstar_jax.models import moe, qwen3, qwen3_moe  # noqa: E402
from rstar_jax.pipelines import demo, rl_loop, wiring  # noqa: E402
from rstar_jax.tokenization import bpe  # noqa: E402

P = argparse.ArgumentParser()
P.add_argument("--run", default="/work/runs/moe_full_replay")
P.add_argument("--prompts", type=int, default=4)
P.add_argument("--top", type=int, default=12)
P.add_argument("--seed", type=int, default=1)
A = P.parse_args()

cfg = demo_cfg.get_config("moe")
cfg.rl.routing_replay = "rollout"
cfg.train.batch_prompts = A.prompts
cfg.train.seed = A.seed
run = cli.typed_config(cfg, "rl", "diagnose")
rcfg = demo._derived(run, "rl")
mc = rcfg.model.qwen3_config()
params = qwen3.load_hf_params(os.path.join(A.run, "rl", "hf"), mc)
tok = bpe.load_tokenizer(os.path.join(A.run, "tokenizer"))
train, _ = demo.problems_for(run)
learner = wiring.build_learner(rcfg, params=params)
work = tempfile.mkdtemp(prefix="replay39_")


async def collect():
  async with wiring.open_runner(rcfg, learner.model_config, learner.params_copy(), tok) as runner:
    loop = rl_loop.RLLoop(rcfg, learner, runner, work, problems=train, eval_problems=[])
    loop._make_iterator(None)
    ro = await loop.rollout(loop.stages[0])
    await loop.source.close()
    return ro, runner.pad_id


ro, pad_id = asyncio.run(collect())
trajs = [t for g in ro.groups for t in g]
longest = max(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
pad_to = -(-longest // 64) * 64
b = batch_lib.make_rl_batch(trajs, [0.0] * len(trajs), pad_to, pad_id=pad_id, row_multiple=1)
ids, am, lm = b["input_ids"], b["attention_mask"], b["loss_mask"]
routes, samp = b[batch_lib.ROUTES_KEY], b[batch_lib.SAMPLER_KEY]
print(f"{len(trajs)} trajectories, batch {ids.shape}, routes {routes.shape}", flush=True)

# The learner's router probabilities per layer, captured from inside the scanned layers.
probs_log = []
_route = moe.route


def route_spy(x, gate, k, norm, routes=None):
  r = _route(x, gate, k, norm, routes)
  jax.debug.callback(lambda p: probs_log.append(np.asarray(p)), r.probs, ordered=True)
  return r


moe.route = route_spy


def fwd(forced):
  probs_log.clear()
  logits, aux = qwen3_moe.forward(
    learner.state.params if hasattr(learner.state, "params") else params,
    mc,
    jnp.asarray(ids),
    attention_mask=jnp.asarray(am),
    routes=jnp.asarray(routes) if forced else None,
    return_aux=True,
  )
  jax.effects_barrier()
  lp = jax.nn.log_softmax(logits[:, :-1], -1)
  lp = jnp.take_along_axis(lp, jnp.asarray(ids)[:, 1:, None], -1)[..., 0]
  lp = np.concatenate([np.zeros((ids.shape[0], 1), np.float32), np.asarray(lp)], 1)
  pr = np.stack(probs_log).reshape(mc.num_hidden_layers, ids.shape[0], ids.shape[1], -1)
  return lp, np.asarray(aux.topk), pr


lp_own, topk_own, pr_own = fwd(False)
lp_rep, topk_rep, pr_rep = fwd(True)
mask = (lm > 0).copy()
mask[:, 0] = False
lr_own, lr_rep = lp_own - samp, lp_rep - samp
for name, lr in (("own", lr_own), ("replay", lr_rep)):
  v = lr[mask]
  print(
    f"{name}: ratio min {np.exp(v.min()):.3f} max {np.exp(v.max()):.3f} mean|log| {np.abs(v).mean():.5f}"
  )

# Alignment: agreement of the engine's set with the learner's own top-k by token class. An
# off-by-one or a misaligned re-render would show as a class with agreement far below the rest.
rec = (routes >= 0).all(-1)  # [N, T, L]
agree = np.sort(routes, -1) == np.sort(topk_own, -1)
agree = agree.all(-1)
valid = am > 0
gen = lm > 0
prev_gen = np.zeros_like(gen)
prev_gen[:, 1:] = gen[:, :-1]
next_gen = np.zeros_like(gen)
next_gen[:, :-1] = gen[:, 1:]
plen = np.array([len(t.prompt_ids) for t in trajs])
pos = np.arange(ids.shape[1])[None]
prompt = pos < plen[:, None]
classes = {
  "prompt": valid & prompt,
  "last prompt token": valid & (pos == plen[:, None] - 1),
  "generated": valid & gen,
  "tool/env (masked, after prompt)": valid & ~gen & ~prompt,
  "masked token right before a generated turn": valid & ~gen & next_gen & ~prompt,
  "first generated token of a turn": valid & gen & ~prev_gen,
}
for name, c in classes.items():
  m = c[..., None] & rec
  print(
    f"agreement [{name}]: {agree[m].mean():.4f} over {m.sum()} (token,layer) recorded, "
    f"{(c[..., None] & ~rec).sum()} unrecorded"
  )
# Agreement shifted by one: if routes were off by one, shifting would raise agreement.
for s in (-1, 1):
  sh = np.roll(routes, s, axis=1)
  a = (np.sort(sh, -1) == np.sort(topk_own, -1)).all(-1)
  m = valid[..., None] & rec & np.roll(rec, s, axis=1)
  print(f"agreement with routes shifted {s:+d}: {a[m].mean():.4f}")

# Worst replayed tokens (target j is predicted at column j - 1).
score = np.where(mask, np.abs(lr_rep), -1)
order = np.argsort(score, None)[::-1][: A.top]
for flat in order:
  i, j = np.unravel_index(flat, score.shape)
  c = j - 1
  n_dis = [(int(l)) for l in range(mc.num_hidden_layers) if rec[i, c, l] and not agree[i, c, l]]
  dis_before = int((rec[i, :j] & ~agree[i, :j]).sum())
  where = []
  if not gen[i, c]:
    where.append("input token is prompt/tool" if c >= plen[i] else "input is prompt")
  if gen[i, j] and not prev_gen[i, j]:
    where.append("first token of a turn")
  if j >= am[i].sum() - 2:
    where.append("last positions")
  print(
    f"\n row {i} target pos {j} (len {int(am[i].sum())}, prompt {plen[i]}) "
    f"ratio own {np.exp(lr_own[i, j]):.3f} replay {np.exp(lr_rep[i, j]):.3f} "
    f"| {', '.join(where) or 'mid generated span'}; disagreeing (pos,layer) in prefix: "
    f"{dis_before}; at predicting pos: layers {n_dis}"
  )
  for l in range(mc.num_hidden_layers):
    e, o = routes[i, c, l], topk_own[i, c, l]
    po = pr_own[l, i, c]
    srt = np.sort(po)[::-1]
    pr = pr_rep[l, i, c]
    print(
      f"   L{l}: engine {sorted(e.tolist())} learner {sorted(o.tolist())} "
      f"own-fwd p[engine]={np.round(po[e], 4).tolist()} p[own]={np.round(po[o], 4).tolist()} "
      f"(k-th {srt[1]:.4f} vs k+1-th {srt[2]:.4f}, gap {srt[1] - srt[2]:.4f}); "
      f"forced-fwd p[engine]={np.round(pr[e], 4).tolist()}"
    )
# Where the worst own-vs-replay change comes from: tokens with the largest |lr_rep| - |lr_own|.
d = np.where(mask, np.abs(lr_rep) - np.abs(lr_own), -np.inf)
k = np.argsort(d, None)[::-1][:5]
print("\nlargest increases of |log ratio| under replay:")
for flat in k:
  i, j = np.unravel_index(flat, d.shape)
  c = j - 1
  dl = [l for l in range(mc.num_hidden_layers) if rec[i, c, l] and not agree[i, c, l]]
  gaps = []
  for l in range(mc.num_hidden_layers):
    s = np.sort(pr_own[l, i, c])[::-1]
    gaps.append(round(float(s[1] - s[2]), 4))
  print(
    f" row {i} pos {j}: own {np.exp(lr_own[i, j]):.3f} replay {np.exp(lr_rep[i, j]):.3f}; "
    f"disagree at predicting pos layers {dl}; k/k+1 gaps {gaps}; "
    f"prefix disagreements {int((rec[i, :j] & ~agree[i, :j]).sum())}"
  )
# Global: margin of the learner's own top-k at disagreeing (token, layer) pairs.
dis = valid[..., None] & rec & ~agree
gap_all = []
for l in range(mc.num_hidden_layers):
  s = np.sort(pr_own[l], -1)[..., ::-1]
  gap_all.append(s[..., 1] - s[..., 2])
gap_all = np.stack(gap_all, -1)  # [N, T, L]
g = gap_all[dis]
print(
  f"\nlearner f32 k-th vs (k+1)-th router prob gap at the {dis.sum()} disagreeing (token,layer): "
  f"median {np.median(g):.4f}, p90 {np.quantile(g, 0.9):.4f}, max {g.max():.4f}; "
  f"at agreeing: median {np.median(gap_all[valid[..., None] & rec & agree]):.4f}"
)


# The disagreements that can move a target's forced log-prob: every (pos <= j-1, layer) whose
# engine set differs from the learner's own top-k, with its class and the learner's f32 gap
# between the engine's weaker pick and the learner's k-th expert.
def cls(i, c):
  if c < plen[i]:
    return "prompt"
  if not gen[i, c]:
    return "tool/env" + (" (last before gen)" if next_gen[i, c] else "")
  return "generated"


print("\nprefix disagreements of the 3 tokens whose |log ratio| grew most under replay:")
for flat in k[:3]:
  i, j = np.unravel_index(flat, d.shape)
  print(f" row {i} pos {j}: own {np.exp(lr_own[i, j]):.4f} replay {np.exp(lr_rep[i, j]):.4f}")
  for c, l in zip(*np.nonzero(rec[i, :j] & ~agree[i, :j])):
    e, o, p = routes[i, c, l], topk_own[i, c, l], pr_own[l, i, c]
    only_e, only_o = sorted(set(e) - set(o)), sorted(set(o) - set(e))
    print(
      f"   pos {c} L{l} [{cls(i, c)}] engine-only {only_e} p={np.round(p[only_e], 4).tolist()} "
      f"learner-only {only_o} p={np.round(p[only_o], 4).tolist()} (f32 margin "
      f"{float(p[only_o].min() - p[only_e].max()):.5f})"
    )
m = dis
bl = valid & ~gen & next_gen & ~prompt
print(
  f"gap at disagreeing pairs on the last tool/env token before a generated turn: "
  f"{np.round(gap_all[bl[..., None] & rec & ~agree], 4).tolist()}"
)

# Cascade check: a disagreement whose own-forward margin is large should be a consequence of an
# upstream near-tie flip (earlier layer, same position). Under the forced forward (upstream
# layers use the engine's experts) the learner's top-k should then match the engine's set.
agree_rep = (np.sort(routes, -1) == np.sort(topk_rep, -1)).all(-1)
big = dis & (gap_all > 0.01)
up_flip = np.zeros_like(big)
for l in range(1, mc.num_hidden_layers):
  up_flip[..., l] = dis[..., :l].any(-1)
print(
  f"\ncascade: {big.sum()} disagreeing (token,layer) with own-forward gap > 0.01; "
  f"{(big & up_flip).sum()} of them follow a flip at an earlier layer of the same token; "
  f"{(big & agree_rep).sum()} agree with the engine under the forced forward"
)
gap_rep = []
for l in range(mc.num_hidden_layers):
  s = np.sort(pr_rep[l], -1)[..., ::-1]
  gap_rep.append(s[..., 1] - s[..., 2])
gap_rep = np.stack(gap_rep, -1)
dr = valid[..., None] & rec & ~agree_rep
print(
  f"forced forward: {dr.sum()} (token,layer) where the learner's own top-k still differs from "
  f"the engine's; f32 gap there: median {np.median(gap_rep[dr]):.5f}, "
  f"p90 {np.quantile(gap_rep[dr], 0.9):.5f}, max {gap_rep[dr].max():.5f}"
)
w = mask & (np.abs(lr_rep) > np.abs(lr_own) + 1e-3)
b_ = mask & (np.abs(lr_rep) < np.abs(lr_own) - 1e-3)
print(
  f"targets whose |log ratio| grows under replay by > 1e-3: {w.sum()}, shrinks: {b_.sum()}, "
  f"of {mask.sum()}"
)

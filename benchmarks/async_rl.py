"""Asynchronous RL benchmark: the real RL loop (`RLLoop`) synchronous vs ``rl.max_staleness`` 1, 2.

Simulated engine and code tool (no sampler, no sandbox), latency distributions as in
``benchmarks/rollout_pipeline.py``: each generate call sleeps a log-normal latency (continuous
batching: ``--slots`` requests at once), each tool call a heavy-tailed log-normal, and each
problem needs 1..``max_calls`` tool calls before answering. Rewards alternate inside each group
(every group informative, so every step updates). The learner is the real one on a tiny model
(batching, log-prob recompute, jitted update, weight push through the async machinery), with
each update stage (log-prob recompute + step) padded by a sleep to ``--update_s`` seconds; by
default that is the synchronous loop's own mean rollout time per step, measured first in the
same run.

All three loops train the same number of steps x prompts x G trajectories; steps/s is steps
over the whole ``run()`` wall time (pipeline fill and drain included).

    python benchmarks/async_rl.py [--steps 8] [--prompts 8] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import logging
import os
import sys
import tempfile
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
from rollout_pipeline import Sim, SimPool, _lognormal, _u  # noqa: E402

from configs import rstar2_tiny_cpu  # noqa: E402
from rstar_jax.config import from_config_dict  # noqa: E402
from rstar_jax.data.problems import Problem  # noqa: E402
from rstar_jax.pipelines import rl_loop, wiring  # noqa: E402
from rstar_jax.pipelines.metrics_log import read_jsonl_metrics  # noqa: E402
from rstar_jax.rollout.agent_runner import AgentRunner  # noqa: E402
from rstar_jax.rollout.types import GenerateResult  # noqa: E402
from rstar_jax.tokenization import chat_format as cf  # noqa: E402
from rstar_jax.tokenization.bpe import train_bpe_tokenizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/json_stdout.py
import json_stdout  # noqa: E402


class SimEngine:
  """Simulated engine with weight versions. Tokens carry the version at the request's start
  (conservative: a push mid-request would make them newer), so staleness is not understated."""

  swaps_weights_in_flight = True

  def __init__(self, tok, sim: Sim, slots: int):
    self.tok, self.sim, self.slots = tok, sim, asyncio.Semaphore(slots)
    self.im_end = cf.stop_token_id(tok)
    self.final = tok.encode("done</reason><answer>\\boxed{1}</answer>", add_special_tokens=False)
    self._v = 0

  @property
  def weight_version(self):
    return self._v

  async def update_weights(self, config, params, version=None):
    self._v = self._v + 1 if version is None else int(version)

  async def generate(self, reqs):
    return list(await asyncio.gather(*[self._one(r) for r in reqs]))

  async def _one(self, r):
    version = self._v
    turn = int(r.rid.rsplit(":", 1)[1])
    seed = r.sampling.seed
    async with self.slots:
      await asyncio.sleep(_lognormal(self.sim.gen_mean_s, self.sim.gen_sigma, seed, turn, "g"))
    prompt_key = hashlib.blake2b(repr(list(r.input_ids[:64])).encode(), digest_size=8).hexdigest()
    n_calls = 1 + int(_u(prompt_key, "calls") * self.sim.max_calls)
    if turn < n_calls:
      ids = self.tok.encode(
        cf.format_tool_call(f"print({seed % 97}+{turn})", "x"), add_special_tokens=False
      )
    else:
      ids = list(self.final)
    ids = (ids + [self.im_end])[: r.sampling.max_new_tokens]
    return GenerateResult(ids, [-1.0] * len(ids), "stop", version, [version] * len(ids))


class ShortPromptRunner(AgentRunner):
  """A one-line system prompt without the tool block (the learner's real update stays cheap
  next to the simulated one on a shared CPU); tool responses are the bare stdout."""

  def __init__(self, engine, pool, tok):
    super().__init__(engine, pool, tok, system_prompt="Use python.", with_tools=False)

  def render_tool_response(self, result, max_chars):
    return result.stdout


async def _alternating(trajs, answers):
  return [float(i % 2) for i in range(len(answers))]


def _config(args, k: int):
  c = rstar2_tiny_cpu.get_config("rl")
  c.model.vocab_size, c.model.hidden_size, c.model.intermediate_size = 512, 32, 64
  c.model.num_hidden_layers, c.model.head_dim = 1, 16
  c.mesh.num_devices = 1
  c.train.batch_prompts = args.prompts
  c.train.eval_every = 0
  c.train.checkpoint_every = 0
  c.train.length_bucket = 256  # one batch shape: no recompiles inside the timing
  c.train.progress_every_s = 1e9
  c.rl.group_size, c.rl.oversample = 2, 2
  c.rl.max_staleness = k
  c.rl.partial_rollout = "continue"
  c.rollout.max_prompt_tokens = 2048
  c.stages = [
    dict(
      name="bench",
      steps=args.steps,
      response_budget=200,
      max_turns=10,
      data="full",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
    )
  ]
  return from_config_dict(c, "rl")


def _slow_updates(learner, update_s: list):
  """The update stage (log-prob recompute + jitted step) padded by a sleep to ``update_s[0]``:
  a stand-in for a big model's update, whatever the tiny one costs on this CPU."""
  real_step, real_lp = learner.jitted.rl_step, learner.jitted.compute_logprobs
  started = [0.0]

  def logprobs(params, batch):
    started[0] = time.monotonic()
    return real_lp(params, batch)

  def step(state, mb):
    out = jax.block_until_ready(real_step(state, mb))
    time.sleep(max(0.0, update_s[0] - (time.monotonic() - started[0])))
    return out

  learner.jitted = dataclasses.replace(learner.jitted, rl_step=step, compute_logprobs=logprobs)


def run_once(args, k, learner, init_state, tok, problems, sim, update_s):
  cfg = _config(args, k)
  learner.state = jax.tree.map(lambda x: x.copy(), init_state)
  with tempfile.TemporaryDirectory() as wd:

    async def main():
      runner = ShortPromptRunner(SimEngine(tok, sim, args.slots), SimPool(sim), tok)
      runner.rewards = _alternating
      loop = rl_loop.RLLoop(cfg, learner, runner, wd, problems=problems)
      t0 = time.perf_counter()
      await loop.run()
      wall = time.perf_counter() - t0
      loop.ckpt.close()
      return wall

    wall = asyncio.run(main())
    recs = read_jsonl_metrics(os.path.join(wd, "metrics.jsonl"))
  trained = sum(r.get("kept_num_trajectories", 0.0) for r in recs)
  return wall, recs, trained


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--steps", type=int, default=8)
  ap.add_argument("--prompts", type=int, default=8)
  ap.add_argument("--slots", type=int, default=32)
  ap.add_argument(
    "--update_s",
    type=float,
    default=0.0,
    help="simulated update time per step (0 = the measured sync rollout time)",
  )
  ap.add_argument("--json", action="store_true")
  args = ap.parse_args()
  emit = json_stdout.reserve(args.json)  # --json: stdout holds the JSON only
  logging.disable(logging.WARNING)
  sim = Sim(gen_mean_s=0.08, gen_sigma=0.6, tool_mean_s=0.15, tool_sigma=1.0, max_calls=4)
  tok = train_bpe_tokenizer(
    [
      cf.SYSTEM_PROMPT,
      cf.TOOLS_BLOCK,
      cf.USER_PREFIX,
      cf.format_tool_call("print(1+2)", "x"),
      "done</reason><answer>\\boxed{1}</answer>",
    ]
    * 4,
    512,
  )
  problems = [Problem(problem=f"Problem {i}.", answer="1") for i in range(64)]
  learner = wiring.build_learner(_config(args, 0))
  init_state = jax.tree.map(lambda x: x.copy(), learner.state)
  update_s = [0.0]
  _slow_updates(learner, update_s)

  # Warm-up (compiles) and the reference rollout time: the synchronous loop, no added update.
  _, recs, _ = run_once(
    argparse.Namespace(**{**vars(args), "steps": 3}),
    0,
    learner,
    init_state,
    tok,
    problems,
    sim,
    update_s,
  )
  rollout_s = sum(r["time_rollout_s"] for r in recs) / len(recs)
  update_s[0] = args.update_s or rollout_s

  rows = {}
  for name, k in (("sync", 0), ("async", 1), ("async2", 2)):
    wall, recs, trained = run_once(args, k, learner, init_state, tok, problems, sim, update_s)
    rows[name] = dict(
      wall_s=wall,
      steps_per_s=args.steps / wall,
      trained=trained,
      dropped=sum(r.get("async/dropped_stale_trajectories", 0.0) for r in recs),
      lag1=sum(r.get("async/lag_1_tokens", 0.0) for r in recs),
      lag2=sum(r.get("async/lag_2_tokens", 0.0) for r in recs),
      learner_idle=sum(r.get("async/learner_idle_frac", 0.0) for r in recs) / len(recs),
    )
  if len({r["trained"] for r in rows.values()}) != 1:
    raise RuntimeError(
      f"trained trajectories differ between loops: { {k: r['trained'] for k, r in rows.items()} }"
    )
  ref = rows["sync"]["steps_per_s"]
  print(
    f"simulated: gen lognormal(mean {sim.gen_mean_s}s, sigma {sim.gen_sigma}) x "
    f"{args.slots} slots; tool lognormal(mean {sim.tool_mean_s}s, sigma {sim.tool_sigma}); "
    f"1-{sim.max_calls} tool calls per trajectory; {args.prompts} prompts x 4 rollouts "
    f"(G=2 kept) per step; {args.steps} steps; update {update_s[0]:.2f}s/step "
    f"(sync rollout {rollout_s:.2f}s/step)"
  )
  print(
    f"{'loop':<16} {'wall s':>7} {'steps/s':>8} {'vs sync':>8} {'trained':>8} "
    f"{'lag1 tok':>9} {'lag2 tok':>9} {'dropped':>8}"
  )
  for name, r in rows.items():
    label = {"sync": "sync (k=0)", "async": "async k=1", "async2": "async k=2"}[name]
    print(
      f"{label:<16} {r['wall_s']:7.2f} {r['steps_per_s']:8.3f} "
      f"{r['steps_per_s'] / ref:7.2f}x {int(r['trained']):8d} {int(r['lag1']):9d} "
      f"{int(r['lag2']):9d} {int(r['dropped']):8d}"
    )
  if args.json:
    emit(
      {
        "sync_steps_per_s": rows["sync"]["steps_per_s"],
        "async_steps_per_s": rows["async"]["steps_per_s"],
        "async2_steps_per_s": rows["async2"]["steps_per_s"],
        "async_speedup": rows["async"]["steps_per_s"] / ref,
        "async2_speedup": rows["async2"]["steps_per_s"] / ref,
        "trained_trajectories": rows["sync"]["trained"],
        "steps": args.steps,
        "update_s": update_s[0],
        "sync_rollout_s": rollout_s,
        "dropped_stale_trajectories": {k: r["dropped"] for k, r in rows.items()},
      }
    )


if __name__ == "__main__":
  main()

"""MoE routes travel with their tokens: multi-turn agent loop (prompt and tool turns included)
-> RL batch -> packing -> mini-batch split, and the padding never turns into expert 0.

The engines report routes that are a known function of (token, position), so every route cell
downstream can be checked against the token that sits in the same cell."""

import asyncio
import dataclasses

import numpy as np
import pytest
from rollout_helpers import FakePool, ScriptedEngine, call_text

from rstar_jax.learner import batch as batch_lib
from rstar_jax.learner import packing
from rstar_jax.models.routes import NO_ROUTE
from rstar_jax.rollout.agent_loop import RolloutSettings, run_trajectory

FINAL = "so 4.</reason><answer>\\boxed{4}</answer>"
LAYERS, K = 2, 2


def route_of(token: int, pos: int) -> np.ndarray:
  """The stand-in router: [LAYERS, K] distinct ids from the token and its position."""
  base = (int(token) * 31 + int(pos) * 7) % 1000
  return np.array([[base + 10 * r + j for j in range(K)] for r in range(LAYERS)], np.int32)


class RoutingEngine(ScriptedEngine):
  """ScriptedEngine that also reports routes, like SGLang (``full``: every position of
  input + output but the last) or like a decode-only sampler (``decode``: the positions it
  fed as inputs while generating, from the last input token on); ``recomputed``: as ``full``,
  but each call's experts differ from the previous call's (a recomputed prefix)."""

  def __init__(self, tokenizer, script, mode):
    super().__init__(tokenizer, script)
    self.mode = mode
    self.reported = []  # (first position, count) of each report

  async def generate(self, requests):
    out = []
    for req, res in zip(requests, await super().generate(requests)):
      seq = list(req.input_ids) + list(res.output_ids)
      start = 0 if self.mode in ("full", "recomputed") else len(req.input_ids) - 1
      routes = np.stack([route_of(seq[p], p) for p in range(start, len(seq) - 1)])
      if self.mode == "recomputed":  # each call recomputes the whole prefix, numerics differ
        routes = routes + 1000 * len(self.reported)
      self.reported.append((start, len(routes)))
      out.append(dataclasses.replace(res, routes=routes, routes_start=start))
    return out


def _trajectory(tokenizer, mode, budget=400):
  eng = RoutingEngine(tokenizer, lambda r, turn: [call_text("print(2+2)"), FINAL][turn], mode)
  cfg = RolloutSettings(response_budget=budget)
  t = asyncio.run(
    run_trajectory(eng, tokenizer, FakePool(), "What is 2+2?", cfg, render=lambda r, n: "4")
  )
  return t, eng


def _expected(seq, recorded):
  return np.stack(
    [
      route_of(tok, p) if recorded(p) else np.full((LAYERS, K), NO_ROUTE)
      for p, tok in enumerate(seq)
    ]
  )


def test_full_reports_cover_prompt_and_tool_turns(tokenizer):
  t, eng = _trajectory(tokenizer, "full")
  assert t.num_turns == 2 and 0 in t.loss_mask  # a tool turn sits in the middle
  seq = t.prompt_ids + t.response_ids
  # Every token but the last (never fed to the model) has its route, tool tokens included.
  np.testing.assert_array_equal(t.routes, _expected(seq, lambda p: p < len(seq) - 1))


def test_decode_only_reports_leave_unfed_tokens_as_sentinels(tokenizer):
  t, eng = _trajectory(tokenizer, "decode")
  seq = t.prompt_ids + t.response_ids
  fed = {p for start, n in eng.reported for p in range(start, start + n)}
  np.testing.assert_array_equal(t.routes, _expected(seq, lambda p: p in fed))
  tool = [len(t.prompt_ids) + i for i, m in enumerate(t.loss_mask) if m == 0]
  assert any(p not in fed for p in tool) and (t.routes[tool[:-1]] == NO_ROUTE).all()
  assert (t.routes[: len(t.prompt_ids) - 1] == NO_ROUTE).all()  # prompt: never fed by decode


def test_a_recomputed_prefix_keeps_the_routes_its_tokens_were_sampled_with(tokenizer):
  """Issue 39: a later turn that re-prefills the earlier turns (kept cache evicted) reports
  their positions again, here with other experts (bf16 near-ties flip between prefill and
  decode). The tokens of turn 1 were sampled with turn 1's routes: those stay (first report
  wins); positions first computed by turn 2 (the tool output) take turn 2's."""
  t, eng = _trajectory(tokenizer, "recomputed")
  assert t.num_turns == 2
  seq = t.prompt_ids + t.response_ids
  first_turn = eng.reported[0][1]  # positions 0 .. n - 1 reported by the first call
  want = _expected(seq, lambda p: p < len(seq) - 1)
  want[first_turn:] += 1000 * (want[first_turn:] >= 0)
  np.testing.assert_array_equal(t.routes, want)


def test_budget_cut_output_keeps_routes_aligned(tokenizer):
  t, _ = _trajectory(tokenizer, "full", budget=12)
  assert t.finish_reason == "length" and len(t.response_ids) == 12
  seq = t.prompt_ids + t.response_ids
  assert t.routes.shape[0] == len(seq)
  np.testing.assert_array_equal(t.routes, _expected(seq, lambda p: p < len(seq) - 1))


def _check_cells(batch):
  """Each real cell's route is route_of(its token, its position) or NO_ROUTE; padding cells
  are NO_ROUTE (never expert 0)."""
  ids, att, routes = batch["input_ids"], batch["attention_mask"], batch[batch_lib.ROUTES_KEY]
  pos = batch.get("positions", np.broadcast_to(np.arange(ids.shape[1]), ids.shape))
  checked = 0
  for n, t in zip(*np.nonzero(att)):
    r = routes[n, t]
    if (r >= 0).any():
      np.testing.assert_array_equal(r, route_of(ids[n, t], pos[n, t]))
      checked += 1
  assert (routes[att == 0] == NO_ROUTE).all()
  return checked


def test_routes_line_up_after_batch_packing_and_split(tokenizer):
  full, _ = _trajectory(tokenizer, "full")
  short, _ = _trajectory(tokenizer, "full", budget=12)
  decode, _ = _trajectory(tokenizer, "decode")
  plain = dataclasses.replace(short, routes=None)  # e.g. an engine that reported nothing
  trajs = [short, full, plain, decode]
  pad_to = batch_lib.length_bucket(max(len(t.prompt_ids) + len(t.response_ids) for t in trajs))
  batch = batch_lib.make_rl_batch(trajs, [1.0, -1.0, 0.5, 0.0], pad_to, row_multiple=8)
  assert batch["routes"].shape == (8, pad_to, LAYERS, K) and batch["routes"].dtype == np.int32
  assert (batch["routes"][2] == NO_ROUTE).all()  # the trajectory without routes
  n_real = _check_cells(batch)
  packed = packing.pack_batch(batch, row_multiple=2)
  assert packed["input_ids"].shape[0] < 8  # really packed: several trajectories per row
  assert _check_cells(packed) == n_real  # no route lost or moved
  parts = batch_lib.split_rl_batch(packed, 2, np.random.default_rng(0), rows=4)
  assert sum(_check_cells(mb) for mb in parts) == n_real


def test_mixed_route_shapes_are_refused(tokenizer):
  t, _ = _trajectory(tokenizer, "full")
  other = dataclasses.replace(t, routes=t.routes[:, :1])
  with pytest.raises(ValueError, match="routes of different shapes"):
    batch_lib.make_rl_batch([t, other], [1.0, 0.0], 512)


def test_no_routes_cost_nothing(tokenizer):
  """A dense policy's trajectories (routes None) build the batch they always built."""
  t, _ = _trajectory(tokenizer, "full")
  plain = dataclasses.replace(t, routes=None)
  batch = batch_lib.make_rl_batch([plain], [1.0], 1024)
  assert batch_lib.ROUTES_KEY not in batch
  assert batch_lib.ROUTES_KEY not in packing.pack_batch(batch)

"""Routing-outlier records (issue 39) on a tiny Qwen3-MoE (a dense layer in the middle): the
engine's routes of two positions of one row are swapped on purpose, and the record names the
tokens they predict, with the engine's and the learner's top-k sets differing there; an aligned
batch (engine routes = the learner's own top-k, sampler = the learner) writes nothing. The RL
loop's `routing_outliers` step is run on a stand-in loop object (config, learner, workdir)."""

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.config import schema
from rstar_jax.learner import routing_outliers as ro
from rstar_jax.models import qwen3, qwen3_moe
from rstar_jax.pipelines import rl_loop

CFG = qwen3_moe.Qwen3MoeConfig(
  vocab_size=64,
  hidden_size=32,
  intermediate_size=48,
  moe_intermediate_size=16,
  num_hidden_layers=3,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=8,
  num_experts=6,
  num_experts_per_tok=2,
  mlp_only_layers=(1,),
  moe_implementation="dense",
)
T = 16
SWAP = (5, 9)  # row 0: the routes of these columns trade places (9: the last tool token)
BAND = 4.0


@pytest.fixture(scope="module")
def setup():
  # Weights x50 (init std 0.02 -> 1): a foreign expert set then moves a log-prob by nats, not
  # by the 1e-3 of a near-uniform random model, so the default band sees it.
  p0 = qwen3.init_params(CFG, jax.random.key(0))
  params = jax.tree_util.tree_map_with_path(
    lambda k, x: x if "scale" in jax.tree_util.keystr(k) else x * 50, p0
  )
  ids = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, T)).astype(np.int32)
  attn = np.ones((2, T), np.int32)
  attn[1, 12:] = 0
  loss = np.zeros((2, T), np.float32)
  loss[:, 3:8] = 1  # prompt 0-2, generated 3-7, tool output 8-9, generated 10-
  loss[:, 10:] = 1
  loss *= attn
  lp, topk, _ = jax.device_get(
    ro._forward(params, CFG, jnp.asarray(ids), jnp.asarray(attn), None, None, None)
  )
  routes = np.where(attn[..., None, None] > 0, topk, -1).astype(np.int32)
  routes[np.arange(2), attn.sum(1) - 1] = -1  # the last token is never fed to the engine
  batch = {
    "input_ids": ids,
    "attention_mask": attn,
    "loss_mask": loss,
    "sampler_logprobs": (lp * loss).astype(np.float32),  # the engine is the learner
    "advantages": np.zeros((2,), np.float32),
    "routes": routes,
  }
  return params, batch, topk


def _stand_in_loop(params, tmp_path):
  rl = schema.RLConfig(routing_outlier_band=BAND)
  learner = types.SimpleNamespace(state=types.SimpleNamespace(params=params), model_config=CFG)
  return types.SimpleNamespace(
    config=types.SimpleNamespace(rl=rl),
    learner=learner,
    runner=types.SimpleNamespace(tokenizer=None),
    workdir=str(tmp_path),
    pos=types.SimpleNamespace(rl_step=6),
  )


def _lps(params, batch):
  def lp(routes):
    args = (jnp.asarray(batch["input_ids"]), jnp.asarray(batch["attention_mask"]), None, None)
    return np.asarray(ro._forward(params, CFG, *args, routes)[0])

  return {"replay": lp(jnp.asarray(batch["routes"])), "own": lp(None)}


def test_aligned_routes_write_nothing(setup, tmp_path):
  params, batch, _ = setup
  loop = _stand_in_loop(params, tmp_path)
  m = rl_loop.RLLoop.routing_outliers(loop, batch, _lps(params, batch))
  assert m == {"routing/outlier_tokens": 0.0, "routing/outlier_checked": 18.0}
  assert not (tmp_path / ro.FILENAME).exists() and not (tmp_path / "routing_outliers").exists()


def test_swapped_routes_are_recorded_at_the_tokens_they_predict(setup, tmp_path):
  params, aligned, topk = setup
  batch = dict(aligned)
  routes = aligned["routes"].copy()
  a, b = SWAP
  routes[0, [a, b]] = routes[0, [b, a]]
  batch["routes"] = routes
  lps = _lps(params, batch)
  loop = _stand_in_loop(params, tmp_path)
  m = rl_loop.RLLoop.routing_outliers(loop, batch, lps, [{"group": 0, "sample": 3}, None])
  recs = [json.loads(line) for line in (tmp_path / ro.FILENAME).read_text().splitlines()]
  assert m["routing/outlier_tokens"] == len(recs) > 0
  # Only row 0, and nothing before the first swapped column's target (causal: unchanged).
  assert {r["row"] for r in recs} == {0}
  assert min(r["pos"] for r in recs) == a + 1
  for r in recs:
    assert r["step"] == 7 and r["trajectory"] == {"group": 0, "sample": 3}
    assert abs(np.log(r["ratio"]["replay"])) > np.log(BAND)  # replay: out of band
    assert r["ratio"]["own"] == pytest.approx(1.0, abs=1e-5)  # own routing: the sampler's
    np.testing.assert_allclose(
      r["recomputed_logprob"]["replay"], r["learner_logprob"]["replay"], atol=1e-4
    )
    assert r["row_alignment"]["aligned"] < 1.0
  by_pos = {r["pos"]: r for r in recs}
  # The two swapped columns' targets: the engine's set at the input column is the other
  # column's, the learner's own is its own; they differ in some sparse layer.
  for c, other in ((a, b), (b, a)):
    r = by_pos[c + 1]
    assert r["input_pos"] == c
    assert [x["layer"] for x in r["layers"]] == [0, 2]  # layer 1 is dense
    for x in r["layers"]:
      assert x["engine"] == topk[0, other, x["layer"]].tolist()
      assert x["learner"] == topk[0, c, x["layer"]].tolist()
      assert x["agree"] == (sorted(x["engine"]) == sorted(x["learner"]))
    assert not all(x["agree"] for x in r["layers"])
    assert r["prefix_misrouted_positions"] == (0 if c == a else 1)
    assert r["prefix_unrouted_positions"] == 0
  first = by_pos[a + 1]
  assert first["token_class"] == "generated" and first["input_class"] == "generated"
  second = by_pos[b + 1]  # the turn boundary: tool output -> the next generated turn
  assert second["input_class"] == "tool/env" and second["turn"] == 2
  assert "last token before a generated turn" in second["input_boundary"]
  assert "first generated token of a turn" in second["boundary"]
  assert second["nearest_misrouted_positions"] == [a]
  # The flagged row's batch is kept for offline diagnosis.
  saved = np.load(tmp_path / "routing_outliers" / "step7.npz")
  assert saved["rows"].tolist() == [0]
  np.testing.assert_array_equal(saved["routes"][0], routes[0])
  np.testing.assert_array_equal(saved["learner_replay"][0], lps["replay"][0])
  assert any(n["pos"] == b + 1 and n["loss"] for n in second["neighbours"])


def test_flag_band_and_config_check():
  s = np.zeros((1, 4), np.float32)
  mask = np.ones((1, 4), np.float32)
  lp = np.log(np.array([[5.0, 5.0, 3.9, 0.2]], np.float32))  # ratios 5, 5, 3.9, 0.2
  got = ro.flag(s, mask, 4.0, {"replay": lp, "own": None})
  assert got.tolist() == [[False, True, False, True]]  # column 0 is never a target
  assert not ro.flag(s, mask, 0.0, {"replay": lp}).any()
  with pytest.raises(ValueError, match="routing_outlier_band"):
    schema.RLConfig(routing_outlier_band=0.5)


def test_a_row_shifted_by_one_position_shows_in_its_alignment(setup, tmp_path):
  params, aligned, _ = setup
  batch = dict(aligned)
  routes = aligned["routes"].copy()
  routes[0, 1:15] = aligned["routes"][0, 0:14]  # column t carries column t - 1's route
  routes[0, 0] = -1
  batch["routes"] = routes
  loop = _stand_in_loop(params, tmp_path)
  rl_loop.RLLoop.routing_outliers(loop, batch, _lps(params, batch))
  recs = [json.loads(line) for line in (tmp_path / ro.FILENAME).read_text().splitlines()]
  assert recs and {r["row"] for r in recs} == {0}
  al = recs[0]["row_alignment"]
  assert al["shifted-1"] == 1.0 and al["aligned"] < 0.5 and al["shifted+1"] < 0.5
  assert recs[0]["prefix_unrouted_positions"] == 1  # column 0 lost its route

"""Jitted, sharded steps on 8 fake CPU devices equal the single-device whole-batch step.

Tolerance: after one AdamW update at lr 1e-3 every parameter differs by at most 5e-6 (absolute;
observed ~1e-6, from float32 reduction order across devices and micro-batches), and every metric
agrees to rtol 1e-5 / atol 1e-6.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.learner import optim, steps
from rstar_jax.learner.train_state import TrainState
from rstar_jax.models import qwen3
from rstar_jax.sharding import make_mesh

CFG = qwen3.Qwen3Config(
  vocab_size=128,
  hidden_size=32,
  intermediate_size=64,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=8,
)
OPT = optim.OptimConfig(lr=1e-3, warmup_steps=1)
N, T = 16, 12
PARAM_ATOL = 5e-6


def qwen_batch(seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(4, T + 1, N)
  attn = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
  loss = ((rng.random((N, T)) < 0.7) & (attn == 1)).astype(np.float32)
  loss[:, 0] = 0
  # Near-uniform behaviour log-probs so ratios straddle the clip range.
  old = (np.log(1 / CFG.vocab_size) + rng.normal(size=(N, T)) * 0.3).astype(np.float32) * loss
  return {
    "input_ids": (rng.integers(0, CFG.vocab_size, (N, T)) * attn).astype(np.int32),
    "attention_mask": attn,
    "loss_mask": loss,
    "old_logprobs": old,
    "advantages": rng.normal(size=N).astype(np.float32),
  }


@functools.cache
def _params():
  return qwen3.init_params(CFG, jax.random.key(0))


def _fresh_state(tx):
  return TrainState.create(jax.tree.map(jnp.copy, _params()), tx, 0)


@functools.cache
def _single_device(kind):
  """Reference: plain jit, one device, whole batch."""
  tx = optim.make_optimizer(OPT)
  step = steps.rl_step if kind == "rl" else steps.sft_step
  apply_fn = lambda p, ids, m: qwen3.forward(p, CFG, ids, attention_mask=m)
  fn = jax.jit(functools.partial(step, apply_fn=apply_fn, config=steps.StepConfig(optim=OPT)))
  state, metrics = fn(_fresh_state(tx), qwen_batch())
  return jax.device_get(state.params), jax.device_get(metrics)


@pytest.mark.parametrize("kind", ["rl", "sft"])
@pytest.mark.parametrize(
  "sizes", [{"data": 2, "fsdp": 2, "tensor": 2}, {"data": 8}], ids=["data2_fsdp2_tensor2", "data8"]
)
def test_sharded_micro_batched_step_equals_single_device(kind, sizes):
  want_params, want_metrics = _single_device(kind)
  mesh = make_mesh(sizes)
  tx = optim.make_optimizer(OPT)
  js = steps.make_jitted_steps(
    CFG, mesh, tx=tx, config=steps.StepConfig(num_micro_batches=2, optim=OPT)
  )
  state = js.shard_state(_fresh_state(tx))
  step = js.rl_step if kind == "rl" else js.sft_step
  state, metrics = step(state, js.shard_batch(qwen_batch()))
  chex.assert_trees_all_close(jax.device_get(state.params), want_params, atol=PARAM_ATOL, rtol=0)
  chex.assert_trees_all_close(jax.device_get(metrics), want_metrics, rtol=1e-5, atol=1e-6)
  if kind == "rl":  # the test batch really exercises clipping
    assert 0.0 < float(metrics["clip_frac"]) < 1.0
  # Shardings survive the step (params and Adam moments on the rules' layout).
  for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(js.state_shardings)):
    assert got.sharding.is_equivalent_to(want, got.ndim)
  kernel = state.params["layers"]["mlp"]["gate_proj"]["kernel"]
  if sizes.get("tensor"):
    assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")


def test_sharded_compute_logprobs_and_batch_divisibility():
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  tx = optim.make_optimizer(OPT)
  js = steps.make_jitted_steps(CFG, mesh, tx=tx, config=steps.StepConfig(num_micro_batches=2))
  batch = qwen_batch()
  logp = js.compute_logprobs(_params(), js.shard_batch(batch))
  logits = qwen3.forward(
    _params(),
    CFG,
    jnp.asarray(batch["input_ids"]),
    attention_mask=jnp.asarray(batch["attention_mask"]),
  )
  want = jnp.take_along_axis(
    jax.nn.log_softmax(logits[:, :-1]), batch["input_ids"][:, 1:, None], -1
  )[..., 0]
  mask = batch["attention_mask"][:, 1:]
  np.testing.assert_allclose(
    np.asarray(logp)[:, 1:] * mask, np.asarray(want) * mask, rtol=1e-5, atol=1e-5
  )
  fresh = steps.with_old_logprobs(js.shard_batch(batch), logp)
  np.testing.assert_array_equal(
    np.asarray(fresh["old_logprobs"]), np.asarray(logp) * batch["loss_mask"]
  )
  with pytest.raises(ValueError, match="multiple of data-parallel size 4 x num_micro_batches 2"):
    js.shard_batch({k: v[:12] for k, v in batch.items()})

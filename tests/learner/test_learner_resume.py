"""SFT resume is bit-identical: N steps straight == N/2 + save + restore (fresh state) + N/2."""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from learner_toy_model import toy_apply, toy_batch, toy_params

from rstar_jax.learner import optim, steps
from rstar_jax.learner.checkpoint import Checkpointer
from rstar_jax.learner.train_state import TrainState

OPT = optim.OptimConfig(lr=3e-2, warmup_steps=3, weight_decay=0.05)
NUM_STEPS = 6


def _jitted(mesh, tx):
  def ns(*spec):
    return NamedSharding(mesh, P(*spec))

  psh = {"emb": ns("tensor", "fsdp"), "w": ns("fsdp", "tensor")}
  return steps.make_jitted_steps_for(
    toy_apply,
    psh,
    jax.eval_shape(toy_params),
    tx,
    mesh,
    config=steps.StepConfig(num_micro_batches=2, optim=OPT),
  )


def _batches():
  return [
    {k: v for k, v in toy_batch(100 + i).items() if k in steps.SFT_KEYS} for i in range(NUM_STEPS)
  ]


def test_sft_resume_bit_identical(tmp_path):
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
  tx = optim.make_optimizer(OPT)
  js = _jitted(mesh, tx)
  batches = _batches()
  half = NUM_STEPS // 2

  # N steps straight. The async checkpoint at N/2 must not be disturbed by the next steps
  # donating (overwriting) the state buffers it was taken from.
  ck = Checkpointer(tmp_path, max_to_keep=1)
  straight = js.shard_state(TrainState.create(toy_params(), tx, 7))
  for i, b in enumerate(batches):
    straight, _ = js.sft_step(straight, js.shard_batch(b))
    if i + 1 == half:
      ck.save(straight, {"data_position": half, "stage": "sft"})
  ck.close()

  # A new process rebuilds everything: new tx, new jitted steps, a fresh (different) target.
  tx2 = optim.make_optimizer(OPT)
  js2 = _jitted(mesh, tx2)
  target = js2.shard_state(TrainState.create(toy_params(seed=9), tx2, 0))
  ck2 = Checkpointer(tmp_path, max_to_keep=1)
  resumed, meta = ck2.restore(target)
  ck2.close()
  assert meta == {"data_position": half, "stage": "sft", "step": half}
  assert int(resumed.step) == half
  for b in batches[meta["data_position"] :]:
    resumed, _ = js2.sft_step(resumed, js2.shard_batch(b))

  assert int(resumed.step) == int(straight.step) == NUM_STEPS
  for a, b in zip(
    jax.tree.leaves((straight.params, straight.opt_state, straight.rng)),
    jax.tree.leaves((resumed.params, resumed.opt_state, resumed.rng)),
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bit-identical


def test_state_from_another_optimizer_is_rejected():
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
  js = _jitted(mesh, optim.make_optimizer(OPT))
  other = TrainState.create(toy_params(), optim.make_optimizer(OPT), 0)
  with pytest.raises(ValueError, match="not the optimizer these steps were built with"):
    js.shard_state(other)
  with pytest.raises(ValueError, match="not the optimizer these steps were built with"):
    js.sft_step(other, _batches()[0])

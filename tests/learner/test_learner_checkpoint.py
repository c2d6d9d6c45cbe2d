"""Checkpointer: bit-exact round trip onto live shardings, metadata, keep-last-N, errors."""

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from rstar_jax.learner import optim
from rstar_jax.learner.checkpoint import Checkpointer
from rstar_jax.learner.train_state import TrainState


def _state(mesh, seed=0):
  w = jax.random.normal(jax.random.key(seed), (8, 4))
  params = {
    "w": jax.device_put(w, NamedSharding(mesh, P("fsdp", "tensor"))),
    "b": jax.device_put(jnp.arange(3.0), NamedSharding(mesh, P())),
  }
  tx = optim.make_optimizer(optim.OptimConfig(lr=0.1, warmup_steps=2))
  return TrainState.create(params, tx, seed)


def _mesh(shape=(4, 2)):
  return jax.make_mesh(shape, ("fsdp", "tensor"), axis_types=(AxisType.Auto,) * 2)


def _grads(state, k):
  return jax.tree.map(lambda x: jnp.full_like(x, 0.1 * (k + 1)), state.params)


def test_round_trip_bit_exact_with_shardings_and_metadata(tmp_path):
  mesh = _mesh()
  state = _state(mesh)
  for k in range(3):
    state = state.apply_gradients(_grads(state, k))
  state, _ = state.split_rng()
  with Checkpointer(tmp_path / "ck", max_to_keep=2) as ck:
    assert ck.save(state, {"data_position": 17, "stage": "stage2", "weight_version": 3})
    # A different-seed target: everything must come from disk, not from the target.
    restored, meta = ck.restore(_state(mesh, seed=1))
  assert meta == {"data_position": 17, "stage": "stage2", "weight_version": 3, "step": 3}
  chex.assert_trees_all_equal(
    (restored.params, restored.opt_state, restored.step, restored.rng),
    (state.params, state.opt_state, state.step, state.rng),
  )
  assert restored.params["w"].sharding == state.params["w"].sharding
  adam = restored.opt_state[1][0]
  assert adam.mu["w"].sharding.spec == P("fsdp", "tensor")
  assert type(adam) is type(state.opt_state[1][0])


def test_restore_onto_a_different_mesh(tmp_path):
  state = _state(_mesh((4, 2)))
  ck = Checkpointer(tmp_path, max_to_keep=1)
  ck.save(state)
  target = _state(_mesh((2, 4)), seed=5)
  restored, _ = ck.restore(target)
  ck.close()
  np.testing.assert_array_equal(np.asarray(restored.params["w"]), np.asarray(state.params["w"]))
  assert restored.params["w"].sharding.mesh.shape == {"fsdp": 2, "tensor": 4}


def test_keep_last_n_and_restore_specific_step(tmp_path):
  state = _state(_mesh())
  ck = Checkpointer(tmp_path, max_to_keep=2)
  saved = {}
  for k in range(4):
    state = state.apply_gradients(_grads(state, k))
    ck.save(state, {"k": k})
    saved[int(state.step)] = state.params
  ck.wait_until_finished()
  assert ck.all_steps() == [3, 4] and ck.latest_step() == 4
  restored, meta = ck.restore(state, step=3)
  assert meta["k"] == 2 and int(restored.step) == 3
  chex.assert_trees_all_equal(restored.params, saved[3])
  with pytest.raises(FileNotFoundError, match="no checkpoint for step 1"):
    ck.restore(state, step=1)
  ck.close()


def test_save_interval_and_force(tmp_path):
  state = _state(_mesh())
  ck = Checkpointer(tmp_path, max_to_keep=None, save_interval_steps=3)
  written = []
  for k in range(8):
    state = state.apply_gradients(_grads(state, k))
    written.append(ck.save(state, force=(int(state.step) == 5)))
  ck.wait_until_finished()
  # Step 1: the first save of a run; 3, 6: multiples of the interval; 5: forced.
  assert written == [True, False, True, False, True, True, False, False]
  assert ck.all_steps() == [1, 3, 5, 6]
  ck.close()


def test_errors(tmp_path):
  state = _state(_mesh())
  ck = Checkpointer(tmp_path)
  with pytest.raises(FileNotFoundError, match="no checkpoint in"):
    ck.restore(state)
  with pytest.raises(TypeError, match="not JSON-serialisable"):
    ck.save(state, {"bad": object()})
  with pytest.raises(ValueError, match="differs from state.step"):
    ck.save(state, {"step": 7})
  ck.close()
  with pytest.raises(ValueError, match="max_to_keep"):
    Checkpointer(tmp_path, max_to_keep=0)


_SAVE_AND_EXIT = """
import sys
import jax.numpy as jnp
from rstar_jax.learner import optim
from rstar_jax.learner.checkpoint import Checkpointer
from rstar_jax.learner.train_state import TrainState
tx = optim.make_optimizer(optim.OptimConfig(lr=0.1, warmup_steps=2))
state = TrainState.create({"w": jnp.ones((256, 256))}, tx, 0)
ck = Checkpointer(sys.argv[1], max_to_keep=2)
ck.save(state, {"k": 7})
print("saved", flush=True)
"""  # no close(), no wait: the script just ends while the async save runs


def test_async_save_completes_at_interpreter_exit(tmp_path):
  import subprocess
  import sys

  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(
    os.environ,
    XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""),
    JAX_PLATFORMS="cpu",
    PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]),
  )
  proc = subprocess.run(
    [sys.executable, "-c", _SAVE_AND_EXIT, str(tmp_path / "ck")],
    capture_output=True,
    text=True,
    timeout=120,
    env=env,
  )
  assert proc.returncode == 0 and "saved" in proc.stdout, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  # Without the exit hook the step is left as a half-written "0.orbax-checkpoint-tmp".
  assert os.listdir(tmp_path / "ck") == ["0"]
  tx = optim.make_optimizer(optim.OptimConfig(lr=0.1, warmup_steps=2))
  with Checkpointer(tmp_path / "ck") as ck:
    restored, meta = ck.restore(TrainState.create({"w": jnp.zeros((256, 256))}, tx, 1))
  assert meta == {"k": 7, "step": 0}
  np.testing.assert_array_equal(np.asarray(restored.params["w"]), np.ones((256, 256)))


def test_close_waits_and_is_idempotent(tmp_path):
  state = _state(_mesh())
  ck = Checkpointer(tmp_path)
  ck.save(state)
  ck.close()  # returns only once the async save is committed
  assert sorted(os.listdir(tmp_path)) == ["0"]
  ck.close()


def test_restore_into_another_model_is_a_one_line_user_error(tmp_path):
  from rstar_jax.errors import UserError
  from rstar_jax.learner.checkpoint import CheckpointMismatchError

  tx = optim.make_optimizer(optim.OptimConfig(lr=0.1, warmup_steps=2))
  with Checkpointer(tmp_path) as ck:
    ck.save(TrainState.create({"w": jnp.ones((4, 4))}, tx, 0))
  for other, why in (
    ({"w": jnp.ones((8, 4))}, "holds an array of shape (4, 4) where this run's has (8, 4)"),
    ({"w": jnp.ones((4, 4)), "b": jnp.ones(3)}, ".b:"),
  ):
    with Checkpointer(tmp_path) as ck, pytest.raises(CheckpointMismatchError) as e:
      ck.restore(TrainState.create(other, tx, 0))
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    assert msg.startswith(f"checkpoint {tmp_path} step 0 does not fit this run's model")
    assert why in msg, msg

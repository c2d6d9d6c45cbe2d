"""Checkpoint errors as one line. A write that hits a full disk (issue 43 row 2), on a real
small tmpfs: one `CheckpointWriteError` line naming the directory, the lost step and the last
good checkpoint; the half-written step is never restored and is cleaned up by the next run.
A checkpoint of another model shape (row 9): our line, without orbax's API advice."""

import contextlib
import os
import subprocess

import chex
import jax
import jax.numpy as jnp
import optax
import pytest

from rstar_jax.errors import UserError
from rstar_jax.learner.checkpoint import (
  Checkpointer,
  CheckpointMismatchError,
  CheckpointWriteError,
)
from rstar_jax.learner.train_state import TrainState


@contextlib.contextmanager
def small_tmpfs(path, size: str):
  """A tmpfs of ``size`` mounted at ``path`` (root only: skipped elsewhere)."""
  os.makedirs(path, exist_ok=True)
  r = subprocess.run(
    ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
    capture_output=True,
    text=True,
  )
  if r.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); needs root")
  try:
    yield str(path)
  finally:
    subprocess.run(["umount", "-l", str(path)], check=False)


def resize(path, size: str) -> None:
  subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def _state(seed, n=256):
  # ~256 KiB of params + Adam's two moments: one checkpoint ~330 KiB on disk (compressed).
  params = {"w": jax.random.normal(jax.random.key(seed), (n, n)), "b": jnp.zeros(3)}
  return TrainState.create(params, optax.adam(1e-3), seed)


def _step(state):
  return state.apply_gradients(jax.tree.map(jnp.ones_like, state.params))


def test_full_disk_is_one_line_naming_the_last_good_checkpoint(tmp_path):
  with small_tmpfs(tmp_path / "disk", "500k") as disk:
    ck_dir = os.path.join(disk, "ckpt")
    state1 = _step(_state(0))
    ck = Checkpointer(ck_dir)
    assert ck.save(state1, {"data": 1})
    ck.wait_until_finished()
    state2 = _step(state1)
    with pytest.raises(CheckpointWriteError) as e:
      ck.save(state2, {"data": 2})  # async: the failure may surface at the next wait
      ck.wait_until_finished()
    ck.close()  # the failure was reported once: closing does not raise it again
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    assert msg == (
      f"checkpoint {ck_dir}: cannot write step 2 (no space left on device); the last good "
      f"checkpoint is step 1 ({ck_dir}/1): free space, then rerun the same command to resume"
    )
    assert any(n.startswith("2.") for n in os.listdir(ck_dir))  # half-written, left by orbax

    resize(disk, "8m")
    with Checkpointer(ck_dir) as ck2:
      assert ck2.latest_step() == 1 and ck2.all_steps() == [1]
      restored, meta = ck2.restore(_state(1))
    assert meta["data"] == 1
    chex.assert_trees_all_equal(restored.params, state1.params)
    assert sorted(os.listdir(ck_dir)) == ["1"]  # the half-written step was removed


def test_another_model_shape_is_our_line_only(tmp_path):
  with Checkpointer(tmp_path / "ck") as ck:
    ck.save(_step(_state(0, n=8)))
    with pytest.raises(CheckpointMismatchError) as e:
      ck.restore(_state(0, n=16))
  msg = str(e.value)
  assert msg.startswith(f"checkpoint {tmp_path / 'ck'} step 1 does not fit this run's model")
  assert "the checkpoint holds an array of shape (8, 8) where this run's has (16, 16)" in msg
  assert "strict" not in msg and "Truncating" not in msg and "\n" not in msg

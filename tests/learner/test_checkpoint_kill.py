"""A learner killed (SIGKILL) while its asynchronous checkpoint write is in flight: the cut
write (orbax's ``<step>.orbax-checkpoint-tmp*`` folder, renamed to ``<step>`` only once
complete) is never listed or restored; the next run restores the last complete step, byte for
byte, and removes the leftover (issue 41 item 4). Also: async and sync writes restore the same
bytes."""

import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from rstar_jax.errors import complete_steps
from rstar_jax.learner import optim
from rstar_jax.learner.checkpoint import Checkpointer
from rstar_jax.learner.train_state import TrainState

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 1024  # a 4 MiB array (and its two Adam moments): a write long enough to be caught

_SAVER = f"""
import sys
import jax.numpy as jnp
from rstar_jax.learner import optim
from rstar_jax.learner.checkpoint import Checkpointer
from rstar_jax.learner.train_state import TrainState
tx = optim.make_optimizer(optim.OptimConfig(lr=0.1, warmup_steps=2))
ck = Checkpointer(sys.argv[1], max_to_keep=None)
for step in range(1, 10_000):
  st = TrainState.create({{"w": jnp.full(({N}, {N}), float(step))}}, tx, 0)
  ck.save(st.replace(step=jnp.asarray(step, jnp.int32)), {{"pos": step}})  # async: returns at once
"""


def _tmp_dirs(d):
  try:
    return [n for n in os.listdir(d) if "orbax-checkpoint-tmp" in n]
  except FileNotFoundError:
    return []


def _kill_during_a_write(d, tries=5):
  """Runs the saver and SIGKILLs it as soon as a write of step >= 2 is in flight (a tmp folder
  exists); returns once a kill left a cut write behind."""
  env = dict(
    os.environ,
    XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""),
    JAX_PLATFORMS="cpu",
    PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
  )
  for _ in range(tries):
    proc = subprocess.Popen([sys.executable, "-c", _SAVER, d], env=env, stderr=subprocess.PIPE)
    try:
      deadline = time.monotonic() + 180
      while not any(int(n.split(".")[0]) >= 2 for n in _tmp_dirs(d)):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint write seen"
        time.sleep(0.002)
      proc.send_signal(signal.SIGKILL)
      proc.wait(timeout=60)
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
    if _tmp_dirs(d) and complete_steps(d):
      return
  raise AssertionError(f"no kill landed during a write in {tries} tries")


def test_a_write_cut_by_sigkill_is_never_restored(tmp_path):
  d = str(tmp_path / "ck")
  _kill_during_a_write(d)
  cut = _tmp_dirs(d)
  done = complete_steps(d)
  assert cut and done, os.listdir(d)
  cut_steps = {int(n.split(".")[0]) for n in cut}
  assert max(cut_steps) > max(done)  # the write in flight was newer than any complete one
  tx = optim.make_optimizer(optim.OptimConfig(lr=0.1, warmup_steps=2))
  target = TrainState.create({"w": jnp.zeros((N, N))}, tx, 1)
  last = max(done)
  with Checkpointer(d, max_to_keep=None) as ck:
    assert ck.latest_step() == last and ck.all_steps() == done
    state, meta = ck.restore(target)
    assert meta == {"pos": last, "step": last}
    assert int(state.step) == last
    np.testing.assert_array_equal(np.asarray(state.params["w"]), np.full((N, N), float(last)))
    # A later save of the resumed run: orbax has removed the leftover by then (its clean-up
    # runs in the background from the moment the folder is opened; a save waits for it). A
    # step past the cut one, so that the save does not just replace the cut step's folder.
    nxt = max(cut_steps) + 1
    ck.save(state.replace(step=jnp.asarray(nxt, jnp.int32)), {"pos": nxt})
  assert _tmp_dirs(d) == [], os.listdir(d)
  assert complete_steps(d) == [*done, nxt]


def test_async_and_sync_writes_restore_the_same_bytes(tmp_path):
  tx = optim.make_optimizer(optim.OptimConfig(lr=0.1, warmup_steps=2))
  st = TrainState.create({"w": jnp.arange(12.0).reshape(3, 4) / 7}, tx, 3)
  st = st.apply_gradients({"w": jnp.full((3, 4), 0.25)})
  got = []
  for enable_async in (True, False):
    d = tmp_path / f"a{enable_async}"
    with Checkpointer(d, enable_async=enable_async) as ck:
      ck.save(st, {"k": 1})
    with Checkpointer(d) as ck:
      got.append(ck.restore(TrainState.create({"w": jnp.zeros((3, 4))}, tx, 0)))
  (a, ma), (b, mb) = got
  assert ma == mb == {"k": 1, "step": 1}
  la, lb = (jax.tree.leaves((x.params, x.opt_state, x.step, _raw(x.rng))) for x in (a, b))
  assert len(la) == len(lb) > 3
  for u, v in zip(la, lb, strict=True):
    assert np.asarray(u).dtype == np.asarray(v).dtype
    assert np.asarray(u).tobytes() == np.asarray(v).tobytes()


def _raw(rng):
  return jax.random.key_data(rng) if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng

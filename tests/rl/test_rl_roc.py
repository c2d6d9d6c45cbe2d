"""RoC down-sampling: counts, distinctness, released ordering, paper sampling statistics."""

import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.rl import roc


def _reference_counts(n_pos, n, g, min_pos=2, min_neg=2):
  """The released code's rule (docs/reference.md §1.2), written independently with Python's round()."""
  n_neg = n - n_pos
  k_neg = round(n_neg * g / n)
  k_pos = g - k_neg
  if k_pos < min(min_pos, n_pos):
    k_pos = min(min_pos, n_pos)
    k_neg = g - k_pos
  if k_neg < min(min_neg, n_neg):
    k_neg = min(min_neg, n_neg)
    k_pos = g - k_neg
  return k_pos, k_neg


class RocTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_informative_groups(self):
    r = jnp.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 1]], jnp.float32)
    got = self.variant(roc.informative_groups)(r)
    np.testing.assert_array_equal(got, [False, False, True, True])
    counts = self.variant(roc.group_outcome_counts)(r)
    self.assertEqual(
      (int(counts["all_correct"]), int(counts["all_wrong"]), int(counts["informative"])), (1, 1, 2)
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_counts_analytic(self):
    # N = 32, G = 16: n_neg -> k_neg (half-even rounding, then minima).
    table = {0: 0, 1: 1, 2: 2, 3: 2, 5: 2, 7: 4, 16: 8, 29: 14, 30: 14, 31: 15, 32: 16}
    n_negs = list(table)
    rewards = jnp.array([[0.0] * k + [1.0] * (32 - k) for k in n_negs])
    k_pos, k_neg = self.variant(functools.partial(roc.roc_counts, group_size=16))(rewards)
    np.testing.assert_array_equal(k_neg, [table[k] for k in n_negs])
    np.testing.assert_array_equal(k_pos + k_neg, 16)

  @chex.variants(with_jit=True, without_jit=True)
  def test_distinct_indices_and_counts_random(self):
    n, g = 16, 8
    rng = np.random.default_rng(0)
    n_pos = np.arange(64) % (n + 1)
    rewards = np.zeros((64, n), np.float32)
    for b, k in enumerate(n_pos):
      rewards[b, rng.permutation(n)[:k]] = 1.0
    pen = rng.uniform(0, 2, (64, n)).astype(np.float32)
    for mode in ("paper", "released"):
      fn = self.variant(functools.partial(roc.roc_downsample, group_size=g, mode=mode))
      idx = np.asarray(fn(jax.random.PRNGKey(1), jnp.asarray(rewards), jnp.asarray(pen)))
      self.assertEqual(idx.shape, (64, g))
      self.assertEqual(idx.dtype, np.int32)
      for b in range(64):
        self.assertEqual(len(set(idx[b].tolist())), g)
        got_pos = int(rewards[b, idx[b]].sum())
        self.assertEqual(got_pos, _reference_counts(int(n_pos[b]), n, g)[0], (mode, b))

  @chex.variants(with_jit=True, without_jit=True)
  def test_released_keeps_lowest_penalties(self):
    rng = np.random.default_rng(3)
    rewards = (rng.uniform(size=(32, 16)) < 0.6).astype(np.float32)
    pen = rng.permutation(32 * 16).reshape(32, 16).astype(np.float32) / 100.0  # distinct
    fn = self.variant(functools.partial(roc.roc_downsample, group_size=8, mode="released"))
    idx = np.asarray(fn(jax.random.PRNGKey(0), jnp.asarray(rewards), jnp.asarray(pen)))
    for b in range(32):
      pos = np.flatnonzero(rewards[b] > 0)
      k_pos, _ = _reference_counts(len(pos), 16, 8)
      want = set(pos[np.argsort(pen[b, pos])[:k_pos]].tolist())
      got = {i for i in idx[b].tolist() if rewards[b, i] > 0}
      self.assertEqual(got, want)

  def test_released_ties_break_by_index(self):
    rewards = jnp.ones((1, 8))
    idx = roc.roc_downsample(
      jax.random.PRNGKey(0), rewards, jnp.zeros((1, 8)), group_size=4, mode="released"
    )
    np.testing.assert_array_equal(idx, [[0, 1, 2, 3]])

  def test_bad_arguments(self):
    r = jnp.ones((2, 8))
    with pytest.raises(ValueError, match="mode"):
      roc.roc_downsample(jax.random.PRNGKey(0), r, r, group_size=4, mode="nope")
    with pytest.raises(ValueError, match="group_size"):
      roc.roc_downsample(jax.random.PRNGKey(0), r, r, group_size=9)
    with pytest.raises(ValueError, match="min_pos"):
      roc.roc_downsample(jax.random.PRNGKey(0), r, r, group_size=3, min_pos=2, min_neg=2)


def test_paper_frequencies_follow_inverse_penalty_weights():
  """Inclusion frequencies over K keys vs the exact successive-sampling probabilities.

  4 positives with w = 1/(p + eps), k_pos = 2 (N=8, G=4); 4 negatives, k_neg = 2 (uniform:
  inclusion 1/2 each). Tolerance: 4.5 binomial standard errors per entry (a false alarm
  has probability < 1e-4 over the whole test).
  """
  pen = np.array([0.0, 0.5, 1.0, 1.5, 0, 0, 0, 0], np.float32)
  eps = 0.5
  w = 1.0 / (pen[:4] + eps)
  exact = np.zeros(4)
  for i, j in itertools.permutations(range(4), 2):
    p = w[i] / w.sum() * w[j] / (w.sum() - w[i])
    exact[i] += p
    exact[j] += p
  k = 4000
  rewards = jnp.tile(jnp.array([1, 1, 1, 1, 0, 0, 0, 0], jnp.float32), (k, 1))
  idx = jax.jit(functools.partial(roc.roc_downsample, group_size=4, mode="paper", eps=eps))(
    jax.random.PRNGKey(42), rewards, jnp.tile(jnp.asarray(pen), (k, 1))
  )
  freq = np.zeros(8)
  np.add.at(freq, np.asarray(idx).ravel(), 1.0)
  freq /= k
  want = np.concatenate([exact, np.full(4, 0.5)])
  tol = 4.5 * np.sqrt(want * (1 - want) / k)
  assert np.all(np.abs(freq - want) <= tol), (freq, want, tol)
  # The preference is real: the lowest penalty is kept far more often than the highest.
  assert freq[0] > freq[3] + 0.2


def test_vmappable_and_gather():
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  rewards = jnp.tile(jnp.array([[1, 0, 1, 0, 1, 1, 0, 0]], jnp.float32), (3, 2, 1))
  pen = jnp.zeros_like(rewards)
  fn = functools.partial(roc.roc_downsample, group_size=4)
  idx = jax.jit(jax.vmap(fn))(keys, rewards, pen)
  chex.assert_shape(idx, (3, 2, 4))
  x = jnp.arange(8.0)[None].repeat(2, 0)[..., None].repeat(5, -1)  # [2, 8, 5]
  out = roc.gather_groups(x, idx[0])
  np.testing.assert_array_equal(out[..., 0], idx[0])

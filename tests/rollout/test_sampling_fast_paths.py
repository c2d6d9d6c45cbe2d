"""The fast paths of ``sampling_ops``: argmax by max + masked min, the greedy-only shortcut and
the two-level inverse-CDF draw (vocabularies that are not a multiple of the block)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from rstar_jax.rollout import sampling_ops as ops


class FastPathsTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_argmax_first_matches_argmax_including_ties(self):
    x = jnp.round(jax.random.normal(jax.random.key(0), (16, 300)) * 2)  # many ties
    np.testing.assert_array_equal(self.variant(ops.argmax_first)(x), jnp.argmax(x, -1))

  @chex.variants(with_jit=True, without_jit=True)
  def test_all_greedy_batch_skips_the_draw_but_mixed_batches_still_sample(self):
    logits = jax.random.normal(jax.random.key(1), (6, 200)) * 0.1  # flat: draws differ
    keys = ops.row_keys(jnp.arange(12, dtype=jnp.uint32).reshape(6, 2), jnp.zeros(6, jnp.int32))
    fn = self.variant(ops.sample_tokens)
    off_k, off_p = jnp.zeros(6, jnp.int32), jnp.ones(6)
    greedy, _ = fn(logits, keys, jnp.zeros(6), off_k, off_p)
    np.testing.assert_array_equal(greedy, jnp.argmax(logits, -1))
    temp = jnp.asarray([0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    mixed, _ = fn(logits, keys, temp, off_k, off_p)
    np.testing.assert_array_equal(mixed[temp == 0], greedy[temp == 0])
    assert np.any(np.asarray(mixed)[temp > 0] != np.asarray(greedy)[temp > 0])

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(7, 64, 130, 1000)
  def test_block_inverse_cdf_follows_the_distribution_and_skips_zeros(self, vocab):
    rng = np.random.default_rng(vocab)
    p = rng.random(vocab) * (rng.random(vocab) < 0.3)  # most tokens impossible
    p[rng.integers(vocab)] = 1.0
    p[-1] = 0.0  # a zero at the padded end
    p /= p.sum()
    n = 6000
    logits = jnp.tile(
      jnp.asarray(np.where(p > 0, np.log(np.maximum(p, 1e-30)), ops.NEG_INF), jnp.float32)[None],
      (n, 1),
    )
    keys = ops.row_keys(
      jnp.stack([jnp.arange(n, dtype=jnp.uint32), jnp.full(n, vocab, jnp.uint32)], -1),
      jnp.zeros(n, jnp.int32),
    )
    tokens = np.asarray(self.variant(ops._inverse_cdf_sample)(logits, keys))
    assert tokens.min() >= 0 and tokens.max() < vocab
    assert np.all(p[tokens] > 0), "a zero-probability token was drawn"
    freq = np.bincount(tokens, minlength=vocab) / n
    top = np.argsort(-p)[:5]
    np.testing.assert_allclose(freq[top], p[top], atol=0.03)

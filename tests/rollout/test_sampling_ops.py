"""Analytic tests of the pure sampling ops (with and without jit)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from rstar_jax.rollout import sampling_ops as ops


def _logits_from_probs(probs):
  return jnp.log(jnp.asarray(probs, jnp.float32))


class KeepMaskTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_top_k_keeps_exactly_the_k_largest(self):
    logits = jnp.asarray([[0.1, 3.0, -1.0, 2.0, 0.5, 2.5]], jnp.float32)
    keep = self.variant(ops.top_k_top_p_keep_mask)(
      logits, jnp.asarray([3], jnp.int32), jnp.asarray([1.0], jnp.float32)
    )
    np.testing.assert_array_equal(keep[0], [False, True, False, True, False, True])

  @chex.variants(with_jit=True, without_jit=True)
  def test_top_k_ties_broken_by_lower_id(self):
    logits = jnp.asarray([[1.0, 2.0, 2.0, 2.0]], jnp.float32)
    keep = self.variant(ops.top_k_top_p_keep_mask)(
      logits, jnp.asarray([2], jnp.int32), jnp.asarray([1.0], jnp.float32)
    )
    np.testing.assert_array_equal(keep[0], [False, True, True, False])

  @parameterized.parameters(
    # probs are placed at ids [2, 0, 3, 1] = [0.5, 0.25, 0.15, 0.1]
    (0.4, [False, False, True, False]),
    (0.6, [True, False, True, False]),
    (0.8, [True, False, True, True]),
    (0.95, [True, True, True, True]),
    (1.0, [True, True, True, True]),
  )
  def test_top_p_smallest_prefix_reaching_mass(self, top_p, expected):
    probs = [0.25, 0.1, 0.5, 0.15]
    for fn in (ops.top_k_top_p_keep_mask, jax.jit(ops.top_k_top_p_keep_mask)):
      keep = fn(
        _logits_from_probs([probs]), jnp.asarray([0], jnp.int32), jnp.asarray([top_p], jnp.float32)
      )
      np.testing.assert_array_equal(keep[0], expected)

  @chex.variants(with_jit=True, without_jit=True)
  def test_top_p_applies_to_the_top_k_renormalised_distribution(self):
    # top-2 renormalised = [4/7, 3/7]: mass before the second token 0.571 >= 0.5 -> 1 kept.
    # (Without renormalisation 0.4 < 0.5 would keep two: the order of the filters matters.)
    logits = _logits_from_probs([[0.4, 0.3, 0.2, 0.1]])
    keep = self.variant(ops.top_k_top_p_keep_mask)(
      logits, jnp.asarray([2], jnp.int32), jnp.asarray([0.5], jnp.float32)
    )
    np.testing.assert_array_equal(keep[0], [True, False, False, False])

  @chex.variants(with_jit=True, without_jit=True)
  def test_disabled_filters_keep_everything_and_rows_are_independent(self):
    logits = jax.random.normal(jax.random.key(0), (4, 11))
    top_k = jnp.asarray([0, 11, 40, 1], jnp.int32)
    top_p = jnp.asarray([1.0, 1.0, 1.0, 1.0], jnp.float32)
    keep = self.variant(ops.top_k_top_p_keep_mask)(logits, top_k, top_p)
    assert keep[:3].all()
    np.testing.assert_array_equal(keep[3], jax.nn.one_hot(jnp.argmax(logits[3]), 11) > 0)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
    ("many_ties", 64, 50, 2.0, 1),  # logits rounded to 0.1: ties everywhere
    ("flat_4k_vocab", 8, 4096, 0.5, None),  # a near-uniform row: the nucleus is most of V
    ("peaked_4k_vocab", 8, 4096, 6.0, None),
    ("peaked_with_ties", 8, 4096, 6.0, 0),  # integer logits: large tie groups at the cut
  )
  def test_matches_a_sort_based_reference(self, B, V, scale, decimals):
    rng = np.random.default_rng(V + B)
    logits = (rng.normal(size=(B, V)) * scale).astype(np.float32)
    if decimals is not None:
      logits = np.round(logits, decimals).astype(np.float32)
    top_k = rng.integers(-1, V + 10, B).astype(np.int32)
    top_k[: B // 2] = -1  # half the rows: top-p alone
    top_p = rng.uniform(0.05, 1.2, B).clip(max=1.0).astype(np.float32)
    keep = np.asarray(
      self.variant(ops.top_k_top_p_keep_mask)(
        jnp.asarray(logits), jnp.asarray(top_k), jnp.asarray(top_p)
      )
    )
    for b in range(B):
      order = np.argsort(-logits[b], kind="stable")
      k = V if top_k[b] <= 0 else min(top_k[b], V)
      kept = order[:k]
      pr = np.exp(logits[b, kept] - logits[b, kept].max())
      pr /= pr.sum()
      before = np.cumsum(pr) - pr
      n = V if top_p[b] >= 1 else max(1, int(np.sum(before < top_p[b])))
      expected = np.zeros(V, bool)
      expected[kept[:n]] = True
      np.testing.assert_array_equal(keep[b], expected, err_msg=f"row {b}")

  @chex.variants(with_jit=True, without_jit=True)
  def test_filter_logits_skips_the_sort_only_when_every_row_is_unfiltered(self):
    logits = jax.random.normal(jax.random.key(1), (2, 7))
    out = self.variant(ops.filter_logits)(
      logits, jnp.asarray([0, 0], jnp.int32), jnp.asarray([1.0, 1.0], jnp.float32)
    )
    np.testing.assert_array_equal(out, logits)
    out = self.variant(ops.filter_logits)(
      logits, jnp.asarray([0, 2], jnp.int32), jnp.asarray([1.0, 1.0], jnp.float32)
    )
    np.testing.assert_array_equal(out[0], logits[0])
    assert int((out[1] > ops.NEG_INF / 2).sum()) == 2


class SampleTest(parameterized.TestCase):
  def _draw(self, logits_row, n, temperature, top_k, top_p, fn):
    logits = jnp.tile(jnp.asarray(logits_row, jnp.float32)[None], (n, 1))
    seeds = jnp.stack([jnp.arange(n, dtype=jnp.uint32), jnp.zeros(n, jnp.uint32)], -1)
    keys = ops.row_keys(seeds, jnp.zeros(n, jnp.int32))
    return fn(
      logits,
      keys,
      jnp.full(n, temperature, jnp.float32),
      jnp.full(n, top_k, jnp.int32),
      jnp.full(n, top_p, jnp.float32),
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_filtered_tokens_are_never_sampled_and_the_rest_follow_the_renormalised_dist(self):
    probs = np.asarray([0.05, 0.3, 0.05, 0.2, 0.1, 0.3])
    tokens, _ = self._draw(np.log(probs), 4000, 1.0, 3, 1.0, self.variant(ops.sample_tokens))
    tokens = np.asarray(tokens)
    allowed = {1, 3, 5}
    assert set(tokens.tolist()) <= allowed, set(tokens.tolist()) - allowed
    freq = np.bincount(tokens, minlength=6)[[1, 3, 5]] / len(tokens)
    np.testing.assert_allclose(freq, [0.375, 0.25, 0.375], atol=0.03)

  @chex.variants(with_jit=True, without_jit=True)
  def test_top_p_excluded_tokens_are_never_sampled(self):
    probs = np.asarray([0.1, 0.45, 0.05, 0.4])
    tokens, _ = self._draw(np.log(probs), 2000, 1.0, -1, 0.8, self.variant(ops.sample_tokens))
    assert set(np.asarray(tokens).tolist()) == {1, 3}

  @chex.variants(with_jit=True, without_jit=True)
  def test_temperature_sharpens_as_softmax_of_scaled_logits(self):
    logits = np.asarray([0.0, 1.0, 2.0])
    tokens, _ = self._draw(logits, 4000, 0.5, 0, 1.0, self.variant(ops.sample_tokens))
    freq = np.bincount(np.asarray(tokens), minlength=3) / 4000
    np.testing.assert_allclose(freq, jax.nn.softmax(logits / 0.5), atol=0.03)

  @chex.variants(with_jit=True, without_jit=True)
  def test_greedy_is_argmax_whatever_the_key(self):
    logits = jax.random.normal(jax.random.key(3), (64, 50))
    seeds = jax.random.randint(jax.random.key(4), (64, 2), 0, 2**31 - 1).astype(jnp.uint32)
    keys = ops.row_keys(seeds, jnp.arange(64, dtype=jnp.int32))
    tokens, _ = self.variant(ops.sample_tokens)(
      logits, keys, jnp.zeros(64), jnp.full(64, 5, jnp.int32), jnp.full(64, 0.3)
    )
    np.testing.assert_array_equal(tokens, jnp.argmax(logits, -1))

  @chex.variants(with_jit=True, without_jit=True)
  def test_logprobs_are_of_the_raw_distribution(self):
    logits = jax.random.normal(jax.random.key(5), (8, 30)) * 3
    keys = ops.row_keys(jnp.zeros((8, 2), jnp.uint32), jnp.arange(8, dtype=jnp.int32))
    tokens, logp = self.variant(ops.sample_tokens)(
      logits, keys, jnp.full(8, 0.7), jnp.full(8, 4, jnp.int32), jnp.full(8, 0.9)
    )
    expected = jax.nn.log_softmax(logits)[jnp.arange(8), tokens]
    np.testing.assert_allclose(logp, expected, rtol=1e-6, atol=1e-6)


class KeysTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_keys_depend_only_on_seed_and_index(self):
    seeds = jnp.asarray([[7, 0], [7, 0], [8, 0], [7, 1]], jnp.uint32)
    idx = jnp.asarray([3, 4, 3, 3], jnp.int32)
    data = jax.random.key_data(self.variant(ops.row_keys)(seeds, idx))
    assert len({tuple(np.asarray(d).tolist()) for d in data}) == 4
    # Same (seed, index) in another row / batch -> the same key.
    again = jax.random.key_data(self.variant(ops.row_keys)(seeds[::-1], idx[::-1]))
    np.testing.assert_array_equal(again[::-1], data)

  def test_split_seed(self):
    assert ops.split_seed(5) == (5, 0)
    assert ops.split_seed((3 << 32) + 9) == (9, 3)
    lo, hi = ops.split_seed(-1)
    assert lo == hi == 0xFFFFFFFF


class LargestTrueSearchTest(parameterized.TestCase):
  """The bisection behind both filters, against brute force."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(("spread", 1 << 30), ("clustered", 40), ("all_tied", 1))
  def test_kth_largest_key_exactly(self, spread):
    rng = np.random.default_rng(spread % 97)
    B, V = 16, 300
    key = (rng.integers(0, spread, (B, V)) + (1 << 20)).astype(np.uint32)
    k = rng.integers(1, V + 1, B).astype(np.int32)
    k[:3] = [1, V, 2]
    fn = self.variant(
      lambda key, k: ops._largest_true(lambda t: jnp.sum(key >= t[:, None], -1) >= k, B)
    )
    got = np.asarray(fn(jnp.asarray(key), jnp.asarray(k)))
    want = -np.sort(-key.astype(np.int64), axis=-1)[np.arange(B), k - 1]
    np.testing.assert_array_equal(got, want)


class TokenLogprobsTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_equals_the_gathered_log_softmax(self):
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(6, 300)).astype(np.float32) * np.array(
      [[0.1], [1.0], [10.0], [80.0], [1.0], [1.0]], np.float32
    )
    logits[4, 5:] = ops.NEG_INF  # masked tokens, as after filtering
    logits[5] += 1e4  # a large offset: needs the max shift
    tokens = np.array([0, 17, 299, 123, 4, 250], np.int32)
    got = self.variant(ops.token_logprobs)(jnp.asarray(logits), jnp.asarray(tokens))
    ref = np.take_along_axis(
      np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1)), tokens[:, None], -1
    )[:, 0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)
    assert np.all(np.isfinite(np.asarray(got)))


class StaticVariantTest(parameterized.TestCase):
  """The decode step's static sampling variants (no ``lax.cond``) against the on-device
  decision, for every variant that covers the rows' settings."""

  # (temperature, top_k, top_p) per row -> the cheapest variant that serves them.
  @parameterized.parameters(
    ([(0.0, 5, 0.5), (0.0, -1, 1.0)], "greedy"),
    ([(0.0, 5, 0.5), (1.0, -1, 1.0)], "sample"),
    ([(0.7, 300, 1.0), (1.0, 0, 1.0)], "sample"),  # k >= V and k <= 0 filter nothing
    ([(0.7, 5, 1.0), (1.0, -1, 1.0)], "top_k"),
    ([(0.7, -1, 0.9), (0.0, 5, 1.0)], "top_p"),
    ([(0.7, 5, 1.0), (1.0, -1, 0.8)], "top_k_top_p"),
  )
  def test_pick_and_every_covering_variant_match_the_dynamic_path(self, rows, want):
    V = 300
    t, k, p = (np.array(x) for x in zip(*rows))
    assert ops.pick_variant(t, k, p, V) == want
    covering = {
      "greedy": list(ops.VARIANTS),
      "sample": ["sample", "top_k", "top_p", "top_k_top_p"],
      "top_k": ["top_k", "top_k_top_p"],
      "top_p": ["top_p", "top_k_top_p"],
      "top_k_top_p": ["top_k_top_p"],
    }[want]
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(len(rows), V)).astype(np.float32) * 3)
    args = (jnp.asarray(t, jnp.float32), jnp.asarray(k, jnp.int32), jnp.asarray(p, jnp.float32))
    for step in range(4):
      keys = ops.row_keys(jnp.asarray([[1, 2], [3, 4]], jnp.uint32), jnp.full(2, step))
      ref_t, ref_l = ops.sample_tokens(logits, keys, *args)
      for v in covering:
        if v == "greedy" and want != "greedy":
          continue
        got_t, got_l = jax.jit(ops.sample_tokens, static_argnames="variant")(
          logits, keys, *args, variant=v
        )
        np.testing.assert_array_equal(got_t, ref_t, err_msg=v)
        np.testing.assert_allclose(got_l, ref_l, rtol=1e-6, err_msg=v)

  def test_unknown_variant_fails_clearly(self):
    z = jnp.zeros((1, 4))
    with self.assertRaisesRegex(ValueError, "variant expected one of"):
      ops.sample_tokens(
        z,
        ops.row_keys(jnp.zeros((1, 2), jnp.uint32), jnp.zeros(1, jnp.int32)),
        jnp.ones(1),
        jnp.zeros(1, jnp.int32),
        jnp.ones(1),
        variant="beam",
      )

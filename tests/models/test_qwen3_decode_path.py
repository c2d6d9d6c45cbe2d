"""The one-token decode path of ``forward_cached`` against the general (any-T) path."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from rstar_jax.models import qwen3

CONFIG = qwen3.Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, max_position_embeddings=64, tie_word_embeddings=False)
B, S = 5, 12


def _state(lengths, active):
    params = qwen3.init_params(CONFIG, jax.random.key(0))
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    shape = (CONFIG.num_hidden_layers, B, S, CONFIG.num_key_value_heads, CONFIG.head_dim)
    cache = qwen3.KVCache(k=jax.random.normal(k1, shape), v=jax.random.normal(k2, shape),
                          lengths=jnp.asarray(lengths, jnp.int32))
    ids = jax.random.randint(k3, (B, 1), 0, CONFIG.vocab_size)
    return params, cache, ids, jnp.asarray(active)[:, None]


class DecodePathTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_general_path_on_ragged_idle_and_full_rows(self):
        # Rows: empty cache, mid, idle (inactive), one slot left, full (token dropped).
        lengths, active = [0, 5, 7, S - 1, S], [True, True, False, True, True]
        params, cache, ids, mask = _state(lengths, active)
        decode = self.variant(lambda p, i, c, m: qwen3._forward_cached_decode(p, CONFIG, i, c, m))
        general = self.variant(lambda p, i, c, m: qwen3._forward_cached_general(p, CONFIG, i, c,
                                                                                m))
        got_logits, got = decode(params, ids, cache, mask)
        ref_logits, ref = general(params, ids, cache, mask)
        np.testing.assert_array_equal(got.lengths, ref.lengths)
        np.testing.assert_array_equal(got.lengths, [1, 6, 7, S, S])
        np.testing.assert_allclose(got.k, ref.k, atol=1e-6)
        np.testing.assert_allclose(got.v, ref.v, atol=1e-6)
        valid = np.flatnonzero(active)   # an inactive row's logits are unspecified
        np.testing.assert_allclose(np.asarray(got_logits)[valid], np.asarray(ref_logits)[valid],
                                   atol=2e-5)
        # The idle row's cache and every slot outside the written ones are untouched.
        np.testing.assert_array_equal(got.k[:, 2], cache.k[:, 2])
        np.testing.assert_array_equal(got.k[:, 1, :5], cache.k[:, 1, :5])
        assert not np.allclose(got.k[:, 1, 5], cache.k[:, 1, 5])

    @chex.variants(with_jit=True, without_jit=True)
    def test_stale_slots_past_length_are_ignored(self):
        """Whatever sits in slots >= lengths (a reused row) must not change the logits."""
        params, cache, ids, mask = _state([3, 4, 0, 6, 9], [True] * B)
        fn = self.variant(lambda c: qwen3._forward_cached_decode(params, CONFIG, ids, c, mask)[0])
        junk = cache._replace(k=cache.k.at[:, :, 9:].set(1e3), v=cache.v.at[:, :, 9:].set(-1e3))
        np.testing.assert_allclose(fn(junk), fn(cache), atol=1e-6)

    def test_forward_cached_dispatches_t1_to_the_decode_path(self):
        params, cache, ids, mask = _state([2, 3, 4, 5, 6], [True] * B)
        out = jax.jit(qwen3.forward_cached, static_argnames="config")(params, CONFIG, ids, cache,
                                                                      mask)
        ref = qwen3._forward_cached_decode(params, CONFIG, ids, cache, mask)
        np.testing.assert_allclose(out[0], ref[0], atol=1e-6)

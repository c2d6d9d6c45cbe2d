"""Building blocks against analytic facts, with and without jit (chex variants)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rstar_jax.models import qwen3


class BlocksTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_rms_norm_gives_unit_rms_times_scale(self):
    x = jax.random.normal(jax.random.key(0), (3, 5, 16)) * 7.0
    scale = jnp.linspace(0.5, 2.0, 16)
    y = self.variant(lambda x, s: qwen3.rms_norm(x, s, 1e-6))(x, scale)
    np.testing.assert_allclose(jnp.sqrt(jnp.mean((y / scale) ** 2, -1)), 1.0, rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_rope_is_a_relative_rotation(self):
    """Position 0 is the identity, norms are kept, and q.k depends only on the offset."""
    q = jax.random.normal(jax.random.key(1), (1, 1, 2, 8))
    k = jax.random.normal(jax.random.key(2), (1, 1, 2, 8))
    rope = self.variant(lambda x, p: qwen3.rope(x, p, 500.0))
    at = lambda x, p: rope(x, jnp.array([[p]]))
    np.testing.assert_allclose(at(q, 0), q, atol=1e-6)
    np.testing.assert_allclose(
      jnp.linalg.norm(at(q, 9), axis=-1), jnp.linalg.norm(q, axis=-1), rtol=1e-5
    )
    dot = lambda a, b: float(jnp.sum(at(q, a) * at(k, b)))
    np.testing.assert_allclose(dot(7, 3), dot(14, 10), rtol=1e-4)
    assert abs(dot(7, 3) - dot(3, 7)) > 1e-4

  @chex.variants(with_jit=True, without_jit=True)
  def test_forward_is_causal_and_shapes(self):
    config = qwen3.Qwen3Config(
      vocab_size=40,
      hidden_size=16,
      intermediate_size=24,
      num_hidden_layers=1,
      num_attention_heads=2,
      num_key_value_heads=1,
      head_dim=8,
    )
    params = qwen3.init_params(config, jax.random.key(0))
    f = self.variant(lambda p, ids: qwen3.forward(p, config, ids))
    ids = jnp.array([[1, 2, 3, 4, 5]], jnp.int32)
    out = f(params, ids)
    chex.assert_shape(out, (1, 5, 40))
    chex.assert_type(out, jnp.float32)
    changed = f(params, ids.at[0, 3].set(9))
    np.testing.assert_allclose(changed[:, :3], out[:, :3], atol=1e-6)  # past unaffected
    assert float(jnp.abs(changed[:, 3:] - out[:, 3:]).max()) > 1e-6


def test_jit_without_static_config_says_what_to_do():
  import pytest

  config = qwen3.Qwen3Config(
    vocab_size=40,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
  )
  params = qwen3.init_params(config, jax.random.key(0))
  ids = jnp.ones((1, 3), jnp.int32)
  hint = r"config must be a static Qwen3Config \(jit with static_argnames='config'\)"
  with pytest.raises(TypeError, match=hint):
    jax.jit(qwen3.forward)(params, config, ids)
  cache = qwen3.init_cache(config, 1, 8)
  with pytest.raises(TypeError, match=hint):
    jax.jit(qwen3.forward_cached)(params, config, ids, cache)
  with pytest.raises(TypeError, match=hint + "; got dict"):
    qwen3.forward(params, {"vocab_size": 40}, ids)
  # The documented form works.
  assert jax.jit(qwen3.forward, static_argnames="config")(params, config, ids).shape == (1, 3, 40)

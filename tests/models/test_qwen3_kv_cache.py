"""The per-layer KV-cache layout and the decode-friendly param layout of ``forward_cached``."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from rstar_jax.models import qwen3


def _config(tied):
  return qwen3.Qwen3Config(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
    tie_word_embeddings=tied,
  )


CONFIG = _config(False)
B, S = 4, 12


def _prefilled(lengths, config=CONFIG, params=None):
  """Params and a cache holding ``lengths[b]`` real prompt tokens per row (right-padded)."""
  params = qwen3.init_params(config, jax.random.key(0)) if params is None else params
  T = max(max(lengths), 1)
  ids = jax.random.randint(jax.random.key(1), (B, T), 0, config.vocab_size)
  mask = jnp.arange(T)[None] < jnp.asarray(lengths)[:, None]
  _, cache = qwen3.forward_cached(params, config, ids, qwen3.init_cache(config, B, S), mask)
  return params, cache, np.asarray(ids), np.asarray(mask)


class KVCacheLayoutTest(parameterized.TestCase):
  def test_init_cache_layout(self):
    cache = qwen3.init_cache(CONFIG, B, S)
    assert cache.num_layers == CONFIG.num_hidden_layers and cache.max_len == S
    for k, v in zip(cache.k, cache.v):
      assert k.shape == (B, 2, 16, S) and v.shape == (B, 2, S, 16)
    np.testing.assert_array_equal(cache.lengths, np.zeros(B))

  def test_prefill_writes_each_row_at_its_positions_only(self):
    lengths = [0, 3, 5, 1]
    _, cache, _, _ = _prefilled(lengths)
    np.testing.assert_array_equal(cache.lengths, lengths)
    for k, v in zip(cache.k, cache.v):
      for b, n in enumerate(lengths):
        assert np.all(np.asarray(k[b, ..., n:]) == 0) and np.all(np.asarray(v[b, :, n:]) == 0)
        if n:
          assert np.all(np.abs(np.asarray(k[b, ..., :n])).sum((0, 1)) > 0)
          assert np.all(np.abs(np.asarray(v[b, :, :n])).sum((0, 2)) > 0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_decode_on_idle_one_slot_left_and_full_rows(self):
    """An idle row and a full row keep their cache; the one-slot-left row fills its last
    slot; an active row's logits equal the full forward of its sequence."""
    params, cache, ids, mask = _prefilled([3, 5, S - 1, 4])
    cache = cache._replace(lengths=cache.lengths.at[3].set(S))  # row 3: full
    tok = jnp.array([[7], [9], [11], [13]], jnp.int32)
    active = jnp.array([[True], [False], [True], [True]])
    step = self.variant(lambda p, t, c, m: qwen3.forward_cached(p, CONFIG, t, c, m))
    logits, new = step(params, tok, cache, active)
    np.testing.assert_array_equal(new.lengths, [4, 5, S, S])
    for i in range(CONFIG.num_hidden_layers):
      for b in (1, 3):  # idle and full rows: untouched
        np.testing.assert_array_equal(new.k[i][b], cache.k[i][b])
        np.testing.assert_array_equal(new.v[i][b], cache.v[i][b])
      np.testing.assert_array_equal(new.k[i][0, ..., :3], cache.k[i][0, ..., :3])
      assert not np.allclose(new.k[i][0, ..., 3], cache.k[i][0, ..., 3])
      assert not np.allclose(new.v[i][2, :, S - 1], cache.v[i][2, :, S - 1])
    seq = np.r_[ids[0, :3], 7][None].astype(np.int32)
    ref = qwen3.forward(params, CONFIG, jnp.asarray(seq))[0, -1]
    np.testing.assert_allclose(logits[0, 0], ref, atol=2e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_stale_slots_past_length_are_ignored(self):
    """Whatever sits in slots >= lengths (a reused row) must not change the logits."""
    params, cache, _, _ = _prefilled([3, 4, 1, 6])
    tok = jnp.ones((B, 1), jnp.int32)
    fn = self.variant(lambda c: qwen3.forward_cached(params, CONFIG, tok, c)[0])
    junk = cache._replace(
      k=tuple(k.at[..., 7:].set(1e3) for k in cache.k),
      v=tuple(v.at[:, :, 7:].set(-1e3) for v in cache.v),
    )
    np.testing.assert_allclose(fn(junk), fn(cache), atol=1e-6)

  def test_cache_with_wrong_layer_count_is_named(self):
    params = qwen3.init_params(CONFIG, jax.random.key(0))
    cache = qwen3.init_cache(CONFIG, B, S)
    short = cache._replace(k=cache.k[:1], v=cache.v[:1])
    with pytest.raises(ValueError, match="cache has 1 layers, config 2"):
      qwen3.forward_cached(params, CONFIG, jnp.ones((B, 1), jnp.int32), short)


class InferenceParamsTest(parameterized.TestCase):
  @parameterized.parameters(True, False)
  def test_same_logits_and_cache_as_the_stacked_layout(self, tied):
    config = _config(tied)
    params = qwen3.init_params(config, jax.random.key(2))
    fast = jax.jit(qwen3.inference_params, static_argnums=1)(params, config)
    assert isinstance(fast["layers"], tuple) and len(fast["layers"]) == 2
    assert ("lm_head" in fast) and (("lm_head" in params) == (not tied))
    if tied:
      np.testing.assert_array_equal(
        fast["lm_head"]["kernel"], params["embed_tokens"]["embedding"].T
      )
    ids = jax.random.randint(jax.random.key(3), (B, 5), 0, config.vocab_size)
    step = jax.jit(qwen3.forward_cached, static_argnames="config")
    outs = []
    for p in (params, fast):
      l1, c = step(p, config, ids, qwen3.init_cache(config, B, S))
      l2, c = step(p, config, ids[:, :1], c)
      outs.append((l1, l2, c))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), outs[0], outs[1])

  def test_idempotent_and_leaves_the_input_alone(self):
    config = _config(True)
    params = qwen3.init_params(config, jax.random.key(2))
    once = qwen3.inference_params(params, config)
    twice = qwen3.inference_params(once, config)
    jax.tree.map(np.testing.assert_array_equal, once, twice)
    assert "lm_head" not in params and not isinstance(params["layers"], tuple)
    up = qwen3.layer_params(params, 1)["mlp"]["up_proj"]["kernel"]
    np.testing.assert_array_equal(
      up, once["layers"][1]["mlp"]["gate_up_proj"]["kernel"][:, -up.shape[1] :]
    )

  def test_qkv_and_gate_up_are_fused_unless_a_part_has_lora(self):
    config = _config(False)
    params = qwen3.init_params(config, jax.random.key(2))
    fast = qwen3.inference_params(params, config)
    attn, mlp = fast["layers"][0]["self_attn"], fast["layers"][0]["mlp"]
    assert "qkv_proj" in attn and not {"q_proj", "k_proj", "v_proj"} & set(attn)
    d, hq, hkv, dh = (
      config.hidden_size,
      config.num_attention_heads,
      config.num_key_value_heads,
      config.head_dim,
    )
    assert attn["qkv_proj"]["kernel"].shape == (d, (hq + 2 * hkv) * dh)
    assert "gate_up_proj" in mlp and "gate_proj" not in mlp and "o_proj" in attn
    # A biased attention (Qwen2-style) fuses its biases too, with the same logits; a LoRA
    # adapter on one projection keeps that group unfused (the adapter stays unmerged).
    layers = dict(params["layers"])
    rng = np.random.default_rng(0)
    for n, width in (("q_proj", hq * dh), ("k_proj", hkv * dh), ("v_proj", hkv * dh)):
      layers["self_attn"] = dict(layers["self_attn"])
      layers["self_attn"][n] = {
        **layers["self_attn"][n],
        "bias": jnp.asarray(rng.normal(size=(config.num_hidden_layers, width)), jnp.float32),
      }
    biased = {**params, "layers": layers}
    fb = qwen3.inference_params(biased, config)
    assert fb["layers"][1]["self_attn"]["qkv_proj"]["bias"].shape == ((hq + 2 * hkv) * dh,)
    ids = jax.random.randint(jax.random.key(3), (B, 5), 0, config.vocab_size)
    outs = [
      qwen3.forward_cached(p, config, ids, qwen3.init_cache(config, B, S))[0] for p in (biased, fb)
    ]
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)
    lora_layer = qwen3.layer_params(params, 0)
    lora_layer = {
      **lora_layer,
      "mlp": {**lora_layer["mlp"], "up_proj": {**lora_layer["mlp"]["up_proj"], "lora_a": 0}},
    }
    fused = qwen3._fuse_layer(lora_layer)
    assert "gate_up_proj" not in fused["mlp"] and "lora_a" in fused["mlp"]["up_proj"]
    assert "qkv_proj" in fused["self_attn"]

"""Logits parity with transformers, padding invariance, KV-cache decoding, dtypes, remat."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_test_utils import CASES, torch_logits

from rstar_jax.models import qwen3

fwd = jax.jit(qwen3.forward, static_argnames="config")
fwd_cached = jax.jit(qwen3.forward_cached, static_argnames="config")


def _ids(config, shape, seed=0):
  return np.random.default_rng(seed).integers(0, config.vocab_size, shape).astype(np.int32)


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(hf_models, case):
  hf_dir, model = hf_models(case)
  config = qwen3.Qwen3Config.from_hf(hf_dir)
  params = qwen3.load_hf_params(hf_dir, config)
  ids = _ids(config, (2, 11))
  ours = np.asarray(fwd(params, config, jnp.asarray(ids)))
  ref = torch_logits(model, ids)
  err = np.abs(ours - ref).max()
  assert err < 1e-4, f"{case}: max abs logit diff {err:.3g}"


def test_config_reads_hf_fields(hf_models):
  hf_dir, model = hf_models("qwen3_gqa4_untied")
  c = qwen3.Qwen3Config.from_hf(hf_dir)
  assert (c.head_dim, c.rope_theta, c.rms_norm_eps) == (16, 5000.0, 1e-5)
  assert not c.tie_word_embeddings and c.use_qk_norm and c.model_type == "qwen3"
  c2 = qwen3.Qwen3Config.from_hf(hf_models("qwen2_gqa2")[0])
  assert c2.attention_bias and not c2.use_qk_norm and not c2.o_bias and c2.head_dim == 8


# Padding and cache logic is shared by both model types (parity above covers the qwen2 bits),
# so these run on one case to keep the suite fast.
@pytest.mark.parametrize("case", ["qwen3_gqa4_untied"])
def test_padded_rows_equal_unpadded(hf_models, case):
  """Left- and right-padded rows give each sequence's own unpadded logits."""
  hf_dir, _ = hf_models(case)
  config = qwen3.Qwen3Config.from_hf(hf_dir)
  params = qwen3.load_hf_params(hf_dir, config)
  T = 9
  seqs = [_ids(config, (n,), seed=10 + i) for i, n in enumerate((9, 4, 4))]
  singles = [np.asarray(fwd(params, config, jnp.asarray(s[None])))[0] for s in seqs]
  for side in ("left", "right"):
    ids = np.zeros((3, T), np.int32)
    mask = np.zeros((3, T), np.int32)
    for r, s in enumerate(seqs):
      sl = slice(T - len(s), T) if side == "left" else slice(0, len(s))
      ids[r, sl], mask[r, sl] = s, 1
    out = np.asarray(fwd(params, config, jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    assert np.isfinite(out).all()
    for r, s in enumerate(seqs):
      got = out[r][mask[r] == 1]
      np.testing.assert_allclose(got, singles[r], atol=2e-5, err_msg=f"{side} row {r}")


@pytest.mark.parametrize("case", ["qwen3_gqa4_untied"])
def test_kv_cached_decoding_matches_full_forward(hf_models, case):
  """Ragged prefill (right-padded) then N single-token steps, with a row idling every other
  step, equal the full forward of each row's final sequence at every step's position (causal:
  position t of the full forward sees exactly the tokens cached so far)."""
  hf_dir, _ = hf_models(case)
  config = qwen3.Qwen3Config.from_hf(hf_dir)
  params = qwen3.load_hf_params(hf_dir, config)
  B, P, N, S = 3, 6, 5, 16
  prompt_lens = np.array([6, 2, 4])
  stream = _ids(config, (B, P + N), seed=3)
  cache = qwen3.init_cache(config, B, S)
  pre_mask = np.arange(P)[None] < prompt_lens[:, None]
  logits, cache = fwd_cached(
    params, config, jnp.asarray(stream[:, :P] * pre_mask), cache, jnp.asarray(pre_mask)
  )
  np.testing.assert_array_equal(np.asarray(cache.lengths), prompt_lens)
  seqs = [list(stream[r, : prompt_lens[r]]) for r in range(B)]
  got = [list(np.asarray(logits[r, : prompt_lens[r]])) for r in range(B)]
  lengths = prompt_lens.copy()
  for step in range(N):
    active = np.array([True, step % 2 == 0, True])
    tok = stream[:, P + step].astype(np.int32)
    logits, cache = fwd_cached(
      params, config, jnp.asarray(tok[:, None]), cache, jnp.asarray(active[:, None])
    )
    lengths += active
    np.testing.assert_array_equal(np.asarray(cache.lengths), lengths)
    for r in np.flatnonzero(active):
      seqs[r].append(tok[r])
      got[r].append(np.asarray(logits[r, 0]))
  # One right-padded full forward over the final sequences is the reference for every step.
  T = max(map(len, seqs))
  ids, mask = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32)
  for r, s in enumerate(seqs):
    ids[r, : len(s)], mask[r, : len(s)] = s, 1
  ref = np.asarray(fwd(params, config, jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
  for r in range(B):
    np.testing.assert_allclose(
      np.stack(got[r]), ref[r, : len(seqs[r])], atol=2e-5, err_msg=f"row {r}"
    )


def test_cache_prefill_into_free_slot_while_others_idle(hf_models):
  """Continuous batching: a reset slot gets a new prompt while another row keeps its cache."""
  hf_dir, _ = hf_models("qwen3_gqa4_untied")
  config = qwen3.Qwen3Config.from_hf(hf_dir)
  params = qwen3.load_hf_params(hf_dir, config)
  a, b, c = _ids(config, (5,), 1), _ids(config, (7,), 2), _ids(config, (3,), 4)
  cache = qwen3.init_cache(config, 2, 12)
  ids = np.zeros((2, 7), np.int32)
  ids[0, :5], ids[1] = a, b
  mask = np.zeros((2, 7), bool)
  mask[0, :5], mask[1] = True, True
  _, cache = fwd_cached(params, config, jnp.asarray(ids), cache, jnp.asarray(mask))
  cache = cache.reset_rows(jnp.array([True, False]))
  ids, mask = np.zeros((2, 3), np.int32), np.zeros((2, 3), bool)
  ids[0], mask[0] = c, True
  logits, cache = fwd_cached(params, config, jnp.asarray(ids), cache, jnp.asarray(mask))
  np.testing.assert_array_equal(np.asarray(cache.lengths), [3, 7])
  np.testing.assert_allclose(
    np.asarray(logits[0]), np.asarray(fwd(params, config, jnp.asarray(c[None])))[0], atol=2e-5
  )
  nxt = np.array([[c[0]], [a[0]]], np.int32)
  logits, cache = fwd_cached(params, config, jnp.asarray(nxt), cache)
  ref1 = np.asarray(fwd(params, config, jnp.asarray(np.r_[b, a[:1]][None])))[0, -1]
  np.testing.assert_allclose(np.asarray(logits[1, 0]), ref1, atol=2e-5)


def test_bfloat16_params_and_compute_track_float32(hf_models):
  hf_dir, _ = hf_models("qwen3_gqa4_untied")
  c32 = qwen3.Qwen3Config.from_hf(hf_dir)
  c16 = qwen3.Qwen3Config.from_hf(hf_dir, dtype="bfloat16")
  p32 = qwen3.load_hf_params(hf_dir, c32)
  p16 = qwen3.load_hf_params(hf_dir, c16, dtype=jnp.bfloat16)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(p16))
  ids = jnp.asarray(_ids(c32, (2, 8)))
  l32, l16 = fwd(p32, c32, ids), fwd(p16, c16, ids)
  assert l16.dtype == jnp.float32
  err = float(jnp.abs(l32 - l16).max())
  assert 0 < err < 0.1 * float(jnp.abs(l32).max()), err


def test_remat_gives_same_loss_and_grads():
  config = qwen3.Qwen3Config(
    vocab_size=20,
    hidden_size=8,
    intermediate_size=8,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
  )
  params = qwen3.init_params(config, jax.random.key(0))
  ids = jnp.asarray(_ids(config, (1, 4)))

  def loss(p, cfg):
    return jax.nn.log_softmax(qwen3.forward(p, cfg, ids)).mean()

  g0 = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, config)
  g1 = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, config.replace(remat=True))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g0, g1)


def test_init_params_matches_logical_axes_and_shapes():
  config = qwen3.Qwen3Config(
    vocab_size=50,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    tie_word_embeddings=True,
  )
  params = qwen3.init_params(config, jax.random.key(1), dtype=jnp.bfloat16)
  axes = qwen3.param_logical_axes(config)
  is_axes = lambda x: isinstance(x, tuple)
  assert jax.tree.structure(params) == jax.tree.structure(axes, is_leaf=is_axes)
  jax.tree.map(
    lambda a, ax: a.ndim == len(ax) or pytest.fail(f"{ax} vs {a.shape}"),
    params,
    axes,
    is_leaf=is_axes,
  )
  assert "lm_head" not in params
  assert params["layers"]["mlp"]["up_proj"]["kernel"].shape == (3, 16, 24)


def test_config_validation_names_the_problem():
  base = dict(
    vocab_size=10,
    hidden_size=8,
    intermediate_size=8,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
  )
  with pytest.raises(ValueError, match="model_type"):
    qwen3.Qwen3Config(**base, model_type="llama")
  with pytest.raises(ValueError, match="num_key_value_heads"):
    qwen3.Qwen3Config(**{**base, "num_key_value_heads": 3})
  with pytest.raises(ValueError, match="dtype"):
    qwen3.Qwen3Config(**base, dtype="float16")

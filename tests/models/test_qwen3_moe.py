"""Qwen3-MoE: logits parity with transformers' Qwen3MoeForCausalLM (mixed dense / sparse
layers), HF safetensors in and out, grouped forms == the all-experts reference, KV-cached
decode == full forward, forced routes (replay) and the sentinel. Tolerance: f32 logits within
1e-4 of transformers (observed ~1e-6)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_test_utils import MOE_CASES, torch_logits

from rstar_jax.models import moe, qwen3, qwen3_moe
from rstar_jax.models import qwen3_hf_layout as hf_layout

fwd = jax.jit(qwen3_moe.forward, static_argnames=("config", "return_aux"))
fwd_cached = jax.jit(qwen3.forward_cached, static_argnames="config")


def _ids(config, shape, seed=0):
  return np.random.default_rng(seed).integers(0, config.vocab_size, shape).astype(np.int32)


def _load(hf_models, case, **overrides):
  # Routing tests run the all-experts reference form: the same routing, a program that
  # compiles faster (the grouped forms are checked against it below).
  overrides.setdefault("moe_implementation", "dense")
  hf_dir, model = hf_models(case)
  config = qwen3.Qwen3Config.from_hf(hf_dir, **overrides)
  return config, qwen3.load_hf_params(hf_dir, config), model, hf_dir


@pytest.mark.parametrize("case", sorted(MOE_CASES))
def test_logits_match_transformers(hf_models, case):
  config, params, model, _ = _load(hf_models, case, moe_implementation="dense")
  assert isinstance(config, qwen3_moe.Qwen3MoeConfig)
  ids = _ids(config, (2, 11))
  ref = torch_logits(model, ids)
  for impl in ("dense", "block", "ragged"):
    c = config.replace(moe_implementation=impl, moe_block_size=8)
    ours = np.asarray(fwd(params, c, jnp.asarray(ids)))
    err = np.abs(ours - ref).max()
    assert err < 1e-4, f"{case} {impl}: max abs logit diff {err:.3g}"


def test_config_and_layer_kinds(hf_models):
  c, params, _, _ = _load(hf_models, "qwen3_moe_mixed")
  assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (6, 2, 16)
  assert c.sparse_layers == (0, 2, 3) and c.dense_layers == (1,) and not c.norm_topk_prob
  assert qwen3_moe.runs(c) == [(True, 0, 1, 0), (False, 1, 2, 0), (True, 2, 4, 1)]
  assert params["moe"]["experts"]["down_proj"]["kernel"].shape == (3, 6, 16, 32)
  assert params["dense_mlp"]["gate_proj"]["kernel"].shape == (1, 32, 40)
  c2 = qwen3.Qwen3Config.from_hf(hf_models("qwen3_moe_step2_norm")[0])
  assert c2.sparse_layers == (1, 3) and c2.norm_topk_prob and c2.tie_word_embeddings
  with pytest.raises(ValueError, match="num_experts_per_tok"):
    c.replace(num_experts_per_tok=7)
  with pytest.raises(ValueError, match="mlp_only_layers"):
    c.replace(mlp_only_layers=(9,))
  with pytest.raises(TypeError, match="qwen3_moe.forward"):
    qwen3.forward(params, c, jnp.zeros((1, 3), jnp.int32))


def test_save_hf_round_trip_names_and_transformers_load(hf_models, tmp_path):
  import torch
  import transformers
  from safetensors import safe_open

  config, params, model, hf_dir = _load(hf_models, "qwen3_moe_mixed")
  qwen3.save_hf(tmp_path, config, params)
  with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
    ours = set(f.keys())
  with safe_open(hf_dir + "/model.safetensors", "np") as f:
    theirs = set(f.keys())
  assert ours == theirs and "model.layers.3.mlp.experts.5.down_proj.weight" in ours
  reloaded = transformers.Qwen3MoeForCausalLM.from_pretrained(tmp_path).eval()
  ids = _ids(config, (1, 7), seed=4)
  with torch.no_grad():
    a = reloaded(torch.as_tensor(ids, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(a, torch_logits(model, ids), atol=1e-6)
  back = qwen3.load_hf_params(tmp_path, config)
  for path, leaf in hf_layout.leaves(params):
    np.testing.assert_array_equal(np.asarray(hf_layout.get_leaf(back, path)), np.asarray(leaf))
  # The host-side table inverse agrees with the streaming loader.
  host = {}
  with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
    host = {k: f.get_tensor(k) for k in f.keys()}
  tree = hf_layout.hf_to_tree(host, config)
  for path, leaf in hf_layout.leaves(params):
    np.testing.assert_array_equal(hf_layout.get_leaf(tree, path), np.asarray(leaf))


def test_sharded_load_on_mesh(hf_models):
  from rstar_jax.sharding import make_mesh

  config, params, _, hf_dir = _load(hf_models, "qwen3_moe_mixed")
  mesh = make_mesh({"fsdp": -1})
  sharded = qwen3.load_hf_params(hf_dir, config, mesh=mesh)
  for path, leaf in hf_layout.leaves(params):
    np.testing.assert_array_equal(np.asarray(hf_layout.get_leaf(sharded, path)), np.asarray(leaf))


def test_kv_cached_decoding_matches_full_forward(hf_models):
  """Prefill then single-token steps (stacked and inference layouts) == full forward."""
  config, params, _, _ = _load(hf_models, "qwen3_moe_mixed", moe_implementation="auto")
  B, P, N, S = 2, 5, 3, 16
  stream = _ids(config, (B, P + N), seed=3)
  full = np.asarray(fwd(params, config, jnp.asarray(stream)))
  p = qwen3.inference_params(params, config)
  cache = qwen3.init_cache(config, B, S)
  logits, cache = fwd_cached(p, config, jnp.asarray(stream[:, :P]), cache)
  np.testing.assert_allclose(np.asarray(logits), full[:, :P], atol=2e-5)
  for t in range(P, P + N):
    logits, cache = fwd_cached(p, config, jnp.asarray(stream[:, t : t + 1]), cache)
    np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, t], atol=2e-5, err_msg=f"{t}")
  # The stacked layout (layer views cut from the per-kind stacks), one prefill.
  moe_cached = np.asarray(
    qwen3_moe.forward_cached(params, config, jnp.asarray(stream), qwen3.init_cache(config, B, S))[0]
  )
  np.testing.assert_allclose(moe_cached, full, atol=2e-5)


def test_aux_routes_layout_and_own_routes_replay_exactly(hf_models):
  config, params, _, _ = _load(hf_models, "qwen3_moe_mixed")
  ids = jnp.asarray(_ids(config, (2, 9), seed=1))
  logits, aux = fwd(params, config, ids, return_aux=True)
  B, T, L, k = 2, 9, 4, 2
  assert aux.topk.shape == aux.routes.shape == (B, T, L, k) and aux.topk.dtype == jnp.int32
  np.testing.assert_array_equal(np.asarray(aux.topk[:, :, 1]), -1)  # the dense layer
  assert (np.asarray(aux.topk[:, :, [0, 2, 3]]) >= 0).all()
  np.testing.assert_array_equal(np.asarray(aux.routes), np.asarray(aux.topk))
  # Replaying the model's own routes (same weights) reproduces its routing and logits exactly.
  logits2, aux2 = fwd(params, config, ids, routes=aux.topk, return_aux=True)
  np.testing.assert_array_equal(np.asarray(aux2.routes), np.asarray(aux.topk))
  np.testing.assert_allclose(np.asarray(logits2), np.asarray(logits), atol=1e-6)
  # All-sentinel routes change nothing.
  none = jnp.full((B, T, L, k), -1, jnp.int32)
  np.testing.assert_array_equal(
    np.asarray(fwd(params, config, ids, routes=none)), np.asarray(logits)
  )


def test_forced_routes_take_the_recorded_set_with_router_gradients(hf_models):
  config, params, _, _ = _load(hf_models, "qwen3_moe_step2_norm")
  ids = jnp.asarray(_ids(config, (2, 6), seed=2))
  _, aux = fwd(params, config, ids, return_aux=True)
  own = np.asarray(aux.topk)
  E = config.num_experts
  # A different recorded set: shift every expert id by one (mod E) on the sparse layers.
  forced = np.where(own >= 0, (own + 1) % E, -1).astype(np.int32)
  forced[0, 0] = -1  # token (0, 0): no recorded route in any layer -> its own top-k
  forced[1, 2, 1, 0] = -1  # one slot missing -> the whole (token, layer) falls back
  forced[1, 3, 3, :] = [E, 0, 1]  # out of range -> falls back too
  logits_f, aux_f = fwd(params, config, ids, routes=jnp.asarray(forced), return_aux=True)
  used = np.asarray(aux_f.routes)
  fallback = np.zeros(own.shape[:3], bool)
  fallback[0, 0], fallback[1, 2, 1], fallback[1, 3, 3] = True, True, True
  for b, t, layer in np.ndindex(*own.shape[:3]):
    if layer not in config.sparse_layers:
      continue
    want = own[b, t, layer] if fallback[b, t, layer] else forced[b, t, layer]
    np.testing.assert_array_equal(used[b, t, layer], want, err_msg=f"{(b, t, layer)}")
  # The first sparse layer sees unchanged inputs: its own top-k is still reported.
  np.testing.assert_array_equal(np.asarray(aux_f.topk[:, :, 1]), own[:, :, 1])

  def loss(p, routes):
    return jnp.mean(fwd(p, config, ids, routes=routes) ** 2)

  g = jax.grad(loss)(params, jnp.asarray(forced))
  router_grad = np.abs(np.asarray(g["moe"]["gate"]["kernel"]))
  assert router_grad.max() > 0 and np.isfinite(router_grad).all()
  # Gate weights = own softmax gathered at the forced experts, renormalised: check one layer.
  h = jax.random.normal(jax.random.key(0), (5, config.hidden_size))
  gate = params["moe"]["gate"]["kernel"][0]
  r = moe.route(h, gate, 3, True, jnp.asarray([[4, 0, 7]] * 5, jnp.int32))
  probs = jax.nn.softmax(h @ gate, axis=-1)[:, jnp.array([4, 0, 7])]
  np.testing.assert_allclose(
    np.asarray(r.weights), np.asarray(probs / probs.sum(-1, keepdims=True)), rtol=1e-6
  )


def test_sentinel_never_selects_expert_zero():
  """Where the router's own top-k excludes expert 0, all-sentinel / partly-sentinel routes
  never put a token on expert 0."""
  D, E, k = 8, 4, 2
  h = jnp.ones((3, D))
  gate = jnp.zeros((D, E)).at[:, 2].set(1.0).at[:, 3].set(0.5)  # own top-2 = {2, 3}
  for routes in ([[-1, -1]] * 3, [[-1, 0]] * 3, [[0, -1]] * 3):
    r = moe.route(h, gate, k, False, jnp.asarray(routes, jnp.int32))
    assert not (np.asarray(r.ids) == 0).any(), routes
    np.testing.assert_array_equal(np.asarray(r.ids), [[2, 3]] * 3)


def test_grouped_forms_match_reference_values_and_grads():
  N, D, F, E, k = 37, 16, 12, 6, 2
  ks = jax.random.split(jax.random.key(0), 5)
  x = jax.random.normal(ks[0], (N, D))
  p = {
    "gate_proj": {"kernel": 0.3 * jax.random.normal(ks[1], (E, D, F))},
    "up_proj": {"kernel": 0.3 * jax.random.normal(ks[2], (E, D, F))},
    "down_proj": {"kernel": 0.3 * jax.random.normal(ks[3], (E, F, D))},
  }
  r = moe.route(x, jax.random.normal(ks[4], (D, E)), k, True)
  skew = jnp.stack([jnp.full((N,), 3), jnp.where(jnp.arange(N) % E == 3, 4, jnp.arange(N) % E)], 1)
  for ids in (r.ids, skew):  # router-like and all-on-one-expert routing
    w = r.weights

    def loss(p, x, impl, ids=ids, w=w):
      return jnp.sum(moe.experts(x, ids, w, p, impl, max_block=8) ** 2)

    ref_v, ref_g = jax.value_and_grad(loss, argnums=(0, 1))(p, x, "dense")
    for impl in ("block", "ragged"):
      v, g = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)(p, x, impl)
      np.testing.assert_allclose(float(v), float(ref_v), rtol=1e-5, err_msg=impl)
      for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref_g)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)


def test_losses_and_metrics_analytic():
  # 4 tokens, E=2, k=1; the last token is padding. Logits 0 -> uniform probs.
  logits = jnp.zeros((4, 2))
  r = moe.Routing(
    topk=jnp.array([[0], [0], [1], [1]], jnp.int32),
    ids=jnp.array([[0], [0], [1], [1]], jnp.int32),
    weights=jnp.ones((4, 1)),
    logits=logits,
    probs=jax.nn.softmax(logits),
  )
  st = moe.layer_stats(r, jnp.array([1, 1, 1, 0], bool))
  np.testing.assert_allclose(np.asarray(st.counts), [2, 1])
  assert float(st.tokens) == 3
  # f = (2/3, 1/3), P = (1/2, 1/2): E * sum f P = 2 * 1/2 = 1.
  np.testing.assert_allclose(float(moe.load_balancing_loss(st, 1)), 1.0, rtol=1e-6)
  np.testing.assert_allclose(float(moe.router_z_loss(st)), np.log(2) ** 2, rtol=1e-6)
  m = moe.expert_metrics(jax.tree.map(lambda a: a[None], st))
  np.testing.assert_allclose(np.asarray(m["load_max"]), [4 / 3], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(m["load_min"]), [2 / 3], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(m["load_cv"]), [1 / 3], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(m["router_entropy"]), [np.log(2)], rtol=1e-6)
  # A collapsed router (all mass and load on expert 0) scores E = 2.
  hard = jnp.array([[20.0, -20.0]] * 3)
  r2 = r._replace(ids=jnp.zeros((3, 1), jnp.int32), logits=hard, probs=jax.nn.softmax(hard))
  np.testing.assert_allclose(float(moe.load_balancing_loss(moe.layer_stats(r2), 1)), 2.0, 1e-5)


def test_aux_losses_from_forward(hf_models):
  config, params, _, _ = _load(hf_models, "qwen3_moe_mixed")
  config = config.replace(router_z_loss_coef=0.01)
  ids = jnp.asarray(_ids(config, (2, 9), seed=1))
  mask = jnp.asarray(np.arange(9)[None] < np.array([[9], [5]]))
  _, aux = fwd(params, config, ids, attention_mask=mask, return_aux=True)
  np.testing.assert_allclose(np.asarray(aux.stats.tokens), [14.0] * 3)
  np.testing.assert_allclose(np.asarray(aux.stats.counts.sum(-1)), [28.0] * 3)
  total, metrics = qwen3_moe.aux_losses(aux, config)
  want = 0.001 * metrics["moe/load_balancing_loss"] + 0.01 * metrics["moe/router_z_loss"]
  np.testing.assert_allclose(float(total), float(want), rtol=1e-6)
  assert metrics["moe/load_cv"].shape == (3,)

  # The aux loss reaches the router (only the router: the expert weights do not change it).
  gate = params["moe"]["gate"]["kernel"]

  def loss(gate):
    p = {**params, "moe": {**params["moe"], "gate": {"kernel": gate}}}
    _, a = qwen3_moe.forward(p, config, ids, attention_mask=mask, return_aux=True)
    return qwen3_moe.aux_losses(a, config)[0]

  assert np.abs(np.asarray(jax.jit(jax.grad(loss))(gate))).max() > 0


def test_all_dense_moe_config_has_zero_aux_loss():
  c = qwen3_moe.Qwen3MoeConfig(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=24,
    moe_intermediate_size=8,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    num_experts=4,
    num_experts_per_tok=2,
    mlp_only_layers=(0, 1),
  )
  params = qwen3.init_params(c, jax.random.key(0))
  assert "moe" not in params and c.sparse_layers == ()
  _, aux = qwen3_moe.forward(params, c, jnp.zeros((1, 4), jnp.int32), return_aux=True)
  total, metrics = qwen3_moe.aux_losses(aux, c)
  assert float(total) == 0.0 and metrics == {}
  np.testing.assert_array_equal(np.asarray(aux.routes), -1)

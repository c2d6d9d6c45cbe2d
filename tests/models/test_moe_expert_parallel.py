"""Expert parallelism on 8 fake CPU devices (tests/conftest.py): EP 4 x FSDP 2 (and EP 2 x
FSDP 2 x TP 2) give the 1-device loss, routes, expert metrics and gradients of a tiny
Qwen3-MoE with mixed layers; the lowered program exchanges tokens with all-to-all.

Tolerance (f32): loss rtol 1e-6, gradients atol 1e-6 (observed ~2e-7 against a largest
gradient ~1; the difference is reduction order across devices)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.models import qwen3, qwen3_moe
from rstar_jax.sharding import make_mesh
from rstar_jax.sharding.mesh import use_mesh

CFG = qwen3_moe.Qwen3MoeConfig(
  vocab_size=64,
  hidden_size=32,
  intermediate_size=48,
  moe_intermediate_size=16,
  num_hidden_layers=3,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=8,
  num_experts=8,
  num_experts_per_tok=2,
  mlp_only_layers=(1,),
  norm_topk_prob=True,
  router_z_loss_coef=0.01,
)


@functools.cache
def _setup():
  params = qwen3.init_params(CFG, jax.random.key(0))
  # Sharper router: uneven loads, so a wrong exchange would show.
  params["moe"]["gate"]["kernel"] = params["moe"]["gate"]["kernel"] * 50
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(0, CFG.vocab_size, (8, 6)), jnp.int32)
  mask = jnp.asarray(np.arange(6)[None] < rng.integers(2, 7, (8, 1)))
  routes = np.asarray(rng.integers(0, CFG.num_experts, (8, 6, 3, 2)), np.int32)
  routes[..., 1] = (routes[..., 0] + 1 + routes[..., 1] % 7) % 8  # two distinct experts
  routes[::2] = -1  # half the rows: no recorded route
  return params, ids, mask, jnp.asarray(routes)


def _loss(p, ids, mask, routes):
  logits, aux = qwen3_moe.forward(p, CFG, ids, attention_mask=mask, routes=routes, return_aux=True)
  lp = jax.nn.log_softmax(logits[:, :-1])
  nll = -jnp.take_along_axis(lp, ids[:, 1:, None], -1)[..., 0]
  m = mask[:, 1:]
  aux_loss, metrics = qwen3_moe.aux_losses(aux, CFG)
  return jnp.sum(nll * m) / m.sum() + aux_loss, (aux.routes, metrics["moe/load_cv"])


@functools.cache
def _reference(forced: bool):
  params, ids, mask, routes = _setup()
  fn = jax.jit(jax.value_and_grad(_loss, has_aux=True))
  return jax.device_get(fn(params, ids, mask, routes if forced else None))


@pytest.mark.parametrize(
  "sizes,forced",
  [
    ({"expert": 4, "fsdp": 2}, False),
    # ~1 min each on a loaded 2-core machine: the forced-routes and tensor-parallel variants
    pytest.param({"expert": 4, "fsdp": 2}, True, marks=pytest.mark.slow),
    pytest.param({"expert": 2, "fsdp": 2, "tensor": 2}, False, marks=pytest.mark.slow),
  ],
  ids=["ep4_fsdp2", "ep4_fsdp2_forced", "ep2_fsdp2_tp2"],
)
def test_expert_parallel_equals_one_device(sizes, forced):
  params, ids, mask, routes = _setup()
  (l0, (r0, cv0)), g0 = _reference(forced)
  mesh = make_mesh(sizes)
  shardings = qwen3.param_shardings(CFG, mesh)
  assert "expert" in str(shardings["moe"]["experts"]["down_proj"]["kernel"].spec)
  with use_mesh(mesh):
    ps = jax.device_put(params, shardings)
    fn = jax.jit(jax.value_and_grad(_loss, has_aux=True))
    args = (ps, ids, mask, routes if forced else None)
    assert "all_to_all" in fn.lower(*args).as_text()  # the token exchange
    (l1, (r1, cv1)), g1 = fn(*args)
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(r1), np.asarray(r0))
  np.testing.assert_allclose(np.asarray(cv1), np.asarray(cv0), rtol=1e-5)
  for path, a in jax.tree_util.tree_leaves_with_path(g0):
    b = functools.reduce(lambda t, k: t[k.key], path, g1)
    np.testing.assert_allclose(np.asarray(b), a, atol=1e-6, err_msg=jax.tree_util.keystr(path))
  if forced:
    used = np.asarray(r1)[1::2][:, :, [0, 2]]  # recorded rows, sparse layers
    np.testing.assert_array_equal(used, np.asarray(routes)[1::2][:, :, [0, 2]])


def test_expert_count_must_divide_the_expert_axis():
  params, ids, mask, _ = _setup()
  c = CFG.replace(num_experts=6)
  p = qwen3.init_params(c, jax.random.key(1))
  with use_mesh(make_mesh({"expert": 4, "fsdp": 2})), pytest.raises(ValueError, match="divisible"):
    qwen3_moe.forward(p, c, ids)

"""Mesh construction, the rules table, and sharded model == unsharded model (8 fake CPUs)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rstar_jax import sharding
from rstar_jax.models import qwen3


def test_mesh_fills_the_free_axis_and_uses_auto_axes():
  mesh = sharding.make_mesh({"fsdp": -1, "tensor": 2})
  assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


@pytest.mark.parametrize(
  "sizes,msg",
  [
    ({"data": -1, "fsdp": -1}, "at most one"),
    ({"data": 3}, "product 3 != 8"),
    ({"data": 3, "fsdp": -1}, "not divisible"),
    ({"data": 0}, ">= 1"),
  ],
)
def test_bad_mesh_config_is_named(sizes, msg):
  with pytest.raises(ValueError, match=msg):
    sharding.resolve_axis_sizes(sizes, 8)


def test_rules_map_drop_missing_and_indivisible_axes():
  mesh = sharding.make_mesh({"fsdp": 4, "tensor": 2})
  spec = sharding.logical_to_spec
  assert spec(("vocab", "embed"), sharding.TRAIN_RULES, mesh, (96, 32)) == P("tensor", "fsdp")
  # sampling drops FSDP on weights, keeps tensor parallelism
  assert spec(("vocab", "embed"), sharding.SAMPLING_RULES, mesh, (96, 32)) == P("tensor", None)
  # 30 rows do not split 4 ways -> replicated along that dim instead of an invalid spec
  assert spec(("embed", "mlp"), sharding.TRAIN_RULES, mesh, (30, 48)) == P(None, "tensor")
  # batch over (data, fsdp): data has size 1 here so only fsdp remains
  assert spec(("batch", "seq"), sharding.TRAIN_RULES, mesh, (8, 5)) == P("fsdp", None)
  data_mesh = sharding.make_mesh({"data": 8})
  assert spec(("vocab", "embed"), sharding.TRAIN_RULES, data_mesh, (96, 32)) == P(None, None)
  assert spec(("batch", "seq"), sharding.TRAIN_RULES, data_mesh, (8, 5)) == P("data", None)
  with pytest.raises(KeyError, match="nonexistent"):
    spec(("nonexistent",), sharding.TRAIN_RULES)
  with pytest.raises(ValueError, match="unknown sharding layout"):
    sharding.get_rules("inference")


def test_constrain_is_identity_without_mesh_and_a_constraint_with_one():
  x = jnp.ones((8, 3))
  assert sharding.constrain(x, ("batch", "act_embed")) is x
  f = lambda x: sharding.constrain(x, ("batch", "act_embed")) * 2
  assert "sharding_constraint" not in str(jax.make_jaxpr(f)(x))
  with sharding.use_mesh(sharding.make_mesh({"data": 8})):
    jaxpr = str(jax.make_jaxpr(f)(x))
  assert "sharding_constraint" in jaxpr and "data" in jaxpr


def _close(a, b):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("sizes", [{"fsdp": 4, "tensor": 2}, {"data": 8}])
def test_sharded_load_and_forward_equal_unsharded(hf_models, sizes):
  hf_dir, _ = hf_models("qwen3_gqa4_untied")
  config = qwen3.Qwen3Config.from_hf(hf_dir)
  ref_params = qwen3.load_hf_params(hf_dir, config)
  mesh = sharding.make_mesh(sizes)
  params = qwen3.load_hf_params(hf_dir, config, mesh=mesh)
  want = qwen3.param_shardings(config, mesh, "train")
  jax.tree.map(
    lambda a, s: a.sharding.is_equivalent_to(s, a.ndim) or pytest.fail(f"{a.sharding} != {s}"),
    params,
    want,
  )
  jax.tree.map(_close, params, ref_params)
  if "tensor" in sizes:  # weights really are split: each device holds 1/8 of the q kernel
    q = params["layers"]["self_attn"]["q_proj"]["kernel"]
    assert q.addressable_shards[0].data.size == q.size // 8
    assert params["embed_tokens"]["embedding"].sharding.spec == P("tensor", "fsdp")

  rng = np.random.default_rng(0)
  ids = rng.integers(0, config.vocab_size, (8, 10)).astype(np.int32)
  mask = (np.arange(10)[None] >= rng.integers(0, 4, (8, 1))).astype(np.int32)  # left pads
  ref = qwen3.forward(ref_params, config, jnp.asarray(ids), attention_mask=jnp.asarray(mask))
  batch_sh = NamedSharding(
    mesh, sharding.logical_to_spec(("batch", "seq"), sharding.TRAIN_RULES, mesh, ids.shape)
  )
  with sharding.use_mesh(mesh):
    f = jax.jit(
      lambda p, i, m: qwen3.forward(p, config, i, attention_mask=m),
      in_shardings=(want, batch_sh, batch_sh),
    )
    out = f(params, jax.device_put(ids, batch_sh), jax.device_put(mask, batch_sh))
  _close(out, ref)

  if "tensor" not in sizes:
    return

  # Training gradients agree too (the train layout's reason to exist).
  def loss(p, ids, mask):
    return (
      jax.nn.log_softmax(qwen3.forward(p, config, ids, attention_mask=mask)).max(-1) * mask
    ).sum()

  g_ref = jax.jit(jax.grad(loss))(ref_params, jnp.asarray(ids), jnp.asarray(mask))
  with sharding.use_mesh(mesh):
    g = jax.jit(jax.grad(loss), out_shardings=want)(
      params, jax.device_put(ids, batch_sh), jax.device_put(mask, batch_sh)
    )
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4), g, g_ref)


def test_sampling_layout_cached_decode_equals_unsharded(hf_models):
  hf_dir, _ = hf_models("qwen3_gqa4_untied")
  config = qwen3.Qwen3Config.from_hf(hf_dir)
  ref_params = qwen3.load_hf_params(hf_dir, config)
  mesh = sharding.make_mesh({"fsdp": 4, "tensor": 2})
  params = qwen3.load_hf_params(hf_dir, config, mesh=mesh, layout="sampling")
  assert params["embed_tokens"]["embedding"].sharding.spec == P("tensor", None)
  ids = np.random.default_rng(1).integers(0, config.vocab_size, (4, 6)).astype(np.int32)

  def run(p, cache):
    step = jax.jit(qwen3.forward_cached, static_argnames="config")
    l1, cache = step(p, config, jnp.asarray(ids), cache)
    l2, cache = step(p, config, jnp.asarray(ids[:, :1]), cache)
    return l1, l2

  ref = run(ref_params, qwen3.init_cache(config, 4, 8))
  cache_sh = qwen3.cache_shardings(config, mesh, 4, 8)
  assert cache_sh.k[0].spec == P("fsdp", "tensor", None, None)
  assert cache_sh.v[0].spec == P("fsdp", "tensor", None, None)
  with sharding.use_mesh(mesh), sharding.activation_layout("sampling"):
    out = run(params, jax.device_put(qwen3.init_cache(config, 4, 8), cache_sh))
  jax.tree.map(_close, out, ref)

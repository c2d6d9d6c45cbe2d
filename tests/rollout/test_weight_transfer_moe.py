"""SGLang weight push of a Qwen3-MoE policy (issue 39 item 4) through the stand-in server: the
tensor names are the ones SGLang's ``Qwen3MoeForCausalLM.load_weights`` maps (per-expert HF
names; its loader skips a name it does not know without a word, so a wrong name would be a
silently stale expert), the bytes are the learner's, and a delta push sends exactly the
(layer, expert) tensors that changed."""

import asyncio
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.models import qwen3
from rstar_jax.models import qwen3_hf_layout as layout
from rstar_jax.models.qwen3_config import Qwen3MoeConfig
from rstar_jax.rollout.sglang_engine import SGLangEngine
from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer
from rstar_jax.rollout.weight_transfer import source

E = 4

# What SGLang's qwen3_moe loader accepts (python/sglang/srt/models/qwen3_moe.py): experts through
# FusedMoE.make_expert_params_mapping("gate_proj", "down_proj", "up_proj") = the names
# "experts.{e}.{proj}." with e < num_experts; the router as "mlp.gate.weight"; every other
# tensor under its HF name (q/k/v and a dense layer's gate/up fused at load time).
_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")
_ROUTER = re.compile(r"model\.layers\.(\d+)\.mlp\.gate\.weight")
_DENSE_MLP = re.compile(r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight")


def _moe_model(dtype=jnp.bfloat16, seed=0):
  cfg = Qwen3MoeConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    max_position_embeddings=128,
    num_experts=E,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    mlp_only_layers=(1,),  # layer 1 keeps a dense MLP: both kinds of names
  )
  return cfg, qwen3.init_params(cfg, jax.random.PRNGKey(seed), dtype=dtype)


def _expected(cfg, params):
  host = jax.tree.map(np.asarray, params)
  return {
    t.name: np.ascontiguousarray(layout.to_hf(layout.get_leaf(host, t.path), t))
    for t in layout.hf_table(cfg)
  }


def _assert_same_bytes(got: dict, want: dict):
  assert set(got) == set(want), sorted(set(got) ^ set(want))[:5]
  for k, v in want.items():
    assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
    assert got[k].tobytes() == v.tobytes(), k


def test_moe_names_are_the_ones_sglang_loads():
  cfg, params = _moe_model()
  want = _expected(cfg, params)
  experts = [m.groups() for n in want if (m := _EXPERT.fullmatch(n))]
  assert sorted({(int(i), int(e)) for i, e, _ in experts}) == [
    (i, e) for i in (0, 2) for e in range(E)
  ]
  assert len(experts) == 2 * E * 3
  assert {int(m.group(1)) for n in want if (m := _ROUTER.fullmatch(n))} == {0, 2}
  assert {int(m.group(1)) for n in want if (m := _DENSE_MLP.fullmatch(n))} == {1}
  # HF layout: gate/up [F, D], down [D, F], router [E, D] (nn.Linear's [out, in]).
  assert want["model.layers.2.mlp.experts.3.gate_proj.weight"].shape == (16, 32)
  assert want["model.layers.2.mlp.experts.3.down_proj.weight"].shape == (32, 16)
  assert want["model.layers.0.mlp.gate.weight"].shape == (E, 32)
  np.testing.assert_array_equal(
    want["model.layers.2.mlp.experts.3.up_proj.weight"],
    np.asarray(params["moe"]["experts"]["up_proj"]["kernel"][1, 3]).T,
  )


@pytest.mark.parametrize("transport", ("disk", "tensor", "distributed"))
def test_moe_push_and_delta_through_the_stand_in(transport, tmp_path):
  cfg, p1 = _moe_model()
  p2 = jax.tree.map(jnp.copy, p1)
  ex = p2["moe"]["experts"]["down_proj"]["kernel"]
  p2["moe"]["experts"]["down_proj"]["kernel"] = ex.at[1, 2, 0, 0].add(1.0)  # layer 2, expert 2
  g = p2["moe"]["gate"]["kernel"]
  p2["moe"]["gate"]["kernel"] = g.at[0, 0, 0].add(1.0)  # layer 0's router
  n_total = len(layout.hf_table(cfg))
  opts = {} if transport == "disk" else {"bucket_bytes": 4096, "timeout_s": 20}

  async def main():
    server = await MockSGLangServer(vocab_size=64).start()
    try:
      async with SGLangEngine(
        [server.url],
        str(tmp_path),
        weight_transport=transport,
        weight_delta=True,
        transport_options=opts,
      ) as eng:
        m1 = await eng.update_weights(cfg, p1, 1)
        first = dict(server.weights)
        m2 = await eng.update_weights(cfg, p2, 2)
        return m1, m2, first, dict(server.weights), server.weight_version
    finally:
      await server.close()

  m1, m2, first, got, version = asyncio.run(main())
  _assert_same_bytes(first, _expected(cfg, p1))
  assert m1["push/delta_fraction"] == 1.0
  assert m2["push/delta_fraction"] == pytest.approx(2 / n_total)
  assert m2["push/bytes"] == (32 * 16 + E * 32) * 2  # one expert's down_proj + one router
  assert version == "2"
  _assert_same_bytes(got, _expected(cfg, p2))


def test_changed_tensors_flags_each_layer_and_expert():
  cfg, p1 = _moe_model(jnp.float32)
  table = layout.hf_table(cfg)
  p2 = jax.tree.map(jnp.copy, p1)
  k = p2["moe"]["experts"]["gate_proj"]["kernel"]
  p2["moe"]["experts"]["gate_proj"]["kernel"] = k.at[0, 3].add(1.0).at[1, 0, 5, 5].add(1.0)
  d = p2["dense_mlp"]["up_proj"]["kernel"]
  p2["dense_mlp"]["up_proj"]["kernel"] = d.at[0, 1, 1].add(1.0)
  names = {t.name for t in source.changed_tensors(p2, p1, table)}
  assert names == {
    "model.layers.0.mlp.experts.3.gate_proj.weight",
    "model.layers.2.mlp.experts.0.gate_proj.weight",
    "model.layers.1.mlp.up_proj.weight",
  }
  assert source.changed_tensors(p1, p1, table) == []


@pytest.mark.parametrize("lead", [0, 1, 2])
def test_device_and_host_change_flags_agree(lead):
  # The device compare (used off CPU) and the host compare give the same per-tensor flags.
  a = jnp.zeros((2, 3, 4, 5), jnp.bfloat16)
  b = a.at[1, 2, 0, 0].set(1.0)
  dev = np.asarray(source._changed_rows(a, b, lead))
  host = source._changed_rows_host(np.asarray(a), np.asarray(b), lead)
  assert dev.shape == host.shape == a.shape[:lead]
  np.testing.assert_array_equal(dev, host)
  assert dev.sum() == 1

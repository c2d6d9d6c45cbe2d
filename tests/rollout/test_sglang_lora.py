"""LoRA weight pushes to SGLang (the stand-in server): merged weights through the transports with
the delta option sending only the adapted tensors, and adapters through SGLang's
/load_lora_adapter + /unload_lora_adapter with requests naming the adapter in ``lora_path``."""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.models import lora, qwen3
from rstar_jax.models import qwen3_hf_layout as layout
from rstar_jax.rollout.sglang_engine import SGLangEngine, SGLangError
from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer
from rstar_jax.rollout.types import GenerateRequest, SamplingParams

MC = qwen3.Qwen3Config(
  vocab_size=64,
  hidden_size=32,
  intermediate_size=48,
  num_hidden_layers=2,
  num_attention_heads=2,
  num_key_value_heads=1,
  head_dim=16,
)
CFG = lora.LoraConfig(rank=2, alpha=4.0, targets=("q_proj", "v_proj", "down_proj"), base="b")


def _policy(seed=0):
  base = qwen3.init_params(MC, jax.random.key(0))
  p = lora.make_params(base, MC, CFG, jax.random.key(1))
  # A trained policy: both factors nonzero (b = 0 at init would make merged == base).
  leaves, tdef = jax.tree.flatten(p.lora)
  keys = jax.random.split(jax.random.key(100 + seed), len(leaves))
  return p.replace(
    lora=jax.tree.unflatten(
      tdef, [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    )
  )


def _hf(params):
  host = jax.tree.map(np.asarray, params)
  return {
    t.name: np.ascontiguousarray(layout.to_hf(layout.get_leaf(host, t.path), t))
    for t in layout.hf_table(MC)
  }


def _adapted_names():
  return {
    f"model.layers.{i}.{lora.TARGET_GROUPS[n]}.{n}.weight"
    for i in range(MC.num_hidden_layers)
    for n in CFG.targets
  }


@pytest.mark.parametrize("transport", ["disk", "tensor"])
def test_merged_push_with_delta_sends_only_the_adapted_tensors(transport, tmp_path):
  p1, p2 = _policy(0), _policy(1)

  async def run():
    async with MockSGLangServer(vocab_size=64) as srv:
      opts = {"bucket_bytes": 4096} if transport == "tensor" else {}
      eng = SGLangEngine(
        [srv.url],
        staging_dir=str(tmp_path / "stage"),
        weight_transport=transport,
        weight_delta=True,
        transport_options=opts,
      )
      async with eng:
        await eng.update_weights(MC, lora.merged(p1), 1)
        first = eng.last_push
        srv.weights.clear()  # what the second push sends, alone
        await eng.update_weights(MC, lora.merged(p2), 2)
        sent = set(srv.weights)
        srv_weights = dict(srv.weights)
      return first, eng.last_push, sent, srv_weights

  first, second, sent, got = asyncio.run(run())
  assert first.tensors_sent == first.tensors_total
  assert sent == _adapted_names()  # embeddings, norms, other kernels unchanged: not resent
  assert second.tensors_sent == len(_adapted_names()) < second.tensors_total
  want = _hf(lora.merge(p2))
  for k in sent:
    assert got[k].tobytes() == want[k].tobytes(), k


def test_adapter_push_loads_peft_adapters_and_requests_name_them(tmp_path):
  policies = [_policy(i) for i in range(3)]
  sp = SamplingParams(max_new_tokens=3, temperature=0.0)

  async def run():
    async with MockSGLangServer(vocab_size=64) as a, MockSGLangServer(vocab_size=64) as b:
      eng = SGLangEngine([a.url, b.url], staging_dir=str(tmp_path / "stage"), keep_versions=2)
      seen = []
      async with eng:
        for v, p in enumerate(policies, start=1):
          held, a.weights = a.weights, {}
          metrics = await eng.update_weights(MC, p, v)
          sent, a.weights = set(a.weights), {**held, **a.weights}
          await eng.generate([GenerateRequest([1, 2, 3], sp, rid=f"t{v}:0")])
          seen.append(
            {
              "stats": eng.last_push,
              "metrics": metrics,
              "base_sent": sent,
              "loras": (sorted(a.loras), sorted(b.loras)),
              "lora_path": (a.requests + b.requests)[-1].get("lora_path"),
              "version": (a.weight_version, b.weight_version),
            }
          )
          if v == 1:
            base_weights = dict(a.weights)
        effective = a.effective_weights("rstar_jax_v3")
        calls = list(a.lora_calls)
      return seen, base_weights, effective, calls

  seen, base_weights, effective, calls = asyncio.run(run())
  n_adapter = 2 * MC.num_hidden_layers * len(CFG.targets)
  # First push: the frozen base through the transport, byte for byte; later pushes: no base.
  assert seen[0]["base_sent"] == set(_hf(policies[0].base))
  want_base = _hf(policies[0].base)
  for k, v in want_base.items():
    assert base_weights[k].tobytes() == v.tobytes(), k
  assert [s["base_sent"] for s in seen[1:]] == [set(), set()]
  assert seen[1]["stats"].tensors_sent == n_adapter
  assert seen[1]["stats"].tensors_total == len(want_base) + n_adapter
  assert seen[1]["metrics"]["push/bytes"] > 0
  # Adapters: one per version, the last keep_versions stay loaded, on every server.
  assert [s["loras"] for s in seen] == [
    (["rstar_jax_v1"], ["rstar_jax_v1"]),
    (["rstar_jax_v1", "rstar_jax_v2"], ["rstar_jax_v1", "rstar_jax_v2"]),
    (["rstar_jax_v2", "rstar_jax_v3"], ["rstar_jax_v2", "rstar_jax_v3"]),
  ]
  assert [s["lora_path"] for s in seen] == ["rstar_jax_v1", "rstar_jax_v2", "rstar_jax_v3"]
  assert [s["version"] for s in seen] == [("1", "1"), ("2", "2"), ("3", "3")]
  assert ("unload", {"lora_name": "rstar_jax_v1"}) in calls
  load = next(body for kind, body in calls if kind == "load")
  assert set(load) == {"lora_name", "lora_path", "pinned"}  # SGLang's LoadLoRAAdapterReqInput
  # What the server computes with the newest adapter is the learner's merged policy.
  merged = _hf(lora.merge(policies[2]))
  for k in _adapted_names():
    np.testing.assert_allclose(effective[k], merged[k], rtol=1e-5, atol=1e-6)
  assert float(np.abs(effective[k] - want_base[k]).max()) > 1e-3


def test_adapter_push_failure_keeps_previous_adapter_and_version(tmp_path):
  p1, p2 = _policy(0), _policy(1)
  sp = SamplingParams(max_new_tokens=2, temperature=0.0)

  async def run():
    async with MockSGLangServer(vocab_size=64) as a, MockSGLangServer(vocab_size=64) as b:
      eng = SGLangEngine([a.url, b.url], staging_dir=str(tmp_path / "s"), max_retries=0)
      async with eng:
        await eng.update_weights(MC, p1, 1)
        b.fail_next("/load_lora_adapter", status=400)
        with pytest.raises(SGLangError, match=r"load_lora_adapter\(rstar_jax_v2"):
          await eng.update_weights(MC, p2, 2)
        await eng.generate([GenerateRequest([1, 2], sp)])
        return (
          eng.weight_version,
          sorted(a.loras),
          sorted(b.loras),
          a.requests[-1:] + b.requests[-1:],
        )

  version, la, lb, reqs = asyncio.run(run())
  assert version == 1
  assert la == lb == ["rstar_jax_v1"]  # the half-loaded v2 was unloaded again
  assert [r["lora_path"] for r in reqs] == ["rstar_jax_v1"]


def test_stand_in_refuses_unknown_adapter_names(tmp_path):
  async def run():
    async with MockSGLangServer(vocab_size=64) as srv:
      eng = SGLangEngine([srv.url], staging_dir=str(tmp_path / "s"), max_retries=0)
      async with eng:
        eng._lora_names.append("never_loaded")
        with pytest.raises(SGLangError, match="never_loaded' is not loaded"):
          await eng.generate([GenerateRequest([1], SamplingParams(max_new_tokens=1))])
        with pytest.raises(SGLangError, match="HTTP 400"):
          await eng._unload_adapters(["never_loaded"])

  asyncio.run(run())


def test_learner_params_copy_follows_lora_push():
  from rstar_jax.config import schema
  from rstar_jax.pipelines import wiring

  def run_cfg(push):
    return schema.RunConfig(
      model=schema.ModelConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        lora_rank=2,
      ),
      rollout=schema.RolloutConfig(lora_push=push),
    )

  merged = wiring.build_learner(run_cfg("merged")).params_copy()
  adapters = wiring.build_learner(run_cfg("adapters")).params_copy()
  assert not lora.is_lora(merged) and lora.is_lora(adapters)
  for x, y in zip(jax.tree.leaves(merged), jax.tree.leaves(lora.merge(adapters))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert jnp.dtype(adapters.lora["layers"]["mlp"]["down_proj"]["a"].dtype) == jnp.float32

"""LoRA (rstar_jax/models/lora.py; the training side in rstar_jax/learner/lora_training.py, the
PEFT export in rstar_jax/models/peft_export.py): merge / unmerge, the learner step against the
chain rule through the merged model, rank of the learned update, adapter-only optimizer state,
checkpoints, the merged weights the sampler decodes with, and the PEFT export."""

import asyncio
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rstar_jax.learner import lora_training, optim, steps
from rstar_jax.learner.checkpoint import Checkpointer, CheckpointMismatchError
from rstar_jax.learner.train_state import TrainState
from rstar_jax.models import lora, peft_export, qwen3

MC = qwen3.Qwen3Config(
  vocab_size=64,
  hidden_size=32,
  intermediate_size=48,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=8,
)
CFG = lora.LoraConfig(rank=2, alpha=6.0, base="tiny")


def _params(cfg=CFG, nonzero_b=True, seed=0):
  base = qwen3.init_params(MC, jax.random.key(seed))
  p = lora.make_params(base, MC, cfg, jax.random.key(seed + 1))
  if nonzero_b:  # B = 0 at init hides half of the branch; make both factors matter
    leaves, tdef = jax.tree.flatten(p.lora)
    keys = jax.random.split(jax.random.key(seed + 2), len(leaves))
    leaves = [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    p = p.replace(lora=jax.tree.unflatten(tdef, leaves))
  return p


def _batch(seed=3, n=4, t=12):
  ids = jax.random.randint(jax.random.key(seed), (n, t), 0, MC.vocab_size)
  mask = jnp.ones((n, t), jnp.int32).at[0, -3:].set(0)
  return {"input_ids": ids, "attention_mask": mask, "loss_mask": mask.astype(jnp.float32)}


def _fwd(params, ids):
  return qwen3.forward(params, MC, ids)


def test_merge_unmerge_exact_in_float32_and_branch_equals_merged_forward():
  p = _params()
  merged = lora.merge(p)
  back = lora.unmerge(merged, p.lora, CFG)
  for grp, name in CFG_TARGETS(p):
    w = np.asarray(p.base["layers"][grp][name]["kernel"])
    ab = p.lora["layers"][grp][name]
    d = np.asarray(lora.delta(ab["a"], ab["b"], CFG.scale))
    r = np.asarray(back["layers"][grp][name]["kernel"])
    # f32 cannot hold W + D exactly; (W + D) - D rounds twice, so W comes back within one ulp
    # of |W| + |D| (a wrong sign or scale would be off by |D|, thousands of ulps).
    assert np.all(np.abs(r - w) <= np.spacing(np.abs(w) + np.abs(d))), (grp, name)
    assert np.abs(d).max() > 1e3 * np.spacing(np.abs(w) + np.abs(d)).max()
  for path, x in jax.tree_util.tree_leaves_with_path(back):
    keys = [k.key for k in path]
    if keys[-1] != "kernel" or keys[-2] not in CFG.targets:  # not adapted: the same array
      orig = p.base
      for k in keys:
        orig = orig[k]
      assert x is orig, keys
  # Non-target leaves are untouched, targets moved.
  assert merged["norm"]["scale"] is p.base["norm"]["scale"]
  dq = (
    merged["layers"]["self_attn"]["q_proj"]["kernel"]
    - p.base["layers"]["self_attn"]["q_proj"]["kernel"]
  )
  assert float(jnp.abs(dq).max()) > 1e-3
  ids = _batch()["input_ids"]
  unmerged_logits = lora_training.apply_fn_for(MC)(p, ids, jnp.ones_like(ids))
  np.testing.assert_allclose(unmerged_logits, _fwd(merged, ids), atol=2e-5, rtol=1e-5)


def test_lora_step_equals_full_step_on_merged_model_with_base_gradient_masked():
  """One LoRA step == the chain rule through a full-model gradient at the merged weights
  (dA = s G B^T, dB = s A^T G), the base's own gradient dropped, fed to the same AdamW."""
  p = _params()
  batch = _batch()
  oc = optim.OptimConfig(lr=1e-2, warmup_steps=0, grad_clip=0.05)
  inner = optim.make_optimizer(oc)
  tx = lora_training.optimizer(inner, p)
  state = TrainState.create(p, tx, 0)
  sc = steps.StepConfig(optim=oc)
  new, metrics = jax.jit(
    lambda s, b: steps.sft_step(s, b, apply_fn=lora_training.apply_fn_for(MC), config=sc)
  )(state, batch)

  # Reference: the full model's gradient at the merged weights.
  merged = lora.merge(p)
  plain_apply = lambda prm, ids, m, **kw: qwen3.forward(prm, MC, ids, attention_mask=m)  # noqa: E731
  full_state = TrainState.create(merged, optax.sgd(0.0), 0)
  g_full, ref_metrics = None, None

  def loss(prm):
    mask = steps._target_mask(batch["loss_mask"])
    norm = steps._normaliser(mask, "token-mean")
    return steps._sft_micro_loss(plain_apply, prm, batch, norm, sc)

  g_full, sums = jax.grad(loss, has_aux=True)(full_state.params)
  ref_metrics = steps.losses.reduce_metrics(sums)
  s = CFG.scale
  g_lora = {"layers": {}}
  for grp, ad in p.lora["layers"].items():
    for name, ab in ad.items():
      G = g_full["layers"][grp][name]["kernel"]  # [L, in, out]
      g_lora["layers"].setdefault(grp, {})[name] = {
        "a": s * jnp.einsum("lio,lro->lir", G, ab["b"], precision="highest"),
        "b": s * jnp.einsum("lir,lio->lro", ab["a"], G, precision="highest"),
      }
  upd, _ = inner.update(g_lora, inner.init(p.lora), p.lora)
  want = optax.apply_updates(p.lora, upd)

  np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=1e-6)
  np.testing.assert_allclose(metrics["grad_norm"], optax.global_norm(g_lora), rtol=1e-4)
  assert float(metrics["grad_norm"]) > 0.05  # the clip is active: it must match too
  for got, exp in zip(jax.tree.leaves(new.params.lora), jax.tree.leaves(want)):
    np.testing.assert_allclose(got, exp, atol=1e-6, rtol=1e-5)
  for got, exp in zip(jax.tree.leaves(new.params.base), jax.tree.leaves(p.base)):
    np.testing.assert_array_equal(got, exp)  # base frozen, bit for bit


def test_rank_r_updates_stay_rank_r_and_optimizer_holds_adapters_only():
  p0 = _params(nonzero_b=False)
  base0 = jax.tree.map(np.asarray, p0.base)
  tx = lora_training.optimizer(optim.make_optimizer(optim.OptimConfig(lr=3e-2, warmup_steps=0)), p0)
  state = TrainState.create(p0, tx, 0)
  moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
  assert sum(x.size for x in moments) == 2 * lora.adapter_param_count(MC, CFG)
  step = jax.jit(lambda s, b: steps.sft_step(s, b, apply_fn=lora_training.apply_fn_for(MC)))
  for i in range(3):
    state, m = step(state, _batch(seed=10 + i))
  merged = jax.tree.map(np.asarray, lora.merge(state.params))
  for grp, ad in CFG_TARGETS(state.params):
    d = merged["layers"][grp][ad]["kernel"] - base0["layers"][grp][ad]["kernel"]
    for layer in d:
      sv = np.linalg.svd(layer, compute_uv=False)
      assert sv[0] > 1e-3, (grp, ad)  # it learned something
      assert np.all(sv[CFG.rank :] <= 1e-5 * sv[0]), (grp, ad, sv[: CFG.rank + 2])
  for got, exp in zip(jax.tree.leaves(state.params.base), jax.tree.leaves(base0)):
    np.testing.assert_array_equal(got, exp)


def CFG_TARGETS(params):
  return [(g, n) for g, ad in params.lora["layers"].items() for n in ad]


def test_checkpoint_holds_adapters_and_base_pointer(tmp_path):
  p = _params()
  tx = lora_training.optimizer(optim.make_optimizer(optim.OptimConfig(warmup_steps=0)), p)
  state = TrainState.create(p, tx, 7)
  with Checkpointer(tmp_path / "ck", enable_async=False) as ck:
    ck.save(state, {"x": 1}, force=True)
  import orbax.checkpoint as ocp

  saved = ocp.StandardCheckpointer().metadata(tmp_path / "ck" / "0" / "state")
  tree = getattr(saved, "item_metadata", saved)
  tree = getattr(tree, "tree", tree)
  saved_params = tree["params"]
  assert set(saved_params) == {"lora"}  # no base arrays on disk
  fresh = TrainState.create(_params(seed=5), tx, 0)
  fresh = fresh.replace(params=fresh.params.replace(base=p.base))
  with Checkpointer(tmp_path / "ck") as ck:
    restored, meta = ck.restore(fresh)
  assert meta["lora"]["base"] == "tiny" and meta["lora"]["rank"] == CFG.rank
  for got, exp in zip(jax.tree.leaves(restored.params.lora), jax.tree.leaves(p.lora)):
    np.testing.assert_array_equal(got, exp)
  other = _params(cfg=dataclasses.replace(CFG, base="another-base"))
  tx2 = lora_training.optimizer(optim.make_optimizer(optim.OptimConfig(warmup_steps=0)), other)
  with Checkpointer(tmp_path / "ck") as ck:
    with pytest.raises(CheckpointMismatchError, match="base is 'tiny'"):
      ck.restore(TrainState.create(other, tx2, 0))


def test_merged_copy_is_fresh_and_compiles_once_per_config():
  p, q = _params(seed=0), _params(seed=3)
  a = lora.merged_copy(p)
  n = lora._merge_copy_jit._cache_size()
  b = lora.merged_copy(q)  # new values, same config and shapes: no recompile
  assert lora._merge_copy_jit._cache_size() == n
  for x, y in zip(jax.tree.leaves(b), jax.tree.leaves(lora.merge(q))):  # (jit vs eager: last bit)
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-8)
  # Fresh buffers: deleting the source (a donating step) leaves the copy intact.
  norm = p.base["norm"]["scale"]
  norm.delete()
  assert not a["norm"]["scale"].is_deleted()


def test_sampler_decodes_with_the_merged_weights():
  from rstar_jax.rollout.jax_sampler import JaxSampler
  from rstar_jax.rollout.types import GenerateRequest, SamplingParams

  p = _params()
  sp = SamplingParams(temperature=0.0, max_new_tokens=6)
  reqs = [GenerateRequest(input_ids=[1, 2, 3, 4], sampling=sp)]

  async def run(params_for_update):
    s = JaxSampler(MC, qwen3.init_params(MC, jax.random.key(9)), max_batch=2, max_len=32)
    await s.update_weights(MC, params_for_update, 1)
    return [r.output_ids for r in await s.generate(reqs)]

  got = asyncio.run(run(p))
  want = asyncio.run(run(lora.merge(p)))
  base_only = asyncio.run(run(p.base))
  assert got == want
  assert got != base_only  # the adapters change what is decoded


def test_config_errors_are_one_line():
  from rstar_jax.config import ConfigError, schema

  with pytest.raises(ConfigError, match=r"config.model.lora_targets: expected names"):
    schema.ModelConfig(lora_rank=4, lora_targets=("q_proj", "qkv"))
  with pytest.raises(ValueError, match="LoraConfig.rank: expected an int >= 1"):
    lora.LoraConfig(rank=0)
  assert schema.ModelConfig().lora_config() is None
  c = schema.ModelConfig(lora_rank=4, lora_dropout=0.1).lora_config(base="b")
  assert (c.rank, c.dropout, c.base) == (4, 0.1, "b")


def test_dropout_masks_the_branch_and_is_a_function_of_the_batch():
  p = _params(cfg=dataclasses.replace(CFG, dropout=0.5))
  ids = _batch()["input_ids"]
  fn = jax.jit(lora_training.apply_fn_for(MC))
  a, b = fn(p, ids, jnp.ones_like(ids)), fn(p, ids, jnp.ones_like(ids))
  np.testing.assert_array_equal(a, b)  # same batch, same mask
  no_drop = lora_training.apply_fn_for(MC)(p.replace(config=CFG), ids, jnp.ones_like(ids))
  assert float(jnp.abs(a - no_drop).max()) > 1e-4


@pytest.mark.slow
def test_peft_loads_the_adapters_export(tmp_path):
  """export --adapters_only: `peft.PeftModel` on the base HF model gives our merged logits."""
  peft = pytest.importorskip("peft")
  import torch
  import transformers

  p = _params()
  qwen3.save_hf(str(tmp_path / "base"), MC, p.base)
  peft_export.save_peft(str(tmp_path / "adapters"), p, base_model=str(tmp_path / "base"))
  model = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "base").eval()
  model = peft.PeftModel.from_pretrained(model, tmp_path / "adapters").eval()
  ids = np.asarray(_batch()["input_ids"])
  with torch.no_grad():
    theirs = model(torch.tensor(ids)).logits.numpy()
  ours = np.asarray(_fwd(lora.merge(p), jnp.asarray(ids)))
  np.testing.assert_allclose(theirs, ours, atol=2e-4, rtol=1e-4)
  base_logits = np.asarray(_fwd(p.base, jnp.asarray(ids)))
  assert np.abs(theirs - base_logits).max() > 1e-3  # the adapters were applied


def test_bf16_base_stays_frozen_while_float32_adapters_train():
  base = qwen3.init_params(MC, jax.random.key(0), dtype=jnp.bfloat16)
  p = lora.make_params(base, MC, CFG, jax.random.key(1))
  tx = lora_training.optimizer(optim.make_optimizer(optim.OptimConfig(lr=1e-2, warmup_steps=0)), p)
  state = TrainState.create(p, tx, 0)
  step = jax.jit(lambda s, b: steps.sft_step(s, b, apply_fn=lora_training.apply_fn_for(MC)))
  for i in range(2):
    state, _ = step(state, _batch(seed=20 + i))
  for got, exp in zip(jax.tree.leaves(state.params.base), jax.tree.leaves(base)):
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got), np.asarray(exp))
  assert {x.dtype for x in jax.tree.leaves(state.params.lora)} == {jnp.dtype(jnp.float32)}
  assert {x.dtype for x in jax.tree.leaves(state.opt_state) if x.ndim} == {jnp.dtype(jnp.float32)}
  assert float(jnp.abs(state.params.lora["layers"]["mlp"]["up_proj"]["b"]).max()) > 0
  merged = lora.merge(state.params)
  assert merged["layers"]["mlp"]["up_proj"]["kernel"].dtype == jnp.bfloat16  # served like the base


def _lora_run(tmp_path):
  """A LoRA RunConfig over a saved HF base (with a tokenizer) and a checkpoint of trained
  adapters; returns (run, params)."""
  from rstar_jax.config import schema
  from rstar_jax.pipelines import wiring
  from rstar_jax.tokenization.bpe import train_bpe_tokenizer

  base_dir = str(tmp_path / "base")
  qwen3.save_hf(base_dir, MC, qwen3.init_params(MC, jax.random.key(0)))
  # (export copies the tokenizer as it is; its size need not match this toy model)
  train_bpe_tokenizer(["12 + 34 = 46", "the answer is 7"] * 20, 300, out_dir=base_dir)
  run = schema.RunConfig(model=schema.ModelConfig(hf_dir=base_dir, lora_rank=2, lora_alpha=6.0))
  learner = wiring.build_learner(run)
  trained = _params(cfg=learner.state.params.config).lora
  learner.state = learner.state.replace(params=learner.state.params.replace(lora=trained))
  with Checkpointer(tmp_path / "ck", enable_async=False) as ck:
    ck.save(learner.state, {}, force=True)
  return run, learner.state.params


def test_export_writes_merged_model_or_peft_adapters(tmp_path):
  from rstar_jax.pipelines import hf_export

  run, params = _lora_run(tmp_path)
  assert params.config.base == str(tmp_path / "base")
  hf_export.export_checkpoint(run, str(tmp_path / "ck"), str(tmp_path / "merged"))
  got = qwen3.load_hf_params(str(tmp_path / "merged"), MC)
  # (the export's merge runs sharded: the f32 sum may round differently in the last bit)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(lora.merge(params))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
  w = np.asarray(got["layers"]["mlp"]["down_proj"]["kernel"])
  assert np.abs(w - np.asarray(params.base["layers"]["mlp"]["down_proj"]["kernel"])).max() > 1e-3
  assert (tmp_path / "merged" / "tokenizer.json").exists()

  hf_export.export_checkpoint(run, str(tmp_path / "ck"), str(tmp_path / "ad"), adapters_only=True)
  import json

  from safetensors.numpy import load_file

  cfg = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
  assert (cfg["peft_type"], cfg["r"], cfg["lora_alpha"]) == ("LORA", 2, 6.0)
  assert cfg["base_model_name_or_path"] == str(tmp_path / "base")
  tensors = load_file(str(tmp_path / "ad" / "adapter_model.safetensors"))
  want = peft_export.peft_tensors(params)
  assert set(tensors) == set(want) and len(want) == 2 * 2 * 7
  for k, v in want.items():
    np.testing.assert_array_equal(tensors[k], v)

  full = dataclasses.replace(run, model=dataclasses.replace(run.model, lora_rank=0))
  with pytest.raises(ValueError, match="no adapters"):
    hf_export.export_checkpoint(full, str(tmp_path / "ck"), str(tmp_path / "x"), adapters_only=True)
  with pytest.raises(CheckpointMismatchError, match="holds LoRA adapters"):
    hf_export.export_checkpoint(full, str(tmp_path / "ck"), str(tmp_path / "x"))

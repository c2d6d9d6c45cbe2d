"""LoRA on a Qwen3-MoE policy (issue 39 item 4): adapters on the attention projections train
through the learner's MoE forward (the unmerged branch equals the merged model, the base and
every expert stay frozen, the router's aux loss is still reported), and asking for adapters on
the experts / MLPs is one clear error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.errors import UserError
from rstar_jax.learner import optim
from rstar_jax.learner.train_state import TrainState
from rstar_jax.models import lora, qwen3, qwen3_moe
from rstar_jax.sharding import make_mesh

MC = qwen3_moe.Qwen3MoeConfig(
  vocab_size=64,
  hidden_size=32,
  intermediate_size=48,
  moe_intermediate_size=16,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=8,
  num_experts=4,
  num_experts_per_tok=2,
  mlp_only_layers=(1,),
  moe_implementation="dense",  # the reference form: fastest to compile, same routing
)
ATTN = lora.LoraConfig(rank=2, alpha=4.0, targets=lora.ATTENTION_TARGETS, base="tiny-moe")


def _batch(n=2, t=8):
  ids = jax.random.randint(jax.random.key(3), (n, t), 0, MC.vocab_size)
  mask = jnp.ones((n, t), jnp.int32).at[0, -2:].set(0)
  return {"input_ids": ids, "attention_mask": mask, "loss_mask": mask.astype(jnp.float32)}


@pytest.mark.parametrize("targets", [("q_proj", "gate_proj"), ("up_proj",), lora.ALL_TARGETS])
def test_adapters_on_experts_are_one_clear_error(targets):
  cfg = lora.LoraConfig(rank=2, targets=targets)
  for fn in (
    lambda: lora.adapter_shapes(MC, cfg),
    lambda: lora.make_jitted_steps(MC, cfg, None, tx=optim.make_optimizer(optim.OptimConfig())),
  ):
    with pytest.raises(UserError) as e:
      fn()
    msg = str(e.value)
    assert "\n" not in msg and "model.lora_targets" in msg and "Qwen3-MoE" in msg
    assert "lora_targets=q_proj,k_proj,v_proj,o_proj" in msg
  # A dense model takes the same targets.
  dense = qwen3.Qwen3Config(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
  )
  assert set(lora.adapter_shapes(dense, cfg)["layers"]) >= {"mlp"}


@pytest.mark.slow  # ~2 min on the loaded 2-core machine (compiles log-probs + the SFT step)
def test_attention_adapters_train_on_a_moe_model():
  base = qwen3.init_params(MC, jax.random.key(0))
  p = lora.make_params(base, MC, ATTN, jax.random.key(1))
  assert set(p.lora["layers"]) == {"self_attn"}
  # b != 0 so the branch matters in the forward below.
  p = p.replace(lora=jax.tree.map(lambda x: x + 0.05, p.lora))
  batch = _batch()
  oc = optim.OptimConfig(lr=1e-2, warmup_steps=0)
  tx = lora.optimizer(optim.make_optimizer(oc), p)
  js = lora.make_jitted_steps(MC, ATTN, make_mesh({"fsdp": 1}, jax.devices()[:1]), tx=tx)
  # The unmerged forward the learner runs == the merged model through qwen3_moe.forward.
  logp = np.asarray(js.compute_logprobs(p, js.shard_batch(batch)))
  logits = qwen3_moe.forward(lora.merge(p), MC, batch["input_ids"])
  want = jnp.take_along_axis(
    jax.nn.log_softmax(logits[:, :-1]), batch["input_ids"][:, 1:, None], -1
  )[..., 0]
  m = np.asarray(batch["attention_mask"][:, 1:])
  np.testing.assert_allclose(logp[:, 1:] * m, np.asarray(want) * m, atol=2e-5)

  before = jax.device_get((p.base, p.lora))  # the step donates its state
  state = js.shard_state(TrainState.create(jax.tree.map(jnp.copy, p), tx, 0))
  new, metrics = js.sft_step(state, js.shard_batch(batch))
  assert np.isfinite(float(metrics["loss"])) and float(metrics["moe/load_balancing_loss"]) > 0
  moved = [
    float(jnp.abs(a - b).max())
    for a, b in zip(jax.tree.leaves(new.params.lora), jax.tree.leaves(before[1]))
  ]
  assert min(moved) > 0  # every adapter trained
  for got, exp in zip(jax.tree.leaves(new.params.base), jax.tree.leaves(before[0])):
    np.testing.assert_array_equal(got, exp)  # base, router and experts frozen, bit for bit

"""The learner's jitted steps run a Qwen3-MoE model (qwen3_moe.forward) on an expert-parallel
mesh: log-probs equal the 1-device forward's, an SFT step moves the expert weights and
reports the router's load-balancing / z losses (added to its loss)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.learner import optim, steps
from rstar_jax.learner.train_state import TrainState
from rstar_jax.models import qwen3, qwen3_moe
from rstar_jax.sharding import make_mesh

CFG = qwen3_moe.Qwen3MoeConfig(
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
)


@pytest.mark.slow  # ~3 min on a loaded 2-core machine (compiles the three steps with EP)
def test_moe_steps_on_expert_parallel_mesh():
  params = qwen3.init_params(CFG, jax.random.key(0))
  rng = np.random.default_rng(0)
  attn = (np.arange(8)[None] < rng.integers(3, 9, (8, 1))).astype(np.int32)
  batch = {
    "input_ids": (rng.integers(0, CFG.vocab_size, (8, 8)) * attn).astype(np.int32),
    "attention_mask": attn,
    "loss_mask": attn.astype(np.float32),
  }
  mesh = make_mesh({"expert": 2, "fsdp": 2, "data": 2})
  tx = optim.make_optimizer(optim.OptimConfig(lr=1e-2, warmup_steps=1))
  js = steps.make_jitted_steps(CFG, mesh, tx=tx)
  assert set(js.data_axes) == {"data", "fsdp", "expert"}
  logp = js.compute_logprobs(params, js.shard_batch(batch))
  logits, aux = qwen3_moe.forward(
    params, CFG, jnp.asarray(batch["input_ids"]), attention_mask=jnp.asarray(attn), return_aux=True
  )
  want = jnp.take_along_axis(
    jax.nn.log_softmax(logits[:, :-1]), batch["input_ids"][:, 1:, None], -1
  )[..., 0]
  m = attn[:, 1:]
  np.testing.assert_allclose(np.asarray(logp)[:, 1:] * m, np.asarray(want) * m, atol=1e-5)
  state = js.shard_state(TrainState.create(jax.tree.map(jnp.copy, params), tx, 0))
  state, metrics = js.sft_step(state, js.shard_batch(batch))
  new = jax.device_get(state.params)
  assert np.isfinite(float(jax.device_get(metrics["loss"])))
  # The router's balance loss joined the step (one micro-batch: the whole batch's value).
  _, want_metrics = qwen3_moe.aux_losses(aux, CFG)
  for k in ("moe/load_balancing_loss", "moe/router_z_loss", "moe/load_cv_mean"):
    np.testing.assert_allclose(float(metrics[k]), float(want_metrics[k]), rtol=1e-5, err_msg=k)
  assert not np.allclose(
    new["moe"]["experts"]["up_proj"]["kernel"], params["moe"]["experts"]["up_proj"]["kernel"]
  )

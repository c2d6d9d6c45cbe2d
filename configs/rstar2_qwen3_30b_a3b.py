"""rStar2-Agent on Qwen3-30B-A3B (mixture of experts): the 14B recipe on the MoE model.

Everything the paper and the released code fix (stages, batch, optimizer, tool loop, reward,
prompt, evaluation: configs/rstar2_qwen3_14b.py, docs/fidelity.md) is the 14B recipe's; what
changes is the policy and how it is laid out:

* the model: Qwen3-30B-A3B (HF ``qwen3_moe``: 48 layers, all sparse, 128 experts, top 8,
  30.5 B parameters, 3.3 B active per token), trained by `rstar_jax.models.qwen3_moe` with the
  load-balancing loss at the checkpoint's ``router_aux_loss_coef`` (docs/moe.md);
* the mesh: 8 nodes x 8 MI300X as expert parallel 8 x FSDP 8 (each device holds 16 experts of
  every layer; tokens go to their experts by all-to-all inside the layer; the batch is split
  over all 64 devices);
* rollout routing replay (docs/routing_replay.md): the SGLang workers record each token's
  experts (start them with ``--enable-return-routed-experts``) and the learner's forward,
  old log-probs included, uses the engine's expert set, so sampler and learner agree on the
  experts and the importance ratios stay near 1.

Usage: --config=configs/rstar2_qwen3_30b_a3b.py            (RL, all stages)
       --config=configs/rstar2_qwen3_30b_a3b.py:sft        (non-reasoning SFT)
       --config=configs/rstar2_qwen3_30b_a3b.py:debug --config.model.hf_dir=DIR
           (one RL step on one CPU against a local transformers-built Qwen3-MoE; :sft_debug
           and :eval_debug likewise; `configs.common.debug_overlay` lists what changes)
Plan: python -m launchers.plan --config=configs/rstar2_qwen3_30b_a3b.py --num_devices=64
      (8 devices: --num_devices=8 --config.mesh.fsdp=1 --config.train.micro_batches=1024;
      figures in docs/moe.md)
"""

import ml_collections

from configs import common, rstar2_qwen3_14b


def get_config(variant: str = "rl") -> ml_collections.ConfigDict:
  mode, debug = common.recipe_variant(variant, "configs/rstar2_qwen3_30b_a3b.py")
  c = _recipe(mode)
  return common.debug_overlay(c) if debug else c


def _recipe(mode: str) -> ml_collections.ConfigDict:
  c = rstar2_qwen3_14b._recipe(mode)
  c.model.hf_dir = "/checkpoints/Qwen3-30B-A3B-Base"
  # Expert parallel 8 x FSDP 8: the expert stacks are split over both axes (experts over
  # `expert`, model width over `fsdp`); attention, norms and embeddings over `fsdp` (8-way).
  c.mesh = common.mesh_config(data=1, fsdp=8, tensor=1)
  c.mesh.expert = 8
  # 8192 rows over 64 data shards (data x fsdp x expert) = 128 rows per device; 128
  # micro-batches -> 1 row per device per micro-batch, as the 14B recipe.
  c.train.micro_batches = 128 if mode == "rl" else 1
  c.rl.routing_replay = "rollout"
  c.plan.model_preset = "qwen3-30b-a3b"
  return c

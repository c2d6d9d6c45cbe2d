"""ASTER on Qwen3-4B-Thinking-2507: interaction-dense cold start, then 2 RL stages.

Values from the ASTER paper and its public reproduction (docs/fidelity.md has each one with its
source and test): 128 prompts x 8 samples, 2 updates per step (mini-batches of 64 prompts),
token-level truncated importance sampling capped at 2.0 between the sampler's and the learner's
log-probs, no warm-up, no zero-variance filter, dual clip c = 10, responses 16,384 then 30,720
tokens, 50 turns and 50 tool calls, a stateful 30 s / 1 GB interpreter, the Qwen3 thinking chat
template with a `code_interpreter` tool, a stage-2 set without the problems all-correct in the
last stage-1 steps' rollouts, evaluation at T = 1, top-p 1.

Usage: --config=configs/aster_qwen3_4b.py        (RL)
       --config=configs/aster_qwen3_4b.py:sft    (cold-start SFT on dense trajectories)
       --config=configs/aster_qwen3_4b.py:debug --config.model.hf_dir=DIR
           (one RL step on one CPU against a local transformers-built checkpoint; :sft_debug
           and :eval_debug likewise; `configs.common.debug_overlay` lists what changes)
"""

import ml_collections

from configs import common


def get_config(variant: str = "rl") -> ml_collections.ConfigDict:
  mode, debug = common.recipe_variant(variant, "configs/aster_qwen3_4b.py")
  c = _recipe(mode)
  return common.debug_overlay(c) if debug else c


def _recipe(mode: str) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.mode = mode
  c.model = common.model_config(hf_dir="/checkpoints/Qwen3-4B-Thinking-2507")
  c.model.dtype = "bfloat16"
  c.model.remat = True
  # 8 nodes x 8 MI300X: tensor-parallel inside a node, FSDP across nodes; a 32k-token row's
  # (T, T) attention scores need the heads split 8 ways (plan: third_party/rocm/README.md).
  c.mesh = common.mesh_config(data=1, fsdp=8, tensor=8)
  c.rl = common.rl_config()
  c.rl.group_size = 8  # [REPRO] n = 8
  c.rl.oversample = 1  # ASTER is plain GRPO: no oversampling
  c.rl.roc_mode = "random"
  c.rl.dual_clip_c = 10.0
  c.rl.drop_zero_variance = False  # plain GRPO groups, all-correct / all-wrong included
  c.rl.ppo_mini_batches = 2  # 2 optimizer updates per step: 64 of the 128 prompts each
  c.rl.tis_cap = 2.0  # truncated IS, sampler (behaviour) vs learner log-probs
  c.rl.answer_mode = "anywhere"  # Qwen3 thinking models box the answer; no <answer> tags
  c.rollout = common.rollout_config(engine="sglang")
  c.rollout.sglang_urls = [f"http://rstar-node{i}:30000" for i in range(8)]  # every worker
  c.rollout.staging_dir = "/shared/rstar_jax/weights"
  c.rollout.max_turns = 50
  c.rollout.max_tool_calls = 50
  c.rollout.response_budget = 16384
  c.rollout.chat_format = "qwen3_thinking"  # Qwen3 thinking template, `code_interpreter` tool
  c.tool = common.tool_config()
  c.tool.stateful = True
  c.tool.timeout_s = 30.0
  c.tool.memory_limit_mb = 1024
  c.train = common.train_config()
  c.train.batch_prompts = 128
  # RL: 2 updates per step, each on 64 prompts x 8 = 512 rows over 8 data shards = 64 per
  # shard -> 1 row of T = 32768 per shard per micro-batch. SFT: 16 rows / 8 shards / 2 = 1 row.
  # (launchers/plan.py sizes one update of all 1024 rows: 2 rows per micro-batch, an upper bound.)
  c.train.micro_batches = 64 if mode == "rl" else 2
  c.eval = common.eval_config()
  c.eval.temperature, c.eval.top_p = 1.0, 1.0
  # Ahead-of-time planning (launchers/plan.py): architecture used when hf_dir is not readable
  # on the planning machine, and the accelerator assumptions.
  c.plan = common.plan_config(model_preset="qwen3-4b", hbm_gib=192.0, mem_fraction=0.55, mfu=0.35)
  c.data = common.data_config(
    train_path="/data/dapo17k.jsonl", sft_path="/data/aster_dense_4k.jsonl"
  )
  # Cold-start selection (ASTER §3.1): correct answer, every tool call succeeded, > 9 calls.
  c.coldstart = common.coldstart_config(
    min_tool_calls=10, max_trajectories=4000, require_all_calls_ok=True
  )
  if mode == "sft":
    c.optim = common.optim_config(lr=3e-5, warmup_steps=0, schedule="constant")
    c.sft = common.sft_config(epochs=6.0, warmup_ratio=0.06, batch_size=16, max_seq_len=32768)
    c.stages = []
  else:
    c.optim = common.optim_config(lr=1e-6, warmup_steps=0)
    # Stage 2 drops the problems whose rollouts were all correct the last time they were
    # sampled in the final stage-1 steps (no re-sampling). The window is not given in the
    # paper: ~one pass over DAPO-Math-17k at 128 prompts per step (docs/fidelity.md).
    c.stages = [
      common.stage("stage1_16k", steps=405, response_budget=16384, max_turns=50),
      common.stage(
        "stage2_30k",
        steps=200,
        response_budget=30720,
        max_turns=50,
        data="recent",
        recent_steps=135,
      ),
    ]
  c.reward = common.reward_config()  # reward / verifier by registry name
  c.log = common.log_config()  # W&B, sample rollouts
  return c

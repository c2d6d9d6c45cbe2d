"""rStar2-Agent on Qwen3-14B: 3 RL stages, 64 GPUs, SGLang rollouts.

The stage plan, batch and optimizer follow the rStar2-Agent paper (Shang et al. 2025,
arXiv:2508.20722, §4: 512 prompts x 16 kept of 32 sampled, lr 1e-6, stages 8k/12k/12k with a
hard third stage). The tool loop, reward, prompt and evaluation follow the released code
(microsoft/rStar, rstar2_agent/ and its verl fork): one tool call per turn, tool output cut to
256 characters (middle), 5 assistant turns, the `python_code_with_standard_io` tool, the
prime_math + math-verify reward, integer answers and prompts <= 2,048 tokens, and AIME eval with
n = 16 greedy samples. docs/fidelity.md lists every element with its source and test.

Usage: --config=configs/rstar2_qwen3_14b.py            (RL, all stages; plan default = stage 1)
       --config=configs/rstar2_qwen3_14b.py:sft        (non-reasoning SFT, paper §3)
       --config=configs/rstar2_qwen3_14b.py:debug --config.model.hf_dir=DIR
           (one RL step on one CPU against a local transformers-built checkpoint; :sft_debug
           and :eval_debug likewise; `configs.common.debug_overlay` lists what changes)
"""

import ml_collections

from configs import common


def get_config(variant: str = "rl") -> ml_collections.ConfigDict:
  mode, debug = common.recipe_variant(variant, "configs/rstar2_qwen3_14b.py")
  c = _recipe(mode)
  return common.debug_overlay(c) if debug else c


def _recipe(mode: str) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.mode = mode
  c.model = common.model_config(hf_dir="/checkpoints/Qwen3-14B-Base")
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "float32"
  c.model.remat = True
  # Blockwise attention: O(T x block) memory instead of the (B, H, T, T) scores, so a 12-16k
  # token row fits without splitting heads; rows are packed (train.pack_rows, on by default).
  c.model.attention = "blockwise"
  c.model.attention_block_size = 512
  # 8 nodes x 8 MI300X, pure FSDP over all 64 devices (no tensor parallelism needed once the
  # T x T scores are gone). Plan: python -m launchers.plan --config=configs/rstar2_qwen3_14b.py
  # --stage=1 (third_party/rocm/README.md)
  c.mesh = common.mesh_config(data=1, fsdp=64, tensor=1)
  c.rl = common.rl_config()
  c.rl.answer_mode = "released"  # prime_math rules or math-verify over the whole response
  c.rl.dual_clip_c = 3.0  # verl's clip_ratio_c default, active in the released actor
  c.rollout = common.rollout_config(engine="sglang")
  c.rollout.chat_format = "rstar2_released"  # released tool name + descriptions, no "\n" join
  c.rollout.max_parallel_calls = 1  # verl multi_turn.max_parallel_calls
  c.rollout.max_turns = 5  # rstar2_agent_trainer.yaml max_assistant_turns
  # Every SGLang worker is listed (not only sglang-router): the engine's KV-capacity scheduler
  # spreads trajectories itself, and the weight push must reach each worker.
  c.rollout.sglang_urls = [f"http://rstar-node{i}:30000" for i in range(8)]
  c.rollout.staging_dir = "/shared/rstar_jax/weights"
  c.tool = common.tool_config()
  c.tool.num_workers = 64
  c.tool.max_response_chars = 256  # verl multi_turn.max_tool_response_length
  c.tool.truncation = "released"  # tool_response_truncate_side = middle (128 + marker + 128)
  c.train = common.train_config()
  # RL: 512 prompts x 16 = 8192 rows over 64 data shards = 128 rows per shard; 128
  # micro-batches -> 1 row of T = 14336 (stage 2/3) per device per micro-batch (the plan's
  # fit). Packed rows need fewer micro-batches for the same trajectories.
  c.train.micro_batches = 128 if mode == "rl" else 1
  c.eval = common.eval_config()
  c.eval.protocol = "released"  # examples/aime_eval.sh: n = 16, greedy, 5 turns, 30,720
  # Ahead-of-time planning (launchers/plan.py): architecture used when hf_dir is not readable
  # on the planning machine, and the accelerator assumptions.
  # packed_fill: mean trajectory length / T assumed for the packed-rows FLOPs (not measured).
  c.plan = common.plan_config(
    model_preset="qwen3-14b", hbm_gib=192.0, mem_fraction=0.55, mfu=0.35, packed_fill=0.5
  )
  c.data = common.data_config(
    train_path="/data/rstar2_rl_42k.jsonl",
    sft_path="/data/nonreasoning_sft.jsonl",
    integer_answers_only=True,
    drop_overlong_prompts=True,
  )
  if mode == "sft":
    c.optim = common.optim_config(lr=5e-6, warmup_steps=0, schedule="cosine")
    c.sft = common.sft_config(epochs=3.0, warmup_ratio=0.04, batch_size=128, max_seq_len=4096)
    c.stages = []
  else:
    c.optim = common.optim_config(lr=1e-6, warmup_steps=20, schedule="constant")
    # Paper: 10 / 10 / 15 assistant turns; the released trainer allows 5 in every stage.
    c.stages = [
      common.stage("stage1_8k", steps=300, response_budget=8192, max_turns=5),
      common.stage("stage2_12k", steps=85, response_budget=12288, max_turns=5),
      common.stage(
        "stage3_hard",
        steps=125,
        response_budget=12288,
        max_turns=5,
        data="hard",
        reset_optimizer=True,
        drop_solved_k_of_k=8,
      ),
    ]
  c.reward = common.reward_config()  # reward / verifier by registry name
  c.log = common.log_config()  # W&B, sample rollouts
  return c

"""ASTER recipe at toy scale (CPU, nothing downloaded): plain GRPO with a tool-call budget,
stateful tool sessions, 2 stages with always-solved prompts dropped before the second.

Usage: --config=configs/aster_tiny_cpu.py        (RL)
       --config=configs/aster_tiny_cpu.py:sft    (cold-start SFT on scripted tool chats)
       --config=configs/aster_tiny_cpu.py:eval
"""

import ml_collections

from configs import common
from configs.rstar2_tiny_cpu import synthetic_data, tiny_model


def get_config(mode: str = "rl") -> ml_collections.ConfigDict:
  common.check_variant(mode, "configs/aster_tiny_cpu.py")
  c = ml_collections.ConfigDict()
  c.mode = mode
  c.model = tiny_model()
  c.mesh = common.mesh_config(data=1, fsdp=-1, tensor=1)
  c.rl = common.rl_config()
  c.rl.group_size = 8  # 8 rollouts per prompt: with the tiny SFT model, often mixed
  c.rl.oversample = 1  # ASTER: no oversampling
  c.rl.roc_mode = "random"
  c.rl.min_pos, c.rl.min_neg = 1, 1
  c.rl.dual_clip_c = 10.0
  c.rollout = common.rollout_config(engine="jax")
  c.rollout.max_prompt_tokens = 1536
  c.rollout.response_budget = 128  # the scripted trajectory is ~95 tokens (tool tokens count)
  c.rollout.max_turns = 4
  c.rollout.max_tool_calls = 3
  c.rollout.max_batch = 16
  c.rollout.temperature = 0.8
  c.tool = common.tool_config()
  c.tool.num_workers = 2
  c.tool.stateful = True
  c.tool.max_response_chars = 256
  c.train = common.train_config()
  c.train.batch_prompts = 4
  c.train.checkpoint_every = 1
  c.train.keep_checkpoints = 2
  c.train.progress_every_s = 5.0
  c.eval = common.eval_config()
  c.eval.k = 1
  c.eval.max_turns = 4
  c.eval.response_budget = 128
  c.eval.max_problems = 4
  c.data = synthetic_data()
  c.coldstart = common.coldstart_config(
    min_tool_calls=1, max_trajectories=64, require_all_calls_ok=True
  )
  if mode == "sft":
    # As rstar2_tiny_cpu: enough SFT steps that RL's groups are mixed (see its docstring).
    c.optim = common.optim_config(lr=1e-2, warmup_steps=0, schedule="cosine")
    c.sft = common.sft_config(epochs=30.0, warmup_ratio=0.1, batch_size=4, max_seq_len=2048)
    c.stages = []
  else:
    c.optim = common.optim_config(lr=1e-4, warmup_steps=2)
    c.stages = [
      common.stage("stage1", steps=2, response_budget=128, max_turns=4),
      common.stage(
        "stage2", steps=1, response_budget=160, max_turns=4, data="hard", drop_solved_k_of_k=2
      ),
    ]
  c.reward = common.reward_config()  # reward / verifier by registry name
  c.log = common.log_config()  # W&B, sample rollouts
  return c

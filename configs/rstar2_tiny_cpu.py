"""rStar2-Agent recipe at toy scale: runs on a 2-core CPU in a minute or two, nothing downloaded.

Same structure as `rstar2_qwen3_14b` (3 stages, the last on the hard subset with an optimizer
reset; 2G rollouts down-sampled to G by RoC), with a tiny from-scratch Qwen3, a BPE tokenizer
trained on the run's own texts, the embedded JaxSampler and synthetic tool-needing problems.
It checks the machinery, it does not learn much: the demo (`configs/demo_cpu.py`) is the run
that shows learning.

Usage: --config=configs/rstar2_tiny_cpu.py          (RL)
       --config=configs/rstar2_tiny_cpu.py:sft      (SFT on scripted tool chats)
       --config=configs/rstar2_tiny_cpu.py:eval     (avg@k evaluation)
"""
import ml_collections

from configs import common


def tiny_model() -> ml_collections.ConfigDict:
  return common.model_config(vocab_size=1024, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=16, max_position_embeddings=2048)


def synthetic_data() -> ml_collections.ConfigDict:
  # The paths stay empty: seeded synthetic tasks, disjoint train / held-out.
  return common.synthetic_data(seed=0, n_train=24, n_eval=8,
                               families=["mul", "mulmod", "powmod"], difficulty="easy")


def get_config(mode: str = "rl") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.mode = mode
  c.model = tiny_model()
  c.mesh = common.mesh_config(data=1, fsdp=-1, tensor=1)
  c.rl = common.rl_config()
  c.rl.group_size = 2
  c.rl.oversample = 2
  c.rl.min_pos, c.rl.min_neg = 1, 1
  c.rollout = common.rollout_config(engine="jax")
  c.rollout.max_prompt_tokens = 1536
  c.rollout.response_budget = 48
  c.rollout.max_turns = 2
  c.rollout.max_batch = 8
  c.tool = common.tool_config()
  c.tool.num_workers = 2
  c.tool.max_response_chars = 256
  c.train = common.train_config()
  c.train.batch_prompts = 2
  c.train.checkpoint_every = 1
  c.train.keep_checkpoints = 2
  c.train.progress_every_s = 5.0
  c.eval = common.eval_config()
  c.eval.k = 1
  c.eval.max_turns = 2
  c.eval.response_budget = 48
  c.eval.max_problems = 4
  c.data = synthetic_data()
  if mode == "sft":
    c.optim = common.optim_config(lr=1e-3, warmup_steps=0, schedule="cosine")
    c.sft = common.sft_config(epochs=1.0, warmup_ratio=0.1, batch_size=8, max_seq_len=2048)
    c.stages = []
  else:
    c.optim = common.optim_config(lr=1e-4, warmup_steps=2, schedule="constant")
    c.stages = [
        common.stage("stage1", steps=2, response_budget=48, max_turns=2),
        common.stage("stage2", steps=1, response_budget=64, max_turns=2),
        common.stage("stage3_hard", steps=1, response_budget=64, max_turns=3, data="hard",
                     reset_optimizer=True, drop_solved_k_of_k=2),
    ]
  return c

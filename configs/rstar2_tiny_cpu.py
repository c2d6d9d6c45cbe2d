"""rStar2-Agent recipe at toy scale: runs on a 2-core CPU in a few minutes, nothing downloaded.

Same structure as `rstar2_qwen3_14b` (3 stages, the last on the hard subset with an optimizer
reset; 2G rollouts down-sampled to G by RoC), with a tiny from-scratch Qwen3, a BPE tokenizer
trained on the run's own texts, the embedded JaxSampler and synthetic tool-needing problems.
It checks the machinery rather than teaching much (the demo, `configs/demo.py`, is the run that
shows learning), but it does train: the problems are one-digit products ("Compute 7 * 8.") and
SFT runs 30 epochs over 4 of them at lr 1e-2, so the SFT model gets the tool-call format and
some answers right when sampled (temperature 0.8); RL's groups of 8 rollouts for each of the 4
prompts are then often mixed (neither all-correct nor all-wrong) and the optimizer steps (3
updates in 4 RL steps in the launcher test's run). The response budgets (128+) fit the
~95-token scripted trajectory (tool tokens count). With 3-digit operands, 8 problems x 20
epochs, or budgets under the trajectory length, every group was all-wrong: no update.

Usage: --config=configs/rstar2_tiny_cpu.py          (RL)
       --config=configs/rstar2_tiny_cpu.py:sft      (SFT on scripted tool chats)
       --config=configs/rstar2_tiny_cpu.py:eval     (avg@k evaluation)
"""

import ml_collections

from configs import common


def tiny_model() -> ml_collections.ConfigDict:
  return common.model_config(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
  )


def synthetic_data() -> ml_collections.ConfigDict:
  # The paths stay empty: seeded synthetic tasks, disjoint train / held-out. One-digit operands:
  # a ~70k-parameter model copies them into the code after a few dozen SFT steps (3-digit
  # "easy" operands stay at chance: no RL signal).
  return common.synthetic_data(**common.one_digit_mul(), n_train=4, n_eval=8)


def get_config(mode: str = "rl") -> ml_collections.ConfigDict:
  common.check_variant(mode, "configs/rstar2_tiny_cpu.py")
  c = ml_collections.ConfigDict()
  c.mode = mode
  c.model = tiny_model()
  c.mesh = common.mesh_config(data=1, fsdp=-1, tensor=1)
  c.rl = common.rl_config()
  c.rl.group_size = 4
  c.rl.oversample = 2  # 8 rollouts per prompt, RoC keeps 4
  c.rl.min_pos, c.rl.min_neg = 1, 1
  c.rollout = common.rollout_config(engine="jax")
  c.rollout.max_prompt_tokens = 1536
  c.rollout.response_budget = 128
  c.rollout.max_turns = 2
  c.rollout.max_batch = 16
  c.rollout.temperature = 0.8  # the tiny SFT model keeps the tool-call JSON intact more often
  c.tool = common.tool_config()
  c.tool.num_workers = 2
  c.tool.max_response_chars = 256
  c.train = common.train_config()
  c.train.batch_prompts = 4
  c.train.checkpoint_every = 1
  c.train.keep_checkpoints = 2
  c.train.progress_every_s = 5.0
  c.eval = common.eval_config()
  c.eval.k = 1
  c.eval.max_turns = 2
  c.eval.response_budget = 128
  c.eval.max_problems = 4
  c.data = synthetic_data()
  if mode == "sft":
    c.optim = common.optim_config(lr=1e-2, warmup_steps=0, schedule="cosine")
    c.sft = common.sft_config(epochs=30.0, warmup_ratio=0.1, batch_size=4, max_seq_len=2048)
    c.stages = []
  else:
    c.optim = common.optim_config(lr=1e-4, warmup_steps=2, schedule="constant")
    c.stages = [
      common.stage("stage1", steps=2, response_budget=128, max_turns=2),
      common.stage("stage2", steps=1, response_budget=128, max_turns=2),
      common.stage(
        "stage3_hard",
        steps=1,
        response_budget=160,
        max_turns=3,
        data="hard",
        reset_optimizer=True,
        drop_solved_k_of_k=2,
      ),
    ]
  c.reward = common.reward_config()  # reward / verifier by registry name
  c.log = common.log_config()  # W&B, sample rollouts
  return c

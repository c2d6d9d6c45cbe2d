"""The CPU demo (README main job): cold-start SFT -> eval -> GRPO-RoC -> eval, from scratch.

  python -m launchers.demo --workdir=/tmp/demo_run
  python -m launchers.demo --workdir=/tmp/demo_grpo --config.rl.roc_mode=random   (plain GRPO)

Sized for a 2-core CPU in about 20 minutes: a ~1M-parameter Qwen3 with a 1024-token BPE
trained on the run's own texts, a short system prompt without the tool schema block (the chat
format is otherwise SPEC §3's, identical in SFT, RL and evaluation), short tool-needing
problems, and the held-out set evaluated with the same settings before and after RL.
"""
import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.mode = "rl"
  c.model = common.model_config(vocab_size=1024, hidden_size=128, intermediate_size=384,
                                num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=32,
                                max_position_embeddings=1024)
  c.mesh = common.mesh_config(data=1, fsdp=-1, tensor=1)
  c.mesh.num_devices = 1
  c.data = ml_collections.ConfigDict(dict(
      train_path="", sft_path="",
      synthetic=ml_collections.ConfigDict(dict(
          seed=0, n_train=1000, n_eval=200,
          families=["mul", "mulmod", "powmod", "digit_sum_pow", "ncr_mod"],
          difficulty="easy")),
  ))
  # Scripted interaction-dense cold start (rstar_jax.data.coldstart) + ASTER selection.
  c.coldstart = ml_collections.ConfigDict(dict(
      explore_prob=0.8, bug_prob=0.3, min_tool_calls=2, max_trajectories=0, max_calls=2,
      seed=0))
  c.sft = ml_collections.ConfigDict(dict(epochs=3.0, warmup_ratio=0.05, batch_size=16,
                                         max_seq_len=256, log_every_s=15.0))
  c.sft_optim = common.optim_config(lr=3e-3, warmup_steps=0, schedule="cosine")
  c.optim = common.optim_config(lr=2e-4, warmup_steps=2, schedule="constant")
  c.rl = common.rl_config()
  c.rl.group_size = 8
  c.rl.oversample = 2
  c.rollout = common.rollout_config(engine="jax")
  c.rollout.temperature = 1.0
  c.rollout.max_prompt_tokens = 256
  c.rollout.response_budget = 168
  c.rollout.max_turns = 5
  c.rollout.max_batch = 64
  c.rollout.max_len = 256
  c.rollout.decode_chunk = 16
  c.tool = common.tool_config()
  c.tool.num_workers = 2
  c.tool.max_response_chars = 128
  c.train = common.train_config()
  c.train.batch_prompts = 8
  c.train.checkpoint_every = 5
  c.train.keep_checkpoints = 2
  c.train.eval_every = 5
  c.train.progress_every_s = 20.0
  c.stages = [common.stage("demo", steps=30, response_budget=168, max_turns=5)]
  c.eval = common.eval_config()
  c.eval.k = 1
  c.eval.temperature = 0.6
  c.eval.top_p = 1.0
  c.eval.max_turns = 5
  c.eval.response_budget = 168
  c.eval.max_problems = 200
  c.demo = ml_collections.ConfigDict(dict(
      # A short system prompt and no tool-schema block keep prompts ~80 tokens on a CPU.
      system_prompt="Solve the problem with the python tool.",
      with_tools=False,
      show_tool_time=False,       # no "execution time" line in tool responses (fewer tokens)
      curve_eval_problems=64,     # held-out problems evaluated every train.eval_every steps
      reuse_sft_from="",          # another demo workdir whose data/tokenizer/SFT phases to copy
      plot=True,
  ))
  return c

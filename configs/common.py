"""Shared config builders. Every field is documented once here; the recipe files only override.

A full run config has these sections:
  model     which policy: an HF checkpoint dir (real runs) or tiny from-scratch dims (CPU demo).
  mesh      device mesh axis sizes; -1 on one axis means "all remaining devices".
  optim     AdamW + schedule (SPEC §6.3: lr 1e-6 constant after 20 warm-up steps, wd 0.01, clip 1.0).
  rl        GRPO-RoC knobs (SPEC §1 and the decisions table).
  rollout   engine + agent loop limits (SPEC §3.4, §5).
  tool      code pool limits (SPEC §4).
  stages    the multi-stage recipe, a list of per-stage overrides (SPEC §6.3, §8.3).
  data      problem / trajectory files.
  train     batch sizes, micro-batching, checkpointing, logging.
  eval      avg@k pass@1 settings (SPEC §10).
"""
import ml_collections


def model_config(hf_dir: str = "", **tiny) -> ml_collections.ConfigDict:
  m = ml_collections.ConfigDict()
  # A local HF directory (config.json + safetensors + tokenizer). Empty = build from `tiny`.
  m.hf_dir = hf_dir
  # Tiny from-scratch model (used when hf_dir is empty): Qwen3 architecture at toy scale.
  m.vocab_size = tiny.get("vocab_size", 512)
  m.hidden_size = tiny.get("hidden_size", 128)
  m.intermediate_size = tiny.get("intermediate_size", 384)
  m.num_hidden_layers = tiny.get("num_hidden_layers", 2)
  m.num_attention_heads = tiny.get("num_attention_heads", 4)
  m.num_key_value_heads = tiny.get("num_key_value_heads", 2)
  m.head_dim = tiny.get("head_dim", 32)
  m.rope_theta = tiny.get("rope_theta", 10000.0)
  m.max_position_embeddings = tiny.get("max_position_embeddings", 4096)
  m.tie_word_embeddings = tiny.get("tie_word_embeddings", True)
  m.param_dtype = "float32"
  m.dtype = "float32"          # compute dtype; "bfloat16" on accelerators
  m.remat = False              # per-layer rematerialisation (needed at 14B scale)
  # Learner attention: "xla" (dense T x T scores), "blockwise" (O(T * block) memory, long rows)
  # or "fused" (cuDNN flash attention on CUDA, else XLA); see rstar_jax/models/attention.py.
  m.attention = "xla"
  m.attention_block_size = 512
  # Directory with tokenizer.json; empty = hf_dir. A from-scratch model needs one (the demo
  # trains a byte-level BPE tokenizer and points here).
  m.tokenizer_dir = ""
  return m


def mesh_config(data: int = 1, fsdp: int = -1, tensor: int = 1) -> ml_collections.ConfigDict:
  # num_devices: use only the first n devices (0 = all), e.g. one CPU device for toy runs.
  return ml_collections.ConfigDict(dict(data=data, fsdp=fsdp, tensor=tensor, num_devices=0))


def optim_config(lr: float = 1e-6, warmup_steps: int = 20, schedule: str = "constant",
                 total_steps: int = 0) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      lr=lr,
      warmup_steps=warmup_steps,
      schedule=schedule,          # "constant" | "cosine" (cosine decays over total_steps)
      total_steps=total_steps,
      b1=0.9, b2=0.999, eps=1e-8,
      weight_decay=0.01,
      grad_clip=1.0,
  ))


def rl_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      group_size=16,                 # G kept per prompt; 2G are sampled
      oversample=2,                  # rollouts sampled per prompt = oversample * G
      roc_mode="paper",              # "paper" (∝ 1/(p+eps) sampling) | "released" (lowest penalty) | "random" (plain GRPO)
      min_pos=2, min_neg=2,
      roc_eps=1e-6,
      drop_zero_variance=True,       # drop all-correct / all-wrong groups before RoC
      p_err_mode="paper",            # "paper" structured outcomes | "released" substring "error"
      p_format_mode="paper",
      adv_eps=1e-6,
      unbiased_std=True,
      neg_adv_scale=1.0,             # negative advantages x this (1 = GRPO; <1 = asymmetric REINFORCE)
      eps_low=0.2, eps_high=0.28,
      dual_clip_c=0.0,               # 0 = off (released code: 3.0)
      ppo_mini_batches=1,            # optimizer updates per RL step, each on a shuffled slice (1 = on-policy, paper code)
      ppo_epochs=1,                  # passes over the step's trajectories
      kl_coef=0.0,
      entropy_coef=0.0,
      loss_agg="token-mean",         # "token-mean" | "seq-mean-token-mean" ("seq-mean") | "seq-mean-token-sum"
      recompute_old_logprobs=True,   # True: learner recomputes after RoC (released code); False: sampler's
      answer_mode="answer_tag",      # reward: last boxed answer inside <answer> (paper) | "anywhere" (released)
      max_step_retries=3,            # retries of a failed rollout (engine error, lost tool worker)
      hard_subset_max_problems=0,    # 0 = sample the whole set when building a hard subset
      collapse_window=5,             # steps of falling tool calls/trajectory before a warning
  ))


def rollout_config(engine: str = "jax") -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      engine=engine,                 # "jax" (embedded JaxSampler) | "sglang"
      sglang_urls=["http://127.0.0.1:30000"],
      staging_dir="/dev/shm/rstar_jax_weights",   # weight push target (tmpfs or shared FS)
      temperature=1.0, top_p=1.0, top_k=-1,
      max_prompt_tokens=2048,
      response_budget=8192,          # generated + tool tokens per trajectory
      max_turns=10,
      max_parallel_calls=0,          # 0 = execute every call in a turn (paper)
      max_tool_calls=0,              # 0 = unlimited; ASTER: 50
      max_batch=64,                  # JaxSampler slots
      decode_chunk=16,               # JaxSampler tokens per jitted decode call
  ))


def tool_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      num_workers=8,
      timeout_s=4.0,                 # rStar README: MAX_EXECUTION_TIME = 4 s
      memory_limit_mb=384,           # 256 MB + 128 MB (code-judge)
      max_response_chars=1024,       # middle-truncated tool response body
      stateful=False,                # ASTER: variables persist across the calls of one trajectory
  ))


def train_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      seed=0,
      batch_prompts=512,             # prompts per RL step
      micro_batches=1,               # gradient accumulation; token-mean stays exact
      checkpoint_every=10,
      keep_checkpoints=3,
      log_every=1,
      eval_every=0,                  # RL steps between held-out evaluations (0 = none in the loop)
      progress_every_s=10.0,         # progress lines during rollouts / SFT / eval
      # RL and SFT: pack several trajectories per row (segment ids, per-segment positions;
      # rstar_jax/learner/packing.py). RL packs only with rl.loss_agg = "token-mean".
      pack_rows=True,
  ))


def eval_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      path="",
      k=16,                          # samples per problem (avg@k pass@1)
      temperature=0.6, top_p=0.95,
      max_turns=30,
      response_budget=30720,
      seed=0,
      max_problems=0,                # 0 = every problem of the eval set
  ))


def stage(name: str, steps: int, response_budget: int, max_turns: int, data: str = "full",
          reset_optimizer: bool = False, drop_solved_k_of_k: int = 0) -> dict:
  """One RL stage. `data="hard"` uses the subset left after dropping problems that the policy
  at the stage start solves k of k times (`drop_solved_k_of_k` = k; rStar2 stage 3: k = 8)."""
  return dict(name=name, steps=steps, response_budget=response_budget, max_turns=max_turns,
              data=data, reset_optimizer=reset_optimizer, drop_solved_k_of_k=drop_solved_k_of_k)

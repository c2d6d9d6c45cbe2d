"""The CPU demo (README main job): cold-start SFT -> eval -> GRPO-RoC -> eval, from scratch.

  python -m launchers.demo --workdir=/tmp/demo_run
  python -m launchers.demo --workdir=/tmp/demo_grpo --config.rl.roc_mode=random   (plain GRPO)
  python -m launchers.demo --config=configs/demo.py:lora --workdir=/tmp/demo_lora  (RL with LoRA)
  python -m launchers.demo --config=configs/demo.py:moe --workdir=/tmp/demo_moe    (tiny Qwen3-MoE;
      --config.rl.routing_replay=rollout replays the engine's routes; docs/routing_replay.md)

Sized for a 2-core CPU (11 minutes measured, the bar is 20): a ~0.8M-parameter Qwen3 (3 layers, hidden 128)
with a 1536-token BPE trained on the run's own texts (numbers 0-999, the user prefix and the
tool-call JSON wrapper are single tokens), a short system prompt without the tool-schema block
(otherwise rStar2-Agent's chat format, identical in SFT, RL and evaluation), short tool-needing
problems with two-digit operands (a*b mod m, a^e mod m, C(n,k) mod m, power sums mod m, prime
counts), and the same 200 held-out problems evaluated with the same settings (temperature 0.6,
k=1) before and after RL.

Where the RL settings leave the paper's (rStar2-Agent) and why, all measured on this model:
  * rollout temperature 0.6 (paper 1.0): at 1.0 the SFT model solves ~10% of its rollouts,
    at 0.6 ~55%, so most groups are mixed and every step has a signal;
  * 32 prompts x 8 rollouts kept to 4 per step (paper 16 of 32 per prompt): more distinct
    problems per update; with 8 prompts a step over-fits the few numbers it saw;
  * lr 3e-4, 2 updates per step (paper 1e-6, 1): a 0.8M model needs large steps;
  * rl.neg_adv_scale = 0.3 (paper 1.0): with unscaled negatives the negatives' log-probs fall
    ~10x faster than the positives' rise and the policy spreads instead of sharpening
    (collapse at lr >= 5e-4, no gain at 1e-4).
In the 2026-12-04 README run the SFT model is right on 0.670 of the held-out problems at
temperature 0.6, and 40 RL steps raise that to 0.800. In the first runs (2026-12-03, older
code) the SFT model's copies of numbers were diffuse: it was right far more
often greedily than at temperature 0.6 (0.905 vs 0.385); RL raised the sampled accuracy (the
paper's metric; 0.385 -> 0.550) and ended tool errors and truncations, but lowered the greedy
one (0.905 -> 0.755).
"""

import ml_collections

from configs import common
from rstar_jax.config import schema


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  """variant "" = the demo; "smoke" = a toy-sized run of every phase with real RL updates
  (~1-2 minutes); "noisy" / "sparse" / "dense" / "graded" = the claims benchmark's environments
  (`CLAIM_VARIANTS`), and "<claim>_smoke" the same at toy size (`_claim_smoke`); "lora" /
  "lora_smoke" = RL with LoRA adapters (the latter at the smoke size); "moe" / "moe_smoke" = the
  demo on a tiny Qwen3-MoE with bf16 rollouts (`_moe`)."""
  common.check_variant(variant, "configs/demo.py", VARIANTS)
  c = ml_collections.ConfigDict()
  c.mode = "rl"
  c.model = common.model_config(
    vocab_size=1536,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=1024,
  )
  c.mesh = common.mesh_config(data=1, fsdp=-1, tensor=1)
  c.mesh.num_devices = 1
  c.data = common.synthetic_data(
    seed=0,
    n_train=1000,
    n_eval=200,
    families=["mulmod", "powmod", "ncr_mod", "power_sum", "count_primes"],
    # Two-digit numbers: every number the model copies is a frequent token, so 10 SFT
    # epochs teach the copies (with "easy"'s 3-digit operands they stay near chance).
    difficulty=ml_collections.ConfigDict(
      dict(
        operand_digits=2, modulus_digits=2, exponent_digits=2, range_max=100, n_max=40, index_max=99
      )
    ),
  )
  # Scripted interaction-dense cold start (rstar_jax.data.coldstart) + ASTER selection.
  c.coldstart = common.coldstart_config(
    explore_prob=0.8, bug_prob=0.3, min_tool_calls=2, max_trajectories=0, max_calls=3, seed=0
  )
  c.sft = common.sft_config(
    epochs=10.0, warmup_ratio=0.05, batch_size=16, max_seq_len=256, log_every_s=15.0
  )
  c.sft_optim = common.optim_config(lr=3e-3, warmup_steps=0, schedule="cosine")
  c.optim = common.optim_config(lr=3e-4, warmup_steps=2, schedule="constant")
  c.rl = common.rl_config()
  c.rl.group_size = 4
  c.rl.oversample = 2
  c.rl.ppo_mini_batches = 2
  c.rl.neg_adv_scale = 0.3
  c.rollout = common.rollout_config(engine="jax")
  c.rollout.temperature = 0.6
  c.rollout.max_prompt_tokens = 56
  c.rollout.response_budget = 200
  c.rollout.max_turns = 5
  c.rollout.max_batch = 64
  c.rollout.max_len = 256
  c.rollout.decode_chunk = 16
  # A short system prompt and no tool-schema block keep prompts ~40 tokens on a CPU.
  c.rollout.system_prompt = "Solve the problem with the python tool."
  c.rollout.with_tools = False
  c.tool = common.tool_config()
  c.tool.num_workers = 2
  c.tool.max_response_chars = 128
  c.tool.show_time = False  # no "execution time" line in tool responses (fewer tokens)
  c.train = common.train_config()
  c.train.batch_prompts = 32
  # The README's demo figures were measured with one trajectory per row; packed rows give the
  # same loss up to float summation order, which still moves a 40-step run's sampled accuracy.
  c.train.pack_rows = False
  c.train.checkpoint_every = 5
  c.train.keep_checkpoints = 2
  c.train.eval_every = 5
  c.train.progress_every_s = 20.0
  c.stages = [common.stage("demo", steps=40, response_budget=200, max_turns=5)]
  c.eval = common.eval_config()
  c.eval.k = 1
  c.eval.temperature = 0.6
  c.eval.top_p = 1.0
  c.eval.max_turns = 5
  c.eval.response_budget = 200
  c.eval.max_problems = 200
  c.demo = common.section(
    schema.DemoConfig,
    split_digits=True,
    domain_tokens=True,
    number_tokens=1000,
    curve_eval_problems=48,
  )
  claim = variant.split("_")[0]
  if claim in CLAIM_VARIANTS:
    CLAIM_VARIANTS[claim](c)
    _claim_lengths(c)
  if claim == "lora":
    _lora(c)
  if claim == "moe":
    _moe(c)
  if variant in ("smoke", "lora_smoke", "moe_smoke"):
    _smoke(c)
  elif variant.endswith("_smoke"):
    _claim_smoke(c)
  c.reward = common.reward_config()  # reward / verifier by registry name
  c.log = common.log_config()  # W&B, sample rollouts
  return c


def _lora(c: ml_collections.ConfigDict) -> None:
  """RL with LoRA adapters on every linear layer (the SFT phase stays full fine-tuning: the
  model is trained from scratch there). Adapters need a larger step than full weights."""
  c.model.lora_rank = 16
  c.model.lora_alpha = 32.0
  c.optim.lr = 1e-3


def _moe(c: ml_collections.ConfigDict) -> None:
  """The demo on a tiny Qwen3-MoE (issue 39): every layer sparse, 8 experts of width 192, top 2
  (renormalised gates, as Qwen3-30B-A3B), so a token's active MLP width (2 x 192 = 384) is the
  dense demo's. The rollouts run in bf16 and the learner in f32, so the engine's and the
  learner's routers really disagree; the engine records its routes (``rl.routing_metrics``) and
  every RL step logs router agreement and the importance ratios with and without replay.
  ``--config.rl.routing_replay=rollout`` replays the engine's routes in the learner
  (docs/routing_replay.md has both runs). Measured on this model (2026-12-07, docs/moe.md):
  * expert width 192 (first 96, half the dense active width): with the same cold start and
    SFT recipe, width 96 reached 0.335 held-out at T 0.6 (0.545 greedy) and RL did not move
    it; width 192 reaches 0.500. Neither the bf16 sampler (the width-96 model: 0.340 sampled
    in f32) nor the router (expert load CV 0.13, router entropy 1.75 of ln 8 = 2.08 at the end
    of SFT: no collapse) was the cause;
  * SFT and RL settings are the dense demo's, so the two runs differ only in the MLP;
  * 20 RL steps, half the dense demo's: a MoE step costs more on a CPU (the block-grouped
    experts, bf16 emulated in the sampler, one extra forward for the ratio metrics).
  Held-out after 20 RL steps (2026-12-08, after the route re-prefill fix): 0.500 -> 0.595 with
  replay off, 0.605 with it on (±3.5 each; replayed ratios 0.775-1.263, own routing
  0.0005-2.9; docs/routing_replay.md)."""
  c.model.num_experts = 8
  c.model.num_experts_per_tok = 2
  c.model.moe_intermediate_size = 192
  c.model.norm_topk_prob = True
  c.model.router_aux_loss_coef = 0.01
  c.rollout.dtype = "bfloat16"
  c.rl.routing_metrics = True
  c.stages = [common.stage("demo", steps=20, response_budget=200, max_turns=5)]


def _smoke(c: ml_collections.ConfigDict) -> None:
  """Every phase at toy size, with real RL updates. SFT memorises 4 one-digit products
  ("Compute 7 * 8.", one tool call) in 80 steps at lr 1e-2 on a ~70k-parameter model, so RL's
  8 rollouts per training problem at temperature 0.8 are right some of the time and the
  groups are mixed (measured: 4, 3 and 4 of 4 groups kept, mean reward 0.41 / 0.22 / 0.31; a
  test asserts an update happens). With the first smoke settings (the demo's problems, 1 SFT
  epoch, 48-token budgets shorter than one scripted trajectory) every group was all-wrong: no
  update, and a plot of four flat lines at 0. Held-out accuracy stays near 0 (memorised, not
  learnt): the run checks the machinery, the full demo shows learning."""
  c.data.synthetic.n_train = 4
  c.data.synthetic.n_eval = 6
  c.data.synthetic.families = ["mul"]
  c.data.synthetic.difficulty.operand_digits = 1
  c.coldstart.explore_prob, c.coldstart.bug_prob, c.coldstart.min_tool_calls = 0.0, 0.0, 1
  c.eval.max_problems = 6
  c.model.hidden_size, c.model.intermediate_size = 64, 128
  c.model.num_hidden_layers, c.model.head_dim = 2, 16
  if c.model.num_experts:
    c.model.num_experts, c.model.moe_intermediate_size = 4, 32
  c.sft.epochs, c.sft.batch_size = 80.0, 4
  c.sft_optim.lr = 1e-2
  c.rl.group_size, c.rl.oversample, c.rl.min_pos, c.rl.min_neg = 2, 4, 1, 1
  c.rollout.temperature = 0.8
  c.train.batch_prompts = 4
  c.train.eval_every = 1
  c.train.checkpoint_every = 1
  c.stages = [common.stage("demo", steps=3, response_budget=128, max_turns=3)]
  c.rollout.response_budget = c.eval.response_budget = 128
  c.eval.max_turns = 3
  c.rollout.max_batch = 32
  c.rollout.max_len = 192
  c.demo.curve_eval_problems = 3


def _claim_smoke(c: ml_collections.ConfigDict) -> None:
  """The claims benchmark's toy size (benchmarks/claims.py --smoke): the claim's own problems
  and cold start at the smallest size that runs every phase. Its groups may all be all-wrong
  (no update); `_smoke` is the toy run that trains."""
  c.data.synthetic.n_train = 32
  c.data.synthetic.n_eval = 6
  c.eval.max_problems = 6
  c.model.hidden_size, c.model.intermediate_size = 32, 64
  c.model.num_hidden_layers, c.model.head_dim = 1, 8
  c.sft.epochs, c.sft.batch_size = 1.0, 8
  c.rl.group_size, c.rl.min_pos, c.rl.min_neg = 2, 1, 1
  c.train.batch_prompts = 2
  c.train.eval_every = 1
  c.train.checkpoint_every = 1
  c.stages = [common.stage("demo", steps=2, response_budget=48, max_turns=3)]
  c.rollout.response_budget = c.eval.response_budget = 48
  c.rollout.max_batch = 8
  c.rollout.max_prompt_tokens = 96
  c.demo.curve_eval_problems = 3


# ---------------------------------------------------------------- claims benchmark (issue 30)
# benchmarks/claims.py runs these next to each other; each changes only what its claim needs.


def _noisy(c: ml_collections.ConfigDict) -> None:
  """rStar2-Agent's claim needs positives that carry tool errors. Every cold-start chat explores
  first, and half of those explorations fail (they print names they never defined) and are not
  fixed; with the broken-then-fixed solves, ~1/3 of the cold start's calls fail while every chat
  still ends right. Problems, held-out split and reward are the demo's. Injected transient
  failures (tool.inject_failure_rate) stay off unless asked for (benchmarks/claims.py
  --tool_failure_rate)."""
  c.coldstart.explore_prob = 1.0
  c.coldstart.explore_fail_prob = 0.5
  c.coldstart.bug_prob = 0.3
  c.coldstart.max_calls = 3


# ASTER's claim needs tasks a policy can also answer without the tool ("in the head", less
# reliably): the demo's families plus two such (rstar_jax.data.synthetic_tasks).
_ASTER_FAMILIES = [
  "mulmod",
  "powmod",
  "ncr_mod",
  "power_sum",
  "count_primes",
  "add",
  "mul_last_digit",
]


def _dense(c: ml_collections.ConfigDict) -> None:
  """Interaction-dense cold start: every chat explores, then solves (or breaks and fixes)."""
  c.data.synthetic.families = list(_ASTER_FAMILIES)
  c.coldstart.style = "dense"
  c.coldstart.min_tool_calls = 2
  c.coldstart.max_calls = 0


def _sparse(c: ml_collections.ConfigDict) -> None:
  """Interaction-sparse cold start on the same problems: the answer worked out in the
  reasoning, then one verification call."""
  c.data.synthetic.families = list(_ASTER_FAMILIES)
  c.coldstart.style = "sparse"
  c.coldstart.min_tool_calls = 1
  c.coldstart.max_calls = 1


def _graded(c: ml_collections.ConfigDict) -> None:
  """Between the two (issue 42, ASTER's collapse): 1 to 4 calls per chat, uniformly, on the same
  problems; a policy that starts with several calls and, under RL, may drift toward fewer."""
  c.data.synthetic.families = list(_ASTER_FAMILIES)
  c.coldstart.style = "graded"
  c.coldstart.min_tool_calls = 1
  c.coldstart.max_calls = 0


def _claim_lengths(c: ml_collections.ConfigDict) -> None:
  """Each claim variant trains its own tokenizer on its own cold start, so a question can take
  more tokens than under the demo's (the noisy one's splits "primes" apart: 58 > 56), and a
  held-out prompt over the limit would stop the SFT evaluation. The same room for every claim
  arm keeps their held-out sets identical."""
  c.rollout.max_prompt_tokens = 72
  c.rollout.max_len = c.rollout.max_prompt_tokens + c.rollout.response_budget


CLAIM_VARIANTS = {"noisy": _noisy, "dense": _dense, "sparse": _sparse, "graded": _graded}
VARIANTS = (
  ("", "smoke", "lora", "lora_smoke", "moe", "moe_smoke")
  + tuple(CLAIM_VARIANTS)
  + tuple(f"{v}_smoke" for v in CLAIM_VARIANTS)
)

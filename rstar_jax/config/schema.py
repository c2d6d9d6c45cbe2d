"""The typed run configuration: one frozen, keyword-only dataclass per concern.

This module is the single source of truth for every setting: its default, its check and its
one-line documentation live in one `checks.field(default, check, doc)` call. The recipe files
(`configs/*.py`) stay ``ml_collections`` (so absl ``config_flags`` and ``--config.x.y=...``
overrides work) and build their ConfigDicts from these defaults; launchers convert once with
`rstar_jax.config.from_config_dict`, and library code only reads these objects.

Adding a setting = one line in the section's dataclass below (default, check, doc); recipes
may then override it and the converter accepts it. Cross-field rules go in the section's
``_cross`` (or `RunConfig._cross` when they span sections).

Papers cited: rStar2-Agent (Shang et al. 2025, arXiv:2508.20722) and its released code
(github.com/microsoft/rStar, verl-based); ASTER (interaction-dense cold start + GRPO with a
tool-call budget).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from rstar_jax.config.checks import (
  INT_TUPLE,
  IS_BOOL,
  IS_STR,
  STR_TUPLE,
  Check,
  ConfigError,
  Section,
  field,
  int_range,
  num_range,
  one_of,
  registered,
  section,
)

# Defined where the learner reads it (`rstar_jax.learner.optim`); a section of the run config
# like the others (``config.optim``, ``config.sft_optim``).
from rstar_jax.learner.optim_config import OptimConfig
from rstar_jax.rewards import registry as reward_registry
from rstar_jax.user_modules import import_user_modules

MODES = ("rl", "sft", "eval")
ROUTING_REPLAY = ("off", "rollout")
DTYPES = ("float32", "bfloat16")
STAGE_DATA = ("full", "hard", "recent")
DATA_FORMATS = ("auto", "jsonl", "parquet", "hf_dataset")  # == rstar_jax.data.formats.FORMATS
ATTENTIONS = ("xla", "blockwise", "fused")  # == rstar_jax.models.attention.IMPLEMENTATIONS
LOSS_AGG = ("token-mean", "seq-mean", "seq-mean-token-mean", "seq-mean-token-sum")
# "seq-mean" is the verl spelling of "seq-mean-token-mean".
LOSS_AGG_CANONICAL = {
  "token-mean": "token-mean",
  "seq-mean": "seq-mean-token-mean",
  "seq-mean-token-mean": "seq-mean-token-mean",
  "seq-mean-token-sum": "seq-mean-token-sum",
}


# The section base and decorator live in the bottom layer (`rstar_jax.config_fields`) so the
# learner's `OptimConfig` is written in the same vocabulary.
_Section = Section
_section = section


@_section
class ModelConfig(_Section):
  """The policy: an HF checkpoint directory (real runs) or tiny from-scratch Qwen3 dims."""

  SECTION: ClassVar[str] = "model"
  hf_dir: str = field(
    "",
    IS_STR,
    "HF directory (config.json + safetensors [+ tokenizer]); '' = build from the dims below.",
  )
  vocab_size: int = field(
    512, int_range(2), "Tiny model: vocabulary size (must cover the tokenizer)."
  )
  hidden_size: int = field(128, int_range(1), "Tiny model: residual width.")
  intermediate_size: int = field(384, int_range(1), "Tiny model: MLP width.")
  num_hidden_layers: int = field(2, int_range(1), "Tiny model: decoder layers.")
  num_attention_heads: int = field(4, int_range(1), "Tiny model: query heads.")
  num_key_value_heads: int = field(
    2, int_range(1), "Tiny model: key/value heads (GQA; divides the query heads)."
  )
  head_dim: int = field(32, int_range(1), "Tiny model: per-head width.")
  rope_theta: float = field(10000.0, num_range(0, lo_open=True), "Tiny model: RoPE base.")
  rms_norm_eps: float = field(
    1e-6, num_range(0, lo_open=True), "Tiny model: RMSNorm epsilon (Qwen3: 1e-6)."
  )
  max_position_embeddings: int = field(4096, int_range(2), "Tiny model: longest position.")
  tie_word_embeddings: bool = field(
    True, IS_BOOL, "Tiny model: LM head shares the embedding table."
  )
  param_dtype: str = field("float32", one_of(DTYPES), "Dtype the params are stored and updated in.")
  dtype: str = field("float32", one_of(DTYPES), "Compute dtype; 'bfloat16' on accelerators.")
  remat: bool = field(False, IS_BOOL, "Per-layer rematerialisation (needed at 14B scale).")
  attention: str = field(
    "xla",
    one_of(ATTENTIONS),
    "Learner attention (rstar_jax/models/attention.py): 'xla' (dense T x T scores), 'blockwise' (O(T * block) memory, long rows) or 'fused' (cuDNN flash attention on CUDA, else XLA with a logged reason).",
  )
  attention_block_size: int = field(
    512, int_range(1), "Query / key block length of the 'blockwise' attention."
  )
  tokenizer_dir: str = field(
    "", IS_STR, "Directory with tokenizer.json; '' = hf_dir (a from-scratch model trains one)."
  )
  lora_rank: int = field(
    0, int_range(0), "LoRA rank r; 0 = full fine-tuning (rstar_jax/models/lora.py)."
  )
  lora_alpha: float = field(
    16.0, num_range(0, lo_open=True), "LoRA scale numerator: the branch is x @ a @ b * alpha / r."
  )
  lora_dropout: float = field(
    0.0, num_range(0, 1, hi_open=True), "LoRA dropout on the branch input (training only)."
  )
  lora_targets: tuple = field(
    ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    STR_TUPLE,
    "Linear layers that get adapters (q/k/v/o_proj, gate/up/down_proj).",
  )
  lora_dtype: str = field(
    "float32", one_of(DTYPES), "Adapter dtype (the base keeps param_dtype, e.g. bf16 base)."
  )
  num_experts: int = field(
    0, int_range(0), "Tiny model: experts per MoE layer (0 = dense Qwen3; > 0 = Qwen3-MoE)."
  )
  num_experts_per_tok: int = field(2, int_range(1), "Tiny MoE: top-k experts per token.")
  moe_intermediate_size: int = field(128, int_range(1), "Tiny MoE: SwiGLU width of one expert.")
  norm_topk_prob: bool = field(
    True, IS_BOOL, "Tiny MoE: renormalise the top-k gate weights (Qwen3-30B-A3B: true)."
  )
  decoder_sparse_step: int = field(
    1, int_range(1), "Tiny MoE: layer i is sparse when (i + 1) % step == 0 (HF's rule)."
  )
  mlp_only_layers: tuple = field((), INT_TUPLE, "Tiny MoE: layers that keep a dense MLP.")
  router_aux_loss_coef: float = field(
    0.001,
    num_range(0),
    "Tiny MoE: load-balancing loss coefficient (an hf_dir model: its config.json).",
  )
  router_z_loss_coef: float = field(0.0, num_range(0), "Tiny MoE: router z-loss coefficient.")
  moe_implementation: str = field(
    "auto",
    one_of(("auto", "ragged", "block", "dense")),
    "Tiny MoE: grouped expert matmul: 'auto' (ragged_dot on GPU/TPU, block on CPU), 'ragged', 'block' or 'dense' (every expert on every token; the reference).",
  )

  def _cross(self):
    from rstar_jax.models.lora import (
      ALL_TARGETS,  # the config stays jax-free (--help, --describe_config)
    )

    bad = [t for t in self.lora_targets if t not in ALL_TARGETS]
    if bad or (self.lora_rank and not self.lora_targets):
      return [("model.lora_targets", f"expected names from {list(ALL_TARGETS)}, got {bad or []}")]
    if self.num_experts and self.num_experts_per_tok > self.num_experts:
      return [
        (
          "model.num_experts_per_tok",
          f"expected <= num_experts={self.num_experts}, got {self.num_experts_per_tok}",
        )
      ]
    bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]
    if bad:
      return [
        (
          "model.mlp_only_layers",
          f"expected layer indices < num_hidden_layers={self.num_hidden_layers}, got {bad}",
        )
      ]
    if self.num_attention_heads % self.num_key_value_heads:
      return [
        (
          "model.num_key_value_heads",
          f"expected a divisor of num_attention_heads="
          f"{self.num_attention_heads}, got "
          f"{self.num_key_value_heads}",
        )
      ]
    return []

  def lora_config(self, base: str = "", seed: int = 0):
    """The `lora.LoraConfig` (``base``: pointer to the frozen base), or None when
    ``lora_rank`` is 0."""
    if not self.lora_rank:
      return None
    from rstar_jax.models.lora import (
      LoraConfig,  # the config stays jax-free (--help, --describe_config)
    )

    return LoraConfig(
      rank=self.lora_rank,
      alpha=self.lora_alpha,
      dropout=self.lora_dropout,
      targets=self.lora_targets,
      dtype=self.lora_dtype,
      base=base or self.hf_dir,
      seed=seed,
    )

  def qwen3_config(self):
    """The model's own `Qwen3Config` (read from ``hf_dir`` when set)."""
    # the config stays jax-free (--help, --describe_config)
    from rstar_jax.models import qwen3, qwen3_config

    if self.hf_dir:
      return qwen3.Qwen3Config.from_hf(
        self.hf_dir,
        dtype=self.dtype,
        remat=self.remat,
        attention=self.attention,
        attention_block_size=self.attention_block_size,
      )
    if self.num_experts:
      return qwen3_config.Qwen3MoeConfig(**self._dense_fields(), **self._moe_fields())
    return qwen3.Qwen3Config(**self._dense_fields())

  def _moe_fields(self) -> dict:
    return dict(
      num_experts=self.num_experts,
      num_experts_per_tok=self.num_experts_per_tok,
      moe_intermediate_size=self.moe_intermediate_size,
      norm_topk_prob=self.norm_topk_prob,
      decoder_sparse_step=self.decoder_sparse_step,
      mlp_only_layers=tuple(self.mlp_only_layers),
      router_aux_loss_coef=self.router_aux_loss_coef,
      router_z_loss_coef=self.router_z_loss_coef,
      moe_implementation=self.moe_implementation,
    )

  def _dense_fields(self) -> dict:
    return dict(
      vocab_size=self.vocab_size,
      hidden_size=self.hidden_size,
      intermediate_size=self.intermediate_size,
      num_hidden_layers=self.num_hidden_layers,
      num_attention_heads=self.num_attention_heads,
      num_key_value_heads=self.num_key_value_heads,
      head_dim=self.head_dim,
      rope_theta=self.rope_theta,
      rms_norm_eps=self.rms_norm_eps,
      tie_word_embeddings=self.tie_word_embeddings,
      max_position_embeddings=self.max_position_embeddings,
      dtype=self.dtype,
      remat=self.remat,
      attention=self.attention,
      attention_block_size=self.attention_block_size,
    )


@_section
class MeshConfig(_Section):
  """Device mesh axis sizes; -1 on one axis means "all remaining devices"."""

  SECTION: ClassVar[str] = "mesh"
  data: int = field(1, int_range(-1), "Pure data-parallel axis.")
  fsdp: int = field(-1, int_range(-1), "FSDP axis (params and optimizer state sharded).")
  tensor: int = field(1, int_range(-1), "Tensor-parallel axis (heads / MLP columns).")
  expert: int = field(
    1,
    int_range(-1),
    "Expert-parallel axis (Qwen3-MoE experts split over it; the batch is split over it too).",
  )
  num_devices: int = field(
    0, int_range(0), "Use only the first n devices (0 = all), e.g. one CPU device for toy runs."
  )

  def _cross(self):
    sizes = [self.data, self.fsdp, self.tensor, self.expert]
    out = []
    if sum(1 for s in sizes if s == -1) > 1:
      out.append(("mesh", f"expected at most one axis = -1, got {sizes}"))
    if any(s == 0 for s in sizes):
      out.append(("mesh", f"expected axis sizes >= 1 or -1, got {sizes}"))
    return out

  @property
  def axes(self) -> dict[str, int]:
    return {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor, "expert": self.expert}


@_section
class RLConfig(_Section):
  """GRPO-RoC (rStar2-Agent) and plain GRPO (ASTER) knobs; algorithm pieces named by registry name."""

  SECTION: ClassVar[str] = "rl"
  group_size: int = field(16, int_range(1), "G rollouts kept per prompt (rStar2-Agent: 16).")
  oversample: int = field(
    2, int_range(1), "Rollouts sampled per prompt = oversample * G (rStar2-Agent: 2G; ASTER: 1)."
  )
  roc_mode: str = field(
    "paper",
    registered("downsample"),
    "Down-sampling to G: 'paper' (RoC, positives ∝ 1/(p+eps)), 'released' (lowest penalty, microsoft/rStar code), 'random' (plain GRPO), or a registered name.",
  )
  min_pos: int = field(2, int_range(0), "RoC: positives kept at least (when available).")
  min_neg: int = field(2, int_range(0), "RoC: negatives kept at least (when available).")
  roc_eps: float = field(
    1e-6, num_range(0, lo_open=True), "RoC 'paper': added to the penalty before inversion."
  )
  drop_zero_variance: bool = field(
    True, IS_BOOL, "Drop all-correct / all-wrong groups before down-sampling."
  )
  p_err_mode: str = field(
    "paper",
    one_of(("paper", "released")),
    "p_err from structured tool outcomes ('paper') or a substring 'error' ('released').",
  )
  p_format_mode: str = field(
    "paper", one_of(("paper", "released")), "p_format rule: the paper's or the released code's."
  )
  advantage: str = field(
    "grpo",
    registered("advantage"),
    "Advantage estimator (rstar_jax.rl.registry 'advantage'; rStar2-Agent Eq. 7 = 'grpo').",
  )
  adv_eps: float = field(
    1e-6, num_range(0, lo_open=True), "Added to the group std in the GRPO advantage."
  )
  unbiased_std: bool = field(True, IS_BOOL, "Bessel-corrected group std (torch.std, as verl).")
  neg_adv_scale: float = field(
    1.0, num_range(0, 1), "Negative advantages x this (1 = GRPO; < 1 = asymmetric REINFORCE)."
  )
  policy_loss: str = field(
    "grpo_roc",
    registered("policy_loss"),
    "Policy loss (rstar_jax.rl.registry 'policy_loss'; rStar2-Agent Eq. 6 = 'grpo_roc').",
  )
  eps_low: float = field(
    0.2, num_range(0, 1, hi_open=True), "Lower clip (rStar2-Agent Clip-Higher: 0.2)."
  )
  eps_high: float = field(0.28, num_range(0), "Upper clip (rStar2-Agent Clip-Higher: 0.28).")
  dual_clip_c: float = field(
    0.0,
    num_range(0),
    "Dual-clip bound for negative advantages; 0 = off (released code: 3.0; ASTER: 10).",
  )
  ppo_mini_batches: int = field(
    1,
    int_range(1),
    "Optimizer updates per RL step, each on a shuffled slice (1 = on-policy, as the released code).",
  )
  ppo_epochs: int = field(1, int_range(1), "Passes over the step's trajectories.")
  kl_coef: float = field(
    0.0,
    num_range(0),
    "Reference-policy KL weight; must be 0 (the paper uses none, none is implemented).",
  )
  entropy_coef: float = field(0.0, num_range(0), "Entropy bonus weight (paper: 0).")
  loss_agg: str = field(
    "token-mean",
    one_of(LOSS_AGG),
    "'token-mean' (paper) | 'seq-mean-token-mean' ('seq-mean') | 'seq-mean-token-sum'.",
  )
  recompute_old_logprobs: bool = field(
    True,
    IS_BOOL,
    "Learner recomputes old log-probs after RoC (released code); False = the sampler's.",
  )
  answer_mode: str = field(
    "answer_tag",
    one_of(("answer_tag", "anywhere", "released")),
    "Reward (`rewards.math_reward.score` mode): last boxed answer inside <answer> (paper), last boxed anywhere, or 'released' (prime_math-style rules or math-verify over the whole response, as the released rStar2-Agent reward; docs/fidelity.md).",
  )
  max_step_retries: int = field(
    3, int_range(0), "Retries of a failed rollout (engine error, lost tool worker)."
  )
  hard_subset_max_problems: int = field(
    0, int_range(0), "Problems sampled when building a hard subset (0 = all)."
  )
  collapse_window: int = field(
    5, int_range(1), "Steps of falling tool calls/trajectory before a collapse warning (ASTER)."
  )
  max_staleness: int = field(
    0,
    int_range(0),
    "Async RL: 0 = synchronous loop; k >= 1 = rollouts for the next steps overlap the update, a group is trained only if its oldest token is within k weight pushes of the version trained (AReaL max_head_offpolicyness).",
  )
  partial_rollout: str = field(
    "continue",
    one_of(("continue", "restart")),
    "Async RL, at a weight push: in-flight trajectories 'continue' with the new weights (tokens keep their versions) or 'restart'.",
  )
  tis_cap: float = field(
    0.0,
    num_range(0),
    "Token-level truncated importance sampling cap C between the sampler's and the learner's log-probs, w = min(rho, C) (0 = off, else >= 1; ASTER: 2.0). The batch then carries the sampler's log-probs and the loss is rl.off_policy_loss.",
  )
  off_policy_loss: str = field(
    "tis",
    registered("off_policy_loss"),
    "Loss used when tis_cap > 0 (rstar_jax.rl.registry 'off_policy_loss', `rl.off_policy`): 'tis' (w = min(rho, C); ASTER) or 'decoupled_ppo' (AReaL, w = rho * 1[rho <= C]).",
  )

  routing_replay: str = field(
    "off",
    one_of(ROUTING_REPLAY),
    "MoE rollout routing replay: 'off' (the learner routes every token itself) or 'rollout' (the engine records each token's top-k experts per layer, SGLang: servers need --enable-return-routed-experts, and the learner's forward, old log-probs included, uses that expert set with gate weights from its own router; tokens without a recorded route route themselves). Ignored for a dense model.",
  )
  routing_metrics: bool = field(
    False,
    IS_BOOL,
    "MoE: record the engine's routes even with routing_replay 'off' and log router agreement (routing/agree*, the learner's top-k set vs the engine's, per layer) and sampler-vs-learner importance ratios without replay (routing/no_replay/*; with replay on this costs one extra forward per step, beside routing/replay/*).",
  )
  routing_outlier_band: float = field(
    4.0,
    num_range(0),
    "MoE with recorded routes (routing_replay 'rollout' or routing_metrics): a loss token whose sampler-vs-learner importance ratio, with the engine's routes replayed or with the learner's own routing (whichever the step computed), lies outside [1 / band, band] gets a JSON line in <rl workdir>/routing_outliers.jsonl (its class, both top-k sets and router probabilities per layer, log-probs, neighbours; rstar_jax.learner.routing_outliers); only the rows holding such a token are recomputed. 0 = off.",
  )

  def _cross(self):
    out = []
    if 0 < self.routing_outlier_band <= 1:
      out.append(
        (
          "rl.routing_outlier_band",
          f"expected 0 (off) or > 1, got {self.routing_outlier_band}",
        )
      )
    if self.min_pos + self.min_neg > self.group_size:
      out.append(
        (
          "rl.min_pos",
          f"expected min_pos + min_neg <= group_size={self.group_size}, "
          f"got {self.min_pos} + {self.min_neg}",
        )
      )
    if self.kl_coef != 0:
      out.append(
        (
          "rl.kl_coef",
          f"expected 0 (no reference-policy KL term is implemented; the "
          f"paper uses none), got {self.kl_coef!r}",
        )
      )
    if 0 < self.dual_clip_c <= 1:
      out.append(("rl.dual_clip_c", f"expected 0 (off) or a value > 1, got {self.dual_clip_c!r}"))
    if 0 < self.tis_cap < 1:
      out.append(("rl.tis_cap", f"expected 0 (off) or a cap >= 1, got {self.tis_cap!r}"))
    return out


@_section
class RolloutConfig(_Section):
  """Rollout engine and agent-loop limits (rStar2-Agent RL stage 1 defaults)."""

  SECTION: ClassVar[str] = "rollout"
  engine: str = field(
    "jax", one_of(("jax", "sglang")), "'jax' (embedded JaxSampler) or 'sglang' (HTTP servers)."
  )
  dtype: str = field(
    "",
    one_of(("",) + DTYPES),
    "JaxSampler compute dtype ('' = model.dtype), e.g. 'bfloat16' rollouts beside an f32 learner (the engine/learner mismatch routing replay is for); SGLang servers choose their own.",
  )
  sglang_urls: tuple[str, ...] = field(
    ("http://127.0.0.1:30000",), STR_TUPLE, "Every SGLang worker (the weight push must reach each)."
  )
  server_timeout_s: float = field(
    600.0,
    num_range(0, lo_open=True),
    "engine 'sglang': seconds to wait for every server's /health at start (progress logged every few seconds; an unresolvable host fails at once), and the longest the run goes on with no server in rotation before it checkpoints and stops (exit status 75).",
  )
  health_interval_s: float = field(
    5.0,
    num_range(0, lo_open=True),
    "engine 'sglang': seconds between /health probes of every server (and between the probes of a server a request just failed on).",
  )
  health_timeout_s: float = field(
    20.0,
    num_range(0, lo_open=True),
    "engine 'sglang': a /health probe not answered within this many seconds fails (a hung server). SGLang's /health generates one token, so leave room for a loaded server.",
  )
  max_server_failures: int = field(
    3,
    int_range(1),
    "engine 'sglang': failed /health probes in a row that take a server out of rotation (its turns in flight are generated again on another server; it rejoins after it gets the current weights). A server leaves within about max_server_failures x (health_interval_s + health_timeout_s).",
  )
  router_url: str = field(
    "",
    IS_STR,
    "engine 'sglang': SGLang's router (sglang-router) in front of the workers; '' = route here. Generation goes through the router; weight pushes go to every healthy worker it lists (GET /workers). sglang_urls may then be empty.",
  )
  staging_dir: str = field(
    "/dev/shm/rstar_jax_weights", IS_STR, "Weight push target (tmpfs or shared FS)."
  )
  weight_transport: str = field(
    "disk",
    one_of(("disk", "tensor", "distributed")),
    "Weight push to SGLang: 'disk' (staged safetensors + update_weights_from_disk), 'tensor' (same node, update_weights_from_tensor) or 'distributed' (broadcast through a process group, update_weights_from_distributed).",
  )
  weight_delta: bool = field(
    False,
    IS_BOOL,
    "Push only the HF tensors whose bytes changed since the last push (verl delta sync).",
  )
  lora_push: str = field(
    "merged",
    one_of(("merged", "adapters")),
    "LoRA runs (model.lora_rank > 0): push the merged weights through weight_transport, or "
    "'adapters' (SGLang: base once, then PEFT adapters via /load_lora_adapter; servers need "
    "--enable-lora).",
  )
  colocated: bool = field(
    False,
    IS_BOOL,
    "SGLang shares the learner's accelerators: release its memory before a push and resume it after.",
  )
  temperature: float = field(1.0, num_range(0), "Sampling temperature (rStar2-Agent RL: 1.0).")
  top_p: float = field(1.0, num_range(0, 1, lo_open=True), "Nucleus sampling.")
  top_k: int = field(-1, int_range(-1), "Top-k sampling (-1 = off).")
  max_prompt_tokens: int = field(
    2048, int_range(1), "Longer prompts raise (they would eat the budget)."
  )
  response_budget: int = field(
    8192, int_range(1), "Generated + tool tokens per trajectory (rStar2-Agent stage 1: 8K)."
  )
  max_turns: int = field(10, int_range(1), "Assistant turns per trajectory (rStar2-Agent: 10).")
  max_parallel_calls: int = field(0, int_range(0), "Calls executed per turn (0 = all, paper).")
  max_tool_calls: int = field(
    0, int_range(0), "Tool calls per trajectory (0 = unlimited; ASTER: 50)."
  )
  max_batch: int = field(64, int_range(1), "JaxSampler: sequence slots.")
  decode_chunk: int = field(16, int_range(1), "JaxSampler: tokens per jitted decode call.")
  max_len: int = field(
    0, int_range(0), "JaxSampler: KV-cache length (0 = the model's longest position)."
  )
  system_prompt: str = field(
    "",
    IS_STR,
    "System prompt of every chat, RL, eval and cold-start SFT ('' = the chat format's, rStar2-Agent's).",
  )
  with_tools: bool = field(
    True, IS_BOOL, "Put the tool-schema block in the system prompt (rStar2-Agent's format)."
  )
  chat_format: str = field(
    "rstar2",
    one_of(("rstar2", "rstar2_released", "qwen3_thinking", "qwen3")),
    "Prompt / tool-turn layout (`tokenization.chat_format.FORMATS`): 'rstar2' (project), 'rstar2_released' (released tool name, descriptions and turn joining), 'qwen3_thinking' (ASTER: Qwen3 thinking template, `code_interpreter` tool), 'qwen3' (Qwen3 hybrid template, thinking on).",
  )

  def _cross(self):
    if self.engine == "sglang" and not self.sglang_urls and not self.router_url:
      return [
        (
          "rollout.sglang_urls",
          "expected at least one URL (or rollout.router_url) for engine='sglang', got ()",
        )
      ]
    return []


@_section
class ToolConfig(_Section):
  """The sandboxed Python code pool."""

  SECTION: ClassVar[str] = "tool"
  num_workers: int = field(8, int_range(1), "Calls executing at once.")
  timeout_s: float = field(
    4.0,
    num_range(0, lo_open=True),
    "Wall-clock limit per call (released code: MAX_EXECUTION_TIME = 4 s).",
  )
  memory_limit_mb: int = field(
    384, int_range(16), "Address space a call may add (256 + 128 MB, as code-judge)."
  )
  max_response_chars: int = field(
    1024, int_range(16), "Tool response body limit (middle truncation)."
  )
  stateful: bool = field(
    False, IS_BOOL, "Variables persist across the calls of one trajectory (ASTER)."
  )
  show_time: bool = field(
    True, IS_BOOL, "Tool responses carry the 'execution time' line (released code's rendering)."
  )
  backend: str = field(
    "local",
    one_of(("local", "http", "ray")),
    "Code pool: 'local' (in-process CodePool), 'http' (the code service) or 'ray'.",
  )
  urls: tuple[str, ...] = field(
    (),
    STR_TUPLE,
    "backend 'http': service URLs (tool nodes); each JAX process uses them all, starting at urls[i % len(urls)]: stateless calls go to the nodes that are up, a session stays on its node (session_lost when that node fails).",
  )
  ray_address: str = field(
    "auto", IS_STR, "backend 'ray': ray.init address when Ray is not initialised yet."
  )
  truncation: str = field(
    "project",
    one_of(("project", "released")),
    "'project' (body <= max_response_chars, middle cut) or 'released' (first and last max_response_chars // 2 characters around a marker, verl's middle truncation).",
  )
  inject_failure_rate: float = field(
    0.0,
    num_range(0, 1),
    "Share of calls that fail transiently without running (a noisy environment, rstar_jax.tools.noise; 0 = off).",
  )
  inject_seed: int = field(0, int_range(0), "Seeds which calls inject_failure_rate fails.")

  def _cross(self):
    if self.backend == "http" and not self.urls:
      return [
        ("tool.urls", "expected at least one code-pool service URL for backend='http', got ()")
      ]
    return []


@_section
class TrainConfig(_Section):
  """Batch sizes, micro-batching, checkpointing and logging."""

  SECTION: ClassVar[str] = "train"
  seed: int = field(0, int_range(0), "Seeds the init, the data order and the step keys.")
  batch_prompts: int = field(512, int_range(1), "Prompts per RL step (rStar2-Agent: 512).")
  micro_batches: int = field(1, int_range(1), "Gradient accumulation; the token-mean stays exact.")
  checkpoint_every: int = field(
    10, int_range(0), "RL/SFT steps between checkpoints (0 = only at the end)."
  )
  keep_checkpoints: int = field(3, int_range(1), "Orbax checkpoints kept.")
  async_checkpoints: bool = field(
    True,
    IS_BOOL,
    "Write checkpoints in a background thread (orbax async): a step waits for the copy off "
    "the device, not for the disk; the results are the same as with False (tested).",
  )
  log_every: int = field(1, int_range(1), "Steps between metric records.")
  eval_every: int = field(
    0, int_range(0), "RL steps between held-out evaluations (0 = none in the loop)."
  )
  progress_every_s: float = field(
    10.0, num_range(0), "Seconds between progress lines (rollouts, SFT, eval)."
  )
  length_bucket: int = field(
    64, int_range(2), "Smallest padded length; batches pad to a power of two >= this."
  )
  pack_rows: bool = field(
    True,
    IS_BOOL,
    "RL and SFT: pack several trajectories per row (segment ids, per-segment positions; rstar_jax/learner/packing.py). RL packs only with rl.loss_agg = 'token-mean'.",
  )
  device_memory_gib: float = field(
    0.0,
    num_range(),
    "Per-device memory (GiB) the learner's step on its largest batch must fit, checked before anything is allocated (rstar_jax/planning/fit.py). 0 = the device's free memory (an accelerator reports it; on a CPU the check is skipped); < 0 = no check.",
  )


@_section
class EvalConfig(_Section):
  """avg@k pass@1 evaluation (rStar2-Agent: k=16, temperature 0.6, 30 turns, 30K tokens)."""

  SECTION: ClassVar[str] = "eval"
  path: str = field("", IS_STR, "JSONL problem file ('' = data.synthetic's held-out split).")
  k: int = field(16, int_range(1), "Samples per problem (avg@k).")
  temperature: float = field(0.6, num_range(0), "Sampling temperature (rStar2-Agent eval: 0.6).")
  top_p: float = field(
    0.95, num_range(0, 1, lo_open=True), "Nucleus sampling (rStar2-Agent eval: 0.95)."
  )
  max_turns: int = field(
    30, int_range(1), "Assistant turns per trajectory (rStar2-Agent eval: 30)."
  )
  response_budget: int = field(
    30720, int_range(1), "Generated + tool tokens (rStar2-Agent eval: 30K)."
  )
  seed: int = field(0, int_range(0), "Base seed of the attempts.")
  max_problems: int = field(0, int_range(0), "Evaluate the first n problems (0 = all).")
  protocol: str = field(
    "",
    one_of(("", "released", "paper_avg_at_k")),
    "Named protocol filling k / sampling / turns / budget where they are left at their defaults ('' = the fields above; `config.eval_protocols`; each replaced field is logged): 'released' (n=16 greedy, 5 turns, 30,720 tokens) or 'paper_avg_at_k'.",
  )
  protocol_strict: bool = field(
    False,
    IS_BOOL,
    "With eval.protocol: a k / sampling / turns / budget field set to a non-default value is an error instead of a kept override.",
  )
  csv_path: str = field(
    "", IS_STR, "Per-problem CSV (num correct, avg@k, pass@k); '' = next to the JSON report."
  )


@_section
class SyntheticDataConfig(_Section):
  """Seeded tool-needing synthetic tasks (`rstar_jax.data.synthetic_tasks`), disjoint train / held-out."""

  SECTION: ClassVar[str] = "data.synthetic"
  seed: int = field(0, int_range(0), "Generator seed.")
  n_train: int = field(24, int_range(1), "Training problems.")
  n_eval: int = field(8, int_range(0), "Held-out problems.")
  families: tuple[str, ...] = field(
    (), STR_TUPLE, "Task families (empty = synthetic_tasks.DEFAULT_FAMILIES)."
  )
  difficulty: Any = field(
    "",
    None,
    "A preset name ('easy', ...), a `synthetic_tasks.Difficulty` (a dict in a recipe), or '' = Difficulty().",
  )


@_section
class DataConfig(_Section):
  """Problem and trajectory files (or synthetic tasks when the paths are empty)."""

  SECTION: ClassVar[str] = "data"
  train_path: str = field(
    "", IS_STR, "RL problems: a JSONL or parquet file, or a local HF `datasets` directory."
  )
  sft_path: str = field(
    "", IS_STR, "SFT chats: a JSONL or parquet file, or a local HF `datasets` directory."
  )
  format: str = field(
    "auto",
    one_of(DATA_FORMATS),
    "Format of train_path / sft_path: 'auto' (by suffix; a directory = hf_dataset), 'jsonl', 'parquet' or 'hf_dataset' (`datasets.save_to_disk` output; nothing is downloaded).",
  )
  question_field: str = field(
    "", IS_STR, "Column holding the question ('' = 'problem', alias 'question')."
  )
  answer_field: str = field("", IS_STR, "Column holding the gold answer ('' = 'answer').")
  messages_field: str = field("", IS_STR, "SFT column holding the chat ('' = 'messages').")
  split: str = field(
    "",
    IS_STR,
    "hf_dataset: the split of a DatasetDict directory ('' = its only split, or 'train').",
  )
  synthetic: SyntheticDataConfig | None = field(
    None, None, "Synthetic tasks used when a path is empty (None = off)."
  )
  integer_answers_only: bool = field(
    False, IS_BOOL, "RL set: keep only problems with an integer gold answer (rStar2-Agent RL data)."
  )
  drop_overlong_prompts: bool = field(
    True,
    IS_BOOL,
    "RL set: drop (and count) problems whose prompt exceeds rollout.max_prompt_tokens instead of failing mid-run (released verl: filter_overlong_prompts).",
  )


MODULE_NAMES = Check(
  "a list of module names (or one comma-separated string)",
  lambda v: isinstance(v, tuple) and all(isinstance(x, str) and x for x in v),
  lambda v: (
    tuple(x.strip() for x in v.split(",") if x.strip())
    if isinstance(v, str)
    else (tuple(v) if isinstance(v, list) else v)
  ),
)


@_section
class RewardConfig(_Section):
  """Outcome reward and verifier by registry name (`rstar_jax.rewards.registry`)."""

  SECTION: ClassVar[str] = "reward"
  name: str = field(
    "math",
    IS_STR,
    "Registered reward: 'math' (answer per rl.answer_mode, judged by reward.verifier), 'released' (the released rStar2-Agent reward), or one a module of reward.imports registers.",
  )
  verifier: str = field(
    "math_verify",
    IS_STR,
    "Registered verifier fn(pred, gold) -> bool, run out of process with reward.timeout_s: 'math_verify', 'math_verify_text' or a user's.",
  )
  timeout_s: float = field(
    5.0, num_range(0, lo_open=True), "Bound on each verifier call (a timeout scores 0)."
  )
  imports: tuple[str, ...] = field(
    (),
    MODULE_NAMES,
    "Modules imported before the reward registry is read (a user's module registering rewards / verifiers); the top-level `imports` field imports through the same path.",
  )

  def _cross(self):
    try:
      import_user_modules(self.imports, field="reward.imports")
    except ImportError as e:
      return [("reward.imports", str(e).split(": ", 1)[1])]
    out = []
    for kind, value in (("reward", self.name), ("verifier", self.verifier)):
      known = reward_registry.names(kind)
      if value not in known:
        fld = "name" if kind == "reward" else "verifier"
        out.append(
          (f"reward.{fld}", f"expected a registered {kind}, one of {known}, got {value!r}")
        )
    if not out and self.name == "released" and self.verifier != "math_verify":
      out.append(
        (
          "reward.verifier",
          "the 'released' reward judges with math-verify itself; expected 'math_verify' "
          f"(a custom verifier goes with reward.name='math'), got {self.verifier!r}",
        )
      )
    return out


@_section
class LogConfig(_Section):
  """Experiment logging besides metrics.jsonl + TensorBoard (docs/metrics.md)."""

  SECTION: ClassVar[str] = "log"
  tensorboard: bool = field(
    True, IS_BOOL, "TensorBoard scalars (and sample text) under <workdir>/tb."
  )
  wandb: bool = field(
    False, IS_BOOL, "Also log to Weights & Biases (pip install rstar_jax[wandb])."
  )
  wandb_project: str = field("rstar_jax", IS_STR, "W&B project.")
  wandb_mode: str = field(
    "offline",
    one_of(("offline", "online", "disabled")),
    "W&B mode: 'offline' writes under <workdir>/wandb with no network (sync later with `wandb sync`); 'online' streams to the W&B server; 'disabled' = no W&B run.",
  )
  wandb_run_name: str = field("", IS_STR, "W&B run name ('' = the workdir's name).")
  samples_every: int = field(
    10,
    int_range(0),
    "RL steps between sample-rollout records (prompt, response, tool turns, reward) to every sink (<workdir>/metrics_samples.jsonl, TensorBoard text, W&B table); 0 = none.",
  )
  samples_per_step: int = field(4, int_range(1), "Rollouts logged per sample record.")
  sample_max_chars: int = field(
    4000, int_range(100), "Prompt / response / tool text longer than this is cut in the middle."
  )
  trajectory_ledger: bool = field(
    False,
    IS_BOOL,
    "RL: write <workdir>/trained.jsonl, one line per step naming the prompt groups it took and the trajectories it trained (problem, group seed, sample), kept exact across resumes and learner restarts, to audit that nothing was lost or trained twice (pipelines/trajectory_ledger.py).",
  )

  def _cross(self):
    # at config time, not when the RL phase opens its writer hours later
    if self.wandb and self.wandb_mode != "disabled" and not _importable("wandb"):
      return [
        (
          "log.wandb",
          "expected the wandb package to be installed (pip install 'rstar_jax[wandb]'), "
          "got True with wandb missing",
        )
      ]
    return []


def _importable(module: str) -> bool:
  import importlib.util

  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError, AttributeError):  # sys.modules[module] is None or broken
    return False


@_section
class StageConfig(_Section):
  """One RL stage (rStar2-Agent: 8K/10 turns, 12K/10, then 12K/15 on the hard subset; ASTER: 16K then 30K)."""

  SECTION: ClassVar[str] = "stage"
  name: str = field("stage", IS_STR, "Label in logs and checkpoints.")
  steps: int = field(1, int_range(1), "RL steps in this stage.")
  response_budget: int = field(8192, int_range(1), "Generated + tool tokens per trajectory.")
  max_turns: int = field(10, int_range(1), "Assistant turns per trajectory.")
  data: str = field(
    "full",
    one_of(STAGE_DATA),
    "'full' problem set, the 'hard' subset re-sampled at the stage start, or 'recent' (problems not all-correct in the last recent_steps steps' rollouts; ASTER stage 2).",
  )
  reset_optimizer: bool = field(
    False, IS_BOOL, "Fresh optimizer state (and warm-up) at the stage start (rStar2-Agent stage 3)."
  )
  drop_solved_k_of_k: int = field(
    0,
    int_range(0),
    "k for the hard subset: problems solved k of k are dropped (rStar2-Agent stage 3: 8).",
  )
  recent_steps: int = field(
    0, int_range(0), "Window of RL steps a data='recent' stage reads (>= 1 there)."
  )

  def _cross(self):
    if self.data == "hard" and self.drop_solved_k_of_k < 1:
      return [
        (
          "stage.drop_solved_k_of_k",
          f"expected k >= 1 for a stage with data='hard', got {self.drop_solved_k_of_k}",
        )
      ]
    if self.data == "recent" and self.recent_steps < 1:
      return [
        (
          "stage.recent_steps",
          f"expected k >= 1 for a stage with data='recent', got {self.recent_steps}",
        )
      ]
    return []


@_section
class SftConfig(_Section):
  """Supervised fine-tuning on chat trajectories, loss on assistant tokens only."""

  SECTION: ClassVar[str] = "sft"
  epochs: float = field(
    1.0, num_range(0, lo_open=True), "Passes over the data (fractions allowed)."
  )
  warmup_ratio: float = field(
    0.0, num_range(0, 1), "Warm-up steps as a fraction of all steps (0 = optim.warmup_steps)."
  )
  batch_size: int = field(8, int_range(1), "Sequences per step.")
  max_seq_len: int = field(2048, int_range(2), "Longer items are dropped, never truncated.")
  shuffle: bool = field(True, IS_BOOL, "Seeded shuffle per epoch.")
  log_every_s: float = field(10.0, num_range(0), "Seconds between progress lines.")
  loss: str = field("nll", registered("sft_loss"), "SFT loss (rstar_jax.rl.registry 'sft_loss').")


@_section
class ColdStartConfig(_Section):
  """Interaction-dense cold start: the scripted solver (demo) and ASTER's selection of SFT chats."""

  SECTION: ClassVar[str] = "coldstart"
  explore_prob: float = field(
    0.8, num_range(0, 1), "Scripted solver: probability of an exploratory first call."
  )
  bug_prob: float = field(
    0.3, num_range(0, 1), "Scripted solver: probability of a broken call that is then corrected."
  )
  min_tool_calls: int = field(
    2, int_range(0), "Calls a kept trajectory makes at least (ASTER: > 9)."
  )
  max_trajectories: int = field(
    0, int_range(0), "Keep at most this many, densest first (0 = all; ASTER: 4000)."
  )
  max_calls: int = field(
    0, int_range(0), "Scripted solver: calls per trajectory at most (0 = no cap)."
  )
  explore_fail_prob: float = field(
    0.0,
    num_range(0, 1),
    "Scripted solver: probability that the exploratory call fails and is left unfixed (an error that does not change the answer).",
  )
  style: str = field(
    "mixed",
    one_of(("mixed", "dense", "sparse", "graded")),
    "Scripted solver: 'mixed' (each step by its probability), 'dense' (exploration + solve, >= 2 calls), 'sparse' (the answer in the reasoning, one late verification call) or 'graded' (1 to 4 calls per chat, uniformly; set min_tool_calls <= 1 to keep the 1-call chats).",
  )
  require_all_calls_ok: bool = field(
    True, IS_BOOL, "Keep only chats whose every tool call succeeded (ASTER)."
  )
  seed: int = field(0, int_range(0), "Scripted solver seed.")


@_section
class DemoConfig(_Section):
  """The CPU demo's extras (`rstar_jax.pipelines.demo`)."""

  SECTION: ClassVar[str] = "demo"
  split_digits: bool = field(
    True, IS_BOOL, "Tokenizer: digits outside number tokens are one token each."
  )
  domain_tokens: bool = field(
    True, IS_BOOL, "Tokenizer: user prefix and tool-call JSON wrapper as single tokens."
  )
  number_tokens: int = field(0, int_range(0), "Tokenizer: '0'..str(n-1) are single tokens.")
  curve_eval_problems: int = field(
    0, int_range(0), "Held-out problems evaluated every train.eval_every RL steps."
  )
  reuse_sft_from: str = field(
    "", IS_STR, "Another demo workdir whose data/tokenizer/SFT phases to copy."
  )
  rl_max_steps: int = field(
    0, int_range(0), "Stop RL after this many steps in this call (0 = all; rerun to resume)."
  )
  plot: bool = field(True, IS_BOOL, "Write demo_plot.png.")


@_section
class PlanConfig(_Section):
  """Ahead-of-time planning (`launchers.plan`): architecture preset and accelerator assumptions."""

  SECTION: ClassVar[str] = "plan"
  model_preset: str = field(
    "", IS_STR, "Architecture when hf_dir is not readable here (e.g. 'qwen3-14b')."
  )
  hbm_gib: float = field(192.0, num_range(0, lo_open=True), "HBM per device in GiB (MI300X: 192).")
  mem_fraction: float = field(0.93, num_range(0, 1, lo_open=True), "Usable HBM fraction.")
  mfu: float = field(0.35, num_range(0, 1, lo_open=True), "Assumed MFU for the implied step time.")
  packed_fill: float = field(
    0.0,
    num_range(0, 1),
    "Mean trajectory length / T assumed for the packed-rows FLOPs of the plan (an input, not measured; 0 = no packed estimate).",
  )


# Section name -> dataclass, in the order a run config lists them.
SECTIONS: dict[str, type] = {
  "model": ModelConfig,
  "mesh": MeshConfig,
  "optim": OptimConfig,
  "rl": RLConfig,
  "rollout": RolloutConfig,
  "tool": ToolConfig,
  "train": TrainConfig,
  "eval": EvalConfig,
  "data": DataConfig,
  "sft": SftConfig,
  "sft_optim": OptimConfig,
  "coldstart": ColdStartConfig,
  "demo": DemoConfig,
  "plan": PlanConfig,
  "reward": RewardConfig,
  "log": LogConfig,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
  """A whole run: every section, the RL stages and the mode ("rl" | "sft" | "eval")."""

  mode: str = "rl"
  # Modules imported before the config is checked (`convert.import_modules`), so the losses,
  # advantages or rewards they register can be named by the fields below.
  imports: tuple[str, ...] = ()
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
  rl: RLConfig = dataclasses.field(default_factory=RLConfig)
  rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
  tool: ToolConfig = dataclasses.field(default_factory=ToolConfig)
  train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
  eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  stages: tuple[StageConfig, ...] = ()
  sft: SftConfig = dataclasses.field(default_factory=SftConfig)
  sft_optim: OptimConfig | None = None  # the demo's SFT optimizer (None = optim)
  coldstart: ColdStartConfig | None = None  # present = ASTER selection of config-read SFT chats
  demo: DemoConfig = dataclasses.field(default_factory=DemoConfig)
  plan: PlanConfig = dataclasses.field(default_factory=PlanConfig)
  reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
  log: LogConfig = dataclasses.field(default_factory=LogConfig)

  def __post_init__(self):
    object.__setattr__(self, "stages", tuple(self.stages))
    problems = self._cross()
    if problems:
      raise ConfigError(problems)

  def _cross(self) -> list[tuple[str, str]]:
    out = []
    if self.mode not in MODES:
      return [("mode", f"expected one of {list(MODES)}, got {self.mode!r}")]
    if self.mode == "rl":
      if self.optim.schedule == "cosine" and self.optim.total_steps <= self.optim.warmup_steps:
        out.append(
          (
            "optim.total_steps",
            f"expected > warmup_steps ({self.optim.warmup_steps}) "
            f"for a cosine schedule, got {self.optim.total_steps}",
          )
        )
      if self.rl.group_size < 2:
        out.append(
          (
            "rl.group_size",
            f"expected >= 2 for GRPO (advantages need a group), got {self.rl.group_size}",
          )
        )
    return out

  def require_inputs(self) -> None:
    """Raises `ConfigError` when the mode's inputs are not named: RL needs stages and a problem
    source, SFT a chat source (files or ``data.synthetic``). Planning skips this."""
    out = []
    synthetic = self.data.synthetic is not None
    if self.mode == "rl":
      if not self.stages:
        out.append(("stages", "expected a non-empty list of stages, got []"))
      if not self.data.train_path and not synthetic:
        out.append(("data.train_path", "expected a JSONL problem file path, got ''"))
    if self.mode == "sft" and not self.data.sft_path and not synthetic:
      out.append(("data.sft_path", "expected a chat-trajectory JSONL path, got ''"))
    if out:
      raise ConfigError(out)

  # ------------------------------------------------------------------ derived settings
  def step_config(self, optim_config=None, num_micro_batches: int | None = None):
    """`rstar_jax.learner.steps.StepConfig`: losses by registry name (the off-policy one when
    ``rl.tis_cap`` > 0), clip range, micro-batches."""
    from rstar_jax.learner import steps  # the config stays jax-free (--help, --describe_config)

    rl = self.rl
    return steps.StepConfig(
      num_micro_batches=num_micro_batches or self.train.micro_batches,
      optim=optim_config,
      policy_loss=rl.policy_loss,
      sft_loss=self.sft.loss,
      eps_low=rl.eps_low,
      eps_high=rl.eps_high,
      dual_clip_c=rl.dual_clip_c or None,
      entropy_coef=rl.entropy_coef,
      agg=LOSS_AGG_CANONICAL[rl.loss_agg],
      tis_cap=rl.tis_cap or None,
      off_policy_loss=rl.off_policy_loss,
      routing_replay=rl.routing_replay == "rollout",
    )

  def tokenizer_dir(self) -> str:
    return self.model.tokenizer_dir or self.model.hf_dir


def describe(cls: type) -> list[tuple[str, Any, str]]:
  """(name, default, doc) of every field of a section dataclass (README tables, --help)."""
  out = []
  for f in dataclasses.fields(cls):
    default = (
      f.default
      if f.default is not dataclasses.MISSING
      else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
    )
    out.append((f.name, default, f.metadata.get("doc", "")))
  return out


def defaults_dict(cls: type) -> dict[str, Any]:
  """The defaults of a section as a plain dict (tuples as lists), for ``ConfigDict(...)``."""
  d = dataclasses.asdict(cls())
  return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


__all__ = (
  ["Check", "ConfigError", "RunConfig", "SECTIONS", "describe", "defaults_dict"]
  + [c.__name__ for c in set(SECTIONS.values())]
  + ["StageConfig", "SyntheticDataConfig"]
)

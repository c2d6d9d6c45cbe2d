"""Qwen3 / Qwen2 architecture config and the layout of the parameter pytree.

The param pytree (plain nested dicts of arrays; layers stacked on a leading ``L`` axis so the
decoder is one ``lax.scan``)::

    {"embed_tokens": {"embedding": [V, D]},
     "layers": {"input_layernorm": {"scale": [L, D]},
                "self_attn": {"q_proj": {"kernel": [L, D, Hq*Dh], "bias"?: [L, Hq*Dh]},
                              "k_proj": {"kernel": [L, D, Hkv*Dh], "bias"?: [L, Hkv*Dh]},
                              "v_proj": {"kernel": [L, D, Hkv*Dh], "bias"?: [L, Hkv*Dh]},
                              "o_proj": {"kernel": [L, Hq*Dh, D], "bias"?: [L, D]},
                              "q_norm"?: {"scale": [L, Dh]}, "k_norm"?: {"scale": [L, Dh]}},
                "post_attention_layernorm": {"scale": [L, D]},
                "mlp": {"gate_proj": {"kernel": [L, D, F]}, "up_proj": {"kernel": [L, D, F]},
                        "down_proj": {"kernel": [L, F, D]}}},
     "norm": {"scale": [D]},
     "lm_head"?: {"kernel": [D, V]}}          # absent when tie_word_embeddings

Kernels are ``[in, out]`` (HF ``nn.Linear.weight`` transposed).

Qwen3-MoE (`Qwen3MoeConfig`): ``layers`` holds no ``mlp``; the MLPs are stacked per kind,
``"dense_mlp"`` (as ``mlp`` above, [Ld, ...], rows = ``config.dense_layers``) and::

    "moe": {"gate": {"kernel": [Ls, D, E]},                   # router
            "experts": {"gate_proj": {"kernel": [Ls, E, D, F]}, "up_proj": {...[Ls, E, D, F]},
                        "down_proj": {"kernel": [Ls, E, F, D]}}}   # rows = config.sparse_layers
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, ClassVar

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2")
_DTYPES = ("float32", "bfloat16")
_ATTENTIONS = ("xla", "blockwise", "fused")  # == rstar_jax.models.attention.IMPLEMENTATIONS


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen3Config:
  """Decoder hyper-parameters. Frozen and hashable: pass as a static jit argument."""

  model_types: ClassVar[tuple[str, ...]] = SUPPORTED_MODEL_TYPES
  is_moe: ClassVar[bool] = False

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int | None = None
  """Per-head width; independent of hidden_size / heads in Qwen3 (None = that ratio)."""
  rope_theta: float = 1_000_000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  max_position_embeddings: int = 40960
  model_type: str = "qwen3"
  attention_bias: bool = False
  """qwen3: bias on q/k/v/o (HF ``attention_bias``); qwen2: always bias on q/k/v only."""
  use_qk_norm: bool | None = None
  """Per-head RMSNorm on q and k before RoPE (None = True for qwen3, False for qwen2)."""
  dtype: str = "float32"
  """Compute dtype ("float32" | "bfloat16"); param dtype is whatever the params hold."""
  remat: bool = False
  """Rematerialise each decoder layer in the backward pass (jax.checkpoint)."""
  attention: str = "xla"
  """Learner-forward attention (``rstar_jax.models.attention``): "xla" (dense T x T scores),
    "blockwise" (online softmax over key blocks, O(T * block) memory) or "fused" (cuDNN flash
    attention where available). The KV-cache decode path always uses its own kernel."""
  attention_block_size: int = 512
  """Query / key block length of the "blockwise" attention."""

  def __post_init__(self):
    if self.model_type not in self.model_types:
      raise ValueError(f"unsupported model_type {self.model_type!r}; supported: {self.model_types}")
    if self.head_dim is None:
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
    if self.use_qk_norm is None:
      object.__setattr__(self, "use_qk_norm", self.model_type != "qwen2")
    if self.model_type == "qwen2":
      object.__setattr__(self, "attention_bias", True)
    for f in (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_hidden_layers",
      "num_attention_heads",
      "num_key_value_heads",
      "head_dim",
    ):
      if getattr(self, f) < 1:
        raise ValueError(f"Qwen3Config.{f} must be >= 1, got {getattr(self, f)}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(
        f"num_attention_heads ({self.num_attention_heads}) must be a multiple "
        f"of num_key_value_heads ({self.num_key_value_heads})"
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
    if self.attention not in _ATTENTIONS:
      raise ValueError(
        f"Qwen3Config.attention must be one of {_ATTENTIONS}, got {self.attention!r}"
      )
    if not isinstance(self.attention_block_size, int) or self.attention_block_size < 1:
      raise ValueError(
        f"Qwen3Config.attention_block_size must be an int >= 1, got {self.attention_block_size!r}"
      )
    if self.dtype not in _DTYPES:
      raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")

  @property
  def o_bias(self) -> bool:
    return self.attention_bias and self.model_type != "qwen2"

  def replace(self, **kw) -> Qwen3Config:
    return dataclasses.replace(self, **kw)

  @classmethod
  def from_hf_dict(cls, d: dict[str, Any], **overrides) -> Qwen3Config:
    """From a parsed HF ``config.json`` (transformers 4 or 5 style). On ``Qwen3Config`` a
    ``qwen3_moe`` config gives a `Qwen3MoeConfig`."""
    if cls is Qwen3Config and d.get("model_type") in Qwen3MoeConfig.model_types:
      return Qwen3MoeConfig.from_hf_dict(d, **overrides)
    kw = cls._hf_kwargs(d)
    kw.update(overrides)
    return cls(**kw)

  @classmethod
  def _hf_kwargs(cls, d: dict[str, Any]) -> dict[str, Any]:
    mt = d.get("model_type")
    if mt not in cls.model_types:
      raise ValueError(
        f"unsupported model_type {mt!r} in config.json; supported: {cls.model_types}"
      )
    if d.get("use_sliding_window"):
      raise ValueError("config.json: use_sliding_window=true is not supported")
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
      raise ValueError(f"config.json: rope_type {rope_type!r} is not supported (only 'default')")
    theta = rope.get("rope_theta", d.get("rope_theta"))
    if theta is None:
      theta = 10000.0
    missing = [
      k
      for k in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
      )
      if k not in d
    ]
    if missing:
      raise ValueError(f"config.json is missing fields {missing}")
    return dict(
      vocab_size=d["vocab_size"],
      hidden_size=d["hidden_size"],
      intermediate_size=d["intermediate_size"],
      num_hidden_layers=d["num_hidden_layers"],
      num_attention_heads=d["num_attention_heads"],
      num_key_value_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
      head_dim=d.get("head_dim"),
      rope_theta=float(theta),
      rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
      tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
      max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
      model_type=mt,
      attention_bias=bool(d.get("attention_bias", mt == "qwen2")),
    )

  @classmethod
  def from_hf(cls, hf_dir: str | os.PathLike, **overrides) -> Qwen3Config:
    """Reads ``hf_dir/config.json``; ``overrides`` set e.g. ``dtype`` or ``remat``."""
    path = os.path.join(os.fspath(hf_dir), "config.json")
    if not os.path.isfile(path):
      raise FileNotFoundError(f"missing HF config file: {path}")
    with open(path) as f:
      return cls.from_hf_dict(json.load(f), **overrides)

  def to_hf_dict(self, dtype_name: str = "float32") -> dict[str, Any]:
    """transformers-5 style ``config.json`` content."""
    arch = "Qwen3ForCausalLM" if self.model_type == "qwen3" else "Qwen2ForCausalLM"
    d = dict(
      architectures=[arch],
      model_type=self.model_type,
      vocab_size=self.vocab_size,
      hidden_size=self.hidden_size,
      intermediate_size=self.intermediate_size,
      num_hidden_layers=self.num_hidden_layers,
      num_attention_heads=self.num_attention_heads,
      num_key_value_heads=self.num_key_value_heads,
      head_dim=self.head_dim,
      hidden_act="silu",
      max_position_embeddings=self.max_position_embeddings,
      rms_norm_eps=self.rms_norm_eps,
      rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
      rope_theta=self.rope_theta,  # transformers 4 readers
      tie_word_embeddings=self.tie_word_embeddings,
      use_cache=True,
      use_sliding_window=False,
      attention_dropout=0.0,
      dtype=dtype_name,
    )
    if self.model_type != "qwen2":
      d["attention_bias"] = self.attention_bias
    return d


MOE_IMPLEMENTATIONS = (
  "auto",
  "ragged",
  "block",
  "dense",
)  # == rstar_jax.models.moe.IMPLEMENTATIONS


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen3MoeConfig(Qwen3Config):
  """Qwen3-MoE (HF ``qwen3_moe``): the Qwen3 decoder with sparse (mixture-of-experts) MLPs.

  Layer ``i`` is sparse when ``i not in mlp_only_layers`` and ``(i + 1) % decoder_sparse_step
  == 0`` (HF's rule); the other layers keep a dense SwiGLU MLP of ``intermediate_size``.
  """

  model_types: ClassVar[tuple[str, ...]] = ("qwen3_moe",)
  is_moe: ClassVar[bool] = True

  model_type: str = "qwen3_moe"
  num_experts: int
  num_experts_per_tok: int
  """Top-k: experts each token is routed to."""
  moe_intermediate_size: int
  """SwiGLU hidden width of one expert."""
  norm_topk_prob: bool = False
  """Renormalise the k gate weights to sum to 1 (HF default False; Qwen3-30B-A3B sets True)."""
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  router_aux_loss_coef: float = 0.001
  """Coefficient of the load-balancing loss (`moe.load_balancing_loss`) in the training loss."""
  router_z_loss_coef: float = 0.0
  """Coefficient of the router z-loss (`moe.router_z_loss`) in the training loss."""
  moe_implementation: str = "auto"
  """Grouped expert matmul (`rstar_jax.models.moe`): "auto" (``ragged`` on GPU/TPU, ``block``
    on CPU), "ragged" (``jax.lax.ragged_dot``), "block" (expert groups padded to blocks, one
    batched matmul) or "dense" (every expert on every token: the reference)."""
  moe_block_size: int = 256
  """Largest row block of the "block" implementation (smaller for few tokens)."""

  def __post_init__(self):
    object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
    super().__post_init__()
    for f in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"):
      if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
        raise ValueError(f"Qwen3MoeConfig.{f} must be an int >= 1, got {getattr(self, f)!r}")
    if self.num_experts_per_tok > self.num_experts:
      raise ValueError(
        f"Qwen3MoeConfig.num_experts_per_tok ({self.num_experts_per_tok}) must be <= "
        f"num_experts ({self.num_experts})"
      )
    bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]
    if bad:
      raise ValueError(
        f"Qwen3MoeConfig.mlp_only_layers {bad} out of range for {self.num_hidden_layers} layers"
      )
    if self.moe_implementation not in MOE_IMPLEMENTATIONS:
      raise ValueError(
        f"Qwen3MoeConfig.moe_implementation must be one of {MOE_IMPLEMENTATIONS}, "
        f"got {self.moe_implementation!r}"
      )
    if self.moe_block_size < 1:
      raise ValueError(f"Qwen3MoeConfig.moe_block_size must be >= 1, got {self.moe_block_size}")

  def is_sparse_layer(self, i: int) -> bool:
    return i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0

  @property
  def sparse_layers(self) -> tuple[int, ...]:
    """Indices of the MoE layers (rows of the ``moe`` param stacks, in order)."""
    return tuple(i for i in range(self.num_hidden_layers) if self.is_sparse_layer(i))

  @property
  def dense_layers(self) -> tuple[int, ...]:
    """Indices of the dense-MLP layers (rows of the ``dense_mlp`` param stacks, in order)."""
    return tuple(i for i in range(self.num_hidden_layers) if not self.is_sparse_layer(i))

  @classmethod
  def from_hf_dict(cls, d: dict[str, Any], **overrides) -> Qwen3MoeConfig:
    kw = cls._hf_kwargs(d)
    # transformers 5 writes ``num_local_experts``; Qwen's released configs ``num_experts``.
    experts = d.get("num_experts", d.get("num_local_experts"))
    missing = [
      k
      for k, v in (
        ("num_experts", experts),
        ("num_experts_per_tok", d.get("num_experts_per_tok")),
        ("moe_intermediate_size", d.get("moe_intermediate_size")),
      )
      if v is None
    ]
    if missing:
      raise ValueError(f"config.json (qwen3_moe) is missing fields {missing}")
    kw.update(
      num_experts=int(experts),
      num_experts_per_tok=int(d["num_experts_per_tok"]),
      moe_intermediate_size=int(d["moe_intermediate_size"]),
      norm_topk_prob=bool(d.get("norm_topk_prob", False)),
      decoder_sparse_step=int(d.get("decoder_sparse_step", 1)),
      mlp_only_layers=tuple(d.get("mlp_only_layers") or ()),
      router_aux_loss_coef=float(d.get("router_aux_loss_coef", 0.001)),
    )
    kw.update(overrides)
    return cls(**kw)

  def to_hf_dict(self, dtype_name: str = "float32") -> dict[str, Any]:
    d = super().to_hf_dict(dtype_name)
    d.update(
      architectures=["Qwen3MoeForCausalLM"],
      num_experts=self.num_experts,
      num_local_experts=self.num_experts,
      num_experts_per_tok=self.num_experts_per_tok,
      moe_intermediate_size=self.moe_intermediate_size,
      norm_topk_prob=self.norm_topk_prob,
      decoder_sparse_step=self.decoder_sparse_step,
      mlp_only_layers=list(self.mlp_only_layers),
      router_aux_loss_coef=self.router_aux_loss_coef,
      output_router_logits=False,
    )
    return d


def _layer_layout(c: Qwen3Config) -> dict[str, Any]:
  """(shape without L, logical axes without "layers") per layer param."""
  D, F, Dh = c.hidden_size, c.intermediate_size, c.head_dim
  q, kv = c.num_attention_heads * Dh, c.num_key_value_heads * Dh
  attn = {
    "q_proj": {"kernel": ((D, q), ("embed", "q_heads"))},
    "k_proj": {"kernel": ((D, kv), ("embed", "kv_heads"))},
    "v_proj": {"kernel": ((D, kv), ("embed", "kv_heads"))},
    "o_proj": {"kernel": ((q, D), ("q_heads", "embed"))},
  }
  if c.attention_bias:
    attn["q_proj"]["bias"] = ((q,), ("q_heads",))
    attn["k_proj"]["bias"] = ((kv,), ("kv_heads",))
    attn["v_proj"]["bias"] = ((kv,), ("kv_heads",))
  if c.o_bias:
    attn["o_proj"]["bias"] = ((D,), ("norm",))
  if c.use_qk_norm:
    attn["q_norm"] = {"scale": ((Dh,), ("head_dim",))}
    attn["k_norm"] = {"scale": ((Dh,), ("head_dim",))}
  return {
    "input_layernorm": {"scale": ((D,), ("norm",))},
    "self_attn": attn,
    "post_attention_layernorm": {"scale": ((D,), ("norm",))},
    "mlp": {
      "gate_proj": {"kernel": ((D, F), ("embed", "mlp"))},
      "up_proj": {"kernel": ((D, F), ("embed", "mlp"))},
      "down_proj": {"kernel": ((F, D), ("mlp", "embed"))},
    },
  }


def _is_entry(x) -> bool:
  return isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], tuple)


def _stack(n: int, tree) -> dict[str, Any]:
  return _map(lambda e: ((n,) + e[0], ("layers",) + e[1]), tree)


def _moe_layout(c: Qwen3MoeConfig) -> dict[str, Any]:
  """One sparse layer's MLP: router ``gate`` [D, E] and expert stacks [E, ...]."""
  D, E, F = c.hidden_size, c.num_experts, c.moe_intermediate_size
  return {
    "gate": {"kernel": ((D, E), ("embed", None))},
    "experts": {
      "gate_proj": {"kernel": ((E, D, F), ("expert", "embed", "expert_mlp"))},
      "up_proj": {"kernel": ((E, D, F), ("expert", "embed", "expert_mlp"))},
      "down_proj": {"kernel": ((E, F, D), ("expert", "expert_mlp", "embed"))},
    },
  }


def _layout(c: Qwen3Config) -> dict[str, Any]:
  L, V, D = c.num_hidden_layers, c.vocab_size, c.hidden_size
  per_layer = _layer_layout(c)
  tree = {"embed_tokens": {"embedding": ((V, D), ("vocab", "embed"))}}
  if c.is_moe:
    # Attention and norms stay stacked over all L layers; the MLPs are stacked per kind.
    dense_mlp = per_layer.pop("mlp")
    tree["layers"] = _stack(L, per_layer)
    if c.dense_layers:
      tree["dense_mlp"] = _stack(len(c.dense_layers), dense_mlp)
    if c.sparse_layers:
      tree["moe"] = _stack(len(c.sparse_layers), _moe_layout(c))
  else:
    tree["layers"] = _stack(L, per_layer)
  tree["norm"] = {"scale": ((D,), ("norm",))}
  if not c.tie_word_embeddings:
    tree["lm_head"] = {"kernel": ((D, V), ("embed", "vocab"))}
  return tree


def _map(fn, tree):
  if _is_entry(tree):
    return fn(tree)
  return {k: _map(fn, v) for k, v in tree.items()}


def param_shapes(config: Qwen3Config) -> dict[str, Any]:
  """Nested dict of shape tuples matching the params pytree."""
  return _map(lambda e: e[0], _layout(config))


def param_logical_axes(config: Qwen3Config) -> dict[str, Any]:
  """Nested dict of logical-axis-name tuples matching the params pytree (see sharding.rules)."""
  return _map(lambda e: e[1], _layout(config))

"""Tiny random transformers Qwen3/Qwen2 models for tests (no hub)."""

import numpy as np

# name -> (model_type, config kwargs). Sizes are tiny; each case stresses one feature.
CASES = {
  # GQA 4:1, untied, head_dim (16) != hidden / heads (4), non-default theta and eps.
  "qwen3_gqa4_untied": (
    "qwen3",
    dict(
      vocab_size=96,
      hidden_size=32,
      intermediate_size=48,
      num_hidden_layers=2,
      num_attention_heads=8,
      num_key_value_heads=2,
      head_dim=16,
      rms_norm_eps=1e-5,
      rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
      tie_word_embeddings=False,
    ),
  ),
  # MHA (1:1), tied embeddings, attention_bias on (q/k/v/o biases).
  "qwen3_mha_tied_bias": (
    "qwen3",
    dict(
      vocab_size=80,
      hidden_size=32,
      intermediate_size=64,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=4,
      head_dim=8,
      rms_norm_eps=1e-6,
      rope_parameters={"rope_type": "default", "rope_theta": 123.0},
      tie_word_embeddings=True,
      attention_bias=True,
    ),
  ),
  # Qwen2.5 style: q/k/v bias, no q/k norm, GQA 2:1, untied.
  "qwen2_gqa2": (
    "qwen2",
    dict(
      vocab_size=64,
      hidden_size=32,
      intermediate_size=48,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      rms_norm_eps=3e-6,
      rope_parameters={"rope_type": "default", "rope_theta": 20000.0},
      tie_word_embeddings=False,
    ),
  ),
}

# Qwen3-MoE cases (kept apart from CASES: the dense-model tests parametrize over CASES).
MOE_CASES = {
  # Sparse layers 0, 2, 3 and a dense layer 1 (mlp_only_layers), k=2 of 6 experts, raw top-k
  # probabilities (norm_topk_prob False), GQA 2:1, untied.
  "qwen3_moe_mixed": (
    "qwen3_moe",
    dict(
      vocab_size=96,
      hidden_size=32,
      intermediate_size=40,
      moe_intermediate_size=16,
      num_hidden_layers=4,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=8,
      num_experts=6,
      num_experts_per_tok=2,
      norm_topk_prob=False,
      decoder_sparse_step=1,
      mlp_only_layers=[1],
      rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
      tie_word_embeddings=False,
    ),
  ),
  # Every other layer sparse (decoder_sparse_step 2: layers 1, 3), k=3 of 8, renormalised
  # gate weights, tied embeddings.
  "qwen3_moe_step2_norm": (
    "qwen3_moe",
    dict(
      vocab_size=80,
      hidden_size=32,
      intermediate_size=48,
      moe_intermediate_size=24,
      num_hidden_layers=4,
      num_attention_heads=4,
      num_key_value_heads=4,
      head_dim=8,
      num_experts=8,
      num_experts_per_tok=3,
      norm_topk_prob=True,
      decoder_sparse_step=2,
      rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
      tie_word_embeddings=True,
    ),
  ),
}


def build_torch_model(model_type: str, kwargs: dict, seed: int = 0):
  """Random transformers model whose norm weights and biases are not the init constants."""
  import torch
  import transformers

  torch.manual_seed(seed)
  cfg_cls, model_cls = {
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
  }[model_type]
  model = model_cls(cfg_cls(**kwargs, max_position_embeddings=256)).eval()
  gen = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("mlp.gate.weight"):  # router: spread logits so top-k is well separated
        p.copy_(torch.randn(p.shape, generator=gen))
      elif "norm" in name:
        p.copy_(0.5 + torch.rand(p.shape, generator=gen))
      elif name.endswith("bias"):
        p.copy_(0.1 * torch.randn(p.shape, generator=gen))
  return model


def torch_logits(model, ids: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
  import torch

  with torch.no_grad():
    kw = {} if attention_mask is None else {"attention_mask": torch.as_tensor(attention_mask)}
    return model(torch.as_tensor(ids, dtype=torch.long), **kw).logits.float().numpy()

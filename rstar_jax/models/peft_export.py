"""A LoRA policy's adapters in HF PEFT's format, beside the HF I/O of the base
(`rstar_jax.models.qwen3_hf_io`): ``adapter_config.json`` + ``adapter_model.safetensors``,
loadable with ``peft.PeftModel.from_pretrained(hf_model, out_dir)`` on the exported base.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from rstar_jax.models.lora import LoraParams, is_lora


def peft_tensors(params: LoraParams) -> dict[str, np.ndarray]:
  """HF PEFT tensor names -> host arrays: ``lora_A.weight`` [r, in] = a.T, ``lora_B.weight``
  [out, r] = b.T per layer (PEFT computes ``lora_B(lora_A(x)) * alpha / r``)."""
  out = {}
  for g, adapters in params.lora["layers"].items():
    for name, ab in adapters.items():
      a, b = np.asarray(jax.device_get(ab["a"])), np.asarray(jax.device_get(ab["b"]))
      for i in range(a.shape[0]):
        prefix = f"base_model.model.model.layers.{i}.{g}.{name}"
        out[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a[i].T)
        out[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b[i].T)
  return out


def save_peft(out_dir: str | os.PathLike, params: LoraParams, base_model: str = "") -> None:
  """Writes ``adapter_config.json`` + ``adapter_model.safetensors`` (PEFT's LoRA format,
  loadable with ``peft.PeftModel.from_pretrained(hf_model, out_dir)``)."""
  if not is_lora(params):
    raise ValueError("save_peft: the params are not LoRA params (model.lora_rank is 0)")
  c = params.config
  os.makedirs(out_dir, exist_ok=True)
  tensors = peft_tensors(params)
  if c.dtype == "bfloat16":  # safetensors.numpy stores ml_dtypes bf16 as BF16
    tensors = {k: v.astype(jnp.bfloat16) for k, v in tensors.items()}
  save_file(tensors, os.path.join(out_dir, "adapter_model.safetensors"))
  cfg = {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "base_model_name_or_path": base_model or c.base,
    "r": c.rank,
    "lora_alpha": c.alpha,
    "lora_dropout": c.dropout,
    "target_modules": sorted(c.targets),
    "bias": "none",
    "fan_in_fan_out": False,
    "inference_mode": True,
    "use_rslora": False,
    "init_lora_weights": True,
    "modules_to_save": None,
  }
  with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
    json.dump(cfg, f, indent=1)

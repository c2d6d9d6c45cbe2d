"""`export_checkpoint` (an orbax checkpoint -> an HF directory) and what an HF export carries
besides the weights, so that transformers serves the policy the
way it was trained (issue 29, row 4):

  * the weights in the source's precision: a run that started from a bf16 checkpoint (or keeps
    bf16 params) exports bf16, not float32 at twice the size; ``--dtype`` overrides;
  * ``generation_config.json`` whose ``eos_token_id`` lists the ids training stopped on
    (`chat_format.stop_token_ids`: <|im_end|> plus the source checkpoint's EOS ids); the
    source's other generation settings are kept;
  * the tokenizer with the chat template of the run's format (`chat_format.chat_template` with
    the run's system prompt and tool block), so ``apply_chat_template(messages,
    add_generation_prompt=True)`` on the export gives the training prompt token for token,
    rStar2's ``<reason>`` prefill included.
"""

from __future__ import annotations

import json
import os
from typing import Any

from rstar_jax.config import RunConfig
from rstar_jax.distributed.primary import is_primary
from rstar_jax.errors import UserError
from rstar_jax.learner.checkpoint import Checkpointer, export_hf
from rstar_jax.models import lora, peft_export
from rstar_jax.models.qwen3_hf_io import SAVE_DTYPES
from rstar_jax.pipelines import data_sources, wiring
from rstar_jax.tokenization import chat_format

GENERATION_CONFIG = chat_format.GENERATION_CONFIG
_HALF = ("bfloat16", "float16")


def _hf_dtype(hf_dir: str) -> str:
  """The dtype ``hf_dir``/config.json declares ("dtype", transformers 4's "torch_dtype"); ""
  when there is none."""
  path = os.path.join(hf_dir, "config.json")
  if not hf_dir or not os.path.isfile(path):
    return ""
  with open(path) as f:
    d = json.load(f)
  v = d.get("dtype") or d.get("torch_dtype") or ""
  return v if isinstance(v, str) else ""


def source_dtype(run: RunConfig) -> str:
  """The precision the policy came in: ``model.param_dtype`` when that is a half type, else
  the dtype of the checkpoint the run started from (``model.hf_dir``) when that is, else
  float32. (The 14B recipe keeps float32 master params of a bf16 checkpoint: it exports bf16.)"""
  if run.model.param_dtype in _HALF:
    return run.model.param_dtype
  src = _hf_dtype(run.model.hf_dir)
  return src if src in _HALF else "float32"


def export_dtype(run: RunConfig, requested: str | None = None) -> str:
  """``requested`` (one of `SAVE_DTYPES`), else `source_dtype`; a bad name is a one-line error."""
  if requested:
    if requested not in SAVE_DTYPES:
      raise UserError(f"export_hf --dtype: expected one of {list(SAVE_DTYPES)}, got {requested!r}")
    return requested
  return source_dtype(run)


def trained_chat_template(run: RunConfig) -> str:
  """The Jinja chat template of the prompts the run trained on (format, system prompt, tools)."""
  r = run.rollout
  return chat_format.chat_template(r.chat_format, r.system_prompt or None, r.with_tools)


def generation_config(run: RunConfig, tokenizer) -> dict[str, Any]:
  """The export's generation_config.json: the source's (``model.hf_dir``) with ``eos_token_id``
  set to the stop ids of training and a ``pad_token_id`` (generate needs one for batches)."""
  base: dict[str, Any] = {}
  src = os.path.join(run.model.hf_dir, GENERATION_CONFIG) if run.model.hf_dir else ""
  if src and os.path.isfile(src):
    with open(src) as f:
      base = json.load(f)
    if not isinstance(base, dict):
      raise UserError(f"{src}: expected a JSON object, got {type(base).__name__}")
  stop = chat_format.stop_token_ids(tokenizer, run.model.hf_dir)
  out = {**base, "eos_token_id": list(stop)}
  if not isinstance(out.get("pad_token_id"), int):
    out["pad_token_id"] = chat_format.pad_id_of(tokenizer)
  return out


def write_tokenizer_and_generation_config(out_dir: str, run: RunConfig, tokenizer) -> None:
  """Saves ``tokenizer`` with `trained_chat_template` and writes `generation_config` into
  ``out_dir`` (call on the primary process only)."""
  tokenizer.chat_template = trained_chat_template(run)
  tokenizer.save_pretrained(out_dir)
  with open(os.path.join(out_dir, GENERATION_CONFIG), "w") as f:
    json.dump(generation_config(run, tokenizer), f, indent=2)
    f.write("\n")


def export_checkpoint(
  run: RunConfig,
  checkpoint_dir: str,
  out_dir: str,
  *,
  tokenizer_path: str = "",
  step: int | None = None,
  adapters_only: bool = False,
  dtype: str | None = None,
) -> int:
  """Writes the params of an orbax checkpoint (latest, or ``step``) as an HF directory, with
  the tokenizer from ``tokenizer_path`` (default: the config's) carrying the run's chat
  template, and generation_config.json with the run's stop ids (`hf_export`). Tensors are
  ``dtype`` (None = the source's: `hf_export.source_dtype`). Returns the exported step.

  A LoRA run (``model.lora_rank > 0``) exports the merged model, or with ``adapters_only``
  the adapters in PEFT's format (``adapter_config.json`` + ``adapter_model.safetensors``)."""
  dtype = export_dtype(run, dtype)
  learner = wiring.build_learner_for_restore(run)
  if adapters_only and not lora.is_lora(learner.state.params):
    raise ValueError("export_hf --adapters_only: the run has no adapters (model.lora_rank is 0)")
  with Checkpointer(checkpoint_dir) as ck:
    learner.state, meta = ck.restore(learner.state, step)
  if adapters_only:
    if is_primary():
      peft_export.save_peft(out_dir, learner.state.params)
    return int(meta["step"])
  export_hf(out_dir, learner.model_config, learner.state.params, dtype=dtype)
  tok_path = tokenizer_path or run.tokenizer_dir()
  if tok_path and is_primary():  # [multi-process] one writer
    write_tokenizer_and_generation_config(out_dir, run, data_sources.load_tokenizer(tok_path))
  return int(meta["step"])

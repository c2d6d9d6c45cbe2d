"""Training a LoRA policy (`rstar_jax.models.lora.LoraParams`): what the learner does with the
adapters, the model side (shapes, init, merge, the branch) staying in `rstar_jax.models.lora`.

  * the step differentiates only the adapters (`split_trainable`, read by ``steps._accumulate``);
  * the optimizer keeps moments for the adapters only (`optimizer`);
  * the step's ``apply_fn`` runs the base with the unmerged branches (`apply_fn_for`), base and
    adapters sharded by the logical-axis rules (`param_shardings`);
  * checkpoints hold only the adapters plus the base's name (`saved_params` /
    `restored_params`, `checkpoint_meta` / `check_checkpoint_meta`).

`rstar_jax.learner.steps.make_lora_jitted_steps` wires these into the jitted steps.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from rstar_jax.models import qwen3
from rstar_jax.models.lora import LoraConfig, LoraParams, adapter_shardings, inject, is_lora
from rstar_jax.models.qwen3_config import Qwen3Config


def param_shardings(model_config: Qwen3Config, cfg: LoraConfig, mesh, layout="train"):
  """`LoraParams` of NamedShardings: base as ``qwen3.param_shardings``, adapters by the same
  logical-axis rules (`lora.adapter_shardings`)."""
  return LoraParams(
    base=qwen3.param_shardings(model_config, mesh, layout),
    lora=adapter_shardings(model_config, cfg, mesh, layout),
    config=cfg,
  )


def apply_fn_for(model_config: Qwen3Config):
  """The learner's ``apply_fn`` for `LoraParams` (base + unmerged low-rank branches)."""

  def apply_fn(params, input_ids, attention_mask, segment_ids=None, positions=None):
    return qwen3.forward(
      inject(params, input_ids),
      model_config,
      input_ids,
      positions=positions,
      attention_mask=attention_mask,
      segment_ids=segment_ids,
    )

  return apply_fn


def split_trainable(params):
  """(trainable, rebuild, zeros_frozen): the adapters of a `LoraParams`, a function putting
  new adapters back, and a function giving the full-structure gradient from the adapters'
  (zeros for the frozen base); None for plain params (everything trains)."""
  if not is_lora(params):
    return None

  def rebuild(lora):
    return params.replace(lora=lora)

  def full_grads(g):
    return params.replace(base=jax.tree.map(jnp.zeros_like, params.base), lora=g)

  return params.lora, rebuild, full_grads


def optimizer(tx: optax.GradientTransformation, params) -> optax.GradientTransformation:
  """``tx`` over the adapters only; the base gets zero updates and no optimizer state.

  ``params``: a `LoraParams` (arrays or ShapeDtypeStructs) giving the structure; the labels
  are a fixed tree (optax's ``tree_map_params`` inits with a placeholder, not the params).
  """
  labels = params.replace(
    base=jax.tree.map(lambda _: "frozen", params.base),
    lora=jax.tree.map(lambda _: "adapter", params.lora),
  )
  return optax.multi_transform({"adapter": tx, "frozen": optax.set_to_zero()}, labels)


def saved_params(params):
  """What a checkpoint stores of ``params``: the adapters only for a `LoraParams`."""
  return {"lora": params.lora} if is_lora(params) else params


def restored_params(target, saved):
  """``target`` with the checkpoint's params put in (adapters into a `LoraParams`)."""
  return target.replace(lora=saved["lora"]) if is_lora(target) else saved


def checkpoint_meta(params) -> dict[str, Any]:
  """The adapters' settings and base pointer (JSON), empty for plain params."""
  if not is_lora(params):
    return {}
  c = params.config
  return {"lora": {"base": c.base, "rank": c.rank, "alpha": c.alpha, "targets": list(c.targets)}}


def check_checkpoint_meta(target, meta: dict[str, Any]) -> str | None:
  """A one-line problem when a checkpoint's LoRA record does not fit ``target``, else None."""
  want, got = checkpoint_meta(target).get("lora"), meta.get("lora")
  if want is None and got is None:
    return None
  if want is None or got is None:
    kind = "LoRA adapters" if got is not None else "full params"
    return f"the checkpoint holds {kind}, this run is {'LoRA' if want else 'full fine-tuning'}"
  for k in ("base", "rank", "alpha", "targets"):
    if want[k] != got[k]:
      return f"checkpoint LoRA {k} is {got[k]!r}, this run's is {want[k]!r}"
  return None

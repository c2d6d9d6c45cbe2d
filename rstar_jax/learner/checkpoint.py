"""Checkpoints: orbax CheckpointManager over the TrainState arrays plus a JSON metadata record.

Each checkpoint (one per saved ``state.step``) holds
  state: {"params", "opt_state", "step", "rng"}  (orbax StandardSave; sharded arrays stay sharded)
  meta:  JSON dict the loop needs to resume (data position, stage, weight version, ...), plus
         ``"step"``, written by `Checkpointer.save` itself.
Restoring reads onto the live state's structure, dtypes and shardings (`restore(target)`), so a
run resumes on the mesh it runs on now, which may differ from the one it saved from.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp

from rstar_jax.distributed.export import save_hf_multihost
from rstar_jax.errors import UserError, disk_full_reason, write_failed_line
from rstar_jax.learner import lora_training
from rstar_jax.learner.train_state import TrainState
from rstar_jax.models import lora

log = logging.getLogger(__name__)


class CheckpointMismatchError(UserError, ValueError):
  """A checkpoint's arrays do not fit the state it is restored into."""


class CheckpointWriteError(UserError, OSError):
  """A checkpoint could not be written (disk full, quota, read-only): the message names the
  directory, the step lost and the last complete checkpoint a rerun resumes from."""


# orbax's advice in its shape-mismatch message (turn on padding / truncation through its own
# API) is about orbax, and wrong for a resume: a padded or cut array is another model.
_ORBAX_ADVICE = re.compile(r"\s*Truncating/padding is disabled\..*$|\s*To enable it, set .*$")


def mismatch_detail(err: BaseException) -> str:
  """orbax's restore error as one line, its API advice removed: "the checkpoint holds shape
  (512, 32) where this run's model has (1024, 64)" for a shape mismatch."""
  text = " ".join(str(err).split())
  m = re.search(
    r"Requested shape: (\([\d, ]*\)) is not compatible with the stored shape: (\([\d, ]*\))", text
  )
  if m:
    return f"the checkpoint holds an array of shape {m.group(2)} where this run's has {m.group(1)}"
  return _ORBAX_ADVICE.sub("", text)


def _arrays(state: TrainState) -> dict[str, Any]:
  return {
    "params": lora_training.saved_params(state.params),  # LoRA: the adapters only
    "opt_state": state.opt_state,
    "step": state.step,
    "rng": state.rng,
  }


class Checkpointer:
  """Keep-last-N checkpoints of a TrainState and its metadata.

  Args:
      directory: where checkpoints go (created if missing); one sub-folder per step.
      max_to_keep: how many most recent checkpoints survive; None keeps all.
      save_interval_steps: `save` without ``force`` writes only at steps that are multiples
          of this (and at the first save when the directory has no checkpoint yet).
      enable_async: write in a background thread after the device-to-host copy (the caller
          may donate/overwrite the state as soon as `save` returns).
  """

  def __init__(
    self,
    directory: str | os.PathLike,
    *,
    max_to_keep: int | None = 3,
    save_interval_steps: int = 1,
    enable_async: bool = True,
  ):
    if max_to_keep is not None and max_to_keep < 1:
      raise ValueError(f"Checkpointer max_to_keep: expected >= 1 or None, got {max_to_keep}")
    if save_interval_steps < 1:
      raise ValueError(
        f"Checkpointer save_interval_steps: expected >= 1, got {save_interval_steps}"
      )
    self.directory = os.path.abspath(os.fspath(directory))
    options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep,
      save_interval_steps=save_interval_steps,
      create=True,
      enable_async_checkpointing=enable_async,
      # A write cut off (disk full, a killed process) leaves `<step>.orbax-checkpoint-tmp*`;
      # orbax never restores those, and this removes them when the next run opens the folder.
      cleanup_tmp_directories=True,
    )
    self._pending: int | None = None  # the step of the save in flight (async)
    self._failed = False  # a write failure was raised once; close() then stays quiet
    self._mgr = ocp.CheckpointManager(self.directory, options=options)
    # An async save still running when the interpreter exits is cut off (orbax's event loop
    # is torn down under it: a half-written `<step>.orbax-checkpoint-tmp` folder and
    # "Event loop is closed" tracebacks). The finalizer waits for it and closes the manager,
    # at `close()`, when this object is collected, or at exit, whichever comes first.
    self._finalizer = weakref.finalize(self, _close_manager, self._mgr, self.directory)
    self._finalizer.atexit = False
    _at_thread_shutdown(self._finalizer)

  def save(
    self, state: TrainState, metadata: Mapping[str, Any] | None = None, *, force: bool = False
  ) -> bool:
    """Saves at ``int(state.step)``; returns whether a checkpoint was written.

    ``metadata`` must be JSON-serialisable (checked before anything is written).
    """
    step = int(jax.device_get(state.step))
    meta = dict(metadata or {})
    if "step" in meta and meta["step"] != step:
      raise ValueError(
        f"Checkpointer.save: metadata['step']={meta['step']} differs from state.step={step}"
      )
    meta["step"] = step
    meta.update(lora_training.checkpoint_meta(state.params))  # LoRA: settings + pointer to the base
    try:
      json.dumps(meta)
    except TypeError as e:
      raise TypeError(f"Checkpointer.save: metadata is not JSON-serialisable: {e}") from e
    # The previous async write's failure surfaces here: named as that step's.
    self.wait_until_finished()
    self._pending = step
    try:
      wrote = self._mgr.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(_arrays(state)), meta=ocp.args.JsonSave(meta)
        ),
        force=force,
      )
    except Exception as e:
      self._raise_if_disk_full(e)
      raise
    if not wrote:
      self._pending = None
    return wrote

  def _raise_if_disk_full(self, e: BaseException) -> None:
    reason = disk_full_reason(e)
    if reason is None:
      return
    step, self._pending, self._failed = self._pending, None, True
    raise CheckpointWriteError(write_failed_line(self.directory, step, reason)) from e

  def restore(
    self, target: TrainState, step: int | None = None
  ) -> tuple[TrainState, dict[str, Any]]:
    """Restores ``step`` (default: latest) onto ``target``'s structure and shardings.

    ``target`` is any TrainState of the same model and optimizer (e.g. a freshly built one);
    its ``tx`` is kept. Returns (state, metadata).
    """
    self._mgr.wait_until_finished()
    if step is None:
      step = self._mgr.latest_step()
      if step is None:
        raise FileNotFoundError(f"Checkpointer.restore: no checkpoint in {self.directory}")
    elif step not in self._mgr.all_steps():
      raise FileNotFoundError(
        f"Checkpointer.restore: no checkpoint for step {step} in "
        f"{self.directory} (have {sorted(self._mgr.all_steps())})"
      )
    # LoRA vs full params, or another base: named before orbax reports a tree mismatch.
    meta = self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    problem = lora_training.check_checkpoint_meta(target.params, meta or {})
    if problem:
      raise CheckpointMismatchError(f"checkpoint {self.directory} step {step}: {problem}")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _arrays(target))
    try:
      out = self._mgr.restore(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
        ),
      )
    except ValueError as e:
      # orbax's shape / tree-structure mismatch: the usual cause is resuming a workdir
      # with a config (model size, optimizer) other than the one that wrote it.
      detail = mismatch_detail(e)
      raise CheckpointMismatchError(
        f"checkpoint {self.directory} step {step} does not fit this run's model and "
        f"optimizer (written with another config? use that config or a new workdir): "
        f"{detail[:400]}{'...' if len(detail) > 400 else ''}"
      ) from e
    arrays = out["state"]
    state = target.replace(
      params=lora_training.restored_params(target.params, arrays["params"]),
      opt_state=arrays["opt_state"],
      step=arrays["step"],
      rng=arrays["rng"],
    )
    return state, dict(out["meta"])

  def latest_step(self) -> int | None:
    return self._mgr.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._mgr.all_steps())

  def wait_until_finished(self) -> None:
    """Waits for the async write in flight; a failed write is a `CheckpointWriteError` (disk
    full, ...) naming the step and the last good checkpoint."""
    try:
      self._mgr.wait_until_finished()
    except Exception as e:
      self._raise_if_disk_full(e)
      raise
    self._pending = None

  def close(self) -> None:
    """Waits for pending async saves, then releases the manager (idempotent). A write failure
    not reported yet is raised (`CheckpointWriteError`); one already raised is not repeated."""
    if not self._failed and self._finalizer.alive:
      self.wait_until_finished()
    self._finalizer()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _at_thread_shutdown(fn) -> None:
  """Runs ``fn`` at interpreter exit while threads and executors still work.

  Plain `atexit` hooks run after `concurrent.futures` has shut down, too late for orbax's
  commit thread ("cannot schedule new futures after interpreter shutdown").
  `threading._register_atexit` (what `concurrent.futures` itself uses) runs its hooks in
  reverse order before that, so this one runs before the executors close.
  """
  register = getattr(threading, "_register_atexit", None)
  try:
    if register is not None:
      register(fn)
      return
  except RuntimeError:  # interpreter already shutting down
    pass
  atexit.register(fn)


def _close_manager(mgr: ocp.CheckpointManager, directory: str) -> None:
  try:
    mgr.wait_until_finished()
  except Exception as e:
    # Only reached for a failure already raised (close) or at exit / collection, where
    # raising helps no one: one line, not orbax's stack.
    reason = disk_full_reason(e)
    if reason is None:
      log.error("checkpoint %s: the last write failed: %s", directory, " ".join(str(e).split()))
  try:
    mgr.close()
  except Exception:  # the failed write's threads may already be gone
    pass


def export_hf(out_dir: str | os.PathLike, model_config, params, dtype: str | None = None) -> None:
  """Writes ``params`` as a Hugging Face model directory (transformers ``from_pretrained``),
  tensors cast to ``dtype`` ("float32" / "bfloat16" / "float16"; None = the params' dtype).

  Sharded params are fine: ``qwen3.save_hf`` gathers one safetensors shard at a time. With
  several JAX processes every process must call this; tensors are gathered one at a time and
  process 0 writes (`rstar_jax.distributed.export`).
  """

  save_hf_multihost(
    os.fspath(out_dir), model_config, lora.merged(params), dtype=dtype
  )  # LoRA: merged

"""Supervised fine-tuning on chat trajectories, loss on assistant tokens only (rStar2-Agent non-reasoning SFT, ASTER cold start).

Inputs are either a chat-trajectory JSONL file (``{"messages": [...]}`` per line, validated by
`rstar_jax.data.sft_data`) or in-memory sequences: agent-loop `Trajectory` objects (prompt ids
+ response ids with their loss mask: model tokens 1, tool/template tokens 0) or ``(ids,
loss_mask)`` pairs. Chats are rendered with the rStar2-Agent chat format; the mask is 1 exactly on
assistant-written tokens.

Training: ``sft.epochs`` passes in a seeded shuffled order (`EpochIterator`), batches of
``sft.batch_size`` sequences padded to a power-of-two length bucket (rows padded with empty
rows to a fixed count, so the jitted step compiles once per bucket), AdamW with warm-up
(``sft.warmup_ratio`` of the steps) then constant or cosine. Checkpoints keep the data position,
so a resumed run continues with the next batch; the final params are exported as an HF
directory with the tokenizer (``<workdir>/hf``), ready for the RL or eval launchers.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import jax

from rstar_jax.config import RunConfig
from rstar_jax.data.iterator import EpochIterator
from rstar_jax.data.sft_data import ChatExample
from rstar_jax.distributed.primary import is_primary
from rstar_jax.errors import UserError
from rstar_jax.learner import batch as batch_lib
from rstar_jax.learner import packing
from rstar_jax.learner.batch import length_bucket
from rstar_jax.learner.checkpoint import Checkpointer, export_hf
from rstar_jax.pipelines import data_sources, hf_export, interrupts, metrics_log, wiring
from rstar_jax.pipelines.metrics_log import MetricsWriter, Progress
from rstar_jax.tokenization import chat_format

log = logging.getLogger(__name__)

Sequence_ = tuple[list[int], list[int]]


def chat_settings(run: RunConfig) -> dict[str, Any]:
  """How SFT renders a chat's prompt: as RL's prompt builder (`AgentRunner.from_config`) and
  the export's chat template (`hf_export.trained_chat_template`) do, from the run's
  ``rollout`` section: ``chat_format``, ``system_prompt`` ('' = the format's) and
  ``with_tools``. An SFT'd policy thus starts RL on the prompts it was fine-tuned on."""
  r = run.rollout
  return {
    "chat_format_name": r.chat_format,
    "system_prompt": r.system_prompt or None,
    "with_tools": r.with_tools,
  }


def encode_example(
  example: Any,
  tokenizer,
  chat_format_name: str | None = None,
  system_prompt: str | None = None,
  with_tools: bool = True,
) -> Sequence_:
  """(ids, loss_mask) of one SFT item: a ChatExample, a Trajectory or an (ids, mask) pair.
  Chats render in ``chat_format_name`` with ``system_prompt`` (None = the format's) and the
  tool block when ``with_tools`` (`chat_settings` gives the run's); a chat's own system
  message replaces ``system_prompt``."""
  if isinstance(example, ChatExample):
    rc = chat_format.render_chat_ids(
      tokenizer,
      list(example.messages),
      system_prompt=system_prompt,
      with_tools=with_tools,
      fmt=chat_format_name,
    )
    return rc.input_ids, rc.full_loss_mask
  if hasattr(example, "prompt_ids") and hasattr(example, "response_ids"):
    ids = list(example.prompt_ids) + list(example.response_ids)
    mask = [0] * len(example.prompt_ids) + [int(m) for m in example.loss_mask]
    return ids, mask
  ids, mask = example
  ids, mask = list(ids), [int(m) for m in mask]
  if len(ids) != len(mask):
    raise ValueError(f"SFT item: {len(ids)} ids but {len(mask)} loss-mask entries")
  return ids, mask


def encode_all(
  examples: Sequence[Any], tokenizer, max_seq_len: int, **render: Any
) -> tuple[list[Sequence_], int]:
  """Encodes every item (``render``: `encode_example`'s chat settings, e.g. `chat_settings`);
  items longer than ``max_seq_len`` or with no trained token are dropped (counted and logged,
  never truncated: a cut trajectory teaches a cut answer)."""
  out, too_long, untrained, longest = [], 0, 0, 0
  for i, ex in enumerate(examples):
    try:
      ids, mask = encode_example(ex, tokenizer, **render)
    except (ValueError, TypeError, KeyError) as e:
      src = getattr(ex, "extra", {}) or {}
      where = f" ({src['source']})" if "source" in src else ""
      raise ValueError(f"SFT item {i}{where}: cannot render: {e}") from e
    if len(ids) > max_seq_len:
      too_long += 1
      longest = max(longest, len(ids))
      continue
    if not any(mask[1:]):
      untrained += 1
      continue
    out.append((ids, mask))
  dropped = too_long + untrained
  if not out:  # one line, the error's (the warning below would repeat it)
    raise NoUsableItemsError(no_usable_items_line(len(examples), too_long, longest, max_seq_len))
  if dropped:
    log.warning(
      "SFT: dropped %d of %d items (%d longer than sft.max_seq_len=%d, %d without an "
      "assistant token)",
      dropped,
      len(examples),
      too_long,
      max_seq_len,
      untrained,
    )
  return out, dropped


class NoUsableItemsError(UserError, ValueError):
  """Every SFT item was dropped: the message names the setting that dropped them."""


def no_usable_items_line(n: int, too_long: int, longest: int, max_seq_len: int) -> str:
  """The one line for an SFT set with no usable item: the setting to raise (and to what) when
  length dropped them, else that no chat has an assistant turn to train on."""
  line = f"SFT: no usable items among {n}"
  if too_long:
    fit = 1 << max(0, longest - 1).bit_length()
    line += (
      f": {too_long} longer than sft.max_seq_len={max_seq_len} tokens (the longest is "
      f"{longest}); set --config.sft.max_seq_len={fit} or more"
    )
  if n - too_long:
    line += f"{';' if too_long else ':'} {n - too_long} without an assistant token to train on"
  return line


def sft_total_steps(num_items: int, batch_size: int, epochs: float) -> int:
  return max(1, math.ceil(num_items * float(epochs) / batch_size))


def run_sft(
  run: RunConfig,
  workdir: str,
  *,
  tokenizer=None,
  examples: Sequence[Any] | None = None,
  params=None,
  max_steps: int | None = None,
  export: bool = True,
) -> dict:
  """Runs (or resumes) SFT; returns a summary dict.

  Args:
    run: typed config (`rstar_jax.config.from_config_dict(cfg, "sft")`).
    workdir: checkpoints (``ckpt/``), metrics (``sft_metrics.jsonl``), export (``hf/``).
    tokenizer: defaults to the one in ``model.tokenizer_dir`` / ``model.hf_dir``.
    examples: in-memory items (see `encode_example`), used as given; default: the config's
      ``data.sft_path`` (or scripted chats), filtered by the ``coldstart`` section if present.
    params: initial params (default: from ``config.model``).
    max_steps: stop after this many steps in this call (for tests / time-boxed runs).
    export: write ``<workdir>/hf`` (HF model + tokenizer) when training finishes.
  """
  t_start = time.monotonic()
  os.makedirs(workdir, exist_ok=True)
  s = run.sft
  select_stats = None
  from_config = examples is None
  if from_config:
    examples = data_sources.sft_examples(run)
  # ASTER selection applies to chats read from the config's sources; in-memory examples are
  # taken as already selected by their builder (e.g. `rstar_jax.data.coldstart`).
  if from_config and run.coldstart is not None:
    cs = run.coldstart
    examples, select_stats = data_sources.select_interaction_dense(
      [e for e in examples if isinstance(e, ChatExample)],
      min_tool_calls=cs.min_tool_calls,
      max_trajectories=cs.max_trajectories,
      require_all_calls_ok=cs.require_all_calls_ok,
    )
    log.info("cold-start selection: %s", select_stats)
  if tokenizer is None:
    chats = [e for e in examples if isinstance(e, ChatExample)]
    tokenizer = data_sources.ensure_tokenizer(
      run,
      workdir,
      data_sources.tokenizer_corpus(
        data_sources.train_problems(run) if run.data.synthetic is not None else [], chats
      ),
    )
  seqs, dropped = encode_all(examples, tokenizer, s.max_seq_len, **chat_settings(run))
  bs = s.batch_size
  total = sft_total_steps(len(seqs), bs, s.epochs)
  warm = int(round(s.warmup_ratio * total))
  run = _with_warmup(run, warm, total)
  learner = wiring.build_learner(run, total_steps=total, params=params)
  data_sources.check_vocab(tokenizer, learner.model_config)
  js = learner.jitted
  rows = -(-bs // learner.row_multiple) * learner.row_multiple
  pad_id = chat_format.pad_id_of(tokenizer)

  ckpt = Checkpointer(
    os.path.join(workdir, "ckpt"),
    max_to_keep=run.train.keep_checkpoints,
    enable_async=run.train.async_checkpoints,
  )
  it = EpochIterator(list(range(len(seqs))), seed=run.train.seed, shuffle=s.shuffle)
  resumed_step = None
  if ckpt.latest_step() is not None:
    learner.state, meta = ckpt.restore(learner.state)
    it = EpochIterator.from_state(list(range(len(seqs))), meta["data"])
    resumed_step = int(meta["step"])
    log.info("SFT resumed at step %d (epoch %d, index %d)", resumed_step, it.epoch, it.index)
  writer = MetricsWriter(
    workdir,
    "sft_metrics",
    resume_step=resumed_step,
    **metrics_log.sink_options(run, workdir, "sft"),  # W&B hook (issue 32)
  )
  step = int(jax.device_get(learner.state.step))
  every = run.train.checkpoint_every
  prog = Progress("sft", total, every_s=s.log_every_s)
  done_here = 0
  last: dict = {}
  # The state and the data position it was trained to, replaced by one assignment: a Ctrl-C
  # between two statements then still checkpoints a matching pair.
  committed = (learner.state, it.state_dict())
  saved = step if resumed_step is not None else None
  try:
    while step < total and (max_steps is None or done_here < max_steps):
      t0 = time.monotonic()
      idx = it.next_batch(bs)
      chunk = [seqs[i] for i in idx]
      pad_to = length_bucket(max(len(ids) for ids, _ in chunk))
      b = batch_lib.make_sft_batch(chunk, pad_to, pad_id=pad_id, row_multiple=rows)
      pack_metrics = {}
      if run.train.pack_rows:
        b, pack_metrics = packing.pack_for_step(b, row_multiple=learner.row_multiple, pad_id=pad_id)
      new_state, m = js.sft_step(learner.state, js.shard_batch(b))
      m = {k: float(v) for k, v in jax.device_get(m).items()} | pack_metrics
      m.update(epoch=float(it.epoch), batch_len=pad_to, time_step_s=time.monotonic() - t0)
      # The step's state, data position and metric row are recorded together: a Ctrl-C here
      # waits, so the checkpoint an interrupt writes and the log end at the same step.
      with interrupts.sigint_deferred():
        last = writer.write(step + 1, m)
        committed = (new_state, it.state_dict())
        learner.state = new_state
        step += 1
        done_here += 1
      prog.update(step, extra=f"loss {m['loss']:.4f}")
      if (every and step % every == 0) or step == total:
        ckpt.save(learner.state, {"data": it.state_dict(), "phase": "sft"}, force=True)
        saved = step
    ckpt.wait_until_finished()
  except KeyboardInterrupt:
    state, data = committed
    at = int(jax.device_get(state.step))
    if at != saved:  # a resumed run continues exactly here, not at the last periodic save
      ckpt.save(state, {"data": data, "phase": "sft"}, force=True)
      ckpt.wait_until_finished()
    log.info("SFT interrupted: checkpoint of step %d written", at)
    raise
  finally:
    writer.close()
    ckpt.close()
  out = {
    "steps": step,
    "total_steps": total,
    "num_items": len(seqs),
    "dropped_items": dropped,
    "coldstart_selection": select_stats,
    "final_loss": last["loss"] if "loss" in last else None,
    "wall_time_s": time.monotonic() - t_start,
  }
  if export and step >= total:
    hf_dir = os.path.join(workdir, "hf")
    export_with_tokenizer(hf_dir, learner.model_config, learner.state.params, tokenizer, run)
    out["hf_dir"] = hf_dir
  out["learner"] = learner
  out["tokenizer"] = tokenizer
  return out


def export_with_tokenizer(
  out_dir: str, model_config, params, tokenizer, run: RunConfig | None = None
) -> None:
  """HF model directory + the tokenizer files (so the directory is self-contained); with the
  ``run``, its chat template and generation_config.json with its stop ids (`hf_export`), so an
  RL run from this directory stops on the same ids (the source's EOS ids carry over)."""
  export_hf(out_dir, model_config, params)
  # [multi-process] one writer
  if tokenizer is not None and hasattr(tokenizer, "save_pretrained") and is_primary():
    if run is None:
      tokenizer.save_pretrained(out_dir)
    else:
      hf_export.write_tokenizer_and_generation_config(out_dir, run, tokenizer)


def _with_warmup(run: RunConfig, warm: int, total: int) -> RunConfig:
  """``sft.warmup_ratio`` of the steps as warm-up; a cosine schedule spans the whole run."""
  o = run.optim
  if run.sft.warmup_ratio > 0:
    o = dataclasses.replace(o, warmup_steps=warm)
  if o.schedule == "cosine":
    o = dataclasses.replace(
      o, total_steps=total, warmup_steps=min(o.warmup_steps, max(0, total - 1))
    )
  return dataclasses.replace(run, optim=o)

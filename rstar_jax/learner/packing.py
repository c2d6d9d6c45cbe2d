"""Packed rows: several trajectories per batch row (host-side numpy; no jax).

An RL batch padded to its longest row spends most of its FLOPs on padding when lengths vary
(agentic rollouts range from a few hundred to the full budget). Packing places whole
trajectories one after another in rows of the same length T, first-fit-decreasing, and adds

  segment_ids int32 [N, T]  1, 2, ... per trajectory within its row; 0 on padding.
  positions   int32 [N, T]  position inside the trajectory (RoPE restarts at 0 per segment).

The model's attention never crosses a segment boundary (``qwen3.forward(segment_ids=...)``), so
every token gets exactly the logits it gets alone in its own row. Per-token arrays move with
their tokens; the per-trajectory ``advantages`` [N] become per-token [N, T] (0 off the
trajectory), which the policy loss takes as is. A trajectory's first token never has loss
(it is a prompt token, or SFT column 0), so the logits at the end of one segment, which
"predict" the next segment's first token, never reach a loss. The token-mean normaliser (the
whole batch's loss-token count) is unchanged: the same tokens carry loss. Per-row aggregations
("seq-mean-*") are not per-trajectory on packed rows; the learner step refuses them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rstar_jax.learner.batch import pad_value

PACKING_KEYS = ("segment_ids", "positions")


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
  """Bins of item indices, each bin's total length <= capacity (first-fit decreasing).

  Items are taken longest first (ties by index, so the result is deterministic) and put in
  the first bin with room. FFD uses at most 11/9 OPT + 6/9 bins (Dósa 2007).
  """
  lengths = [int(x) for x in lengths]
  if any(x < 0 for x in lengths):
    raise ValueError(f"first_fit_decreasing: negative length in {lengths}")
  if lengths and max(lengths) > capacity:
    raise ValueError(f"first_fit_decreasing: item of length {max(lengths)} > capacity {capacity}")
  order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
  bins: list[list[int]] = []
  room: list[int] = []
  for i in order:
    if lengths[i] == 0:
      continue
    for b, r in enumerate(room):
      if lengths[i] <= r:
        bins[b].append(i)
        room[b] -= lengths[i]
        break
    else:
      bins.append([i])
      room.append(capacity - lengths[i])
  return bins


def pad_fraction(batch: dict[str, np.ndarray]) -> float:
  """Share of the batch's [N, T] cells that are padding (no token)."""
  mask = np.asarray(batch["attention_mask"])
  return float(1.0 - mask.sum() / max(mask.size, 1))


def pack_batch(
  batch: dict[str, np.ndarray],
  *,
  capacity: int | None = None,
  row_multiple: int = 1,
  pad_id: int = 0,
) -> dict[str, np.ndarray]:
  """Packs a right-padded `make_rl_batch` / `make_sft_batch` batch into fewer rows.

  Args:
      batch: input_ids, attention_mask, loss_mask [N, T] (+ sampler_logprobs [N, T], advantages
          [N] for RL); every row right-padded (real tokens a prefix). Empty rows are dropped.
      capacity: packed row length; default T (packing never lengthens rows).
      row_multiple: pad the packed row count up to a multiple of this with empty rows.
      pad_id: input id of padding cells.
  Returns:
      the same keys with [N', T'] arrays (advantages becomes [N', T'] per token), plus
      segment_ids and positions [N', T'] (module docstring).
  """
  if "segment_ids" in batch:
    raise ValueError("pack_batch: batch is already packed (has segment_ids)")
  mask = np.asarray(batch["attention_mask"]).astype(bool)
  n, t = mask.shape
  lengths = mask.sum(axis=1)
  if not np.array_equal(mask, np.arange(t)[None] < lengths[:, None]):
    raise ValueError("pack_batch: rows must be right-padded (real tokens a prefix of each row)")
  cap = t if capacity is None else int(capacity)
  if not isinstance(row_multiple, int) or row_multiple < 1:
    raise ValueError(f"pack_batch: row_multiple must be an int >= 1, got {row_multiple!r}")
  bins = first_fit_decreasing(lengths, cap)
  rows = max(1, -(-len(bins) // row_multiple) * row_multiple)
  # Per-token arrays are [N, T, ...] (routes carry [R, k] per token); padding cells take
  # `batch_lib.pad_value` (NO_ROUTE for routes, never expert 0).
  per_token = [
    k
    for k, v in batch.items()
    if np.ndim(v) >= 2 and np.shape(v)[:2] == (n, t) and k not in ("attention_mask", "advantages")
  ]
  out = {
    k: np.full((rows, cap) + np.shape(batch[k])[2:], pad_value(k), np.asarray(batch[k]).dtype)
    for k in per_token
  }
  out["input_ids"][:] = pad_id
  out["attention_mask"] = np.zeros((rows, cap), np.asarray(batch["attention_mask"]).dtype)
  out["segment_ids"] = np.zeros((rows, cap), np.int32)
  out["positions"] = np.zeros((rows, cap), np.int32)
  adv = batch.get("advantages")
  if adv is not None:
    adv = np.asarray(adv)
    if adv.shape not in ((n,), (n, t)):
      raise ValueError(f"pack_batch: advantages must be [{n}] or [{n}, {t}], got {adv.shape}")
    out["advantages"] = np.zeros((rows, cap), np.float32)
  for r, items in enumerate(bins):
    col = 0
    for seg, i in enumerate(items, start=1):
      ln = int(lengths[i])
      sl = slice(col, col + ln)
      for k in per_token:
        out[k][r, sl] = batch[k][i, :ln]
      out["attention_mask"][r, sl] = 1
      out["segment_ids"][r, sl] = seg
      out["positions"][r, sl] = np.arange(ln)
      if adv is not None:
        out["advantages"][r, sl] = adv[i] if adv.ndim == 1 else adv[i, :ln]
      col += ln
  return out


def pack_for_step(
  batch: dict[str, np.ndarray], *, row_multiple: int, pad_id: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
  """`pack_batch` for a training loop: the packed row count is rounded up to row_multiple x
  a power of two (so a run compiles a few row counts, not one per step), never above the
  unpacked count. Returns (batch, metrics) with ``batch/pad_fraction_unpacked`` and
  ``batch/pad_fraction_packed`` (padding cells / all cells, empty rows included) and
  ``batch/rows_packed``."""
  n = batch["input_ids"].shape[0]
  packed = pack_batch(batch, row_multiple=row_multiple, pad_id=pad_id)
  units = packed["input_ids"].shape[0] // row_multiple
  rows = min(
    row_multiple * (1 << max(units - 1, 0).bit_length()), -(-n // row_multiple) * row_multiple
  )
  if rows > packed["input_ids"].shape[0]:
    packed = pack_batch(batch, row_multiple=rows, pad_id=pad_id)
  return packed, {
    "batch/pad_fraction_unpacked": pad_fraction(batch),
    "batch/pad_fraction_packed": pad_fraction(packed),
    "batch/rows_packed": float(packed["input_ids"].shape[0]),
  }

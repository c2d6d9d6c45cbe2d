"""Host-side batch building for the learner steps (numpy in, numpy out; no jax).

Layout (N rows, T = ``pad_to`` columns; every row right-padded):

  RL batch (`make_rl_batch`):
    input_ids      int32   [N, T]  prompt ids then response ids, then ``pad_id``.
    attention_mask int32   [N, T]  1 on real (prompt + response) tokens.
    loss_mask      float32 [N, T]  1 on model-generated response tokens, 0 elsewhere (prompt,
                                   tool/template tokens, padding).
    sampler_logprobs float32 [N, T] the sampler's log-prob of ``input_ids[n, t]``; 0 where
                                   loss_mask is 0 (``SAMPLER_KEY``: the one place they ride).
    advantages     float32 [N]     one scalar per trajectory (GRPO: constant over its tokens).

  RL step inputs (`rl_inputs`): the keys ``StepConfig.rl_keys`` names, built from the batch
  above: ``old_logprobs`` = the learner's recomputed log-probs (or the sampler's when not
  recomputed), ``behaviour_logprobs`` = the sampler's (off-policy losses only).

  SFT batch (`make_sft_batch`): input_ids, attention_mask, loss_mask as above.

Target convention ("token-aligned"): column t of loss_mask / the log-probs describes the token
``input_ids[:, t]`` itself, which the model predicts from the logits at column ``t - 1``. Column 0
is never a target. This keeps every per-token array aligned with ``input_ids`` exactly as the
agent loop records it (``Trajectory.loss_mask`` / ``logprobs`` are per response token), so
building a batch is concatenation and padding, with no shift to get wrong.

Rows added by ``row_multiple`` padding are all-zero (no tokens, no loss): they exist only so N
divides the micro-batch count and the data-parallel mesh size, and change no result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

SAMPLER_KEY = "sampler_logprobs"  # the sampler's log-probs on the host batch
OLD_KEY = "old_logprobs"  # the step's reference log-probs (the PPO ratio's denominator)
BEHAVIOUR_KEY = "behaviour_logprobs"  # the sampler's, as the step's off-policy input


class TrajectoryLike(Protocol):
  """The fields of ``rstar_jax.rollout.types.Trajectory`` that a batch needs."""

  prompt_ids: Sequence[int]
  response_ids: Sequence[int]
  loss_mask: Sequence[int]
  logprobs: Sequence[float]


def _padded_rows(n: int, row_multiple: int) -> int:
  if not isinstance(row_multiple, int) or row_multiple < 1:
    raise ValueError(f"row_multiple: expected an int >= 1, got {row_multiple!r}")
  return -(-n // row_multiple) * row_multiple


def make_rl_batch(
  trajectories: Sequence[TrajectoryLike],
  advantages: Sequence[float],
  pad_to: int,
  *,
  pad_id: int = 0,
  row_multiple: int = 1,
) -> dict[str, np.ndarray]:
  """Builds the RL batch (layout in the module docstring) from agent-loop trajectories.

  Args:
      trajectories: N trajectories (``prompt_ids``, ``response_ids``, ``loss_mask``,
          ``logprobs``; the last two have one entry per response token).
      advantages: N floats, one per trajectory.
      pad_to: T; every ``len(prompt_ids) + len(response_ids)`` must be <= T (nothing is
          silently truncated: a cut response would train on a different sequence than sampled).
      pad_id: id written into padding columns (masked out everywhere).
      row_multiple: pad N up to a multiple of this with empty rows.

  Returns:
      dict of numpy arrays: input_ids, attention_mask, loss_mask, sampler_logprobs [N', T] and
      advantages [N'], with N' = N rounded up to ``row_multiple``.
  """
  advantages = np.asarray(advantages, np.float32)
  if advantages.shape != (len(trajectories),):
    raise ValueError(
      f"make_rl_batch: advantages must have shape ({len(trajectories)},) "
      f"(one per trajectory), got {advantages.shape}"
    )
  if not np.all(np.isfinite(advantages)):
    bad = int(np.flatnonzero(~np.isfinite(advantages))[0])
    raise ValueError(f"make_rl_batch: advantages[{bad}] is {advantages[bad]} (not finite)")
  n = _padded_rows(len(trajectories), row_multiple)
  batch = _empty(n, pad_to, pad_id)
  batch[SAMPLER_KEY] = np.zeros((n, pad_to), np.float32)
  batch["advantages"] = np.zeros((n,), np.float32)
  batch["advantages"][: len(trajectories)] = advantages
  for i, tr in enumerate(trajectories):
    prompt, response = list(tr.prompt_ids), list(tr.response_ids)
    mask, logp = list(tr.loss_mask), list(tr.logprobs)
    where = f"make_rl_batch: trajectory {i}"
    if not prompt:
      raise ValueError(
        f"{where}: empty prompt_ids (the first response token needs a "
        "preceding token to be predicted from)"
      )
    if len(mask) != len(response) or len(logp) != len(response):
      raise ValueError(
        f"{where}: loss_mask ({len(mask)}) and logprobs ({len(logp)}) must "
        f"have one entry per response token ({len(response)})"
      )
    length = len(prompt) + len(response)
    if length > pad_to:
      raise ValueError(
        f"{where}: prompt ({len(prompt)}) + response ({len(response)}) = "
        f"{length} tokens > pad_to={pad_to}"
      )
    mask_arr = np.asarray(mask, np.float32)
    if not np.all((mask_arr == 0) | (mask_arr == 1)):
      raise ValueError(f"{where}: loss_mask must hold only 0/1, got {sorted(set(mask))}")
    p = len(prompt)
    batch["input_ids"][i, :length] = prompt + response
    batch["attention_mask"][i, :length] = 1
    batch["loss_mask"][i, p:length] = mask_arr
    # Logprobs of masked tokens are meaningless (tool text was never sampled): zero them so
    # they cannot leak into a ratio by accident.
    batch[SAMPLER_KEY][i, p:length] = np.asarray(logp, np.float32) * mask_arr
  return batch


def rl_inputs(
  batch: dict[str, np.ndarray], keys: Sequence[str], proximal: np.ndarray | None = None
) -> dict[str, np.ndarray]:
  """The RL step's inputs from a `make_rl_batch` batch (packed or not).

  Args:
      batch: host batch with ``sampler_logprobs`` [N, T].
      keys: the keys the step reads (``StepConfig.rl_keys``); ``behaviour_logprobs`` among them
          makes the sampler's log-probs the off-policy loss's behaviour input.
      proximal: [N, T] the learner's recomputed log-probs (``rl.recompute_old_logprobs``) or
          None (the sampler's are the old log-probs).
  Returns:
      the batch without ``sampler_logprobs``, plus ``old_logprobs`` (masked) and, when in
      ``keys``, ``behaviour_logprobs``.
  """
  if SAMPLER_KEY not in batch:
    raise ValueError(f"rl_inputs: batch is missing {SAMPLER_KEY!r} (has {sorted(batch)})")
  sampler = batch[SAMPLER_KEY]
  out = {k: v for k, v in batch.items() if k != SAMPLER_KEY}
  if proximal is None:
    out[OLD_KEY] = sampler
  else:
    proximal = np.asarray(proximal, np.float32)
    if proximal.shape != sampler.shape:
      raise ValueError(
        f"rl_inputs: proximal log-probs expected shape {sampler.shape}, got {proximal.shape}"
      )
    out[OLD_KEY] = proximal * batch["loss_mask"]
  if BEHAVIOUR_KEY in keys:
    out[BEHAVIOUR_KEY] = sampler.copy()
  return out


def importance_metrics(
  behaviour_logprobs: np.ndarray, proximal_logprobs: np.ndarray, loss_mask: np.ndarray, cap: float
) -> dict[str, float]:
  """Token importance ratios pi_prox / pi_behav = exp(proximal - behaviour) on loss tokens.

  Args:
    behaviour_logprobs: [N, T] the sampler's log-probs (the policy that generated).
    proximal_logprobs: [N, T] the learner's recomputed log-probs (the policy being trained).
    loss_mask: [N, T] 1 on generated tokens.
    cap: truncation cap of truncated importance sampling (``rl.tis_cap``; 0 = off, nothing is
      truncated).
  Returns:
    async/is_ratio_mean, async/is_ratio_max, async/is_truncated_frac (ratio > cap; 0 when off).
  """
  m = np.asarray(loss_mask) > 0
  if not m.any():
    return {"async/is_ratio_mean": 1.0, "async/is_ratio_max": 1.0, "async/is_truncated_frac": 0.0}
  d = np.asarray(proximal_logprobs, np.float64)[m] - np.asarray(behaviour_logprobs, np.float64)[m]
  r = np.exp(np.clip(d, -50.0, 50.0))
  return {
    "async/is_ratio_mean": float(r.mean()),
    "async/is_ratio_max": float(r.max()),
    "async/is_truncated_frac": float((r > cap).mean()) if cap > 0 else 0.0,
  }


def make_sft_batch(
  sequences: Sequence[tuple[Sequence[int], Sequence[Any]]],
  pad_to: int,
  *,
  pad_id: int = 0,
  row_multiple: int = 1,
) -> dict[str, np.ndarray]:
  """Builds the SFT batch from (ids, loss_mask) pairs, token-aligned (mask[t]=1: train on ids[t]).

  Returns input_ids, attention_mask, loss_mask [N', T]. The mask at column 0 is ignored by
  the loss (nothing predicts the first token) and is zeroed here to keep token counts honest.
  """
  n = _padded_rows(len(sequences), row_multiple)
  batch = _empty(n, pad_to, pad_id)
  for i, (ids, mask) in enumerate(sequences):
    ids, mask = list(ids), list(mask)
    where = f"make_sft_batch: sequence {i}"
    if len(mask) != len(ids):
      raise ValueError(f"{where}: loss_mask has {len(mask)} entries, ids has {len(ids)}")
    if len(ids) > pad_to:
      raise ValueError(f"{where}: {len(ids)} tokens > pad_to={pad_to}")
    batch["input_ids"][i, : len(ids)] = ids
    batch["attention_mask"][i, : len(ids)] = 1
    batch["loss_mask"][i, : len(ids)] = np.asarray(mask, np.float32)
    batch["loss_mask"][i, 0] = 0.0
  return batch


def _empty(n: int, pad_to: int, pad_id: int) -> dict[str, np.ndarray]:
  if not isinstance(pad_to, int) or pad_to < 2:
    raise ValueError(f"pad_to: expected an int >= 2, got {pad_to!r}")
  return {
    "input_ids": np.full((n, pad_to), pad_id, np.int32),
    "attention_mask": np.zeros((n, pad_to), np.int32),
    "loss_mask": np.zeros((n, pad_to), np.float32),
  }


def split_rl_batch(
  batch: dict[str, np.ndarray],
  num_mini_batches: int,
  rng: np.random.Generator,
  *,
  rows: int | None = None,
  pad_id: int = 0,
) -> list[dict[str, np.ndarray]]:
  """Splits an RL batch into mini-batches of one fixed shape, for several PPO updates per step.

  Real rows (any attention) are shuffled with ``rng`` and dealt out round-robin, so the
  mini-batches differ by at most one real row. Each is padded with empty rows (no tokens, no
  loss) to ``rows`` rows, so every update reuses one compiled step whatever the number of
  surviving trajectories. When there are fewer real rows than ``num_mini_batches``, fewer
  (non-empty) mini-batches come back: an update on an empty batch would still move Adam.

  Args:
      batch: ``make_rl_batch`` layout, N rows.
      num_mini_batches: M >= 1; M = 1 returns ``[batch]`` unchanged (no shuffle, no re-pad).
      rng: numpy Generator for the shuffle.
      rows: R, rows of every mini-batch; default ceil(N / M). Must hold ceil(real / M).
      pad_id: id written into the padding rows' input_ids.
  Returns:
      up to M dicts with the batch's keys, each [R, ...].
  """
  if not isinstance(num_mini_batches, int) or num_mini_batches < 1:
    raise ValueError(f"num_mini_batches: expected an int >= 1, got {num_mini_batches!r}")
  if num_mini_batches == 1:
    return [batch]
  n = len(batch["attention_mask"])
  rows = -(-n // num_mini_batches) if rows is None else rows
  real = np.flatnonzero(batch["attention_mask"].any(axis=1))
  order = rng.permutation(real)
  parts = [order[m::num_mini_batches] for m in range(num_mini_batches)]
  parts = [p for p in parts if len(p)]
  if parts and len(parts[0]) > rows:
    raise ValueError(
      f"split_rl_batch: {len(real)} real rows in {num_mini_batches} "
      f"mini-batches need {len(parts[0])} rows each, got rows={rows}"
    )
  out = []
  for part in parts:
    mb = {k: np.zeros((rows,) + v.shape[1:], v.dtype) for k, v in batch.items()}
    if "input_ids" in mb:
      mb["input_ids"][:] = pad_id
    for k, v in batch.items():
      mb[k][: len(part)] = v[part]
    out.append(mb)
  return out


def length_bucket(longest: int, minimum: int = 64) -> int:
  """Smallest power of two >= max(longest, minimum): a batch's padded length T (one compiled
  step per bucket instead of one per length)."""
  t = max(int(longest), minimum, 2)
  return 1 << (t - 1).bit_length()

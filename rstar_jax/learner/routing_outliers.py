"""Routing-replay outlier capture (issue 39): one JSON record per loss token whose
sampler-vs-learner importance ratio leaves a band, with what explains it.

The RL loop already has the step's learner log-probs on the host (``routing/replay/*`` and
``routing/no_replay/*``); `flag` finds the tokens with ``|log r| > log band`` there at no extra
cost. Only for the rows that hold such a token, `diagnose_rows` reruns the learner's forward
twice (engine routes forced / own routing) with the router probabilities of every layer, one row
at a time (bounded memory), and `records` turns that into plain dicts for
``<rl workdir>/routing_outliers.jsonl``: the token and its class, the engine's and the learner's
top-k per layer at the input position that predicts it, the router probabilities of both sets,
the log-probs, the neighbours' ratios and the row's route alignment (recorded routes vs the
learner's own top-k, as recorded and shifted by one position: a misaligned row agrees better
shifted).

Convention (`rstar_jax.learner.batch`): the ratio at column j is about token ``ids[j]``, which
the forward step whose input is ``ids[j - 1]`` predicts; that step's routes sit at column
``j - 1``. So a record's ``layers`` describe column ``j - 1`` (``input_pos``).
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rstar_jax.learner import batch as batch_lib
from rstar_jax.models import qwen3_moe
from rstar_jax.rl import losses

FILENAME = "routing_outliers.jsonl"


def flag(
  sampler_logprobs: np.ndarray,
  loss_mask: np.ndarray,
  band: float,
  learner_logprobs: Mapping[str, np.ndarray | None],
) -> np.ndarray:
  """[N, T] bool: loss tokens (column 0 excluded) where any of ``learner_logprobs``' ratios
  exp(learner - sampler) lies outside [1 / band, band]. ``band`` <= 1 flags nothing."""
  m = np.asarray(loss_mask) > 0
  m[:, :1] = False
  out = np.zeros(m.shape, bool)
  if band <= 1:
    return out
  lim = math.log(band)
  s = np.asarray(sampler_logprobs, np.float64)
  for lp in learner_logprobs.values():
    if lp is not None:
      out |= m & (np.abs(np.asarray(lp, np.float64) - s) > lim)
  return out


@functools.partial(jax.jit, static_argnames=("config",))
def _forward(params, config, input_ids, attention_mask, segment_ids, positions, routes):
  kw = {}
  if segment_ids is not None:
    kw = dict(segment_ids=segment_ids, positions=positions)
  logits, aux = qwen3_moe.forward(
    params,
    config,
    input_ids,
    attention_mask=attention_mask,
    routes=routes,
    return_aux=True,
    return_probs=True,
    **kw,
  )
  lp, _ = losses.token_logprobs_and_entropy(logits[:, :-1], input_ids[:, 1:])
  lp = jnp.concatenate([jnp.zeros_like(lp[:, :1]), lp], axis=1)  # token-aligned
  return lp, aux.topk, aux.probs


def diagnose_rows(params, config, batch: Mapping[str, np.ndarray], rows: Sequence[int]) -> dict:
  """The learner's forward on ``rows`` of the host batch, with the batch's routes forced
  (``replay``) and with its own routing (``own``): per key ``lp`` [n, T], ``topk`` [n, T, L, k]
  and router ``probs`` [n, T, L, E] (NaN on dense layers). One row per call: the probs of a
  long row of a large MoE are the memory that matters."""
  out: dict[str, list] = {
    f"{w}_{a}": [] for w in ("replay", "own") for a in ("lp", "topk", "probs")
  }

  def row(key, i):
    v = batch.get(key)
    return None if v is None else jnp.asarray(v[i : i + 1])

  for i in rows:
    args = [row(k, i) for k in ("input_ids", "attention_mask", "segment_ids", "positions")]
    for which, routes in (("replay", row(batch_lib.ROUTES_KEY, i)), ("own", None)):
      lp, topk, probs = jax.device_get(_forward(params, config, *args, routes))
      out[f"{which}_lp"].append(lp[0])
      out[f"{which}_topk"].append(topk[0])
      out[f"{which}_probs"].append(probs[0])
  return {k: np.stack(v) for k, v in out.items()}


def _same_set(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return (np.sort(a, -1) == np.sort(b, -1)).all(-1)


def _segments(batch: Mapping[str, np.ndarray], i: int) -> tuple[np.ndarray, np.ndarray]:
  """(segment id per column, position within the segment) of row ``i`` (one segment when
  the batch is not packed)."""
  valid = np.asarray(batch["attention_mask"][i]) > 0
  if "segment_ids" in batch:
    return np.asarray(batch["segment_ids"][i]), np.asarray(batch["positions"][i])
  return valid.astype(np.int32), np.cumsum(valid) - 1


def _classes(loss_row: np.ndarray, seg: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Per column of one row: class ("prompt" before the segment's first generated token,
  "generated", "tool/env" = masked after it, "pad"), the turn (0 = prompt, n = n-th generated
  span and the masked tokens after it) and whether it is generated."""
  gen = loss_row > 0
  cls = np.full(gen.shape, "pad", object)
  turn = np.zeros(gen.shape, np.int32)
  for s in np.unique(seg[seg > 0]):
    cols = np.flatnonzero(seg == s)
    g = gen[cols]
    starts = g & ~np.concatenate([[False], g[:-1]])
    turn[cols] = np.cumsum(starts)
    first = int(np.argmax(g)) if g.any() else len(cols)
    c = np.where(g, "generated", "tool/env").astype(object)
    c[:first] = "prompt"
    cls[cols] = c
  return cls, turn, gen


def _boundary(gen: np.ndarray, seg: np.ndarray, cls: np.ndarray, t: int) -> list[str]:
  """Turn-boundary labels of column ``t``."""
  out = []
  n = len(gen)
  prev_same = t > 0 and seg[t - 1] == seg[t]
  next_same = t + 1 < n and seg[t + 1] == seg[t]
  if gen[t] and not (prev_same and gen[t - 1]):
    out.append("first generated token of a turn")
  if gen[t] and not (next_same and gen[t + 1]):
    out.append("last generated token of a turn")
  if not gen[t] and next_same and gen[t + 1]:
    out.append("last token before a generated turn")
  if cls[t] == "tool/env" and prev_same and gen[t - 1]:
    out.append("first tool/env token after a generated turn")
  if not next_same:
    out.append("last token of the trajectory")
  return out


def _rounded(x) -> list:
  # Significant digits, not decimals: a foreign expert's probability can be 1e-9.
  return [float(f"{float(v):.4g}") for v in np.asarray(x).ravel()]


def _ratio(lp, s) -> float | None:
  return None if lp is None else float(np.exp(np.clip(float(lp) - float(s), -50.0, 50.0)))


def records(
  *,
  step: int,
  batch: Mapping[str, np.ndarray],
  flagged: np.ndarray,
  diag: Mapping[str, np.ndarray],
  rows: Sequence[int],
  learner_logprobs: Mapping[str, np.ndarray | None],
  band: float,
  row_labels: Sequence[Any] | None = None,
  decode: Callable[[list[int]], str] | None = None,
  neighbours: int = 3,
  max_records: int = 64,
) -> list[dict[str, Any]]:
  """One dict per flagged token of ``rows`` (in order, at most ``max_records``); ``diag`` is
  `diagnose_rows` of those rows. ``learner_logprobs``: the step's [N, T] log-probs by name
  ("replay", "own"; None where the step did not compute one). ``row_labels[i]``: what row i
  is (e.g. the (group, sample) of its trajectory; unpacked batches only)."""
  sampler = np.asarray(batch[batch_lib.SAMPLER_KEY])
  loss = np.asarray(batch["loss_mask"])
  ids = np.asarray(batch["input_ids"])
  routes = np.asarray(batch[batch_lib.ROUTES_KEY])
  out: list[dict[str, Any]] = []
  for n, i in enumerate(rows):
    seg, pos = _segments(batch, i)
    cls, turn, gen = _classes(loss[i], seg)
    rec = (routes[i] >= 0).all(-1)  # [T, L] a recorded route
    own_topk = diag["own_topk"][n]
    agree = _same_set(routes[i], own_topk) & rec
    sparse = rec.any(0) | (own_topk >= 0).all(-1).any(0)  # [L] layers with routing
    valid = (seg > 0)[:, None] & rec
    alignment = {"aligned": float(agree[valid].mean()) if valid.any() else None}
    for s in (-1, 1):  # agreement with the recorded routes moved by one column
      sh = np.roll(routes[i], s, axis=0)
      m = valid & np.roll(rec, s, axis=0) & (np.roll(seg, s) == seg)[:, None]
      a = _same_set(sh, own_topk)
      alignment[f"shifted{s:+d}"] = float(a[m].mean()) if m.any() else None
    for j in np.flatnonzero(flagged[i]):
      if len(out) >= max_records:
        return out
      c = j - 1  # the column whose forward step predicts token j
      layers = []
      for layer in np.flatnonzero(sparse):
        e, o = routes[i, c, layer], own_topk[c, layer]
        po, pr = diag["own_probs"][n, c, layer], diag["replay_probs"][n, c, layer]
        top = np.sort(po)[::-1]
        k = len(o)
        layers.append(
          {
            "layer": int(layer),
            "engine": [int(v) for v in e],
            "learner": [int(v) for v in o],
            "learner_under_replay": [int(v) for v in diag["replay_topk"][n, c, layer]],
            "agree": bool(agree[c, layer]),
            "no_route": bool(not rec[c, layer]),
            "p_engine": _rounded(po[e]) if rec[c, layer] else None,
            "p_learner": _rounded(po[o]),
            "kth_gap": _rounded(top[k - 1] - top[k])[0] if k < len(top) else None,
            "p_engine_under_replay": _rounded(pr[e]) if rec[c, layer] else None,
          }
        )
      same = seg[:c] == seg[c]
      before = np.flatnonzero((~agree & rec)[:c][:, sparse].any(-1) & same)
      unrouted = np.flatnonzero((~rec)[:c][:, sparse].any(-1) & same)
      nb = []
      for t in range(max(0, j - neighbours), min(len(seg), j + neighbours + 1)):
        if seg[t] != seg[j]:
          continue
        nb.append(
          {
            "pos": int(pos[t]),
            "loss": bool(loss[i, t] > 0),
            "ratio_replay": _ratio(diag["replay_lp"][n, t], sampler[i, t]) if loss[i, t] else None,
            "ratio_own": _ratio(diag["own_lp"][n, t], sampler[i, t]) if loss[i, t] else None,
          }
        )
      step_lp = {k: (None if v is None else float(v[i, j])) for k, v in learner_logprobs.items()}
      out.append(
        {
          "step": int(step),
          "row": int(i),
          "trajectory": None if row_labels is None else row_labels[i],
          "segment": int(seg[j]),
          "pos": int(pos[j]),
          "input_pos": int(pos[c]),
          "token_id": int(ids[i, j]),
          "token_text": None if decode is None else decode([int(ids[i, j])]),
          "input_token_id": int(ids[i, c]),
          "input_token_text": None if decode is None else decode([int(ids[i, c])]),
          "turn": int(turn[j]),
          "token_class": str(cls[j]),
          "input_class": str(cls[c]),
          "boundary": _boundary(gen, seg, cls, j),
          "input_boundary": _boundary(gen, seg, cls, c),
          "band": band,
          "sampler_logprob": float(sampler[i, j]),
          "learner_logprob": step_lp,
          "ratio": {k: _ratio(v, sampler[i, j]) for k, v in step_lp.items()},
          "recomputed_logprob": {
            "replay": float(diag["replay_lp"][n, j]),
            "own": float(diag["own_lp"][n, j]),
          },
          "layers": layers,
          "prefix_misrouted_positions": int(len(before)),
          "nearest_misrouted_positions": [int(pos[t]) for t in before[-8:]],
          "prefix_unrouted_positions": int(len(unrouted)),
          "neighbours": nb,
          "row_alignment": alignment,
        }
      )
  return out


def save_rows(
  workdir: str,
  step: int,
  batch: Mapping[str, np.ndarray],
  rows: Sequence[int],
  learner_logprobs: Mapping[str, np.ndarray | None],
) -> str:
  """Saves ``rows`` of the host batch (every per-row array) and the step's learner log-probs
  to ``<workdir>/routing_outliers/step<step>.npz``, so a record can be re-examined offline
  (a rerun of the step need not give the same batch back: XLA:CPU updates are not
  bit-reproducible). Keys: the batch keys, ``learner_<name>``, ``rows``."""
  d = os.path.join(workdir, "routing_outliers")
  os.makedirs(d, exist_ok=True)
  idx = np.asarray(rows, np.int64)
  arrays = {k: np.asarray(v)[idx] for k, v in batch.items() if np.ndim(v) >= 1}
  arrays.update(
    {f"learner_{k}": np.asarray(v)[idx] for k, v in learner_logprobs.items() if v is not None}
  )
  path = os.path.join(d, f"step{int(step)}.npz")
  np.savez_compressed(path, rows=idx, **arrays)
  return path


def write(workdir: str, recs: Sequence[Mapping[str, Any]]) -> str:
  """Appends ``recs`` as JSON lines to ``<workdir>/routing_outliers.jsonl``; returns the path."""
  path = os.path.join(workdir, FILENAME)
  with open(path, "a") as f:
    for r in recs:
      f.write(json.dumps(r) + "\n")
  return path

"""Qwen3-MoE decoder (HF ``qwen3_moe``) as pure functions beside the dense ``qwen3`` one.

Attention, norms, embedding, LM head, RoPE and the KV cache are ``qwen3``'s; only the MLP of a
sparse layer differs (``rstar_jax.models.moe``: softmax router, top-k, dropless grouped
experts). Numerics follow transformers' ``Qwen3MoeForCausalLM``.

Param tree (``qwen3_config``): attention and norms stacked over all L layers in ``layers``
(as the dense model, minus ``mlp``); the MLPs stacked per kind, ``dense_mlp`` over
``config.dense_layers`` and ``moe`` ({"gate": router [Ls, D, E], "experts": gate/up [Ls, E, D,
F], down [Ls, E, F, D]}) over ``config.sparse_layers``.

Layer scan with mixed layers: the layers are cut into maximal runs of one kind and each run
is one ``lax.scan`` over its slice of the stacks. Released Qwen3-MoE models are all sparse
(one run, one scan, as the dense model); ``mlp_only_layers`` / ``decoder_sparse_step > 1``
add one scan per run, which only grows the compiled program with the number of runs.

Routing-replay interface (shared with the sampler and the learner):

* routes: int32 ``[B, T, L, k]``, L = ``num_hidden_layers`` (all layers; the entries of dense
  layers are ignored on input and ``-1`` on output), k = ``num_experts_per_tok``. ``-1`` is
  the "no recorded route" sentinel: a (token, layer) whose k ids are not all in ``[0, E)``
  uses the learner's own top-k, so a sentinel never selects expert 0.
* ``forward(..., routes=r)`` forces the recorded top-k SET at every recorded (token, layer);
  the gate weights are the learner's own router softmax (over all E, float32) gathered at
  those experts, renormalised when ``norm_topk_prob``: the router still gets gradients.
* ``forward(..., return_aux=True)`` returns ``(logits, aux)``; ``aux`` (see `MoeAux`) holds
  ``topk`` (the learner's own top-k ids, ``[B, T, L, k]``, what replay agreement compares
  against the engine's), ``routes`` (the ids used, = ``topk`` except where forced) and
  per-sparse-layer routing statistics for the load-balancing / z losses and expert metrics
  (`aux_losses`, `moe.expert_metrics`), summed over the valid (``attention_mask``) tokens.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rstar_jax.models import moe, qwen3
from rstar_jax.models.qwen3_config import Qwen3MoeConfig
from rstar_jax.sharding.rules import constrain

Params = dict[str, Any]

ROUTE_SENTINEL = -1

__all__ = [
  "MoeAux",
  "Qwen3MoeConfig",
  "ROUTE_SENTINEL",
  "aux_losses",
  "forward",
  "forward_cached",
  "runs",
]


class MoeAux(NamedTuple):
  """What ``forward(..., return_aux=True)`` returns beside the logits.

  topk: [B, T, L, k] int32, the learner's own top-k per token and layer (-1 on dense layers).
  routes: [B, T, L, k] int32, the experts used (= ``topk`` except where routes were forced).
  stats: `moe.LayerStats` with a leading [Ls] axis (one row per sparse layer).
  probs: [B, T, L, E] float32 router softmax per token and layer (NaN on dense layers), only
    with ``forward(..., return_probs=True)`` (routing diagnostics); None otherwise.
  """

  topk: jax.Array
  routes: jax.Array
  stats: moe.LayerStats
  probs: jax.Array | None = None


def runs(config: Qwen3MoeConfig) -> list[tuple[bool, int, int, int]]:
  """Maximal runs of one layer kind: (sparse, first layer, end layer, first row in its stack)."""
  out: list[tuple[bool, int, int, int]] = []
  rows = {True: 0, False: 0}
  for i in range(config.num_hidden_layers):
    sparse = config.is_sparse_layer(i)
    if out and out[-1][0] == sparse:
      s, a, _, r = out[-1]
      out[-1] = (s, a, i + 1, r)
    else:
      out.append((sparse, i, i + 1, rows[sparse]))
    rows[sparse] += 1
  return out


def _rows(tree, a: int, b: int, n: int):
  return tree if (a, b) == (0, n) else jax.tree.map(lambda x: x[a:b], tree)


def _check(config: Any, fn: str) -> None:
  if not isinstance(config, Qwen3MoeConfig):
    raise TypeError(
      f"qwen3_moe.{fn}: config must be a static Qwen3MoeConfig (jit with "
      f"static_argnames='config'); got {type(config).__name__}"
    )


def forward(
  params: Params,
  config: Qwen3MoeConfig,
  input_ids: jax.Array,
  positions: jax.Array | None = None,
  attention_mask: jax.Array | None = None,
  segment_ids: jax.Array | None = None,
  routes: jax.Array | None = None,
  return_aux: bool = False,
  return_probs: bool = False,
):
  """Full-sequence causal forward (pure; jit with ``static_argnames=("config", "return_aux")``).

  Args: as ``qwen3.forward``, plus
    routes: optional [B, T, L, k] int32 forced routes (-1 = none; see the module docstring).
    return_aux: also return the `MoeAux`.
    return_probs: with ``return_aux``, fill ``MoeAux.probs`` (a [B, T, L, E] array: for
      diagnostics on a few rows, not for the training step).
  Returns:
    logits [B, T, V] float32, or (logits, MoeAux) with ``return_aux``.
  """
  _check(config, "forward")
  c = config
  B, T = input_ids.shape
  L, k = c.num_hidden_layers, c.num_experts_per_tok
  mask = jnp.ones((B, T), bool) if attention_mask is None else attention_mask.astype(bool)
  if positions is None:
    positions = qwen3.default_positions(mask)
  if routes is not None and routes.shape != (B, T, L, k):
    raise ValueError(
      f"qwen3_moe.forward: routes shape {routes.shape} != [B, T, L, k] {(B, T, L, k)}"
    )
  attend = qwen3._attention_fn(c, mask, segment_ids)
  routes_l = None if routes is None else jnp.moveaxis(routes.astype(jnp.int32), 2, 0)

  def dense_layer(x, xs):
    p, pm = xs
    x = qwen3._attention_residual(x, p, positions, attend, c)
    h = qwen3.rms_norm(x, p["post_attention_layernorm"]["scale"], c.rms_norm_eps)
    return constrain(x + qwen3._mlp(h, pm), ("batch", "seq", "act_embed")), None

  def sparse_layer(x, xs):
    p, pm, r = xs
    x = qwen3._attention_residual(x, p, positions, attend, c)
    h = qwen3.rms_norm(x, p["post_attention_layernorm"]["scale"], c.rms_norm_eps)
    y, rt, stats = moe.sparse_mlp(h, pm, c, routes=r, valid=mask)
    x = constrain(x + y, ("batch", "seq", "act_embed"))
    out = (rt.topk.reshape(B, T, k), rt.ids.reshape(B, T, k), stats)
    if return_probs:
      if rt.probs is None:
        raise ValueError("qwen3_moe.forward: return_probs is not available expert parallel")
      out += (rt.probs.reshape(B, T, -1),)
    return x, out

  x = qwen3._embed(params, input_ids, c)
  n_dense, n_sparse = len(c.dense_layers), len(c.sparse_layers)
  topk, used, stats, probs = [], [], [], []
  for sparse, a, b, r0 in runs(c):
    p = _rows(params["layers"], a, b, L)
    n = b - a
    if not sparse:
      pm = _rows(params["dense_mlp"], r0, r0 + n, n_dense)
      x, _ = jax.lax.scan(qwen3._maybe_remat(dense_layer, c), x, (p, pm))
      none = jnp.full((n, B, T, k), ROUTE_SENTINEL, jnp.int32)
      topk.append(none)
      used.append(none)
      if return_probs:
        probs.append(jnp.full((n, B, T, c.num_experts), jnp.nan, jnp.float32))
      continue
    pm = _rows(params["moe"], r0, r0 + n, n_sparse)
    r = None if routes_l is None else routes_l[a:b]
    x, ys = jax.lax.scan(qwen3._maybe_remat(sparse_layer, c), x, (p, pm, r))
    topk.append(ys[0])
    used.append(ys[1])
    stats.append(ys[2])
    if return_probs:
      probs.append(ys[3])
  logits = qwen3._logits(params, x, c)
  if not return_aux:
    return logits
  aux = MoeAux(
    topk=jnp.moveaxis(jnp.concatenate(topk), 0, 2),
    routes=jnp.moveaxis(jnp.concatenate(used), 0, 2),
    stats=jax.tree.map(lambda *a: jnp.concatenate(a), *stats)
    if stats
    else moe.LayerStats(*(jnp.zeros((0,) + s) for s in ((c.num_experts,),) * 2 + ((),) * 3)),
    probs=jnp.moveaxis(jnp.concatenate(probs), 0, 2) if return_probs else None,
  )
  return logits, aux


def aux_losses(aux: MoeAux, config: Qwen3MoeConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(weighted auxiliary loss to add to the training loss, metrics).

  ``router_aux_loss_coef * load_balancing_loss + router_z_loss_coef * router_z_loss`` over
  the sparse layers; metrics: both losses and the per-layer expert load / router entropy of
  `moe.expert_metrics` (the ``*_mean`` entries average over layers)."""
  if aux.stats.counts.shape[0] == 0:  # every layer dense (mlp_only_layers): nothing to balance
    return jnp.zeros((), jnp.float32), {}
  lb = moe.load_balancing_loss(aux.stats, config.num_experts_per_tok)
  z = moe.router_z_loss(aux.stats)
  total = config.router_aux_loss_coef * lb + config.router_z_loss_coef * z
  metrics = {"moe/load_balancing_loss": lb, "moe/router_z_loss": z}
  metrics.update({f"moe/{k}": v for k, v in moe.expert_metrics(aux.stats).items()})
  return total, metrics


def forward_cached(params, config: Qwen3MoeConfig, input_ids, cache, input_mask=None):
  """KV-cached prefill / decode: ``qwen3.forward_cached`` (which runs sparse layers through
  `moe.sparse_mlp` with the router's own top-k). Params in the stacked or
  ``qwen3.inference_params`` layout; returns (logits [B, T, V] float32, new cache)."""
  _check(config, "forward_cached")
  return qwen3.forward_cached(params, config, input_ids, cache, input_mask)

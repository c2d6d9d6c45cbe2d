"""Mixture-of-experts MLP as pure functions: softmax router, top-k (or forced) routes, dropless
grouped expert SwiGLU, load-balancing / z losses and expert metrics.

Routing follows transformers' ``Qwen3MoeSparseMoeBlock``: router logits ``x @ gate`` in the
compute dtype, softmax over all E experts in float32, top-k of the probabilities, renormalised
to sum 1 when ``norm_topk_prob``, gate weights cast back to the compute dtype.

Forced routes (rollout routing replay). ``routes`` holds, per token, k recorded expert ids
(int32, ``[..., k]``); a token whose k ids are not all in ``[0, E)`` (the sentinel is ``-1``)
has no recorded route and uses the router's own top-k, so a sentinel never selects expert 0.
For a recorded token the top-k SET is the recorded one and the gate weights are the learner's
own softmax probabilities gathered at those experts (renormalised when ``norm_topk_prob``):
the router keeps its gradient.

Grouped expert computation (dropless: no capacity factor, no dropped token). The ``N * k``
(token, expert) rows are sorted by expert; then per ``implementation``:

* ``"ragged"``: ``jax.lax.ragged_dot`` over the expert groups (a grouped GEMM on GPU / TPU).
* ``"block"``: each expert's group is padded to a multiple of a row block, one expert per
  block, and all blocks run as one batched matmul against their expert's weights. XLA:CPU
  lowers ``ragged_dot`` to a loop that is slower than running every expert; this form is the
  CPU default. Padding costs at most ``E`` blocks of rows.
* ``"dense"``: every expert on every token, weighted by the (sparse) gate matrix: the
  reference the others are tested against (E / k times the FLOPs).
* ``"auto"``: ``"block"`` on CPU, ``"ragged"`` elsewhere.

Shapes: ``x`` [N, D]; router kernel ``gate`` [D, E]; experts ``gate_proj`` / ``up_proj``
[E, D, F], ``down_proj`` [E, F, D]. Leading dims of ``x`` beyond one are flattened.

Expert parallelism. Traced under a mesh (``jax.set_mesh``) whose ``expert`` axis has size
P > 1, `sparse_mlp` runs inside ``jax.shard_map``: each device holds E / P experts (the
``expert`` logical axis of the sharding rules) and its own slice of the tokens (the batch is
split over ``expert`` too). A device routes its tokens, sends each (token, expert) row to the
device owning the expert with one ``all_to_all`` over ``expert``, runs its local experts
(grouped as above) and sends the results back with a second ``all_to_all``. Composed with
FSDP / tensor parallelism: the router and expert weights arrive split as the rules say and are
all-gathered over their other axes inside the map (their gradients reduce-scattered back).
Static shapes and no dropped token mean a send buffer of the worst case (every row to one
device): P x the rows of a balanced exchange, and as many rows of expert compute. That is
correct for any routing and fine at test and small scale; a ``ragged_all_to_all`` exchange
sized by a capacity bound is the upgrade for large EP on GPU / TPU.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from rstar_jax.sharding.rules import active_rules, logical_to_spec

IMPLEMENTATIONS = ("auto", "ragged", "block", "dense")

Params = dict[str, Any]


class Routing(NamedTuple):
  """One MoE layer's routing for N tokens.

  topk: [N, k] int32, the router's own top-k expert ids (descending probability).
  ids: [N, k] int32, the experts used (= ``topk`` except where a route was forced).
  weights: [N, k] compute dtype, gate weight per used expert.
  logits: [N, E] float32 router logits.
  probs: [N, E] float32 softmax of ``logits``.
  """

  topk: jax.Array
  ids: jax.Array
  weights: jax.Array
  logits: jax.Array
  probs: jax.Array


class LayerStats(NamedTuple):
  """Sufficient statistics of one layer's routing over the valid tokens (sums, so they add
  across micro-batches and devices). counts [E] f32: (token, slot) assignments per used
  expert; prob_sum [E]: router probability mass per expert; z_sum: sum of logsumexp(logits)^2;
  entropy_sum: sum of router entropies (nats); tokens: number of valid tokens."""

  counts: jax.Array
  prob_sum: jax.Array
  z_sum: jax.Array
  entropy_sum: jax.Array
  tokens: jax.Array


# ----------------------------------------------------------------------------- routing


def valid_routes(routes: jax.Array, num_experts: int) -> jax.Array:
  """[..., k] recorded ids -> [...] bool: all k ids in [0, E) (a sentinel -1 anywhere: False)."""
  return jnp.all((routes >= 0) & (routes < num_experts), axis=-1)


def route(
  x: jax.Array,
  gate: jax.Array,
  k: int,
  norm_topk_prob: bool,
  routes: jax.Array | None = None,
) -> Routing:
  """Router. x: [N, D]; gate: [D, E]; routes: optional [N, k] int (forced; -1 = none)."""
  logits = (x @ gate.astype(x.dtype)).astype(jnp.float32)
  probs = jax.nn.softmax(logits, axis=-1)
  top_p, topk = jax.lax.top_k(probs, k)
  topk = topk.astype(jnp.int32)
  ids = topk
  if routes is not None:
    if routes.shape != topk.shape:
      raise ValueError(f"moe.route: routes shape {routes.shape} != expected {topk.shape}")
    forced = valid_routes(routes, gate.shape[-1])[:, None]
    ids = jnp.where(forced, routes.astype(jnp.int32), topk)
    top_p = jnp.take_along_axis(probs, ids, axis=-1)
  if norm_topk_prob:
    top_p = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
  return Routing(topk, ids, top_p.astype(x.dtype), logits, probs)


def layer_stats(r: Routing, valid: jax.Array | None = None) -> LayerStats:
  """Routing statistics over tokens with ``valid`` [N] (default all)."""
  N, E = r.probs.shape
  w = jnp.ones((N,), jnp.float32) if valid is None else valid.astype(jnp.float32)
  counts = jnp.zeros((E,), jnp.float32).at[r.ids].add(jnp.broadcast_to(w[:, None], r.ids.shape))
  logp = jax.nn.log_softmax(r.logits, axis=-1)
  lse = jax.nn.logsumexp(r.logits, axis=-1)
  entropy = -jnp.sum(r.probs * logp, axis=-1)
  return LayerStats(
    counts=jax.lax.stop_gradient(counts),
    prob_sum=jnp.sum(r.probs * w[:, None], axis=0),
    z_sum=jnp.sum(w * lse * lse),
    entropy_sum=jax.lax.stop_gradient(jnp.sum(w * entropy)),
    tokens=jnp.sum(w),
  )


# ----------------------------------------------------------------------------- losses / metrics


def load_balancing_loss(stats: LayerStats, k: int) -> jax.Array:
  """Switch-Transformer balance loss, global-batch form, mean over layers.

  ``E * sum_e f_e * P_e`` with ``f_e = counts_e / (k * tokens)`` (fraction of assignments,
  no gradient) and ``P_e = prob_sum_e / tokens`` (mean router probability). Both come from
  statistics summed over the whole batch (every micro-batch and device that made ``stats``),
  not averaged per sequence: the "global-batch" balance of Qiu et al. 2025
  (arXiv:2501.11873). 1.0 at perfect balance. Stats: [L, E] / [L] (or unstacked).
  transformers' ``load_balancing_loss_func`` is ``k`` times this.
  """
  E = stats.counts.shape[-1]
  n = jnp.maximum(stats.tokens, 1.0)[..., None]
  f = stats.counts / (k * n)
  p = stats.prob_sum / n
  return jnp.mean(E * jnp.sum(f * p, axis=-1))


def router_z_loss(stats: LayerStats) -> jax.Array:
  """ST-MoE router z-loss: mean over tokens of logsumexp(logits)^2, mean over layers."""
  return jnp.mean(stats.z_sum / jnp.maximum(stats.tokens, 1.0))


def expert_metrics(stats: LayerStats) -> dict[str, jax.Array]:
  """Per-layer expert load and router entropy, from [L, E] / [L] stats.

  ``load`` is each expert's share of the assignments times E (1.0 = perfectly balanced);
  returns ``load_min`` / ``load_max`` / ``load_cv`` (std / mean over experts) [L] and
  ``router_entropy`` [L] (mean nats per token), plus their means over layers.
  """
  E = stats.counts.shape[-1]
  total = jnp.maximum(jnp.sum(stats.counts, axis=-1, keepdims=True), 1.0)
  load = stats.counts / total * E
  out = {
    "load_min": jnp.min(load, axis=-1),
    "load_max": jnp.max(load, axis=-1),
    "load_cv": jnp.std(load, axis=-1) / jnp.maximum(jnp.mean(load, axis=-1), 1e-9),
    "router_entropy": stats.entropy_sum / jnp.maximum(stats.tokens, 1.0),
  }
  out.update({f"{k}_mean": jnp.mean(v) for k, v in list(out.items())})
  return out


# ----------------------------------------------------------------------------- experts


def _swiglu(x, wg, wu, wd, dot):
  return dot(jax.nn.silu(dot(x, wg)) * dot(x, wu), wd)


def experts_dense(x: jax.Array, ids: jax.Array, weights: jax.Array, p: Params) -> jax.Array:
  """Reference: every expert on every token, combined with the sparse gate matrix. [N, D]."""
  E = p["gate_proj"]["kernel"].shape[0]
  dt = x.dtype
  wg, wu, wd = (p[n]["kernel"].astype(dt) for n in ("gate_proj", "up_proj", "down_proj"))
  h = jax.nn.silu(jnp.einsum("nd,edf->enf", x, wg)) * jnp.einsum("nd,edf->enf", x, wu)
  y = jnp.einsum("enf,efd->end", h, wd)
  combine = jnp.sum(jax.nn.one_hot(ids, E, dtype=dt) * weights[..., None], axis=1)  # [N, E]
  return jnp.einsum("ne,end->nd", combine, y)


def _sort_rows(ids: jax.Array, E: int):
  """Flat (token, slot) rows sorted by expert: (order [M], group sizes [E], expert of each
  sorted row [M]); M = N * k, stable so rows of one expert keep token order."""
  flat = ids.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  sizes = jnp.zeros((E,), jnp.int32).at[flat].add(1)
  return order, sizes, flat[order]


def _combine(y_rows: jax.Array, weights: jax.Array) -> jax.Array:
  """[M, D] rows in (token, slot) order -> [N, D] weighted sum over the k slots."""
  N, k = weights.shape
  y = y_rows.reshape(N, k, -1) * weights[..., None].astype(y_rows.dtype)
  return jnp.sum(y, axis=1)


_planning = threading.local()


@contextlib.contextmanager
def shape_only_grouped_matmul():
  """Ahead-of-time planning only (`rstar_jax.planning.plan`): while tracing inside this
  context, the ``ragged`` form's grouped matmul is a stand-in with the grouped GEMM's operand
  and result shapes, FLOPs (2 x rows x in x out) and weight-gradient shape, but not its values
  (rows against expert 0's weights). XLA:CPU expands ``ragged_dot`` into a dense masked product
  (temporaries = groups x the result), which would make a CPU compile of the GPU program
  report memory the GPU never uses. A program traced here must never run."""
  prev = getattr(_planning, "on", False)
  _planning.on = True
  try:
    yield
  finally:
    _planning.on = prev


def _grouped_dot(a: jax.Array, w: jax.Array, sizes: jax.Array) -> jax.Array:
  if getattr(_planning, "on", False):
    return a @ w[0]
  return jax.lax.ragged_dot(a, w, sizes)


def experts_ragged(x: jax.Array, ids: jax.Array, weights: jax.Array, p: Params) -> jax.Array:
  """Sorted rows through ``jax.lax.ragged_dot`` (one grouped GEMM per projection). [N, D]."""
  E = p["gate_proj"]["kernel"].shape[0]
  k = ids.shape[-1]
  order, sizes, _ = _sort_rows(ids, E)
  xs = x[order // k]
  dt = x.dtype

  def dot(a, w):
    return _grouped_dot(a, w.astype(dt), sizes)

  ys = _swiglu(xs, p["gate_proj"]["kernel"], p["up_proj"]["kernel"], p["down_proj"]["kernel"], dot)
  inv = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
  return _combine(ys[inv], weights)


def block_size_for(rows: int, num_experts: int, max_block: int) -> int:
  """Row block of the "block" form: a power of two near the mean group size, >= 8, capped
  at ``max_block``, so few tokens (decode) do not pay for large mostly-empty blocks."""
  mean = max(1, -(-rows // num_experts))
  return max(1, min(max_block, max(8, 1 << (mean - 1).bit_length())))


def experts_block(
  x: jax.Array, ids: jax.Array, weights: jax.Array, p: Params, max_block: int = 256
) -> jax.Array:
  """Expert groups padded to row blocks (one expert per block), one batched matmul. [N, D].

  With M = N * k rows and block b, the static block count ``ceil(M / b) + E`` bounds
  ``sum_e ceil(size_e / b)`` for any routing, so nothing is dropped; each block gathers its
  expert's weights. Padding rows are zeros and never read back.
  """
  E = p["gate_proj"]["kernel"].shape[0]
  N, k = ids.shape
  M = N * k
  bs = block_size_for(M, E, max_block)
  nb = -(-M // bs) + E
  order, sizes, _ = _sort_rows(ids, E)
  blocks = -(-sizes // bs)  # [E]
  block_end = jnp.cumsum(blocks)
  block_start = block_end - blocks
  row_start = jnp.cumsum(sizes) - sizes
  block_expert = jnp.minimum(
    jnp.searchsorted(block_end, jnp.arange(nb), side="right"), E - 1
  ).astype(jnp.int32)  # [nb]
  # Padded slot (b, s) holds sorted row row_start[e] + rank when rank < size[e].
  rank = (jnp.arange(nb) - block_start[block_expert])[:, None] * bs + jnp.arange(bs)[None, :]
  slot_ok = rank < sizes[block_expert][:, None]  # [nb, bs]
  src = jnp.where(slot_ok, row_start[block_expert][:, None] + rank, 0)
  tok = order[src.reshape(-1)] // k
  dt = x.dtype
  xp = jnp.where(slot_ok.reshape(-1, 1), x[tok], 0).reshape(nb, bs, -1)

  def dot(a, w):
    return jnp.einsum("bsi,bio->bso", a, w.astype(dt)[block_expert])

  yp = _swiglu(xp, p["gate_proj"]["kernel"], p["up_proj"]["kernel"], p["down_proj"]["kernel"], dot)
  # Sorted row r sits at padded position block_start[e]*bs + (r - row_start[e]).
  e_sorted = jnp.sort(ids.reshape(-1))
  pos_sorted = block_start[e_sorted] * bs + jnp.arange(M) - row_start[e_sorted]
  pos = jnp.zeros((M,), pos_sorted.dtype).at[order].set(pos_sorted)  # (token, slot) order
  return _combine(yp.reshape(nb * bs, -1)[pos], weights)


def resolve_implementation(implementation: str) -> str:
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"moe: implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}"
    )
  if implementation == "auto":
    return "block" if jax.default_backend() == "cpu" else "ragged"
  return implementation


def experts(
  x: jax.Array,
  ids: jax.Array,
  weights: jax.Array,
  p: Params,
  implementation: str = "auto",
  max_block: int = 256,
) -> jax.Array:
  """Dropless weighted expert SwiGLU. x [N, D]; ids / weights [N, k]; returns [N, D]."""
  impl = resolve_implementation(implementation)
  if impl == "dense":
    return experts_dense(x, ids, weights, p)
  if impl == "ragged":
    return experts_ragged(x, ids, weights, p)
  return experts_block(x, ids, weights, p, max_block)


# ----------------------------------------------------------------------------- the layer


def _expert_axis_size() -> int:
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty or "expert" not in mesh.axis_names:
    return 1
  return dict(zip(mesh.axis_names, mesh.axis_sizes))["expert"]


def sparse_mlp(
  x: jax.Array,
  p: Params,
  config,
  routes: jax.Array | None = None,
  valid: jax.Array | None = None,
) -> tuple[jax.Array, Routing, LayerStats]:
  """One MoE MLP. x: [..., D]; p: {"gate": {"kernel": [D, E]}, "experts": {...}};
  config: a ``Qwen3MoeConfig`` (``num_experts_per_tok``, ``norm_topk_prob``,
  ``moe_implementation``, ``moe_block_size``); routes: [..., k] int or None; valid: [...]
  bool tokens counted in the stats (default all). Returns (y [..., D], Routing with [N, ...]
  arrays, LayerStats). Expert parallel under a mesh with an ``expert`` axis (x then [B, T, D])."""
  if _expert_axis_size() > 1 and x.ndim == 3:
    return _sparse_mlp_ep(x, p, config, routes, valid)
  lead, D = x.shape[:-1], x.shape[-1]
  xf = x.reshape(-1, D)
  k = config.num_experts_per_tok
  rf = None if routes is None else routes.reshape(-1, k)
  r = route(xf, p["gate"]["kernel"], k, config.norm_topk_prob, rf)
  y = experts(xf, r.ids, r.weights, p["experts"], config.moe_implementation, config.moe_block_size)
  stats = layer_stats(r, None if valid is None else valid.reshape(-1))
  return y.reshape(*lead, D), r, stats


def _ep_local(x, gate, ex, routes, valid, *, config, batch_axes, gather_axes, num_experts):
  """Per-device body of the expert-parallel layer (inside shard_map). x: [b, T, D] local."""
  b, T, D = x.shape
  k = config.num_experts_per_tok
  # FSDP / tensor shards of the weights -> whole matrices (transpose: reduce-scatter).
  gate = _gather_dims(gate, ("embed", None), gather_axes)
  ex = {
    "gate_proj": {
      "kernel": _gather_dims(ex["gate_proj"]["kernel"], (None, "embed", "mlp"), gather_axes)
    },
    "up_proj": {
      "kernel": _gather_dims(ex["up_proj"]["kernel"], (None, "embed", "mlp"), gather_axes)
    },
    "down_proj": {
      "kernel": _gather_dims(ex["down_proj"]["kernel"], (None, "mlp", "embed"), gather_axes)
    },
  }
  E_loc = ex["gate_proj"]["kernel"].shape[0]
  ep = num_experts // E_loc
  xf = x.reshape(-1, D)
  n = xf.shape[0]
  rf = None if routes is None else routes.reshape(n, k)
  r = route(xf, gate, k, config.norm_topk_prob, rf)
  stats = layer_stats(r, None if valid is None else valid.reshape(-1))
  stats = jax.tree.map(lambda a: jax.lax.psum(a, batch_axes), stats) if batch_axes else stats
  # Dispatch: row (token, slot) -> device ids // E_loc, slot = its rank among that device's rows.
  M = n * k
  flat = r.ids.reshape(-1)
  dest = flat // E_loc
  order = jnp.argsort(dest, stable=True)
  counts = jnp.zeros((ep,), jnp.int32).at[dest].add(1)
  starts = jnp.cumsum(counts) - counts
  rank_sorted = jnp.arange(M) - starts[dest[order]]
  rank = jnp.zeros((M,), jnp.int32).at[order].set(rank_sorted.astype(jnp.int32))
  tok = jnp.arange(M) // k
  send_x = jnp.zeros((ep, M, D), x.dtype).at[dest, rank].set(xf[tok])
  send_e = jnp.full((ep, M), -1, jnp.int32).at[dest, rank].set(flat % E_loc)
  recv_x = jax.lax.all_to_all(send_x, "expert", 0, 0, tiled=True)  # [ep, M, D] from each peer
  recv_e = jax.lax.all_to_all(send_e, "expert", 0, 0, tiled=True)
  rows_e = recv_e.reshape(-1, 1)
  ok = rows_e >= 0
  # Empty slots hold zeros (SwiGLU(0) = 0) on local expert 0; one weight each, k = 1.
  y_rows = experts(
    recv_x.reshape(-1, D),
    jnp.where(ok, rows_e, 0),
    ok.astype(x.dtype),
    ex,
    config.moe_implementation,
    config.moe_block_size,
  ).reshape(ep, M, D)
  back = jax.lax.all_to_all(y_rows, "expert", 0, 0, tiled=True)  # [ep, M, D], my rows
  y = _combine(back[dest, rank], r.weights)
  return y.reshape(b, T, D), r.topk.reshape(b, T, k), r.ids.reshape(b, T, k), stats


def _gather_dims(w, kinds, gather_axes):
  """All-gather ``w`` along each dim whose kind ("embed" / "mlp") is sharded (tiled)."""
  for dim, kind in enumerate(kinds):
    for axis in gather_axes.get(kind, ()):
      w = jax.lax.all_gather(w, axis, axis=dim, tiled=True, to="invarying")
  return w


def _axes(spec_entry) -> tuple[str, ...]:
  if spec_entry is None:
    return ()
  return (spec_entry,) if isinstance(spec_entry, str) else tuple(spec_entry)


def _sparse_mlp_ep(x, p, config, routes, valid):
  mesh = jax.sharding.get_abstract_mesh()
  rules = active_rules()
  B, T, D = x.shape
  E, k = config.num_experts, config.num_experts_per_tok
  ep = dict(zip(mesh.axis_names, mesh.axis_sizes))["expert"]
  if E % ep:
    raise ValueError(f"moe: num_experts {E} is not divisible by the expert mesh axis ({ep})")
  ex = p["experts"]
  F = ex["gate_proj"]["kernel"].shape[-1]
  x_spec = logical_to_spec(("batch", None, None), rules, mesh, x.shape)
  batch_axes = _axes(x_spec[0])
  w_spec = logical_to_spec(("expert", "embed", "expert_mlp"), rules, mesh, (E, D, F))
  d_spec = logical_to_spec(("expert", "expert_mlp", "embed"), rules, mesh, (E, F, D))
  g_spec = logical_to_spec(("embed", None), rules, mesh, (D, E))
  if _axes(w_spec[0]) != ("expert",):
    raise ValueError(
      "moe: expert parallelism needs the 'expert' logical axis on the 'expert' mesh axis"
    )
  gather_axes = {"embed": _axes(w_spec[1]), "mlp": _axes(w_spec[2])}
  if _axes(d_spec[1]) != gather_axes["mlp"] or _axes(d_spec[2]) != gather_axes["embed"]:
    raise ValueError("moe: down_proj must be split like gate_proj / up_proj (transposed)")
  if _axes(g_spec[0]) != gather_axes["embed"]:
    raise ValueError("moe: the router's model width must be split like the experts'")
  tok = P(*x_spec[:1], None, None)
  ex_spec = {
    "gate_proj": {"kernel": w_spec},
    "up_proj": {"kernel": w_spec},
    "down_proj": {"kernel": d_spec},
  }
  if routes is not None:
    routes = routes.reshape(B, T, k)
  if valid is not None:
    valid = valid.reshape(B, T)
  body = functools.partial(
    _ep_local, config=config, batch_axes=batch_axes, gather_axes=gather_axes, num_experts=E
  )
  stats_spec = LayerStats(P(), P(), P(), P(), P())
  y, topk, ids, stats = jax.shard_map(
    body,
    mesh=mesh,
    in_specs=(tok, g_spec, ex_spec, tok, P(*x_spec[:1], None)),
    out_specs=(tok, tok, tok, stats_spec),
  )(x, p["gate"]["kernel"], ex, routes, valid)
  # The gate weights / logits stay inside the map; callers use topk, ids and stats.
  r = Routing(topk.reshape(-1, k), ids.reshape(-1, k), None, None, None)
  return y, r, stats


def active_flops_per_token(config) -> int:
  """Multiply-adds x 2 of the expert SwiGLU per token (k experts), for benchmarks."""
  return 2 * 3 * config.hidden_size * config.moe_intermediate_size * config.num_experts_per_tok


__all__ = [
  "IMPLEMENTATIONS",
  "LayerStats",
  "Routing",
  "active_flops_per_token",
  "block_size_for",
  "expert_metrics",
  "experts",
  "experts_block",
  "experts_dense",
  "experts_ragged",
  "layer_stats",
  "load_balancing_loss",
  "resolve_implementation",
  "route",
  "router_z_loss",
  "shape_only_grouped_matmul",
  "sparse_mlp",
  "valid_routes",
]

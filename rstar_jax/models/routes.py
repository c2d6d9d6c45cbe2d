"""Recorded MoE routes (rollout routing replay): the array convention, host-side alignment and
the agreement metric.

A *route* is the top-k expert set a router chose for one token at one MoE layer. Routes travel
as int32 arrays whose leading axes follow the tokens and whose last two are ``[L, k]``: one row
per decoder layer (L = ``num_hidden_layers``, as ``qwen3_moe.forward(routes=...)`` takes them
and as SGLang reports them) and the k expert ids of that layer (order carries no meaning: a
route is a set). ``NO_ROUTE`` (-1) fills the rows of dense layers (``mlp_only_layers``) and
every row of a token without a recorded route (a prompt or tool token the engine did not
report, the trajectory's last token, padding); the learner's forward then routes that token
itself. A sentinel never becomes an expert id: the forward treats any id outside [0, E) as
"not recorded", and nothing here pads a routes array with zeros.

Position convention: the route at sequence position t is the routing of the forward step whose
INPUT is token t (the step that predicts token t + 1), exactly what the learner's forward
computes at column t. An engine that samples token t + 1 therefore reports the route of
position t; the last token of a sequence has none until something is generated after it.

Layering: pure numpy / jax, no model code, so the rollout (engines, agent loop), the learner
(batch, packing, steps) and the pipelines all share it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

NO_ROUTE = -1
ROUTES_DTYPE = np.int32


@dataclasses.dataclass(frozen=True)
class RouteLayout:
  """Which rows a token's route holds.

  num_hidden_layers: L, one row per decoder layer.
  top_k: experts per token (``num_experts_per_tok``).
  layers: ascending indices of the MoE (sparse) layers; the other rows are NO_ROUTE.
  """

  num_hidden_layers: int
  top_k: int
  layers: tuple[int, ...]

  def __post_init__(self):
    object.__setattr__(self, "layers", tuple(int(i) for i in self.layers))
    if self.top_k < 1:
      raise ValueError(f"RouteLayout.top_k: expected >= 1, got {self.top_k}")
    if not self.layers or list(self.layers) != sorted(set(self.layers)):
      raise ValueError(f"RouteLayout.layers: expected ascending unique indices, got {self.layers}")
    if self.layers[0] < 0 or self.layers[-1] >= self.num_hidden_layers:
      raise ValueError(
        f"RouteLayout.layers: {self.layers} outside [0, {self.num_hidden_layers}) hidden layers"
      )

  @property
  def shape(self) -> tuple[int, int]:
    """Per-token route shape ``(L, k)``."""
    return (self.num_hidden_layers, self.top_k)

  def dense_rows_cleared(self, routes: np.ndarray) -> np.ndarray:
    """``routes`` [..., L, k] with the rows of dense layers set to NO_ROUTE (an engine may
    leave anything there: SGLang never writes them)."""
    out = np.array(routes, ROUTES_DTYPE)
    dense = [i for i in range(self.num_hidden_layers) if i not in set(self.layers)]
    out[..., dense, :] = NO_ROUTE
    return out


def moe_layers(
  num_hidden_layers: int, decoder_sparse_step: int = 1, mlp_only_layers: Sequence[int] = ()
) -> tuple[int, ...]:
  """Hidden-layer indices that are MoE under HF Qwen3-MoE's rule: layer i is sparse when it is
  not in ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``."""
  dense = set(int(i) for i in mlp_only_layers)
  step = max(int(decoder_sparse_step), 1)
  return tuple(i for i in range(num_hidden_layers) if i not in dense and (i + 1) % step == 0)


def layout_of(config) -> RouteLayout | None:
  """The route layout of a model config (HF field names: ``num_experts``,
  ``num_experts_per_tok``, ``decoder_sparse_step``, ``mlp_only_layers``); None for a dense
  model (no experts), whose trajectories carry no routes."""
  num_experts = int(getattr(config, "num_experts", 0) or 0)
  if num_experts <= 0:
    return None
  n = int(config.num_hidden_layers)
  layers = getattr(config, "sparse_layers", None)  # Qwen3MoeConfig knows its own
  if layers is None:
    layers = moe_layers(
      n,
      getattr(config, "decoder_sparse_step", 1) or 1,
      getattr(config, "mlp_only_layers", ()) or (),
    )
  if not layers:
    return None
  return RouteLayout(n, int(config.num_experts_per_tok), layers)


def empty_routes(num_tokens: int, shape: tuple[int, int]) -> np.ndarray:
  """``[num_tokens, R, k]`` int32 of NO_ROUTE."""
  return np.full((int(num_tokens),) + tuple(shape), NO_ROUTE, ROUTES_DTYPE)


def has_route(routes) -> np.ndarray:
  """``[..., R, k]`` -> ``[...]`` bool: the token has a recorded route (any non-sentinel id)."""
  return np.asarray(routes).max(axis=(-2, -1)) >= 0


def write_routes(dst: np.ndarray, start: int, src: np.ndarray) -> None:
  """Writes ``src`` [S, R, k] into ``dst`` [N, R, k] at positions ``start ... start + S - 1``
  (cut at N), in place, filling only tokens that have no route yet: the first report of a
  position wins, and a NO_ROUTE report never erases one.

  Why the first: the route at position t decides the distribution token t + 1 was sampled
  from, and the first report is the computation that sampled it. A later report of the same
  position is a recomputation (a later turn re-prefilling a prefix whose kept cache was
  evicted, SGLang after a radix-cache eviction, a resubmitted partial rollout) whose bf16
  numerics can flip a near-tie; letting it win replays experts that token t + 1 never saw
  (issue 39: a replayed importance ratio of 0.016 where the learner's own routing gave
  0.96; docs/routing_replay.md). The later turns' tokens keep their own positions' routes and
  see the recomputed ones only through attention."""
  src = np.asarray(src)
  if src.ndim != 3 or src.shape[1:] != dst.shape[1:]:
    raise ValueError(f"write_routes: routes of shape {src.shape} into a [N, *{dst.shape[1:]}]")
  if start < 0:
    raise ValueError(f"write_routes: negative start {start}")
  end = min(start + src.shape[0], dst.shape[0])
  if end <= start:
    return
  src = src[: end - start]
  fill = has_route(src) & ~has_route(dst[start:end])
  dst[start:end][fill] = src[fill]


def check_routes(routes, num_tokens: int, where: str, shape: tuple[int, int] | None = None):
  """Raises ValueError naming ``where`` unless ``routes`` is ``[num_tokens, R, k]`` int."""
  arr = np.asarray(routes)
  if arr.ndim != 3 or arr.shape[0] != num_tokens or (shape is not None and arr.shape[1:] != shape):
    want = f"[{num_tokens}, {', '.join(map(str, shape)) if shape else 'R, k'}]"
    raise ValueError(f"{where}: routes must have shape {want}, got {list(arr.shape)}")
  if not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f"{where}: routes must be integer expert ids, got dtype {arr.dtype}")
  return arr


# ----------------------------------------------------------------------------- metrics


def same_sets(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
  """``[..., k]`` x ``[..., k]`` -> ``[...]`` bool: the two top-k id sets are equal, in any
  order. Ids within one route are distinct (top-k), so sorting both compares the sets."""
  return jnp.all(jnp.sort(a, axis=-1) == jnp.sort(b, axis=-1), axis=-1)


def agreement_sums(
  learner: jnp.ndarray,
  engine: jnp.ndarray,
  mask: jnp.ndarray,
  layers: Sequence[int] | None = None,
) -> dict[str, tuple[jnp.ndarray, jnp.ndarray]]:
  """(numerator, denominator) sums of router agreement between the learner and the engine.

  Args:
    learner: [B, T, L, k] int the learner's own top-k ids (its router, not the replayed ones;
      ``qwen3_moe.MoeAux.topk``).
    engine: [B, T, L, k] int the engine's recorded ids, NO_ROUTE where none was recorded.
    mask: [B, T] the tokens to count (e.g. attention_mask; pass loss_mask for loss tokens).
    layers: the layers that get a per-layer metric (the MoE layers; static); None = none.
  Returns:
    ``routing/agree``: the share of tokens whose top-k set equals the engine's at every layer
    the engine recorded, over tokens with a recorded route (sentinel tokens excluded);
    ``routing/agree_layer{i}`` for i in ``layers``: the same at layer i over the tokens
    recorded there. Reduce with `rstar_jax.rl.losses.reduce_metrics` (num / den; NaN when
    nothing was recorded).
  """
  on = jnp.asarray(mask) > 0
  recorded = (engine >= 0).all(axis=-1) & on[..., None]  # [B, T, L]
  same = same_sets(learner, engine)  # [B, T, L]
  token = recorded.any(axis=-1).astype(jnp.float32)
  agree = jnp.all(same | ~recorded, axis=-1).astype(jnp.float32) * token
  out = {"routing/agree": (jnp.sum(agree), jnp.sum(token))}
  for i in layers or ():
    rec = recorded[..., i].astype(jnp.float32)
    out[f"routing/agree_layer{i}"] = (jnp.sum(rec * same[..., i]), jnp.sum(rec))
  return out

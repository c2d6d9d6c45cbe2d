"""Per-row KV cache for incremental decoding (continuous batching friendly).

One buffer per layer, in the layouts one-token attention reads without copying: keys
transposed ([B, Hkv, Dh, S], so scores are a plain matmul q @ K) and values [B, Hkv, S, Dh]
(weights @ V). A stacked [L, ...] buffer made XLA:CPU copy each layer's slice out of it on
every decode step, and an [S, Hkv, Dh] order made it transpose the slice before each dot; on
the 4.2M-param benchmark model those copies were over half of the step time.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rstar_jax.sharding.rules import logical_to_shardings


class KVCache(NamedTuple):
  """Cache pytree.

  Attributes:
    k: tuple of L arrays [B, Hkv, Dh, S]: keys, rotated by RoPE, position on the last axis.
    v: tuple of L arrays [B, Hkv, S, Dh]: values.
    lengths: [B] int32, valid tokens cached per row; row b's next token goes to slot
      ``lengths[b]`` and has position ``lengths[b]``. Slots >= lengths hold stale data that is
      never attended to, so resetting a row for a new sequence only needs ``lengths[b] = 0``.
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  lengths: jax.Array

  @property
  def max_len(self) -> int:
    return self.k[0].shape[-1]

  @property
  def num_layers(self) -> int:
    return len(self.k)

  def reset_rows(self, rows: jax.Array) -> KVCache:
    """Cache with ``lengths`` zeroed where ``rows`` ([B] bool) is True (slot reuse)."""
    return self._replace(lengths=jnp.where(rows, 0, self.lengths).astype(jnp.int32))


def _shapes(config, batch_size: int, max_len: int):
  hkv, dh = config.num_key_value_heads, config.head_dim
  return (batch_size, hkv, dh, max_len), (batch_size, hkv, max_len, dh)


def init_cache(config, batch_size: int, max_len: int, dtype=jnp.float32) -> KVCache:
  """Empty cache: zeros, ``lengths`` 0."""
  k_shape, v_shape = _shapes(config, batch_size, max_len)
  n = config.num_hidden_layers
  return KVCache(
    k=tuple(jnp.zeros(k_shape, dtype) for _ in range(n)),
    v=tuple(jnp.zeros(v_shape, dtype) for _ in range(n)),
    lengths=jnp.zeros((batch_size,), jnp.int32),
  )


def cache_logical_axes(num_layers: int) -> KVCache:
  """Logical axes of each cache field (see ``sharding.rules``): rows follow the batch and
  kv heads follow the tensor-split k/v projections, so decode needs no cache resharding."""
  return KVCache(
    k=(("batch", "act_heads", None, "cache_seq"),) * num_layers,
    v=(("batch", "act_heads", "cache_seq", None),) * num_layers,
    lengths=("batch",),
  )


def cache_shardings(config, mesh, batch_size: int, max_len: int, layout: str = "sampling"):
  """KVCache of NamedShardings for ``init_cache(config, batch_size, max_len)`` on ``mesh``;
  use as ``jax.jit(init_cache, ..., out_shardings=...)`` or with ``jax.device_put``."""

  k_shape, v_shape = _shapes(config, batch_size, max_len)
  n = config.num_hidden_layers
  shapes = KVCache(
    k=(jax.ShapeDtypeStruct(k_shape, jnp.float32),) * n,
    v=(jax.ShapeDtypeStruct(v_shape, jnp.float32),) * n,
    lengths=jax.ShapeDtypeStruct((batch_size,), jnp.int32),
  )
  return logical_to_shardings(cache_logical_axes(n), mesh, layout, shapes)

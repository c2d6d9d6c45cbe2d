"""Per-row KV cache for incremental decoding (continuous batching friendly)."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
    """Cache pytree.

    Attributes:
      k: [L, B, S, Hkv, Dh] keys, already rotated by RoPE.
      v: [L, B, S, Hkv, Dh] values.
      lengths: [B] int32, valid tokens cached per row; row b's next token goes to slot
        ``lengths[b]`` and has position ``lengths[b]``. Slots >= lengths hold stale data that is
        never attended to, so resetting a row for a new sequence only needs ``lengths[b] = 0``.
    """
    k: jax.Array
    v: jax.Array
    lengths: jax.Array

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def reset_rows(self, rows: jax.Array) -> "KVCache":
        """Cache with ``lengths`` zeroed where ``rows`` ([B] bool) is True (slot reuse)."""
        return self._replace(lengths=jnp.where(rows, 0, self.lengths).astype(jnp.int32))


def init_cache(config, batch_size: int, max_len: int, dtype=jnp.float32) -> KVCache:
    """Empty cache: zeros, ``lengths`` 0."""
    shape = (config.num_hidden_layers, batch_size, max_len, config.num_key_value_heads,
             config.head_dim)
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                   lengths=jnp.zeros((batch_size,), jnp.int32))


def cache_logical_axes() -> KVCache:
    """Logical axes of each cache field (see ``sharding.rules``): rows follow the batch and
    kv heads follow the tensor-split k/v projections, so decode needs no cache resharding."""
    kv = ("layers", "batch", "cache_seq", "act_heads", None)
    return KVCache(k=kv, v=kv, lengths=("batch",))


def cache_shardings(config, mesh, batch_size: int, max_len: int, layout: str = "sampling"):
    """KVCache of NamedShardings for ``init_cache(config, batch_size, max_len)`` on ``mesh``;
    use as ``jax.jit(init_cache, ..., out_shardings=...)`` or with ``jax.device_put``."""
    from rstar_jax.sharding.rules import logical_to_shardings
    shape = (config.num_hidden_layers, batch_size, max_len, config.num_key_value_heads,
             config.head_dim)
    shapes = KVCache(k=jax.ShapeDtypeStruct(shape, jnp.float32),
                     v=jax.ShapeDtypeStruct(shape, jnp.float32),
                     lengths=jax.ShapeDtypeStruct((batch_size,), jnp.int32))
    return logical_to_shardings(cache_logical_axes(), mesh, layout, shapes)

"""Paged KV cache for the rollout engine: one page pool sized by a token budget, per-row page
tables, and attention over a static window of each row's pages.

Why paged (not one [slots, max_len] buffer): memory is ``budget`` tokens however long a single
request may be, so a 16k-token response budget no longer means 16k positions for every slot;
and a trajectory's pages can be kept between its tool turns and handed to whichever decode row
serves its next turn (prefix reuse) without copying.

Why a window: attention reads the first ``W`` positions of each row (``W`` = the page table's
static width, a bucket chosen on the host from the rows' lengths), so its cost follows the
valid length, not the longest length the engine could hold; a bounded set of widths bounds the
compiled variants.

Layout: per layer k and v pools [N, P, Hkv, Dh] (N pages of P tokens). A row's window is the
gather ``pool[page_table[b]]`` -> [B, W, Hkv, Dh], the [batch, seq, heads, dim] layout that
``jax.nn.dot_product_attention`` (cuDNN on CUDA) takes without a transpose. Decode on the XLA
path keeps its window head-major instead (see `Window`).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rstar_jax.models import attention as attention_lib
from rstar_jax.models import qwen3

DECODE_IMPLEMENTATIONS = ("xla", "fused")

_logged: set[str] = set()


class PagedKV(NamedTuple):
  """k, v: tuples of L arrays [N, P, Hkv, Dh] (keys after RoPE)."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]

  @property
  def num_pages(self) -> int:
    return self.k[0].shape[0]

  @property
  def page_size(self) -> int:
    return self.k[0].shape[1]


def pool_bytes(config, num_pages: int, page_size: int, dtype) -> int:
  """Bytes of ``init_pool(config, num_pages, page_size, dtype)``."""
  per = page_size * config.num_key_value_heads * config.head_dim * jnp.dtype(dtype).itemsize
  return 2 * config.num_hidden_layers * num_pages * per


def init_pool(config, num_pages: int, page_size: int, dtype=jnp.float32) -> PagedKV:
  shape = (num_pages, page_size, config.num_key_value_heads, config.head_dim)
  n = config.num_hidden_layers
  return PagedKV(
    k=tuple(jnp.zeros(shape, dtype) for _ in range(n)),
    v=tuple(jnp.zeros(shape, dtype) for _ in range(n)),
  )


def attend_window(q, k, v, allowed, implementation: str = "xla"):
  """GQA attention of T queries over a window of W cached positions.

  Args:
    q: [B, T, Hq, Dh]; k, v: [B, W, Hkv, Dh]; allowed: [B, T, W] bool.
    implementation: "xla" (two dot_generals, float32 scores) or "fused"
      (``jax.nn.dot_product_attention``: cuDNN where the backend has it, else its XLA path).
  Returns:
    [B, T, Hq * Dh] in q.dtype. A query with no allowed key gets an unspecified finite value.
  """
  B, T, Hq, Dh = q.shape
  Hkv = k.shape[2]
  k, v = k.astype(q.dtype), v.astype(q.dtype)
  if implementation == "fused":
    reason = attention_lib.fused_unavailable_reason(q.dtype)
    if reason is None:
      try:
        o = jax.nn.dot_product_attention(q, k, v, mask=allowed[:, None], implementation="cudnn")
        return o.reshape(B, T, Hq * Dh)
      except (NotImplementedError, ValueError, RuntimeError) as e:  # raised while tracing
        reason = f"cuDNN rejected the call: {type(e).__name__}: {e}"
    if reason not in _logged:
      _logged.add(reason)
      logging.getLogger(__name__).info("decode attention 'fused': %s; XLA path", reason)
    o = jax.nn.dot_product_attention(q, k, v, mask=allowed[:, None], implementation="xla")
    return o.reshape(B, T, Hq * Dh)
  if implementation != "xla":
    raise ValueError(
      f"decode attention: expected one of {DECODE_IMPLEMENTATIONS}, got {implementation!r}"
    )
  return _xla_gqa(q, k, v, allowed, Hkv, "bwkd", "bwkd")


def _xla_gqa(q, k, v, allowed, Hkv: int, k_dims: str, v_dims: str):
  """GQA attention as two dot_generals with float32 scores; ``k_dims`` / ``v_dims`` name the
  key / value layouts in einsum letters (b batch, w position, k kv head, d head dim)."""
  B, T, Hq, Dh = q.shape
  qg = q.reshape(B, T, Hkv, Hq // Hkv, Dh)
  s = jnp.einsum(f"btkgd,{k_dims}->bkgtw", qg, k, preferred_element_type=jnp.float32)
  s = jnp.where(allowed[:, None, None], s * (Dh**-0.5), attention_lib.MASK_VALUE)
  w = jax.nn.softmax(s, axis=-1).astype(q.dtype)
  o = jnp.einsum(f"bkgtw,{v_dims}->btkgd", w, v)
  return o.reshape(B, T, Hq * Dh)


def forward_paged(
  params,
  config,
  input_ids: jax.Array,
  input_mask: jax.Array,
  pool: PagedKV,
  page_table: jax.Array,
  lengths: jax.Array,
  *,
  implementation: str = "xla",
  logits: bool = True,
):
  """Forward of T new tokens per row that appends them to the rows' pages and attends over
  each row's window; pure (jit with config / implementation / logits static, donate pool).

  Args:
    params: ``qwen3.inference_params`` (or stacked) layout.
    input_ids: [B, T] int32; input_mask: [B, T] bool, a prefix of each row (right padding;
      a row with no valid token writes nothing).
    pool: PagedKV.
    page_table: [B, n] int32 page ids; the window is W = n * P positions. Every position a
      row writes (``lengths[b] + t`` for its valid tokens) must lie in the window, on a page
      it owns; entries past a row's pages may name any page (never attended).
    lengths: [B] int32 tokens already cached per row (the first new token's position).
    logits: False skips the LM head (prefill of tokens whose logits nobody reads).
  Returns:
    (logits [B, T, V] float32 or None, pool).
  """
  c = config
  B, T = input_ids.shape
  N, P = pool.num_pages, pool.page_size
  W = page_table.shape[1] * P
  mask = input_mask.astype(bool)
  positions = lengths[:, None] + jnp.arange(T)[None, :]  # [B, T]
  page = jnp.take_along_axis(page_table, jnp.minimum(positions // P, page_table.shape[1] - 1), 1)
  page = jnp.where(mask, page, N)  # out of range: mode="drop" skips padding writes
  off = positions % P
  ks, vs = list(pool.k), list(pool.v)

  def kv_step(i, k, v):
    ks[i] = ks[i].at[page, off].set(k.astype(ks[i].dtype), mode="drop")
    vs[i] = vs[i].at[page, off].set(v.astype(vs[i].dtype), mode="drop")
    return (
      ks[i][page_table].reshape(B, W, c.num_key_value_heads, c.head_dim),
      vs[i][page_table].reshape(B, W, c.num_key_value_heads, c.head_dim),
    )

  x = _layers(params, c, input_ids, positions, W, kv_step, implementation)
  out = qwen3._logits(params, x, c) if logits else None
  return out, PagedKV(k=tuple(ks), v=tuple(vs))


def _layers(params, c, input_ids, positions, W: int, kv_step, implementation: str, attend=None):
  """The decoder layers over T new tokens per row; ``kv_step(i, k, v)`` stores layer i's new
  keys/values wherever the caller keeps them and returns the window to attend, which
  ``attend(q, k, v, allowed, implementation)`` (default `attend_window`: [B, W, Hkv, Dh]) reads."""
  attend = attend or attend_window
  allowed = jnp.arange(W)[None, None, :] <= positions[:, :, None]  # [B, T, W]
  x = qwen3._embed(params, input_ids, c)
  for i in range(c.num_hidden_layers):
    p = qwen3.layer_params(params, i)
    h = qwen3.rms_norm(x, p["input_layernorm"]["scale"], c.rms_norm_eps)
    q, k, v = qwen3._qkv(h, p["self_attn"], positions, c)
    kw, vw = kv_step(i, k, v)
    att = attend(q, kw, vw, allowed, implementation)
    x = x + qwen3._dense(att, p["self_attn"]["o_proj"])
    h = qwen3.rms_norm(x, p["post_attention_layernorm"]["scale"], c.rms_norm_eps)
    x = x + qwen3._mlp(h, p["mlp"])
  return x


# Decode reads each row's window once per dispatch, not once per token: gathering
# ``pool[page_table]`` copies the whole window, which on XLA:CPU made a paged decode step at
# batch 64 ~30% slower than attending over one contiguous cache. A chunk of K steps gathers the
# window (`gather_window`), decodes on it (`forward_window`), and writes back only the <= K
# positions each row appended (`scatter_window`).
#
# For the XLA path the window is kept head-major, keys [B, Hkv, W, Dh] and values
# [B, Hkv, Dh, W]: the operand layouts XLA:CPU's batched dots take. Kept [B, W, Hkv, Dh], the
# compiled step transposed both windows of every layer on every token (8 copies of 5 MB per step
# at batch 64 on the 4.2M benchmark model). The CPU's caches hid most of that (the step got 1%
# faster without them, 10% at batch 8), but on a bandwidth-bound device each is a full read and
# write of the window per layer per token. `fused` (``jax.nn.dot_product_attention``) takes
# [B, W, Hkv, Dh] and keeps it.


class Window(NamedTuple):
  """k, v: tuples of L arrays, each row's window, contiguous: [B, W, Hkv, Dh] for `fused`;
  keys [B, Hkv, W, Dh] and values [B, Hkv, Dh, W] for `xla` (see `gather_window`)."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]


def _head_major(implementation: str) -> bool:
  return implementation != "fused"


def gather_window(pool: PagedKV, page_table: jax.Array, implementation: str = "xla") -> Window:
  """Each row's window (W = n * P positions) per layer, from page_table [B, n], in the layout
  ``implementation`` attends over (`Window`)."""
  B, n = page_table.shape

  def g(a):
    return a[page_table].reshape(B, n * a.shape[1], a.shape[2], a.shape[3])

  if _head_major(implementation):
    return Window(
      k=tuple(g(a).transpose(0, 2, 1, 3) for a in pool.k),
      v=tuple(g(a).transpose(0, 2, 3, 1) for a in pool.v),
    )
  return Window(k=tuple(g(a) for a in pool.k), v=tuple(g(a) for a in pool.v))


def attend_head_major(q, k, v, allowed, implementation: str = "xla"):
  """`attend_window` over a head-major window: q [B, T, Hq, Dh]; k [B, Hkv, W, Dh];
  v [B, Hkv, Dh, W]; allowed [B, T, W] bool. Returns [B, T, Hq * Dh] in q.dtype."""
  del implementation  # the XLA path (the only one that keeps head-major windows)
  k, v = k.astype(q.dtype), v.astype(q.dtype)
  return _xla_gqa(q, k, v, allowed, k.shape[1], "bkwd", "bkdw")


def forward_window(
  params, config, input_ids, input_mask, window: Window, lengths, *, implementation="xla"
):
  """`forward_paged` for one new token per row over contiguous windows (`gather_window`'s layout
  for ``implementation``): input_ids, input_mask [B, 1]; lengths [B] (the token's position,
  < W for a valid row). Returns (logits [B, 1, V] float32, window)."""
  c = config
  B = input_ids.shape[0]
  head_major = _head_major(implementation)
  W = window.k[0].shape[2 if head_major else 1]
  positions = lengths[:, None]
  rows = jnp.arange(B)
  at = jnp.where(input_mask[:, 0].astype(bool), lengths, W)  # W: dropped
  ks, vs = list(window.k), list(window.v)

  def kv_step(i, k, v):
    k1, v1 = k[:, 0].astype(ks[i].dtype), v[:, 0].astype(vs[i].dtype)  # [B, Hkv, Dh]
    if head_major:  # advanced indices split by slices: the update is [B, Hkv, Dh]
      ks[i] = ks[i].at[rows, :, at, :].set(k1, mode="drop")
      vs[i] = vs[i].at[rows, :, :, at].set(v1, mode="drop")
    else:
      ks[i] = ks[i].at[rows, at].set(k1, mode="drop")
      vs[i] = vs[i].at[rows, at].set(v1, mode="drop")
    return ks[i], vs[i]

  attend = attend_head_major if head_major else attend_window
  x = _layers(params, c, input_ids, positions, W, kv_step, implementation, attend)
  return qwen3._logits(params, x, c), Window(k=tuple(ks), v=tuple(vs))


def scatter_window(
  pool: PagedKV,
  page_table: jax.Array,
  window: Window,
  start: jax.Array,
  count: jax.Array,
  K: int,
  implementation: str = "xla",
) -> PagedKV:
  """Writes positions start[b] .. start[b] + count[b] - 1 (count <= K, static K) of each row's
  window (`gather_window`'s layout for ``implementation``) back into its pages; nothing else of
  the pool changes."""
  N, P = pool.num_pages, pool.page_size
  n = page_table.shape[1]
  W = n * P
  t = jnp.arange(K)[None, :]
  pos = start[:, None] + t  # [B, K]
  valid = (t < count[:, None]) & (pos < W)
  page = jnp.take_along_axis(page_table, jnp.minimum(pos // P, n - 1), 1)
  page = jnp.where(valid, page, N)  # out of range: dropped
  off = pos % P
  src = jnp.minimum(pos, W - 1)

  def put(dst, win, axes):
    if axes is not None:  # head-major window -> [B, W, Hkv, Dh]; only K positions are read
      win = win.transpose(axes)
    vals = jnp.take_along_axis(win, src[:, :, None, None], 1)  # [B, K, Hkv, Dh]
    return dst.at[page, off].set(vals.astype(dst.dtype), mode="drop")

  hm = _head_major(implementation)
  return PagedKV(
    k=tuple(put(d, w, (0, 2, 1, 3) if hm else None) for d, w in zip(pool.k, window.k)),
    v=tuple(put(d, w, (0, 3, 1, 2) if hm else None) for d, w in zip(pool.v, window.v)),
  )

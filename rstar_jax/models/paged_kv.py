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

Layout: per layer a key pool [N, Hkv, Dh, P] and a value pool [N, Hkv, P, Dh] (N pages of P
tokens), head-major so that a row's window for the XLA attention path, keys [B, Hkv, Dh, W] and
values [B, Hkv, W, Dh], is a gather of whole pages plus a move of the page axis next to the
page's positions; see `Window` for why those layouts. The `fused` path
(``jax.nn.dot_product_attention``, cuDNN on CUDA) takes [B, W, Hkv, Dh] windows, transposed from
the same pool when gathered.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rstar_jax.models import attention as attention_lib
from rstar_jax.models import moe, qwen3

DECODE_IMPLEMENTATIONS = ("xla", "fused")

_logged: set[str] = set()


class PagedKV(NamedTuple):
  """k: tuple of L arrays [N, Hkv, Dh, P] (keys after RoPE); v: L arrays [N, Hkv, P, Dh]."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]

  @property
  def num_pages(self) -> int:
    return self.k[0].shape[0]

  @property
  def page_size(self) -> int:
    return self.v[0].shape[2]


def pool_bytes(config, num_pages: int, page_size: int, dtype) -> int:
  """Bytes of ``init_pool(config, num_pages, page_size, dtype)``."""
  per = page_size * config.num_key_value_heads * config.head_dim * jnp.dtype(dtype).itemsize
  return 2 * config.num_hidden_layers * num_pages * per


def init_pool(config, num_pages: int, page_size: int, dtype=jnp.float32) -> PagedKV:
  hkv, dh, n = config.num_key_value_heads, config.head_dim, config.num_hidden_layers
  return PagedKV(
    k=tuple(jnp.zeros((num_pages, hkv, dh, page_size), dtype) for _ in range(n)),
    v=tuple(jnp.zeros((num_pages, hkv, page_size, dh), dtype) for _ in range(n)),
  )


def _write(k_pool, v_pool, page, off, k, v):
  """One layer's pools (keys [N, Hkv, Dh, P], values [N, Hkv, P, Dh]) with k, v [B, T, Hkv, Dh]
  stored at (page, off) [B, T]; a page id out of range (>= N) drops that token."""
  # Advanced indices split by slices: the indexed axes come first, so the update is
  # [B, T, Hkv, Dh] for both pools.
  return (
    k_pool.at[page, :, :, off].set(k.astype(k_pool.dtype), mode="drop"),
    v_pool.at[page, :, off, :].set(v.astype(v_pool.dtype), mode="drop"),
  )


def _gather(pool: PagedKV, i: int, page_table, head_major: bool):
  """Layer i's window for page_table [B, n] (W = n * P): head-major keys [B, Hkv, Dh, W] and
  values [B, Hkv, W, Dh], or both [B, W, Hkv, Dh]."""
  B, n = page_table.shape
  k, v = pool.k[i][page_table], pool.v[i][page_table]  # [B, n, Hkv, Dh, P], [B, n, Hkv, P, Dh]
  _, _, hkv, dh, P = k.shape
  if head_major:
    return (
      k.transpose(0, 2, 3, 1, 4).reshape(B, hkv, dh, n * P),
      v.transpose(0, 2, 1, 3, 4).reshape(B, hkv, n * P, dh),
    )
  return (
    k.transpose(0, 1, 4, 2, 3).reshape(B, n * P, hkv, dh),
    v.transpose(0, 1, 3, 2, 4).reshape(B, n * P, hkv, dh),
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
  _check_implementation(implementation)
  B, T, Hq, Dh = q.shape
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
  return attend_head_major(q, k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3), allowed)


def attend_head_major(q, k, v, allowed, implementation: str = "xla"):
  """`attend_window` over a head-major window (the XLA path's layout, see `Window`).

  Args:
    q: [B, T, Hq, Dh]; k: [B, Hkv, Dh, W]; v: [B, Hkv, W, Dh]; allowed: [B, T, W] bool.
  Returns:
    [B, T, Hq * Dh] in q.dtype.
  """
  del implementation  # the XLA path (the only one that keeps head-major windows)
  B, T, Hq, Dh = q.shape
  Hkv, W = k.shape[1], k.shape[3]
  G = Hq // Hkv
  k, v = k.astype(q.dtype), v.astype(q.dtype)
  # The (query, group) rows of a kv head form the small left operand and the window the
  # right one, both products plain row-major matmuls per (row, kv head); see `Window`.
  qg = q.reshape(B, T, Hkv, G, Dh).transpose(0, 2, 3, 1, 4).reshape(B, Hkv, G * T, Dh)
  s = jnp.einsum("bkmd,bkdw->bkmw", qg, k, preferred_element_type=jnp.float32)
  s = s.reshape(B, Hkv, G, T, W)
  s = jnp.where(allowed[:, None, None], s * (Dh**-0.5), attention_lib.MASK_VALUE)
  w = jax.nn.softmax(s, axis=-1).astype(q.dtype).reshape(B, Hkv, G * T, W)
  o = jnp.einsum("bkmw,bkwd->bkmd", w, v).reshape(B, Hkv, G, T, Dh)
  return o.transpose(0, 3, 1, 2, 4).reshape(B, T, Hq * Dh)


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
  return_routes: bool = False,
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
    return_routes: also return the MoE routes (the router's own top-k, routing replay).
  Returns:
    (logits [B, T, V] float32 or None, pool[, routes [B, T, L, k] int32, -1 on dense layers]).
  """
  _check_implementation(implementation)
  c = config
  B, T = input_ids.shape
  N, P = pool.num_pages, pool.page_size
  W = page_table.shape[1] * P
  mask = input_mask.astype(bool)
  positions = lengths[:, None] + jnp.arange(T)[None, :]  # [B, T]
  page = jnp.take_along_axis(page_table, jnp.minimum(positions // P, page_table.shape[1] - 1), 1)
  page = jnp.where(mask, page, N)  # out of range: mode="drop" skips padding writes
  off = positions % P
  head_major = _head_major(implementation)
  cur = pool

  def kv_step(i, k, v):
    nonlocal cur
    ki, vi = _write(cur.k[i], cur.v[i], page, off, k, v)
    cur = PagedKV(k=_put(cur.k, i, ki), v=_put(cur.v, i, vi))
    return _gather(cur, i, page_table, head_major)

  attend = attend_head_major if head_major else attend_window
  routes = [] if return_routes else None
  x = _layers(params, c, input_ids, positions, W, kv_step, implementation, attend, routes)
  out = qwen3._logits(params, x, c) if logits else None
  return (out, cur) + ((jnp.stack(routes, 2),) if return_routes else ())


def _put(arrays: tuple, i: int, a) -> tuple:
  return arrays[:i] + (a,) + arrays[i + 1 :]


def _check_implementation(implementation: str):
  if implementation not in DECODE_IMPLEMENTATIONS:
    raise ValueError(
      f"decode attention: expected one of {DECODE_IMPLEMENTATIONS}, got {implementation!r}"
    )


def _layers(
  params, c, input_ids, positions, W: int, kv_step, implementation: str, attend, routes=None
):
  """The decoder layers over T new tokens per row; ``kv_step(i, k, v)`` stores layer i's new
  keys/values wherever the caller keeps them and returns the window that
  ``attend(q, k, v, allowed, implementation)`` reads. A ``routes`` list gets each layer's
  [B, T, k] top-k expert ids (-1 for a dense layer; MoE routing replay)."""
  allowed = jnp.arange(W)[None, None, :] <= positions[:, :, None]  # [B, T, W]
  x = qwen3._embed(params, input_ids, c)
  for i in range(c.num_hidden_layers):
    p = qwen3.layer_params(params, i, c)
    h = qwen3.rms_norm(x, p["input_layernorm"]["scale"], c.rms_norm_eps)
    q, k, v = qwen3._qkv(h, p["self_attn"], positions, c)
    kw, vw = kv_step(i, k, v)
    att = attend(q, kw, vw, allowed, implementation)
    x = x + qwen3._dense(att, p["self_attn"]["o_proj"])
    h = qwen3.rms_norm(x, p["post_attention_layernorm"]["scale"], c.rms_norm_eps)
    if routes is None:
      x = x + qwen3._mlp(h, p["mlp"], c)
    elif "experts" in p["mlp"]:
      y, rt, _ = moe.sparse_mlp(h, p["mlp"], c)
      x = x + y
      routes.append(rt.topk.reshape(h.shape[:2] + (c.num_experts_per_tok,)))
    else:
      x = x + qwen3._mlp(h, p["mlp"], c)
      routes.append(jnp.full(h.shape[:2] + (c.num_experts_per_tok,), -1, jnp.int32))
  return x


# Decode reads each row's window once per dispatch, not once per token: gathering
# ``pool[page_table]`` copies the whole window, which on XLA:CPU made a paged decode step at
# batch 64 ~30% slower than attending over one contiguous cache. A chunk of K steps gathers the
# window (`gather_window`), decodes on it (`forward_window`), and writes back only the <= K
# positions each row appended (`scatter_window`).
#
# For the XLA path the window is head-major, keys [B, Hkv, Dh, W] and values [B, Hkv, W, Dh],
# so both attention products are, per (row, kv head), a G x Dh by Dh x W and a G x W by W x Dh
# matmul: the small query group is the left operand and the window streams as a plain
# row-major right operand. Measured on XLA:CPU (the 4.2M benchmark model, batch 64, window 192,
# 4 layers, attention alone): 1.44 ms per step in this layout; 3.75 ms with keys [B, Hkv, W, Dh]
# and values [B, Hkv, Dh, W] (the window as the left operand); and kept [B, W, Hkv, Dh] the
# compiled step transposed both windows of every layer on every token. The pool is head-major
# too, so the gather moves whole runs of a page's positions: 5.5 ms per chunk for that window
# (8 arrays of 6.3 MB), against 14.3 ms when the pool was [N, P, Hkv, Dh].


class Window(NamedTuple):
  """k, v: tuples of L arrays, each row's window, contiguous: keys [B, Hkv, Dh, W] and values
  [B, Hkv, W, Dh] for `xla`; both [B, W, Hkv, Dh] for `fused` (see `gather_window`)."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]


def _head_major(implementation: str) -> bool:
  return implementation != "fused"


def gather_window(pool: PagedKV, page_table: jax.Array, implementation: str = "xla") -> Window:
  """Each row's window (W = n * P positions) per layer, from page_table [B, n], in the layout
  ``implementation`` attends over (`Window`)."""
  _check_implementation(implementation)
  hm = _head_major(implementation)
  kv = [_gather(pool, i, page_table, hm) for i in range(len(pool.k))]
  return Window(k=tuple(k for k, _ in kv), v=tuple(v for _, v in kv))


def forward_window(
  params,
  config,
  input_ids,
  input_mask,
  window: Window,
  lengths,
  *,
  implementation="xla",
  return_routes=False,
):
  """`forward_paged` for one new token per row over contiguous windows (`gather_window`'s layout
  for ``implementation``): input_ids, input_mask [B, 1]; lengths [B] (the token's position,
  < W for a valid row). Returns (logits [B, 1, V] float32, window[, routes [B, 1, L, k] int32
  with ``return_routes``])."""
  c = config
  B = input_ids.shape[0]
  head_major = _head_major(implementation)
  W = window.k[0].shape[3 if head_major else 1]
  positions = lengths[:, None]
  rows = jnp.arange(B)
  at = jnp.where(input_mask[:, 0].astype(bool), lengths, W)  # W: dropped
  ks, vs = list(window.k), list(window.v)

  def kv_step(i, k, v):
    k1, v1 = k[:, 0].astype(ks[i].dtype), v[:, 0].astype(vs[i].dtype)  # [B, Hkv, Dh]
    if head_major:  # advanced indices split by slices: the update is [B, Hkv, Dh]
      ks[i] = ks[i].at[rows, :, :, at].set(k1, mode="drop")
      vs[i] = vs[i].at[rows, :, at, :].set(v1, mode="drop")
    else:
      ks[i] = ks[i].at[rows, at].set(k1, mode="drop")
      vs[i] = vs[i].at[rows, at].set(v1, mode="drop")
    return ks[i], vs[i]

  attend = attend_head_major if head_major else attend_window
  routes = [] if return_routes else None
  x = _layers(params, c, input_ids, positions, W, kv_step, implementation, attend, routes)
  out = (qwen3._logits(params, x, c), Window(k=tuple(ks), v=tuple(vs)))
  return out + ((jnp.stack(routes, 2),) if return_routes else ())


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

  def take(win, axes):
    if axes is not None:  # head-major window -> [B, W, Hkv, Dh]; only K positions are read
      win = win.transpose(axes)
    return jnp.take_along_axis(win, src[:, :, None, None], 1)  # [B, K, Hkv, Dh]

  hm = _head_major(implementation)
  ks, vs = pool.k, pool.v
  for i in range(len(ks)):
    k = take(window.k[i], (0, 3, 1, 2) if hm else None)
    v = take(window.v[i], (0, 2, 1, 3) if hm else None)
    ki, vi = _write(ks[i], vs[i], page, off, k, v)
    ks, vs = _put(ks, i, ki), _put(vs, i, vi)
  return PagedKV(k=ks, v=vs)

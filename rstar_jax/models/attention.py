"""Causal GQA self-attention for the learner forward, in three implementations.

All take q [B, T, Hq, Dh], k / v [B, T, Hkv, Dh] and an ``allowed`` rule built from

  * causality by column index (query t sees keys s <= t),
  * ``kv_valid`` [B, T] bool: keys that may be attended at all (padding is False),
  * ``segment_ids`` [B, T] int (optional): packed rows; a query sees only keys of its own
    segment. Without it every valid key of the row is visible.

and return [B, T, Hq * Dh] in q's dtype; scores and softmax statistics in float32. Queries
with no visible key (padding) get an unspecified finite output: losses mask them out.

Implementations (``Qwen3Config.attention``):

  ``"xla"``       the whole (B, H, T, T) score tensor, then softmax. Simple and fast for short
                  rows; its T x T memory (forward and saved for the backward) is what limits
                  long rows.
  ``"blockwise"`` online softmax over key/value blocks (Milakov & Gimelshein 2018; the
                  FlashAttention-2 recurrences, Dao 2023) in pure JAX, with a ``custom_vjp``
                  whose backward recomputes each block's probabilities from the saved
                  log-sum-exp. Memory O(T * block) in forward and backward; key blocks wholly
                  in the causal future are never visited (loop bounds, not masks). Runs on any
                  backend.
  ``"fused"``     ``jax.nn.dot_product_attention(implementation="cudnn")`` where the backend
                  has cuDNN flash attention (CUDA, bf16/fp16); otherwise it logs why, once, and
                  uses ``jax.nn.dot_product_attention``'s XLA path. Segment masks are given to
                  cuDNN as a dense [B, 1, T, T] bool mask, so packed rows cost T x T bytes there.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

IMPLEMENTATIONS = ("xla", "blockwise", "fused")

# Large finite negative instead of -inf, so fully masked rows stay finite (no inf - inf).
MASK_VALUE = -1e30

_logged: set[str] = set()


def _log_once(msg: str) -> None:
  if msg not in _logged:
    _logged.add(msg)
    logging.getLogger(__name__).warning(msg)


def allowed_mask(kv_valid: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
  """[B, T] key validity (+ optional [B, T] segment ids) -> [B, T(q), T(k)] bool."""
  T = kv_valid.shape[-1]
  idx = jnp.arange(T)
  allowed = (idx[None, :, None] >= idx[None, None, :]) & kv_valid.astype(bool)[:, None, :]
  if segment_ids is not None:
    allowed &= segment_ids[:, :, None] == segment_ids[:, None, :]
  return allowed


def attend_dense(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array) -> jax.Array:
  """The ``"xla"`` implementation. allowed: [B, T, S] bool. Returns [B, T, Hq*Dh]."""
  B, T, Hq, Dh = q.shape
  Hkv = k.shape[2]
  qg = q.reshape(B, T, Hkv, Hq // Hkv, Dh)
  s = jnp.einsum("btkgd,bskd->bkgts", qg, k.astype(q.dtype), preferred_element_type=jnp.float32) * (
    Dh**-0.5
  )
  s = jnp.where(allowed[:, None, None], s, MASK_VALUE)
  w = jax.nn.softmax(s, axis=-1).astype(q.dtype)
  o = jnp.einsum("bkgts,bskd->btkgd", w, v.astype(q.dtype))
  return o.reshape(B, T, Hq * Dh)


def self_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  kv_valid: jax.Array,
  segment_ids: jax.Array | None = None,
  *,
  implementation: str = "xla",
  block_size: int = 512,
) -> jax.Array:
  """Causal GQA self-attention (module docstring). Pure; jit/grad/remat friendly.

  Args:
    q: [B, T, Hq, Dh]; k, v: [B, T, Hkv, Dh] (Hq a multiple of Hkv).
    kv_valid: [B, T] bool/int, 1 on real tokens.
    segment_ids: [B, T] int or None; packed rows (equal id = same trajectory).
    implementation: one of ``IMPLEMENTATIONS``.
    block_size: query and key block length of ``"blockwise"`` (clipped to T).
  Returns:
    [B, T, Hq*Dh] in q.dtype.
  """
  if implementation == "xla":
    return attend_dense(q, k, v, allowed_mask(kv_valid, segment_ids))
  if implementation == "blockwise":
    seg = kv_valid.astype(jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    # A key is visible iff valid and in the query's segment: fold validity into the key's
    # segment id (-1 never equals a query's id, which is >= 0).
    kv_seg = jnp.where(kv_valid.astype(bool), seg, -1)
    B, T, Hq, Dh = q.shape
    o = blockwise_attention(q, k, v, seg, kv_seg, block_size=block_size)
    return o.reshape(B, T, Hq * Dh)
  if implementation == "fused":
    return _fused(q, k, v, kv_valid, segment_ids)
  raise ValueError(
    f"attention implementation: expected one of {IMPLEMENTATIONS}, got {implementation!r}"
  )


# ----------------------------------------------------------------------------- fused


def fused_unavailable_reason(dtype) -> str | None:
  """Why cuDNN flash attention cannot run here (None when it can be tried)."""
  backend = jax.default_backend()
  if backend != "gpu":
    return f"backend is {backend!r}, cuDNN flash attention needs CUDA"
  dev = jax.devices()[0]
  version = str(getattr(getattr(dev, "client", None), "platform_version", "")).lower()
  if "rocm" in version or "hip" in version:
    return f"device {dev.device_kind!r} runs ROCm; cuDNN is CUDA-only"
  if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    return f"compute dtype is {jnp.dtype(dtype).name}; cuDNN flash attention needs bf16/fp16"
  return None


def _fused(q, k, v, kv_valid, segment_ids):
  B, T, Hq, Dh = q.shape
  allowed = allowed_mask(kv_valid, segment_ids)[:, None]  # [B, 1, T, T]
  k, v = k.astype(q.dtype), v.astype(q.dtype)
  reason = fused_unavailable_reason(q.dtype)
  if reason is None:
    try:
      o = jax.nn.dot_product_attention(q, k, v, mask=allowed, implementation="cudnn")
      return o.reshape(B, T, Hq * Dh)
    except (NotImplementedError, ValueError, RuntimeError) as e:  # raised while tracing
      reason = f"cuDNN rejected the call: {type(e).__name__}: {e}"
  _log_once(f"attention='fused': {reason}; using jax.nn.dot_product_attention's XLA path")
  o = jax.nn.dot_product_attention(q, k, v, mask=allowed, implementation="xla")
  return o.reshape(B, T, Hq * Dh)


# ----------------------------------------------------------------------------- blockwise


def blockwise_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  q_seg: jax.Array,
  kv_seg: jax.Array,
  *,
  block_size: int = 512,
) -> jax.Array:
  """Causal online-softmax attention over blocks. q: [B, T, Hq, Dh]; k, v: [B, T, Hkv, Dh];
  q_seg, kv_seg: [B, T] int32 (query t sees key s iff s <= t and q_seg[t] == kv_seg[s]).

  Returns [B, T, Hq, Dh] in q.dtype. T is padded up to a multiple of the block internally.
  """
  B, T, Hq, Dh = q.shape
  bs = max(1, min(int(block_size), T))
  Tp = -(-T // bs) * bs
  if Tp != T:
    pad = ((0, 0), (0, Tp - T), (0, 0), (0, 0))
    q, k, v = jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad)
    q_seg = jnp.pad(q_seg, ((0, 0), (0, Tp - T)), constant_values=-2)
    kv_seg = jnp.pad(kv_seg, ((0, 0), (0, Tp - T)), constant_values=-1)
  o = _flash(q, k, v, q_seg, kv_seg, bs)
  return o[:, :T]


def _group(q, hkv):
  B, T, Hq, Dh = q.shape
  return q.reshape(B, T, hkv, Hq // hkv, Dh)


def _block_mask(q_seg_i, kv_seg_j, i, j, bs):
  """[B, 1, 1, bq, bk] bool for query block i, key block j."""
  qi = i * bs + jnp.arange(bs)
  kj = j * bs + jnp.arange(bs)
  causal = qi[:, None] >= kj[None, :]
  same = q_seg_i[:, :, None] == kv_seg_j[:, None, :]
  return (causal[None] & same)[:, None, None]


def _scores(qb, kb, scale):
  # qb [B, bq, Hkv, G, Dh], kb [B, bk, Hkv, Dh] -> [B, Hkv, G, bq, bk] float32
  return jnp.einsum("bqkgd,bskd->bkgqs", qb, kb, preferred_element_type=jnp.float32) * scale


def _slice(x, i, bs):
  return jax.lax.dynamic_slice_in_dim(x, i * bs, bs, axis=1)


def _flash_fwd_impl(q, k, v, q_seg, kv_seg, bs):
  B, T, Hq, Dh = q.shape
  Hkv = k.shape[2]
  G = Hq // Hkv
  nb = T // bs
  scale = Dh**-0.5
  qg = _group(q, Hkv)

  def q_block(i, carry):
    out, lse = carry
    qb = _slice(qg, i, bs)
    qs = _slice(q_seg, i, bs)

    def kv_block(j, st):
      m, l, acc = st
      kb, vb, ks = _slice(k, j, bs), _slice(v, j, bs), _slice(kv_seg, j, bs)
      ok = _block_mask(qs, ks, i, j, bs)
      s = jnp.where(ok, _scores(qb, kb.astype(q.dtype), scale), MASK_VALUE)
      m_new = jnp.maximum(m, s.max(-1))
      p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
      alpha = jnp.exp(m - m_new)
      l = l * alpha + p.sum(-1)
      pv = jnp.einsum(
        "bkgqs,bskd->bkgqd",
        p.astype(q.dtype),
        vb.astype(q.dtype),
        preferred_element_type=jnp.float32,
      )
      return m_new, l, acc * alpha[..., None] + pv

    init = (
      jnp.full((B, Hkv, G, bs), MASK_VALUE, jnp.float32),
      jnp.zeros((B, Hkv, G, bs), jnp.float32),
      jnp.zeros((B, Hkv, G, bs, Dh), jnp.float32),
    )
    # Causal: key blocks after the query block are never visited (a dynamic trip count).
    m, l, acc = jax.lax.fori_loop(0, i + 1, kv_block, init)
    o = acc / jnp.where(l > 0, l, 1.0)[..., None]  # [B,Hkv,G,bq,Dh]
    lse_b = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), jnp.inf)
    o = o.transpose(0, 3, 1, 2, 4).reshape(B, bs, Hq, Dh).astype(q.dtype)
    out = jax.lax.dynamic_update_slice_in_dim(out, o, i * bs, axis=1)
    lse = jax.lax.dynamic_update_slice_in_dim(lse, lse_b, i * bs, axis=3)
    return out, lse

  out = jnp.zeros((B, T, Hq, Dh), q.dtype)
  lse = jnp.zeros((B, Hkv, G, T), jnp.float32)
  return jax.lax.fori_loop(0, nb, q_block, (out, lse))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(q, k, v, q_seg, kv_seg, bs):
  return _flash_fwd_impl(q, k, v, q_seg, kv_seg, bs)[0]


def _flash_fwd(q, k, v, q_seg, kv_seg, bs):
  out, lse = _flash_fwd_impl(q, k, v, q_seg, kv_seg, bs)
  return out, (q, k, v, q_seg, kv_seg, out, lse)


def _flash_bwd(bs, res, d_out):
  q, k, v, q_seg, kv_seg, out, lse = res
  B, T, Hq, Dh = q.shape
  Hkv = k.shape[2]
  G = Hq // Hkv
  nb = T // bs
  scale = Dh**-0.5
  qg = _group(q, Hkv)
  dog = _group(d_out.astype(q.dtype), Hkv)
  # D_t = rowsum(dO_t * O_t) (FlashAttention-2, Alg. 2).
  delta = jnp.einsum(
    "btkgd,btkgd->bkgt", dog.astype(jnp.float32), _group(out, Hkv).astype(jnp.float32)
  )

  def q_block(i, carry):
    dq, dk, dv = carry
    qb, dob = _slice(qg, i, bs), _slice(dog, i, bs)
    qs = _slice(q_seg, i, bs)
    lse_i = jax.lax.dynamic_slice_in_dim(lse, i * bs, bs, axis=3)
    d_i = jax.lax.dynamic_slice_in_dim(delta, i * bs, bs, axis=3)

    def kv_block(j, st):
      dq_i, dk, dv = st
      kb, vb, ks = (
        _slice(k, j, bs).astype(q.dtype),
        _slice(v, j, bs).astype(q.dtype),
        _slice(kv_seg, j, bs),
      )
      ok = _block_mask(qs, ks, i, j, bs)
      s = _scores(qb, kb, scale)
      p = jnp.where(ok, jnp.exp(s - lse_i[..., None]), 0.0)  # [B,Hkv,G,bq,bk]
      dv_j = jnp.einsum(
        "bkgqs,bqkgd->bskd", p.astype(q.dtype), dob, preferred_element_type=jnp.float32
      )
      dp = jnp.einsum("bqkgd,bskd->bkgqs", dob, vb, preferred_element_type=jnp.float32)
      ds = p * (dp - d_i[..., None]) * scale
      dq_i = dq_i + jnp.einsum(
        "bkgqs,bskd->bqkgd", ds.astype(q.dtype), kb, preferred_element_type=jnp.float32
      )
      dk_j = jnp.einsum(
        "bkgqs,bqkgd->bskd", ds.astype(q.dtype), qb, preferred_element_type=jnp.float32
      )
      dk = jax.lax.dynamic_update_slice_in_dim(dk, _slice(dk, j, bs) + dk_j, j * bs, 1)
      dv = jax.lax.dynamic_update_slice_in_dim(dv, _slice(dv, j, bs) + dv_j, j * bs, 1)
      return dq_i, dk, dv

    dq_i = jnp.zeros((B, bs, Hkv, G, Dh), jnp.float32)
    dq_i, dk, dv = jax.lax.fori_loop(0, i + 1, kv_block, (dq_i, dk, dv))
    dq = jax.lax.dynamic_update_slice_in_dim(dq, dq_i, i * bs, axis=1)
    return dq, dk, dv

  zeros_kv = jnp.zeros((B, T, Hkv, Dh), jnp.float32)
  dq, dk, dv = jax.lax.fori_loop(
    0, nb, q_block, (jnp.zeros((B, T, Hkv, G, Dh), jnp.float32), zeros_kv, zeros_kv)
  )
  return (
    dq.reshape(B, T, Hq, Dh).astype(q.dtype),
    dk.astype(k.dtype),
    dv.astype(v.dtype),
    None,
    None,
  )


_flash.defvjp(_flash_fwd, _flash_bwd)

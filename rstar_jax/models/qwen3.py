"""Qwen3 (and Qwen2/2.5) decoder as pure functions over a plain nested-dict param pytree.

``forward`` / ``forward_cached`` are pure and jittable with ``config`` static, so the params work
directly with optax, orbax and ``jax.tree``. Numerics follow transformers' Qwen3ForCausalLM /
Qwen2ForCausalLM: RMSNorm in float32, rotate-half RoPE with float32 inverse frequencies, GQA
with optional per-head q/k RMSNorm before RoPE, SwiGLU MLP, optional tied embeddings.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from rstar_jax.models import attention as attention_lib
from rstar_jax.models import lora, moe
from rstar_jax.models.kv_cache import KVCache, cache_logical_axes, cache_shardings, init_cache
from rstar_jax.models.qwen3_config import (
  SUPPORTED_MODEL_TYPES,
  Qwen3Config,
  param_logical_axes,
  param_shapes,
)
from rstar_jax.models.qwen3_hf_io import CheckpointError, hf_names, load_hf_params, save_hf
from rstar_jax.sharding.rules import constrain, logical_to_shardings

Params = dict[str, Any]

__all__ = [
  "Qwen3Config",
  "KVCache",
  "init_cache",
  "cache_logical_axes",
  "cache_shardings",
  "init_params",
  "forward",
  "forward_cached",
  "inference_params",
  "layer_params",
  "param_logical_axes",
  "param_shapes",
  "param_shardings",
  "load_hf_params",
  "save_hf",
  "CheckpointError",
  "hf_names",
  "default_positions",
  "rms_norm",
  "rope",
  "SUPPORTED_MODEL_TYPES",
]

# Large finite negative instead of -inf: a fully masked row (a padding query) then gets a
# uniform softmax instead of NaNs, and its output is ignored anyway.
_MASK_VALUE = attention_lib.MASK_VALUE


def _compute_dtype(config: Qwen3Config):
  return jnp.dtype(config.dtype)


# ----------------------------------------------------------------------------- init


def init_params(config: Qwen3Config, key: jax.Array, dtype=jnp.float32) -> Params:
  """Random init (normal(0, 0.02) weights, unit norm scales, zero biases), HF's scheme.

  Compiled as one program (eager per-leaf dispatch is slow); jit-compatible itself, and
  ``jax.jit(init_params, ..., out_shardings=param_shardings(...))`` creates params sharded.
  """
  return _init_params(config, key, jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(0, 2))
def _init_params(config: Qwen3Config, key: jax.Array, dtype) -> Params:
  leaves, treedef = jax.tree.flatten(param_shapes(config), is_leaf=lambda x: isinstance(x, tuple))
  names = [
    path[-1].key
    for path, _ in jax.tree_util.tree_flatten_with_path(
      param_shapes(config), is_leaf=lambda x: isinstance(x, tuple)
    )[0]
  ]
  sizes = [math.prod(s) for s in leaves]
  # One flat draw carved into leaves: a per-leaf threefry compiles far slower on CPU.
  flat = 0.02 * jax.random.normal(key, (sum(sizes),), jnp.float32)
  out, off = [], 0
  for name, shape, n in zip(names, leaves, sizes):
    if name == "scale":
      out.append(jnp.ones(shape, dtype))
    elif name == "bias":
      out.append(jnp.zeros(shape, dtype))
    else:
      out.append(flat[off : off + n].reshape(shape).astype(dtype))
    off += n
  return jax.tree.unflatten(treedef, out)


def param_shardings(config: Qwen3Config, mesh, layout: str = "train") -> Params:
  """NamedSharding per param for ``mesh`` under the ``train`` or ``sampling`` layout."""
  shapes = jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s, jnp.float32),
    param_shapes(config),
    is_leaf=lambda x: isinstance(x, tuple),
  )
  return logical_to_shardings(param_logical_axes(config), mesh, layout, shapes)


# ----------------------------------------------------------------------------- building blocks


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """x: [..., D]; normalises in float32, returns x.dtype (HF Qwen3RMSNorm)."""
  xf = x.astype(jnp.float32)
  xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return scale.astype(x.dtype) * xf.astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotate-half RoPE. x: [B, T, H, Dh]; positions: [B, T] int."""
  dh = x.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh))
  ang = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh/2]
  ang = jnp.concatenate([ang, ang], axis=-1)[:, :, None, :]  # [B, T, 1, Dh]
  cos, sin = jnp.cos(ang).astype(x.dtype), jnp.sin(ang).astype(x.dtype)
  x1, x2 = x[..., : dh // 2], x[..., dh // 2 :]
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return x * cos + rotated * sin


def _dense(x: jax.Array, p: Params) -> jax.Array:
  y = x @ p["kernel"].astype(x.dtype)
  if "bias" in p:
    y = y + p["bias"].astype(x.dtype)
  if "lora_a" in p:  # LoRA adapters, unmerged (put there by `lora.inject`)
    y = y + lora.branch(x, p)
  return y


def _qkv(x: jax.Array, p: Params, positions: jax.Array, c: Qwen3Config):
  """x: [B, T, D] -> q [B, T, Hq, Dh], k/v [B, T, Hkv, Dh] (q, k rotated)."""
  B, T, _ = x.shape
  if "qkv_proj" in p:  # fused by `inference_params`: one matmul instead of three
    nq, nk = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    y = _dense(x, p["qkv_proj"])
    q = y[..., :nq].reshape(B, T, c.num_attention_heads, c.head_dim)
    k = y[..., nq : nq + nk].reshape(B, T, c.num_key_value_heads, c.head_dim)
    v = y[..., nq + nk :].reshape(B, T, c.num_key_value_heads, c.head_dim)
  else:
    q = _dense(x, p["q_proj"]).reshape(B, T, c.num_attention_heads, c.head_dim)
    k = _dense(x, p["k_proj"]).reshape(B, T, c.num_key_value_heads, c.head_dim)
    v = _dense(x, p["v_proj"]).reshape(B, T, c.num_key_value_heads, c.head_dim)
  if c.use_qk_norm:
    q = rms_norm(q, p["q_norm"]["scale"], c.rms_norm_eps)
    k = rms_norm(k, p["k_norm"]["scale"], c.rms_norm_eps)
  q = constrain(rope(q, positions, c.rope_theta), ("batch", "seq", "act_heads", None))
  k = constrain(rope(k, positions, c.rope_theta), ("batch", "seq", "act_heads", None))
  v = constrain(v, ("batch", "seq", "act_heads", None))
  return q, k, v


def _mlp(x: jax.Array, p: Params, c: Qwen3Config | None = None) -> jax.Array:
  if "experts" in p:  # a Qwen3-MoE sparse layer (routes and stats dropped; see qwen3_moe)
    return moe.sparse_mlp(x, p, c)[0]
  if "gate_up_proj" in p:  # fused by `inference_params`
    gu = _dense(x, p["gate_up_proj"])
    f = gu.shape[-1] // 2
    h = jax.nn.silu(gu[..., :f]) * gu[..., f:]
  else:
    h = jax.nn.silu(_dense(x, p["gate_proj"])) * _dense(x, p["up_proj"])
  h = constrain(h, ("batch", "seq", "act_mlp"))
  return _dense(h, p["down_proj"])


def _embed(params: Params, input_ids: jax.Array, c: Qwen3Config) -> jax.Array:
  x = params["embed_tokens"]["embedding"][input_ids].astype(_compute_dtype(c))
  return constrain(x, ("batch", "seq", "act_embed"))


def _logits(params: Params, x: jax.Array, c: Qwen3Config) -> jax.Array:
  x = rms_norm(x, params["norm"]["scale"], c.rms_norm_eps)
  if c.tie_word_embeddings and "lm_head" not in params:  # tied, stacked layout
    w = params["embed_tokens"]["embedding"].astype(x.dtype).T
  else:  # untied, or tied in the ``inference_params`` layout (its own [D, V] kernel)
    w = params["lm_head"]["kernel"].astype(x.dtype)
  logits = jnp.einsum("btd,dv->btv", x, w, preferred_element_type=jnp.float32)
  return constrain(logits, ("batch", "seq", "act_vocab"))


def _maybe_remat(fn, c: Qwen3Config):
  return jax.checkpoint(fn) if c.remat else fn


# ----------------------------------------------------------------------------- forward


def _check_static_config(config: Any, fn: str) -> None:
  # Under jax.jit without static_argnames the config arrives as a pytree of tracers and fails
  # deep inside with "... has no attribute remat"; say what to do instead.
  if not isinstance(config, Qwen3Config):
    raise TypeError(
      f"qwen3.{fn}: config must be a static Qwen3Config (jit with "
      f"static_argnames='config'); got {type(config).__name__}"
    )


def _attention_fn(c: Qwen3Config, mask: jax.Array, segment_ids: jax.Array | None):
  """attend(q, k, v) -> [B, T, Hq*Dh] for the full-sequence forward (``c.attention``)."""
  if c.attention == "xla":
    # Built once outside the layer scan (as before the other implementations existed).
    allowed = attention_lib.allowed_mask(mask, segment_ids)  # [B, T(q), T(k)]
    return lambda q, k, v: attention_lib.attend_dense(q, k, v, allowed)
  return functools.partial(
    attention_lib.self_attention,
    kv_valid=mask,
    segment_ids=segment_ids,
    implementation=c.attention,
    block_size=c.attention_block_size,
  )


def _attention_residual(x, p: Params, positions, attend, c: Qwen3Config) -> jax.Array:
  """x + self-attention(input_layernorm(x)) for one layer's params ``p``."""
  h = rms_norm(x, p["input_layernorm"]["scale"], c.rms_norm_eps)
  q, k, v = _qkv(h, p["self_attn"], positions, c)
  return x + _dense(attend(q, k, v), p["self_attn"]["o_proj"])


def default_positions(attention_mask: jax.Array) -> jax.Array:
  """[B, T] mask -> positions cumsum(mask) - 1, clipped at 0 (pads before a row's start)."""
  return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def forward(
  params: Params,
  config: Qwen3Config,
  input_ids: jax.Array,
  positions: jax.Array | None = None,
  attention_mask: jax.Array | None = None,
  segment_ids: jax.Array | None = None,
) -> jax.Array:
  """Full-sequence causal forward (pure; jit with ``static_argnames="config"``).

  Args:
    params: the param pytree.
    config: static; ``config.attention`` picks the attention implementation.
    input_ids: [B, T] int32.
    positions: [B, T] int; default ``cumsum(attention_mask) - 1`` so left- and right-padded
      rows give the same logits as unpadded ones. Packed rows pass per-segment positions
      (restarting at 0 for each trajectory).
    attention_mask: [B, T] (1/True = real token); default all ones. Pad keys are never
      attended; pad queries produce unspecified (finite) logits.
    segment_ids: [B, T] int or None; packed rows: a token attends only to earlier tokens
      with the same id (several trajectories share a row without seeing each other).
  Returns:
    logits: [B, T, V] float32.
  """
  _check_static_config(config, "forward")
  if config.is_moe:
    raise TypeError("qwen3.forward: a Qwen3MoeConfig model runs with qwen3_moe.forward")
  c = config
  B, T = input_ids.shape
  mask = jnp.ones((B, T), bool) if attention_mask is None else attention_mask.astype(bool)
  if positions is None:
    positions = default_positions(mask)
  attend = _attention_fn(c, mask, segment_ids)

  def layer(x, p):
    x = _attention_residual(x, p, positions, attend, c)
    h = rms_norm(x, p["post_attention_layernorm"]["scale"], c.rms_norm_eps)
    x = constrain(x + _mlp(h, p["mlp"]), ("batch", "seq", "act_embed"))
    return x, None

  x, _ = jax.lax.scan(_maybe_remat(layer, c), _embed(params, input_ids, c), params["layers"])
  return _logits(params, x, c)


def layer_params(params: Params, i: int, config: Qwen3Config | None = None) -> Params:
  """Layer ``i``'s params from the stacked layout (``params["layers"]`` a dict of [L, ...]
  arrays) or the per-layer layout of ``inference_params`` (a tuple of per-layer dicts).
  A stacked Qwen3-MoE tree (MLPs in ``dense_mlp`` / ``moe`` stacks) needs ``config``; its
  layer gets ``mlp`` from the stack of its kind."""
  layers = params["layers"]
  if isinstance(layers, (list, tuple)):
    return layers[i]
  p = jax.tree.map(lambda a: a[i], layers)
  if "mlp" not in p and ("moe" in params or "dense_mlp" in params):
    if config is None or not config.is_moe:
      raise ValueError("qwen3.layer_params: a stacked MoE param tree needs its Qwen3MoeConfig")
    if config.is_sparse_layer(i):
      p["mlp"] = jax.tree.map(lambda a: a[config.sparse_layers.index(i)], params["moe"])
    else:
      p["mlp"] = jax.tree.map(lambda a: a[config.dense_layers.index(i)], params["dense_mlp"])
  return p


def inference_params(params: Params, config: Qwen3Config) -> Params:
  """The param layout ``forward_cached`` runs fastest on; pure, jittable (config static).

  Layers become a tuple of per-layer dicts, so a decode step reads each weight in place
  instead of slicing (on XLA:CPU: copying) it out of the stacked [L, ...] arrays; with tied
  embeddings the LM head gets its own [D, V] kernel, a plain matmul instead of one against
  the transposed [V, D] table. Each layer's q/k/v projections become one ``qkv_proj`` and
  gate/up one ``gate_up_proj`` (outputs concatenated, biases too): one matmul instead of three
  and two, 6% (batch 64) to 14% (batch 8) off a decode step of the 4.2M benchmark model on CPU;
  a group where a projection carries unmerged LoRA adapters stays separate. Costs one copy of
  the weights (plus V x D when tied). ``forward`` and the learner keep the stacked layout.
  """
  out = {k: v for k, v in params.items() if k not in ("layers", "moe", "dense_mlp")}
  out["layers"] = tuple(
    _fuse_layer(layer_params(params, i, config)) for i in range(config.num_hidden_layers)
  )
  if config.tie_word_embeddings and "lm_head" not in params:
    out["lm_head"] = {"kernel": params["embed_tokens"]["embedding"].T}
  return out


def _fuse(parts: list[Params]) -> Params | None:
  """One dense layer whose output is the concatenation of ``parts``' outputs, or None when a
  part carries LoRA adapters (kept unmerged and separate) or only some parts have a bias."""
  if any(set(q) - {"kernel", "bias"} for q in parts):
    return None
  biased = ["bias" in q for q in parts]
  if any(biased) and not all(biased):
    return None
  out = {"kernel": jnp.concatenate([q["kernel"] for q in parts], axis=-1)}
  if all(biased):
    out["bias"] = jnp.concatenate([q["bias"] for q in parts], axis=-1)
  return out


def _fuse_layer(p: Params) -> Params:
  attn, mlp = dict(p["self_attn"]), dict(p["mlp"])
  qkv = None if "qkv_proj" in attn else _fuse([attn["q_proj"], attn["k_proj"], attn["v_proj"]])
  if qkv is not None:
    for n in ("q_proj", "k_proj", "v_proj"):
      del attn[n]
    attn["qkv_proj"] = qkv
  gu = None if "gate_proj" not in mlp else _fuse([mlp["gate_proj"], mlp["up_proj"]])
  if gu is not None:
    del mlp["gate_proj"], mlp["up_proj"]
    mlp["gate_up_proj"] = gu
  return {**p, "self_attn": attn, "mlp": mlp}


def forward_cached(
  params: Params,
  config: Qwen3Config,
  input_ids: jax.Array,
  cache: KVCache,
  input_mask: jax.Array | None = None,
) -> tuple[jax.Array, KVCache]:
  """Forward that reads and extends a KV cache (prefill T > 1 or decode T = 1); pure, jit with
  ``static_argnames="config"`` (donate ``cache`` to update it in place).

  Args:
    params: stacked or ``inference_params`` layout (same result; the latter is faster).
    input_ids: [B, T] int32.
    cache: KVCache, L layers of k [B, Hkv, Dh, S] / v [B, Hkv, S, Dh], lengths [B].
    input_mask: [B, T] bool, valid tokens a prefix of each row (right padding); a row with no
      valid token leaves its cache untouched (idle slot). Default all valid.
  Returns:
    (logits [B, T, V] float32, new cache). Row b's valid token t is stored at slot and
    position ``lengths[b] + t``; ``lengths`` grows by the row's valid count. Each token
    attends to its row's slots ``<=`` its own position. Tokens past the cache end are dropped.

  Layers run as a Python loop (the per-layer cache buffers are separate arrays): each layer
  writes its new k/v into its buffers, then attends over them, so the buffers are updated in
  place and read once.
  """
  _check_static_config(config, "forward_cached")
  c = config
  B, T = input_ids.shape
  S = cache.max_len
  if cache.num_layers != c.num_hidden_layers:
    raise ValueError(
      f"forward_cached: cache has {cache.num_layers} layers, config {c.num_hidden_layers}"
    )
  mask = jnp.ones((B, T), bool) if input_mask is None else input_mask.astype(bool)
  positions = cache.lengths[:, None] + jnp.arange(T)[None, :]  # [B, T]
  # Padded tokens get an out-of-range slot, and mode="drop" skips their writes.
  slots = jnp.where(mask, positions, S)
  allowed = jnp.arange(S)[None, None, :] <= positions[:, :, None]  # [B, T, S]
  rows = jnp.arange(B)[:, None]
  x = _embed(params, input_ids, c)
  k_all, v_all = list(cache.k), list(cache.v)
  for i in range(c.num_hidden_layers):
    p = layer_params(params, i, c)
    h = rms_norm(x, p["input_layernorm"]["scale"], c.rms_norm_eps)
    q, k, v = _qkv(h, p["self_attn"], positions, c)
    # Advanced indices around sliced axes put [B, T] first: the update is [B, T, Hkv, Dh].
    k_all[i] = k_all[i].at[rows, :, :, slots].set(k.astype(k_all[i].dtype), mode="drop")
    v_all[i] = v_all[i].at[rows, :, slots].set(v.astype(v_all[i].dtype), mode="drop")
    x = x + _dense(_attend_cached(q, k_all[i], v_all[i], allowed), p["self_attn"]["o_proj"])
    h = rms_norm(x, p["post_attention_layernorm"]["scale"], c.rms_norm_eps)
    x = constrain(x + _mlp(h, p["mlp"], c), ("batch", "seq", "act_embed"))
  lengths = jnp.minimum(cache.lengths + mask.sum(-1).astype(jnp.int32), S)
  return _logits(params, x, c), KVCache(k=tuple(k_all), v=tuple(v_all), lengths=lengths)


def _attend_cached(q: jax.Array, k_t: jax.Array, v: jax.Array, allowed: jax.Array) -> jax.Array:
  """GQA attention over one layer's cache. q: [B, T, Hq, Dh]; k_t: [B, Hkv, Dh, S];
  v: [B, Hkv, S, Dh]; allowed: [B, T, S] bool. Returns [B, T, Hq*Dh]; scores and softmax in
  float32.

  Both contractions are spelled as dot_generals with the queries first: batched (B, Hkv)
  matmuls [G*T, Dh] @ [Dh, S] and [G*T, S] @ [S, Dh] on the cache in place. As einsums,
  XLA:CPU put the cache first for T = 1 and ran a slower generic dot plus a transpose.
  """
  B, T, Hq, Dh = q.shape
  Hkv = k_t.shape[1]
  G = Hq // Hkv
  qh = q.reshape(B, T, Hkv, G, Dh).transpose(0, 2, 3, 1, 4).reshape(B, Hkv, G * T, Dh)
  batch = ((0, 1), (0, 1))
  s = jax.lax.dot_general(
    qh, k_t.astype(q.dtype), (((3,), (2,)), batch), preferred_element_type=jnp.float32
  ) * (Dh**-0.5)  # [B,Hkv,G*T,S]
  ok = jnp.broadcast_to(allowed[:, None, None], (B, 1, G, T, allowed.shape[-1]))
  s = jnp.where(ok.reshape(B, 1, G * T, -1), s, _MASK_VALUE)
  w = jax.nn.softmax(s, axis=-1).astype(q.dtype)
  o = jax.lax.dot_general(w, v.astype(q.dtype), (((3,), (2,)), batch))  # [B,Hkv,G*T,Dh]
  return o.reshape(B, Hkv, G, T, Dh).transpose(0, 3, 1, 2, 4).reshape(B, T, Hq * Dh)

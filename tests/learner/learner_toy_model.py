"""A tiny causal LM and random batches for learner tests (no model module needed)."""

import jax
import jax.numpy as jnp
import numpy as np

V, D, N, T = 16, 8, 8, 7


def toy_apply(params, ids, mask):
  """A tiny causal LM: running mean of embeddings -> tanh layer -> tied output."""
  h = params["emb"][ids] * mask[..., None]
  ctx = jnp.cumsum(h, 1) / jnp.arange(1, ids.shape[1] + 1)[None, :, None]
  return jnp.tanh(ctx @ params["w"]) @ params["emb"].T


def toy_params(seed=0):
  k1, k2 = jax.random.split(jax.random.key(seed))
  return {"emb": jax.random.normal(k1, (V, D)), "w": jax.random.normal(k2, (D, D))}


def toy_batch(seed=0, n=N):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, T + 1, n)
  attn = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
  loss = ((rng.random((n, T)) < 0.7) & (attn == 1)).astype(np.float32)
  loss[:, 0] = 0
  loss[1] = 0  # a row with no targets must not change the mean
  return {
    "input_ids": (rng.integers(0, V, (n, T)) * attn).astype(np.int32),
    "attention_mask": attn,
    "loss_mask": loss,
    "old_logprobs": (-rng.random((n, T)) * 3 * loss).astype(np.float32),
    "advantages": rng.normal(size=n).astype(np.float32),
  }

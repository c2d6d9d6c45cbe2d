"""Paged KV forward against the full-sequence forward, and its attention paths against each
other (the cuDNN path cannot run on CPU: "fused" there is jax.nn.dot_product_attention's XLA
implementation, compared with the project's own dot_general path)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.models import paged_kv, qwen3

CFG = qwen3.Qwen3Config(
  vocab_size=128,
  hidden_size=32,
  intermediate_size=64,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=8,
)


@pytest.fixture(scope="module")
def params():
  return qwen3.init_params(CFG, jax.random.key(0))


@pytest.mark.parametrize("impl", paged_kv.DECODE_IMPLEMENTATIONS)
def test_paged_prefill_then_decode_matches_full_forward(params, impl):
  """Two rows on scattered, interleaved pages; a prefix in two pieces then token by token."""
  ids = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 13)).astype(np.int32)
  ref = np.asarray(qwen3.forward(params, CFG, jnp.asarray(ids)))
  ip = qwen3.inference_params(params, CFG)
  fwd = jax.jit(paged_kv.forward_paged, static_argnames=("config", "implementation", "logits"))
  pool = paged_kv.init_pool(CFG, 9, 4)
  table = np.array([[5, 2, 7, 0], [1, 8, 3, 6]], np.int32)
  outs = []
  # Row 1 is shorter in the first piece (right padding) and catches up in the second.
  mask = np.ones((2, 6), bool)
  mask[1, 4:] = False
  lg, pool = fwd(
    ip, CFG, ids[:, :6], mask, pool, table, jnp.zeros(2, jnp.int32), implementation=impl
  )
  outs.append(np.asarray(lg))
  np.testing.assert_allclose(outs[0][0], ref[0, :6], atol=2e-5)
  np.testing.assert_allclose(outs[0][1, :4], ref[1, :4], atol=2e-5)
  lengths = np.array([6, 4], np.int32)
  rest = [ids[0, 6:], ids[1, 4:]]
  for t in range(max(len(r) for r in rest)):
    tok = np.array([[r[t] if t < len(r) else 0] for r in rest], np.int32)
    m = np.array([[t < len(r)] for r in rest])
    lg, pool = fwd(ip, CFG, tok, m, pool, table, jnp.asarray(lengths), implementation=impl)
    for b in range(2):
      if m[b, 0]:
        np.testing.assert_allclose(np.asarray(lg)[b, 0], ref[b, lengths[b]], atol=2e-5)
    lengths = lengths + m[:, 0]


@pytest.mark.parametrize("impl", paged_kv.DECODE_IMPLEMENTATIONS)
def test_window_decode_matches_full_forward_and_writes_back_only_new_positions(params, impl):
  """Decode on a gathered window (as the sampler's chunk does): same logits as the full
  forward, and the write-back touches exactly the appended positions of each row's pages."""
  ids = np.random.default_rng(1).integers(0, CFG.vocab_size, (2, 14)).astype(np.int32)
  ref = np.asarray(qwen3.forward(params, CFG, jnp.asarray(ids)))
  ip = qwen3.inference_params(params, CFG)
  fwd = jax.jit(paged_kv.forward_paged, static_argnames=("config", "implementation", "logits"))
  win_fwd = jax.jit(paged_kv.forward_window, static_argnames=("config", "implementation"))
  pool = paged_kv.init_pool(CFG, 10, 4)
  # Row 1 owns pages 1, 8, 3; its table's last entry names row 0's page 2, which row 0
  # appends to during the chunk: a write-back past row 1's own tokens would clobber them.
  table = np.array([[5, 2, 7, 0], [1, 8, 3, 2]], np.int32)
  lengths = np.array([6, 10], np.int32)
  mask = np.arange(10)[None, :] < lengths[:, None]
  _, pool = fwd(
    ip, CFG, ids[:, :10], mask, pool, table, jnp.zeros(2, jnp.int32), implementation=impl
  )
  before = jax.tree.map(np.asarray, pool)
  window = paged_kv.gather_window(pool, jnp.asarray(table), impl)
  start, n_new = lengths.copy(), np.array([5, 1])  # row 1 stops after 1 of the 5 steps
  for t in range(5):
    m = t < n_new
    tok = np.array([[ids[b, lengths[b]] if m[b] else 0] for b in range(2)], np.int32)
    lg, window = win_fwd(
      ip, CFG, tok, m[:, None], window, jnp.asarray(lengths), implementation=impl
    )
    for b in range(2):
      if m[b]:
        np.testing.assert_allclose(np.asarray(lg)[b, 0], ref[b, lengths[b]], atol=2e-5)
    lengths = lengths + m
  pool = paged_kv.scatter_window(
    pool, jnp.asarray(table), window, start, jnp.asarray(n_new), 5, impl
  )
  after = jax.tree.map(np.asarray, pool)
  written = {
    (int(table[b, p // 4]), p % 4) for b in range(2) for p in range(start[b], start[b] + n_new[b])
  }
  # Keys are [N, Hkv, Dh, P] and values [N, Hkv, P, Dh]: (page, position) pairs that changed.
  pairs = [(before.k, after.k, (1, 2)), (before.v, after.v, (1, 3))]
  for a0s, a1s, axes in pairs:
    for a0, a1 in zip(a0s, a1s):
      changed = {(int(i), int(j)) for i, j in zip(*np.nonzero(np.any(a0 != a1, axis=axes)))}
      assert changed == written  # the appended positions, nothing else
  # Continuing from the pool with the paged forward sees the window's writes.
  tok = np.array([[ids[0, lengths[0]]], [ids[1, lengths[1]]]], np.int32)
  lg, _ = fwd(
    ip, CFG, tok, np.ones((2, 1), bool), pool, table, jnp.asarray(lengths), implementation=impl
  )
  for b in range(2):
    np.testing.assert_allclose(np.asarray(lg)[b, 0], ref[b, lengths[b]], atol=2e-5)


def test_attention_paths_agree_with_gqa_and_masks():
  key = jax.random.split(jax.random.key(1), 3)
  q = jax.random.normal(key[0], (3, 2, 8, 16))
  k = jax.random.normal(key[1], (3, 24, 2, 16))
  v = jax.random.normal(key[2], (3, 24, 2, 16))
  pos = jnp.array([[5, 6], [0, 1], [22, 23]])
  allowed = jnp.arange(24)[None, None] <= pos[:, :, None]
  a = paged_kv.attend_window(q, k, v, allowed, "xla")
  b = paged_kv.attend_window(q, k, v, allowed, "fused")
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
  with pytest.raises(ValueError, match="decode attention: expected one of"):
    paged_kv.attend_window(q, k, v, allowed, "pallas")


def test_pool_bytes_counts_k_and_v_of_every_layer():
  pool = paged_kv.init_pool(CFG, 5, 4, jnp.bfloat16)
  real = sum(a.size * a.dtype.itemsize for a in pool.k + pool.v)
  assert paged_kv.pool_bytes(CFG, 5, 4, jnp.bfloat16) == real

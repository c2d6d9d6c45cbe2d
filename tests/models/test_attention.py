"""The "blockwise" and "fused" attentions equal "xla" (forward and gradients).

Tolerances (float32 everywhere): outputs and logits atol 2e-5; gradients atol 5e-5 / rtol 1e-4
(observed ~1e-6: the blockwise sums run in a different order). Padding queries have unspecified
outputs, so comparisons weight them by zero (their cotangent is zero, as in the losses).
On CPU "fused" runs jax.nn.dot_product_attention's XLA path (the cuDNN kernel needs CUDA); the
GPU check script (scripts/gpu_check.sh) covers the cuDNN path.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.learner import optim, steps
from rstar_jax.learner.train_state import TrainState
from rstar_jax.models import attention, qwen3
from rstar_jax.sharding import make_mesh

ATOL, GRAD_ATOL, GRAD_RTOL = 2e-5, 5e-5, 1e-4
B, T, HQ, HKV, DH = 3, 45, 4, 2, 8


def _qkv(seed=0, t=T):
  ks = jax.random.split(jax.random.key(seed), 3)
  return (
    jax.random.normal(ks[0], (B, t, HQ, DH)),
    jax.random.normal(ks[1], (B, t, HKV, DH)),
    jax.random.normal(ks[2], (B, t, HKV, DH)),
  )


def _inputs(kind, t=T):
  """(kv_valid [B, T] bool, segment_ids or None) for ragged / padded / packed rows."""
  idx = np.arange(t)
  if kind == "ragged":  # right padding, every row a different length
    valid = idx[None] < np.array([t, t - 7, 11])[:, None]
    return jnp.asarray(valid), None
  if kind == "padded":  # left padding on one row, right on another, none on the third
    valid = np.ones((B, t), bool)
    valid[0, :9] = False
    valid[1, t - 13 :] = False
    return jnp.asarray(valid), None
  # packed: 1-4 segments per row (ids 1..), trailing padding with id 0
  seg = np.zeros((B, t), np.int32)
  seg[0, :10], seg[0, 10:30], seg[0, 30 : t - 2] = 1, 2, 3
  seg[1, :t] = 1
  seg[2, :3], seg[2, 3:4], seg[2, 4:20], seg[2, 20:25] = 1, 2, 3, 4
  return jnp.asarray(seg > 0), jnp.asarray(seg)


def _attention_loss(kind, name, bs, q, k, v):
  """(sum of sin(output) over real queries, output): padding queries weigh zero."""
  valid, seg = _inputs(kind)
  o = attention.self_attention(q, k, v, valid, seg, implementation=name, block_size=bs or 512)
  return jnp.sum(jnp.sin(o) * valid[..., None]), o


@functools.cache
def _xla_attention_grads(kind):
  """The "xla" reference of a kind (gradients, output), computed once for the three cases."""
  loss = functools.partial(_attention_loss, kind, "xla", None)
  return jax.grad(loss, (0, 1, 2), has_aux=True)(*_qkv())


@pytest.mark.parametrize("kind", ["ragged", "padded", "packed"])
@pytest.mark.parametrize("impl,block", [("blockwise", 8), ("blockwise", 16), ("fused", None)])
def test_attention_equals_xla_forward_and_grads(kind, impl, block):
  w = _inputs(kind)[0][..., None].astype(jnp.float32)  # weight 0 on padding queries
  want_grads, want = _xla_attention_grads(kind)
  fn = jax.grad(functools.partial(_attention_loss, kind, impl, block), (0, 1, 2), has_aux=True)
  got_grads, got = jax.jit(fn)(*_qkv())
  chex.assert_trees_all_close(got * w, want * w, atol=ATOL)
  chex.assert_trees_all_close(got_grads, want_grads, atol=GRAD_ATOL, rtol=GRAD_RTOL)


def test_blockwise_without_jit_equals_xla():
  q, k, v = _qkv()
  valid, seg = _inputs("packed")
  want = attention.self_attention(q, k, v, valid, seg)
  got = attention.self_attention(q, k, v, valid, seg, implementation="blockwise", block_size=8)
  w = valid[..., None]
  chex.assert_trees_all_close(got * w, want * w, atol=ATOL)


def test_packed_attention_never_crosses_segments():
  """Changing one segment's keys/values leaves every other segment's output unchanged."""
  q, k, v = _qkv()
  valid, seg = _inputs("packed")
  o1 = attention.self_attention(q, k, v, valid, seg, implementation="blockwise", block_size=8)
  in_seg2 = (seg == 2)[..., None, None]
  o2 = attention.self_attention(
    q,
    jnp.where(in_seg2, k + 3.0, k),
    jnp.where(in_seg2, v - 2.0, v),
    valid,
    seg,
    implementation="blockwise",
    block_size=8,
  )
  outside = np.asarray((seg != 2) & valid)
  np.testing.assert_array_equal(np.asarray(o1)[outside], np.asarray(o2)[outside])
  assert not np.allclose(np.asarray(o1)[np.asarray(seg == 2)], np.asarray(o2)[np.asarray(seg == 2)])


def test_unknown_implementation_is_a_clear_error():
  q, k, v = _qkv()
  with pytest.raises(ValueError, match="expected one of"):
    attention.self_attention(q, k, v, jnp.ones((B, T), bool), implementation="flash")
  with pytest.raises(ValueError, match="Qwen3Config.attention must be one of"):
    qwen3.Qwen3Config(
      vocab_size=8,
      hidden_size=8,
      intermediate_size=8,
      num_hidden_layers=1,
      num_attention_heads=1,
      num_key_value_heads=1,
      attention="flash",
    )


def test_fused_logs_its_fallback_reason_once(caplog):
  attention._logged.clear()
  q, k, v = _qkv()
  with caplog.at_level("WARNING"):
    for _ in range(2):
      attention.self_attention(q, k, v, jnp.ones((B, T), bool), implementation="fused")
  reasons = [r for r in caplog.records if "attention='fused'" in r.getMessage()]
  if jax.default_backend() == "cpu":
    assert len(reasons) == 1 and "backend is 'cpu'" in reasons[0].getMessage()


def _grad_temp_bytes(impl, t, block=128):
  q = jax.ShapeDtypeStruct((1, t, 4, 32), jnp.float32)
  kv = jax.ShapeDtypeStruct((1, t, 2, 32), jnp.float32)
  valid = jax.ShapeDtypeStruct((1, t), jnp.bool_)

  def loss(q, k, v, valid):
    return jnp.sum(attention.self_attention(q, k, v, valid, implementation=impl, block_size=block))

  compiled = jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, kv, kv, valid).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_blockwise_grad_memory_is_linear_in_t():
  """XLA's memory analysis of the compiled gradient: "xla" holds (H, T, T) float32 scores
  (4 x 2048^2 x 4 B = 64 MiB at least); "blockwise" holds O(T * block) and grows ~linearly."""
  t = 2048
  dense, blk = _grad_temp_bytes("xla", t), _grad_temp_bytes("blockwise", t)
  assert dense >= 4 * t * t * 4
  assert blk < dense / 8, (blk, dense)
  blk2 = _grad_temp_bytes("blockwise", 2 * t)
  assert blk2 < 3 * blk, (blk, blk2)  # doubling T roughly doubles it (T^2 would be 4x)


# ----------------------------------------------------------------------------- in the model

CFG = qwen3.Qwen3Config(
  vocab_size=97,
  hidden_size=32,
  intermediate_size=48,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=8,
)


@functools.cache
def _params():
  return qwen3.init_params(CFG, jax.random.key(1))


def _model_batch(kind, t=T):
  valid, seg = _inputs(kind, t)
  ids = jax.random.randint(jax.random.key(2), (B, t), 0, CFG.vocab_size)
  if seg is None:
    return ids, valid, None, None
  # Per-segment positions: restart at 0 at each segment start.
  s = np.asarray(seg)
  pos = np.zeros_like(s)
  for b in range(B):
    for j in range(1, t):
      pos[b, j] = pos[b, j - 1] + 1 if s[b, j] == s[b, j - 1] else 0
  return ids, valid, jnp.asarray(seg), jnp.asarray(pos)


@functools.cache
def _model_grads(cfg, kind):
  """(param grads, logits) of a weighted log-softmax sum over the `kind` batch under `cfg`.
  Cached: the "xla" reference of a kind is compiled once for the blockwise and fused cases."""
  ids, valid, seg, pos = _model_batch(kind)
  w = valid.astype(jnp.float32)[..., None]

  def loss(params):
    logits = qwen3.forward(params, cfg, ids, positions=pos, attention_mask=valid, segment_ids=seg)
    return jnp.sum(jax.nn.log_softmax(logits) * w * 0.01), logits

  return jax.jit(jax.grad(loss, has_aux=True))(_params())


@pytest.mark.parametrize("kind", ["ragged", "padded", "packed"])
@pytest.mark.parametrize("impl", ["blockwise", "fused"])
def test_model_forward_and_grads_equal_xla(kind, impl):
  # remat under padded and packed rows, plain under ragged
  ref = CFG.replace(remat=kind != "ragged")
  w = _model_batch(kind)[1].astype(jnp.float32)[..., None]
  g_want, l_want = _model_grads(ref, kind)
  g_got, l_got = _model_grads(ref.replace(attention=impl, attention_block_size=16), kind)
  chex.assert_trees_all_close(l_got * w, l_want * w, atol=ATOL)
  chex.assert_trees_all_close(g_got, g_want, atol=GRAD_ATOL, rtol=GRAD_RTOL)


def test_packed_row_logits_equal_separate_rows():
  """A packed row (segment ids + per-segment positions) gives each trajectory the logits it
  gets alone in its own row."""
  ids, valid, seg, pos = _model_batch("packed")
  fwd = jax.jit(qwen3.forward, static_argnames="config")
  s = np.asarray(seg)
  # Every trajectory alone in its own right-padded row (one compile: same shape).
  where = [(b, np.flatnonzero(s[b] == sid)) for b in range(B) for sid in sorted(set(s[b]) - {0})]
  alone_ids = np.zeros((len(where), T), np.int32)
  alone_mask = np.zeros((len(where), T), bool)
  for r, (b, cols) in enumerate(where):
    alone_ids[r, : len(cols)] = np.asarray(ids)[b, cols]
    alone_mask[r, : len(cols)] = True
  alone = np.asarray(
    fwd(
      _params(),
      config=CFG,
      input_ids=jnp.asarray(alone_ids),
      attention_mask=jnp.asarray(alone_mask),
    )
  )
  for impl in attention.IMPLEMENTATIONS:
    cfg = CFG.replace(attention=impl, attention_block_size=8)
    packed = np.asarray(
      fwd(
        _params(), config=cfg, input_ids=ids, positions=pos, attention_mask=valid, segment_ids=seg
      )
    )
    for r, (b, cols) in enumerate(where):
      np.testing.assert_allclose(
        packed[b, cols],
        alone[r, : len(cols)],
        atol=ATOL,
        rtol=0,
        err_msg=f"{impl}: row {b}, columns {cols}",
      )


OPT = optim.OptimConfig(lr=1e-3, warmup_steps=1)


def _rl_batch(n=8, t=20, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(4, t + 1, n)
  attn = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
  loss = ((rng.random((n, t)) < 0.7) & (attn == 1)).astype(np.float32)
  loss[:, 0] = 0
  old = (np.log(1 / CFG.vocab_size) + rng.normal(size=(n, t)) * 0.3).astype(np.float32) * loss
  return {
    "input_ids": (rng.integers(0, CFG.vocab_size, (n, t)) * attn).astype(np.int32),
    "attention_mask": attn,
    "loss_mask": loss,
    "old_logprobs": old,
    "advantages": rng.normal(size=n).astype(np.float32),
  }


@functools.cache
def _sharded_update(name):
  """(params, metrics) after one sharded RL update with attention `name`, on the host. Cached:
  the "xla" reference is compiled once for the blockwise and fused cases."""
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  tx = optim.make_optimizer(OPT)
  cfg = CFG.replace(attention=name, attention_block_size=8, remat=True)
  js = steps.make_jitted_steps(
    cfg, mesh, tx=tx, config=steps.StepConfig(num_micro_batches=2, optim=OPT)
  )
  state = js.shard_state(TrainState.create(jax.tree.map(jnp.copy, _params()), tx, 0))
  state, metrics = js.rl_step(state, js.shard_batch(_rl_batch()))
  return jax.device_get((state.params, metrics))


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["blockwise", "fused"])
def test_sharded_step_equals_xla(impl):
  """8 fake devices (data 2 x fsdp 2 x tensor 2), remat on, 2 micro-batches: one RL update
  with ``impl`` equals the same update with "xla" (params atol 5e-6 after one AdamW step)."""
  got, want = _sharded_update(impl), _sharded_update("xla")
  chex.assert_trees_all_close(got[0], want[0], atol=5e-6, rtol=0)
  chex.assert_trees_all_close(got[1], want[1], rtol=1e-5, atol=1e-6)

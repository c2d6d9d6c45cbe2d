"""JaxSampler: the embedded rollout engine (paged KV cache, fixed-trip decode units, overlap).

Design:
  * KV memory is one page pool sized by a token budget (``kv_budget_tokens``), not slots x the
    longest request: a request owns ``ceil((prompt + max_new) / page_size)`` pages from
    admission until it ends (``models/paged_kv.py``). A request that can never fit fails with a
    one-line error; one that fits later waits in the queue. A pool the device cannot hold
    fails at construction, before anything is allocated.
  * Two jitted pure functions do all model work, the pool donated to both: ``_prefill``
    (a group of prompts' new tokens, right padded to a length bucket and a power-of-two row
    count) and ``_decode`` (exactly ``decode_chunk`` steps for every slot in a ``lax.scan``:
    a known trip count and no conditional, so XLA:GPU never copies a predicate to the host
    mid-chunk; finished rows are masked, not branched around). Attention reads a static
    window of each row's pages, the smallest of a bounded set of widths (about two per
    octave up to ``max_len``) that covers the rows' lengths, so its cost follows the valid
    length and a longer request reuses a compiled width. The sampling variant (greedy /
    temperature / top-k / top-p, see ``sampling_ops.VARIANTS``) is picked on the host from
    the rows' settings. Every per-row setting is an array, so mixed settings and lengths
    only ever select among: prefill length x row buckets x windows, decode variants x
    windows. ``compile_counts`` counts traces, ``dispatch_counts`` calls.
  * Overlap: decode state (last token, active, count, length) stays on the device between
    chunks. Chunk n + 1 is dispatched before chunk n's tokens are read on the host, which
    then checks stops while the device runs; a row the host ends (stop sequence, a stop id
    past the first few the device checks, abort) is masked from the next dispatch. A row the
    device will end by its budget is not dispatched again, so budget-bound rows waste
    nothing; a row ended by a host-only rule may run one masked-out chunk.
  * Prefix reuse: inside ``trajectory_lease(tid, ...)`` (the agent loop's hook), a finished
    request's pages are kept for the trajectory; its next request, whose ids start with the
    kept tokens, prefills only the appended ones (tool response). ``prefill_tokens`` counts
    the input tokens each trajectory had to run. Kept pages are evicted (oldest first) when
    an admission needs room, and freed when the lease ends.
  * ``generate`` enqueues requests and awaits futures; one background task runs the blocking
    steps in a worker thread (``asyncio.to_thread``) under a lock, so the event loop keeps
    running and requests that arrive mid-batch join at the next step. ``update_weights``
    takes the same lock and swaps params between chunks (each chunk records the version it
    was dispatched with); ``abort(rid)`` ends a pending or running request with
    finish_reason "abort".

Sampling semantics (see ``sampling_ops``): temperature 0 = greedy; top-k / top-p after
temperature; a request's randomness depends only on its seed and the token index, so seeded
outputs are identical whatever the batch composition. ``logprobs`` are the log-probabilities of
the sampled tokens under the RAW model distribution (temperature 1, no top-k/top-p), which is
what the learner recomputes. ``output_ids`` include the stop token / stop sequence that ended
the request. Only ``stop_token_ids`` stop generation: no EOS is added implicitly.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import functools
import os
import threading
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rstar_jax.models import attention as attention_lib
from rstar_jax.models import lora, paged_kv, qwen3
from rstar_jax.rollout import sampling_ops as ops
from rstar_jax.rollout.types import GenerateRequest, GenerateResult

# Stop ids checked on the device per row (more are still honoured on the host, a chunk later).
_DEVICE_STOP_IDS = 4
# Default KV budget per slot when neither ``max_len`` nor ``kv_budget_tokens`` is given.
_DEFAULT_TOKENS_PER_SLOT = 2048

# The trajectory whose lease the current task holds (set by ``trajectory_lease``).
_TRAJECTORY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
  "jax_sampler_trajectory", default=None
)


def _next_pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def _default_buckets(limit: int) -> tuple[int, ...]:
  # From 16: a short prompt padded to 64 costs a prefill up to 4x longer than it needs.
  out, b = [], 16
  while b < limit:
    out.append(b)
    b *= 2
  return tuple(out) + (b,)


def window_buckets(max_pages: int) -> tuple[int, ...]:
  """Window widths in pages: 1, 2, 3, 4, 6, 8, 12, 16, ... (<= 1.5x padding, two per octave)
  capped by ``max_pages`` (always included)."""
  out, b = [], 1
  while b < max_pages:
    out.append(b)
    if b >= 2 and b * 3 // 2 < max_pages:
      out.append(b * 3 // 2)
    b *= 2
  return tuple(sorted(set(out))) + (max_pages,)


def _free_bytes() -> int | None:
  """Free memory of the default device (None when unknown)."""
  dev = jax.devices()[0]
  try:
    stats = dev.memory_stats()
  except Exception:  # noqa: BLE001 - some backends do not implement it
    stats = None
  if stats and "bytes_limit" in stats:
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
  if dev.platform == "cpu":
    try:
      return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
      return None
  return None


# ----------------------------------------------------------------------------- jitted steps


def _prefill(
  params, pool, input_ids, input_mask, page_table, lengths, *, config, impl, counter, routes=False
):
  """Writes P rows' new tokens (all but each request's last token) into their pages.

  The last prompt token is fed by the first decode step, which samples the first output
  token; so prefill needs no logits (no LM head) and all sampling lives in one function.

  Args:
    pool: PagedKV (donated).
    input_ids, input_mask: [P, T] right-padded new tokens (a padding row has none).
    page_table: [P, n] the rows' pages (window n * page_size).
    lengths: [P] int32 tokens each row already has cached (reused prefix).
    routes: (static) also return the MoE routes of the new tokens.
  Returns:
    the pool, or (pool, routes [P, T, L, k] int32) with ``routes``.
  """
  counter["prefill"] += 1
  kw = dict(implementation=impl, logits=False)
  if routes:  # the model's decode step reports the experts it routed each token to
    _, pool, r = paged_kv.forward_paged(
      params, config, input_ids, input_mask, pool, page_table, lengths, return_routes=True, **kw
    )
    return pool, r
  _, pool = paged_kv.forward_paged(
    params, config, input_ids, input_mask, pool, page_table, lengths, **kw
  )
  return pool


def _decode(
  params,
  pool,
  state,
  override,
  max_new,
  seeds,
  temperature,
  top_k,
  top_p,
  stop_ids,
  page_table,
  *,
  config,
  impl,
  variant,
  num_steps,
  counter,
  routes=False,
):
  """Exactly ``num_steps`` decode steps for every slot; inactive rows are masked.

  Args:
    pool: PagedKV (donated).
    state: (tok [B] int32 newest token not yet cached, active [B] bool, count [B] int32 tokens
      generated so far, length [B] int32 tokens cached) as left by the previous call (donated).
    override: (mask [B] bool, tok, active, count, length): rows where ``mask`` take these
      values instead (newly admitted rows, rows the host ended).
    max_new: [B] int32; seeds [B, 2] uint32; temperature, top_p [B] float32; top_k [B] int32.
    stop_ids: [B, K] int32, -1 padded. page_table: [B, n] int32.
    routes: (static) also return each step's MoE routes (of the step's INPUT token).
  Returns:
    (pool, state, out_tokens [B, num_steps] int32 (-1 where a row was inactive),
     out_logprobs [B, num_steps] float32[, out_routes [B, num_steps, L, k] int32, -1 where
     inactive]).
  """
  counter["decode"] += 1
  m = override[0]
  tok, act, cnt, length = (jnp.where(m, o, s) for s, o in zip(state, override[1:]))

  def body(carry, _):
    window, tok, act, cnt, length = carry
    fw = functools.partial(paged_kv.forward_window, implementation=impl)
    if routes:
      logits, window, rt = fw(
        params, config, tok[:, None], act[:, None], window, length, return_routes=True
      )
    else:
      logits, window = fw(params, config, tok[:, None], act[:, None], window, length)
    keys = ops.row_keys(seeds, cnt)
    new, logp = ops.sample_tokens(logits[:, 0], keys, temperature, top_k, top_p, variant=variant)
    out = (jnp.where(act, new, -1), jnp.where(act, logp, 0.0))
    if routes:
      out += (jnp.where(act[:, None, None], rt[:, 0], -1),)
    step = act.astype(jnp.int32)
    cnt, length = cnt + step, length + step
    hit_stop = jnp.any(new[:, None] == stop_ids, axis=-1)
    tok = jnp.where(act, new, tok)
    act = act & ~hit_stop & (cnt < max_new)
    return (window, tok, act, cnt, length), out

  start = length
  window = paged_kv.gather_window(pool, page_table, impl)
  (window, tok, act, cnt, length), outs = jax.lax.scan(
    body, (window, tok, act, cnt, length), None, length=num_steps
  )
  pool = paged_kv.scatter_window(pool, page_table, window, start, length - start, num_steps, impl)
  extra = (jnp.swapaxes(outs[2], 0, 1),) if routes else ()
  return (pool, (tok, act, cnt, length), outs[0].T, outs[1].T) + extra


# ----------------------------------------------------------------------------- host state


@dataclasses.dataclass
class _Request:
  """A request with everything resolved on the host (stop sequences as id tuples, seed)."""

  request: GenerateRequest
  future: asyncio.Future
  prompt: np.ndarray
  max_new: int
  seed: tuple[int, int]
  stop_ids: frozenset[int]
  stop_seqs: tuple[tuple[int, ...], ...]
  tid: str | None = None


@dataclasses.dataclass
class _Row:
  req: _Request
  output_ids: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  versions: list[int] = dataclasses.field(default_factory=list)
  finish_reason: str | None = None
  pages: list[int] = dataclasses.field(default_factory=list)
  dispatched: int = 0  # tokens the dispatched chunks may have produced (upper bound)
  prefilled: int = 0  # input tokens computed at admission (the rest reused a kept cache)
  # MoE routes (JaxSampler(return_routes=True)): one [L, k] per decode step (the route of the
  # step's input token), and the prefill's (device routes [P, T, L, k], row, count, start).
  routes: list | None = None
  prefill_routes: tuple | None = None

  def push(self, token: int, logprob: float, version: int, route=None) -> bool:
    """Appends one token; returns True (and sets finish_reason) when the request ends."""
    if route is not None:
      self.routes.append(route)
    self.output_ids.append(token)
    self.logprobs.append(logprob)
    self.versions.append(version)
    if token in self.req.stop_ids or any(
      len(s) <= len(self.output_ids) and tuple(self.output_ids[-len(s) :]) == s
      for s in self.req.stop_seqs
    ):
      self.finish_reason = "stop"
    elif len(self.output_ids) >= self.req.max_new:
      self.finish_reason = "length"
    return self.finish_reason is not None


@dataclasses.dataclass
class _Kept:
  """A trajectory's cache between its turns: its pages and the tokens they hold."""

  pages: list[int]
  tokens: np.ndarray


@dataclasses.dataclass
class _Chunk:
  """A dispatched decode chunk whose tokens the host has not read yet."""

  out_t: jax.Array
  out_l: jax.Array
  version: int
  rows: dict[int, _Row]
  out_r: jax.Array | None = None


class JaxSampler:
  """Embedded JAX engine implementing the rollout ``Engine`` protocol.

  Args:
    config: ``qwen3.Qwen3Config`` (static).
    params: model param pytree.
    max_batch: decode slots (rows decoded together).
    max_len: longest ``len(input_ids) + max_new_tokens`` of one request (the widest attention
      window). None: the KV budget.
    kv_budget_tokens: KV-cache capacity in tokens, shared by all requests (and trajectories'
      kept prefixes). Default ``max_batch * max_len``, or ``max_batch * 2048`` without
      ``max_len``.
    page_size: tokens per KV page.
    attention: decode/prefill attention: "xla", "fused" (``jax.nn.dot_product_attention``, cuDNN
      on CUDA) or None (fused where cuDNN can run, else xla).
    prefill_buckets: new-token-count buckets (ascending). Prompts are right-padded to the
      smallest bucket that fits; longer ones to a multiple of the last bucket. Default
      16, 32, 64, ... up to ``max_len``.
    decode_chunk: tokens per decode dispatch (K fixed steps on the device per call).
    seed: seeds the per-request seeds of requests whose ``SamplingParams.seed`` is None.
    tokenizer: needed only for ``SamplingParams.stop`` given as strings: each string is
      encoded once (``encode(s, add_special_tokens=False)``) and matched as a token-id suffix,
      so a stop string produced with a different tokenisation is not caught. Entries of
      ``stop`` that are sequences of ints are used as pre-tokenised stop sequences directly.
    weight_version: initial version reported in results.
    return_routes: an MoE policy's results carry routes (`GenerateResult.routes`): those of
      the positions the sampler computed for the request (prefilled input tokens and every
      decode step's input token), i.e. from the first token not reused from a kept cache to
      the second-to-last output token. The model's paged forward must report them
      (``paged_kv.forward_paged`` / ``forward_window`` with ``return_routes=True``).
    dtype: compute dtype ("float32" / "bfloat16") overriding ``config.dtype``, here and in
      every `update_weights` config (e.g. bf16 rollouts beside an f32 learner, whose pushes
      carry the learner's config). None: the config's own.
  """

  # update_weights lands between decode chunks; rows in flight continue with the new weights
  # and record each token's version (rollout/interruptible.py relies on this).
  swaps_weights_in_flight = True

  def __init__(
    self,
    config: qwen3.Qwen3Config,
    params: Any,
    *,
    max_batch: int = 8,
    max_len: int | None = None,
    kv_budget_tokens: int | None = None,
    page_size: int = 16,
    attention: str | None = None,
    prefill_buckets: Sequence[int] | None = None,
    decode_chunk: int = 16,
    seed: int = 0,
    tokenizer: Any = None,
    weight_version: int = 0,
    return_routes: bool = False,
    dtype: str | None = None,
  ):
    if dtype is not None and dtype not in ("float32", "bfloat16"):
      raise ValueError(f"dtype: expected None, 'float32' or 'bfloat16', got {dtype!r}")
    if not isinstance(max_batch, int) or max_batch < 1:
      raise ValueError(f"max_batch: expected an int >= 1, got {max_batch!r}")
    if max_len is not None and (not isinstance(max_len, int) or max_len < 2):
      raise ValueError(f"max_len: expected None or an int >= 2, got {max_len!r}")
    if kv_budget_tokens is not None and (
      not isinstance(kv_budget_tokens, int) or kv_budget_tokens < 2
    ):
      raise ValueError(f"kv_budget_tokens: expected None or an int >= 2, got {kv_budget_tokens!r}")
    if not isinstance(page_size, int) or page_size < 1:
      raise ValueError(f"page_size: expected an int >= 1, got {page_size!r}")
    if attention not in (None,) + paged_kv.DECODE_IMPLEMENTATIONS:
      raise ValueError(
        f"attention: expected None or one of {paged_kv.DECODE_IMPLEMENTATIONS}, got {attention!r}"
      )
    if not isinstance(decode_chunk, int) or decode_chunk < 1:
      raise ValueError(f"decode_chunk: expected an int >= 1, got {decode_chunk!r}")
    if prefill_buckets is not None:
      prefill_buckets = tuple(prefill_buckets)
      if (
        not prefill_buckets
        or any(not isinstance(b, int) or b < 1 for b in prefill_buckets)
        or list(prefill_buckets) != sorted(set(prefill_buckets))
      ):
        raise ValueError(
          f"prefill_buckets: expected strictly ascending positive ints, got {prefill_buckets!r}"
        )
    if kv_budget_tokens is None:
      kv_budget_tokens = max_batch * (max_len or _DEFAULT_TOKENS_PER_SLOT)
    if max_len is None:
      max_len = kv_budget_tokens
    if max_len > kv_budget_tokens:
      raise ValueError(
        f"max_len={max_len} exceeds kv_budget_tokens={kv_budget_tokens}: one request could "
        "never fit"
      )
    self.max_batch = max_batch
    self.decode_chunk = decode_chunk
    self.page_size = page_size
    self.max_len = max_len
    self.kv_budget_tokens = kv_budget_tokens
    self._num_pages = -(-kv_budget_tokens // page_size)
    self._max_pages = -(-max_len // page_size)
    self._windows = window_buckets(self._max_pages)
    self._attention = attention
    self.return_routes = bool(return_routes)
    self._prefill_buckets = prefill_buckets or _default_buckets(max_len)
    self._tokenizer = tokenizer
    self._stop_cache: dict[str, tuple[int, ...]] = {}
    self._seed_rng = np.random.default_rng(seed)
    self._weight_version = int(weight_version)
    self.compile_counts = collections.Counter()
    self.dispatch_counts = collections.Counter()
    self.prefill_tokens: collections.Counter[str] = collections.Counter()
    self.evictions = 0  # kept trajectory prefixes dropped to make room
    self._dtype = dtype
    self._set_model(self._own_dtype(config), params)
    self._check_fits()
    self._pool: paged_kv.PagedKV | None = None
    self._pending: collections.deque[_Request] = collections.deque()
    self._abort_rids: set[str] = set()
    self._leases: collections.Counter[str] = collections.Counter()
    self._loop: asyncio.AbstractEventLoop | None = None
    self._task: asyncio.Task | None = None
    self._lock: asyncio.Lock | None = None
    self._thread_guard = threading.Lock()  # the device state is touched by one thread
    self._reset_rows()

  def _own_dtype(self, config):
    """``config`` with the sampler's own compute dtype, when it has one (``dtype``)."""
    return config.replace(dtype=self._dtype) if self._dtype else config

  # ------------------------------------------------------------------ public API

  @property
  def weight_version(self) -> int:
    return self._weight_version

  @property
  def free_pages(self) -> int:
    return len(self._free)

  async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
    """Generates for every request; results in request order."""
    self._bind_loop()
    loop = asyncio.get_running_loop()
    resolved = [self._resolve(r, i, loop) for i, r in enumerate(requests)]
    self._pending.extend(resolved)
    if self._task is None or self._task.done():
      self._task = loop.create_task(self._schedule())
    return list(await asyncio.gather(*(r.future for r in resolved)))

  @contextlib.asynccontextmanager
  async def trajectory_lease(self, tid: str, budget_tokens: int | None = None):
    """Requests made inside (by this task) belong to trajectory ``tid``: the cache of each
    finished request is kept so the next one prefills only its new tokens. The kept pages
    are freed on exit (and may be evicted earlier when an admission needs room)."""
    del budget_tokens  # pages are reserved per request, not per trajectory
    self._bind_loop()
    token = _TRAJECTORY.set(tid)
    self._leases[tid] += 1
    try:
      yield
    finally:
      _TRAJECTORY.reset(token)
      self._leases[tid] -= 1
      if self._leases[tid] <= 0:
        del self._leases[tid]
        async with self._lock:
          kept = self._kept.pop(tid, None)
          if kept is not None:
            self._free.extend(kept.pages)

  async def update_weights(
    self, config: qwen3.Qwen3Config, params: Any, version: int | None = None
  ) -> None:
    """Swaps params between decode chunks; rows in flight continue with the new weights
    (each token's version is recorded). ``version`` None = current + 1."""
    self._bind_loop()
    config = self._own_dtype(config)
    async with self._lock:
      if config != self.config and any(r is not None for r in self._rows):
        raise ValueError(
          "update_weights: config changed while requests are in flight; "
          f"had {self.config}, got {config}"
        )
      if config != self.config:
        self._set_model(config, params)
        self._check_fits()
        self._reset_rows()
        self._pool = None
      else:
        self._set_model(config, params)
      if self._kept:  # cached prefixes were computed by the old weights
        for kept in self._kept.values():
          self._free.extend(kept.pages)
        self._kept.clear()
      self._weight_version = self._weight_version + 1 if version is None else int(version)

  async def abort(self, rid: str) -> bool:
    """Ends request ``rid`` with finish_reason "abort" (output so far kept); False when no
    such request is pending or in flight. A decoding row stops before the next chunk."""
    self._bind_loop()
    async with self._lock:  # the worker thread admits from the queue while it holds the lock
      return self._abort_locked(rid)

  def _abort_locked(self, rid: str) -> bool:
    for req in self._pending:
      if req.request.rid == rid:
        self._pending.remove(req)
        if not req.future.done():
          req.future.set_result(
            _make_result(_Row(req, finish_reason="abort"), self._weight_version)
          )
        return True
    if any(r is not None and r.req.request.rid == rid for r in self._rows):
      self._abort_rids.add(rid)
      return True
    return False

  # ------------------------------------------------------------------ setup

  def _set_model(self, config, params):
    if getattr(self, "config", None) != config:  # same shapes: keep the compiled functions
      self._build_fns(config)
    # The sampler's own copy in the decode-friendly layout (per-layer weights, an untied
    # LM-head kernel); the caller's params stay as they are.
    self._params = self._to_inference(lora.merged(params))  # LoRA: merged weights

  def _build_fns(self, config):
    self.config = config
    self._to_inference = jax.jit(functools.partial(qwen3.inference_params, config=config))
    self._cache_dtype = jnp.dtype(config.dtype)
    impl = self._attention
    if impl is None:
      impl = "fused" if attention_lib.fused_unavailable_reason(self._cache_dtype) is None else "xla"
    self.attention = impl
    self._prefill_fn = jax.jit(
      functools.partial(
        _prefill, config=config, impl=impl, counter=self.compile_counts, routes=self.return_routes
      ),
      donate_argnames=("pool",),
    )
    self._decode_fns = {
      v: jax.jit(
        functools.partial(
          _decode,
          config=config,
          impl=impl,
          variant=v,
          num_steps=self.decode_chunk,
          counter=self.compile_counts,
          routes=self.return_routes,
        ),
        donate_argnames=("pool", "state"),
      )
      for v in ops.VARIANTS
    }

  def _check_fits(self):
    need = paged_kv.pool_bytes(self.config, self._num_pages, self.page_size, self._cache_dtype)
    free = _free_bytes()
    if free is not None and need > free:
      raise ValueError(
        f"JaxSampler: a KV cache of kv_budget_tokens={self.kv_budget_tokens} needs "
        f"{need / 2**30:.2f} GiB but the device has {free / 2**30:.2f} GiB free; lower "
        "kv_budget_tokens (or max_batch / max_len)"
      )

  def _reset_rows(self):
    B = self.max_batch
    self._rows: list[_Row | None] = [None] * B
    self._free: list[int] = list(range(self._num_pages))
    self._kept: collections.OrderedDict[str, _Kept] = collections.OrderedDict()
    self._chunks: collections.deque[_Chunk] = collections.deque()
    self._state = None  # device (tok, active, count, length)
    self._max_new = np.zeros(B, np.int32)
    self._seeds = np.zeros((B, 2), np.uint32)
    self._temp = np.zeros(B, np.float32)
    self._top_k = np.zeros(B, np.int32)
    self._top_p = np.ones(B, np.float32)
    self._stop = np.full((B, _DEVICE_STOP_IDS), -1, np.int32)
    self._table = np.zeros((B, self._max_pages), np.int32)
    self._clear_override()

  def _clear_override(self):
    B = self.max_batch
    self._ovr = (
      np.zeros(B, bool),
      np.zeros(B, np.int32),
      np.zeros(B, bool),
      np.zeros(B, np.int32),
      np.zeros(B, np.int32),
    )

  def _bind_loop(self):
    loop = asyncio.get_running_loop()
    if self._loop is not loop:
      if self._task is not None and not self._task.done():
        raise RuntimeError("JaxSampler is already running on another event loop")
      self._loop, self._task, self._lock = loop, None, asyncio.Lock()

  def _stop_sequence(self, stop) -> tuple[int, ...]:
    if isinstance(stop, str):
      if stop not in self._stop_cache:
        if self._tokenizer is None:
          raise ValueError(
            f"SamplingParams.stop has the string {stop!r} but JaxSampler "
            "was built without a tokenizer: pass tokenizer=... or give "
            "the stop sequence as a tuple of token ids"
          )
        enc = self._tokenizer.encode(stop, add_special_tokens=False)
        ids = tuple(int(t) for t in getattr(enc, "ids", enc))
        if not ids:
          raise ValueError(f"stop string {stop!r} encodes to no tokens")
        self._stop_cache[stop] = ids
      return self._stop_cache[stop]
    ids = tuple(int(t) for t in stop)
    if not ids:
      raise ValueError("SamplingParams.stop: an empty stop sequence")
    return ids

  def _resolve(self, req: GenerateRequest, index: int, loop) -> _Request:
    where = f"requests[{index}]" + (f" (rid={req.rid!r})" if req.rid is not None else "")
    sp = req.sampling
    prompt = np.asarray(req.input_ids, np.int64)
    V = self.config.vocab_size
    if prompt.ndim != 1 or prompt.size == 0:
      raise ValueError(f"{where}: input_ids must be a non-empty list of ints")
    if prompt.min() < 0 or prompt.max() >= V:
      raise ValueError(
        f"{where}: input_ids must lie in [0, {V}), got min {prompt.min()} max {prompt.max()}"
      )
    if not isinstance(sp.max_new_tokens, int) or sp.max_new_tokens < 1:
      raise ValueError(f"{where}: max_new_tokens must be an int >= 1, got {sp.max_new_tokens!r}")
    if sp.temperature < 0:
      raise ValueError(f"{where}: temperature must be >= 0, got {sp.temperature}")
    if not 0 < sp.top_p <= 1:
      raise ValueError(f"{where}: top_p must be in (0, 1], got {sp.top_p}")
    need = prompt.size + sp.max_new_tokens
    if need > self.max_len:
      raise ValueError(
        f"{where}: len(input_ids) + max_new_tokens = {prompt.size} + "
        f"{sp.max_new_tokens} = {need} exceeds max_len={self.max_len}"
      )
    seed = sp.seed if sp.seed is not None else int(self._seed_rng.integers(0, 2**63))
    return _Request(
      request=req,
      future=loop.create_future(),
      prompt=prompt.astype(np.int32),
      max_new=sp.max_new_tokens,
      seed=ops.split_seed(int(seed)),
      stop_ids=frozenset(int(t) for t in sp.stop_token_ids),
      stop_seqs=tuple(self._stop_sequence(s) for s in sp.stop),
      tid=_TRAJECTORY.get(),
    )

  # ------------------------------------------------------------------ scheduler

  def _busy(self) -> bool:
    return bool(self._pending) or any(r is not None for r in self._rows) or bool(self._chunks)

  async def _schedule(self):
    while self._busy():
      async with self._lock:
        done = self._take_aborted()
        try:
          done += await asyncio.to_thread(self._step)
        except BaseException as e:  # noqa: BLE001 - every waiter must hear about it
          with self._thread_guard:  # a cancelled to_thread may still be running
            failed = [r.req for r in self._rows if r is not None]
            self._reset_rows()
            self._pool = None
          for r in failed:
            if not r.future.done():
              r.future.set_exception(e)
          _resolve(done)
          if isinstance(e, asyncio.CancelledError):
            raise
          continue
      _resolve(done)
      await asyncio.sleep(0)  # let aborts, weight swaps and new requests in between steps

  def _take_aborted(self) -> list[tuple[asyncio.Future, GenerateResult]]:
    out = []
    for slot, row in enumerate(self._rows):
      if row is not None and row.req.request.rid in self._abort_rids:
        row.finish_reason = "abort"
        self._finish(slot, out)
    self._abort_rids.clear()
    return out

  def _step(self) -> list[tuple[asyncio.Future, GenerateResult]]:
    """Blocking: admit what fits, dispatch one decode chunk, then read the previous chunk
    (so the host's bookkeeping overlaps the device's work)."""
    with self._thread_guard:
      finished: list[tuple[asyncio.Future, GenerateResult]] = []
      if self._pool is None:
        self._pool = paged_kv.init_pool(
          self.config, self._num_pages, self.page_size, self._cache_dtype
        )
      self._admit_pending(finished)
      dispatched = self._dispatch()
      if self._chunks and (len(self._chunks) > 1 or not dispatched):
        self._read(self._chunks.popleft(), finished)
      return finished

  # ------------------------------------------------------------------ admission

  def _take_pages(self, n: int, keep_tid: str | None) -> list[int] | None:
    """``n`` free pages, evicting other trajectories' kept prefixes (oldest first); None
    (nothing taken) when they are not enough."""
    while len(self._free) < n:
      victim = next((t for t in self._kept if t != keep_tid), None)
      if victim is None:
        return None
      self._free.extend(self._kept.pop(victim).pages)
      self.evictions += 1
    taken, self._free = self._free[:n], self._free[n:]
    return taken

  def _admit_pending(self, finished):
    P = self.page_size
    admitted: list[tuple[int, _Row, int]] = []  # (slot, row, cached prefix length)
    free_slots = [b for b, r in enumerate(self._rows) if r is None]
    while self._pending and free_slots:
      req = self._pending[0]
      n_in = req.prompt.size
      kept = self._kept.get(req.tid) if req.tid is not None else None
      reuse = 0
      if kept is not None:
        m = min(kept.tokens.size, n_in - 1)
        same = kept.tokens[:m] == req.prompt[:m]
        reuse = m if same.all() else int(np.argmin(same))
      total = -(-(n_in + req.max_new) // P)
      have = kept.pages[: -(-reuse // P)] if kept is not None else []
      extra = self._take_pages(total - len(have), req.tid)
      if extra is None:
        break  # waits for pages; requests behind it wait too (FIFO)
      self._pending.popleft()
      if kept is not None:
        del self._kept[req.tid]
        self._free.extend(kept.pages[len(have) :])
      slot = free_slots.pop(0)
      row = _Row(req, pages=have + extra, prefilled=n_in - reuse)
      if self.return_routes:
        row.routes = []
      self._rows[slot] = row
      admitted.append((slot, row, reuse))
      if req.tid is not None:
        self.prefill_tokens[req.tid] += n_in - reuse
    if admitted:
      self._prefill(admitted)

  def _bucket(self, n: int) -> int:
    for b in self._prefill_buckets:
      if n <= b:
        return b
    return -(-n // self._prefill_buckets[-1]) * self._prefill_buckets[-1]

  def _window(self, tokens: int) -> int:
    pages = -(-max(tokens, 1) // self.page_size)
    return next(w for w in self._windows if w >= pages)

  def _prefill(self, admitted):
    groups: dict[int, list[tuple[int, _Row, int]]] = collections.defaultdict(list)
    for slot, row, reuse in admitted:
      self._table[slot] = 0
      self._table[slot, : len(row.pages)] = row.pages
      new = row.req.prompt.size - 1 - reuse
      if new > 0:
        groups[self._bucket(new)].append((slot, row, reuse))
      self._setup_row(slot, row, reuse)
    for T, group in sorted(groups.items()):
      Pn = min(_next_pow2(len(group)), self.max_batch)
      n = self._window(max(r.req.prompt.size - 1 for _, r, _ in group))
      ids = np.zeros((Pn, T), np.int32)
      mask = np.zeros((Pn, T), bool)
      table = np.zeros((Pn, n), np.int32)
      lengths = np.zeros(Pn, np.int32)
      for i, (slot, row, reuse) in enumerate(group):
        k = row.req.prompt.size - 1 - reuse
        ids[i, :k], mask[i, :k] = row.req.prompt[reuse:-1], True
        table[i], lengths[i] = self._table[slot, :n], reuse
      out = self._prefill_fn(self._params, self._pool, ids, mask, table, lengths)
      self.dispatch_counts["prefill"] += 1
      if self.return_routes:  # read at the request's end, so the prefill stays asynchronous
        self._pool, r = out
        for i, (slot, row, reuse) in enumerate(group):
          row.prefill_routes = (r, i, row.req.prompt.size - 1 - reuse, reuse)
      else:
        self._pool = out

  def _setup_row(self, slot: int, row: _Row, reuse: int):
    req, sp = row.req, row.req.request.sampling
    mask, tok, act, cnt, length = self._ovr
    mask[slot], tok[slot], act[slot], cnt[slot] = True, req.prompt[-1], True, 0
    length[slot] = req.prompt.size - 1
    self._max_new[slot], self._seeds[slot] = req.max_new, req.seed
    self._temp[slot], self._top_k[slot], self._top_p[slot] = sp.temperature, sp.top_k, sp.top_p
    stop = sorted(req.stop_ids)[:_DEVICE_STOP_IDS]
    self._stop[slot] = -1
    self._stop[slot, : len(stop)] = stop

  # ------------------------------------------------------------------ decode

  def _dispatch(self) -> bool:
    """Dispatches one decode chunk for the rows that may still be generating; False when
    there are none (every row is done or will be by the chunks already in flight)."""
    K = self.decode_chunk
    live = {
      b: r for b, r in enumerate(self._rows) if r is not None and r.dispatched < r.req.max_new
    }
    if not live:
      return False
    idx = np.fromiter(live, np.int32)
    variant = ops.pick_variant(
      self._temp[idx], self._top_k[idx], self._top_p[idx], self.config.vocab_size
    )
    reach = max(r.req.prompt.size - 1 + min(r.dispatched + K, r.req.max_new) for r in live.values())
    n = self._window(reach)
    if self._state is None:
      B = self.max_batch
      z = np.zeros(B, np.int32)
      self._state = (z, np.zeros(B, bool), z, z)
    self._pool, self._state, out_t, out_l, *out_r = self._decode_fns[variant](
      self._params,
      self._pool,
      self._state,
      self._ovr,
      self._max_new,
      self._seeds,
      self._temp,
      self._top_k,
      self._top_p,
      self._stop,
      np.ascontiguousarray(self._table[:, :n]),
    )
    self.dispatch_counts["decode"] += 1
    self._clear_override()
    for r in live.values():
      r.dispatched += K
    self._chunks.append(
      _Chunk(out_t, out_l, self._weight_version, live, out_r[0] if out_r else None)
    )
    return True

  def _read(self, chunk: _Chunk, finished):
    out_t, out_l = np.asarray(chunk.out_t), np.asarray(chunk.out_l)
    out_r = None if chunk.out_r is None else np.asarray(chunk.out_r)
    for slot, row in chunk.rows.items():
      if self._rows[slot] is not row:  # ended by the host while this chunk ran
        continue
      for i, (t, lp) in enumerate(zip(out_t[slot], out_l[slot])):
        if t < 0:
          raise RuntimeError(
            f"JaxSampler: row {slot} stopped on the device but not on the host "
            f"after {len(row.output_ids)} tokens"
          )
        route = None if out_r is None else out_r[slot, i]
        if row.push(int(t), float(lp), chunk.version, route):
          self._finish(slot, finished)
          break

  def _finish(self, slot: int, finished):
    row = self._rows[slot]
    self._rows[slot] = None
    mask, _, act, _, _ = self._ovr
    mask[slot], act[slot] = True, False  # masked from the next dispatch
    req = row.req
    cached = req.prompt.size - 1 + len(row.output_ids)
    keep = -(-cached // self.page_size) if req.tid in self._leases else 0
    if keep:
      tokens = np.concatenate([req.prompt, np.asarray(row.output_ids[:-1], np.int32)])
      old = self._kept.pop(req.tid, None)
      if old is not None:
        self._free.extend(old.pages)
      self._kept[req.tid] = _Kept(row.pages[:keep], tokens[:cached])
    self._free.extend(row.pages[keep:])
    finished.append((req.future, _make_result(row, self._weight_version)))


def _resolve(done: list[tuple[asyncio.Future, GenerateResult]]) -> None:
  for fut, result in done:
    if not fut.done():
      fut.set_result(result)


def _make_result(row: _Row, current_version: int) -> GenerateResult:
  """``weight_version`` is the oldest version that produced a token (the staleness bound;
  ``current_version`` when there are none); ``weight_versions`` has each token's version
  (weights can change mid-request)."""
  routes, start = _row_routes(row)
  return GenerateResult(
    output_ids=row.output_ids,
    logprobs=row.logprobs,
    finish_reason=row.finish_reason,
    weight_version=min(row.versions, default=current_version),
    weight_versions=row.versions,
    prefill_tokens=row.prefilled,
    routes=routes,
    routes_start=start,
  )


def _row_routes(row: _Row) -> tuple[np.ndarray | None, int]:
  """(routes [S, L, k], first position): the prefilled input tokens' routes (positions
  reuse ... prompt - 2) then each decode step's (prompt - 1 ... prompt + outputs - 2)."""
  if not row.routes and row.prefill_routes is None:
    return None, 0
  decode_start = row.req.prompt.size - 1
  parts = [np.stack(row.routes)] if row.routes else []
  start = decode_start
  if row.prefill_routes is not None:
    r, i, n, start = row.prefill_routes
    parts.insert(0, np.asarray(r[i, :n]))
  return np.concatenate(parts).astype(np.int32), start

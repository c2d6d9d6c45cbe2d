"""JaxSampler: the embedded rollout engine (jitted prefill + chunked decode, continuous batching).

Design:
  * One KV cache of ``max_batch`` slots x ``max_len`` positions lives on the device for the
    sampler's lifetime. A request occupies one slot from prefill until it stops; its slot is
    then refilled with the next pending request while the other rows keep decoding.
  * Two jitted pure functions do all model work: ``_prefill`` (a group of new prompts, right
    padded to a length bucket and a power-of-two row count, written into their slots) and
    ``_decode`` (up to ``decode_chunk`` tokens for every slot in one ``lax.while_loop``, leaving
    early once every row is done). The cache is donated to both. Every per-row setting is an
    array, so mixed temperatures / top-k / top-p / lengths never recompile; shapes only change
    with the prefill bucket, the prefill row bucket and (when ``max_len`` is not given) the
    cache length bucket. ``compile_counts`` counts traces of each function. The sampler
    decodes with its own copy of the weights in ``qwen3.inference_params`` layout (made on
    construction and on ``update_weights``).
  * Stops are decided on the host after each chunk, token by token: stop token ids, multi-token
    stop sequences (matched on token-id suffixes; generated ids are never decoded), and
    ``max_new_tokens``. The device also stops a row on its first few stop ids and at
    ``max_new_tokens`` so finished rows stop spending compute and cache.
  * ``generate`` enqueues requests and awaits futures; one background task runs the blocking
    steps in a worker thread (``asyncio.to_thread``) under a lock, so the event loop (tool
    calls, other trajectories) keeps running and requests that arrive mid-batch join at the
    next refill. ``update_weights`` takes the same lock and swaps params between steps;
    ``abort(rid)`` ends a pending or running request with finish_reason "abort".

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
import dataclasses
import functools
import threading
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rstar_jax.models import lora, qwen3
from rstar_jax.models.kv_cache import KVCache
from rstar_jax.rollout import sampling_ops as ops
from rstar_jax.rollout.types import GenerateRequest, GenerateResult

# Stop ids checked on the device per row (more are still honoured on the host, a chunk later).
_DEVICE_STOP_IDS = 4


def _next_pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def _default_buckets(limit: int) -> tuple[int, ...]:
  # From 16: a short prompt padded to 64 costs a prefill up to 4x longer than it needs.
  out, b = [], 16
  while b < limit:
    out.append(b)
    b *= 2
  return tuple(out) + (b,)


# ----------------------------------------------------------------------------- jitted steps


def _prefill(params, cache: KVCache, slots, input_ids, input_mask, *, config, counter):
  """Writes P prompts (all but their last token) into their slots, replacing what was there.

  The last prompt token is fed by the first decode step, which samples the first output
  token; so prefill needs no logits (XLA drops the LM head) and all sampling lives in one
  compiled function.

  Args:
    params: model params.
    cache: KVCache, L layers of [B, ...] buffers (donated).
    slots: [P] int32 target slots; ``>= B`` marks a padding row (its writes are dropped).
    input_ids, input_mask: [P, T] right-padded prompt prefixes (a row may have no tokens).
  Returns:
    the cache with those rows rewritten and their lengths set to the prefix lengths.
  """
  counter["prefill"] += 1
  P = input_ids.shape[0]
  sub = qwen3.init_cache(config, P, cache.max_len, dtype=cache.k[0].dtype)
  _, sub = qwen3.forward_cached(params, config, input_ids, sub, input_mask)
  return KVCache(
    k=tuple(c.at[slots].set(n, mode="drop") for c, n in zip(cache.k, sub.k)),
    v=tuple(c.at[slots].set(n, mode="drop") for c, n in zip(cache.v, sub.v)),
    lengths=cache.lengths.at[slots].set(sub.lengths, mode="drop"),
  )


def _decode(
  params,
  cache: KVCache,
  tokens,
  active,
  count,
  max_new,
  seeds,
  temperature,
  top_k,
  top_p,
  stop_ids,
  *,
  config,
  num_steps,
  counter,
):
  """Up to ``num_steps`` decode steps for every slot (leaves early when no row is active).

  Args:
    cache: KVCache (donated).
    tokens: [B] int32, each row's newest token, not yet in the cache (right after prefill:
      the last prompt token).
    active: [B] bool, rows that still need tokens.
    count: [B] int32, tokens generated so far per row (= index of the next one).
    max_new: [B] int32; seeds [B, 2] uint32; temperature, top_p [B] float32; top_k [B] int32.
    stop_ids: [B, K] int32, -1 padded.
  Returns:
    (cache, tokens, active, count, out_tokens [B, num_steps] int32 (-1 where a row was
     inactive), out_logprobs [B, num_steps] float32).
  """
  counter["decode"] += 1
  B = tokens.shape[0]

  def cond(carry):
    i, _, _, act, *_ = carry
    return (i < num_steps) & jnp.any(act)

  def body(carry):
    i, cache, tok, act, cnt, out_t, out_l = carry
    logits, cache = qwen3.forward_cached(params, config, tok[:, None], cache, act[:, None])
    keys = ops.row_keys(seeds, cnt)
    new, logp = ops.sample_tokens(logits[:, 0], keys, temperature, top_k, top_p)
    out_t = out_t.at[:, i].set(jnp.where(act, new, -1))
    out_l = out_l.at[:, i].set(jnp.where(act, logp, 0.0))
    cnt = cnt + act.astype(jnp.int32)
    hit_stop = jnp.any(new[:, None] == stop_ids, axis=-1)
    tok = jnp.where(act, new, tok)
    act = act & ~hit_stop & (cnt < max_new)
    return i + 1, cache, tok, act, cnt, out_t, out_l

  carry = (
    jnp.int32(0),
    cache,
    tokens,
    active,
    count,
    jnp.full((B, num_steps), -1, jnp.int32),
    jnp.zeros((B, num_steps), jnp.float32),
  )
  _, cache, tokens, active, count, out_t, out_l = jax.lax.while_loop(cond, body, carry)
  return cache, tokens, active, count, out_t, out_l


def _grow(cache: KVCache, new_len: int) -> KVCache:
  """The cache with every row's positions extended to ``new_len`` (zeros, never attended)."""
  extra = new_len - cache.max_len
  return cache._replace(
    k=tuple(jnp.pad(a, ((0, 0), (0, 0), (0, 0), (0, extra))) for a in cache.k),
    v=tuple(jnp.pad(a, ((0, 0), (0, 0), (0, extra), (0, 0))) for a in cache.v),
  )


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


@dataclasses.dataclass
class _Row:
  req: _Request
  output_ids: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  versions: list[int] = dataclasses.field(default_factory=list)
  finish_reason: str | None = None

  def push(self, token: int, logprob: float, version: int) -> bool:
    """Appends one token; returns True (and sets finish_reason) when the request ends."""
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


class JaxSampler:
  """Embedded JAX engine implementing the rollout ``Engine`` protocol.

  Args:
    config: ``qwen3.Qwen3Config`` (static).
    params: model param pytree.
    max_batch: decode slots (rows decoded together).
    max_len: KV-cache positions per slot; every request needs ``len(input_ids) +
      max_new_tokens <= max_len``. None: sized from the requests (next power of two >= 64 of
      the largest need so far); a larger later request grows the cache (one recompile).
    prefill_buckets: prompt-length buckets (ascending). Prompts are right-padded to the
      smallest bucket that fits; longer prompts to a multiple of the last bucket. Default
      16, 32, 64, ... up to the cache length.
    decode_chunk: tokens per jitted decode call before control returns to Python to check
      stops and refill slots (larger = less overhead, more wasted steps past a stop).
    seed: seeds the per-request seeds of requests whose ``SamplingParams.seed`` is None.
    tokenizer: needed only for ``SamplingParams.stop`` given as strings: each string is
      encoded once (``encode(s, add_special_tokens=False)``) and matched as a token-id suffix,
      so a stop string produced with a different tokenisation is not caught. Entries of
      ``stop`` that are sequences of ints are used as pre-tokenised stop sequences directly.
    weight_version: initial version reported in results.
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
    prefill_buckets: Sequence[int] | None = None,
    decode_chunk: int = 16,
    seed: int = 0,
    tokenizer: Any = None,
    weight_version: int = 0,
  ):
    if not isinstance(max_batch, int) or max_batch < 1:
      raise ValueError(f"max_batch: expected an int >= 1, got {max_batch!r}")
    if max_len is not None and (not isinstance(max_len, int) or max_len < 2):
      raise ValueError(f"max_len: expected None or an int >= 2, got {max_len!r}")
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
    self.max_batch = max_batch
    self.decode_chunk = decode_chunk
    self._fixed_max_len = max_len
    self._prefill_buckets = prefill_buckets
    self._tokenizer = tokenizer
    self._stop_cache: dict[str, tuple[int, ...]] = {}
    self._seed_rng = np.random.default_rng(seed)
    self._weight_version = int(weight_version)
    self.compile_counts = collections.Counter()
    self._set_model(config, params)
    self._cache: KVCache | None = None
    self._rows: list[_Row | None] = [None] * max_batch
    self._reset_row_arrays()
    self._pending: collections.deque[_Request] = collections.deque()
    self._abort_rids: set[str] = set()
    self._loop: asyncio.AbstractEventLoop | None = None
    self._task: asyncio.Task | None = None
    self._lock: asyncio.Lock | None = None
    self._thread_guard = threading.Lock()  # the device state is touched by one thread

  # ------------------------------------------------------------------ public API

  @property
  def weight_version(self) -> int:
    return self._weight_version

  @property
  def max_len(self) -> int | None:
    """Current cache length (None until the first request when not fixed)."""
    return self._cache.max_len if self._cache is not None else self._fixed_max_len

  async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
    """Generates for every request; results in request order."""
    self._bind_loop()
    loop = asyncio.get_running_loop()
    resolved = [self._resolve(r, i, loop) for i, r in enumerate(requests)]
    self._pending.extend(resolved)
    if self._task is None or self._task.done():
      self._task = loop.create_task(self._schedule())
    return list(await asyncio.gather(*(r.future for r in resolved)))

  async def update_weights(
    self, config: qwen3.Qwen3Config, params: Any, version: int | None = None
  ) -> None:
    """Swaps params between decode steps; rows in flight continue with the new weights
    (each token's version is recorded). ``version`` None = current + 1."""
    self._bind_loop()
    async with self._lock:
      if config != self.config and any(r is not None for r in self._rows):
        raise ValueError(
          "update_weights: config changed while requests are in flight; "
          f"had {self.config}, got {config}"
        )
      if config != self.config:
        self._cache = None
      self._set_model(config, params)
      self._weight_version = self._weight_version + 1 if version is None else int(version)

  async def abort(self, rid: str) -> bool:
    """Ends request ``rid`` with finish_reason "abort" (output so far kept); False when no
    such request is pending or in flight. A decoding row stops before the next chunk."""
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
    self._prefill_fn = jax.jit(
      functools.partial(_prefill, config=config, counter=self.compile_counts),
      donate_argnames=("cache",),
    )
    self._decode_fn = jax.jit(
      functools.partial(
        _decode, config=config, num_steps=self.decode_chunk, counter=self.compile_counts
      ),
      donate_argnames=("cache",),
    )

  def _reset_row_arrays(self):
    B = self.max_batch
    self._tok = np.zeros(B, np.int32)
    self._active = np.zeros(B, bool)
    self._count = np.zeros(B, np.int32)
    self._max_new = np.zeros(B, np.int32)
    self._seeds = np.zeros((B, 2), np.uint32)
    self._temp = np.ones(B, np.float32)
    self._top_k = np.zeros(B, np.int32)
    self._top_p = np.ones(B, np.float32)
    self._stop = np.full((B, _DEVICE_STOP_IDS), -1, np.int32)

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
    if self._fixed_max_len is not None and need > self._fixed_max_len:
      raise ValueError(
        f"{where}: len(input_ids) + max_new_tokens = {prompt.size} + "
        f"{sp.max_new_tokens} = {need} exceeds max_len={self._fixed_max_len}"
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
    )

  # ------------------------------------------------------------------ scheduler

  async def _schedule(self):
    while self._pending or any(r is not None for r in self._rows):
      async with self._lock:
        free = [b for b, r in enumerate(self._rows) if r is None]
        admit = [self._pending.popleft() for _ in range(min(len(free), len(self._pending)))]
        done = self._take_aborted()
        try:
          done += await asyncio.to_thread(self._step, admit)
        except BaseException as e:  # noqa: BLE001 - every waiter must hear about it
          with self._thread_guard:  # a cancelled to_thread may still be running
            failed = admit + [r.req for r in self._rows if r is not None]
            self._rows = [None] * self.max_batch
            self._reset_row_arrays()
            self._cache = None
          for r in failed:
            if not r.future.done():
              r.future.set_exception(e)
          _resolve(done)
          if isinstance(e, asyncio.CancelledError):
            raise
          continue
      _resolve(done)

  def _take_aborted(self) -> list[tuple[asyncio.Future, GenerateResult]]:
    out = []
    for slot, row in enumerate(self._rows):
      if row is not None and row.req.request.rid in self._abort_rids:
        row.finish_reason = "abort"
        self._finish(slot, out)
    self._abort_rids.clear()
    return out

  def _step(self, admit: list[_Request]) -> list[tuple[asyncio.Future, GenerateResult]]:
    """Blocking: prefill ``admit`` into free slots, decode one chunk, collect finished rows."""
    with self._thread_guard:
      finished: list[tuple[asyncio.Future, GenerateResult]] = []
      if admit:
        self._ensure_cache(max(r.prompt.size + r.max_new for r in admit))
        self._admit(admit)
      if self._active.any():
        self._decode_chunk(finished)
      stuck = [b for b, r in enumerate(self._rows) if r is not None and not self._active[b]]
      if stuck:  # host and device stop rules disagree: a bug, never loop forever on it
        raise RuntimeError(f"JaxSampler: rows {stuck} stopped on the device but not on the host")
      return finished

  def _ensure_cache(self, need: int):
    if self._fixed_max_len is not None:
      size = self._fixed_max_len
    else:
      size = max(64, _next_pow2(need))
    if self._cache is None:
      self._cache = qwen3.init_cache(self.config, self.max_batch, size, dtype=self._cache_dtype)
    elif self._cache.max_len < size:
      self._cache = jax.jit(_grow, static_argnums=1)(self._cache, size)

  def _bucket(self, n: int) -> int:
    buckets = self._prefill_buckets or _default_buckets(self._cache.max_len)
    for b in buckets:
      if n <= b:
        return b
    return -(-n // buckets[-1]) * buckets[-1]

  def _admit(self, admit: list[_Request]):
    free = [b for b, r in enumerate(self._rows) if r is None]
    groups: dict[int, list[tuple[int, _Request]]] = collections.defaultdict(list)
    for slot, req in zip(free, admit):
      groups[self._bucket(req.prompt.size - 1)].append((slot, req))
    for T, group in sorted(groups.items()):
      P = min(_next_pow2(len(group)), self.max_batch)
      ids = np.zeros((P, T), np.int32)
      mask = np.zeros((P, T), bool)
      slots = np.full(P, self.max_batch, np.int32)  # padding rows: dropped writes
      for i, (slot, req) in enumerate(group):
        n = req.prompt.size - 1
        ids[i, :n], mask[i, :n], slots[i] = req.prompt[:-1], True, slot
      self._cache = self._prefill_fn(self._params, self._cache, slots, ids, mask)
      for slot, req in group:
        sp = req.request.sampling
        self._rows[slot] = _Row(req)
        self._tok[slot], self._count[slot] = req.prompt[-1], 0
        self._max_new[slot], self._seeds[slot] = req.max_new, req.seed
        self._temp[slot], self._top_k[slot], self._top_p[slot] = (
          sp.temperature,
          sp.top_k,
          sp.top_p,
        )
        stop = sorted(req.stop_ids)[:_DEVICE_STOP_IDS]
        self._stop[slot] = -1
        self._stop[slot, : len(stop)] = stop
        self._active[slot] = True

  def _decode_chunk(self, finished):
    (self._cache, tok, active, count, out_t, out_l) = self._decode_fn(
      self._params,
      self._cache,
      self._tok,
      self._active,
      self._count,
      self._max_new,
      self._seeds,
      self._temp,
      self._top_k,
      self._top_p,
      self._stop,
    )
    self._tok, self._count = np.array(tok), np.array(count)
    self._active = np.array(active)
    out_t, out_l = np.asarray(out_t), np.asarray(out_l)
    for slot, row in enumerate(self._rows):
      if row is None:
        continue
      for t, lp in zip(out_t[slot], out_l[slot]):
        if t < 0:
          break
        if row.push(int(t), float(lp), self._weight_version):
          self._finish(slot, finished)
          break

  def _finish(self, slot: int, finished):
    row = self._rows[slot]
    self._rows[slot] = None
    self._active[slot] = False
    self._max_new[slot] = 0
    finished.append((row.req.future, _make_result(row, self._weight_version)))


def _resolve(done: list[tuple[asyncio.Future, GenerateResult]]) -> None:
  for fut, result in done:
    if not fut.done():
      fut.set_result(result)


def _make_result(row: _Row, current_version: int) -> GenerateResult:
  """``weight_version`` is the oldest version that produced a token (the staleness bound;
  ``current_version`` when there are none); ``weight_versions`` has each token's version
  (weights can change mid-request)."""
  return GenerateResult(
    output_ids=row.output_ids,
    logprobs=row.logprobs,
    finish_reason=row.finish_reason,
    weight_version=min(row.versions, default=current_version),
    weight_versions=row.versions,
  )

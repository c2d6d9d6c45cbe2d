"""SGLangEngine: the rollout Engine over one or more SGLang HTTP servers (endpoints as in SGLang's `srt/entrypoints/http_server.py`; see rollout/README.md).

Token-in/token-out: `POST /generate` with `input_ids`, `sampling_params`, `return_logprob` and a
`rid`; the result's `output_ids`, `meta_info.output_token_logprobs` ((logprob, id, text)
triples) and `meta_info.finish_reason.type`. Transient failures (connection errors, 5xx,
timeouts) are retried with exponential backoff; a timed-out request is aborted on the worker that
holds it (`POST /abort_request {rid}`, sent to the worker directly since sglang-router does not
forward aborts). Weight push: through one of the transports of
`rstar_jax.rollout.weight_transfer` (disk: staged safetensors + `/update_weights_from_disk`;
tensor: `/update_weights_from_tensor`; distributed: a broadcast group), then
`GET /get_weight_version` on every server to confirm. A LoRA policy pushed as adapters
(`lora.LoraParams`, ``rollout.lora_push=adapters``) sends its frozen base once through the
transport and then only PEFT adapters: `POST /load_lora_adapter {lora_name, lora_path, pinned}`
(then `/update_weight_version`), `/generate` selects the newest with `lora_path` = its name, and
`POST /unload_lora_adapter {lora_name}` drops adapters older than ``keep_versions`` (servers
started with `--enable-lora --max-lora-rank R --lora-target-modules ...`). Trajectories lease KV capacity through `KVCapacityScheduler` (`trajectory_lease`), which
also pins each trajectory to one server across turns for prefix-cache reuse.

Starting a real server (its own venv: sglang pins its own torch/transformers; GPU only)::

    # CUDA
    python -m sglang.launch_server --model-path /path/to/hf_dir --port 30000 \\
        --host 127.0.0.1 --skip-tokenizer-init --mem-fraction-static 0.8
    # ROCm (MI300X): the ROCm sglang image / wheel, same flags (plus --attention-backend triton
    # if aiter is unavailable)

    engine = SGLangEngine(urls=["http://127.0.0.1:30000"], staging_dir="/dev/shm/rstar_weights")

`staging_dir` must be readable by the server processes (tmpfs on one node, a shared filesystem
across nodes). `--skip-tokenizer-init` is safe: nothing here sends or reads text.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from rstar_jax.errors import UserError
from rstar_jax.models import lora, peft_export
from rstar_jax.models import qwen3_hf_layout as layout
from rstar_jax.rollout.scheduler import KVCapacityScheduler
from rstar_jax.rollout.types import GenerateRequest, GenerateResult
from rstar_jax.rollout.weight_transfer import base, make_transport, source
from rstar_jax.rollout.weight_transfer.base import PushError

log = logging.getLogger(__name__)


class SGLangError(RuntimeError):
  """A server answered with an error that retries did not fix (names url, path, status)."""


class ServersUnavailable(SGLangError, UserError):
  """The servers did not come up (unresolvable host, timeout, Ctrl-C while waiting): one line
  naming the URLs; a `UserError`, so launchers print it without a traceback."""


class _Retryable(Exception):
  pass


def _session_key(rid: str | None) -> str | None:
  """Agent-loop rids are "<trajectory id>:<turn>"; the trajectory id pins the server."""
  return rid.rsplit(":", 1)[0] if rid else None


def _parse_version(v: Any, default: int) -> int:
  try:
    return int(v)
  except (TypeError, ValueError):
    return default


def sampling_to_sglang(sp) -> dict:
  """SamplingParams -> SGLang `sampling_params` (only the fields SGLang knows)."""
  out = {
    "max_new_tokens": sp.max_new_tokens,
    "temperature": sp.temperature,
    "top_p": sp.top_p,
    "top_k": sp.top_k,
    "stop_token_ids": list(sp.stop_token_ids),
    # keep special tokens in text-free mode and never trim the matched stop
    "skip_special_tokens": False,
    "no_stop_trim": True,
  }
  text_stops = [s for s in sp.stop if isinstance(s, str)]
  if len(text_stops) != len(sp.stop):
    raise ValueError(
      "SGLangEngine: stop sequences given as token ids are not supported by "
      "SGLang's /generate; pass strings (the server tokenizer matches them)"
    )
  if text_stops:
    out["stop"] = text_stops
  if sp.seed is not None:
    out["sampling_seed"] = int(sp.seed)
  return out


def check_resolvable(urls: Sequence[str]) -> None:
  """Raises `ServersUnavailable` for the first URL whose host name does not resolve (a typo in
  ``rollout.sglang_urls`` fails at once instead of after the health timeout)."""
  for u in urls:
    parsed = urllib.parse.urlsplit(u)
    host = parsed.hostname
    if not host:
      raise ServersUnavailable(f"SGLang URL {u!r}: expected http://host:port")
    try:
      socket.getaddrinfo(host, parsed.port or 80, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
      raise ServersUnavailable(
        f"SGLang URL {u}: cannot resolve host {host!r} ({e.strerror or e}); "
        "check rollout.sglang_urls"
      ) from None


def parse_generate_response(body: dict, default_version: int) -> GenerateResult:
  """SGLang /generate JSON (one request) -> GenerateResult."""
  if not isinstance(body, dict) or "output_ids" not in body:
    raise SGLangError(f"/generate: response lacks output_ids: {str(body)[:300]}")
  meta = body.get("meta_info") or {}
  ids = [int(t) for t in body["output_ids"]]
  lp_items = meta.get("output_token_logprobs")
  if lp_items is None:
    logprobs = [0.0] * len(ids)
  else:
    if len(lp_items) != len(ids) or any(int(it[1]) != t for it, t in zip(lp_items, ids)):
      raise SGLangError(
        "/generate: output_token_logprobs do not match output_ids "
        f"({len(lp_items)} vs {len(ids)} items)"
      )
    logprobs = [float(it[0]) for it in lp_items]
  fr = meta.get("finish_reason")
  kind = fr.get("type") if isinstance(fr, dict) else fr
  if kind not in ("stop", "length", "abort"):
    raise SGLangError(f"/generate: unknown finish_reason {fr!r}")
  # SGLang reports the prompt length and how much of it its radix cache served.
  prompt_n, cached_n = meta.get("prompt_tokens"), meta.get("cached_tokens")
  prefill = (
    int(prompt_n) - int(cached_n)
    if isinstance(prompt_n, int) and isinstance(cached_n, int)
    else None
  )
  return GenerateResult(
    ids,
    logprobs,
    kind,
    _parse_version(meta.get("weight_version"), default_version),
    prefill_tokens=prefill,
  )


class SGLangEngine:
  """Engine over SGLang servers. Every argument but `urls` has a default.

  urls: server base urls. staging_dir: where `update_weights` writes HF dirs (must be
  visible to the servers). request_timeout_s: per /generate attempt. max_retries: extra
  attempts on transient errors, sleeping backoff_s * 2**k. keep_versions: staged dirs kept.
  capacities: {url: KV tokens} to skip /get_server_info; utilization: share of it to use.
  load_refresh_s: /get_load is re-read at most this often, when a trajectory asks for a lease.
  weight_transport: "disk" | "tensor" | "distributed" (rollout/weight_transfer);
  transport_options: its keyword arguments (bucket_bytes, timeout_s, backend, ...).
  weight_delta: push only the HF tensors whose bytes changed since the last push.
  colocated: servers share the learner's accelerators (release/resume KV memory per push).
  server_timeout_s: how long `wait_healthy` waits for every server (``rollout.server_timeout_s``).
  """

  def __init__(
    self,
    urls: Sequence[str],
    staging_dir: str | None = None,
    *,
    request_timeout_s: float = 3600.0,
    admin_timeout_s: float = 600.0,
    max_retries: int = 3,
    backoff_s: float = 0.5,
    keep_versions: int = 2,
    capacities: dict | None = None,
    utilization: float = 0.9,
    weight_version: int = 0,
    max_connections: int = 1024,
    load_refresh_s: float = 5.0,
    weight_transport: str = "disk",
    weight_delta: bool = False,
    colocated: bool = False,
    transport_options: dict | None = None,
    server_timeout_s: float = 600.0,
  ):
    if isinstance(urls, str):
      urls = [urls]
    self.urls = [u.rstrip("/") for u in urls]
    if not self.urls:
      raise ValueError("SGLangEngine: urls is empty")
    if max_retries < 0 or backoff_s < 0 or keep_versions < 1:
      raise ValueError("SGLangEngine: max_retries, backoff_s >= 0 and keep_versions >= 1")
    self.staging_dir = staging_dir or os.path.join(
      "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp", "rstar_jax_weights"
    )
    self.request_timeout_s = request_timeout_s
    self.server_timeout_s = float(server_timeout_s)
    self.admin_timeout_s = admin_timeout_s
    self.max_retries = max_retries
    self.backoff_s = backoff_s
    self.keep_versions = keep_versions
    self.max_connections = max_connections
    self._version = int(weight_version)
    self._session = None
    self._inflight: dict[str, str] = {}  # rid -> url
    self._active = collections.Counter()  # url -> requests in flight
    self._sticky: collections.OrderedDict = collections.OrderedDict()  # key -> url (LRU)
    self.scheduler = KVCapacityScheduler(self.urls, capacities, utilization)
    self._capacities_known = capacities is not None

    self.transport = make_transport(
      weight_transport,
      staging_dir=self.staging_dir,
      keep_versions=keep_versions,
      **(transport_options or {}),
    )
    self._transport_opened = True
    self.weight_delta = bool(weight_delta)
    self.colocated = bool(colocated)
    self._last_pushed = None
    self._lora_names: list[str] = []  # adapters loaded on the servers, oldest first
    self.last_push = None
    self.push_history: list = []
    self.retries = 0
    self.load_refresh_s = load_refresh_s
    self._last_load = float("-inf")

  # ------------------------------------------------------------------ plumbing
  @property
  def weight_version(self) -> int:
    return self._version

  async def _client(self):
    import aiohttp

    if self._session is None or self._session.closed:
      self._session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=self.max_connections)
      )
    return self._session

  async def close(self) -> None:
    if self._transport_opened:
      try:
        await self.transport.close(self)
      except Exception as e:  # noqa: BLE001 - closing anyway
        log.warning("closing the weight transport failed: %s", e)
    if self._session is not None:
      await self._session.close()
      self._session = None

  async def __aenter__(self):
    return self

  async def __aexit__(self, *exc):
    await self.close()

  async def _request(
    self,
    method: str,
    url: str,
    path: str,
    body: dict | None = None,
    timeout_s: float | None = None,
    on_timeout=None,
  ) -> Any:
    """One HTTP call with retries; returns parsed JSON (or text). Raises SGLangError."""
    import aiohttp

    session = await self._client()
    timeout = aiohttp.ClientTimeout(total=timeout_s or self.admin_timeout_s)
    last = ""
    for attempt in range(self.max_retries + 1):
      if attempt:
        self.retries += 1
        await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
      try:
        async with session.request(method, url + path, json=body, timeout=timeout) as r:
          text = await r.text()
          if r.status >= 500 or r.status == 429:
            last = f"HTTP {r.status}: {text[:200]}"
            continue
          if r.status >= 400:
            raise SGLangError(f"{method} {url}{path}: HTTP {r.status}: {text[:500]}")
          if not text:
            return None
          try:
            return await r.json(content_type=None)
          except ValueError:
            return text
      except TimeoutError:
        last = f"timeout after {timeout.total}s"
        if on_timeout is not None:
          await on_timeout()
      except aiohttp.ClientError as e:
        last = f"{type(e).__name__}: {e}"
    raise SGLangError(
      f"{method} {url}{path}: failed after {self.max_retries + 1} attempts; last error: {last}"
    )

  # ------------------------------------------------------------------ routing
  def _route(self, rid: str | None) -> str:
    key = _session_key(rid)
    if key is not None:
      url = self.scheduler.server_for(key) or self._sticky.get(key)
      if url is not None:
        self._sticky[key] = url
        self._sticky.move_to_end(key)
        return url
    url = min(self.urls, key=lambda u: (self._active[u], self.urls.index(u)))
    if key is not None:
      self._sticky[key] = url
      while len(self._sticky) > 100_000:
        self._sticky.popitem(last=False)
    return url

  @contextlib.asynccontextmanager
  async def trajectory_lease(self, tid: str, budget_tokens: int):
    """Holds `budget_tokens` of one server's KV capacity for a trajectory (agent loop hook)."""
    if not self._capacities_known:
      await self.refresh_capacity()
    elif asyncio.get_running_loop().time() - self._last_load > self.load_refresh_s:
      await self.refresh_load()
    async with self.scheduler.lease(tid, budget_tokens) as url:
      self._sticky[tid] = url
      try:
        yield url
      finally:
        self._sticky.pop(tid, None)

  async def refresh_capacity(self) -> dict:
    """Reads max_total_num_tokens (/get_server_info) and usage (/get_load) of each server."""
    infos = await asyncio.gather(*[self._request("GET", u, "/get_server_info") for u in self.urls])
    caps = {}
    for u, info in zip(self.urls, infos):
      cap = (info or {}).get("max_total_num_tokens")
      if cap is None:
        states = (info or {}).get("internal_states") or [{}]
        cap = states[0].get("max_total_num_tokens")
      if cap is None:
        raise SGLangError(f"{u}/get_server_info: no max_total_num_tokens in the reply")
      caps[u] = int(cap)
    self.scheduler.set_capacities(caps)
    self._capacities_known = True
    await self.refresh_load()
    return caps

  async def refresh_load(self) -> None:
    """Tokens each server reports in use (/get_load); usage beyond our leases is subtracted
    from its free capacity (another client, or requests not under a lease)."""
    self._last_load = asyncio.get_running_loop().time()
    loads = await asyncio.gather(*[self._request("GET", u, "/get_load") for u in self.urls])
    for u, load in zip(self.urls, loads):
      rows = load if isinstance(load, list) else [load or {}]
      used = sum(int(r.get("num_tokens", 0) or 0) for r in rows if isinstance(r, dict))
      self.scheduler.set_external_usage(u, used)

  # ------------------------------------------------------------------ engine API
  async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
    return list(await asyncio.gather(*[self._generate_one(r) for r in requests]))

  async def _generate_one(self, req: GenerateRequest) -> GenerateResult:
    url = self._route(req.rid)
    body = {
      "input_ids": [int(t) for t in req.input_ids],
      "sampling_params": sampling_to_sglang(req.sampling),
      "return_logprob": True,
    }
    if self._lora_names:  # SGLang resolves lora_path against the names of loaded adapters
      body["lora_path"] = self._lora_names[-1]
    if req.rid is not None:
      body["rid"] = req.rid
      self._inflight[req.rid] = url

    async def abort_on_timeout():
      if req.rid is not None:
        await self.abort(req.rid)

    self._active[url] += 1
    try:
      reply = await self._request(
        "POST", url, "/generate", body, self.request_timeout_s, on_timeout=abort_on_timeout
      )
    finally:
      self._active[url] -= 1
      if req.rid is not None:
        self._inflight.pop(req.rid, None)
    return parse_generate_response(reply, self._version)

  async def abort(self, rid: str) -> bool:
    """Aborts `rid` on the worker holding it; False when no such request is in flight."""
    url = self._inflight.get(rid)
    if url is None:
      return False
    import aiohttp

    session = await self._client()
    try:
      async with session.post(
        url + "/abort_request", json={"rid": rid}, timeout=aiohttp.ClientTimeout(total=30)
      ) as r:
        return r.status < 400
    except (TimeoutError, aiohttp.ClientError) as e:
      log.warning("abort %s on %s failed: %s", rid, url, e)
      return False

  async def health(self) -> dict[str, bool]:
    import aiohttp

    session = await self._client()

    async def one(u):
      try:
        async with session.get(u + "/health", timeout=aiohttp.ClientTimeout(total=10)) as r:
          return r.status == 200
      except (TimeoutError, aiohttp.ClientError):
        return False

    return dict(zip(self.urls, await asyncio.gather(*[one(u) for u in self.urls])))

  async def wait_healthy(
    self, timeout_s: float | None = None, poll_s: float = 2.0, log_every_s: float = 5.0
  ) -> None:
    """Returns when every server answers ``/health``; else `ServersUnavailable` naming the
    URLs: at once for a host name that does not resolve, after ``timeout_s`` (default
    ``server_timeout_s``) for servers that do not answer, and on Ctrl-C. Logs which servers
    it still waits for every ``log_every_s`` seconds."""
    timeout_s = self.server_timeout_s if timeout_s is None else float(timeout_s)
    await asyncio.to_thread(check_resolvable, self.urls)
    t0 = time.monotonic()
    next_log = t0 + log_every_s
    down: list[str] = list(self.urls)
    try:
      while True:
        h = await self.health()
        down = [u for u, ok in h.items() if not ok]
        if not down:
          if time.monotonic() - t0 >= log_every_s:
            log.info("all %d SGLang servers healthy", len(self.urls))
          return
        now = time.monotonic()
        if now - t0 >= timeout_s:
          raise ServersUnavailable(
            f"SGLang server(s) not healthy after {timeout_s:g}s (rollout.server_timeout_s): "
            f"{', '.join(down)}"
          )
        if now >= next_log:
          log.info(
            "waiting for %d of %d SGLang servers (%.0fs of %gs): %s",
            len(down),
            len(self.urls),
            now - t0,
            timeout_s,
            ", ".join(down),
          )
          next_log = now + log_every_s
        await asyncio.sleep(max(0.0, min(poll_s, t0 + timeout_s - now)))
    except (KeyboardInterrupt, asyncio.CancelledError):
      raise ServersUnavailable(
        f"interrupted after {time.monotonic() - t0:.0f}s while waiting for SGLang server(s): "
        f"{', '.join(down)}"
      ) from None

  async def update_weights(self, config, params, version: int | None = None) -> dict:
    """Pushes ``params`` through the configured transport; returns the push metrics.

    Delta (``weight_delta``): only the HF tensors whose bytes changed since the last
    successful push are sent (none changed: ``/update_weight_version`` alone). Colocated:
    ``/release_memory_occupation`` {tags: [kv_cache]} before, ``/resume_memory_occupation``
    after (also after a failure), so the KV cache's memory is free while weights move.
    Ends with ``/get_weight_version`` == version on every server. On any failure the engine
    stays on its previous version, the next delta push resends everything, and the error
    names the transport and the failing call.

    A `lora.LoraParams` is pushed as adapters: its base like plain params (always as a delta:
    the base is frozen, so after the first push nothing of it is sent), then the adapters in
    PEFT format through ``/load_lora_adapter`` under the name ``rstar_jax_v<version>``, which
    the following ``/generate`` requests name in ``lora_path``.
    """
    import time

    version = self._version + 1 if version is None else int(version)
    adapters = params if lora.is_lora(params) else None
    if adapters is not None:
      params = adapters.base
    base.check_params(config, params)
    t0 = time.perf_counter()
    table = layout.hf_table(config)
    delta = self.weight_delta or adapters is not None
    prev = self._last_pushed if delta else None
    tensors = await asyncio.to_thread(source.changed_tensors, params, prev, table)
    n_adapter = 2 * config.num_hidden_layers * len(adapters.config.targets) if adapters else 0
    stats = base.PushStats(
      self.transport.name,
      version,
      tensors_sent=len(tensors) + n_adapter,
      tensors_total=len(table) + n_adapter,
    )
    released = False
    lora_name = None
    try:
      if self.colocated:
        await self._all("/release_memory_occupation", {"tags": ["kv_cache"]})
        released = True
      if tensors:
        stats.bytes = await self.transport.push(self, config, params, tensors, version)
      if adapters is not None:
        lora_name = f"rstar_jax_v{version}"
        stats.bytes += await self._load_adapter(adapters, lora_name)
      if adapters is not None or not tensors:
        await self._all(
          "/update_weight_version", {"new_version": str(version), "abort_all_requests": False}
        )
      got = await asyncio.gather(
        *[self._request("GET", u, "/get_weight_version") for u in self.urls]
      )
      for u, g in zip(self.urls, got):
        v = g.get("weight_version") if isinstance(g, dict) else g
        if str(v) != str(version):
          raise SGLangError(f"{u}: weight version after update is {v!r}, expected {version}")
    except Exception as e:
      self._last_pushed = None
      if lora_name is not None:
        await self._unload_adapters([lora_name], quiet=True)
      raise SGLangError(
        f"weight push to version {version} via {self.transport.name!r} "
        f"failed; engine stays on version {self._version}: "
        f"{type(e).__name__}: {e}"
      ) from e
    finally:
      if released:
        try:
          await self._all("/resume_memory_occupation", {"tags": ["kv_cache"]})
        except SGLangError as e:
          log.error("resume_memory_occupation after a push failed: %s", e)
    stats.seconds = time.perf_counter() - t0
    self._version = version
    self._last_pushed = params if delta else None
    if lora_name is not None:
      self._lora_names.append(lora_name)
      # Requests in flight keep the adapter they started with (SGLang's unload waits for
      # them), so the previous ones stay loaded for a while.
      old, self._lora_names = (
        self._lora_names[: -self.keep_versions],
        self._lora_names[-self.keep_versions :],
      )
      await self._unload_adapters(old, quiet=True)
    self.last_push = stats
    self.push_history.append(stats)
    return stats.metrics()

  async def _load_adapter(self, params, name: str) -> int:
    """Writes the adapters as a PEFT directory under ``staging_dir`` and loads it on every
    server as ``name``; returns the bytes written."""
    import shutil

    path = os.path.abspath(os.path.join(self.staging_dir, name))
    if os.path.exists(path):
      shutil.rmtree(path)
    await asyncio.to_thread(peft_export.save_peft, path, params)
    nbytes = sum(e.stat().st_size for e in os.scandir(path))
    body = {"lora_name": name, "lora_path": path, "pinned": False}
    replies = await asyncio.gather(
      *[self._request("POST", u, "/load_lora_adapter", body) for u in self.urls],
      return_exceptions=True,
    )
    for u, rep in zip(self.urls, replies):
      if isinstance(rep, BaseException) or not (isinstance(rep, dict) and rep.get("success")):
        raise PushError(f"{u}/load_lora_adapter({name}, {path}): {rep}")
    return nbytes

  async def _unload_adapters(self, names: Sequence[str], quiet: bool = False) -> None:
    import shutil

    for name in names:
      for u in self.urls:
        try:
          await self._request("POST", u, "/unload_lora_adapter", {"lora_name": name})
        except SGLangError as e:
          if not quiet:
            raise
          log.warning("unloading LoRA adapter %s on %s failed: %s", name, u, e)
      shutil.rmtree(os.path.join(self.staging_dir, name), ignore_errors=True)

  async def _all(self, path: str, body: dict) -> list:
    """POST to every server; raises SGLangError unless each reply is a success."""
    replies = await asyncio.gather(*[self._request("POST", u, path, body) for u in self.urls])
    for u, rep in zip(self.urls, replies):
      if isinstance(rep, dict) and rep.get("success") is False:
        raise SGLangError(f"{u}{path}: {rep}")
    return replies

  @property
  def push_metrics(self) -> dict:
    """Metrics of the last successful push (``push/bytes``, ``push/seconds``, ...)."""
    return self.last_push.metrics() if self.last_push is not None else {}

  # ------------------------------------------------------------------ pause / continue
  # (asynchronous RL, partial rollouts: see rollout/interruptible.py)
  async def pause_generation(self, mode: str = "abort") -> None:
    """`POST /pause_generation {"mode": mode}` on every server.

    "abort": every running request returns now with finish_reason abort and its partial
    output; "retract" / "in_place": running requests are parked (KV recomputed / kept).
    The servers stay paused until `continue_generation`.
    """
    if mode not in ("abort", "retract", "in_place"):
      raise ValueError(
        f"pause_generation: mode must be 'abort', 'retract' or 'in_place', got {mode!r}"
      )
    await asyncio.gather(
      *[self._request("POST", u, "/pause_generation", {"mode": mode}) for u in self.urls]
    )

  async def continue_generation(self) -> None:
    """`POST /continue_generation {}` on every server (ends a `pause_generation`)."""
    await asyncio.gather(*[self._request("POST", u, "/continue_generation", {}) for u in self.urls])

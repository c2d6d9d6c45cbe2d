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

Fleet failures (rollout/README.md, "Server failures"): a background task probes every server's
``/health`` every ``health_interval_s`` (``health_timeout_s`` each); a request that fails makes
its server a suspect, probed at once. After ``max_server_failures`` failed probes in a row the
server is taken out of rotation: the scheduler forgets its leases, and the turns in flight on it
are sent again to another server from the trajectory's token prefix (the request's own input
ids: earlier turns and tool results kept, the lost turn's partial tokens never returned, so its
log-probs all come from one server). A server that answers again is brought to the engine's
weight version (a push to that server alone, then ``/get_weight_version``) before it takes
traffic. With no server in rotation for longer than ``server_timeout_s`` every request raises
`FleetUnavailable` (a `rstar_jax.errors.CheckpointedStop`: the RL loop checkpoints and the
launcher prints one line). ``fleet_metrics()``: servers healthy, failovers, re-generated turns.

``router_url`` (SGLang's own router, ``sglang-router``): generation goes through the router;
the weight push, version checks, pause/continue and capacity reads go to every healthy worker
the router lists (``GET /workers`` -> ``{"workers": [{"url", "is_healthy", ...}]}``,
sglang-router 0.3.2).

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
import dataclasses
import logging
import os
import socket
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from rstar_jax.errors import CheckpointedStop, UserError
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


class FleetUnavailable(SGLangError, CheckpointedStop):
  """No rollout server was in rotation for longer than ``rollout.server_timeout_s``: the RL
  loop writes a checkpoint and the launcher prints this one line and exits with
  `CheckpointedStop.exit_code`."""


class _AttemptFailed(Exception):
  """One /generate attempt failed transiently (connection, 5xx, timeout) or its server was
  taken out of rotation while it ran (``lost``)."""

  def __init__(self, reason: str, lost: bool = False):
    super().__init__(reason)
    self.lost = lost


@dataclasses.dataclass
class _Health:
  """One server's place in the rotation."""

  up: bool = True
  failures: int = 0  # failed probes in a row
  lost: asyncio.Event | None = None  # set when taken out of rotation (cancels its attempts)
  rejoining: bool = False

  def lost_event(self) -> asyncio.Event:
    if self.lost is None:
      self.lost = asyncio.Event()
    return self.lost


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
  server_timeout_s: how long `wait_healthy` waits for every server at start, and how long the
      fleet may have no server in rotation before requests raise `FleetUnavailable`
      (``rollout.server_timeout_s``).
  health_interval_s / health_timeout_s / max_server_failures: the health probe's period, its
      timeout, and the failed probes in a row that take a server out of rotation
      (``rollout.health_*``, ``rollout.max_server_failures``).
  router_url: SGLang's router in front of ``urls`` (``rollout.router_url``; ``urls`` may then
      be empty: the workers are read from the router's ``/workers``).
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
    health_interval_s: float = 5.0,
    health_timeout_s: float = 20.0,
    max_server_failures: int = 3,
    router_url: str | None = None,
  ):
    if isinstance(urls, str):
      urls = [urls]
    self.router_url = router_url.rstrip("/") if router_url else None
    self._workers = [u.rstrip("/") for u in urls]  # admin targets (router: refreshed)
    # Where /generate goes: the servers themselves, or the router alone.
    self.fleet = [self.router_url] if self.router_url else list(self._workers)
    if not self.fleet:
      raise ValueError("SGLangEngine: urls is empty")
    if health_interval_s <= 0 or health_timeout_s <= 0 or max_server_failures < 1:
      raise ValueError(
        "SGLangEngine: health_interval_s, health_timeout_s > 0 and max_server_failures >= 1"
      )
    self.health_interval_s = float(health_interval_s)
    self.health_timeout_s = float(health_timeout_s)
    self.max_server_failures = int(max_server_failures)
    self._health = {u: _Health() for u in self.fleet}
    self._worker_health: dict[str, bool] = {u: True for u in self._workers}
    self._removed: set[str] = set()  # router workers taken off the router until refreshed
    self._targets: list[str] | None = None  # a push to some servers only (a rejoin)
    self._monitor_task: asyncio.Task | None = None
    self._loop: asyncio.AbstractEventLoop | None = None
    self._suspects: dict[str, asyncio.Task] = {}
    self._fleet_changed: asyncio.Event | None = None
    self._all_down_since: float | None = None
    self._fleet_error: FleetUnavailable | None = None
    self._orphans: dict[str, int] = {}  # tid -> budget of a lease lost with its server
    self._current = None  # (config, params) of the last successful push (rejoin refresh)
    self._push_lock: asyncio.Lock | None = None
    self.fleet_stats = collections.Counter()  # failovers, regenerated_turns, rejoins (totals)
    self._stats_at_last_read = collections.Counter()
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
    self.scheduler = KVCapacityScheduler(self.fleet, capacities, utilization)
    self._capacities_known = capacities is not None
    self._last_capacity_read: float | None = None
    self._capacity_task: asyncio.Future | None = None

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

  @property
  def urls(self) -> list[str]:
    """The servers admin calls and weight pushes go to: those in rotation (a rejoining
    server alone while it is refreshed). With a router: its healthy workers."""
    if self._targets is not None:
      return list(self._targets)
    if self.router_url:
      return [u for u in self._workers if self._worker_health.get(u, False)]
    return [u for u in self.fleet if self._health[u].up]

  async def _client(self):
    import aiohttp

    if self._session is None or self._session.closed:
      self._session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=self.max_connections)
      )
    return self._session

  async def close(self) -> None:
    tasks = [t for t in [self._monitor_task, *self._suspects.values()] if t is not None]
    for t in tasks:
      t.cancel()
    for t in tasks:
      with contextlib.suppress(BaseException):
        await t
    self._monitor_task, self._suspects = None, {}
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
  def _route(self, rid: str | None) -> str | None:
    """The server for ``rid``: its trajectory's (leased or sticky) server when in rotation,
    else the least busy one in rotation; None when none is."""
    key = _session_key(rid)
    live = [u for u in self.fleet if self._health[u].up]
    if key is not None:
      url = self.scheduler.server_for(key) or self._sticky.get(key)
      if url is not None and self._health[url].up:
        self._sticky[key] = url
        self._sticky.move_to_end(key)
        return url
    if not live:
      return None
    url = min(live, key=lambda u: (self._active[u], self.fleet.index(u)))
    if key is not None:
      self._sticky[key] = url
      while len(self._sticky) > 100_000:
        self._sticky.popitem(last=False)
    return url

  async def _pick(self, rid: str | None) -> str:
    """`_route`, waiting while no server is in rotation; a trajectory whose lease was lost
    with its server leases the same budget on another. Raises `FleetUnavailable`."""
    key = _session_key(rid)
    while True:
      if self._fleet_error is not None:
        raise self._fleet_error
      if key is not None and key in self._orphans:
        budget = self._orphans.pop(key)
        try:
          url = await self.scheduler.acquire(key, budget)
        except BaseException:
          self._orphans[key] = budget
          raise
        self._sticky[key] = url
        return url
      url = self._route(rid)
      if url is not None:
        return url
      ev = self._changed_event()
      ev.clear()
      self._ensure_monitor()
      with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ev.wait(), self.health_interval_s)

  def _changed_event(self) -> asyncio.Event:
    if self._fleet_changed is None:
      self._fleet_changed = asyncio.Event()
    return self._fleet_changed

  @contextlib.asynccontextmanager
  async def trajectory_lease(self, tid: str, budget_tokens: int):
    """Holds `budget_tokens` of one server's KV capacity for a trajectory (agent loop hook)."""
    self._ensure_monitor()
    if self._fleet_error is not None:
      raise self._fleet_error
    now = asyncio.get_running_loop().time()
    task = self._capacity_task
    if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
      await asyncio.shield(task)  # a read already under way: every lease waits for it
    elif not self._capacities_known and (
      self._last_capacity_read is None or now - self._last_capacity_read > self.load_refresh_s
    ):
      self._capacity_task = asyncio.ensure_future(self.refresh_capacity())
      await asyncio.shield(self._capacity_task)
    elif now - self._last_load > self.load_refresh_s:
      await self.refresh_load()
    async with self.scheduler.lease(tid, budget_tokens) as url:
      self._sticky[tid] = url
      try:
        yield url
      finally:
        self._sticky.pop(tid, None)
        self._orphans.pop(tid, None)

  async def refresh_capacity(self) -> dict:
    """Reads max_total_num_tokens (/get_server_info) and usage (/get_load) of each server in
    rotation. A server that does not answer is skipped (no capacity: nothing is admitted to it;
    the health checks decide its fate) and read again later; it raises only when none answers."""
    self._last_capacity_read = asyncio.get_running_loop().time()
    if self.router_url:
      await self.refresh_workers()
    urls = self.urls
    infos = await asyncio.gather(
      *[self._request("GET", u, "/get_server_info") for u in urls], return_exceptions=True
    )
    caps, failed = {}, []
    for u, info in zip(urls, infos):
      if isinstance(info, BaseException):
        failed.append(info)
        continue
      cap = (info or {}).get("max_total_num_tokens")
      if cap is None:
        states = (info or {}).get("internal_states") or [{}]
        cap = states[0].get("max_total_num_tokens")
      if cap is None:
        raise SGLangError(f"{u}/get_server_info: no max_total_num_tokens in the reply")
      caps[u] = int(cap)
    if not caps:
      raise failed[0] if failed else SGLangError("no SGLang server in rotation")
    if self.router_url:  # one pool behind the router: the workers' capacities summed
      caps = {self.router_url: sum(caps.values())}
    self.scheduler.set_capacities(caps)
    self._capacities_known = not failed
    await self.refresh_load()
    return caps

  async def refresh_load(self) -> None:
    """Tokens each server reports in use (/get_load); usage beyond our leases is subtracted
    from its free capacity (another client, or requests not under a lease)."""
    self._last_load = asyncio.get_running_loop().time()
    urls = self.urls
    loads = await asyncio.gather(
      *[self._request("GET", u, "/get_load") for u in urls], return_exceptions=True
    )
    used_by = {}
    for u, load in zip(urls, loads):
      if isinstance(load, BaseException):  # a failing server: the health checks decide
        continue
      rows = load if isinstance(load, list) else [load or {}]
      used_by[u] = sum(int(r.get("num_tokens", 0) or 0) for r in rows if isinstance(r, dict))
    if self.router_url:
      used_by = {self.router_url: sum(used_by.values())}
    for u, used in used_by.items():
      self.scheduler.set_external_usage(u, used)

  # ------------------------------------------------------------------ engine API
  async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
    return list(await asyncio.gather(*[self._generate_one(r) for r in requests]))

  async def _generate_one(self, req: GenerateRequest) -> GenerateResult:
    """One request with the retry and failover rules (module docstring): a transient failure
    on a server that still answers its probe is retried (``max_retries``, back-off); on a
    server taken out of rotation the turn is generated again elsewhere from the same input
    ids, without spending a retry."""
    self._ensure_monitor()
    body = {
      "input_ids": [int(t) for t in req.input_ids],
      "sampling_params": sampling_to_sglang(req.sampling),
      "return_logprob": True,
    }
    if self._lora_names:  # SGLang resolves lora_path against the names of loaded adapters
      body["lora_path"] = self._lora_names[-1]
    if req.rid is not None:
      body["rid"] = req.rid
    failures, last, moved = 0, "", False
    while True:
      url = await self._pick(req.rid)
      health = self._health[url]
      if req.rid is not None:
        self._inflight[req.rid] = url
      self._active[url] += 1
      try:
        reply = await self._attempt(url, health.lost_event(), body, req.rid)
      except _AttemptFailed as e:
        last = str(e)
        if not e.lost and await self._still_up(url):
          failures += 1  # the server answers its probe: this request's own failure
          if failures > self.max_retries:
            raise SGLangError(
              f"POST {url}/generate: failed after {failures} attempts; last error: {last}"
            ) from None
          self.retries += 1
          await asyncio.sleep(self.backoff_s * 2 ** (failures - 1))
          continue
        # Taken out of rotation: this turn starts again on another server (the request
        # carries the trajectory's prefix; nothing of the lost attempt is kept).
        if not moved:
          self.fleet_stats["regenerated_turns"] += 1
          moved = True
        log.warning("turn %s lost with %s (%s); generating it again elsewhere", req.rid, url, last)
        continue
      finally:
        self._active[url] -= 1
        if req.rid is not None:
          self._inflight.pop(req.rid, None)
      health.failures = 0
      return parse_generate_response(reply, self._version)

  async def _attempt(self, url: str, lost: asyncio.Event, body: dict, rid: str | None):
    """One POST /generate raced against ``url`` leaving the rotation; raises _AttemptFailed."""
    import aiohttp

    session = await self._client()
    timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)

    async def post():
      try:
        async with session.post(url + "/generate", json=body, timeout=timeout) as r:
          text = await r.text()
          if r.status >= 500 or r.status == 429:
            raise _AttemptFailed(f"HTTP {r.status}: {text[:200]}")
          if r.status >= 400:
            raise SGLangError(f"POST {url}/generate: HTTP {r.status}: {text[:500]}")
          try:
            return await r.json(content_type=None)
          except ValueError:
            raise _AttemptFailed(f"reply is not JSON: {text[:200]}") from None
      except TimeoutError:
        if rid is not None:
          await self.abort(rid)
        raise _AttemptFailed(f"timeout after {timeout.total}s") from None
      except aiohttp.ClientError as e:
        raise _AttemptFailed(f"{type(e).__name__}: {e}") from None

    if lost.is_set():
      raise _AttemptFailed("server out of rotation", lost=True)
    call = asyncio.ensure_future(post())
    gone = asyncio.ensure_future(lost.wait())
    try:
      await asyncio.wait({call, gone}, return_when=asyncio.FIRST_COMPLETED)
      if call.done():
        return call.result()
      raise _AttemptFailed("server taken out of rotation while the turn ran", lost=True)
    finally:
      for t in (call, gone):
        if not t.done():
          t.cancel()
      with contextlib.suppress(BaseException):
        await asyncio.gather(call, gone, return_exceptions=True)

  # ------------------------------------------------------------------ fleet health
  def _ensure_monitor(self) -> None:
    """Starts the health-probe task on the running loop (again after an `asyncio.run`)."""
    loop = asyncio.get_running_loop()
    t = self._monitor_task
    if t is not None and not t.done() and t.get_loop() is loop:
      return
    if self._loop is not loop:  # events, locks and tasks belong to one event loop
      self._loop = loop
      self._fleet_changed = None
      self._suspects = {}
      self._push_lock = None
      for h in self._health.values():
        h.lost, h.rejoining = None, False
    self._monitor_task = loop.create_task(self._monitor())

  async def _probe(self, url: str) -> bool:
    import aiohttp

    session = await self._client()
    try:
      async with session.get(
        url + "/health", timeout=aiohttp.ClientTimeout(total=self.health_timeout_s)
      ) as r:
        await r.read()
        return r.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
      return False

  async def _monitor(self) -> None:
    """Probes every server each ``health_interval_s``: failures take one out of rotation,
    an answer brings a server that was out back (after its weights are refreshed); with no
    server in rotation for longer than ``server_timeout_s`` the fleet is declared lost."""
    while True:
      if self.router_url:
        with contextlib.suppress(SGLangError):
          await self.refresh_workers()
      oks = await asyncio.gather(*[self._probe(u) for u in self.fleet])
      for u, ok in zip(self.fleet, oks):
        h = self._health[u]
        if h.up:
          await self._count_probe(u, ok)
        elif ok and not h.rejoining:
          h.rejoining = True
          asyncio.get_running_loop().create_task(self._rejoin(u))
      await self._check_fleet()
      await asyncio.sleep(self.health_interval_s)

  async def _count_probe(self, url: str, ok: bool) -> None:
    h = self._health[url]
    if ok:
      h.failures = 0
      return
    h.failures += 1
    if h.failures >= self.max_server_failures and h.up:
      await self._take_out(url, f"{h.failures} failed health probes in a row")

  async def _still_up(self, url: str) -> bool:
    """After a failed request: probes ``url`` now, and again every ``health_interval_s`` while
    it fails, until it answers (True) or is taken out of rotation (False). One probe series
    per server, shared by every request that failed on it."""
    task = self._suspects.get(url)
    if task is None or task.done():

      async def verdict() -> bool:
        while self._health[url].up:
          ok = await self._probe(url)
          await self._count_probe(url, ok)
          if ok:
            return True
          if self._health[url].up:
            await asyncio.sleep(self.health_interval_s)
        return False

      task = self._suspects[url] = asyncio.ensure_future(verdict())
    return await asyncio.shield(task)

  async def _take_out(self, url: str, why: str) -> None:
    """Takes ``url`` out of rotation: its in-flight turns move, its leases are forgotten."""
    h = self._health[url]
    if not h.up:
      return
    h.up = False
    self.fleet_stats["failovers"] += 1
    live = sum(x.up for x in self._health.values())
    log.warning(
      "SGLang server %s taken out of rotation (%s); %d of %d in rotation",
      url,
      why,
      live,
      len(self.fleet),
    )
    self._orphans.update(await self.scheduler.forget_server(url))
    for key in [k for k, u in self._sticky.items() if u == url]:
      del self._sticky[key]
    h.lost_event().set()
    self._changed_event().set()

  async def _rejoin(self, url: str) -> None:
    """Brings a server that answers again to the current weights, then back into rotation."""
    h = self._health[url]
    try:
      if self._push_lock is None:
        self._push_lock = asyncio.Lock()
      async with self._push_lock:
        if self.router_url:  # the router's workers are refreshed by refresh_workers
          ok = True
        else:
          ok = await self._bring_to_version(url)
      if not ok:
        return
      h.up, h.failures, h.lost = True, 0, None
      if self.scheduler.stats()[url]["capacity"] == 0:  # never read: read at the next lease
        self._capacities_known, self._last_capacity_read = False, None
      await self.scheduler.restore_server(url)
      self.fleet_stats["rejoins"] += 1
      log.warning("SGLang server %s back in rotation at weight version %d", url, self._version)
      self._changed_event().set()
    except Exception as e:  # noqa: BLE001 - it stays out; the next probe tries again
      log.warning("SGLang server %s answers but could not be refreshed: %s", url, e)
    finally:
      h.rejoining = False

  async def _server_version(self, url: str) -> str | None:
    g = await self._request("GET", url, "/get_weight_version")
    v = g.get("weight_version") if isinstance(g, dict) else g
    return None if v is None else str(v)

  async def _bring_to_version(self, url: str) -> bool:
    """True when ``url`` serves the engine's weight version, pushing the last pushed weights
    to it alone first when it does not (a restarted server comes back with its start
    weights). Call under the push lock."""
    if await self._server_version(url) == str(self._version):
      return True
    if self._current is None:  # nothing pushed yet: its start weights are the current ones
      return True
    config, params = self._current
    log.warning(
      "SGLang server %s answers with an old weight version; pushing version %d to it",
      url,
      self._version,
    )
    prev, self._targets = self._targets, [url]
    try:
      await self._reset_transport()
      await self._push_body(config, params, self._version, full=True)
      await self._reset_transport()
    finally:
      self._targets = prev
    return await self._server_version(url) == str(self._version)

  async def _reset_transport(self) -> None:
    """Drops transport state tied to a set of servers (the distributed group)."""
    if self.transport.name == "distributed":
      with contextlib.suppress(Exception):
        await self.transport.close(self)

  async def _check_fleet(self) -> None:
    now = time.monotonic()
    if any(h.up for h in self._health.values()):
      self._all_down_since = None
      return
    if self._all_down_since is None:
      self._all_down_since = now
      log.error(
        "no SGLang server in rotation; waiting up to %gs (rollout.server_timeout_s)",
        self.server_timeout_s,
      )
      return
    if now - self._all_down_since > self.server_timeout_s and self._fleet_error is None:
      self._fleet_error = FleetUnavailable(
        f"every SGLang server was out of rotation for more than {self.server_timeout_s:g}s "
        f"(rollout.server_timeout_s): {', '.join(self.fleet)}; the run stops at its last "
        "checkpoint; rerun the same command to resume once the servers answer"
      )
      await self.scheduler.fail_waiters(self._fleet_error)
      self._changed_event().set()

  async def refresh_workers(self) -> list[str]:
    """Router mode: reads the router's workers (``GET /workers``). A worker the router reports
    unhealthy is taken off the router (``DELETE /workers/{id}``), so the router cannot give it
    traffic again by itself; once it answers ``/health`` it is brought to the current weight
    version and added back (``POST /workers {"url"}``). Returns the healthy workers."""
    reply = await self._request("GET", self.router_url, "/workers")
    rows = (reply or {}).get("workers") if isinstance(reply, dict) else None
    if not isinstance(rows, list):
      raise SGLangError(f"{self.router_url}/workers: expected {{'workers': [...]}}, got {reply!r}")
    listed = {}
    for w in rows:
      if isinstance(w, dict) and w.get("url"):
        listed[str(w["url"]).rstrip("/")] = (bool(w.get("is_healthy", True)), w.get("id"))
    for u, (ok, wid) in listed.items():
      if u not in self._workers:
        self._workers.append(u)
      if ok and u not in self._removed:
        self._worker_health[u] = True
        continue
      if u in self._removed:
        continue
      self._worker_health[u] = False
      self._removed.add(u)
      self.fleet_stats["failovers"] += 1
      log.warning("router worker %s unhealthy: taken off the router until it answers", u)
      await self._request("DELETE", self.router_url, f"/workers/{wid or u}")
    for u in self._workers:
      if u not in listed and u not in self._removed:  # gone from the router: treat as removed
        self._worker_health[u] = False
        self._removed.add(u)
    for u in sorted(self._removed):
      if u in listed and listed[u][0]:
        continue  # still being removed by the router's job queue
      if await self._probe(u):
        await self._readd_worker(u)
    return self.urls

  async def _readd_worker(self, url: str) -> None:
    if self._push_lock is None:
      self._push_lock = asyncio.Lock()
    try:
      async with self._push_lock:
        ok = await self._bring_to_version(url)
      if not ok:
        return
      await self._request("POST", self.router_url, "/workers", {"url": url})
    except SGLangError as e:
      log.warning("router worker %s answers but could not be refreshed: %s", url, e)
      return
    self._removed.discard(url)
    self._worker_health[url] = True
    self.fleet_stats["rejoins"] += 1
    log.warning("worker %s at weight version %d given back to the router", url, self._version)

  def fleet_metrics(self) -> dict[str, float]:
    """Per-step fleet metrics: servers in rotation now, and failovers / re-generated turns /
    rejoins since the last call."""
    delta = {k: self.fleet_stats[k] - self._stats_at_last_read[k] for k in self.fleet_stats}
    self._stats_at_last_read = collections.Counter(self.fleet_stats)
    healthy = (
      sum(self._worker_health.values())
      if self.router_url
      else sum(h.up for h in self._health.values())
    )
    return {
      "rollout/servers_healthy": float(healthy),
      "rollout/servers_total": float(len(self._workers) if self.router_url else len(self.fleet)),
      "rollout/failovers": float(delta.get("failovers", 0)),
      "rollout/regenerated_turns": float(delta.get("regenerated_turns", 0)),
      "rollout/server_rejoins": float(delta.get("rejoins", 0)),
    }

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

    return dict(zip(self.fleet, await asyncio.gather(*[one(u) for u in self.fleet])))

  async def wait_healthy(
    self, timeout_s: float | None = None, poll_s: float = 2.0, log_every_s: float = 5.0
  ) -> None:
    """Returns when every server answers ``/health``; else `ServersUnavailable` naming the
    URLs: at once for a host name that does not resolve, after ``timeout_s`` (default
    ``server_timeout_s``) for servers that do not answer, and on Ctrl-C. Logs which servers
    it still waits for every ``log_every_s`` seconds."""
    timeout_s = self.server_timeout_s if timeout_s is None else float(timeout_s)
    await asyncio.to_thread(check_resolvable, self.fleet + self._workers)
    t0 = time.monotonic()
    next_log = t0 + log_every_s
    down: list[str] = list(self.fleet)
    try:
      while True:
        h = await self.health()
        down = [u for u, ok in h.items() if not ok]
        if not down and self.router_url:
          try:
            if not await self.refresh_workers():
              down = [f"{self.router_url} (no healthy worker behind the router)"]
          except SGLangError as e:
            down = [f"{self.router_url} ({e})"]
        if not down:
          if time.monotonic() - t0 >= log_every_s:
            log.info("all %d SGLang servers healthy", len(self.fleet))
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
            len(self.fleet),
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
    version = self._version + 1 if version is None else int(version)
    self._ensure_monitor()
    if self._push_lock is None:
      self._push_lock = asyncio.Lock()
    async with self._push_lock:
      for attempt in range(2):
        if not self.urls:
          await self._wait_for_a_server()
        targets = self.urls
        try:
          stats, lora_name, params_kept = await self._push_body(config, params, version)
          break
        except SGLangError as e:
          # A server that died during the push leaves the rotation (it is refreshed when it
          # answers again); the others get the push again.
          dead = [u for u, ok in zip(targets, await self._probe_all(targets)) if not ok]
          for u in dead:
            await self._take_out_target(u, "failed a weight push")
          if attempt or not dead or not self.urls:
            raise
          log.warning("%s; pushing again to the %d server(s) still answering", e, len(self.urls))
      self._version = version
      self._last_pushed = params_kept if (self.weight_delta or lora.is_lora(params)) else None
      self._current = (config, params)
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

  async def _probe_all(self, urls: Sequence[str]) -> list[bool]:
    return list(await asyncio.gather(*[self._probe(u) for u in urls]))

  async def _take_out_target(self, url: str, why: str) -> None:
    if self.router_url:
      self._worker_health[url] = False
      self._removed.add(url)
      self.fleet_stats["failovers"] += 1
      with contextlib.suppress(SGLangError):
        await self._request("DELETE", self.router_url, f"/workers/{url}")
    elif url in self._health:
      await self._take_out(url, why)

  async def _wait_for_a_server(self) -> None:
    self._ensure_monitor()
    while not self.urls:
      if self._fleet_error is not None:
        raise self._fleet_error
      ev = self._changed_event()
      ev.clear()
      with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ev.wait(), self.health_interval_s)
      if self.router_url:
        with contextlib.suppress(SGLangError):
          await self.refresh_workers()

  async def _push_body(self, config, params, version: int, full: bool = False):
    """The push to ``self.urls`` (module docstring of `update_weights`); returns (stats, the
    LoRA adapter name loaded or None, the base params kept for the next delta). ``full``:
    every tensor, whatever was pushed before (a rejoining server)."""
    adapters = params if lora.is_lora(params) else None
    if adapters is not None:
      params = adapters.base
    base.check_params(config, params)
    t0 = time.perf_counter()
    table = layout.hf_table(config)
    delta = (self.weight_delta or adapters is not None) and not full
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
    return stats, lora_name, params

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

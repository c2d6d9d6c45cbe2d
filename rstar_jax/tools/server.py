"""HTTP service for the code pool (aiohttp), bound to loopback by default.

Endpoints (JSON; with a token configured every endpoint needs `Authorization: Bearer <token>`,
else 401):
  GET  /health         -> {"ok", "isolation_level", "num_workers", "service_id",
                           "max_sessions", "stats"}: the caller's tenant's figures only
  POST /execute_batch  {"requests": [{"code", "stdin"? | "stdin_b64"?, "timeout_s"?,
                        "session_id"?, "service_id"?}, ...], "queue_timeout_s"?: float}
                       -> {"results": [{"status", "stdout", "stderr", "duration_s", "exit_code"}],
                           "service_id"}
                       An item that waited longer than queue_timeout_s for a worker (or a new
                       session while all of its token's sessions are mid-call) comes back with
                       status "queue_timeout" (the client retries it); an item that is itself
                       invalid with status "invalid_request" (stderr names the field), the
                       others still run; a session item naming another `service_id` (the session
                       was opened on an earlier run of this service) with "session_lost", not run.
                       A body that is not such an object is a 400, one over `max_request_bytes`
                       a 413.
  POST /close_session  {"session_id"} -> {"closed": bool}
Session ids live in the namespace of the caller's token: the pool sees a hash of (token
namespace, id), so one token cannot reach another token's sessions. Each token (tenant) holds at
most `max_sessions_per_token` sessions; a new one past that closes the tenant's own least
recently used idle session (its next call says so), never another tenant's. The total
(`PoolConfig.max_sessions`) follows from the descriptors (RLIMIT_NOFILE, soft raised to hard at
start) and sandbox uids the service has: a larger configured cap is lowered with a logged line.
A connection must present a valid token within `header_timeout_s` of opening, and at most
`max_unauthenticated_connections` (of `max_connections`) may be waiting to: past that a new
connection is closed at once, so idle sockets cannot exhaust the descriptors. Each output field
comes back at most `max_output_bytes` (+4 KiB) long once JSON-encoded, the whole response at most
`max_response_bytes`; a cut field says so and an "ok" result becomes "output_limit".
There is deliberately no endpoint that unpickles functions: run_function stays in-process/Ray.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import dataclasses
import hashlib
import json
import logging
import resource
import secrets
from typing import Any

from aiohttp import web

from rstar_jax.tools.code_pool import (
  MAX_CODE_BYTES,
  MAX_QUEUE_TIMEOUT_S,
  MAX_TIMEOUT_S,
  CodePool,
  PoolConfig,
  QueueTimeout,
  check_seconds,
)
from rstar_jax.tools.service_token import (
  TOKEN_ENV,
  TOKEN_FILE_ENV,
  TokenSet,
  is_loopback,
  read_tokens,
)

log = logging.getLogger(__name__)
MAX_SESSION_ID_CHARS = 1024
INVALID = "invalid_request"
_FIELD_SLACK = 4096  # room for the truncation note on top of the pool's own output cap
_OFF_LOOP_BYTES = 256 << 10  # bodies / responses above this are (de)serialised in a thread
_NAMESPACE = web.RequestKey("namespace", str)
# Descriptors one idle session holds: 4 memfds in the service, 7 in its template (measured: 144
# idle sessions exhausted a template's 1,024 descriptors); 8 leaves a margin.
FDS_PER_SESSION = 8
FD_RESERVE = 128  # the service's own: listening socket, template pipes, libraries, ...
FDS_PER_WORKER = 8  # one running call's memfds and pipes
MAX_SERVICE_ID_CHARS = 64


class BadRequest(ValueError):
  """The request body as a whole is unusable (HTTP status attached)."""

  def __init__(self, msg: str, status: int = 400):
    super().__init__(msg)
    self.status = status


def _no_constant(name: str):
  raise ValueError(f"JSON constant {name} is not allowed (numbers must be finite)")


def _parse_int(digits: str) -> int | float:
  # Every number of the schema is seconds: an integer too long to be one becomes +-inf, which
  # the field's own check then refuses by name (int() of 4300+ digits would fail the whole body).
  return int(digits) if len(digits) <= 64 else float(digits)


def json_value_count(raw: bytes) -> int:
  """Upper bound on the number of JSON values in `raw` outside strings, in a few C-speed passes.

  Parsing cost grows with the values, not the bytes (6 MiB of `[],` takes ~1 s to parse, 8 MiB
  of one string 17 ms), so the body's structure is bounded before json.loads ever sees it.
  """
  n = raw.count(b",") + raw.count(b"[") + raw.count(b"{") + raw.count(b":")
  if n < 4096:
    return n
  # Commas inside strings (code!) counted above: count again outside strings only. With escaped
  # backslashes and quotes dropped, every remaining quote delimits a string.
  flat = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
  strings = flat.count(b'"') // 2
  outside = b"".join(flat.split(b'"')[::2])
  return strings + sum(outside.count(c) for c in (b",", b"[", b"{", b":"))


def loads_bounded(raw: bytes, max_values: int) -> Any:
  """Strict JSON of at most `max_values` values: NaN / Infinity are refused, not floats."""
  n = json_value_count(raw)
  if n > max_values:
    raise BadRequest(f"body has ~{n} JSON values, more than the limit of {max_values}")
  try:
    return json.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_int=_parse_int)
  except (ValueError, RecursionError) as e:
    raise BadRequest(f"body is not JSON: {str(e)[:200]}") from None


def parse_item(i: int, item: Any) -> dict:
  """One request item, validated; ValueError naming the field otherwise."""
  if not isinstance(item, dict):
    raise ValueError(f"requests[{i}] must be an object, got {type(item).__name__}")
  code = item.get("code")
  if not isinstance(code, str):
    raise ValueError(f"requests[{i}].code must be a string, got {type(code).__name__}")
  try:
    code.encode("utf-8")
  except UnicodeEncodeError as e:
    raise ValueError(f"requests[{i}].code holds a lone surrogate at {e.start}") from None
  if "stdin_b64" in item:
    if "stdin" in item:
      raise ValueError(f"requests[{i}] has both stdin and stdin_b64")
    if not isinstance(item["stdin_b64"], str):
      raise ValueError(f"requests[{i}].stdin_b64 must be a base64 string")
    try:
      stdin: str | bytes = base64.b64decode(item["stdin_b64"], validate=True)
    except (binascii.Error, ValueError):
      raise ValueError(f"requests[{i}].stdin_b64 is not valid base64") from None
  else:
    stdin = item.get("stdin", "")
    if not isinstance(stdin, str):
      raise ValueError(f"requests[{i}].stdin must be a string, got {type(stdin).__name__}")
    try:
      stdin.encode("utf-8")  # binary stdin travels as stdin_b64
    except UnicodeEncodeError as e:
      raise ValueError(
        f"requests[{i}].stdin holds a lone surrogate at {e.start} (send bytes as stdin_b64)"
      ) from None
  if len(code) > MAX_CODE_BYTES or len(stdin) > MAX_CODE_BYTES:
    raise ValueError(f"requests[{i}]: code and stdin must each be <= {MAX_CODE_BYTES} chars")
  timeout = item.get("timeout_s")
  if timeout is not None:
    try:
      timeout = check_seconds(f"requests[{i}].timeout_s", timeout, MAX_TIMEOUT_S)
    except OverflowError:  # an integer too large for a float
      raise ValueError(f"requests[{i}].timeout_s must be <= {MAX_TIMEOUT_S:g}") from None
  sid = item.get("session_id")
  if sid is not None:
    check_session_id(f"requests[{i}].session_id", sid)
  service_id = item.get("service_id")
  if service_id is not None and (
    not isinstance(service_id, str) or not 0 < len(service_id) <= MAX_SERVICE_ID_CHARS
  ):
    raise ValueError(
      f"requests[{i}].service_id must be a string of <= {MAX_SERVICE_ID_CHARS} chars"
    )
  return {
    "code": code,
    "stdin": stdin,
    "timeout_s": timeout,
    "session_id": sid,
    "service_id": service_id,
  }


def check_session_id(name: str, sid: Any) -> str:
  if not isinstance(sid, str) or not 0 < len(sid) <= MAX_SESSION_ID_CHARS:
    what = f"str of length {len(sid)}" if isinstance(sid, str) else type(sid).__name__
    raise ValueError(
      f"{name} must be a non-empty string of <= {MAX_SESSION_ID_CHARS} chars, got {what}"
    )
  return sid


def pool_session_id(namespace: str, sid: str) -> str:
  """The pool's id of session `sid` of the token namespace `namespace` (fixed length)."""
  raw = namespace.encode() + b"\0" + sid.encode("utf-8", "surrogatepass")
  return "s" + hashlib.sha256(raw).hexdigest()


def _item_result(status: str, stderr: str) -> dict:
  return {"status": status, "stdout": "", "stderr": stderr, "duration_s": 0.0, "exit_code": None}


def _wire_len(text: str) -> int:
  return len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def _prefix_within(text: str, limit: int) -> int:
  """The longest prefix of `text` whose JSON string takes <= `limit` bytes, in one pass over at
  most ~`limit` characters (a character takes 1 to 6 bytes: `\\u0001`), not over all of it."""
  end, used = 0, 2  # the quotes
  step = 1 << 16
  while end < len(text):
    n = _wire_len(text[end : end + step]) - 2
    if used + n > limit:
      lo, hi = 0, min(step, len(text) - end)  # within this chunk: the longest part that fits
      while lo < hi:
        mid = (lo + hi + 1) // 2
        if used + _wire_len(text[end : end + mid]) - 2 <= limit:
          lo = mid
        else:
          hi = mid - 1
      return end + lo
    used += n
    end += step
  return len(text)


def _fit(text: str, budget: int) -> tuple[str, bool]:
  """`text` cut so that its JSON string takes <= `budget` bytes (the note included), and
  whether it was cut."""
  if 6 * len(text) + 2 <= budget or _prefix_within(text, budget) == len(text):
    return text, False
  note = f"\n[output cut by the code pool service: over {budget} bytes as JSON]\n"
  end = _prefix_within(text, max(budget - (_wire_len(note) - 2), 2))
  return text[:end] + note, True


def encode_results(
  results: list[dict], field_bytes: int, total_bytes: int, service_id: str | None = None
) -> bytes:
  """The response body: each output field cut to `field_bytes` of JSON, items past
  `total_bytes` in all replaced by an output_limit result that says why."""
  out, used = [], 0
  for r in results:
    r = dict(r)
    cut = False
    for field in ("stdout", "stderr"):
      r[field], was_cut = _fit(r[field], field_bytes)
      cut |= was_cut
    if cut and r["status"] == "ok":
      r["status"] = "output_limit"
    size = len(json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass")) + 2
    if used + size > total_bytes:
      r = _item_result(
        "output_limit",
        f"[result dropped by the code pool service: the response would exceed {total_bytes} "
        f"bytes (status was {r['status']})]\n",
      )
      size = len(json.dumps(r)) + 2
    used += size
    out.append(r)
  body: dict = {"results": out}
  if service_id is not None:
    body["service_id"] = service_id
  return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")


def raise_nofile_limit() -> int:
  """Raises this process's soft RLIMIT_NOFILE to its hard limit (the templates the pool starts
  inherit it) and returns the soft limit now in force."""
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
  if soft == resource.RLIM_INFINITY or soft >= want:
    return soft if soft != resource.RLIM_INFINITY else 1 << 20
  try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want
  except (ValueError, OSError):
    return soft


def session_capacity(config: PoolConfig, nofile: int, max_connections: int) -> tuple[int, str]:
  """(sessions the service can hold, what bounds it): the descriptors left once the service's
  own, its running calls' and its connections' are set aside, and one template's share of
  sandbox uids (idle sessions may all sit on one template)."""
  fds = nofile - FD_RESERVE - FDS_PER_WORKER * config.num_workers - max_connections
  fd_cap = fds // FDS_PER_SESSION
  uid_cap = max(1, config.uids_per_template - config.num_workers - 1)
  if fd_cap < uid_cap:
    return fd_cap, (
      f"RLIMIT_NOFILE={nofile} descriptors ({FDS_PER_SESSION} per session after "
      f"{nofile - max(fds, 0)} for the service, its workers and max_connections={max_connections})"
    )
  return uid_cap, f"{config.uids_per_template} sandbox uids per template less the workers'"


class _Tenant:
  """One token's sessions (least recently used first, each [calls in flight]), the ids the
  service closed with why (the next call says so), and its figures."""

  def __init__(self):
    self.sessions: collections.OrderedDict[str, list] = collections.OrderedDict()
    self.notes: collections.OrderedDict[str, str] = collections.OrderedDict()
    self.stats = {
      "calls": 0,
      "sessions_opened": 0,
      "sessions_evicted": 0,
      "sessions_lost": 0,
      "queue_timeouts": 0,
      "internal_errors": 0,
    }


class _ConnectionGuard:
  """Counts the server's connections; a connection not yet authenticated is closed after
  `header_timeout_s`, and one past the caps is closed as soon as it opens."""

  def __init__(self, max_connections: int, max_unauthenticated: int, header_timeout_s: float):
    self.max_connections = max_connections
    self.max_unauthenticated = max_unauthenticated
    self.header_timeout_s = header_timeout_s
    self.open: dict[Any, asyncio.Transport] = {}
    self.waiting: dict[Any, asyncio.TimerHandle] = {}  # not yet authenticated
    self.stats = {"connections_refused": 0, "header_timeouts": 0}

  def install(self, server: web.Server) -> None:
    # aiohttp's Server hears of every connection from its RequestHandler; wrapping its two hooks
    # on this instance is the least intrusive place (test_server_tenants catches a change).
    made, lost = server.connection_made, server.connection_lost

    def on_made(handler, transport):
      made(handler, transport)
      self.opened(handler, transport)

    def on_lost(handler, exc=None):
      self.closed(handler)
      lost(handler, exc)

    server.connection_made, server.connection_lost = on_made, on_lost

  def opened(self, handler, transport) -> None:
    if len(self.open) >= self.max_connections or len(self.waiting) >= self.max_unauthenticated:
      self.stats["connections_refused"] += 1
      transport.abort()  # RST now: the descriptor is freed, nothing is read
      return
    self.open[handler] = transport
    loop = asyncio.get_running_loop()
    self.waiting[handler] = loop.call_later(self.header_timeout_s, self._expire, handler)

  def _expire(self, handler) -> None:
    self.waiting.pop(handler, None)
    transport = self.open.pop(handler, None)
    if transport is not None:
      self.stats["header_timeouts"] += 1
      transport.abort()

  def authenticated(self, handler) -> None:
    timer = self.waiting.pop(handler, None)
    if timer is not None:
      timer.cancel()

  def closed(self, handler) -> None:
    self.open.pop(handler, None)
    timer = self.waiting.pop(handler, None)
    if timer is not None:
      timer.cancel()


class CodePoolServer:
  """Owns a CodePool and serves it; `port=0` picks a free port (see `.port`).

  `token` / `token_file` (default: $RSTAR_CODE_POOL_TOKEN_FILE, then $RSTAR_CODE_POOL_TOKEN)
  turn on authentication; it is required when `host` is not loopback (ValueError otherwise).
  Constructing it raises this process's soft RLIMIT_NOFILE to the hard limit and fixes the
  session caps from what is then available (see the module doc).
  """

  def __init__(
    self,
    config: PoolConfig,
    host: str = "127.0.0.1",
    port: int = 8088,
    queue_timeout_s: float | None = None,
    max_batch: int = 4096,
    *,
    token: str | None = None,
    token_file: str | None = None,
    max_request_bytes: int = 64 << 20,
    max_response_bytes: int = 256 << 20,
    max_sessions_per_token: int | None = None,
    max_connections: int = 1024,
    max_unauthenticated_connections: int = 256,
    header_timeout_s: float = 10.0,
  ):
    self.tokens = TokenSet(read_tokens(token, token_file))
    if not self.tokens and not is_loopback(host):
      raise ValueError(
        f"refusing to serve on {host!r} (not loopback) without a token: set ${TOKEN_FILE_ENV} "
        f"or ${TOKEN_ENV} (or --token_file)"
      )
    if min(max_batch, max_request_bytes, max_response_bytes) < 1:
      raise ValueError(
        "max_batch, max_request_bytes and max_response_bytes must be >= 1, got "
        f"{max_batch}, {max_request_bytes}, {max_response_bytes}"
      )
    if not 1 <= max_unauthenticated_connections <= max_connections:
      raise ValueError(
        "need 1 <= max_unauthenticated_connections <= max_connections, got "
        f"{max_unauthenticated_connections} and {max_connections}"
      )
    header_timeout_s = check_seconds("header_timeout_s", header_timeout_s, MAX_QUEUE_TIMEOUT_S)
    nofile = raise_nofile_limit()
    if max_connections > nofile // 4:
      # A quarter of the descriptors for connections, the rest for sessions and the service.
      log.warning(
        "max_connections=%d lowered to %d: RLIMIT_NOFILE=%d", max_connections, nofile // 4, nofile
      )
      max_connections = max(1, nofile // 4)
      max_unauthenticated_connections = min(max_unauthenticated_connections, max_connections)
    config = self._fit_sessions(config, nofile, max_connections)
    self.max_sessions_per_token = self._per_token(config.max_sessions, max_sessions_per_token)
    self.pool = CodePool(config=config)
    self.host, self.port = host, port
    self.queue_timeout_s = queue_timeout_s
    self.max_batch = max_batch
    self.max_request_bytes = max_request_bytes
    self.max_response_bytes = max_response_bytes
    # Each item is one object of <= 6 keys (~16 values); the rest is slack for the envelope.
    self.max_json_values = 16 * max_batch + 1024
    # Names this run of the service: a session opened on an earlier run is lost, and says so.
    self.service_id = secrets.token_hex(8)
    self.connections = _ConnectionGuard(
      max_connections, max_unauthenticated_connections, header_timeout_s
    )
    self._tenants: dict[str, _Tenant] = {}
    self._runner: web.AppRunner | None = None

  @staticmethod
  def _fit_sessions(config: PoolConfig, nofile: int, max_connections: int) -> PoolConfig:
    cap, why = session_capacity(config, nofile, max_connections)
    if cap < 1:
      raise ValueError(
        f"no room for a single session: {why}; raise the descriptor limit (ulimit -n) or lower "
        "num_workers / max_connections"
      )
    wanted = config.max_sessions
    if wanted is not None and wanted > cap:
      log.warning("max_sessions=%d lowered to %d: bounded by %s", wanted, cap, why)
    return dataclasses.replace(config, max_sessions=min(wanted or cap, cap))

  def _per_token(self, total: int, per_token: int | None) -> int:
    tenants = max(1, len(self.tokens))
    share = total // tenants
    if share < 1:
      raise ValueError(f"{tenants} tokens cannot each hold a session within max_sessions={total}")
    if per_token is None:
      return share
    if per_token < 1:
      raise ValueError(f"max_sessions_per_token must be >= 1, got {per_token}")
    if per_token > share:
      # Past its share one tenant could fill the pool, whose own LRU then closes another's.
      log.warning(
        "max_sessions_per_token=%d lowered to %d (max_sessions=%d over %d tokens)",
        per_token,
        share,
        total,
        tenants,
      )
    return min(per_token, share)

  def app(self) -> web.Application:
    app = web.Application(client_max_size=self.max_request_bytes, middlewares=[self._auth])
    app.router.add_get("/health", self.health)
    app.router.add_post("/execute_batch", self.execute_batch)
    app.router.add_post("/close_session", self.close_session)
    return app

  async def start(self) -> CodePoolServer:
    await self.pool.start()
    # Idle keep-alive connections close after 75 s (aiohttp's default is an hour); clients
    # (aiohttp's connector: 15 s) drop theirs first, so a request never races the close.
    self._runner = web.AppRunner(self.app(), access_log=None, keepalive_timeout=75.0)
    await self._runner.setup()
    self.connections.install(self._runner.server)
    site = web.TCPSite(self._runner, self.host, self.port)
    await site.start()
    self.port = site._server.sockets[0].getsockname()[1]
    log.warning(
      "code pool server on http://%s:%d (isolation %s, %s; at most %d sessions, %d per token)",
      self.host,
      self.port,
      self.pool.isolation_level,
      "token required" if self.tokens else "no token: loopback only",
      self.pool.config.max_sessions,
      self.max_sessions_per_token,
    )
    return self

  async def stop(self) -> None:
    if self._runner is not None:
      await self._runner.cleanup()
    await self.pool.close()

  async def __aenter__(self):
    return await self.start()

  async def __aexit__(self, *exc):
    await self.stop()

  # -- request plumbing
  @web.middleware
  async def _auth(self, request: web.Request, handler) -> web.StreamResponse:
    # Checked before the body is read: an unauthenticated request costs no parsing.
    ns = "open"
    if self.tokens:
      header = request.headers.get("Authorization", "")
      scheme, _, presented = header.partition(" ")
      ns = self.tokens.namespace(presented.strip()) if scheme.lower() == "bearer" else None
      if ns is None:
        return web.json_response(
          {"error": "missing or wrong token (send Authorization: Bearer <token>)"},
          status=401,
          headers={"WWW-Authenticate": "Bearer"},
        )
    self.connections.authenticated(request.protocol)
    request[_NAMESPACE] = ns
    return await handler(request)

  def _tenant(self, ns: str) -> _Tenant:
    t = self._tenants.get(ns)
    if t is None:
      t = self._tenants[ns] = _Tenant()
    return t

  async def _body(self, request: web.Request) -> Any:
    try:
      raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
      raise BadRequest(f"body over max_request_bytes={self.max_request_bytes}", 413) from None
    if len(raw) <= _OFF_LOOP_BYTES:
      return loads_bounded(raw, self.max_json_values)
    return await asyncio.get_running_loop().run_in_executor(
      None, loads_bounded, raw, self.max_json_values
    )

  async def _respond(self, results: list[dict]) -> web.Response:
    field = self.pool.config.max_output_bytes + _FIELD_SLACK
    args = (results, field, self.max_response_bytes, self.service_id)
    if sum(len(r["stdout"]) + len(r["stderr"]) for r in results) <= _OFF_LOOP_BYTES:
      body = encode_results(*args)
    else:
      body = await asyncio.get_running_loop().run_in_executor(None, encode_results, *args)
    return web.Response(body=body, content_type="application/json", charset="utf-8")

  # -- sessions per tenant
  async def _admit(self, tenant: _Tenant, ns: str, sid: str) -> list | None:
    """Counts a call on session `sid` of `tenant` in; a new session past the tenant's cap
    first closes the tenant's least recently used idle one. None: every one is mid-call."""
    entry = tenant.sessions.get(sid)
    if entry is not None:
      entry[0] += 1
      tenant.sessions.move_to_end(sid)
      return entry
    entry = tenant.sessions[sid] = [1]  # reserved before any await
    victims = []
    while len(tenant.sessions) > self.max_sessions_per_token:
      victim = next((s for s, e in tenant.sessions.items() if e[0] == 0), None)
      if victim is None:
        del tenant.sessions[sid]
        return None
      del tenant.sessions[victim]
      victims.append(victim)
      tenant.notes[victim] = (
        f"evicted by the code pool service (this token holds at most "
        f"{self.max_sessions_per_token} sessions; it was the least recently used)"
      )
      while len(tenant.notes) > 65536:
        tenant.notes.popitem(last=False)
      tenant.stats["sessions_evicted"] += 1
    tenant.stats["sessions_opened"] += 1
    for victim in victims:  # closed before the new one starts: descriptors are freed first
      await self.pool.close_session(pool_session_id(ns, victim))
    return entry

  # -- endpoints
  async def health(self, request: web.Request) -> web.Response:
    tenant = self._tenant(request[_NAMESPACE])
    return web.json_response(
      {
        "ok": True,
        "isolation_level": self.pool.isolation_level,
        "num_workers": self.pool.config.num_workers,
        "service_id": self.service_id,
        "max_sessions": self.max_sessions_per_token,
        "stats": dict(tenant.stats, sessions=len(tenant.sessions)),
      }
    )

  async def execute_batch(self, request: web.Request) -> web.Response:
    try:
      body = await self._body(request)
      if not isinstance(body, dict) or not isinstance(body.get("requests"), list):
        raise BadRequest("body must be an object with a 'requests' list")
      items = body["requests"]
      if len(items) > self.max_batch:
        raise BadRequest(f"batch of {len(items)} exceeds max_batch={self.max_batch}")
      qt = body.get("queue_timeout_s", self.queue_timeout_s)
      if qt is not None:
        try:
          qt = check_seconds("queue_timeout_s", qt, MAX_QUEUE_TIMEOUT_S, allow_zero=True)
        except (ValueError, OverflowError):
          raise BadRequest(
            f"queue_timeout_s must be a finite number in [0, {MAX_QUEUE_TIMEOUT_S:g}]"
          ) from None
    except BadRequest as e:
      return web.json_response({"error": str(e)}, status=e.status)
    ns = request[_NAMESPACE]
    tenant = self._tenant(ns)

    async def run(i, p, sid):
      try:
        r = await self.pool._execute(p["code"], p["stdin"], p["timeout_s"], sid, qt)
      except QueueTimeout as e:
        tenant.stats["queue_timeouts"] += 1
        return _item_result("queue_timeout", str(e))
      except (ValueError, TypeError, OverflowError, UnicodeError) as e:
        return _item_result(INVALID, f"requests[{i}]: {e}\n")
      except Exception as e:  # an infrastructure fault: this item only
        log.exception("code pool failed on a request item")
        tenant.stats["internal_errors"] += 1
        return _item_result("internal_error", f"code pool service error: {type(e).__name__}\n")
      return dataclasses.asdict(r)

    async def one(i, it):
      # Every failure stays in its own item: a batch never loses a co-batched session result.
      try:
        p = parse_item(i, it)
      except ValueError as e:
        return _item_result(INVALID, f"{e}\n")
      tenant.stats["calls"] += 1
      user_sid = p["session_id"]
      if user_sid is None:
        return await run(i, p, None)
      if p["service_id"] is not None and p["service_id"] != self.service_id:
        tenant.stats["sessions_lost"] += 1
        return _item_result(
          "session_lost",
          "the code pool service restarted since this session's last call: its state is lost "
          "(the call was not run)\n",
        )
      entry = await self._admit(tenant, ns, user_sid)
      if entry is None:
        tenant.stats["queue_timeouts"] += 1
        return _item_result(
          "queue_timeout",
          f"all {self.max_sessions_per_token} sessions of this token are mid-call; none can "
          "be closed for a new one",
        )
      try:
        r = await run(i, p, pool_session_id(ns, user_sid))
      finally:
        entry[0] -= 1
        if user_sid in tenant.sessions:
          tenant.sessions.move_to_end(user_sid)  # least recently *used*, ends included
      if r["status"] not in (INVALID, "queue_timeout") and user_sid in tenant.notes:
        note = tenant.notes.pop(user_sid)
        r["stdout"] = f"[session {note}: previous state is lost]\n" + r["stdout"]
      return r

    results = await asyncio.gather(*(one(i, it) for i, it in enumerate(items)))
    return await self._respond(list(results))

  async def close_session(self, request: web.Request) -> web.Response:
    try:
      body = await self._body(request)
      if not isinstance(body, dict) or "session_id" not in body:
        raise BadRequest("body must be an object with a 'session_id' string")
      sid = check_session_id("session_id", body["session_id"])
    except ValueError as e:
      return web.json_response({"error": str(e)}, status=getattr(e, "status", 400))
    ns = request[_NAMESPACE]
    tenant = self._tenant(ns)
    tenant.sessions.pop(sid, None)
    tenant.notes.pop(sid, None)
    closed = await self.pool.close_session(pool_session_id(ns, sid))
    return web.json_response({"closed": closed})


async def serve_forever(
  config: PoolConfig,
  host: str,
  port: int,
  queue_timeout_s: float | None = None,
  **server_kw,
) -> None:
  async with CodePoolServer(config, host, port, queue_timeout_s, **server_kw):
    await asyncio.Event().wait()

"""HTTP service for the code pool (aiohttp), bound to loopback by default.

Endpoints (JSON; with a token configured every endpoint needs `Authorization: Bearer <token>`,
else 401):
  GET  /health         -> {"ok", "isolation_level", "num_workers", "stats"}
  POST /execute_batch  {"requests": [{"code", "stdin"? | "stdin_b64"?, "timeout_s"?,
                        "session_id"?}, ...], "queue_timeout_s"?: float}
                       -> {"results": [{"status", "stdout", "stderr", "duration_s", "exit_code"}]}
                       An item that waited longer than queue_timeout_s for a worker comes back
                       with status "queue_timeout" (the client retries it); an item that is
                       itself invalid with status "invalid_request" (stderr names the field),
                       the others still run. A body that is not such an object is a 400, one
                       over `max_request_bytes` a 413.
  POST /close_session  {"session_id"} -> {"closed": bool}
Session ids live in the namespace of the caller's token: the pool sees a hash of (token
namespace, id), so one token cannot reach another token's sessions. Each output field comes
back at most `max_output_bytes` (+4 KiB) long once JSON-encoded, the whole response at most
`max_response_bytes`; a cut field says so and an "ok" result becomes "output_limit".
There is deliberately no endpoint that unpickles functions: run_function stays in-process/Ray.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import hashlib
import json
import logging
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
  return {"code": code, "stdin": stdin, "timeout_s": timeout, "session_id": sid}


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


def encode_results(results: list[dict], field_bytes: int, total_bytes: int) -> bytes:
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
  return json.dumps({"results": out}, ensure_ascii=False).encode("utf-8", "surrogatepass")


class CodePoolServer:
  """Owns a CodePool and serves it; `port=0` picks a free port (see `.port`).

  `token` / `token_file` (default: $RSTAR_CODE_POOL_TOKEN_FILE, then $RSTAR_CODE_POOL_TOKEN)
  turn on authentication; it is required when `host` is not loopback (ValueError otherwise).
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
    self.pool = CodePool(config=config)
    self.host, self.port = host, port
    self.queue_timeout_s = queue_timeout_s
    self.max_batch = max_batch
    self.max_request_bytes = max_request_bytes
    self.max_response_bytes = max_response_bytes
    # Each item is one object of <= 5 keys (~16 values); the rest is slack for the envelope.
    self.max_json_values = 16 * max_batch + 1024
    self._runner: web.AppRunner | None = None

  def app(self) -> web.Application:
    app = web.Application(client_max_size=self.max_request_bytes, middlewares=[self._auth])
    app.router.add_get("/health", self.health)
    app.router.add_post("/execute_batch", self.execute_batch)
    app.router.add_post("/close_session", self.close_session)
    return app

  async def start(self) -> CodePoolServer:
    await self.pool.start()
    self._runner = web.AppRunner(self.app(), access_log=None)
    await self._runner.setup()
    site = web.TCPSite(self._runner, self.host, self.port)
    await site.start()
    self.port = site._server.sockets[0].getsockname()[1]
    log.warning(
      "code pool server on http://%s:%d (isolation %s, %s)",
      self.host,
      self.port,
      self.pool.isolation_level,
      "token required" if self.tokens else "no token: loopback only",
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
    request[_NAMESPACE] = ns
    return await handler(request)

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
    args = (results, field, self.max_response_bytes)
    if sum(len(r["stdout"]) + len(r["stderr"]) for r in results) <= _OFF_LOOP_BYTES:
      body = encode_results(*args)
    else:
      body = await asyncio.get_running_loop().run_in_executor(None, encode_results, *args)
    return web.Response(body=body, content_type="application/json", charset="utf-8")

  # -- endpoints
  async def health(self, request: web.Request) -> web.Response:
    return web.json_response(
      {
        "ok": True,
        "isolation_level": self.pool.isolation_level,
        "num_workers": self.pool.config.num_workers,
        "stats": self.pool.stats,
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

    async def one(i, it):
      # Every failure stays in its own item: a batch never loses a co-batched session result.
      try:
        p = parse_item(i, it)
      except ValueError as e:
        return _item_result(INVALID, f"{e}\n")
      sid = None if p["session_id"] is None else pool_session_id(ns, p["session_id"])
      try:
        r = await self.pool._execute(p["code"], p["stdin"], p["timeout_s"], sid, qt)
      except QueueTimeout as e:
        return _item_result("queue_timeout", str(e))
      except (ValueError, TypeError, OverflowError, UnicodeError) as e:
        return _item_result(INVALID, f"requests[{i}]: {e}\n")
      except Exception as e:  # an infrastructure fault: this item only
        log.exception("code pool failed on requests[%d]", i)
        return _item_result("internal_error", f"code pool service error: {e!r}\n")
      return dataclasses.asdict(r)

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
    closed = await self.pool.close_session(pool_session_id(request[_NAMESPACE], sid))
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

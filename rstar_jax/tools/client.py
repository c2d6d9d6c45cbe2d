"""HTTP client of the code-pool service with the CodePool `execute`/`execute_many` interface.

Calls are micro-batched (up to `max_batch` calls per request, sent when full or after
`max_wait_s`), retried with exponential backoff on transport errors and on per-item queue
timeouts, and a call that still cannot be placed is surfaced as an internal_error whose stderr
starts with "queue_timeout" (counted in `stats`), never as a hang.

Several service URLs (tool nodes) may be given. Stateless calls go round-robin to the nodes that
are up; a node whose request fails (connection refused or dropped, a timeout, a 5xx) is marked
down and the stateless calls of that request are re-sent to another node. A down node is probed
(`GET /health`) every `probe_interval_s` and rejoins when it answers. A session lives on the node
of its first call. A refused connection means the service, and its sessions with it, is gone:
the session call comes back `session_lost` at once. Otherwise a session call is re-sent only when
the request surely never reached the service (the connection could not be opened), and only to
its own node: the request names the service instance that holds the session (`service_id`), so
a node that restarted in between answers `session_lost` instead of running the call on a fresh
interpreter. After a 5xx, a dropped
connection or a timeout the call may have run, so it comes back with status `session_lost`
(never re-run); the next call on that session id starts a fresh session, its stdout opening with
a note that says so. A 4xx or a 3xx (redirects are not followed) is never retried.

Every response is read with a bound: results up to `max_response_bytes`, error bodies and
`/health` up to a few KiB / 1 MiB. Every failure, whatever raised it, resolves every waiting
caller. The token (`token`, `token_file`, else the environment variables of `service_token`)
goes in every request as `Authorization: Bearer` and in nothing else: no result, log line or
exception message carries it (messages name the exception's type and a cleaned text, never an
aiohttp request repr, which holds the headers).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import itertools
import json
import logging
import re
from collections.abc import Sequence

import aiohttp

from rstar_jax.tools.code_pool import (
  MAX_QUEUE_TIMEOUT_S,
  MAX_TIMEOUT_S,
  BatchExecuteMixin,
  ExecResult,
  check_seconds,
)
from rstar_jax.tools.server import check_session_id
from rstar_jax.tools.service_token import client_token

log = logging.getLogger(__name__)
_OFF_LOOP_BYTES = 256 << 10
_ERROR_BODY_BYTES = 2048  # what an error message quotes of a non-200 body
_HEALTH_BYTES = 1 << 20
SESSION_LOST = "session_lost"
# The connection never opened: nothing was sent, any call may go again.
_NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]+")


class _Failed(Exception):
  """One POST gave no results. `sent`: the service may have run the batch; `node_fault`: the
  node itself failed (transport or 5xx), as opposed to refusing the batch (4xx, bad body)."""

  def __init__(
    self, msg: str, sent: bool, retry: bool = True, node_fault: bool = True, gone: bool = False
  ):
    super().__init__(msg)
    self.sent, self.retry, self.node_fault = sent, retry, node_fault
    self.gone = gone  # the connection was refused: no service listens there any more


def _internal(msg: str) -> ExecResult:
  return ExecResult("internal_error", "", msg if msg.endswith("\n") else msg + "\n", 0.0)


def _lost(msg: str) -> ExecResult:
  return ExecResult(SESSION_LOST, "", msg if msg.endswith("\n") else msg + "\n", 0.0)


def _decode_results(raw: bytes, n: int) -> tuple[list[dict], str | None]:
  try:
    body = json.loads(raw)
    results = body["results"]
  except (ValueError, KeyError, TypeError, RecursionError) as e:
    # RecursionError: deeply nested JSON. str(e) of json errors quotes no body text.
    raise ValueError(f"malformed response: {type(e).__name__}: {str(e)[:120]}") from None
  if not isinstance(results, list) or len(results) != n:
    raise ValueError(f"malformed response: expected {n} results")
  for r in results:
    if not isinstance(r, dict) or not all(isinstance(r.get(k), str) for k in ("status", "stdout")):
      raise ValueError("malformed response: a result is not a {status, stdout, ...} object")
  sid = body.get("service_id")
  return results, sid if isinstance(sid, str) and len(sid) <= 64 else None


class _Node:
  def __init__(self, url: str):
    self.url = url
    self.up = True
    self.service_id: str | None = None  # the service instance that last answered


class _Session:
  """Where one session id lives: node, the service instance there, and its generation (bumped
  when the session is lost, so the next call opens a fresh session under a new wire id)."""

  def __init__(self, node: int, generation: int):
    self.node, self.generation = node, generation
    self.service_id: str | None = None

  def wire_id(self, sid: str) -> str:
    if not self.generation:
      return sid
    return f"~lost{self.generation}~" + hashlib.sha256(sid.encode("utf-8")).hexdigest()


class CodePoolClient(BatchExecuteMixin):
  def __init__(
    self,
    url: str | Sequence[str],
    *,
    max_batch: int = 64,
    max_wait_s: float = 0.005,
    concurrency: int = 8,
    max_retries: int = 4,
    backoff_s: float = 0.5,
    request_timeout_s: float = 600.0,
    queue_timeout_s: float | None = None,
    token: str | None = None,
    token_file: str | None = None,
    max_response_bytes: int = 256 << 20,
    probe_interval_s: float = 2.0,
    probe_timeout_s: float = 5.0,
  ):
    if max_batch < 1 or concurrency < 1 or max_retries < 0 or max_response_bytes < 1:
      raise ValueError(
        f"need max_batch >= 1, concurrency >= 1, max_retries >= 0, max_response_bytes >= 1; got "
        f"{max_batch}, {concurrency}, {max_retries}, {max_response_bytes}"
      )
    urls = [url] if isinstance(url, str) else list(url)
    if not urls or not all(
      isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls
    ):
      raise ValueError(f"url: expected one or more http(s):// URLs, got {url!r}")
    self.nodes = [_Node(u.rstrip("/")) for u in urls]
    self.url = self.nodes[0].url
    self.max_batch, self.max_wait_s = max_batch, max_wait_s
    self.max_retries, self.backoff_s = max_retries, backoff_s
    self.max_response_bytes = max_response_bytes
    self.request_timeout_s = check_seconds(
      "request_timeout_s", request_timeout_s, MAX_QUEUE_TIMEOUT_S
    )
    self.probe_interval_s = check_seconds("probe_interval_s", probe_interval_s, 3600.0)
    self.probe_timeout_s = check_seconds("probe_timeout_s", probe_timeout_s, 3600.0)
    self.queue_timeout_s = (
      None
      if queue_timeout_s is None
      else check_seconds("queue_timeout_s", queue_timeout_s, MAX_QUEUE_TIMEOUT_S, allow_zero=True)
    )
    tok = client_token(token, token_file)
    self._secrets = () if tok is None else (tok,)
    self._headers = {} if tok is None else {"Authorization": f"Bearer {tok}"}
    self._sem = asyncio.Semaphore(concurrency)
    self._queue: asyncio.Queue | None = None
    self._session: aiohttp.ClientSession | None = None
    self._batcher: asyncio.Task | None = None
    self._prober: asyncio.Task | None = None
    self._tasks: set = set()
    self._futures: set = set()
    self._closed = False
    self._rr = itertools.count()
    self._sessions: dict[str, _Session] = {}
    self._lost_notes: collections.OrderedDict[str, str] = collections.OrderedDict()
    self.stats = {
      "batches": 0,
      "retries": 0,
      "queue_timeouts": 0,
      "transport_errors": 0,
      "node_failures": 0,
      "resent_to_other_node": 0,
      "sessions_lost": 0,
      "nodes_rejoined": 0,
    }

  @property
  def nodes_up(self) -> int:
    return sum(n.up for n in self.nodes)

  async def start(self) -> CodePoolClient:
    self._session = aiohttp.ClientSession(
      timeout=aiohttp.ClientTimeout(total=self.request_timeout_s), headers=self._headers
    )
    self._queue = asyncio.Queue()
    self._batcher = asyncio.create_task(self._batch_loop())
    self._prober = asyncio.create_task(self._probe_loop())
    return self

  async def close(self) -> None:
    """Stops the client; every call still waiting (queued, batched, in flight, waiting to be
    re-sent) resolves to an internal_error: `_futures` holds them all, wherever they are."""
    self._closed = True
    for t in (self._batcher, self._prober):
      if t is not None:
        t.cancel()
    for t in list(self._tasks):
      t.cancel()
    if self._tasks:
      await asyncio.wait(list(self._tasks), timeout=5)
    self._fail_all("code pool client closed before the call finished")
    if self._session is not None:
      await self._session.close()

  async def __aenter__(self):
    return await self.start()

  async def __aexit__(self, *exc):
    await self.close()

  # -- messages that may quote a server or an exception: no credential, no control characters
  def _clean(self, text: str, limit: int = 300) -> str:
    for s in self._secrets:
      text = text.replace(s, "<token>")
    text = re.sub(r"(?i)(authorization|bearer)\S*\s*\S*", "<credential>", text)
    return _UNPRINTABLE.sub(" ", text)[:limit]

  def _scrub(self, text: str) -> str:
    """`text` without the token: a service that echoes it back cannot hand it to the policy."""
    for s in self._secrets:
      if s in text:
        text = text.replace(s, "<token>")
    return text

  def _describe(self, e: BaseException) -> str:
    # Never repr() an aiohttp error: its request_info holds the request headers.
    if isinstance(e, aiohttp.ClientResponseError):
      return f"{type(e).__name__}: HTTP {e.status}"
    return f"{type(e).__name__}: {self._clean(str(e), 200)}"

  def _fail_all(self, msg: str) -> None:
    for fut in list(self._futures):
      if not fut.done():
        fut.set_result(_internal(msg))

  def _check_running(self) -> None:
    if self._queue is None or self._closed or self._session is None:
      raise RuntimeError("CodePoolClient is not running: use `async with CodePoolClient(url)`")

  # -- bounded reads
  async def _read(self, resp: aiohttp.ClientResponse, limit: int, what: str) -> bytes:
    """At most `limit` bytes of the body, else _Failed (the connection is dropped, the rest of
    the body is never read)."""
    if resp.content_length is not None and resp.content_length > limit:
      resp.close()
      raise _Failed(f"{what} of {resp.content_length} bytes is over {limit}", True, False)
    chunks, n = [], 0
    while True:
      chunk = await resp.content.read(min(1 << 16, limit + 1 - n))
      if not chunk:
        return b"".join(chunks)
      n += len(chunk)
      if n > limit:
        resp.close()
        raise _Failed(f"{what} over {limit} bytes", True, False)
      chunks.append(chunk)

  async def _error_text(self, resp: aiohttp.ClientResponse) -> str:
    """The first bytes of an error body, cleaned; the rest is not read (connection dropped)."""
    head = await resp.content.read(_ERROR_BODY_BYTES)
    if not resp.content.at_eof():
      resp.close()
    return self._clean(head.decode("utf-8", "replace"))

  async def _get_json(self, node: _Node, path: str, timeout: float | None = None) -> dict:
    kw = {} if timeout is None else {"timeout": aiohttp.ClientTimeout(total=timeout)}
    try:
      async with self._session.get(node.url + path, allow_redirects=False, **kw) as resp:
        if resp.status != 200:
          raise ValueError(
            f"code pool service {path}: HTTP {resp.status}: {await self._error_text(resp)}"
          )
        raw = await self._read(resp, _HEALTH_BYTES, f"{path} response")
    except _Failed as e:
      raise ValueError(f"code pool service {path}: {e}") from None
    except (TimeoutError, aiohttp.ClientError) as e:
      raise ConnectionError(f"code pool service {path}: {self._describe(e)}") from None
    try:
      body = json.loads(raw)
    except (ValueError, RecursionError) as e:
      raise ValueError(f"code pool service {path}: not JSON ({type(e).__name__})") from None
    if not isinstance(body, dict):
      raise ValueError(f"code pool service {path}: expected a JSON object")
    return body

  async def health(self, node: int | None = None) -> dict:
    """`/health` of node `node`, else of the first node that answers (ValueError /
    ConnectionError with a one-line message otherwise)."""
    self._check_running()
    order = [node] if node is not None else range(len(self.nodes))
    err: Exception | None = None
    for i in order:
      try:
        body = await self._get_json(self.nodes[i], "/health")
        sid = body.get("service_id")
        if isinstance(sid, str):
          self.nodes[i].service_id = sid
        return body
      except (ValueError, ConnectionError) as e:
        err = e
    raise err

  # -- calls
  async def execute(
    self,
    code: str,
    stdin: str | bytes = "",
    timeout_s: float | None = None,
    session_id: str | None = None,
  ) -> ExecResult:
    self._check_running()
    # Everything the service would refuse for this item alone is refused here, at the call.
    if not isinstance(code, str):
      raise TypeError(f"code must be str, got {type(code).__name__}")
    try:
      code.encode("utf-8")
    except UnicodeEncodeError as e:
      raise ValueError(f"code holds a lone surrogate at {e.start}") from None
    item: dict = {"code": code}
    if isinstance(stdin, str):
      try:
        stdin.encode("utf-8")
        item["stdin"] = stdin
      except UnicodeEncodeError:
        try:  # as the in-process pool reads it: surrogate escapes stand for raw bytes
          item["stdin_b64"] = base64.b64encode(stdin.encode("utf-8", "surrogateescape")).decode()
        except UnicodeEncodeError as e:
          raise ValueError(f"stdin holds a lone surrogate at {e.start}") from None
    elif isinstance(stdin, (bytes, bytearray, memoryview)):
      item["stdin_b64"] = base64.b64encode(bytes(stdin)).decode()
    else:
      raise TypeError(f"stdin must be str or bytes, got {type(stdin).__name__}")
    if timeout_s is not None:  # same bounds as the pool: refused here, not as a batch's 400
      try:
        item["timeout_s"] = check_seconds("timeout_s", timeout_s, MAX_TIMEOUT_S)
      except OverflowError:
        raise ValueError(f"timeout_s must be <= {MAX_TIMEOUT_S:g}, got a huge integer") from None
    if session_id is not None:
      check_session_id("session_id", session_id)
    fut = asyncio.get_running_loop().create_future()
    self._futures.add(fut)
    fut.add_done_callback(self._futures.discard)
    await self._queue.put((item, fut, 0, session_id))
    return await fut

  async def close_session(self, session_id: str) -> bool:
    """Closes `session_id` on its node (False when it was never opened, or was lost)."""
    self._check_running()
    check_session_id("session_id", session_id)
    self._lost_notes.pop(session_id, None)
    sess = self._sessions.pop(session_id, None)
    node = self.nodes[sess.node if sess is not None else 0]
    wire = sess.wire_id(session_id) if sess is not None else session_id
    try:
      async with self._session.post(
        node.url + "/close_session", json={"session_id": wire}, allow_redirects=False
      ) as resp:
        if resp.status != 200:
          raise ValueError(
            f"code pool service refused close_session: HTTP {resp.status}: "
            f"{await self._error_text(resp)}"
          )
        raw = await self._read(resp, _ERROR_BODY_BYTES, "close_session response")
    except _Failed as e:
      raise ValueError(f"code pool service close_session: {e}") from None
    except (TimeoutError, aiohttp.ClientError) as e:
      raise ConnectionError(f"code pool service close_session: {self._describe(e)}") from None
    try:
      return bool(json.loads(raw)["closed"])
    except (ValueError, KeyError, TypeError, RecursionError):
      raise ValueError("code pool service close_session: malformed response") from None

  # -- nodes
  def _pick(self) -> int:
    up = [i for i, n in enumerate(self.nodes) if n.up]
    pool = up or range(len(self.nodes))
    return pool[next(self._rr) % len(pool)]

  def _node_failed(self, i: int, why: str) -> None:
    node = self.nodes[i]
    self.stats["node_failures"] += 1
    if node.up:
      node.up = False
      log.warning("code pool node %d (%s) marked down: %s", i, node.url, self._clean(why))

  async def _probe_loop(self) -> None:
    while True:
      await asyncio.sleep(self.probe_interval_s)
      for i, node in enumerate(self.nodes):
        if node.up:
          continue
        try:
          body = await self._get_json(node, "/health", self.probe_timeout_s)
        except (ValueError, ConnectionError):
          continue
        if body.get("ok") is True:
          node.up = True
          self.stats["nodes_rejoined"] += 1
          log.warning("code pool node %d (%s) answers again: back in rotation", i, node.url)

  # -- batching
  async def _batch_loop(self) -> None:
    loop = asyncio.get_running_loop()
    while True:
      batch = [await self._queue.get()]
      deadline = loop.time() + self.max_wait_s
      while len(batch) < self.max_batch:
        left = deadline - loop.time()
        if left <= 0:
          break
        try:
          batch.append(await asyncio.wait_for(self._queue.get(), left))
        except TimeoutError:
          break
      # Session calls go to their session's node; the stateless ones to whichever node is up.
      groups: dict[int | None, list] = {}
      try:
        for entry in batch:
          sid = entry[3]
          node = None
          if sid is not None:
            sess = self._sessions.get(sid)
            if sess is None:
              sess = self._sessions[sid] = _Session(self._pick(), 0)
            node = sess.node
          groups.setdefault(node, []).append(entry)
      except Exception as e:  # a bug here must not leave the batch's callers waiting
        for _, fut, _, _ in batch:
          if not fut.done():
            fut.set_result(_internal(f"code pool client error: {self._describe(e)}"))
        continue
      for node, entries in groups.items():
        await self._sem.acquire()
        self._spawn(self._send(entries, node))

  def _spawn(self, coro) -> None:
    t = asyncio.ensure_future(coro)
    self._tasks.add(t)
    t.add_done_callback(self._tasks.discard)

  def _wire_item(self, item: dict, sid: str | None) -> dict:
    if sid is None:
      return item
    sess = self._sessions[sid]
    wire = dict(item, session_id=sess.wire_id(sid))
    if sess.service_id is not None:
      wire["service_id"] = sess.service_id
    return wire

  async def _post_once(self, node: int, entries: list) -> list[dict]:
    items = [self._wire_item(item, sid) for item, _, _, sid in entries]
    body = {"requests": items}
    if self.queue_timeout_s is not None:
      body["queue_timeout_s"] = self.queue_timeout_s
    url = self.nodes[node].url + "/execute_batch"
    try:
      async with self._session.post(url, json=body, allow_redirects=False) as resp:
        if resp.status >= 500:
          raise _Failed(f"HTTP {resp.status}: {await self._error_text(resp)}", sent=True)
        if resp.status != 200:
          what = "redirected (not followed)" if 300 <= resp.status < 400 else "rejected the batch"
          raise _Failed(
            f"code pool service {what}: HTTP {resp.status}: {await self._error_text(resp)}",
            sent=False,
            retry=False,
            node_fault=False,
          )
        raw = await self._read(resp, self.max_response_bytes, "response (max_response_bytes)")
    except _NOT_SENT as e:
      self.stats["transport_errors"] += 1
      gone = isinstance(getattr(e, "os_error", None), ConnectionRefusedError)
      raise _Failed(self._describe(e), sent=False, gone=gone) from None
    except (TimeoutError, aiohttp.ClientError) as e:
      self.stats["transport_errors"] += 1
      raise _Failed(self._describe(e), sent=True) from None
    try:
      if len(raw) <= _OFF_LOOP_BYTES:
        results, service_id = _decode_results(raw, len(items))
      else:
        loop = asyncio.get_running_loop()
        results, service_id = await loop.run_in_executor(None, _decode_results, raw, len(items))
    except ValueError as e:
      raise _Failed(str(e), sent=True, retry=False, node_fault=False) from None
    if service_id is not None:
      self.nodes[node].service_id = service_id
    return results

  def _session_lost(self, entry, why: str) -> None:
    item, fut, _, sid = entry
    sess = self._sessions.get(sid)
    if sess is not None:
      # The next call on this id opens a fresh session under a new wire id, saying so.
      self._sessions[sid] = _Session(self._pick(), sess.generation + 1)
    self._lost_notes[sid] = why
    while len(self._lost_notes) > 65536:
      self._lost_notes.popitem(last=False)
    self.stats["sessions_lost"] += 1
    if not fut.done():
      fut.set_result(_lost(f"session_lost: {why}"))

  async def _send(self, batch: list, pinned: int | None) -> None:
    pending = list(batch)
    try:
      self.stats["batches"] += 1
      last, node = "", pinned
      for attempt in range(self.max_retries + 1):
        if attempt:
          self.stats["retries"] += 1
          if pinned is None and self.nodes_up:
            self.stats["resent_to_other_node"] += 1  # another node is up: no wait
          else:
            await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        node = pinned if pinned is not None else self._pick()
        try:
          results = await self._post_once(node, pending)
        except _Failed as e:
          if e.node_fault:
            self._node_failed(node, str(e))
          if not e.retry:
            for _, fut, _, _ in pending:
              if not fut.done():
                fut.set_result(_internal(str(e)))
            return
          last = str(e)
          if e.gone and not e.sent:
            # Nothing listens on the session's node: its sessions died with the service (a
            # restarted one would refuse them anyway), so waiting out the retries gains nothing.
            keep = []
            for entry in pending:
              if entry[3] is not None:
                self._session_lost(entry, f"the session's tool node refuses connections ({e})")
              else:
                keep.append(entry)
            pending = keep
            if not pending:
              return
          if e.sent:  # the session calls may have run: never a second time
            keep = []
            for entry in pending:
              if entry[3] is not None:
                self._session_lost(
                  entry,
                  f"the tool node failed during this session call ({e}); it was not re-sent "
                  "since it may have run, and the session's state is unknown",
                )
              else:
                keep.append(entry)
            pending = keep
            if not pending:
              return
          continue
        self._deliver(node, pending, results)
        return
      for entry in pending:
        if entry[3] is not None:
          self._session_lost(entry, f"the session's tool node is unreachable: {last}")
        elif not entry[1].done():
          entry[1].set_result(
            _internal(f"code pool service unreachable after {self.max_retries + 1} tries: {last}")
          )
    except Exception as e:  # a bug or a hostile body: every caller still gets an answer
      log.error("code pool client failed on a batch: %s", self._describe(e))
      for _, fut, _, _ in pending:
        if not fut.done():
          fut.set_result(_internal(f"code pool client error: {self._describe(e)}"))
    finally:
      self._sem.release()

  def _deliver(self, node: int, pending: list, results: list[dict]) -> None:
    for entry, res in zip(pending, results):
      item, fut, tries, sid = entry
      if fut.done():
        continue
      status = res["status"]
      if status == "queue_timeout":
        if tries < self.max_retries:
          self.stats["retries"] += 1
          self._spawn(self._requeue(item, fut, tries + 1, sid))
        else:
          self.stats["queue_timeouts"] += 1
          fut.set_result(
            _internal(
              f"queue_timeout: {self._clean(str(res.get('stderr', '')))} (after {tries + 1} tries)"
            )
          )
        continue
      if status == SESSION_LOST and sid is not None:
        self._session_lost(entry, self._clean(str(res.get("stderr", "")).strip()))
        continue
      if status == "invalid_request":
        fut.set_result(_internal(f"invalid_request: {res.get('stderr', '')}"))
        continue
      stdout, stderr = self._scrub(res["stdout"]), self._scrub(str(res.get("stderr", "")))
      if sid is not None:
        sess = self._sessions.get(sid)
        if sess is not None and sess.node == node and sess.service_id is None:
          sess.service_id = self.nodes[node].service_id
        note = self._lost_notes.pop(sid, None)
        if note is not None:
          stdout = (
            "[session lost earlier (its tool node failed): previous state is lost]\n" + stdout
          )
      try:
        fut.set_result(
          ExecResult(
            status,
            stdout,
            stderr,
            float(res.get("duration_s", 0.0)),
            res.get("exit_code"),
          )
        )
      except (TypeError, ValueError) as e:
        fut.set_result(_internal(f"malformed result from the code pool service: {e}"))

  async def _requeue(self, item, fut, tries, sid) -> None:
    await asyncio.sleep(self.backoff_s * 2 ** (tries - 1))
    await self._queue.put((item, fut, tries, sid))

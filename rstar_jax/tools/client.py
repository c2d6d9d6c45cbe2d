"""HTTP client of the code-pool service with the CodePool `execute`/`execute_many` interface.

Calls are micro-batched (up to `max_batch` calls per request, sent when full or after
`max_wait_s`), retried with exponential backoff on transport errors and on per-item queue
timeouts, and a call that still cannot be placed is surfaced as an internal_error whose stderr
starts with "queue_timeout" (counted in `stats`), never as a hang.

A session call is re-sent only when the request surely never reached the service (the connection
could not be opened): after a 5xx, a dropped connection or a timeout it may have run, so it comes
back as an internal_error saying so instead of running twice. Stateless calls retry on all of
these. A 4xx is never retried. The token (`token`, `token_file`, else the environment variables
of `service_token`) goes in every request as `Authorization: Bearer`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging

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
# The connection never opened: nothing was sent, any call may go again.
_NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)


class _Failed(Exception):
  """One POST gave no results; `sent`: the service may have run the batch."""

  def __init__(self, msg: str, sent: bool, retry: bool = True):
    super().__init__(msg)
    self.sent, self.retry = sent, retry


def _internal(msg: str) -> ExecResult:
  return ExecResult("internal_error", "", msg if msg.endswith("\n") else msg + "\n", 0.0)


def _decode_results(raw: bytes, n: int) -> list[dict]:
  try:
    results = json.loads(raw)["results"]
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"malformed response: {e}") from None
  if not isinstance(results, list) or len(results) != n:
    raise ValueError(f"malformed response: expected {n} results")
  for r in results:
    if not isinstance(r, dict) or not all(isinstance(r.get(k), str) for k in ("status", "stdout")):
      raise ValueError("malformed response: a result is not a {status, stdout, ...} object")
  return results


class CodePoolClient(BatchExecuteMixin):
  def __init__(
    self,
    url: str,
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
  ):
    if max_batch < 1 or concurrency < 1 or max_retries < 0 or max_response_bytes < 1:
      raise ValueError(
        f"need max_batch >= 1, concurrency >= 1, max_retries >= 0, max_response_bytes >= 1; got "
        f"{max_batch}, {concurrency}, {max_retries}, {max_response_bytes}"
      )
    self.url = url.rstrip("/")
    self.max_batch, self.max_wait_s = max_batch, max_wait_s
    self.max_retries, self.backoff_s = max_retries, backoff_s
    self.max_response_bytes = max_response_bytes
    self.request_timeout_s = check_seconds(
      "request_timeout_s", request_timeout_s, MAX_QUEUE_TIMEOUT_S
    )
    self.queue_timeout_s = (
      None
      if queue_timeout_s is None
      else check_seconds("queue_timeout_s", queue_timeout_s, MAX_QUEUE_TIMEOUT_S, allow_zero=True)
    )
    tok = client_token(token, token_file)
    self._headers = {} if tok is None else {"Authorization": f"Bearer {tok}"}
    self._sem = asyncio.Semaphore(concurrency)
    self._queue: asyncio.Queue | None = None
    self._session: aiohttp.ClientSession | None = None
    self._batcher: asyncio.Task | None = None
    self._tasks: set = set()
    self._futures: set = set()
    self._closed = False
    self.stats = {"batches": 0, "retries": 0, "queue_timeouts": 0, "transport_errors": 0}

  async def start(self) -> CodePoolClient:
    self._session = aiohttp.ClientSession(
      timeout=aiohttp.ClientTimeout(total=self.request_timeout_s), headers=self._headers
    )
    self._queue = asyncio.Queue()
    self._batcher = asyncio.create_task(self._batch_loop())
    return self

  async def close(self) -> None:
    """Stops the client; every call still waiting (queued, batched, in flight, waiting to be
    re-sent) resolves to an internal_error: `_futures` holds them all, wherever they are."""
    self._closed = True
    if self._batcher is not None:
      self._batcher.cancel()
    for t in list(self._tasks):
      t.cancel()
    if self._tasks:
      await asyncio.wait(list(self._tasks), timeout=5)
    for fut in list(self._futures):
      if not fut.done():
        fut.set_result(_internal("code pool client closed before the call finished"))
    if self._session is not None:
      await self._session.close()

  async def __aenter__(self):
    return await self.start()

  async def __aexit__(self, *exc):
    await self.close()

  async def health(self) -> dict:
    async with self._session.get(self.url + "/health") as resp:
      resp.raise_for_status()
      return await resp.json()

  async def execute(
    self,
    code: str,
    stdin: str | bytes = "",
    timeout_s: float | None = None,
    session_id: str | None = None,
  ) -> ExecResult:
    if self._queue is None or self._closed:
      raise RuntimeError("CodePoolClient is not running: use `async with CodePoolClient(url)`")
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
      item["session_id"] = check_session_id("session_id", session_id)
    fut = asyncio.get_running_loop().create_future()
    self._futures.add(fut)
    fut.add_done_callback(self._futures.discard)
    await self._queue.put((item, fut, 0))
    return await fut

  async def close_session(self, session_id: str) -> bool:
    if self._session is None or self._closed:
      raise RuntimeError("CodePoolClient is not running: use `async with CodePoolClient(url)`")
    check_session_id("session_id", session_id)
    async with self._session.post(
      self.url + "/close_session", json={"session_id": session_id}
    ) as resp:
      if resp.status != 200:
        raise ValueError(
          f"code pool service refused close_session: HTTP {resp.status}: "
          f"{(await resp.text())[:300]}"
        )
      return bool((await resp.json())["closed"])

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
      await self._sem.acquire()
      self._spawn(self._send(batch))

  def _spawn(self, coro) -> None:
    t = asyncio.ensure_future(coro)
    self._tasks.add(t)
    t.add_done_callback(self._tasks.discard)

  async def _read(self, resp: aiohttp.ClientResponse) -> bytes:
    limit = self.max_response_bytes
    if resp.content_length is not None and resp.content_length > limit:
      raise _Failed(f"response of {resp.content_length} bytes over max_response_bytes", True, False)
    chunks, n = [], 0
    async for chunk in resp.content.iter_any():
      n += len(chunk)
      if n > limit:
        raise _Failed(f"response over max_response_bytes={limit}", True, False)
      chunks.append(chunk)
    return b"".join(chunks)

  async def _post_once(self, items: list[dict]) -> list[dict]:
    body = {"requests": items}
    if self.queue_timeout_s is not None:
      body["queue_timeout_s"] = self.queue_timeout_s
    try:
      async with self._session.post(self.url + "/execute_batch", json=body) as resp:
        if resp.status >= 500:
          raise _Failed(f"HTTP {resp.status}: {(await resp.text())[:200]}", sent=True)
        if resp.status != 200:
          raise _Failed(
            f"code pool service rejected the batch: HTTP {resp.status}: "
            f"{(await resp.text())[:500]}",
            sent=False,
            retry=False,
          )
        raw = await self._read(resp)
    except _NOT_SENT as e:
      self.stats["transport_errors"] += 1
      raise _Failed(repr(e), sent=False) from None
    except (TimeoutError, aiohttp.ClientError) as e:
      self.stats["transport_errors"] += 1
      raise _Failed(repr(e), sent=True) from None
    try:
      if len(raw) <= _OFF_LOOP_BYTES:
        return _decode_results(raw, len(items))
      loop = asyncio.get_running_loop()
      return await loop.run_in_executor(None, _decode_results, raw, len(items))
    except ValueError as e:
      raise _Failed(str(e), sent=True, retry=False) from None

  async def _send(self, batch: list) -> None:
    try:
      self.stats["batches"] += 1
      pending = list(batch)
      for attempt in range(self.max_retries + 1):
        if attempt:
          self.stats["retries"] += 1
          await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        try:
          results = await self._post_once([item for item, _, _ in pending])
        except _Failed as e:
          if not e.retry:
            for _, fut, _ in pending:
              if not fut.done():
                fut.set_result(_internal(str(e)))
            return
          last = str(e)
          if e.sent:  # the session calls may have run: never a second time
            keep = []
            for entry in pending:
              if "session_id" in entry[0]:
                if not entry[1].done():
                  entry[1].set_result(
                    _internal(
                      f"code pool service failed during a session call ({e}); not re-sent "
                      "since it may have run: the session's state is unknown"
                    )
                  )
              else:
                keep.append(entry)
            pending = keep
            if not pending:
              return
          continue
        self._deliver(pending, results)
        return
      for _, fut, _ in pending:
        if not fut.done():
          fut.set_result(
            _internal(f"code pool service unreachable after {self.max_retries + 1} tries: {last}")
          )
    finally:
      self._sem.release()

  def _deliver(self, pending: list, results: list[dict]) -> None:
    for (item, fut, tries), res in zip(pending, results):
      if fut.done():
        continue
      if res["status"] == "queue_timeout":
        if tries < self.max_retries:
          self.stats["retries"] += 1
          self._spawn(self._requeue(item, fut, tries + 1))
        else:
          self.stats["queue_timeouts"] += 1
          fut.set_result(
            _internal(f"queue_timeout: {res.get('stderr', '')} (after {tries + 1} tries)")
          )
        continue
      if res["status"] == "invalid_request":
        fut.set_result(_internal(f"invalid_request: {res.get('stderr', '')}"))
        continue
      try:
        fut.set_result(
          ExecResult(
            res["status"],
            res["stdout"],
            str(res.get("stderr", "")),
            float(res.get("duration_s", 0.0)),
            res.get("exit_code"),
          )
        )
      except (TypeError, ValueError) as e:
        fut.set_result(_internal(f"malformed result from the code pool service: {e}"))

  async def _requeue(self, item, fut, tries) -> None:
    await asyncio.sleep(self.backoff_s * 2 ** (tries - 1))
    await self._queue.put((item, fut, tries))

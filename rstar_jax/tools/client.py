"""HTTP client of the code-pool service with the CodePool `execute`/`execute_many` interface.

Calls are micro-batched (up to `max_batch` calls per request, sent when full or after
`max_wait_s`), retried with exponential backoff on transport errors and on per-item queue
timeouts, and a call that still cannot be placed is surfaced as an internal_error whose stderr
starts with "queue_timeout" (counted in `stats`), never as a hang.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from rstar_jax.tools.code_pool import (
  MAX_QUEUE_TIMEOUT_S,
  MAX_TIMEOUT_S,
  BatchExecuteMixin,
  ExecResult,
  check_seconds,
)

log = logging.getLogger(__name__)


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
  ):
    if max_batch < 1 or concurrency < 1 or max_retries < 0:
      raise ValueError(
        f"need max_batch >= 1, concurrency >= 1, max_retries >= 0; got "
        f"{max_batch}, {concurrency}, {max_retries}"
      )
    self.url = url.rstrip("/")
    self.max_batch, self.max_wait_s = max_batch, max_wait_s
    self.max_retries, self.backoff_s = max_retries, backoff_s
    self.request_timeout_s = check_seconds(
      "request_timeout_s", request_timeout_s, MAX_QUEUE_TIMEOUT_S
    )
    self.queue_timeout_s = (
      None
      if queue_timeout_s is None
      else check_seconds("queue_timeout_s", queue_timeout_s, MAX_QUEUE_TIMEOUT_S, allow_zero=True)
    )
    self._sem = asyncio.Semaphore(concurrency)
    self._queue: asyncio.Queue | None = None
    self._session: aiohttp.ClientSession | None = None
    self._batcher: asyncio.Task | None = None
    self._tasks: set = set()
    self.stats = {"batches": 0, "retries": 0, "queue_timeouts": 0, "transport_errors": 0}

  async def start(self) -> CodePoolClient:
    self._session = aiohttp.ClientSession(
      timeout=aiohttp.ClientTimeout(total=self.request_timeout_s)
    )
    self._queue = asyncio.Queue()
    self._batcher = asyncio.create_task(self._batch_loop())
    return self

  async def close(self) -> None:
    if self._batcher is not None:
      self._batcher.cancel()
    for t in list(self._tasks):
      t.cancel()
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
    stdin: str = "",
    timeout_s: float | None = None,
    session_id: str | None = None,
  ) -> ExecResult:
    if self._queue is None:
      raise RuntimeError("CodePoolClient is not started: use `async with CodePoolClient(url)`")
    if not isinstance(code, str):
      raise TypeError(f"code must be str, got {type(code).__name__}")
    fut = asyncio.get_running_loop().create_future()
    item = {"code": code, "stdin": stdin}
    if timeout_s is not None:  # same bounds as the pool: refused here, not as a batch's 400
      item["timeout_s"] = check_seconds("timeout_s", timeout_s, MAX_TIMEOUT_S)
    if session_id is not None:
      item["session_id"] = str(session_id)
    await self._queue.put((item, fut, 0))
    return await fut

  async def close_session(self, session_id: str) -> bool:
    async with self._session.post(
      self.url + "/close_session", json={"session_id": str(session_id)}
    ) as resp:
      resp.raise_for_status()
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

  async def _post(self, items: list[dict]) -> list[dict]:
    body = {"requests": items}
    if self.queue_timeout_s is not None:
      body["queue_timeout_s"] = self.queue_timeout_s
    last = None
    for attempt in range(self.max_retries + 1):
      if attempt:
        self.stats["retries"] += 1
        await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
      try:
        async with self._session.post(self.url + "/execute_batch", json=body) as resp:
          if resp.status >= 500:
            last = f"HTTP {resp.status}: {(await resp.text())[:200]}"
            continue
          if resp.status != 200:
            raise ValueError(
              f"code pool service rejected the batch: HTTP {resp.status}: "
              f"{(await resp.text())[:500]}"
            )
          return (await resp.json())["results"]
      except (TimeoutError, aiohttp.ClientError) as e:
        self.stats["transport_errors"] += 1
        last = repr(e)
    raise ConnectionError(
      f"code pool service unreachable after {self.max_retries + 1} tries: {last}"
    )

  async def _send(self, batch: list) -> None:
    try:
      self.stats["batches"] += 1
      try:
        results = await self._post([item for item, _, _ in batch])
      except (ConnectionError, ValueError) as e:
        for _, fut, _ in batch:
          if not fut.done():
            fut.set_result(ExecResult("internal_error", "", f"{e}\n", 0.0))
        return
      for (item, fut, tries), res in zip(batch, results):
        if fut.done():
          continue
        if res["status"] == "queue_timeout":
          if tries < self.max_retries:
            self.stats["retries"] += 1
            self._spawn(self._requeue(item, fut, tries + 1))
          else:
            self.stats["queue_timeouts"] += 1
            fut.set_result(
              ExecResult(
                "internal_error",
                "",
                f"queue_timeout: {res['stderr']} (after {tries + 1} tries)\n",
                0.0,
              )
            )
          continue
        fut.set_result(
          ExecResult(
            res["status"],
            res["stdout"],
            res["stderr"],
            float(res["duration_s"]),
            res.get("exit_code"),
          )
        )
    finally:
      self._sem.release()

  async def _requeue(self, item, fut, tries) -> None:
    await asyncio.sleep(self.backoff_s * 2 ** (tries - 1))
    await self._queue.put((item, fut, tries))

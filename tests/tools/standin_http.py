"""A hostile or broken stand-in for the code-pool service, on 127.0.0.1 only (raw asyncio, so it
says exactly what it is told: no framework tidies its answers up). Importable helper."""

import asyncio
import json

BIG = 32 << 20  # bytes of a hostile error body


class StandIn:
  """`mode` (may be changed while it runs):
  "big500":    500 with a 32 MiB body streamed without Content-Length, then close
  "big500_cl": 500 declaring Content-Length: 32 MiB
  "deep":      200 whose JSON nests `depth` lists deep
  "redirect":  302 back to the same path (a loop)
  "echo401" / "echo500": 401 / 500 whose body quotes the request headers (a credential too)
  "echo200":   200 whose results quote the request headers in stdout and stderr
  "hang":      reads the request, never answers
  "500":       500 "boom" on every path (a node failing forever)
  "ok":        a healthy service: /health ok, every item answered "from stand-in"
  `requests`: (method, path, parsed JSON body or None) of every request read; `sent`: bytes of
  body written per big response once its connection ended."""

  def __init__(self, mode: str, depth: int = 100_000):
    self.mode, self.depth = mode, depth
    self.requests: list = []
    self.sent: list[int] = []
    self._conns: set = set()
    self._tasks: set = set()

  async def __aenter__(self):
    self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
    self.port = self.server.sockets[0].getsockname()[1]
    self.url = f"http://127.0.0.1:{self.port}"
    return self

  async def __aexit__(self, *exc):
    self.server.close()
    for w in list(self._conns):
      w.transport.abort()
    for t in list(self._tasks):
      t.cancel()
    await asyncio.gather(*self._tasks, return_exceptions=True)
    await self.server.wait_closed()

  async def _read_request(self, reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for ln in lines[1:]:
      if ":" in ln:
        k, v = ln.split(":", 1)
        headers[k.strip().lower()] = v.strip()
    raw = await reader.readexactly(int(headers.get("content-length", "0")))
    try:
      body = json.loads(raw) if raw else None
    except ValueError:
      body = None
    return method, path, headers, body

  async def _serve(self, reader, writer):
    self._conns.add(writer)
    self._tasks.add(asyncio.current_task())
    try:
      while True:
        try:
          method, path, headers, body = await self._read_request(reader)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
          return
        self.requests.append((method, path, body))
        if not await self._answer(writer, path, headers, body):
          return
    finally:
      self._tasks.discard(asyncio.current_task())
      self._conns.discard(writer)
      writer.transport.abort()

  async def _send(self, writer, status, body: bytes, extra: str = "") -> bool:
    writer.write(
      f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
      f"{extra}\r\n".encode()
      + body
    )
    await writer.drain()
    return True

  async def _answer(self, writer, path, headers, body) -> bool:
    mode = self.mode
    if mode == "hang":
      await asyncio.Event().wait()
    if mode in ("big500", "big500_cl"):
      length = f"Content-Length: {BIG}\r\n" if mode == "big500_cl" else "Connection: close\r\n"
      writer.write(f"HTTP/1.1 500 X\r\nContent-Type: text/plain\r\n{length}\r\n".encode())
      chunk, n = b"e" * (1 << 16), 0
      try:
        while n < BIG:
          writer.write(chunk)
          await writer.drain()
          n += len(chunk)
      except (ConnectionError, RuntimeError):
        pass
      self.sent.append(n)
      return False
    if mode == "deep":
      nest = b"[" * self.depth + b"]" * self.depth
      return await self._send(writer, 200, b'{"results": ' + nest + b"}")
    if mode == "redirect":
      return await self._send(writer, 302, b"", f"Location: {path}\r\n")
    if mode in ("echo401", "echo500"):
      return await self._send(writer, int(mode[4:]), json.dumps(headers).encode())
    if mode == "echo200":  # "results" that quote the request headers
      n = len((body or {}).get("requests", []))
      r = {"status": "ok", "stdout": json.dumps(headers), "stderr": json.dumps(headers)}
      return await self._send(
        writer, 200, json.dumps({"results": [r] * n, "closed": True}).encode()
      )
    if mode == "500":
      return await self._send(writer, 500, b'{"error": "boom"}')
    if mode == "ok":
      if path == "/health":
        return await self._send(writer, 200, json.dumps({"ok": True}).encode())
      n = len((body or {}).get("requests", []))
      out = [{"status": "ok", "stdout": "from stand-in\n", "stderr": ""}] * n
      return await self._send(writer, 200, json.dumps({"results": out}).encode())
    raise ValueError(f"unknown mode {mode!r}")

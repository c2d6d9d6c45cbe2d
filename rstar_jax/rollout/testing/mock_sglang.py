"""A mock SGLang HTTP server (aiohttp, 127.0.0.1 only) implementing the subset rstar_jax uses.

Endpoints (SPEC Part II, MACHINE_NOTES §6): POST /generate, POST /update_weights_from_disk,
GET /get_weight_version, GET /get_server_info (+ /server_info), GET /get_load, GET /health,
POST /abort_request, POST /pause_generation {mode}, POST /continue_generation. The "model" is a deterministic function of the token history, so tests
can predict outputs; generation proceeds one token per `token_delay_s` so aborts and timeouts
cut it mid-way. `update_weights_from_disk` really loads every safetensors file of the directory
(checking the index when there is one) and keeps the tensors, proving the pushed dir complete.

Fault injection: `fail_next(path, n, status=500)`, `generate_delay_s`, `healthy = False`,
`hang_next_generate(n)` (sleep far past any client timeout).
"""
from __future__ import annotations

import asyncio
import json
import math
import os
from typing import Any, Optional

from aiohttp import web


def mock_next_token(ids: list[int], vocab_size: int) -> int:
    """The mock model: next id from the last three ids (deterministic)."""
    tail = ids[-3:]
    return (sum((i + 1) * t for i, t in enumerate(tail)) * 31 + 7 * len(ids)) % vocab_size


def mock_logprob(ids: list[int], token: int) -> float:
    return -((token + len(ids)) % 17) / 10.0 - 0.05


class MockSGLangServer:
    def __init__(self, vocab_size: int = 256, max_total_num_tokens: int = 4096,
                 token_delay_s: float = 0.0, weight_version: str = "0"):
        self.vocab_size = vocab_size
        self.max_total_num_tokens = max_total_num_tokens
        self.token_delay_s = token_delay_s
        self.weight_version = weight_version
        self.generate_delay_s = 0.0
        self.external_tokens = 0                # KV tokens held by "other clients" (/get_load)
        self.healthy = True
        self.loaded: dict[str, Any] = {}        # tensors of the last update_weights_from_disk
        self.model_path: Optional[str] = None
        self.requests: list[dict] = []          # every /generate body
        self.aborted: list[str] = []
        self.weight_updates: list[dict] = []
        self._faults: dict[str, list[int]] = {}
        self._hang = 0
        self._running: dict[str, dict] = {}     # rid -> {"abort": bool, "tokens": int}
        self._runner: Optional[web.AppRunner] = None
        self._closing = False
        self.url = ""

    # ------------------------------------------------------------------ control
    def fail_next(self, path: str, n: int = 1, status: int = 500) -> None:
        self._faults.setdefault(path, []).extend([status] * n)

    def hang_next_generate(self, n: int = 1) -> None:
        self._hang += n

    async def start(self) -> "MockSGLangServer":
        app = web.Application()
        r = app.router
        r.add_post("/generate", self._generate)
        r.add_post("/update_weights_from_disk", self._update)
        r.add_get("/get_weight_version", self._weight_version)
        r.add_get("/get_server_info", self._server_info)
        r.add_get("/server_info", self._server_info)
        r.add_get("/get_load", self._load)
        r.add_get("/health", self._health)
        r.add_get("/health_generate", self._health)
        r.add_post("/abort_request", self._abort)
        self._add_pause_routes(r)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        self._closing = True
        for state in self._running.values():
            state["abort"] = True
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.close()

    # ------------------------------------------------------------------ pause / continue
    # SGLang's tokenizer manager: "abort" aborts every running request and returns once they
    # have all answered; other modes park running requests. New /generate requests wait while
    # paused. /continue_generation ends the pause.
    paused_mode: Optional[str] = None
    pause_calls: int = 0

    def _add_pause_routes(self, r) -> None:
        r.add_post("/pause_generation", self._pause)
        r.add_post("/continue_generation", self._continue)

    async def _wait_while_paused(self, state: dict) -> None:
        while self.paused_mode is not None and not state["abort"] and not self._closing:
            await asyncio.sleep(0.002)

    async def _pause(self, request):
        body = await request.json() if request.can_read_body else {}
        mode = (body or {}).get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return web.json_response({"error": f"Invalid mode: {mode!r}"}, status=400)
        self.paused_mode = mode
        self.pause_calls += 1
        if mode == "abort":
            for rid, st in list(self._running.items()):
                st["abort"] = True
                self.aborted.append(rid)
            while self._running and not self._closing:   # drained, as SGLang waits for it
                await asyncio.sleep(0.002)
        return web.json_response({"success": True})

    async def _continue(self, request):
        self.paused_mode = None
        return web.json_response({"success": True})

    def _fault(self, path: str) -> Optional[web.Response]:
        q = self._faults.get(path)
        if q:
            return web.json_response({"error": "injected fault"}, status=q.pop(0))
        return None

    # ------------------------------------------------------------------ handlers
    async def _generate(self, request: web.Request) -> web.Response:
        if (f := self._fault("/generate")) is not None:
            return f
        body = await request.json()
        self.requests.append(body)
        ids = body.get("input_ids")
        sp = body.get("sampling_params") or {}
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            return web.json_response({"error": "input_ids must be a list of int"}, status=400)
        while self.paused_mode is not None and not self._closing:   # held at the door
            await asyncio.sleep(0.002)
        rid = body.get("rid") or f"auto{len(self.requests)}"
        max_new = int(sp.get("max_new_tokens", 128))
        stops = set(sp.get("stop_token_ids") or ())
        state = self._running[rid] = {"abort": False, "tokens": len(ids)}
        out: list[int] = []
        lps: list[float] = []
        finish: dict = {"type": "length", "length": max_new}
        try:
            if self._hang > 0:  # stuck until aborted or the server closes
                self._hang -= 1
                while not state["abort"] and not self._closing:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(self.generate_delay_s)
            hist = list(ids)
            while len(out) < max_new:
                await self._wait_while_paused(state)
                if state["abort"]:
                    finish = {"type": "abort", "message": "Abort in waiting queue",
                              "status_code": 200, "err_type": None}
                    break
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                tok = mock_next_token(hist, self.vocab_size)
                lps.append(mock_logprob(hist, tok))
                out.append(tok)
                hist.append(tok)
                state["tokens"] += 1
                if tok in stops:
                    finish = {"type": "stop", "matched": tok}
                    break
        finally:
            if self._running.get(rid) is state:
                del self._running[rid]
        meta = {"id": rid, "finish_reason": finish, "prompt_tokens": len(ids),
                "completion_tokens": len(out), "cached_tokens": 0,
                "weight_version": self.weight_version}
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(lps, out)]
        return web.json_response({"output_ids": out, "meta_info": meta})

    async def _update(self, request: web.Request) -> web.Response:
        if (f := self._fault("/update_weights_from_disk")) is not None:
            return f
        body = await request.json()
        self.weight_updates.append(body)
        path = body.get("model_path")
        try:
            tensors = await asyncio.to_thread(_load_hf_dir, path)
        except Exception as e:  # noqa: BLE001 - reported the way SGLang does
            return web.json_response({"success": False, "message": f"{type(e).__name__}: {e}",
                                      "num_paused_requests": 0}, status=400)
        self.loaded, self.model_path = tensors, path
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return web.json_response({"success": True, "message": "Succeeded to update model weights.",
                                  "num_paused_requests": 0})

    async def _weight_version(self, request):
        if (f := self._fault("/get_weight_version")) is not None:
            return f
        return web.json_response({"weight_version": self.weight_version})

    async def _server_info(self, request):
        if (f := self._fault("/get_server_info")) is not None:
            return f
        return web.json_response({"model_path": self.model_path, "weight_version": self.weight_version,
                                  "max_total_num_tokens": self.max_total_num_tokens,
                                  "internal_states": [{"max_total_num_tokens": self.max_total_num_tokens}]})

    async def _load(self, request):
        if (f := self._fault("/get_load")) is not None:
            return f
        used = sum(s["tokens"] for s in self._running.values()) + self.external_tokens
        return web.json_response({"num_running_reqs": len(self._running), "num_waiting_reqs": 0,
                                  "num_tokens": used,
                                  "token_usage": used / max(1, self.max_total_num_tokens)})

    async def _health(self, request):
        if (f := self._fault("/health")) is not None:
            return f
        return web.Response(status=200 if self.healthy else 503)

    async def _abort(self, request):
        body = await request.json()
        if body.get("abort_all"):
            targets = list(self._running)
        else:
            targets = [body.get("rid", "")]
        for rid in targets:
            self.aborted.append(rid)
            if rid in self._running:
                self._running[rid]["abort"] = True
        return web.Response(status=200)


def _load_hf_dir(path: str) -> dict:
    """Loads config.json and every safetensors shard; checks the index covers all tensors."""
    from safetensors.numpy import load_file
    if not path or not os.path.isdir(path):
        raise FileNotFoundError(f"model_path {path!r} is not a directory")
    with open(os.path.join(path, "config.json")) as f:
        json.load(f)
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors")
    tensors: dict = {}
    for name in files:
        tensors.update(load_file(os.path.join(path, name)))
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            wm = json.load(f)["weight_map"]
        missing = sorted(set(wm) - set(tensors))
        if missing:
            raise KeyError(f"{path}: index names tensors missing from the shards: {missing[:5]}")
    if any(not math.isfinite(float(abs(v).max())) for v in tensors.values() if v.size):
        raise ValueError(f"{path}: non-finite weights")
    return tensors

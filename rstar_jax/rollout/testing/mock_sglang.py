"""A mock SGLang HTTP server (aiohttp, 127.0.0.1 only) implementing the subset rstar_jax uses.

Endpoints (SGLang's HTTP server, ``srt/entrypoints/http_server.py``): POST /generate, POST /update_weights_from_disk,
GET /get_weight_version, GET /get_server_info (+ /server_info), GET /get_load, GET /health,
POST /abort_request, POST /pause_generation {mode}, POST /continue_generation. The "model" is a deterministic function of the token history, so tests
can predict outputs; generation proceeds one token per `token_delay_s` so aborts and timeouts
cut it mid-way. `update_weights_from_disk` really loads every safetensors file of the directory
(checking the index when there is one) and keeps the tensors, proving the pushed dir complete.

Weight transfer, with SGLang's argument names (``srt/managers/io_struct.py``):
POST /update_weights_from_tensor (``serialized_named_tensors`` deserialised with torch's
multiprocessing reductions, ``load_format`` None | "direct" | "flattened_bucket"),
/init_weights_update_group + /update_weights_from_distributed + /destroy_weights_update_group
(the stand-in joins a real gloo group as rank ``rank_offset`` and receives the broadcasts),
/update_weight_version, /release_memory_occupation, /resume_memory_occupation. Received tensors
are kept in ``weights`` (HF name -> numpy array, bf16 as ml_dtypes bf16), merged per update as
SGLang's ``load_weights`` does, so tests compare them byte for byte with the learner's params.

LoRA (SGLang's ``LoadLoRAAdapterReqInput`` / ``UnloadLoRAAdapterReqInput``, replies
``LoRAUpdateOutput`` {success, error_message, loaded_adapters}): POST /load_lora_adapter
{lora_name, lora_path, pinned} reads the PEFT directory (adapter_config.json +
adapter_model.safetensors) into ``loras``; POST /unload_lora_adapter {lora_name}; /generate
with ``lora_path`` must name a loaded adapter (HTTP 400 otherwise, as SGLang's registry
refuses an unknown name). ``effective_weights(name)`` gives the weights a request with that
adapter runs with (W + alpha/r * B @ A), for comparison with the learner's merged params.

Fault injection: `fail_next(path, n, status=500, skip=0)` (the call after `skip` good ones
fails), `generate_delay_s`, `healthy = False`, `hang_next_generate(n)` (sleep far past any client
timeout), `die_on_distributed_call = k` (the process exits on its k-th distributed update, as a
killed group member), `broken_status = 500` (every endpoint answers that status, /health
included: a server failing forever), `frozen = True` (every request, /health included, waits
until it is unfrozen: a hung server). `logprob_shift` shifts this server's log-probs (tests tell
which server produced a turn). `events` lists the paths served, in order. `script_ids`: a turn
(e.g. a tool call ending in the stop id) emitted before the model's tokens whenever the request's
input ids do not hold it yet, so an agent loop calls its tool once per trajectory.
`python -m rstar_jax.rollout.testing.mock_sglang --port-file F [--port P]` runs one in its own
process (kill -9 / SIGSTOP it; restart it on the same port).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from typing import Any

from aiohttp import web

from rstar_jax.rollout.weight_transfer import buckets, process_group, tensor


def mock_next_token(ids: list[int], vocab_size: int) -> int:
  """The mock model: next id from the last three ids (deterministic)."""
  tail = ids[-3:]
  return (sum((i + 1) * t for i, t in enumerate(tail)) * 31 + 7 * len(ids)) % vocab_size


def _holds(ids: list[int], part: list[int]) -> bool:
  """Whether ``part`` occurs in ``ids`` as a contiguous run (an empty part: always)."""
  n = len(part)
  return any(ids[i : i + n] == part for i in range(len(ids) - n + 1)) if n else True


def mock_logprob(ids: list[int], token: int, shift: float = 0.0) -> float:
  return -((token + len(ids)) % 17) / 10.0 - 0.05 - shift


class MockSGLangServer:
  def __init__(
    self,
    vocab_size: int = 256,
    max_total_num_tokens: int = 4096,
    token_delay_s: float = 0.0,
    weight_version: str = "0",
    logprob_shift: float = 0.0,
    seeded: bool = False,
    script_ids: tuple[int, ...] = (),
  ):
    self.script_ids = [int(t) for t in script_ids]
    self.seeded = bool(seeded)  # sampling_seed changes the tokens (distinct group samples)
    self.vocab_size = vocab_size
    self.logprob_shift = float(logprob_shift)
    self.broken_status: int | None = None
    self.frozen = False
    self.events: list[str] = []
    self.max_total_num_tokens = max_total_num_tokens
    self.token_delay_s = token_delay_s
    self.weight_version = weight_version
    self.generate_delay_s = 0.0
    self.external_tokens = 0  # KV tokens held by "other clients" (/get_load)
    self.healthy = True
    self.loaded: dict[str, Any] = {}  # tensors of the last update_weights_from_disk
    self.model_path: str | None = None
    self.requests: list[dict] = []  # every /generate body
    self.aborted: list[str] = []
    self.weight_updates: list[dict] = []
    self.weights: dict[str, Any] = {}  # every tensor received so far (HF names)
    self.loras: dict[str, dict] = {}  # loaded LoRA adapters: name -> {path, config, tensors}
    self.lora_calls: list[tuple[str, dict]] = []  # ("load" | "unload", body)
    self.memory_events: list[tuple] = []  # ("release" | "resume", tags)
    self.memory_released: set = set()
    self.die_on_distributed_call = 0
    self.check_finite = True  # disk loads: reject non-finite weights
    self._dist_calls = 0
    self._groups: dict[str, Any] = {}
    self._faults: dict[str, list[int]] = {}
    self._hang = 0
    self._running: dict[str, dict] = {}  # rid -> {"abort": bool, "tokens": int}
    self._runner: web.AppRunner | None = None
    self._closing = False
    self.url = ""

  # ------------------------------------------------------------------ control
  def fail_next(self, path: str, n: int = 1, status: int = 500, skip: int = 0) -> None:
    self._faults.setdefault(path, []).extend([None] * skip + [status] * n)

  def hang_next_generate(self, n: int = 1) -> None:
    self._hang += n

  @web.middleware
  async def _faults_middleware(self, request, handler):
    self.events.append(request.path)
    while self.frozen and not self._closing:
      await asyncio.sleep(0.01)
    if self.broken_status is not None:
      return web.json_response({"error": "injected: broken server"}, status=self.broken_status)
    return await handler(request)

  async def start(self, port: int = 0) -> MockSGLangServer:
    app = web.Application(middlewares=[self._faults_middleware])
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
    r.add_post("/update_weights_from_tensor", self._update_tensor)
    r.add_post("/init_weights_update_group", self._init_group)
    r.add_post("/update_weights_from_distributed", self._update_distributed)
    r.add_post("/destroy_weights_update_group", self._destroy_group)
    r.add_post("/update_weight_version", self._update_version)
    r.add_post("/load_lora_adapter", self._load_lora)
    r.add_post("/unload_lora_adapter", self._unload_lora)
    for path in ("/release_memory_occupation", "/resume_memory_occupation"):
      r.add_post(path, self._memory)
      r.add_get(path, self._memory)
    self._add_pause_routes(r)
    self._runner = web.AppRunner(app)
    await self._runner.setup()
    site = web.TCPSite(self._runner, "127.0.0.1", int(port), reuse_address=True)
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
  paused_mode: str | None = None
  pause_calls: int = 0

  def _add_pause_routes(self, r) -> None:
    r.add_post("/pause_generation", self._pause)
    r.add_post("/continue_generation", self._continue)

  async def _wait_while_paused(self, state: dict) -> None:
    while (
      (self.paused_mode is not None or self.frozen) and not state["abort"] and not self._closing
    ):
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
      while self._running and not self._closing:  # drained, as SGLang waits for it
        await asyncio.sleep(0.002)
    return web.json_response({"success": True})

  async def _continue(self, request):
    self.paused_mode = None
    return web.json_response({"success": True})

  def _fault(self, path: str) -> web.Response | None:
    q = self._faults.get(path)
    if q:
      status = q.pop(0)
      if status is not None:
        return web.json_response(
          {"success": False, "message": "injected fault", "error": "injected fault"}, status=status
        )
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
    lora_path = body.get("lora_path")
    if lora_path is not None and lora_path not in self.loras:
      return web.json_response(
        {"error": {"message": f"LoRA adapter {lora_path!r} is not loaded"}}, status=400
      )
    while self.paused_mode is not None and not self._closing:  # held at the door
      await asyncio.sleep(0.002)
    rid = body.get("rid") or f"auto{len(self.requests)}"
    max_new = int(sp.get("max_new_tokens", 128))
    # Seeded: the seed shifts every token, so every server gives the same output for the same
    # (prompt, seed) and different seeds give different samples.
    salt = int(sp.get("sampling_seed", 0)) % self.vocab_size if self.seeded else 0
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
      script = [] if _holds(ids, self.script_ids) else self.script_ids
      while len(out) < max_new:
        await self._wait_while_paused(state)
        if state["abort"]:
          finish = {
            "type": "abort",
            "message": "Abort in waiting queue",
            "status_code": 200,
            "err_type": None,
          }
          break
        if self.token_delay_s:
          await asyncio.sleep(self.token_delay_s)
        if len(out) < len(script):
          tok = script[len(out)]
        else:
          tok = (mock_next_token(hist, self.vocab_size) + salt) % self.vocab_size
        lps.append(mock_logprob(hist, tok, self.logprob_shift))
        out.append(tok)
        hist.append(tok)
        state["tokens"] += 1
        if tok in stops:
          finish = {"type": "stop", "matched": tok}
          break
    finally:
      if self._running.get(rid) is state:
        del self._running[rid]
    meta = {
      "id": rid,
      "finish_reason": finish,
      "prompt_tokens": len(ids),
      "completion_tokens": len(out),
      "cached_tokens": 0,
      "weight_version": self.weight_version,
    }
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
      tensors = await asyncio.to_thread(_load_hf_dir, path, self.check_finite)
    except Exception as e:  # noqa: BLE001 - reported the way SGLang does
      return web.json_response(
        {"success": False, "message": f"{type(e).__name__}: {e}", "num_paused_requests": 0},
        status=400,
      )
    self.loaded, self.model_path = tensors, path
    self.weights.update(tensors)
    if body.get("weight_version") is not None:
      self.weight_version = str(body["weight_version"])
    return web.json_response(
      {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
    )

  def _ok(self, body: dict, message: str = "Succeeded to update model weights."):
    if body.get("weight_version") is not None:
      self.weight_version = str(body["weight_version"])
    return web.json_response({"success": True, "message": message})

  @staticmethod
  def _failed(e: BaseException) -> web.Response:
    return web.json_response({"success": False, "message": f"{type(e).__name__}: {e}"}, status=400)

  async def _update_tensor(self, request: web.Request) -> web.Response:
    if (f := self._fault("/update_weights_from_tensor")) is not None:
      return f
    body = await request.json()
    self.weight_updates.append({k: v for k, v in body.items() if k != "serialized_named_tensors"})
    try:
      payloads = body["serialized_named_tensors"]
      if not isinstance(payloads, list) or not payloads:
        raise ValueError("serialized_named_tensors: expected one payload per TP rank")
      got = await asyncio.to_thread(_receive_tensor_payload, payloads[0], body.get("load_format"))
    except Exception as e:  # noqa: BLE001 - SGLang answers 400 with the message
      return self._failed(e)
    self.weights.update(got)
    return self._ok(body)

  async def _init_group(self, request: web.Request) -> web.Response:
    body = await request.json()
    try:
      name = body.get("group_name", "weight_update_group")
      group = await asyncio.to_thread(
        process_group.open_group,
        body["master_address"],
        int(body["master_port"]),
        int(body["rank_offset"]),
        int(body["world_size"]),
        name,
        body.get("backend", "nccl"),
        float(body.get("timeout_s", 60.0)),
      )
    except Exception as e:  # noqa: BLE001
      return self._failed(e)
    self._groups[name] = group
    return web.json_response({"success": True, "message": "Succeeded to initialize group."})

  async def _update_distributed(self, request: web.Request) -> web.Response:
    if (f := self._fault("/update_weights_from_distributed")) is not None:
      return f
    body = await request.json()
    self.weight_updates.append(body)
    self._dist_calls += 1
    if self.die_on_distributed_call and self._dist_calls >= self.die_on_distributed_call:
      os._exit(17)  # a killed group member, mid-push
    try:
      group = self._groups[body.get("group_name", "weight_update_group")]
      got = await asyncio.to_thread(
        _receive_broadcast,
        group,
        body["names"],
        body["dtypes"],
        body["shapes"],
        body.get("load_format"),
      )
    except Exception as e:  # noqa: BLE001
      return self._failed(e)
    self.weights.update(got)
    return self._ok(body)

  async def _destroy_group(self, request: web.Request) -> web.Response:
    body = await request.json()
    group = self._groups.pop(body.get("group_name", "weight_update_group"), None)
    if group is None:
      return web.json_response({"success": False, "message": "no such group"}, status=400)
    group.close()
    return web.json_response({"success": True, "message": "Succeeded to destroy group."})

  async def _update_version(self, request: web.Request) -> web.Response:
    if (f := self._fault("/update_weight_version")) is not None:
      return f
    body = await request.json()
    self.weight_version = str(body["new_version"])
    return web.json_response({"success": True, "message": "ok"})

  def _lora_reply(self, error: str | None = None) -> web.Response:
    loaded = {n: v["path"] for n, v in self.loras.items()}
    body = {"success": error is None, "error_message": error, "loaded_adapters": loaded}
    return web.json_response(body, status=200 if error is None else 400)

  async def _load_lora(self, request: web.Request) -> web.Response:
    if (f := self._fault("/load_lora_adapter")) is not None:
      return f
    body = await request.json()
    self.lora_calls.append(("load", body))
    name, path = body.get("lora_name"), body.get("lora_path")
    if not name or not path:
      return self._lora_reply("lora_name and lora_path are required")
    if name in self.loras:
      return self._lora_reply(f"The LoRA adapter with name {name} is already loaded.")
    try:
      loaded = await asyncio.to_thread(_load_peft_dir, path)
    except Exception as e:  # noqa: BLE001 - reported the way SGLang does
      return self._lora_reply(f"{type(e).__name__}: {e}")
    self.loras[name] = {"path": path, "pinned": bool(body.get("pinned")), **loaded}
    return self._lora_reply()

  async def _unload_lora(self, request: web.Request) -> web.Response:
    if (f := self._fault("/unload_lora_adapter")) is not None:
      return f
    body = await request.json()
    self.lora_calls.append(("unload", body))
    name = body.get("lora_name")
    if name not in self.loras:
      return self._lora_reply(f"LoRA adapter {name} is not loaded")
    del self.loras[name]
    return self._lora_reply()

  def effective_weights(self, name: str | None) -> dict:
    """HF name -> the weight a request with adapter ``name`` computes with (float32 for the
    adapted ones): PEFT's W + alpha / r * B @ A."""
    import numpy as np

    out = dict(self.weights)
    if name is None:
      return out
    lo = self.loras[name]
    scale = lo["config"]["lora_alpha"] / lo["config"]["r"]
    prefix = "base_model.model."
    for key, a in lo["tensors"].items():
      if not key.endswith(".lora_A.weight"):
        continue
      b = lo["tensors"][key.replace(".lora_A.", ".lora_B.")]
      w_name = key[len(prefix) :].replace(".lora_A.weight", ".weight")
      w = np.asarray(out[w_name], np.float32)
      out[w_name] = w + scale * (np.asarray(b, np.float32) @ np.asarray(a, np.float32))
    return out

  async def _memory(self, request: web.Request) -> web.Response:
    body = await request.json() if request.can_read_body else {}
    tags = tuple((body or {}).get("tags") or ("kv_cache", "weights"))
    kind = "release" if "release" in request.path else "resume"
    self.memory_events.append((kind, tags))
    (self.memory_released.update if kind == "release" else self.memory_released.difference_update)(
      tags
    )
    return web.json_response({"success": True, "message": ""})

  async def _weight_version(self, request):
    if (f := self._fault("/get_weight_version")) is not None:
      return f
    return web.json_response({"weight_version": self.weight_version})

  async def _server_info(self, request):
    if (f := self._fault("/get_server_info")) is not None:
      return f
    return web.json_response(
      {
        "model_path": self.model_path,
        "weight_version": self.weight_version,
        "max_total_num_tokens": self.max_total_num_tokens,
        "internal_states": [{"max_total_num_tokens": self.max_total_num_tokens}],
      }
    )

  async def _load(self, request):
    if (f := self._fault("/get_load")) is not None:
      return f
    used = sum(s["tokens"] for s in self._running.values()) + self.external_tokens
    return web.json_response(
      {
        "num_running_reqs": len(self._running),
        "num_waiting_reqs": 0,
        "num_tokens": used,
        "token_usage": used / max(1, self.max_total_num_tokens),
      }
    )

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


def _load_hf_dir(path: str, check_finite: bool = True) -> dict:
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
  if check_finite and any(
    not math.isfinite(float(abs(v).max())) for v in tensors.values() if v.size
  ):
    raise ValueError(f"{path}: non-finite weights")
  return tensors


def _load_peft_dir(path: str) -> dict:
  """A PEFT LoRA directory: its adapter_config.json and adapter_model.safetensors."""
  from safetensors.numpy import load_file

  if not path or not os.path.isdir(path):
    raise FileNotFoundError(f"lora_path {path!r} is not a directory")
  with open(os.path.join(path, "adapter_config.json")) as f:
    config = json.load(f)
  for k in ("r", "lora_alpha", "target_modules"):
    if k not in config:
      raise KeyError(f"{path}/adapter_config.json lacks {k!r}")
  tensors = load_file(os.path.join(path, "adapter_model.safetensors"))
  if not tensors or any(
    not (k.endswith(".lora_A.weight") or k.endswith(".lora_B.weight")) for k in tensors
  ):
    raise ValueError(f"{path}: adapter_model.safetensors holds no (or non-LoRA) tensors")
  return {"config": config, "tensors": tensors}


def _to_numpy(t) -> Any:
  """A received torch tensor as an owned numpy array (bf16 as ml_dtypes bf16, same bytes)."""
  import ml_dtypes
  import torch

  t = t.detach().cpu().contiguous()
  if t.dtype == torch.bfloat16:
    return t.view(torch.int16).numpy().copy().view(ml_dtypes.bfloat16)
  return t.numpy().copy()


def _receive_tensor_payload(payload: str, load_format: str | None) -> dict:
  obj = tensor.deserialize(payload)
  if load_format == "flattened_bucket":
    named = buckets.reconstruct(obj["flattened_tensor"], obj["metadata"])
  elif load_format in (None, "direct"):
    named = [(n, tensor.deserialize(t.values[0]) if hasattr(t, "values") else t) for n, t in obj]
  else:
    raise NotImplementedError(f"Unknown load_format={load_format}")
  return {n: _to_numpy(t) for n, t in named}


def _receive_broadcast(group, names, dtypes, shapes, load_format) -> dict:
  import torch

  if not (len(names) == len(dtypes) == len(shapes)):
    raise ValueError("names, dtypes and shapes differ in length")
  dts = [buckets.torch_dtype(d) for d in dtypes]
  if load_format == "flattened_bucket":
    sizes = [math.prod(s) * torch.empty((), dtype=d).element_size() for s, d in zip(shapes, dts)]
    flat = torch.empty(sum(sizes), dtype=torch.uint8)
    group.broadcast(flat, 0)
    meta, off = [], 0
    import types

    for n, s, d, sz in zip(names, shapes, dts, sizes):
      meta.append(
        types.SimpleNamespace(
          name=n, shape=torch.Size(s), dtype=d, start_idx=off, end_idx=off + sz, numel=sz
        )
      )
      off += sz
    named = buckets.reconstruct(flat, meta)
  elif load_format is None:
    named = []
    for n, s, d in zip(names, shapes, dts):
      t = torch.empty(s, dtype=d)
      group.broadcast(t, 0)
      named.append((n, t))
  else:
    raise NotImplementedError(f"Unknown load_format={load_format}")
  return {n: _to_numpy(t) for n, t in named}


def main() -> None:
  """Runs one stand-in in this process until killed; writes its URL to --port-file."""
  import argparse

  ap = argparse.ArgumentParser(description=main.__doc__)
  ap.add_argument("--port-file", required=True)
  ap.add_argument("--vocab-size", type=int, default=256)
  ap.add_argument("--die-on-distributed-call", type=int, default=0)
  ap.add_argument("--port", type=int, default=0, help="0 = any free port")
  ap.add_argument("--token-delay-s", type=float, default=0.0)
  ap.add_argument("--logprob-shift", type=float, default=0.0)
  ap.add_argument("--weight-version", default="0")
  ap.add_argument("--seeded", action="store_true", help="sampling_seed changes the tokens")
  ap.add_argument("--script-ids", default="", help="comma-separated ids of a scripted turn")
  args = ap.parse_args()
  import torch.distributed  # noqa: F401  (loaded up front, as in a real server)

  async def run():
    server = MockSGLangServer(
      vocab_size=args.vocab_size,
      token_delay_s=args.token_delay_s,
      weight_version=args.weight_version,
      logprob_shift=args.logprob_shift,
      seeded=args.seeded,
      script_ids=tuple(int(t) for t in args.script_ids.split(",") if t),
    )
    server.die_on_distributed_call = args.die_on_distributed_call
    await server.start(args.port)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
      f.write(server.url)
    os.replace(tmp, args.port_file)
    while True:
      await asyncio.sleep(3600)

  asyncio.run(run())


if __name__ == "__main__":
  main()

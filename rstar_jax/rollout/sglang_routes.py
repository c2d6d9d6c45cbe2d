"""SGLang's routed-experts wire format (rollout routing replay), for `SGLangEngine` and the
stand-in server.

What SGLang does (checked against sgl-project/sglang, python/sglang/srt/):
  * server flag ``--enable-return-routed-experts`` (``server_args.enable_return_routed_experts``)
    allocates the capture buffers; without it nothing is recorded;
  * request field ``return_routed_experts: bool`` of ``GenerateReqInput``
    (``managers/io_struct.py``); newer versions add ``routed_experts_start_len`` (absolute
    first position, 0 = whole sequence), which is not sent here so older servers accept it;
  * ``layers/moe/routed_experts_capturer.py`` keeps an int32 host buffer
    ``[kv_cache_tokens, num_hidden_layers, num_experts_per_tok]`` indexed by KV-cache slot,
    written by every forward (prefill and decode); at the end of a request
    (``maybe_collect_routed_experts`` in ``managers/scheduler_output_processor_mixin.py``) it
    reads ``req_to_token[req][: seqlen - 1]``: one row per position 0 ... seqlen - 2 of
    ``input_ids + output_ids`` (prompt included; a prefix served from the radix cache gives the
    routes recorded when it was computed; the last output token was never fed, so it has
    none). Rows of dense layers (``mlp_only_layers``) are never written;
  * the response carries it as ``meta_info["routed_experts"]``: base64 of the int32 array's
    bytes, C order (``tokenizer_manager.py``: ``pybase64.b64encode(t.numpy().tobytes())``,
    or pre-encoded the same way by the detokenizer).

Decoding keeps SGLang's layout ([positions, num_hidden_layers, top_k], as
``qwen3_moe.forward(routes=...)`` takes it) and sets the rows of dense layers to NO_ROUTE.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np

from rstar_jax.models.routes import RouteLayout

REQUEST_FIELD = "return_routed_experts"
SERVER_FLAG = "--enable-return-routed-experts"
META_FIELD = "routed_experts"


def encode_routed_experts(routes: np.ndarray) -> str:
  """[S, num_hidden_layers, top_k] ids -> SGLang's string (base64 of little-endian int32)."""
  return base64.b64encode(np.ascontiguousarray(routes, "<i4").tobytes()).decode("ascii")


def decode_routed_experts(
  payload: str, num_positions: int, layout: RouteLayout, where: str = "/generate"
) -> np.ndarray:
  """SGLang's ``meta_info["routed_experts"]`` -> routes [num_positions, L, k] int32 for
  positions 0 ... num_positions - 1 (dense layers' rows NO_ROUTE).

  Raises ValueError naming the mismatch when the payload is not base64 of exactly
  ``num_positions x num_hidden_layers x top_k`` int32 values.
  """
  try:
    raw = base64.b64decode(payload, validate=True)
  except (binascii.Error, TypeError, ValueError) as e:
    raise ValueError(f"{where}: meta_info.{META_FIELD} is not base64 ({e})") from None
  per_pos = layout.num_hidden_layers * layout.top_k
  want = num_positions * per_pos * 4
  if len(raw) != want:
    raise ValueError(
      f"{where}: meta_info.{META_FIELD} has {len(raw)} bytes, expected {want} "
      f"({num_positions} positions x {layout.num_hidden_layers} layers x top {layout.top_k} "
      "x int32); does the server run the same model config?"
    )
  full = np.frombuffer(raw, "<i4").reshape(num_positions, layout.num_hidden_layers, layout.top_k)
  return layout.dense_rows_cleared(full)

"""The demo's RL phase with `rollout.engine="sglang"` against the SGLang stand-in, once per
weight transport (disk, tensor, distributed): the demo finishes and the server ends up holding
the demo's final RL policy, byte for byte in HF layout. The first run builds the data and SFT
model; the other two reuse them (`demo.reuse_sft_from`)."""

import asyncio
import json
import os
import threading

import jax
import numpy as np
import pytest

from configs import demo as demo_config
from rstar_jax.config import from_config_dict
from rstar_jax.models import qwen3
from rstar_jax.models import qwen3_hf_layout as layout
from rstar_jax.pipelines import demo
from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer


class _ServerThread:
  """The stand-in on its own event loop: the demo runs its phases with asyncio.run."""

  def __init__(self, vocab_size):
    self.loop = asyncio.new_event_loop()
    self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
    self.thread.start()
    self.server = asyncio.run_coroutine_threadsafe(
      MockSGLangServer(vocab_size=vocab_size).start(), self.loop
    ).result(30)

  def close(self):
    asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(30)
    self.loop.call_soon_threadsafe(self.loop.stop)
    self.thread.join(10)


@pytest.mark.long
@pytest.mark.slow
def test_demo_runs_with_each_weight_transport(tmp_path):
  first = None
  for transport in ("disk", "tensor", "distributed"):
    c = demo_config.get_config("smoke")
    srv = _ServerThread(c.model.vocab_size)
    try:
      c.rollout.engine = "sglang"
      c.rollout.sglang_urls = [srv.server.url]
      c.rollout.weight_transport = transport
      c.rollout.weight_delta = transport != "disk"
      c.rollout.colocated = transport == "tensor"
      c.rollout.staging_dir = str(tmp_path / f"staging_{transport}")
      c.train.eval_every = 0
      # The stand-in's tokens earn no reward: keep the zero-variance groups so that each step
      # updates and pushes.
      c.rl.drop_zero_variance = False
      if first is not None:
        c.demo.reuse_sft_from = first
      w = str(tmp_path / transport)
      summary = demo.run_demo(from_config_dict(c), w)
      first = first or w
    finally:
      srv.close()
    steps = c.stages[0]["steps"]
    assert summary["rl_steps"] == steps, transport
    assert json.load(open(os.path.join(w, "summary.json")))["rl_steps"] == steps
    cfg = from_config_dict(c).model.qwen3_config()
    final = jax.tree.map(np.asarray, qwen3.load_hf_params(os.path.join(w, "rl", "hf"), cfg))
    server = srv.server  # closed, but it keeps the weights it received
    assert server.weights, transport
    sft = jax.tree.map(np.asarray, qwen3.load_hf_params(os.path.join(w, "sft", "hf"), cfg))
    # The pushes carried the RL updates, not the SFT start the server was first given.
    assert any(
      a.tobytes() != b.tobytes() for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(sft))
    ), transport
    for t in layout.hf_table(cfg):
      want = np.ascontiguousarray(layout.to_hf(layout.get_leaf(final, t.path), t))
      got = np.asarray(server.weights[t.name])
      assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (transport, t.name)
    rows = [json.loads(line) for line in open(os.path.join(w, "rl", "metrics.jsonl"))]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for r in rows:
      assert r["push/bytes"] > 0 and r["push/seconds"] > 0, (transport, r)
      if transport != "disk":  # delta: the second push sends only what changed
        assert 0.0 <= r["push/delta_fraction"] <= 1.0, (transport, r)

"""Weight transports (disk, tensor, distributed, delta) against the SGLang stand-in: the tensors a
server holds after a push equal the learner's params byte for byte, in HF layout."""

import asyncio
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.models import qwen3
from rstar_jax.models import qwen3_hf_layout as layout
from rstar_jax.rollout.sglang_engine import SGLangEngine, SGLangError
from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer
from rstar_jax.rollout.weight_transfer import buckets

TRANSPORTS = ("disk", "tensor", "distributed")


def _model(tied: bool, dtype=jnp.float32, seed=0):
  cfg = qwen3.Qwen3Config(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    rope_theta=10000.0,
    tie_word_embeddings=tied,
    max_position_embeddings=128,
  )
  return cfg, qwen3.init_params(cfg, jax.random.PRNGKey(seed), dtype=dtype)


def _expected(cfg, params):
  host = jax.tree.map(np.asarray, params)
  return {
    t.name: np.ascontiguousarray(layout.to_hf(layout.get_leaf(host, t.path), t))
    for t in layout.hf_table(cfg)
  }


def _assert_same_bytes(got: dict, want: dict):
  assert set(got) == set(want), sorted(set(got) ^ set(want))[:5]
  for k, v in want.items():
    assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
    assert got[k].tobytes() == v.tobytes(), k


def _opts(transport, **kw):
  return dict({"bucket_bytes": 4096} if transport != "disk" else {}, **kw)


async def _servers(n):
  return [await MockSGLangServer(vocab_size=64).start() for _ in range(n)]


def test_table_round_trip_and_save_hf_names(tmp_path):
  for tied in (False, True):
    cfg, params = _model(tied)
    want = _expected(cfg, params)
    assert list(want) == qwen3.hf_names(cfg)
    assert ("lm_head.weight" in want) == (not tied)
    back = layout.hf_to_tree(want, cfg)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
      np.testing.assert_array_equal(np.asarray(a), b)
    t = next(t for t in layout.hf_table(cfg) if t.name.endswith("0.mlp.gate_proj.weight"))
    assert t.transpose and t.layer == 0 and t.shape == (48, 32)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("dtype,tied", [(jnp.float32, False), (jnp.bfloat16, True)])
def test_push_delivers_exact_bytes(transport, dtype, tied, tmp_path):
  cfg, params = _model(tied, dtype)

  async def main():
    servers = await _servers(2)
    try:
      async with SGLangEngine(
        [s.url for s in servers],
        str(tmp_path),
        backoff_s=0.01,
        weight_transport=transport,
        transport_options=_opts(transport, timeout_s=20),
      ) as eng:
        m = await eng.update_weights(cfg, params, 3)
        assert eng.weight_version == 3
        return m, [dict(s.weights) for s in servers], [s.weight_version for s in servers]
    finally:
      for s in servers:
        await s.close()

  m, got, versions = asyncio.run(main())
  want = _expected(cfg, params)
  for g in got:
    _assert_same_bytes(g, want)
  assert versions == ["3", "3"]
  assert m["push/bytes"] == sum(v.nbytes for v in want.values())
  assert m["push/seconds"] > 0 and m["push/delta_fraction"] == 1.0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_delta_sends_only_changed_tensors(transport, tmp_path):
  cfg, p1 = _model(False, jnp.bfloat16)
  p2 = jax.tree.map(jnp.copy, p1)
  k = p2["layers"]["mlp"]["up_proj"]["kernel"]
  p2["layers"]["mlp"]["up_proj"]["kernel"] = k.at[1, 0, 0].add(1.0)  # layer 1 only
  p3 = jax.tree.map(jnp.copy, p2)
  n_total = len(layout.hf_table(cfg))

  async def main():
    [server] = await _servers(1)
    try:
      async with SGLangEngine(
        [server.url],
        str(tmp_path),
        weight_transport=transport,
        weight_delta=True,
        transport_options=_opts(transport, timeout_s=20),
      ) as eng:
        m1 = await eng.update_weights(cfg, p1, 1)
        m2 = await eng.update_weights(cfg, p2, 2)
        n_updates = len(server.weight_updates)
        m3 = await eng.update_weights(cfg, p3, 3)  # nothing changed
        return (
          m1,
          m2,
          m3,
          dict(server.weights),
          server.weight_version,
          len(server.weight_updates) - n_updates,
        )
    finally:
      await server.close()

  m1, m2, m3, got, version, calls3 = asyncio.run(main())
  assert m1["push/delta_fraction"] == 1.0
  assert m2["push/delta_fraction"] == pytest.approx(1 / n_total)
  assert m2["push/bytes"] == 48 * 32 * 2
  assert m3["push/delta_fraction"] == 0.0 and m3["push/bytes"] == 0 and calls3 == 0
  assert version == "3"
  _assert_same_bytes(got, _expected(cfg, p3))


@pytest.mark.parametrize("transport", ("tensor", "disk"))
def test_server_error_half_way_keeps_previous_version(transport, tmp_path):
  cfg, p1 = _model(False)
  _, p2 = _model(False, seed=1)
  path = {"tensor": "/update_weights_from_tensor", "disk": "/update_weights_from_disk"}[transport]

  async def main():
    servers = await _servers(2)
    try:
      async with SGLangEngine(
        [s.url for s in servers],
        str(tmp_path),
        max_retries=1,
        backoff_s=0.01,
        weight_transport=transport,
        weight_delta=True,
        transport_options=_opts(transport),
      ) as eng:
        await eng.update_weights(cfg, p1, 1)
        # tensor: server 1's 2nd bucket fails; disk: server 1 fails, server 0 loaded
        servers[1].fail_next(path, 1, status=400, skip=int(transport == "tensor"))
        with pytest.raises(SGLangError, match=r"version 2 .*stays on version 1"):
          await eng.update_weights(cfg, p2, 2)
        assert eng.weight_version == 1
        assert [s.weight_version for s in servers][1] == "1"
        await eng.update_weights(cfg, p2, 2)  # delta was reset: all tensors again
        return eng.last_push, [dict(s.weights) for s in servers]
    finally:
      for s in servers:
        await s.close()

  stats, got = asyncio.run(main())
  assert stats.delta_fraction == 1.0
  for g in got:
    _assert_same_bytes(g, _expected(cfg, p2))


def test_colocated_releases_and_resumes_kv_memory(tmp_path):
  cfg, params = _model(True)

  async def main():
    [server] = await _servers(1)
    try:
      async with SGLangEngine(
        [server.url], str(tmp_path), weight_transport="tensor", colocated=True
      ) as eng:
        await eng.update_weights(cfg, params, 1)
      return server.memory_events, server.memory_released
    finally:
      await server.close()

  events, released = asyncio.run(main())
  assert events == [("release", ("kv_cache",)), ("resume", ("kv_cache",))] and not released


def _spawn_mock(tmp_path, *extra):
  port_file = str(tmp_path / f"url{len(os.listdir(tmp_path))}")
  env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "rstar_jax.rollout.testing.mock_sglang",
      "--port-file",
      port_file,
      *extra,
    ],
    env=env,
  )
  end = time.monotonic() + 60
  while not os.path.exists(port_file):
    if time.monotonic() > end or proc.poll() is not None:
      proc.kill()
      raise RuntimeError("mock server process did not start")
    time.sleep(0.05)
  return proc, open(port_file).read()


@pytest.mark.slow
def test_killed_group_member_fails_push_without_hang(tmp_path, caplog):
  """A server process dies during a distributed push: a clear error within the timeouts, the
  group is dropped, the dead server leaves the rotation (issue 41) and the push goes again to
  the server still answering."""
  cfg, p1 = _model(False)
  _, p2 = _model(False, seed=1)
  good, good_url = _spawn_mock(tmp_path)
  bad, bad_url = _spawn_mock(tmp_path, "--die-on-distributed-call", "3")
  try:

    async def main():
      async with SGLangEngine(
        [good_url, bad_url],
        max_retries=0,
        weight_transport="distributed",
        transport_options={"bucket_bytes": 4096, "timeout_s": 10},
      ) as eng:
        t0 = time.monotonic()
        await eng.update_weights(cfg, p1, 1)
        assert eng.weight_version == 1 and eng.urls == [good_url]
        assert eng.fleet_metrics()["rollout/failovers"] == 1
        return time.monotonic() - t0

    took = asyncio.run(main())
    assert took < 150
    err = next(r.getMessage() for r in caplog.records if "pushing again" in r.getMessage())
    assert "distributed" in err and "stays on version 0" in err, err
    assert "update_weights_from_distributed (bucket 3/" in err, err
    assert bad.wait(timeout=10) == 17, err
  finally:
    for p in (good, bad):
      if p.poll() is None:
        p.kill()
        p.wait()


def test_bucket_plan_and_reconstruct_round_trip():
  import torch

  items = [("a", (2, 3), "float32", 24), ("b", (5,), "bfloat16", 10), ("c", (4,), "float32", 16)]
  plan = buckets.plan_buckets(items, 34)
  assert [[e.name for e in b] for b in plan] == [["a", "b"], ["c"]]
  assert (plan[0][1].start, plan[0][1].end) == (24, 34)
  a, b = torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.ones(5, dtype=torch.bfloat16)
  flat = torch.cat([a.reshape(-1).view(torch.uint8), b.view(torch.uint8)])
  out = dict(buckets.reconstruct(flat, buckets.sglang_metadata(plan[0])))
  assert torch.equal(out["a"], a) and torch.equal(out["b"], b)
  with pytest.raises(ValueError, match="bucket_bytes"):
    buckets.plan_buckets(items, 0)


def test_config_fields_validated():
  from configs import rstar2_tiny_cpu
  from rstar_jax.config import ConfigError, from_config_dict

  cfg = rstar2_tiny_cpu.get_config("rl")
  run = from_config_dict(cfg, "rl")
  assert (run.rollout.weight_transport, run.rollout.weight_delta, run.rollout.colocated) == (
    "disk",
    False,
    False,
  )
  cfg.rollout.weight_transport = "nfs"
  with pytest.raises(ConfigError, match="rollout.weight_transport"):
    from_config_dict(cfg, "rl")
  with pytest.raises(ValueError, match="weight_transport"):
    SGLangEngine(["http://127.0.0.1:1"], weight_transport="nfs")


@pytest.mark.parametrize("use_torch", (True, False))
def test_write_hf_transposes_exact_bytes(use_torch, monkeypatch):
  """The host transpose path (torch's blocked copy, or NumPy tiles without torch) writes
  exactly the C-ordered bytes of x.T, for 2-, 4- and 8-byte types and shapes off the tile."""
  from rstar_jax.rollout.weight_transfer import source

  if not use_torch:
    monkeypatch.setattr(source, "_torch", lambda: None)
  rng = np.random.default_rng(0)
  for dtype in (jnp.bfloat16, np.float32, np.float64):
    for shape in ((3, 5), (300, 517), (1, 700)):
      x = rng.standard_normal(shape).astype(dtype)
      x.flags.writeable = False  # as np.asarray of a JAX buffer
      dst = np.full(x.nbytes, 7, np.uint8)
      source.write_hf(dst, x, True)
      assert dst.tobytes() == np.ascontiguousarray(x.T).tobytes(), (dtype, shape)
      source.write_hf(dst, x, False)
      assert dst.tobytes() == x.tobytes()
  with pytest.raises(ValueError, match="destination has"):
    source.write_hf(np.zeros(3, np.uint8), x, True)
  # fill(): chunked plain copies and transposes on a pool land at their offsets.
  import concurrent.futures

  a, b = rng.standard_normal((40, 24)).astype(np.float32), rng.standard_normal(99)
  dst = np.zeros(a.nbytes + b.nbytes, np.uint8)
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    source.fill(dst, [(0, a, True), (a.nbytes, b, False)], pool, chunk=64)
  assert dst.tobytes() == np.ascontiguousarray(a.T).tobytes() + b.tobytes()


@pytest.mark.parametrize("num_writers,max_file_bytes", [(3, 4 << 30), (2, 6000)])
def test_disk_staging_deals_tensors_over_files(tmp_path, num_writers, max_file_bytes):
  """The staged dir has one file per writer thread (more when max_file_bytes caps them),
  neighbouring tensors in different files (so the threads write different files at once), and
  the index and files together hold every tensor byte for byte."""
  import json

  from safetensors.numpy import load_file

  from rstar_jax.rollout.weight_transfer import disk

  cfg, params = _model(tied=False, dtype=jnp.bfloat16)
  table = layout.hf_table(cfg)
  disk.write_hf_dir(
    str(tmp_path), cfg, params, table, num_writers=num_writers, max_file_bytes=max_file_bytes
  )
  with open(tmp_path / disk.INDEX_FILE) as f:
    wm = json.load(f)["weight_map"]
  files = sorted(set(wm.values()))
  assert len(files) >= num_writers
  if max_file_bytes < 1 << 20:
    assert len(files) > num_writers
    # a tensor bigger than the cap gets a file of its own; no file holds two over the cap
    for name in files:
      assert os.path.getsize(tmp_path / name) <= max_file_bytes + 4096 or (
        len([k for k, v in wm.items() if v == name]) == 1
      )
  else:
    assert len(files) == num_writers
  order = [wm[t.name] for t in table]
  assert sum(a != b for a, b in zip(order, order[1:])) >= len(order) // 2
  got = {}
  for name in files:
    got.update(load_file(str(tmp_path / name)))
  _assert_same_bytes(got, _expected(cfg, params))


def test_closing_a_distributed_transport_that_never_pushed_asks_nothing_of_the_servers():
  """An engine closing before its first push (a run stopped early): no group was formed, so no
  server is asked to leave one."""
  from rstar_jax.rollout.weight_transfer.distributed import DistributedTransport

  class NoCalls:
    def __getattr__(self, name):
      raise AssertionError(f"engine.{name} called")

  t = DistributedTransport()
  asyncio.run(t.close(NoCalls()))
  assert t.group is None

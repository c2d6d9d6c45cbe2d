"""The learner's start-up memory check (issue 29 row 3): a batch that cannot fit is one line
before params, optimizer state or a batch are allocated; a fitting budget runs, and the check's
compile is the one the loop then uses."""

import logging
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import rstar2_tiny_cpu
from rstar_jax.config import from_config_dict
from rstar_jax.learner import batch as batch_lib
from rstar_jax.learner import packing
from rstar_jax.models import qwen3
from rstar_jax.pipelines import wiring
from rstar_jax.planning import fit, kv_cache, plan

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(mode="rl", **train):
  cfg = rstar2_tiny_cpu.get_config(mode)
  cfg.mesh.num_devices = 1
  for k, v in train.items():
    setattr(cfg.train, k, v)
  return from_config_dict(cfg, mode, check_inputs=False)


@pytest.fixture
def no_allocation(monkeypatch):
  """Fails the test if the learner's params are created."""

  def boom(*a, **k):
    raise AssertionError("params allocated before the memory check")

  monkeypatch.setattr(sys.modules[wiring.build_learner.__module__], "initial_params", boom)
  monkeypatch.setattr(qwen3, "init_params", boom)


def test_budget_sources(monkeypatch):
  run = _run()
  dev = jax.devices()[:1]
  assert fit.budget_bytes(run, dev) == (None, "the cpu device reports no memory limit")
  gib = fit.budget_bytes(_run(device_memory_gib=2.5), dev)
  assert gib[0] == int(2.5 * plan.GIB) and "train.device_memory_gib=2.5" in gib[1]
  assert fit.budget_bytes(_run(device_memory_gib=-1.0), dev)[0] is None

  class Gpu:  # an accelerator reports its limit: the free part is the budget
    platform = "gpu"
    process_index = 0

    def __init__(self, limit, used):
      self.stats = {"bytes_limit": limit, "bytes_in_use": used}

    def memory_stats(self):
      return self.stats

  b, src = fit.budget_bytes(run, [Gpu(10 * plan.GIB, plan.GIB), Gpu(10 * plan.GIB, 0)])
  assert b == 9 * plan.GIB and "bytes_limit - bytes_in_use" in src


def test_worst_shape_is_the_loops_largest_batch():
  run = _run()
  sizes = {"data": 1, "fsdp": 1, "tensor": 1}
  shape = fit.worst_shape(run, sizes)
  longest = max(st.response_budget for st in run.stages)
  assert shape.seq_len == batch_lib.length_bucket(
    run.rollout.max_prompt_tokens + longest, run.train.length_bucket
  )
  assert shape.rows == run.train.batch_prompts * run.rl.group_size
  # Two PPO mini-batches: each update gets half the rows (RLLoop.update's rule).
  import dataclasses

  two = dataclasses.replace(run, rl=dataclasses.replace(run.rl, ppo_mini_batches=2))
  assert fit.worst_shape(two, sizes).rows == -(-shape.rows // 2)
  sft = _run("sft")
  s = fit.worst_shape(sft, sizes)
  assert (s.kind, s.rows, s.seq_len) == (
    "sft",
    sft.sft.batch_size,
    batch_lib.length_bucket(sft.sft.max_seq_len),
  )


@pytest.mark.parametrize("mode", ["rl", "sft"])
def test_batch_that_cannot_fit_is_one_line_before_allocation(mode, no_allocation, monkeypatch):
  # A budget everything fits: the check passes and returns its figures, then init runs
  # (patched to fail: nothing was allocated before the check).
  seen = []
  check = fit.check_learner_fits
  monkeypatch.setattr(fit, "check_learner_fits", lambda *a: seen.append(check(*a)) or seen[-1])
  with pytest.raises(AssertionError, match="params allocated"):
    wiring.build_learner(_run(mode, device_memory_gib=100.0), total_steps=10)
  (f,) = seen
  floor = f["state_bytes"] + f["batch_bytes"] + f["sampler_bytes"]
  if mode == "rl":  # the embedded JaxSampler shares the device: KV cache + a params copy
    run = _run(mode)
    assert run.rollout.engine == "jax"
    mc = run.model.qwen3_config()
    params = plan.param_count(mc) * jax.numpy.dtype(run.model.param_dtype).itemsize
    assert f["sampler_bytes"] == kv_cache.kv_cache_bytes(run, mc)[0] + params
    assert f["estimate_bytes"] == f["step_peak_bytes"] + f["sampler_bytes"]
  else:
    assert f["sampler_bytes"] == 0 and f["estimate_bytes"] == f["step_peak_bytes"]
  assert f["step_peak_bytes"] > f["state_bytes"] and f["estimate_bytes"] > floor
  # Below the state + batch bytes: fails without compiling.
  tiny = floor / 2 / plan.GIB
  with pytest.raises(fit.BatchDoesNotFit) as e:
    wiring.build_learner(_run(mode, device_memory_gib=tiny), total_steps=10)
  msg = str(e.value)
  assert "\n" not in msg and "params, optimizer state and batch alone" in msg
  shape = f["shape"]
  assert f"{shape['rows']} rows x {shape['seq_len']} tokens" in msg
  assert "train.micro_batches" in msg and "config.mesh.fsdp" in msg
  assert ("sft.batch_size" if mode == "sft" else "train.batch_prompts") in msg
  # Between the floor and the compiled peak: the compiled estimate decides.
  mid = (floor + f["estimate_bytes"]) / 2 / plan.GIB
  with pytest.raises(fit.BatchDoesNotFit, match=r"compiled step peak") as e:
    wiring.build_learner(_run(mode, device_memory_gib=mid), total_steps=10)
  assert "\n" not in str(e.value)
  assert f"needs {fit.gib(f['estimate_bytes'])} per device" in str(e.value)
  assert f"more than the {fit.gib(int(mid * plan.GIB))} budget (train.device_memory_gib=" in str(
    e.value
  )


def test_no_budget_skips_and_logs_once(caplog, monkeypatch):
  monkeypatch.setattr(fit, "_logged_skip", set())
  with caplog.at_level(logging.INFO, logger=fit.__name__):
    wiring.build_learner(_run())
    wiring.build_learner(_run())
  lines = [r.getMessage() for r in caplog.records if "memory check skipped" in r.getMessage()]
  assert lines == [
    "learner memory check skipped: the cpu device reports no memory limit; "
    "set train.device_memory_gib to check the batch"
  ]


def test_fitting_budget_runs_and_the_loop_reuses_the_check_compile():
  """The check compiles the learner's own sft_step for the largest batch; a real batch of that
  shape (built as the SFT loop builds it) then runs without a second compile."""
  from jax._src import monitoring

  run = _run("sft", device_memory_gib=100.0)
  learner = wiring.build_learner(run, total_steps=10)
  rows = -(-run.sft.batch_size // learner.row_multiple) * learner.row_multiple
  n = run.sft.max_seq_len
  rng = np.random.default_rng(0)
  chunk = [
    (list(rng.integers(1, 50, n)), [0] * 4 + [1] * (n - 4)) for _ in range(run.sft.batch_size)
  ]
  pad_to = batch_lib.length_bucket(n)
  b = batch_lib.make_sft_batch(chunk, pad_to, pad_id=0, row_multiple=rows)
  if run.train.pack_rows:
    b, _ = packing.pack_for_step(b, row_multiple=learner.row_multiple, pad_id=0)
  compiles = []

  def listen(ev, d, **kw):
    if ev.endswith("backend_compile_duration"):
      compiles.append(ev)

  batch = learner.jitted.shard_batch(b)
  monitoring.register_event_duration_secs_listener(listen)
  try:
    learner.state, m = learner.jitted.sft_step(learner.state, batch)
    loss = float(m["loss"])
  finally:
    monitoring.unregister_event_duration_listener(listen)
  assert np.isfinite(loss)
  assert compiles == []
  # Control: the listener does see a compile.
  monitoring.register_event_duration_secs_listener(listen)
  try:
    jax.jit(lambda x: x * 3 + 1)(np.float32(2.0))
  finally:
    monitoring.unregister_event_duration_listener(listen)
  assert compiles


def test_launcher_batch_that_cannot_fit_is_one_line(tmp_path):
  env = dict(os.environ, XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""), JAX_PLATFORMS="cpu")
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "launchers.train",
      "--config=configs/rstar2_tiny_cpu.py",
      f"--workdir={tmp_path}/run",
      "--config.mesh.num_devices=1",
      "--config.train.device_memory_gib=0.0001",
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  lines = [ln for ln in proc.stderr.splitlines() if "rl_step on its largest batch" in ln]
  assert (
    len(lines) == 1
    and "more than the 0.0001 GiB budget (train.device_memory_gib=0.0001)" in lines[0]
  ), proc.stderr
  assert not os.path.exists(tmp_path / "run" / "ckpt")


def test_budget_is_not_part_of_the_run_record():
  # Raising the budget on a resume (or another machine) must not make the run stale.
  import fnmatch

  from rstar_jax import run_record

  assert any(fnmatch.fnmatch("train.device_memory_gib", p) for p in run_record.DEFAULT_IGNORE)


def test_lora_state_is_checked_before_allocation(no_allocation):
  # A LoRA policy's optimizer comes from the abstract LoraParams, so the check (here its
  # no-compile floor: state + batch bytes) also runs before the base or adapters exist.
  cfg = rstar2_tiny_cpu.get_config("sft")
  cfg.mesh.num_devices = 1
  cfg.model.lora_rank = 4
  cfg.train.device_memory_gib = 1e-4
  run = from_config_dict(cfg, "sft", check_inputs=False)
  with pytest.raises(
    fit.BatchDoesNotFit,
    match=r"sft_step on its largest batch .*\(params, optimizer state and batch alone",
  ):
    wiring.build_learner(run, total_steps=10)

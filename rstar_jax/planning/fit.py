"""Does the learner's step fit the device? Checked at start-up, before params, optimizer state or
a batch exist, so a batch that cannot fit is one line (`UserError`) instead of an XLA
out-of-memory traceback after minutes of loading.

The estimate is the planner's (`plan.py`): the compiled per-device program's
``memory_analysis()`` (argument + output - alias + temp) of the learner's own jitted step,
lowered on abstract state and the worst batch the loop can build (`worst_shape`). The jit
objects are the ones the learner then runs, so JAX keeps the executable: when a real batch has
that shape (an RL batch whose longest trajectory hits the response budget, or an SFT batch of
``sft.max_seq_len``) the loop does not compile it again. Before compiling, the state + batch
bytes alone (no compile) are compared with the budget, so a hopeless config fails at once.

With ``rollout.engine='jax'`` an RL run's sampler shares the device: its KV cache
(`kv_cache.kv_cache_bytes`) and its copy of the params are added.

The budget: ``train.device_memory_gib`` when > 0; at 0 the free memory the device reports
(``bytes_limit - bytes_in_use``, lowest over the local devices of the mesh); a CPU reports
none, so the check is skipped there (logged once) unless the field sets a budget; < 0 turns it
off.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import jax

from rstar_jax.errors import UserError
from rstar_jax.planning import kv_cache, plan

log = logging.getLogger(__name__)

_logged_skip: set[str] = set()


class BatchDoesNotFit(UserError, ValueError):
  """The learner's step on the configured batch needs more memory than the device has."""


def budget_bytes(run, devices) -> tuple[int | None, str]:
  """(per-device budget in bytes or None, where it came from)."""
  gib = run.train.device_memory_gib
  if gib < 0:
    return None, "train.device_memory_gib < 0 (check off)"
  if gib > 0:
    return int(gib * plan.GIB), f"train.device_memory_gib={gib:g}"
  free = []
  for d in devices:
    if d.process_index != jax.process_index():
      continue
    try:
      stats = d.memory_stats()
    except Exception:  # some backends do not implement it
      stats = None
    if not stats or not stats.get("bytes_limit"):
      return None, f"the {d.platform} device reports no memory limit"
    free.append(int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)))
  if not free:
    return None, "no local device in the mesh"
  return min(free), f"free memory of the {devices[0].platform} device (bytes_limit - bytes_in_use)"


def worst_shape(run, mesh_sizes: dict[str, int]) -> plan.StepShape:
  """The largest batch the run's loop passes to one step: the planner's shapes (`sft_shape`;
  `rl_shape` over every stage, the longest wins), with an RL step's rows split over
  ``rl.ppo_mini_batches`` updates as `RLLoop.update` splits them (the planner keeps all the
  step's rows in one update: an upper bound)."""
  if run.mode == "sft":
    return plan.sft_shape(run, mesh_sizes)
  shapes = [plan.rl_shape(run, mesh_sizes, i) for i in range(max(len(run.stages), 1))]
  shape = max(shapes, key=lambda s: (s.seq_len, s.rows))
  row_multiple = plan.data_parallel_size(mesh_sizes) * shape.num_micro_batches
  per_update = -(-shape.rows // run.rl.ppo_mini_batches)
  return dataclasses.replace(shape, rows=-(-per_update // row_multiple) * row_multiple)


def packed_rows(run, kind: str) -> bool:
  """The loops pack rows (and the step reads the packing keys) under this rule."""
  return bool(run.train.pack_rows) and (kind == "sft" or run.rl.loss_agg == "token-mean")


def gib(n: float) -> str:
  """Bytes as GiB, with the digits a small budget needs (0.001 GiB is not "0.00")."""
  g = n / plan.GIB
  return f"{g:.2f} GiB" if g >= 0.1 else f"{g:.2g} GiB"


def _sampler_bytes(run, model_config, abstract_state, js) -> tuple[int, str]:
  if run.mode != "rl" or run.rollout.engine != "jax":
    return 0, ""
  kv, max_len = kv_cache.kv_cache_bytes(run, model_config)
  # The sampler holds plain (merged, with LoRA) weights; a LoRA state's params include the
  # base, so its base bytes stand for the merged copy.
  params = getattr(abstract_state.params, "base", abstract_state.params)
  shardings = getattr(js.state_shardings.params, "base", js.state_shardings.params)
  copy = plan.sharded_bytes(params, shardings)
  note = (
    f"; + the JaxSampler's {gib(kv)} KV cache (rollout.max_batch={run.rollout.max_batch} x "
    f"max_len={max_len}) and {gib(copy)} params copy"
  )
  return kv + copy, note


def _advice(run, shape: plan.StepShape) -> str:
  if shape.kind == "sft":
    batch = "sft.batch_size / sft.max_seq_len"
  else:
    batch = (
      "train.batch_prompts / rl.group_size, or the response budget (stages, "
      "rollout.response_budget) / rollout.max_prompt_tokens"
    )
  parts = [f"raise train.micro_batches (now {shape.num_micro_batches})"]
  if not run.train.pack_rows and (shape.kind == "sft" or run.rl.loss_agg == "token-mean"):
    parts.append("set train.pack_rows=true")
  parts.append("shard over more devices (config.mesh.fsdp / mesh.num_devices)")
  parts.append(f"lower {batch}")
  parts.append("or set train.device_memory_gib if the budget is wrong")
  return ", ".join(parts)


def _fail(run, shape, rows_per_micro, estimate, what, budget, source, extra_note):
  raise BatchDoesNotFit(
    f"train: the learner's {shape.kind}_step on its largest batch ({shape.rows} rows x "
    f"{shape.seq_len} tokens; train.micro_batches={shape.num_micro_batches}, "
    f"{rows_per_micro} rows per device per micro-batch) needs {gib(estimate)} per device "
    f"({what}{extra_note}), more than the {gib(budget)} budget ({source}); "
    f"{_advice(run, shape)}"
  )


def check_learner_fits(run, js, abstract_state, model_config) -> dict[str, Any] | None:
  """Raises `BatchDoesNotFit` (one line) when the step on the run's largest batch cannot fit
  the budget; returns the figures (None when no budget is known, logged once per reason).

  ``js``: the learner's `JittedSteps`; ``abstract_state``: its `TrainState` as
  ShapeDtypeStructs (nothing is allocated here)."""
  mesh = js.mesh
  budget, source = budget_bytes(run, list(mesh.devices.flat))
  if budget is None:
    if source not in _logged_skip:
      _logged_skip.add(source)
      log.info(
        "learner memory check skipped: %s; set train.device_memory_gib to check the batch",
        source,
      )
    return None
  shape = worst_shape(run, dict(mesh.shape))
  dp = plan.data_parallel_size(dict(mesh.shape))
  rows_per_micro = shape.rows // (dp * shape.num_micro_batches)
  state = jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
    abstract_state,
    js.state_shardings,
  )
  batch = plan.abstract_batch(shape, js, packed_rows(run, shape.kind))
  extra, extra_note = _sampler_bytes(run, model_config, abstract_state, js)
  state_b = plan.sharded_bytes(state, js.state_shardings)
  batch_b = plan.sharded_bytes(batch, {k: v.sharding for k, v in batch.items()})
  floor = state_b + batch_b + extra
  if floor > budget:  # hopeless without compiling: params + optimizer state + batch alone
    what = "params, optimizer state and batch alone"
    _fail(run, shape, rows_per_micro, floor, what, budget, source, extra_note)
  t0 = time.perf_counter()
  compiled = js.lower(f"{shape.kind}_step", state, batch).compile()
  mem = plan.memory_bytes(compiled)
  seconds = time.perf_counter() - t0
  estimate = mem["peak_bytes"] + extra
  out = {
    "shape": dataclasses.asdict(shape),
    "state_bytes": state_b,
    "batch_bytes": batch_b,
    "sampler_bytes": extra,
    "step_peak_bytes": mem["peak_bytes"],
    "estimate_bytes": estimate,
    "budget_bytes": budget,
    "budget_source": source,
    "compile_s": round(seconds, 2),
  }
  if estimate > budget:
    _fail(
      run,
      shape,
      rows_per_micro,
      estimate,
      "compiled step peak: arguments + outputs - aliased + temporaries",
      budget,
      source,
      extra_note,
    )
  log.info(
    "learner memory: %s_step on %d rows x %d tokens needs %.2f GiB of %.2f GiB per device "
    "(%s; compiled in %.1f s, the executable the loop runs when a batch has that shape)",
    shape.kind,
    shape.rows,
    shape.seq_len,
    estimate / plan.GIB,
    budget / plan.GIB,
    source,
    seconds,
  )
  return out

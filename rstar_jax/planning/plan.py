"""Ahead-of-time memory / FLOP plan of the learner steps on a fake device mesh.

XLA can compile the real sharded ``rl_step`` / ``sft_step`` for N devices that exist only as
``--xla_force_host_platform_device_count=N`` CPU devices. Nothing is allocated at full size:
params and optimizer state are ``jax.eval_shape`` structs, the batch is ``ShapeDtypeStruct``s,
and only ``lower(...).compile()`` runs. From the compiled per-device program we read:

* ``memory_analysis()``: argument / output / alias / temporary bytes per device. The peak
  estimate is ``argument + output - alias + temp`` (donated state buffers are reused for the
  new state, which XLA reports as ``alias``). This is CPU XLA's buffer assignment: an
  *estimate* for the GPU program (GPU fusion, scheduling and collective buffers differ; the
  ROCm runtime also reserves memory), so keep headroom.
* ``cost_analysis()["flops"]``: reported raw, but XLA counts a ``while`` body once, and the
  model scans over layers and micro-batches, so the raw figure undercounts by roughly
  layers x micro-batches. ``flops_per_step`` therefore comes from `step_flops` (an exact count
  of the matmul/attention FLOPs of this model code, checked against XLA on an unscanned tiny
  config in tests/planning).
* the collectives in the optimized HLO text (static op counts; an op inside a loop body
  counts once).

The compiled program is the learner's own: the jit objects `learner.steps.make_jitted_steps`
returns (`JittedSteps.jitted`, lowered with `JittedSteps.lower` on abstract arguments), with the
batch keys the step reads (`StepConfig.rl_keys`: the sampler's log-probs with ``rl.tis_cap``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from typing import Any

import jax
import jax.numpy as jnp

from rstar_jax.config import RunConfig, from_config_dict
from rstar_jax.learner import lora_training, optim, steps
from rstar_jax.learner.batch import length_bucket  # the RL / SFT loops' padding rule
from rstar_jax.learner.packing import PACKING_KEYS
from rstar_jax.learner.train_state import TrainState
from rstar_jax.models import lora, qwen3
from rstar_jax.sharding.mesh import make_mesh

GIB = 1024**3

# Architecture facts (HF config.json of the released checkpoints), used when the config's
# ``model.hf_dir`` is not present on the planning machine.
PRESETS: dict[str, dict[str, Any]] = {
  "qwen3-14b": dict(
    vocab_size=151936,
    hidden_size=5120,
    intermediate_size=17408,
    num_hidden_layers=40,
    num_attention_heads=40,
    num_key_value_heads=8,
    head_dim=128,
    rope_theta=1e6,
    tie_word_embeddings=False,
    max_position_embeddings=32768,
  ),
  "qwen3-4b": dict(
    vocab_size=151936,
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    rope_theta=5e6,
    tie_word_embeddings=True,
    max_position_embeddings=262144,
  ),
}

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepShape:
  """Shapes of one compiled learner step.

  Attributes:
      kind: "rl" (rl_step) or "sft" (sft_step).
      rows: N, batch rows per step (all devices together).
      seq_len: T, padded tokens per row.
      num_micro_batches: M (gradient accumulation).
  """

  kind: str
  rows: int
  seq_len: int
  num_micro_batches: int

  def __post_init__(self):
    if self.kind not in ("rl", "sft"):
      raise ValueError(f"StepShape.kind: expected 'rl' or 'sft', got {self.kind!r}")
    for f in ("rows", "seq_len", "num_micro_batches"):
      if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
        raise ValueError(f"StepShape.{f}: expected an int >= 1, got {getattr(self, f)!r}")


def _attention_fields(m) -> dict:
  return {"attention": m.attention, "attention_block_size": m.attention_block_size}


def model_config_for_plan(cfg: RunConfig) -> qwen3.Qwen3Config:
  """The policy's Qwen3Config: the HF dir when readable here, else ``plan.model_preset``,
  else the tiny dims of ``cfg.model``."""
  m = cfg.model
  if m.hf_dir and os.path.isfile(os.path.join(m.hf_dir, "config.json")):
    return qwen3.Qwen3Config.from_hf(m.hf_dir, dtype=m.dtype, remat=m.remat, **_attention_fields(m))
  preset = cfg.plan.model_preset
  if preset:
    if preset not in PRESETS:
      raise ValueError(f"plan.model_preset: expected one of {sorted(PRESETS)}, got {preset!r}")
    return qwen3.Qwen3Config(
      **PRESETS[preset], dtype=m.dtype, remat=m.remat, **_attention_fields(m)
    )
  if m.hf_dir:
    raise ValueError(
      f"model.hf_dir={m.hf_dir!r} has no config.json here and the config "
      f"has no plan.model_preset (one of {sorted(PRESETS)})"
    )
  return m.qwen3_config()


def data_parallel_size(mesh_sizes: dict[str, int]) -> int:
  return mesh_sizes.get("data", 1) * mesh_sizes.get("fsdp", 1)


def rl_shape(cfg: RunConfig, mesh_sizes: dict[str, int], stage_index: int = 0) -> StepShape:
  """Worst-case RL step: batch_prompts x group_size rows (kept after RoC), padded to the
  bucket of max_prompt_tokens + the stage's response budget, rows rounded up to the row
  multiple (data-parallel size x micro-batches) as the loop does."""
  budget = cfg.stages[stage_index].response_budget if cfg.stages else cfg.rollout.response_budget
  seq = length_bucket(cfg.rollout.max_prompt_tokens + budget, cfg.train.length_bucket)
  m = cfg.train.micro_batches
  rows = _round_up(cfg.train.batch_prompts * cfg.rl.group_size, data_parallel_size(mesh_sizes) * m)
  return StepShape(kind="rl", rows=rows, seq_len=seq, num_micro_batches=m)


def sft_shape(sft_cfg: RunConfig, mesh_sizes: dict[str, int]) -> StepShape:
  """SFT step as the SFT loop runs it: sft.batch_size rows (rounded up to the row multiple),
  padded to the bucket of sft.max_seq_len (the longest a row can be)."""
  m = sft_cfg.train.micro_batches
  rows = _round_up(sft_cfg.sft.batch_size, data_parallel_size(mesh_sizes) * m)
  seq = length_bucket(sft_cfg.sft.max_seq_len)
  return StepShape(kind="sft", rows=rows, seq_len=seq, num_micro_batches=m)


def _round_up(n: int, k: int) -> int:
  return -(-n // k) * k


# ----------------------------------------------------------------------------- counting


def param_count(config: qwen3.Qwen3Config) -> int:
  shapes = jax.tree.leaves(qwen3.param_shapes(config), is_leaf=lambda x: isinstance(x, tuple))
  return sum(math.prod(s) for s in shapes)


def forward_flops_per_row(c: qwen3.Qwen3Config, seq_len: int) -> dict[str, float]:
  """Matmul + attention FLOPs of one forward over one row of T tokens, as this model code
  computes them: dense layers 2*in*out per token; attention scores and weighted sum over the
  full T x T block for ``attention="xla"`` (it materialises it; causality is a mask, not
  skipped work), over the causal key blocks only for "blockwise" (nb (nb + 1) / 2 of nb^2
  blocks of ``attention_block_size``) and the causal triangle for "fused"; logits 2*D*V per
  token. Returns {"layers", "logits"} so remat (which recomputes only the layers) can be
  counted."""
  t, d, f, dh = seq_len, c.hidden_size, c.intermediate_size, c.head_dim
  hq, hkv = c.num_attention_heads, c.num_key_value_heads
  proj = 2 * t * d * (hq * dh + 2 * hkv * dh) + 2 * t * hq * dh * d
  attn = 2 * 2 * t * t * hq * dh
  if c.attention == "blockwise":
    nb = -(-t // min(c.attention_block_size, t))
    attn = attn * (nb + 1) / (2 * nb)
  elif c.attention == "fused":
    attn = attn * (t + 1) / (2 * t)
  mlp = 2 * t * 3 * d * f
  layers = c.num_hidden_layers * (proj + attn + mlp)
  logits = 2 * t * d * c.vocab_size
  return {"layers": float(layers), "logits": float(logits)}


def step_flops(c: qwen3.Qwen3Config, shape: StepShape) -> dict[str, float]:
  """FLOPs of one learner step over the whole batch (all devices).

  model: forward + backward (backward = 2 x forward), the usual MFU numerator.
  hardware: model + the remat re-forward of the layers when ``c.remat``.
  """
  fw = forward_flops_per_row(c, shape.seq_len)
  model = 3.0 * (fw["layers"] + fw["logits"]) * shape.rows
  hardware = model + (fw["layers"] * shape.rows if c.remat else 0.0)
  return {
    "model": model,
    "hardware": hardware,
    "logprob_forward": (fw["layers"] + fw["logits"]) * shape.rows,
  }


def sharded_bytes(abstract_tree, shardings_tree) -> int:
  """Per-device bytes of a pytree laid out on ``shardings_tree`` (largest shard per leaf)."""
  total = 0
  for a, s in zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(shardings_tree)):
    shard = s.shard_shape(a.shape) if a.shape else ()
    total += math.prod(shard) * jnp.dtype(a.dtype).itemsize
  return total


def count_collectives(hlo_text: str) -> dict[str, int]:
  """Static counts of collective ops in optimized HLO text (async ``-start`` pairs count
  once; an op inside a loop body counts once)."""
  out = {}
  for name in COLLECTIVES:
    sync = len(re.findall(rf"= [^\n=]*? {name}\(", hlo_text))
    start = len(re.findall(rf"= [^\n=]*? {name}-start\(", hlo_text))
    out[name] = sync + start
  return out


# ----------------------------------------------------------------------------- compiling


def abstract_state(model_config: qwen3.Qwen3Config, tx, param_dtype) -> TrainState:
  """TrainState of ShapeDtypeStructs (no allocation)."""
  params = jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s, jnp.dtype(param_dtype)),
    qwen3.param_shapes(model_config),
    is_leaf=lambda x: isinstance(x, tuple),
  )
  return jax.eval_shape(lambda p: TrainState.create(p, tx, 0), params)


def _with_shardings(abstract, shardings):
  return jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
  )


def abstract_batch(
  shape: StepShape, js: steps.JittedSteps, packed: bool = False
) -> dict[str, jax.ShapeDtypeStruct]:
  """The step's batch as ShapeDtypeStructs; ``packed`` adds segment_ids / positions and
  per-token advantages (learner/packing.py)."""
  keys = js.config.rl_keys if shape.kind == "rl" else steps.SFT_KEYS
  if packed:
    keys = keys + PACKING_KEYS
  dtypes = {
    "input_ids": jnp.int32,
    "attention_mask": jnp.int32,
    "loss_mask": jnp.float32,
    "old_logprobs": jnp.float32,
    "behaviour_logprobs": jnp.float32,
    "advantages": jnp.float32,
    "segment_ids": jnp.int32,
    "positions": jnp.int32,
  }
  out = {}
  for k in keys:
    dims = (shape.rows,) if k == "advantages" and not packed else (shape.rows, shape.seq_len)
    sds = jax.ShapeDtypeStruct(dims, dtypes[k])
    out[k] = jax.ShapeDtypeStruct(dims, dtypes[k], sharding=js.batch_sharding(sds))
  return out


def memory_bytes(compiled) -> dict[str, int]:
  """Per-device bytes of a compiled step (``memory_analysis()``); ``peak_bytes`` is
  argument + output - alias + temp (donated state buffers are reused for the new state)."""
  mem = compiled.memory_analysis()
  arg = int(mem.argument_size_in_bytes)
  out = int(mem.output_size_in_bytes)
  alias = int(mem.alias_size_in_bytes)
  temp = int(mem.temp_size_in_bytes)
  return {
    "argument_bytes": arg,
    "output_bytes": out,
    "alias_bytes": alias,
    "temp_bytes": temp,
    "peak_bytes": arg + out - alias + temp,
  }


def compile_step(
  shape: StepShape,
  model_config: qwen3.Qwen3Config,
  mesh,
  tx,
  step_config: steps.StepConfig,
  param_dtype,
  packed: bool = False,
  lora_cfg: lora.LoraConfig | None = None,
) -> dict[str, Any]:
  """Lowers and compiles the project's jitted step for ``shape`` (``packed``: with packed-row
  inputs; ``lora_cfg``: a LoRA policy, as `wiring.build_learner` builds it: frozen base,
  adapter-only optimizer); returns the raw analyses."""
  if lora_cfg is None:
    js = steps.make_jitted_steps(model_config, mesh, "train", tx=tx, config=step_config)
    abstract = abstract_state(model_config, tx, param_dtype)
  else:
    abstract_params = lora.abstract_params(model_config, lora_cfg, param_dtype)
    tx = lora_training.optimizer(tx, abstract_params)
    js = steps.make_lora_jitted_steps(
      model_config, lora_cfg, mesh, tx=tx, config=step_config, param_dtype=param_dtype
    )
    abstract = jax.eval_shape(lambda p: TrainState.create(p, tx, 0), abstract_params)
  state = _with_shardings(abstract, js.state_shardings)
  batch = abstract_batch(shape, js, packed)
  t0 = time.perf_counter()
  # The very jit objects the learner runs (`JittedSteps.jitted`), lowered under its mesh and
  # activation layout: what is planned is what trains.
  lowered = js.lower("rl_step" if shape.kind == "rl" else "sft_step", state, batch)
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2 = time.perf_counter()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  hlo = compiled.as_text()
  return {
    **memory_bytes(compiled),
    "state_bytes": sharded_bytes(state, js.state_shardings),
    "params_bytes": sharded_bytes(state.params, js.state_shardings.params),
    "batch_bytes": sharded_bytes(batch, {k: v.sharding for k, v in batch.items()}),
    "xla_flops_raw": float((cost or {}).get("flops", 0.0)),
    "collectives": count_collectives(hlo),
    "lower_s": round(t1 - t0, 2),
    "compile_s": round(t2 - t1, 2),
  }


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hardware:
  """Accelerator assumptions of the plan.

  Attributes:
      hbm_gib: HBM per device (MI300X: 192 GiB).
      mem_fraction: fraction XLA may use (XLA_PYTHON_CLIENT_MEM_FRACTION; .93 for a learner
          on its own GPUs, lower when an SGLang server shares the GPU).
      peak_tflops: dense bf16 peak per device (MI300X: 1307).
      mfu: assumed model-FLOPs utilisation for the implied step time.
  """

  hbm_gib: float = 192.0
  mem_fraction: float = 0.93
  peak_tflops: float = 1307.0
  mfu: float = 0.35
  packed_fill: float | None = None
  """Mean trajectory length / T assumed for the packed-rows FLOPs (None: not reported)."""

  def __post_init__(self):
    if self.packed_fill is not None and not 0 < self.packed_fill <= 1:
      raise ValueError(
        f"Hardware.packed_fill: expected None or in (0, 1], got {self.packed_fill!r}"
      )
    if not self.hbm_gib > 0:
      raise ValueError(f"Hardware.hbm_gib: expected > 0, got {self.hbm_gib!r}")
    if not 0 < self.mem_fraction <= 1:
      raise ValueError(f"Hardware.mem_fraction: expected in (0, 1], got {self.mem_fraction!r}")
    if not 0 < self.mfu <= 1:
      raise ValueError(f"Hardware.mfu: expected in (0, 1], got {self.mfu!r}")


def plan_step(
  shape: StepShape,
  model_config: qwen3.Qwen3Config,
  mesh,
  tx,
  step_config: steps.StepConfig,
  param_dtype,
  hw: Hardware,
  lora_cfg: lora.LoraConfig | None = None,
) -> dict[str, Any]:
  """Compiles one step and derives the fit, FLOPs and implied step time."""
  packed = hw.packed_fill is not None and (shape.kind == "sft" or step_config.agg == "token-mean")
  r = compile_step(shape, model_config, mesh, tx, step_config, param_dtype, packed, lora_cfg)
  n = mesh.devices.size
  usable = hw.hbm_gib * GIB * hw.mem_fraction
  fl = step_flops(model_config, shape)
  step_s = fl["model"] / (n * hw.mfu * hw.peak_tflops * 1e12)
  if packed:
    # Packed rows (learner/packing.py): the same trajectories in ~fill x rows rows of T
    # (first-fit-decreasing wastes little when most trajectories are short). A micro-batch
    # keeps its rows per device (so the memory above holds) and there are fewer of them:
    # train.micro_batches = the "micro_batches" below. Per-row cost is unchanged (a packed
    # row is a full T row), so the FLOPs scale with the row count.
    per_micro = shape.rows // shape.num_micro_batches  # rows of one micro-batch
    rows_p = min(shape.rows, _round_up(math.ceil(shape.rows * hw.packed_fill), per_micro))
    flp = step_flops(model_config, dataclasses.replace(shape, rows=rows_p))
    r["packed"] = {
      "assumed_fill": hw.packed_fill,
      "rows": rows_p,
      "micro_batches": rows_p // per_micro,
      "flops_per_step": flp["hardware"],
      "model_flops_per_step": flp["model"],
      "implied_step_s": flp["model"] / (n * hw.mfu * hw.peak_tflops * 1e12),
      "note": "assumed_fill = mean trajectory length / T of the step's rows (an input, "
      "plan.packed_fill); FLOPs of the packed rows as computed",
    }
  r.update(
    {
      "shape": dataclasses.asdict(shape),
      "per_device_bytes": r["peak_bytes"],
      "usable_bytes": int(usable),
      "headroom_bytes": int(usable - r["peak_bytes"]),
      "fits": bool(r["peak_bytes"] <= usable),
      "flops_per_step": fl["hardware"],
      "model_flops_per_step": fl["model"],
      "logprob_recompute_flops": fl["logprob_forward"],
      "tokens_per_step": shape.rows * shape.seq_len,
      "implied_step_s": step_s,
    }
  )
  return r


def make_plan(cfg: RunConfig, mesh, hw: Hardware, shapes: list[StepShape]) -> dict[str, Any]:
  """The whole plan: per step kind, and a top-level summary (the worst step decides ``fits``).

  ``cfg`` supplies the model (see `model_config_for_plan`), param dtype, optimizer and loss
  settings; ``mesh`` is a mesh over fake (or real) devices. With ``model.lora_rank > 0`` the
  steps are planned for the LoRA policy and, for comparison, for full fine-tuning of the same
  config: ``lora`` gives both peaks per step and the bytes LoRA saves per device.
  """
  mc = model_config_for_plan(cfg)
  oc = cfg.optim.learner_config(total_steps=1000)
  tx = optim.make_optimizer(oc)
  lora_cfg = cfg.model.lora_config(base="plan")
  results, full = {}, {}
  for shape in shapes:
    sc = cfg.step_config(oc, num_micro_batches=shape.num_micro_batches)
    results[shape.kind] = plan_step(
      shape, mc, mesh, tx, sc, cfg.model.param_dtype, hw, lora_cfg=lora_cfg
    )
    if lora_cfg is not None:
      full[shape.kind] = plan_step(shape, mc, mesh, tx, sc, cfg.model.param_dtype, hw)
  worst = max(results.values(), key=lambda r: r["per_device_bytes"])
  lora_summary = None
  if lora_cfg is not None:
    lora_summary = {
      "rank": lora_cfg.rank,
      "targets": list(lora_cfg.targets),
      "adapter_params": lora.adapter_param_count(mc, lora_cfg),
      "full_finetune_per_device_bytes": {k: r["per_device_bytes"] for k, r in full.items()},
      "full_finetune_state_bytes": {k: r["state_bytes"] for k, r in full.items()},
      "full_finetune_fits": {k: r["fits"] for k, r in full.items()},
      "saved_bytes": {
        k: full[k]["per_device_bytes"] - r["per_device_bytes"] for k, r in results.items()
      },
    }
  return {
    "lora": lora_summary,
    "model": dataclasses.asdict(mc),
    "param_count": param_count(mc),
    "param_dtype": cfg.model.param_dtype,
    "mesh": dict(mesh.shape),
    "num_devices": int(mesh.devices.size),
    "hardware": dataclasses.asdict(hw),
    "steps": results,
    "per_device_bytes": worst["per_device_bytes"],
    "headroom_bytes": worst["headroom_bytes"],
    "fits": all(r["fits"] for r in results.values()),
    "flops_per_step": results[shapes[0].kind]["flops_per_step"],
    "flops_per_step_packed": results[shapes[0].kind].get("packed", {}).get("flops_per_step"),
    "notes": (
      "memory: CPU XLA buffer assignment of the partitioned program, an estimate "
      "for GPU; flops_per_step: analytic count incl. remat (XLA cost analysis "
      "counts a scanned loop body once; raw value in xla_flops_raw); collectives: "
      "static op counts in the optimized HLO"
    ),
  }


def sft_variant(main_cfg: RunConfig, config_path: str | None) -> RunConfig:
  """The SFT shapes for a run config: the config itself in SFT mode, else the same file's
  ``get_config("sft")`` with this config's ``model``, ``mesh`` and ``plan`` sections (so
  command-line overrides of those apply to both steps)."""
  if main_cfg.mode == "sft":
    return main_cfg
  if not config_path:
    raise ValueError(
      "planning the SFT step of an RL config needs its file path (to load its ':sft' variant)"
    )
  import importlib.util

  path = config_path.split(":")[0]
  spec = importlib.util.spec_from_file_location("_rstar_plan_config", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  sft = from_config_dict(mod.get_config("sft"), "sft", check_inputs=False)
  return dataclasses.replace(sft, model=main_cfg.model, mesh=main_cfg.mesh, plan=main_cfg.plan)


def plan_config(
  cfg: RunConfig,
  *,
  num_devices: int,
  hw: Hardware,
  steps_to_plan=("rl", "sft"),
  stage_index: int = 0,
  config_path: str | None = None,
) -> dict[str, Any]:
  """`make_plan` for a run config on the first ``num_devices`` devices and its own mesh.

  ``steps_to_plan``: "rl" (needs an RL-mode config; shapes of stage ``stage_index``) and/or
  "sft" (shapes from `sft_variant`).
  """
  if jax.device_count() < num_devices:
    raise ValueError(
      f"only {jax.device_count()} devices for num_devices={num_devices}; set "
      f"XLA_FLAGS=--xla_force_host_platform_device_count={num_devices} "
      "before jax starts (launchers.plan does)"
    )
  mesh = make_mesh(cfg.mesh.axes, jax.devices()[:num_devices])
  sizes = dict(mesh.shape)
  shapes = []
  for kind in steps_to_plan:
    if kind == "rl":
      if cfg.mode != "rl":
        raise ValueError(f"planning rl_step needs an RL-mode config, got mode {cfg.mode!r}")
      shapes.append(rl_shape(cfg, sizes, stage_index))
    elif kind == "sft":
      shapes.append(sft_shape(sft_variant(cfg, config_path), sizes))
    else:
      raise ValueError(f"unknown step {kind!r}; expected 'rl' or 'sft'")
  return make_plan(cfg, mesh, hw, shapes)


def format_table(plan: dict[str, Any]) -> str:
  """Human-readable summary of `make_plan`'s result."""
  g = lambda b: f"{b / GIB:8.2f}"
  lines = [
    f"model params {plan['param_count'] / 1e9:.2f} B ({plan['param_dtype']}), mesh "
    f"{plan['mesh']} = {plan['num_devices']} devices, HBM "
    f"{plan['hardware']['hbm_gib']} GiB x {plan['hardware']['mem_fraction']} usable",
    f"{'step':5} {'rows':>6} {'T':>6} {'M':>5} {'state':>8} {'args':>8} {'temp':>8} "
    f"{'peak':>8} {'headroom':>9} {'fits':>5} {'PFLOP/step':>11} {'step_s@MFU':>10} "
    f"{'compile_s':>9}",
  ]
  for kind, r in plan["steps"].items():
    s = r["shape"]
    lines.append(
      f"{kind:5} {s['rows']:6d} {s['seq_len']:6d} {s['num_micro_batches']:5d} "
      f"{g(r['state_bytes'])} {g(r['argument_bytes'])} {g(r['temp_bytes'])} "
      f"{g(r['per_device_bytes'])} {g(r['headroom_bytes'])} "
      f"{str(r['fits']):>5} {r['flops_per_step'] / 1e15:11.1f} "
      f"{r['implied_step_s']:10.1f} {r['compile_s']:9.1f}"
    )
  for kind, r in plan["steps"].items():
    lines.append(
      f"{kind} collectives (static ops): "
      + ", ".join(f"{k} {v}" for k, v in r["collectives"].items())
    )
  for kind, r in plan["steps"].items():
    if "packed" in r:
      pk = r["packed"]
      lines.append(
        f"{kind} packed rows (assumed fill {pk['assumed_fill']}): {pk['rows']} "
        f"rows, {pk['micro_batches']} micro-batches, "
        f"{pk['flops_per_step'] / 1e15:.1f} PFLOP/step, "
        f"{pk['implied_step_s']:.1f} s @ MFU"
      )
  lo = plan.get("lora")
  if lo:
    for kind, r in plan["steps"].items():
      lines.append(
        f"{kind} LoRA r={lo['rank']} ({lo['adapter_params'] / 1e6:.1f} M adapter params): "
        f"peak {r['per_device_bytes'] / GIB:.2f} GiB vs full fine-tuning "
        f"{lo['full_finetune_per_device_bytes'][kind] / GIB:.2f} GiB "
        f"(state {r['state_bytes'] / GIB:.2f} vs "
        f"{lo['full_finetune_state_bytes'][kind] / GIB:.2f} GiB): saves "
        f"{lo['saved_bytes'][kind] / GIB:.2f} GiB per device"
      )
  lines.append(
    f"fits: {str(plan['fits']).lower()} (per-device peak "
    f"{plan['per_device_bytes'] / GIB:.2f} GiB, headroom "
    f"{plan['headroom_bytes'] / GIB:.2f} GiB)"
  )
  lines.append(
    "(GiB per device; peak = args + outputs - aliased + temp; step_s at MFU "
    f"{plan['hardware']['mfu']} of {plan['hardware']['peak_tflops']} TFLOP/s)"
  )
  return "\n".join(lines)

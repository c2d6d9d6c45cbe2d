"""Ahead-of-time memory / FLOP plan of a run config on N fake devices (no accelerator needed).

  python -m launchers.plan --config=configs/rstar2_qwen3_14b.py --num_devices=64 \
      --hbm_gib=192 --out=plan.json
  python -m launchers.plan --config=configs/aster_qwen3_4b.py --num_devices=64 --out=aster.json
  python -m launchers.plan --config=configs/rstar2_qwen3_14b.py --config.mesh.tensor=4 ...

Compiles the real rl_step (the config's first stage by default) and sft_step (the same file's
":sft" variant, on this config's mesh and model) for --num_devices CPU devices and writes
plan.json. Logic: rstar_jax/planning/plan.py.
"""
import os
import sys


def _early_num_devices(argv) -> int:
  # XLA reads the fake device count once, when jax initialises its CPU backend; absl parses
  # flags only after the imports below, so peek at argv first.
  for i, a in enumerate(argv):
    if a.startswith("--num_devices="):
      return int(a.split("=", 1)[1])
    if a == "--num_devices" and i + 1 < len(argv):
      return int(argv[i + 1])
  return 64


if __name__ == "__main__":
  _n = _early_num_devices(sys.argv)
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={_n}").strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

import importlib.util  # noqa: E402
import json  # noqa: E402

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file (RL or SFT mode).")
_NUM_DEVICES = flags.DEFINE_integer("num_devices", 64, "Fake devices to plan for (read before "
                                    "jax starts).")
_HBM = flags.DEFINE_float("hbm_gib", None, "HBM per device in GiB (default: plan.hbm_gib or "
                          "192, MI300X).")
_MEM_FRACTION = flags.DEFINE_float("mem_fraction", None, "Usable HBM fraction (default: "
                                   "plan.mem_fraction or 0.93).")
_MFU = flags.DEFINE_float("mfu", None, "Assumed MFU for the implied step time (default: "
                          "plan.mfu or 0.35).")
_PEAK = flags.DEFINE_float("peak_tflops", 1307.0, "Dense bf16 peak per device (MI300X 1307).")
_STEPS = flags.DEFINE_list("steps", ["rl", "sft"], "Which steps to compile: rl, sft.")
_STAGE = flags.DEFINE_integer("stage", 0, "RL stage index whose response budget sets T.")
_OUT = flags.DEFINE_string("out", None, "Write the plan here as JSON.")


def _sft_variant(main_cfg):
  """The config file's ":sft" variant with this run's mesh, model and plan sections."""
  if main_cfg.mode == "sft":
    return main_cfg
  path = config_flags.get_config_filename(flags.FLAGS["config"]).split(":")[0]
  spec = importlib.util.spec_from_file_location("_plan_cfg", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  sft = mod.get_config("sft")
  sft.unlock()
  for section in ("model", "mesh"):
    sft[section] = main_cfg[section]
  if "plan" in main_cfg:
    sft.plan = main_cfg.plan
  return sft


def main(argv):
  del argv
  import jax
  from rstar_jax.planning import plan as plan_lib
  from rstar_jax.sharding.mesh import make_mesh

  cfg = _CONFIG.value
  if jax.device_count() < _NUM_DEVICES.value:
    raise SystemExit(f"only {jax.device_count()} devices; run as `python -m launchers.plan` so "
                     "--num_devices is applied before jax starts")
  p = cfg.get("plan", {}) if "plan" in cfg else {}
  hw = plan_lib.Hardware(
      hbm_gib=_HBM.value or p.get("hbm_gib", 192.0),
      mem_fraction=_MEM_FRACTION.value or p.get("mem_fraction", 0.93),
      peak_tflops=_PEAK.value, mfu=_MFU.value or p.get("mfu", 0.35))
  mesh = make_mesh({k: int(cfg.mesh[k]) for k in ("data", "fsdp", "tensor")},
                   jax.devices()[:_NUM_DEVICES.value])
  sizes = dict(mesh.shape)
  shapes = []
  for kind in _STEPS.value:
    if kind == "rl":
      if cfg.mode != "rl":
        raise SystemExit("--steps=rl needs an RL-mode config")
      shapes.append(plan_lib.rl_shape(cfg, sizes, _STAGE.value))
    elif kind == "sft":
      shapes.append(plan_lib.sft_shape(_sft_variant(cfg), sizes))
    else:
      raise SystemExit(f"--steps: unknown step {kind!r} (expected rl, sft)")
  result = plan_lib.make_plan(cfg, mesh, hw, shapes)
  print(plan_lib.format_table(result))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(result, f, indent=1)
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)

"""Ahead-of-time memory / FLOP plan of a run config on N fake devices (no accelerator needed).

  python -m launchers.plan --config=configs/rstar2_qwen3_14b.py --num_devices=64 \
      --hbm_gib=192 --out=plan.json
  python -m launchers.plan --config=configs/aster_qwen3_4b.py --num_devices=64 --out=aster.json
  python -m launchers.plan --config=configs/rstar2_qwen3_14b.py --config.train.micro_batches=256 \
      --mem_fraction=0.93 --steps=rl

Compiles the real rl_step (the config's first stage by default) and sft_step (the same file's
":sft" variant, on this config's mesh and model) for --num_devices CPU devices, prints a table
and writes plan.json. Logic: rstar_jax/planning/plan.py; runbook: third_party/rocm/README.md.
"""

import os
import sys


def _early_num_devices(argv) -> int:
  # XLA reads the fake device count once, when jax starts its CPU backend; absl parses flags
  # only after the imports below, so peek at argv first.
  for i, a in enumerate(argv):
    if a.startswith("--num_devices="):
      return int(a.split("=", 1)[1])
    if a == "--num_devices" and i + 1 < len(argv):
      return int(argv[i + 1])
  return 64


if __name__ == "__main__":
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_"
    f"device_count={_early_num_devices(sys.argv)}"
  ).strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from rstar_jax import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file (RL or SFT mode).")
_NUM_DEVICES = flags.DEFINE_integer(
  "num_devices", 64, "Fake devices to plan for (applied before jax starts)."
)
_HBM = flags.DEFINE_float(
  "hbm_gib", None, "HBM per device in GiB (default: plan.hbm_gib, else 192 = MI300X)."
)
_MEM_FRACTION = flags.DEFINE_float(
  "mem_fraction", None, "Usable HBM fraction (default: plan.mem_fraction, else 0.93)."
)
_MFU = flags.DEFINE_float(
  "mfu", None, "Assumed MFU for the implied step time (default: plan.mfu, else 0.35)."
)
_PEAK = flags.DEFINE_float("peak_tflops", 1307.0, "Dense bf16 peak per device (MI300X 1307).")
_STEPS = flags.DEFINE_list("steps", ["rl", "sft"], "Steps to compile: rl, sft.")
_STAGE = flags.DEFINE_integer("stage", 0, "RL stage (0-based) whose response budget sets T.")
_OUT = flags.DEFINE_string("out", None, "Write the plan here as JSON.")


def main(argv):
  del argv
  # Imported here: --help must not wait for jax, and jax must start after XLA_FLAGS is set.
  from rstar_jax.config import from_config_dict
  from rstar_jax.planning import plan as plan_lib

  run = from_config_dict(_CONFIG.value, check_inputs=False)
  p = run.plan
  hw = plan_lib.Hardware(
    hbm_gib=_HBM.value or p.hbm_gib,
    mem_fraction=_MEM_FRACTION.value or p.mem_fraction,
    peak_tflops=_PEAK.value,
    mfu=_MFU.value or p.mfu,
    packed_fill=(p.packed_fill or None) if run.train.pack_rows else None,
  )
  result = plan_lib.plan_config(
    run,
    num_devices=_NUM_DEVICES.value,
    hw=hw,
    steps_to_plan=tuple(_STEPS.value),
    stage_index=_STAGE.value,
    config_path=config_flags.get_config_filename(flags.FLAGS["config"]),
  )
  print(plan_lib.format_table(result))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(result, f, indent=1)
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  cli.run(main, required=["config"])

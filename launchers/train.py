"""GRPO-RoC RL training over the config's stages. No logic here.

  python -m launchers.train --config=configs/rstar2_qwen3_14b.py --workdir=/runs/rl
  python -m launchers.train --config=configs/rstar2_tiny_cpu.py --workdir=/tmp/rl
  python -m launchers.train --config=configs/rstar2_tiny_cpu.py --config.rl.roc_mode=random ...
Resumes from <workdir>/ckpt when present (same step, data position, stage).
"""
from absl import app, flags
from ml_collections import config_flags

from rstar_jax.config import from_config_dict
from rstar_jax.pipelines import rl_loop, runtime

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file (mode rl).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl, TensorBoard.")
_MAX_STEPS = flags.DEFINE_integer("max_steps", None, "Stop after this many RL steps "
                                  "(resumable).")


def main(argv):
  del argv
  runtime.setup_logging()
  runtime.maybe_initialize_distributed()
  run = from_config_dict(_CONFIG.value, "rl", check_paths=True)
  out = rl_loop.run_rl(run, _WORKDIR.value, max_steps=_MAX_STEPS.value)
  print(runtime.summary_json(out))


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)

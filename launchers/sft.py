"""Supervised fine-tuning (non-reasoning SFT / ASTER cold start). No logic here.

  python -m launchers.sft --config=configs/rstar2_qwen3_14b.py:sft --workdir=/runs/sft
  python -m launchers.sft --config=configs/rstar2_tiny_cpu.py:sft --workdir=/tmp/sft
Resumes from <workdir>/ckpt when present; writes <workdir>/hf (HF model + tokenizer) at the end.
"""
from absl import app, flags
from ml_collections import config_flags

from rstar_jax.config import from_config_dict
from rstar_jax.pipelines import runtime, sft_loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file (mode sft).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics and the exported model.")
_MAX_STEPS = flags.DEFINE_integer("max_steps", None, "Stop after this many steps (resumable).")


def main(argv):
  del argv
  runtime.setup_logging()
  runtime.maybe_initialize_distributed()
  run = from_config_dict(_CONFIG.value, "sft", check_paths=True)
  out = sft_loop.run_sft(run, _WORKDIR.value, max_steps=_MAX_STEPS.value)
  print(runtime.summary_json(out))


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)

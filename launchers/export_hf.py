"""Exports an orbax checkpoint's params as a Hugging Face model directory. No logic here.

  python -m launchers.export_hf --config=configs/rstar2_tiny_cpu.py \
      --checkpoint_dir=/tmp/rl/ckpt --tokenizer_dir=/tmp/rl/tokenizer --out_dir=/tmp/rl/hf
The directory loads with transformers `AutoModelForCausalLM.from_pretrained(out_dir)`.
"""
from absl import app, flags
from ml_collections import config_flags

from rstar_jax.config import from_config_dict
from rstar_jax.pipelines import runtime

_CONFIG = config_flags.DEFINE_config_file("config", None, "The run's config (model shape).",
                                          lock_config=True)
_CKPT = flags.DEFINE_string("checkpoint_dir", None, "An SFT/RL run's ckpt/ directory.")
_OUT = flags.DEFINE_string("out_dir", None, "Where to write the HF directory.")
_TOK = flags.DEFINE_string("tokenizer_dir", "", "Tokenizer to copy (default: the config's).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")


def main(argv):
  del argv
  runtime.setup_logging()
  run = from_config_dict(_CONFIG.value, check_inputs=False)
  step = runtime.export_checkpoint(run, _CKPT.value, _OUT.value,
                                   tokenizer_path=_TOK.value, step=_STEP.value)
  print(f"exported step {step} to {_OUT.value}")


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "checkpoint_dir", "out_dir"])
  app.run(main)

"""Exports an orbax checkpoint's params as a Hugging Face model directory. No logic here.

  python -m launchers.export_hf --config=configs/rstar2_tiny_cpu.py \
      --checkpoint_dir=/tmp/rl/ckpt --tokenizer_dir=/tmp/rl/tokenizer --out_dir=/tmp/rl/hf
The directory loads with transformers `AutoModelForCausalLM.from_pretrained(out_dir)`; its
tokenizer's chat template renders the prompts the run trained on, and generation_config.json
stops on the run's stop ids. A LoRA run (model.lora_rank > 0) writes the merged model, or with
--adapters_only PEFT adapters (`peft.PeftModel.from_pretrained(base_model, out_dir)`).
"""

import os

from absl import flags
from ml_collections import config_flags

from rstar_jax import cli
from rstar_jax.config import from_config_dict
from rstar_jax.errors import UserError
from rstar_jax.pipelines import hf_export, launch

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "The run's config (model shape).", lock_config=True
)
_CKPT = flags.DEFINE_string("checkpoint_dir", None, "An SFT/RL run's ckpt/ directory.")
_OUT = flags.DEFINE_string("out_dir", None, "Where to write the HF directory.")
_TOK = flags.DEFINE_string(
  "tokenizer_dir",
  "",
  "Tokenizer to copy (default: the config's, else <checkpoint_dir>/../tokenizer).",
)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
_ADAPTERS = flags.DEFINE_bool(
  "adapters_only",
  False,
  "LoRA runs: write PEFT-format adapters (adapter_config.json + adapter_model.safetensors) "
  "instead of the merged model.",
)
_DTYPE = flags.DEFINE_string(
  "dtype",
  "",
  "Tensor dtype: float32, bfloat16 or float16 (default: the source's, bfloat16 when the run "
  "started from a bf16 checkpoint or keeps bf16 params).",
)


def main(argv):
  del argv
  launch.setup_logging()
  launch.maybe_initialize_distributed()
  # Any mode: only the model shape (and tokenizer) are read.
  run = from_config_dict(_CONFIG.value, check_inputs=False)
  cli.check_dir(_CKPT.value, "--checkpoint_dir")
  cli.check_dir(_TOK.value, "--tokenizer_dir")
  cli.check_workdir(_OUT.value, "--out_dir")
  cli.check_model_dirs(run, need_tokenizer=False)  # the tokenizer has its own fallbacks
  # The tokenizer: the flag, else the config's (model.tokenizer_dir / hf_dir), else the one a
  # from-scratch run saved next to its ckpt/. A model directory without one is not loadable.
  run_tok = os.path.join(os.path.dirname(os.path.abspath(_CKPT.value)), "tokenizer")
  tok = (
    _TOK.value
    or run.tokenizer_dir()
    or (run_tok if os.path.isfile(os.path.join(run_tok, "tokenizer.json")) else "")
  )
  if not tok:
    raise UserError(
      "export_hf: no tokenizer to copy: pass --tokenizer_dir, or the run's "
      "--config.model.hf_dir / --config.model.tokenizer_dir"
    )
  step = hf_export.export_checkpoint(
    run,
    _CKPT.value,
    _OUT.value,
    tokenizer_path=tok,
    step=_STEP.value,
    adapters_only=_ADAPTERS.value,
    dtype=_DTYPE.value,
  )
  print(f"exported step {step} to {_OUT.value}")


if __name__ == "__main__":
  cli.run(main, required=["config", "checkpoint_dir", "out_dir"])

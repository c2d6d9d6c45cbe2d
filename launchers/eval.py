"""avg@k pass@1 evaluation with the agent loop; writes a JSON report. No logic here.

  python -m launchers.eval --config=configs/rstar2_qwen3_14b.py:eval \
      --config.eval.path=/data/aime24.jsonl --out=/runs/eval/aime24.json
  python -m launchers.eval --config=configs/rstar2_tiny_cpu.py:eval \
      --checkpoint_dir=/tmp/rl/ckpt --out=/tmp/eval.json --workdir=/tmp/rl
"""

import logging
import os

from absl import flags
from ml_collections import config_flags

from rstar_jax import cli

log = logging.getLogger(__name__)

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Run config file (mode eval).", lock_config=True
)
_OUT = flags.DEFINE_string("out", None, "Path of the JSON report.")
_CKPT = flags.DEFINE_string(
  "checkpoint_dir",
  "",
  "Evaluate the latest orbax checkpoint here (an SFT/RL run's ckpt/) instead of config.model.",
)
_WORKDIR = flags.DEFINE_string(
  "workdir",
  "",
  "Run directory holding the tokenizer of a from-scratch model (<workdir>/tokenizer).",
)


def main(argv):
  del argv
  # Imported here: --help and --describe_config must not wait for jax (~4 s).
  from rstar_jax.pipelines import evaluation, launch

  launch.setup_logging()
  run = cli.typed_config(_CONFIG.value, "eval", "launchers.eval", check_paths=True)
  cli.check_checkpoint_dir(_CKPT.value, "--checkpoint_dir")
  cli.check_dir(_WORKDIR.value, "--workdir")
  cli.check_workdir(os.path.dirname(os.path.abspath(_OUT.value)), "--out")
  cli.check_model_dirs(run)
  log.info("%s", launch.run_line(run, "launchers.eval"))
  mismatch = evaluation.recipe_mismatch_warning(run, _CKPT.value)
  if mismatch:
    log.warning("%s", mismatch)
  launch.maybe_initialize_distributed()
  cli.check_devices(run)
  report = evaluation.run_eval(run, _OUT.value, checkpoint_dir=_CKPT.value, workdir=_WORKDIR.value)
  print(launch.summary_json(report["metrics"]))


if __name__ == "__main__":
  cli.run(main, required=["config", "out"])

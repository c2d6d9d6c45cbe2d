"""avg@k pass@1 evaluation with the agent loop; writes a JSON report. No logic here.

  python -m launchers.eval --config=configs/rstar2_qwen3_14b.py:eval \
      --config.eval.path=/data/aime24.jsonl --out=/runs/eval/aime24.json
  python -m launchers.eval --config=configs/rstar2_tiny_cpu.py:eval \
      --checkpoint_dir=/tmp/rl/ckpt --out=/tmp/eval.json --workdir=/tmp/rl
"""
from absl import app, flags
from ml_collections import config_flags

from rstar_jax.config import from_config_dict
from rstar_jax.pipelines import evaluation, runtime

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file (mode eval).",
                                          lock_config=True)
_OUT = flags.DEFINE_string("out", None, "Path of the JSON report.")
_CKPT = flags.DEFINE_string("checkpoint_dir", "", "Evaluate the latest orbax checkpoint here "
                            "(an SFT/RL run's ckpt/) instead of config.model.")
_WORKDIR = flags.DEFINE_string("workdir", "", "Run directory holding the tokenizer of a "
                               "from-scratch model (<workdir>/tokenizer).")


def main(argv):
  del argv
  runtime.setup_logging()
  runtime.maybe_initialize_distributed()
  run = from_config_dict(_CONFIG.value, "eval", check_paths=True)
  report = evaluation.run_eval(run, _OUT.value, checkpoint_dir=_CKPT.value,
                               workdir=_WORKDIR.value)
  print(runtime.summary_json(report["metrics"]))


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "out"])
  app.run(main)

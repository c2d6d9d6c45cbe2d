"""Supervised fine-tuning (non-reasoning SFT / ASTER cold start). No logic here.

  python -m launchers.sft --config=configs/rstar2_qwen3_14b.py:sft --workdir=/runs/sft
  python -m launchers.sft --config=configs/rstar2_tiny_cpu.py:sft --workdir=/tmp/sft
Resumes from <workdir>/ckpt when present, if the config is the one it ran with
(<workdir>/resolved_config/; --discard_stale starts over); writes <workdir>/hf (HF model + tokenizer) at the end.
Ctrl-C checkpoints the step reached and ends with "interrupted at step N; rerun the same
command to resume".
--max_restarts=N restarts the learner process(es) after a crash, from the last checkpoint
(rstar_jax/pipelines/README.md, "Restarts after a crash").
"""

import logging

from absl import flags
from ml_collections import config_flags

from rstar_jax import cli, run_record

log = logging.getLogger(__name__)

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Run config file (mode sft).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics and the exported model.")
_DISCARD = flags.DEFINE_bool(
  "discard_stale",
  False,
  "When --workdir holds a run made with a "
  "different config: delete its outputs and start over (default: stop).",
)
_MAX_STEPS = flags.DEFINE_integer("max_steps", None, "Stop after this many steps (resumable).")


def main(argv):
  del argv
  # Imported here: --help and --describe_config must not wait for jax (~4 s).
  from rstar_jax.pipelines import launch, sft_loop, workdir_lock

  launch.setup_logging()
  run = cli.typed_config(_CONFIG.value, "sft", "launchers.sft", check_paths=True)
  cli.check_workdir(_WORKDIR.value)
  cli.check_model_dirs(run)
  log.info("%s", launch.run_line(run, "launchers.sft"))
  workdir_lock.acquire(_WORKDIR.value)  # one run per workdir (a second launch stops)
  # A resume must continue the same run: a changed config stops here (one line naming the
  # changed fields) instead of mixing two runs' checkpoints and metrics.
  run_record.record_or_check(
    _WORKDIR.value,
    "sft",
    run,
    outputs=("ckpt", "hf", "tokenizer", "sft_metrics.jsonl"),
    discard_stale=_DISCARD.value,
  )
  launch.maybe_initialize_distributed()
  cli.check_devices(run)
  out = sft_loop.run_sft(run, _WORKDIR.value, max_steps=_MAX_STEPS.value)
  print(launch.summary_json(out))


if __name__ == "__main__":
  cli.run(
    main,
    on_interrupt=lambda: cli.sft_interrupted_line(_WORKDIR.value),
    required=["config", "workdir"],
    workdir=lambda: _WORKDIR.value,
    supervisable=True,  # --max_restarts=N (rstar_jax.pipelines.supervisor)
  )

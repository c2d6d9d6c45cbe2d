"""The main-job demo: cold-start SFT -> eval -> GRPO-RoC -> eval on a CPU. No logic here.

  python -m launchers.demo --workdir=/tmp/demo_run
  python -m launchers.demo --workdir=/tmp/demo_grpo --rl.roc_mode=random    (plain GRPO ablation)
  python -m launchers.demo --workdir=/tmp/demo_grpo --rl.roc_mode=random \\
      --config.demo.reuse_sft_from=/tmp/demo_run       (same SFT model, only RL + eval rerun)
Any config field can be overridden (--config.rl.group_size=4, ...). Rerunning with the same
--workdir skips finished phases and resumes the unfinished one, if they ran with the same
config; otherwise it stops and names the changed fields (--discard_stale reruns those phases).
"""

import logging
import os

from absl import flags
from ml_collections import config_flags

from rstar_jax import cli

log = logging.getLogger(__name__)

_CONFIG = config_flags.DEFINE_config_file(
  "config",
  os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "demo.py"),
  "Demo config file.",
  lock_config=False,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output folder (summary.json, plot, ckpts).")
_ROC_MODE = flags.DEFINE_enum(
  "rl.roc_mode",
  None,
  ["paper", "released", "random"],
  "Shorthand for --config.rl.roc_mode (random = plain GRPO).",
)
_DISCARD = flags.DEFINE_bool(
  "discard_stale",
  False,
  "Delete the outputs of phases that ran with a different config and rerun them (default: stop).",
)


def main(argv):
  del argv
  # Imported here: --help and --describe_config must not wait for jax (~4 s).
  from rstar_jax.pipelines import demo, launch, workdir_lock

  launch.setup_logging()
  cli.check_workdir(_WORKDIR.value)
  workdir_lock.acquire(_WORKDIR.value)  # one run per workdir (a second launch stops)
  cfg = _CONFIG.value
  if _ROC_MODE.value:
    cfg.rl.roc_mode = _ROC_MODE.value
  run = cli.typed_config(cfg, "rl", "launchers.demo")
  cli.check_model_dirs(run)
  log.info("%s", launch.run_line(run, "launchers.demo"))
  cli.check_devices(run)
  demo.run_demo(run, _WORKDIR.value, discard_stale=_DISCARD.value)


if __name__ == "__main__":
  cli.run(
    main,
    on_interrupt=lambda: cli.demo_interrupted_line(_WORKDIR.value),
    required=["workdir"],
  )

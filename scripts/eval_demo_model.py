"""Held-out evaluation of a finished demo run's model under other sampling settings (diagnosis).

The demo's own evaluation (`rstar_jax.pipelines.demo`: same held-out problems, tokenizer and
chat format) of `<workdir>/sft/hf` or `<workdir>/rl/hf`, with any config field overridden, e.g.
whether bf16 sampling is what costs a MoE demo its accuracy (docs/routing_replay.md):

  python scripts/eval_demo_model.py --config=configs/demo.py:moe --workdir=W \
      --config.model.moe_intermediate_size=96 --config.rollout.dtype=float32 --out=/tmp/f32.json
  ... --config.eval.temperature=0 (greedy)

Prints one JSON line (accuracy, truncation and tool-error rates, wall time); --out keeps the
whole report. The config must describe the model the run trained (its architecture fields).
"""

import asyncio
import json
import os
import sys
import time

# The config files import `configs.common`: the repository root must be importable when the
# script is run as `python scripts/eval_demo_model.py` (sys.path[0] is then scripts/).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from rstar_jax import cli  # noqa: E402
from rstar_jax.errors import UserError  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "The run's demo config.")
_WORKDIR = flags.DEFINE_string("workdir", None, "The finished demo run.")
_MODEL = flags.DEFINE_enum("model", "sft", ["sft", "rl"], "Which exported model to evaluate.")
_OUT = flags.DEFINE_string("out", "", "Where to write the whole report (JSON).")


def main(argv):
  del argv
  # Imported here: --help must not wait for jax.
  from transformers import AutoTokenizer

  from rstar_jax.models import qwen3
  from rstar_jax.pipelines import demo

  run = cli.typed_config(_CONFIG.value, "rl", "scripts/eval_demo_model.py")
  hf = os.path.join(_WORKDIR.value, _MODEL.value, "hf")
  for need in (hf, os.path.join(_WORKDIR.value, "tokenizer")):
    if not os.path.isdir(need):
      raise UserError(f"--workdir={_WORKDIR.value}: no {need} (expected a finished demo run)")
  tok = AutoTokenizer.from_pretrained(os.path.join(_WORKDIR.value, "tokenizer"))
  params = qwen3.load_hf_params(hf, run.model.qwen3_config())
  _, held = demo.problems_for(run)
  held = held[: run.eval.max_problems] if run.eval.max_problems else held
  t0 = time.monotonic()
  rep = asyncio.run(demo._evaluate(run, params, tok, held, run.eval.k, run.eval.seed))
  m = rep["metrics"]
  line = {
    "model": hf,
    "rollout_dtype": run.rollout.dtype or run.model.dtype,
    "temperature": run.eval.temperature,
    "accuracy": m["accuracy"],
    "truncation_rate": m["truncation_rate"],
    "tool_error_ratio": m["tool_error_ratio"],
    "wall_s": round(time.monotonic() - t0, 1),
  }
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump({**rep, "line": line}, f, indent=1)
  print(json.dumps(line))


if __name__ == "__main__":
  cli.run(main, required=["config", "workdir"])

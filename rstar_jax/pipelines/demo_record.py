"""Which config fields each phase of the demo depends on, for `rstar_jax.run_record`.

A rerun of the demo with the same --workdir reuses finished phases; these records make sure it
only reuses results made with the same settings (`--config.rl.roc_mode=random` on a paper-mode
workdir stops with one line instead of reporting paper-mode numbers as plain GRPO's). Each
phase lists the sections of the phases it consumes, so a change upstream (e.g. ``sft.epochs``)
makes everything after it stale too.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Any

from rstar_jax import run_record
from rstar_jax.config import schema
from rstar_jax.run_record import Phase

# Dotted paths of the typed config (`rstar_jax.config.schema`), e.g. ``rollout.system_prompt``.
_DATA = (
  "data",
  "coldstart",
  "tool.max_response_chars",
  "tool.timeout_s",
  "tool.show_time",
  "rollout.system_prompt",
)
_TOKENIZER = _DATA + (
  "model.vocab_size",
  "rollout.with_tools",
  "demo.domain_tokens",
  "demo.number_tokens",
  "demo.split_digits",
)
# The demo's SFT is full fine-tuning (a from-scratch model); LoRA settings concern RL only.
_MODEL = tuple(
  f"model.{f.name}"
  for f in dataclasses.fields(schema.ModelConfig)
  if not f.name.startswith("lora_")
)
_SFT = _TOKENIZER + _MODEL + ("mesh", "sft", "sft_optim")
_EVAL_SFT = _SFT + ("eval", "rollout", "tool", "rl.answer_mode", "demo")

PHASES = (
  Phase("data", _DATA, ("coldstart.jsonl", "coldstart_stats.json")),
  Phase("tokenizer", _TOKENIZER, ("tokenizer",)),
  Phase("sft", _SFT, ("sft",)),
  Phase("eval_sft", _EVAL_SFT, ("eval_sft.json",)),
  Phase("rl", ("",), ("rl",)),
  Phase("eval_rl", ("",), ("eval_rl.json",)),
  Phase("report", ("",), ("summary.json", "demo_plot.png", "demo_state.json")),
)
# The phases `demo.reuse_sft_from` copies from another workdir (with their records).
REUSED = ("data", "tokenizer", "sft", "eval_sft")

# Besides run_record's defaults: settings that change how a run is driven, not its numbers.
IGNORE = run_record.DEFAULT_IGNORE + ("demo.plot", "demo.reuse_sft_from", "demo.rl_max_steps")


def check_demo(cfg: Any, workdir: str, *, discard_stale: bool = False) -> dict[str, dict]:
  """Checks (and records) every demo phase of ``workdir`` against ``cfg`` before any work;
  returns {phase: recorded config view}. Raises `run_record.StaleRunError` (one line)."""
  src = (run_record.plain(cfg).get("demo") or {}).get("reuse_sft_from") or ""
  if src:  # the copied SFT-side outputs carry the config they were made with
    for name in REUSED:
      s, d = run_record.record_path(src, name), run_record.record_path(workdir, name)
      if os.path.isfile(s) and not os.path.exists(d):
        os.makedirs(os.path.dirname(d), exist_ok=True)
        shutil.copy(s, d)
  return run_record.check_phases(
    workdir, PHASES, cfg, ignore=IGNORE, discard_stale=discard_stale, discard_hint="--discard_stale"
  )

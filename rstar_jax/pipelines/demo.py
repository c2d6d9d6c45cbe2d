"""The end-to-end CPU demo: interaction-dense cold start, SFT, eval, GRPO-RoC, eval.

Phases (each leaves a file; rerunning with the same workdir skips finished phases and the
unfinished one resumes from its checkpoint):
  1. data       synthetic train / held-out problems; scripted solver through the code pool
                -> ``coldstart.jsonl`` (+ ``coldstart_stats.json``)
  2. tokenizer  byte-level BPE trained on the run's texts -> ``tokenizer/``
  3. sft        tiny Qwen3 from scratch, cold-start SFT -> ``sft/`` (ckpt, metrics, ``hf/``)
  4. eval_sft   held-out avg@k with the agent loop + code pool -> ``eval_sft.json``
  5. rl         GRPO-RoC (JaxSampler + code pool) -> ``rl/`` (ckpt, ``metrics.jsonl``, ``hf/``)
  6. eval_rl    same problems and settings as 4 -> ``eval_rl.json``
  7. report     ``summary.json`` and ``demo_plot.png``
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from typing import Any

from rstar_jax.config import ColdStartConfig as ColdStartSection
from rstar_jax.config import ConfigError, RunConfig
from rstar_jax.data import coldstart
from rstar_jax.data.problems import Problem
from rstar_jax.data.sft_data import load_sft_jsonl, write_sft_jsonl
from rstar_jax.learner.checkpoint import export_hf
from rstar_jax.models import qwen3
from rstar_jax.pipelines import (
  data_sources,
  demo_record,
  evaluation,
  rl_loop,
  sft_loop,
  wiring,
)
from rstar_jax.pipelines.metrics_log import read_jsonl_metrics
from rstar_jax.tokenization import bpe, chat_format, domain

log = logging.getLogger(__name__)

SUMMARY_KEYS = (
  "sft_eval_accuracy",
  "rl_eval_accuracy",
  "eval_problems",
  "rl_steps",
  "tool_calls_per_trajectory",
  "positive_tool_error_ratio",
  "wall_time_s",
)


def _say(msg: str) -> None:
  print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _system_prompt(run: RunConfig) -> str:
  return run.rollout.system_prompt or chat_format.SYSTEM_PROMPT


def _derived(run: RunConfig, mode: str) -> RunConfig:
  """The SFT / RL config of the library loops, taken from the demo config."""
  if mode == "sft":  # full fine-tuning: LoRA (model.lora_rank) applies to the RL phase
    model = dataclasses.replace(run.model, lora_rank=0)
    return dataclasses.replace(
      run, mode="sft", model=model, optim=run.sft_optim or run.optim, stages=()
    )
  return dataclasses.replace(run, mode=mode)


def _write_json(path: str, obj: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


def _read_json(path: str) -> Any:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


# --------------------------------------------------------------------------- phases


def problems_for(cfg) -> tuple[list[Problem], list[Problem]]:
  train = data_sources.train_problems(cfg)
  held = data_sources.eval_problems(cfg)
  return train, held


def phase_data(cfg, workdir: str, train: Sequence[Problem]) -> list:
  path = os.path.join(workdir, "coldstart.jsonl")
  if os.path.isfile(path):
    _say(f"data: reusing {path}")
    return load_sft_jsonl(path)
  cs = cfg.coldstart or ColdStartSection()
  csc = coldstart.ColdStartConfig(
    explore_prob=cs.explore_prob,
    bug_prob=cs.bug_prob,
    explore_fail_prob=cs.explore_fail_prob,
    style=cs.style,
    min_tool_calls=cs.min_tool_calls,
    max_trajectories=cs.max_trajectories,
    max_calls=cs.max_calls,
    show_time=cfg.tool.show_time,
    max_response_chars=cfg.tool.max_response_chars,
    tool_timeout_s=cfg.tool.timeout_s,
    system_prompt=_system_prompt(cfg),
    seed=cs.seed,
  )
  t0 = time.monotonic()
  kept, stats = coldstart.build_coldstart_sync(train, csc, num_workers=cfg.tool.num_workers)
  stats["wall_time_s"] = time.monotonic() - t0
  _write_json(os.path.join(workdir, "coldstart_stats.json"), stats)
  write_sft_jsonl(path + ".tmp", kept)
  os.replace(path + ".tmp", path)
  _say(f"data: cold start {stats} -> {path}")
  return load_sft_jsonl(path)


def phase_tokenizer(cfg, workdir: str, chats, train: Sequence[Problem]):
  out = os.path.join(workdir, "tokenizer")
  if os.path.isfile(os.path.join(out, "tokenizer.json")):
    return bpe.load_tokenizer(out)
  sp, wt = _system_prompt(cfg), cfg.rollout.with_tools
  texts = coldstart.chat_texts(chats)
  texts += [chat_format.prompt_text("rstar2", p.problem, sp, wt) for p in train[:2000]]
  texts += [chat_format.tool_turn_text("rstar2", "Tool call success\nstdout: 0")] * 100
  added = domain.domain_tokens() if cfg.demo.domain_tokens else []
  # Whole-number tokens: copying a number (question -> code, tool output -> answer) is then
  # copying one token, which a ~1M-parameter model learns from a few hundred SFT steps
  # (per-digit copying needs induction circuits it does not form in that budget).
  added += [str(i) for i in range(cfg.demo.number_tokens)]
  tok = domain.train_domain_tokenizer(
    texts, cfg.model.vocab_size, out, added, split_digits=cfg.demo.split_digits
  )
  _say(f"tokenizer: {len(tok)} tokens ({len(added)} domain tokens) -> {out}")
  return tok


def phase_sft(cfg, workdir: str, chats, tokenizer):
  """Returns the SFT params (from ``sft/hf`` once finished)."""

  hf = os.path.join(workdir, "sft", "hf")
  model_config = cfg.model.qwen3_config()
  if not os.path.isfile(os.path.join(hf, "config.json")):
    scfg = _derived(cfg, "sft")
    pairs = coldstart.render_examples(tokenizer, chats, with_tools=cfg.rollout.with_tools)
    _say(f"sft: {len(pairs)} chats, {scfg.sft.epochs} epochs, batch {scfg.sft.batch_size}")
    out = sft_loop.run_sft(scfg, os.path.join(workdir, "sft"), tokenizer=tokenizer, examples=pairs)
    _say(
      f"sft: done, {out['steps']} steps, final loss {out['final_loss']:.4f}, "
      f"{out['wall_time_s']:.0f}s"
    )
  else:
    _say(f"sft: reusing {hf}")
  return qwen3.load_hf_params(hf, model_config)


def check_heldout_prompts(cfg, tokenizer, problems) -> None:
  """Every held-out prompt fits ``rollout.max_prompt_tokens`` under the trained tokenizer,
  checked before SFT: the training set drops overlong prompts, but dropping held-out ones would
  change what the accuracy is measured on, and finding one at the SFT evaluation wastes the SFT."""
  s = sft_loop.chat_settings(cfg)  # the prompt SFT, RL and the export all render
  lengths = [
    len(
      chat_format.prompt_ids(
        tokenizer, s["chat_format_name"], p.problem, s["system_prompt"], s["with_tools"]
      )
    )
    for p in problems
  ]
  limit = cfg.rollout.max_prompt_tokens
  over = [(n, p.problem) for n, p in zip(lengths, problems) if n > limit]
  if over:
    n, q = max(over)
    raise ConfigError(
      [
        (
          "rollout.max_prompt_tokens",
          f"{limit}, but {len(over)} of {len(problems)} held-out prompts are longer under this "
          f"run's tokenizer (longest {n} tokens: {q[:60]!r}); raise it (and rollout.max_len) "
          f"to at least {n}",
        )
      ]
    )


async def _evaluate(cfg, params, tokenizer, problems, k: int, seed: int) -> dict:
  mc = cfg.model.qwen3_config()
  async with wiring.open_runner(cfg, mc, params, tokenizer) as runner:
    return await evaluation.evaluate(
      runner,
      problems,
      wiring.eval_settings(cfg, tokenizer=tokenizer),
      k=k,
      seed=seed,
      progress_every_s=cfg.train.progress_every_s,
      keep_samples=4,
    )


def phase_eval(cfg, workdir: str, name: str, params, tokenizer, problems) -> dict:
  path = os.path.join(workdir, f"eval_{name}.json")
  if os.path.isfile(path):
    rep = _read_json(path)
    _say(f"eval_{name}: reusing {path}: accuracy {rep['metrics']['accuracy']:.3f}")
    return rep
  rep = asyncio.run(_evaluate(cfg, params, tokenizer, problems, cfg.eval.k, cfg.eval.seed))
  _write_json(path, rep)
  m = rep["metrics"]
  _say(
    f"eval_{name}: accuracy {m['accuracy']:.3f} on {m['num_problems']} problems x "
    f"{m['k']}, tool calls/traj {m['tool_calls_per_traj']:.2f}, tool error ratio "
    f"{m['tool_error_ratio']:.3f}, {m['wall_time_s']:.0f}s"
  )
  return rep


def phase_rl(cfg, workdir: str, sft_params, tokenizer, train, curve_problems):
  """GRPO-RoC from the SFT params; returns the final params (from ``rl/hf``), or None when
  ``demo.rl_max_steps`` stopped it before the last step (a rerun resumes)."""

  rdir = os.path.join(workdir, "rl")
  hf = os.path.join(rdir, "hf")
  model_config = cfg.model.qwen3_config()
  if os.path.isfile(os.path.join(hf, "config.json")):
    _say(f"rl: reusing {hf}")
    return qwen3.load_hf_params(hf, model_config)
  rcfg = _derived(cfg, "rl")
  os.makedirs(rdir, exist_ok=True)
  learner = wiring.build_learner(
    rcfg, params=sft_params, base_ref=os.path.abspath(os.path.join(workdir, "sft", "hf"))
  )
  data_sources.check_vocab(tokenizer, learner.model_config)
  total = sum(s.steps for s in rcfg.stages)
  _say(
    f"rl: {total} steps of {rcfg.train.batch_prompts} prompts x "
    f"{rcfg.rl.oversample * rcfg.rl.group_size} rollouts (keep {rcfg.rl.group_size}, "
    f"roc_mode={rcfg.rl.roc_mode})"
  )

  async def main():
    async with wiring.open_runner(
      rcfg, learner.model_config, learner.params_copy(), tokenizer
    ) as runner:
      loop = rl_loop.RLLoop(
        rcfg, learner, runner, rdir, problems=train, eval_problems=curve_problems
      )
      await loop.run(max_steps=cfg.demo.rl_max_steps or None)
      loop.ckpt.close()
      return loop

  loop = asyncio.run(main())
  if loop.pos.stage_index < len(loop.stages):
    _say(
      f"rl: stopped at step {loop.pos.rl_step} of {total}; rerun with the same --workdir to resume"
    )
    return None
  export_hf(hf, learner.model_config, learner.state.params)
  _say(f"rl: done at step {loop.pos.rl_step} -> {hf}")
  return qwen3.load_hf_params(hf, model_config)


# --------------------------------------------------------------------------- report


def _first_last(rows: Sequence[dict], key: str) -> dict:
  vals = [r[key] for r in rows if key in r and r[key] is not None]
  return {"first": vals[0] if vals else None, "last": vals[-1] if vals else None}


def build_summary(workdir: str, wall_time_s: float, cfg) -> dict:
  sft, rl = (
    _read_json(os.path.join(workdir, "eval_sft.json")),
    _read_json(os.path.join(workdir, "eval_rl.json")),
  )
  rows = read_jsonl_metrics(os.path.join(workdir, "rl", "metrics.jsonl"))
  sm, rm = sft["metrics"], rl["metrics"]
  out = {
    "sft_eval_accuracy": sm["accuracy"],
    "rl_eval_accuracy": rm["accuracy"],
    "accuracy_gain": rm["accuracy"] - sm["accuracy"],
    "eval_problems": sm["num_problems"],
    "eval_k": sm["k"],
    "rl_steps": len(rows),
    "roc_mode": cfg.rl.roc_mode,
    "tool_calls_per_trajectory": _first_last(rows, "tool_calls_per_traj"),
    "positive_tool_error_ratio": _first_last(rows, "pos_tool_error_ratio"),
    "tool_error_ratio": _first_last(rows, "tool_error_ratio"),
    "reward": _first_last(rows, "reward_mean"),
    "eval": {
      "sft": {
        k: sm[k]
        for k in (
          "tool_calls_per_traj",
          "tool_error_ratio",
          "pos_tool_error_ratio",
          "response_length_mean",
        )
      },
      "rl": {
        k: rm[k]
        for k in (
          "tool_calls_per_traj",
          "tool_error_ratio",
          "pos_tool_error_ratio",
          "response_length_mean",
        )
      },
    },
    "wall_time_s": wall_time_s,
  }
  cs = os.path.join(workdir, "coldstart_stats.json")
  if os.path.isfile(cs):
    out["coldstart"] = _read_json(cs)
  routing = routing_summary(rows)
  if routing:
    out["routing_replay"] = cfg.rl.routing_replay
    out["routing"] = routing
    out["eval_curve"] = [
      [r["step"], r["eval_accuracy"]] for r in rows if r.get("eval_accuracy") is not None
    ]
  return out


def routing_summary(rows: Sequence[dict]) -> dict:
  """MoE runs that record routes: each ``routing/*`` step metric (router agreement, importance
  ratios with / without replay) as first, last and mean over the RL steps that logged it; the
  ``is_ratio_max`` / ``is_ratio_min`` rows also as their extremes over the run."""
  out = {}
  for key in sorted({k for r in rows for k in r if k.startswith("routing/")}):
    vals = [float(r[key]) for r in rows if r.get(key) is not None]
    if not vals:
      continue
    row = {"first": vals[0], "last": vals[-1], "mean": sum(vals) / len(vals)}
    if key.endswith("is_ratio_max"):
      row["max"] = max(vals)
    if key.endswith("is_ratio_min"):
      row["min"] = min(vals)
    out[key[len("routing/") :]] = row
  return out


# --------------------------------------------------------------------------- entry point


def _reuse(src: str, dst: str) -> None:
  """Copies the SFT-side phases (data, tokenizer, SFT export, SFT eval) of another run."""
  for name in ("coldstart.jsonl", "coldstart_stats.json", "eval_sft.json"):
    s, d = os.path.join(src, name), os.path.join(dst, name)
    if os.path.isfile(s) and not os.path.exists(d):
      shutil.copy(s, d)
  for name in ("tokenizer", os.path.join("sft", "hf")):
    s, d = os.path.join(src, name), os.path.join(dst, name)
    if not os.path.isdir(s):
      raise FileNotFoundError(f"demo.reuse_sft_from: {s!r} is missing (run that demo first)")
    if not os.path.exists(d):
      shutil.copytree(s, d)


def run_demo(
  cfg: RunConfig, workdir: str, *, discard_stale: bool = False, sft_only: bool = False
) -> dict:
  """Runs (or resumes) every phase; returns the summary dict (also in summary.json), or {}
  when RL stopped early (``demo.rl_max_steps``). Finished phases are reused only when they
  ran with the same config (`demo_record`); otherwise this stops with one line naming the
  changed fields, or with ``discard_stale`` deletes the stale phases and reruns them.
  ``sft_only`` stops after the SFT evaluation and returns its report (eval_sft.json): a
  workdir made ready for other runs' ``demo.reuse_sft_from``; a later full run resumes it."""

  t0 = time.monotonic()
  os.makedirs(workdir, exist_ok=True)
  state_path = os.path.join(workdir, "demo_state.json")
  if cfg.demo.reuse_sft_from:
    _reuse(cfg.demo.reuse_sft_from, workdir)
  # --- run record (issue 16): before any work; a stale phase stops here or is deleted.
  records = demo_record.check_demo(cfg, workdir, discard_stale=discard_stale)
  # --- end run record
  prior = _read_json(state_path)["elapsed_s"] if os.path.isfile(state_path) else 0.0
  train, held = problems_for(cfg)
  _say(f"{len(train)} train / {len(held)} held-out problems")

  last = {"phase": _read_json(state_path).get("last_phase") if prior else None}

  def mark(phase):
    last["phase"] = phase
    _write_json(state_path, {"last_phase": phase, "elapsed_s": prior + time.monotonic() - t0})

  try:
    return _phases(
      cfg, workdir, train, held, mark, lambda: prior + time.monotonic() - t0, records, sft_only
    )
  except BaseException:
    # Ctrl-C or a failure: this run's time counts too, so the summary's wall time is the
    # sum over the runs that made it (before: only up to the last finished phase).
    mark(last["phase"])
    raise


def _phases(cfg, workdir, train, held, mark, elapsed, records, sft_only=False) -> dict:
  chats = phase_data(cfg, workdir, train)
  mark("data")
  tok = phase_tokenizer(cfg, workdir, chats, train)
  mark("tokenizer")
  check_heldout_prompts(cfg, tok, held)
  sft_params = phase_sft(cfg, workdir, chats, tok)
  mark("sft")
  sft_report = phase_eval(cfg, workdir, "sft", sft_params, tok, held)
  mark("eval_sft")
  if sft_only:
    return sft_report
  n_curve = cfg.demo.curve_eval_problems
  rl_params = phase_rl(cfg, workdir, sft_params, tok, train, held[:n_curve] if n_curve else [])
  if rl_params is None:
    mark("rl (unfinished)")
    return {}
  mark("rl")
  phase_eval(cfg, workdir, "rl", rl_params, tok, held)
  mark("eval_rl")
  wall = elapsed()
  summary = build_summary(workdir, wall, cfg)
  summary["resolved_config"] = records["eval_rl"]  # run record: the config of every number
  _write_json(os.path.join(workdir, "summary.json"), summary)
  if cfg.demo.plot:
    from rstar_jax.pipelines import viz  # matplotlib: optional, imported only for the plot

    viz.plot_demo(workdir, summary, os.path.join(workdir, "demo_plot.png"))
  mark("report")
  _say(
    f"summary: SFT {summary['sft_eval_accuracy']:.3f} -> RL {summary['rl_eval_accuracy']:.3f} "
    f"on {summary['eval_problems']} held-out problems; {summary['rl_steps']} RL steps; "
    f"wall {wall:.0f}s -> {os.path.join(workdir, 'summary.json')}"
  )
  return summary

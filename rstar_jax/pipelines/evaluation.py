"""avg@k / pass@k evaluation with the agent loop (rStar2-Agent's protocol; named protocols:
`eval_protocols`).

Each problem is attempted ``k`` times (independent seeds) with the eval sampling settings
(temperature 0.6, 30 turns, 30K tokens in the paper); pass@1 is the mean correctness over all
k attempts of all problems. Reported alongside: mean response length (generated + tool
tokens), mean generated tokens, mean tool calls and turns per trajectory, tool error ratio,
truncation rate, and per-problem solve counts.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rstar_jax.config import RunConfig, eval_protocols
from rstar_jax.data.problems import Problem
from rstar_jax.distributed import hostdata, primary
from rstar_jax.learner.checkpoint import Checkpointer
from rstar_jax.models import lora
from rstar_jax.pipelines import data_sources, rl_metrics, wiring
from rstar_jax.pipelines.metrics_log import Progress
from rstar_jax.rollout.agent_loop import RolloutSettings
from rstar_jax.rollout.agent_runner import AgentRunner
from rstar_jax.rollout.sources import SyncSource

# Problem i's group is seeded seed * 1_000_003 + 17 + i * 7_919: the rule of the reports
# written before the group sources, kept so their numbers stay reproducible.
EVAL_PROBLEM_STRIDE = 7_919


async def evaluate(
  runner: AgentRunner,
  problems: Sequence[Problem],
  settings: RolloutSettings,
  *,
  k: int = 1,
  seed: int = 0,
  progress_every_s: float = 10.0,
  keep_samples: int = 0,
  max_retries: int = 3,
) -> dict[str, Any]:
  """Runs k attempts per problem; returns the report dict (``metrics``, ``per_problem``, ...).

  Args:
    runner: engine + code pool + tokenizer + reward.
    problems: the evaluation set.
    settings: sampling and agent-loop limits.
    k: attempts per problem (avg@k).
    seed: base seed; the k attempts are one group per problem of a `SyncSource`
      (`rollout.groups`: the seed, retry and multi-process rules of RL's groups), so the same
      call gives the same samples (with a deterministic engine).
    keep_samples: include the first ``keep_samples`` decoded responses in the report.
    max_retries: failed attempts of one rollout (engine error, lost tool worker) retried.
  """
  if k < 1:
    raise ValueError(f"evaluate: k must be >= 1, got {k}")
  if not problems:
    raise ValueError("evaluate: the problem set is empty")
  t0 = time.monotonic()
  prog = Progress("eval", len(problems) * k, every_s=progress_every_s)
  source = SyncSource(
    runner,
    num_samples=k,
    max_retries=max_retries,
    on_start=lambda _: prog.update,
    problem_stride=EVAL_PROBLEM_STRIDE,
  )
  made = await source.groups_of(problems, seed=seed * 1_000_003 + 17, settings=settings)
  trajs = rl_metrics.flatten(made.groups)
  # [multi-process] each process verifies its share; the rewards are all-gathered
  rewards = await hostdata.map_sharded(
    lambda part: runner.rewards([t for t, _ in part], [a for _, a in part]),
    list(zip(trajs, [p.answer for p in problems for _ in range(k)])),
  )
  r = np.asarray(rewards, np.float32).reshape(len(problems), k)
  tm = rl_metrics.trajectory_metrics(list(trajs), r.reshape(-1))
  metrics = {
    "accuracy": float(r.mean()),  # avg@k pass@1
    "avg_at_k": float(r.mean()),
    "pass_at_k": float((r > 0).any(axis=1).mean()),
    "num_problems": len(problems),
    "k": k,
    "response_length_mean": tm["response_length_mean"],
    "generated_tokens_mean": tm["generated_tokens_mean"],
    "tool_calls_per_traj": tm["tool_calls_per_traj"],
    "turns_per_traj": tm["turns_per_traj"],
    "tool_error_ratio": tm["tool_error_ratio"],
    "pos_tool_error_ratio": tm["pos_tool_error_ratio"],
    "truncation_rate": tm["truncation_ratio"],
    "answer_tags_eq1_frac": tm["answer_tags_eq1_frac"],
    "wall_time_s": time.monotonic() - t0,
  }
  report: dict[str, Any] = {
    "metrics": metrics,
    # The settings seed is set per trajectory from evaluate(seed=) and max_concurrent is
    # run_agent_loop's: neither describes this evaluation.
    "settings": {
      k: v for k, v in dataclasses.asdict(settings).items() if k not in ("seed", "max_concurrent")
    },
    "per_problem": [
      {"problem": p.problem, "answer": p.answer, "num_correct": int((r[i] > 0).sum())}
      for i, p in enumerate(problems)
    ],
  }
  if keep_samples:
    report["samples"] = [
      {
        "problem": problems[i // k].problem,
        "answer": problems[i // k].answer,
        "reward": float(r.reshape(-1)[i]),
        "response": t.response_text,
      }
      for i, t in enumerate(trajs[:keep_samples])
    ]
  return report


def write_csv(report: Mapping[str, Any], path: str | os.PathLike) -> None:
  """One row per problem: index, problem, answer, k, num_correct, avg_at_k, pass_at_k."""
  k = int(report["metrics"]["k"])
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8", newline="") as f:
    w = csv.writer(f)
    w.writerow(["index", "problem", "answer", "k", "num_correct", "avg_at_k", "pass_at_k"])
    for i, row in enumerate(report["per_problem"]):
      n = int(row["num_correct"])
      w.writerow([i, row["problem"], row["answer"], k, n, n / k, int(n > 0)])


def write_report(report: dict, path: str | os.PathLike) -> None:
  if not primary.is_primary():  # [multi-process] one writer
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)


def run_eval(
  run: RunConfig,
  out_path: str,
  *,
  problems: Sequence[Problem] | None = None,
  tokenizer=None,
  params=None,
  checkpoint_dir: str = "",
  workdir: str = "",
  engine=None,
) -> dict:
  """Loads the policy of ``run`` (mode "eval") and writes the JSON report.

  The policy: ``params`` if given; else the latest orbax checkpoint in ``checkpoint_dir`` (an
  SFT or RL run's ``ckpt/``); else ``run.model`` (HF dir or a random tiny model). Problems:
  ``problems``, else ``run.eval.path`` / ``data.synthetic`` held-out split, capped at
  ``eval.max_problems``.
  """

  if problems is None:
    problems = data_sources.eval_problems(run)
  if not problems:
    raise ValueError(
      "config.eval.path: expected a JSONL problem file (or data.synthetic), got no problems"
    )
  if tokenizer is None:
    tokenizer = data_sources.ensure_tokenizer(
      run,
      workdir or os.path.dirname(os.path.abspath(out_path)),
      data_sources.tokenizer_corpus(problems),
    )
  model_config = run.model.qwen3_config()
  if params is None and checkpoint_dir:
    learner = wiring.build_learner_for_restore(run)
    with Checkpointer(checkpoint_dir) as ck:
      learner.state, _ = ck.restore(learner.state)
    params = lora.merged(learner.state.params)  # LoRA: the merged weights
  elif params is None:
    params = wiring.initial_params(run, model_config)
  data_sources.check_vocab(tokenizer, model_config)

  async def main():
    async with wiring.open_runner(
      run,
      model_config,
      hostdata.local_params(params),  # [multi-process]
      tokenizer,
      engine=engine,
    ) as runner:
      return await evaluate(
        runner,
        problems,
        wiring.eval_settings(run, tokenizer=tokenizer),
        k=eval_protocols.resolve(run.eval).k,
        seed=run.eval.seed,
        progress_every_s=run.train.progress_every_s,
        keep_samples=4,
      )

  report = asyncio.run(main())
  report["checkpoint_dir"] = checkpoint_dir
  report["protocol"] = run.eval.protocol
  write_report(report, out_path)
  csv_path = run.eval.csv_path or os.path.splitext(out_path)[0] + "_per_problem.csv"
  write_csv(report, csv_path)
  report["csv_path"] = csv_path
  return report


# The recipe each chat format belongs to, for the warning below.
FORMAT_RECIPES = {
  "rstar2": "rStar2-Agent (configs/rstar2_qwen3_14b.py, rstar2_tiny_cpu.py)",
  "rstar2_released": "rStar2-Agent, released prompt layout",
  "qwen3_thinking": "ASTER (configs/aster_qwen3_4b.py, aster_tiny_cpu.py)",
  "qwen3": "Qwen3 hybrid template",
}


def trained_chat_format(model_dirs: Sequence[str]) -> tuple[str, str] | None:
  """(chat format, record file) a run directory recorded for the model being evaluated:
  ``<run>/resolved_config/*.json`` beside a checkpoint folder (``<run>/ckpt``) or an exported
  model (``<run>/hf``); None when no record is found (a model from elsewhere)."""
  for d in model_dirs:
    if not d:
      continue
    rec_dir = os.path.join(os.path.dirname(os.path.abspath(d)), "resolved_config")
    try:
      names = sorted(os.listdir(rec_dir))
    except OSError:
      continue
    for name in names:
      path = os.path.join(rec_dir, name)
      try:
        with open(path, encoding="utf-8") as f:
          fmt = json.load(f).get("rollout.chat_format")
      except (OSError, ValueError, AttributeError):
        continue
      if fmt:
        return fmt, path
  return None


def recipe_mismatch_warning(run: RunConfig, checkpoint_dir: str = "") -> str | None:
  """A warning line when the model was trained (per its run record) with another chat format
  than the eval config renders: it would be scored on prompts it never saw, silently. Names
  both formats and their recipes, and the fix."""
  found = trained_chat_format([checkpoint_dir, run.model.hf_dir])
  if found is None:
    return None
  trained, record = found
  fmt = run.rollout.chat_format
  if trained == fmt:
    return None
  return (
    f"launchers.eval: the model was trained with chat format {trained!r} "
    f"({FORMAT_RECIPES.get(trained, 'another recipe')}; {record}) but this eval config renders "
    f"{fmt!r} ({FORMAT_RECIPES.get(fmt, 'another recipe')}): its prompts and tool turns are "
    f"not the ones it learned; evaluate with the trained recipe's :eval variant or pass "
    f"--config.rollout.chat_format={trained}"
  )

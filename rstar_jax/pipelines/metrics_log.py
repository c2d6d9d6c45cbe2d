"""Per-step metric records: one JSON line each, mirrored to TensorBoard and (optionally) W&B.

The JSONL file is the source of truth (plots and the demo summary read it; its keys are
documented in docs/metrics.md); TensorBoard (tensorboardX) is a convenience view, skipped
with a warning if tensorboardX is missing; Weights & Biases (``log.wandb``, optional extra
``rstar_jax[wandb]``) is a third view, offline by default (``<dir>/wandb``, no network; sync
later with ``wandb sync``).

Sample rollouts (`write_samples`: prompt, response, tool turns, reward, as text) go to every
sink: ``<name>_samples.jsonl``, TensorBoard text and a W&B table.

Appending is resume-safe: on resume, `MetricsWriter(..., resume_step=s)` drops lines with
``step > s`` (metrics and samples) left by a run that died after logging but before
checkpointing, so a file never holds two records for one step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from rstar_jax.distributed.primary import is_primary
from rstar_jax.errors import UserError
from rstar_jax.pipelines.supervisor import restarts_from_env

log = logging.getLogger(__name__)


def _jsonable(v: Any) -> Any:
  if hasattr(v, "item") and getattr(v, "shape", None) == ():
    v = v.item()
  if isinstance(v, float) and not math.isfinite(v):
    return None
  if isinstance(v, (int, float, str, bool)) or v is None:
    return v
  if isinstance(v, Mapping):
    return {str(k): _jsonable(x) for k, x in v.items()}
  if isinstance(v, (list, tuple)):
    return [_jsonable(x) for x in v]
  try:
    return float(v)
  except (TypeError, ValueError):
    return str(v)


def _primary() -> bool:
  return is_primary()


def read_jsonl_metrics(path: str | os.PathLike) -> list[dict]:
  """All records of a metrics file, in order."""
  out = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.strip():
        out.append(json.loads(line))
  return out


def open_jsonl(path: str, resume_step: int | None, read=read_jsonl_metrics):
  """``path`` opened for appending: records with ``step > resume_step`` dropped on resume (the
  file read with ``read``), the file removed on a fresh run."""
  if resume_step is not None and os.path.exists(path):
    kept = [r for r in read(path) if int(r.get("step", 0)) <= resume_step]
    with open(path, "w", encoding="utf-8") as f:
      for r in kept:
        f.write(json.dumps(r) + "\n")
  elif resume_step is None and os.path.exists(path):
    os.remove(path)  # a fresh run starts a fresh log
  return open(path, "a", encoding="utf-8")


def sink_options(run, workdir: str | os.PathLike, name: str) -> dict[str, Any]:
  """`MetricsWriter` keywords of a `RunConfig`'s ``log`` section: TensorBoard on/off and the
  W&B settings (run name ``log.wandb_run_name`` or the workdir's name, then ``-<name>``; the
  whole run config as the W&B run's config, so runs compare by hyperparameter)."""
  lc = run.log
  wandb = None
  if lc.wandb and lc.wandb_mode != "disabled":  # W&B's own off switch: no run, no package
    base = lc.wandb_run_name or os.path.basename(os.path.abspath(os.fspath(workdir)))
    wandb = {
      "project": lc.wandb_project,
      "mode": lc.wandb_mode,
      "name": f"{base}-{name}",
      "config": _jsonable(dataclasses.asdict(run)) if dataclasses.is_dataclass(run) else None,
    }
  return {"tensorboard": lc.tensorboard, "wandb": wandb}


def _wandb_run_id(directory: str, name: str, resume: bool) -> str:
  """A fresh random id per run, kept in ``<dir>/wandb/<name>.run_id`` so that a resumed run
  appends to the W&B run it started (an id derived from names would collide across
  experiments that share a folder name, and W&B refuses to reuse the id of another run)."""
  path = os.path.join(directory, "wandb", f"{name}.run_id")
  if resume and os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      run_id = f.read().strip()
    if run_id:
      return run_id
  run_id = uuid.uuid4().hex[:12]
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(run_id + "\n")
  return run_id


def _start_wandb(directory: str, name: str, settings: Mapping[str, Any], resume: bool):
  try:
    import wandb
  except ImportError:
    raise UserError(
      "config.log.wandb: True needs the wandb package, which is not installed "
      "(pip install 'rstar_jax[wandb]', or set log.wandb=False)"
    ) from None
  run_id = _wandb_run_id(directory, name, resume)
  return wandb.init(
    project=settings["project"],
    name=settings["name"],
    id=run_id,
    config=settings.get("config"),
    mode=settings.get("mode", "offline"),
    dir=directory,
    resume="allow" if resume else None,
    # the SFT and RL writers of one process (the demo) are separate runs; neither ends the other
    reinit="create_new",
    settings=wandb.Settings(console="off", silent=True),
  )


def _middle_cut(text: str, max_chars: int) -> str:
  if len(text) <= max_chars:
    return text
  half = max_chars // 2
  return f"{text[:half]}\n...[{len(text) - 2 * half} chars cut]...\n{text[-half:]}"


def sample_record(
  prompt: str,
  response: str,
  tool_turns: list[Mapping[str, Any]],
  reward: float,
  max_chars: int = 4000,
  **extra: Any,
) -> dict[str, Any]:
  """One logged rollout: texts cut in the middle past ``max_chars`` (each tool turn's
  ``code`` / ``output`` too); ``extra`` (problem index, answer, ...) kept as is."""
  turns = [
    {k: _middle_cut(v, max_chars) if isinstance(v, str) else v for k, v in t.items()}
    for t in tool_turns
  ]
  return {
    "prompt": _middle_cut(prompt, max_chars),
    "response": _middle_cut(response, max_chars),
    "tool_turns": turns,
    "reward": float(reward),
    **extra,
  }


def samples_due(log_config, step: int) -> bool:
  """Whether RL step ``step`` (1-based) logs sample rollouts (``log.samples_every``)."""
  every = log_config.samples_every
  return bool(every) and step % every == 0


def rollout_samples(
  problems: Sequence[Any],
  groups: Sequence[Sequence[Any]],
  rewards: Any,
  n: int,
  max_chars: int,
  tokenizer=None,
) -> list[dict[str, Any]]:
  """``n`` `sample_record`s of a step's rollouts (groups [P][N] of `Trajectory`, rewards
  [P, N]), spread over the prompts: sample k is rollout k // P of prompt k % P. ``prompt`` is
  what the policy saw (the trajectory's prompt ids decoded with ``tokenizer``: system prompt,
  tool block, chat template); ``question`` the problem text it was rendered from."""
  p = len(groups)
  out = []
  for k in range(min(n, sum(len(g) for g in groups))):
    i, j = k % p, k // p
    if j >= len(groups[i]):
      continue
    t = groups[i][j]
    turns = [
      {"turn": c.turn, "status": c.status, "code": c.code, "output": c.output_text}
      for c in t.tool_calls
    ]
    prompt = problems[i].problem
    if tokenizer is not None and getattr(t, "prompt_ids", None):
      prompt = tokenizer.decode(list(t.prompt_ids), skip_special_tokens=False)
    out.append(
      sample_record(
        prompt,
        t.response_text,
        turns,
        float(rewards[i][j]),
        max_chars,
        question=problems[i].problem,
        problem_index=i,
        sample_index=j,
        answer=problems[i].answer,
        finish_reason=t.finish_reason,
      )
    )
  return out


def log_rollout_samples(
  writer: MetricsWriter, log_config, step: int, problems, groups, rewards, tokenizer=None
) -> None:
  """The RL loop's one call per step: when ``log.samples_every`` makes step ``step`` due,
  `rollout_samples` of the step's rollouts (prompts rendered with ``tokenizer``) go to every
  sink of ``writer``."""
  if samples_due(log_config, step):
    n, cut = log_config.samples_per_step, log_config.sample_max_chars
    writer.write_samples(step, rollout_samples(problems, groups, rewards, n, cut, tokenizer))


def _sample_markdown(s: Mapping[str, Any]) -> str:
  """A sample as TensorBoard markdown (indented blocks keep the model's text verbatim)."""
  block = lambda t: "\n".join("    " + line for line in str(t).splitlines() or [""])
  parts = [f"**reward** {s['reward']}", "**prompt**", block(s["prompt"])]
  parts += ["**response**", block(s["response"])]
  for i, t in enumerate(s["tool_turns"]):
    parts += [f"**tool turn {i}** ({t.get('status', '')})", block(t.get("code", ""))]
    parts += ["output:", block(t.get("output", ""))]
  return "\n\n".join(parts)


class MetricsWriter:
  """Writes ``{"step": s, **metrics}`` records to ``<dir>/<name>.jsonl``, TensorBoard and W&B;
  under the supervisor (``--max_restarts``) each record also has ``restarts``, the learner
  restarts before the process that wrote it.

  Args:
    directory: output folder (created).
    name: file stem of the JSONL file.
    resume_step: if given, existing records with ``step > resume_step`` are removed first.
    tensorboard: also write TensorBoard event files under ``<dir>/tb``.
    wandb: None, or ``{"project", "name", "mode"}`` for a W&B run under ``<dir>/wandb``
      (`sink_options` builds it from the ``log`` section).
  """

  def __init__(
    self,
    directory: str | os.PathLike,
    name: str = "metrics",
    *,
    resume_step: int | None = None,
    tensorboard: bool = True,
    wandb: Mapping[str, Any] | None = None,
  ):
    self.path = os.path.join(os.fspath(directory), f"{name}.jsonl")
    self.samples_path = os.path.join(os.fspath(directory), f"{name}_samples.jsonl")
    self._name = name
    self._file = self._tb = self._wandb = self._samples = None
    if not _primary():  # [multi-process] process 0 writes; the others only return records
      return
    os.makedirs(directory, exist_ok=True)
    self._file = open_jsonl(self.path, resume_step)
    if resume_step is not None or os.path.exists(self.samples_path):
      self._samples = open_jsonl(self.samples_path, resume_step)
    self._tb = None
    if wandb:
      self._wandb = _start_wandb(os.fspath(directory), name, wandb, resume_step is not None)
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(os.path.join(os.fspath(directory), "tb", name))
      except Exception as e:  # pragma: no cover - optional dependency
        log.warning("TensorBoard logging disabled: %s", e)

  def write(self, step: int, metrics: Mapping[str, Any]) -> dict:
    rec = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}}
    restarts = restarts_from_env()
    if restarts is not None:  # a supervised run (--max_restarts): the restarts so far
      rec.setdefault("restarts", restarts)
    if self._file is None:
      return rec
    self._file.write(json.dumps(rec) + "\n")
    self._file.flush()
    if self._tb is not None:
      for k, v in rec.items():
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
          self._tb.add_scalar(k, v, int(step))
      self._tb.flush()
    if self._wandb is not None:
      self._wandb.log(
        {k: v for k, v in rec.items() if k != "step" and isinstance(v, (int, float))},
        step=int(step),
      )
    return rec

  def write_samples(self, step: int, samples: list[Mapping[str, Any]]) -> None:
    """Sample rollouts (`sample_record` dicts) of ``step`` to every sink: one JSON line per
    sample in ``<name>_samples.jsonl``, TensorBoard text ``samples/<i>`` and a W&B table."""
    if self._file is None or not samples:
      return
    if self._samples is None:
      self._samples = open_jsonl(self.samples_path, None)
    for i, s in enumerate(samples):
      self._samples.write(json.dumps({"step": int(step), "index": i, **_jsonable(s)}) + "\n")
    self._samples.flush()
    if self._tb is not None:
      for i, s in enumerate(samples):
        self._tb.add_text(f"samples/{i}", _sample_markdown(s), int(step))
      self._tb.flush()
    if self._wandb is not None:
      import wandb

      cols = ["index", "reward", "prompt", "response", "tool_turns"]
      rows = [
        [i, float(s["reward"]), s["prompt"], s["response"], json.dumps(s["tool_turns"])]
        for i, s in enumerate(samples)
      ]
      self._wandb.log({"samples": wandb.Table(columns=cols, data=rows)}, step=int(step))

  def close(self) -> None:
    if self._file is None:
      return
    self._file.close()
    if self._samples is not None:
      self._samples.close()
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


class Progress:
  """Rate-limited progress lines for long phases (rollouts, evaluation, hard-subset passes).

  ``update(done)`` prints ``[label] done/total (x.x/s, eta ...)`` at most every ``every_s``
  seconds, and always on completion.
  """

  def __init__(self, label: str, total: int, *, every_s: float = 10.0, stream=None):
    self.label, self.total, self.every_s = label, total, every_s
    self.stream = stream or sys.stderr
    self.t0 = time.monotonic()
    self._last = -math.inf
    self.done = 0

  def update(self, done: int | None = None, extra: str = "") -> None:
    self.done = self.done + 1 if done is None else done
    now = time.monotonic()
    if self.done < self.total and now - self._last < self.every_s:
      return
    self._last = now
    if not _primary():  # [multi-process]
      return
    dt = max(now - self.t0, 1e-9)
    rate = self.done / dt
    eta = (self.total - self.done) / rate if rate > 0 else float("inf")
    eta_s = f"{eta:.0f}s" if math.isfinite(eta) else "?"
    print(
      f"[{self.label}] {self.done}/{self.total} ({rate:.2f}/s, {dt:.0f}s elapsed, eta "
      f"{eta_s}){' ' + extra if extra else ''}",
      file=self.stream,
      flush=True,
    )

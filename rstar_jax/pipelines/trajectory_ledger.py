"""The trajectory ledger (``log.trajectory_ledger``): which trajectories each RL step trained,
one JSON line per step in ``<workdir>/trained.jsonl``, so that a run stopped, killed and resumed
any number of times can be audited afterwards: no prompt group lost, no trajectory trained
twice.

A row: ``{"step": s, "restarts": a, "groups": [[seq, problem, seed], ...], "trained": [[g,
sample], ...]}``. ``groups`` are the prompt groups step ``s`` took from its source, in batch
order: ``seq`` their place in the asynchronous source's issue order (-1 for the synchronous
source, which keeps none), ``problem`` the index of the problem in the run's training set and
``seed`` the group's seed (sample j is generated with `groups.sample_seed(seed, j)`).
``trained`` are the trajectories the step's update used (after the zero-variance filter and
RoC): ``g`` indexes ``groups``, ``sample`` is the sample's index in its group. A trajectory's id
is ``(problem, seed, sample)``: a re-generated trajectory (a failover, a stale group issued
again, a group in flight when the learner died) keeps it. ``restarts`` is the supervisor's
attempt (`supervisor.restarts_from_env`; absent when unsupervised).

Resume: like ``metrics.jsonl``, a run resumed at RL step ``r`` first drops the rows with step
``> r``; their updates died with the process that made them (no checkpoint holds them) and the
resumed run trains those steps again. The file therefore names exactly the trajectories whose
updates the latest checkpoint holds, whatever the kills were, and `audit` counts them. A line
cut by a kill (the process died inside the write) is dropped too.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Sequence
from typing import Any

from rstar_jax.distributed.primary import is_primary
from rstar_jax.pipelines import metrics_log
from rstar_jax.pipelines.supervisor import restarts_from_env

FILE = "trained.jsonl"


def step_row(
  step: int,
  problem_indices: Sequence[int],
  ids: Sequence[tuple[int, int]],
  kept: Sequence[tuple[int, int]],
) -> dict[str, Any]:
  """One step's ledger row.

  Args:
    step: the RL step (1-based).
    problem_indices: [P] training-set index of each group's problem.
    ids: [P] ``(seq, seed)`` of each group (`groups.Groups.ids`).
    kept: the trained trajectories as ``(group, sample)``, in batch order.
  """
  if len(problem_indices) != len(ids):
    raise ValueError(f"step_row: {len(problem_indices)} problems but {len(ids)} group ids")
  row: dict[str, Any] = {
    "step": int(step),
    "groups": [[int(q), int(p), int(s)] for p, (q, s) in zip(problem_indices, ids)],
    "trained": [[int(g), int(j)] for g, j in kept],
  }
  restarts = restarts_from_env()
  if restarts is not None:
    row["restarts"] = restarts
  return row


def read(path: str | os.PathLike) -> list[dict]:
  """The rows of a ledger file in order; a last line cut by a kill is left out."""
  rows = []
  with open(path, encoding="utf-8") as f:
    lines = [ln for ln in f.read().split("\n") if ln.strip()]
  for i, line in enumerate(lines):
    try:
      rows.append(json.loads(line))
    except ValueError:
      if i != len(lines) - 1:
        raise ValueError(
          f"{path}: line {i + 1} is not JSON (only a last line may be cut)"
        ) from None
  return rows


def trajectory_ids(rows: Sequence[dict]) -> list[tuple[int, int, int]]:
  """Every trained trajectory's id ``(problem, seed, sample)``, in training order."""
  out = []
  for r in rows:
    for g, j in r["trained"]:
      _, p, s = r["groups"][g]
      out.append((p, s, j))
  return out


def audit(rows: Sequence[dict], reference: Sequence[dict] | None = None) -> dict[str, Any]:
  """Counts a ledger's trajectories (rows: `read`).

  Returns:
    ``steps``: the RL steps in the ledger; ``steps_ok``: they are 1..n, each once.
    ``groups`` / ``trained``: groups taken and trajectories trained.
    ``groups_taken_twice``: groups (problem, seed) taken by more than one step (or twice in one).
    ``trained_twice``: trajectory ids trained more than once.
    ``seqs_missing``: asynchronous source: issue numbers below the largest seen that no step
      took (an issued group that was never trained: lost).
    With ``reference`` (the rows of an undisturbed run of the same config and seed):
    ``lost_vs_reference`` / ``extra_vs_reference``: trajectory ids trained by one run only.
  """
  steps = [int(r["step"]) for r in rows]
  groups = collections.Counter((p, s) for r in rows for _, p, s in r["groups"])
  ids = collections.Counter(trajectory_ids(rows))
  seqs = {q for r in rows for q, _, _ in r["groups"] if q >= 0}
  out: dict[str, Any] = {
    "steps": len(steps),
    "steps_ok": steps == list(range(1, len(steps) + 1)),
    "groups": sum(groups.values()),
    "trained": sum(ids.values()),
    "groups_taken_twice": sum(c - 1 for c in groups.values() if c > 1),
    "trained_twice": sum(c - 1 for c in ids.values() if c > 1),
    "seqs_missing": len(set(range(max(seqs) + 1)) - seqs) if seqs else 0,
  }
  if reference is not None:
    ref = set(trajectory_ids(reference))
    out["lost_vs_reference"] = len(ref - set(ids))
    out["extra_vs_reference"] = len(set(ids) - ref)
  return out


class LedgerWriter:
  """Appends rows to ``<workdir>/trained.jsonl`` (process 0 only); ``resume_step``: a resumed
  run's RL step (rows past it are dropped first), None for a fresh run (the file starts
  empty)."""

  def __init__(self, workdir: str | os.PathLike, resume_step: int | None):
    self.path = os.path.join(os.fspath(workdir), FILE)
    self._file = None
    if not is_primary():  # [multi-process] every process holds the same groups; one writes
      return
    os.makedirs(os.fspath(workdir), exist_ok=True)
    # `read` leaves out a last line cut by a kill, which a resume then overwrites.
    self._file = metrics_log.open_jsonl(self.path, resume_step, read=read)

  def write(self, row: dict[str, Any]) -> None:
    if self._file is not None:
      self._file.write(json.dumps(row) + "\n")
      self._file.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None

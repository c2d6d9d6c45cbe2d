"""The RL loop's resumable position and its checkpoint files.

An orbax checkpoint (`learner.checkpoint.Checkpointer`, keyed by the optimizer step) holds the
TrainState plus the `LoopPosition` as JSON. A step that made no update (every group
zero-variance) creates no orbax step, so the position and RNG of every save also go to the side
file ``<ckpt>/loop_position.json``; `restore` uses it when it refers to the restored optimizer
step.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np

from rstar_jax.distributed import primary
from rstar_jax.learner.checkpoint import Checkpointer

SIDE_FILE = "loop_position.json"


@dataclasses.dataclass
class LoopPosition:
  """Everything besides the TrainState that a resumed run needs (stored as checkpoint JSON)."""

  rl_step: int = 0  # RL steps done over the run (skipped steps included)
  stage_index: int = 0
  stage_step: int = 0  # RL steps done in the current stage
  stage_started: bool = False  # stage-start actions (optimizer reset, hard subset) done
  data_source: str = "full"
  data_state: dict | None = None
  hard_indices: list[int] | None = None
  weight_version: int = 0
  collapse: dict | None = None
  hard_subset_stats: dict | None = None
  # Per RL step [(problem index, all rollouts correct)], newest last, for "recent" stages.
  recent_outcomes: list | None = None
  source_state: dict | None = None  # the group source's (asynchronous: issued, not trained)

  def advance(self, stage_steps: int) -> None:
    """Counts one RL step; the next stage starts when this one has had ``stage_steps``."""
    self.stage_step += 1
    self.rl_step += 1
    if self.stage_step >= stage_steps:
      self.stage_index, self.stage_step, self.stage_started = self.stage_index + 1, 0, False

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, d: dict) -> LoopPosition:
    names = {f.name for f in dataclasses.fields(cls)}
    d = dict(d)
    if "async_state" in d:  # checkpoints written before the group sources
      d.setdefault("source_state", d.pop("async_state"))
    return cls(**{k: v for k, v in d.items() if k in names})


def _side_path(ckpt: Checkpointer) -> str:
  return os.path.join(ckpt.directory, SIDE_FILE)


def _read_side(ckpt: Checkpointer) -> dict | None:
  try:
    with open(_side_path(ckpt), encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def restore(ckpt: Checkpointer, state):
  """The latest checkpoint as (state, position, optimizer step), or None when there is none."""
  if ckpt.latest_step() is None:
    return None
  state, meta = ckpt.restore(state)
  saved = int(meta["step"])
  pos = LoopPosition.from_json(meta["loop"])
  side = _read_side(ckpt)
  if side and side["optimizer_step"] == saved and side["loop"]["rl_step"] >= pos.rl_step:
    pos = LoopPosition.from_json(side["loop"])
    rng = np.asarray(side["rng"], np.uint32)
    state = state.replace(rng=jax.device_put(rng, state.rng.sharding))
  return state, pos, saved


def save(ckpt: Checkpointer, state, pos: LoopPosition, last_saved_step: int) -> tuple[bool, int]:
  """Writes an orbax step when the optimizer step moved past ``last_saved_step``, and always
  the side file; returns (orbax step written, optimizer step)."""
  step = int(jax.device_get(state.step))
  wrote = False
  if step != last_saved_step:
    wrote = bool(ckpt.save(state, {"loop": pos.to_json()}, force=True))
    if primary.process_count() > 1:
      # [multi-process] commit before the next step: a process lost mid-step then never
      # takes the step's checkpoint with it (orbax finalises only when every process wrote).
      ckpt.wait_until_finished()
  side = {
    "optimizer_step": step,
    "loop": pos.to_json(),
    "rng": np.asarray(jax.device_get(state.rng)).tolist(),
  }
  if primary.is_primary():  # [multi-process] one writer; the others read it on resume
    tmp = _side_path(ckpt) + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(side, f)
    os.replace(tmp, _side_path(ckpt))
  primary.sync("rl_loop.save")
  return wrote, step

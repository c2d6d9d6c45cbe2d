"""Per-step metric records: one JSON line each, mirrored as TensorBoard scalars.

The JSONL file is the source of truth (plots and the demo summary read it); TensorBoard
(tensorboardX) is a convenience view and is skipped silently if tensorboardX is missing.
Appending is resume-safe: on resume, `MetricsWriter(..., resume_step=s)` drops lines with
``step > s`` left by a run that died after logging but before checkpointing, so the file never
holds two records for one step.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

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
  from rstar_jax.distributed.primary import is_primary

  return is_primary()


def read_jsonl_metrics(path: str | os.PathLike) -> list[dict]:
  """All records of a metrics file, in order."""
  out = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.strip():
        out.append(json.loads(line))
  return out


class MetricsWriter:
  """Writes ``{"step": s, **metrics}`` records to ``<dir>/<name>.jsonl`` and TensorBoard.

  Args:
    directory: output folder (created).
    name: file stem of the JSONL file.
    resume_step: if given, existing records with ``step > resume_step`` are removed first.
    tensorboard: also write TensorBoard event files under ``<dir>/tb``.
  """

  def __init__(
    self,
    directory: str | os.PathLike,
    name: str = "metrics",
    *,
    resume_step: int | None = None,
    tensorboard: bool = True,
  ):
    self.path = os.path.join(os.fspath(directory), f"{name}.jsonl")
    self._file = self._tb = None
    if not _primary():  # [multi-process] process 0 writes; the others only return records
      return
    os.makedirs(directory, exist_ok=True)
    if resume_step is not None and os.path.exists(self.path):
      kept = [r for r in read_jsonl_metrics(self.path) if int(r.get("step", 0)) <= resume_step]
      with open(self.path, "w", encoding="utf-8") as f:
        for r in kept:
          f.write(json.dumps(r) + "\n")
    elif resume_step is None and os.path.exists(self.path):
      os.remove(self.path)  # a fresh run starts a fresh log
    self._file = open(self.path, "a", encoding="utf-8")
    self._tb = None
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(os.path.join(os.fspath(directory), "tb", name))
      except Exception as e:  # pragma: no cover - optional dependency
        log.warning("TensorBoard logging disabled: %s", e)

  def write(self, step: int, metrics: Mapping[str, Any]) -> dict:
    rec = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}}
    if self._file is None:
      return rec
    self._file.write(json.dumps(rec) + "\n")
    self._file.flush()
    if self._tb is not None:
      for k, v in rec.items():
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
          self._tb.add_scalar(k, v, int(step))
      self._tb.flush()
    return rec

  def close(self) -> None:
    if self._file is None:
      return
    self._file.close()
    if self._tb is not None:
      self._tb.close()

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

"""Run records: each phase of a run directory keeps the resolved config it ran with, so a rerun
with a different config cannot silently reuse (or resume) results made with the old one.

Works on plain nested dicts (an ``ml_collections.ConfigDict``'s ``to_dict()``, a dataclass's
``dataclasses.asdict``, or anything with those); nothing here knows a config schema.

    phases = [Phase("sft", sections=("model", "sft", "data"), outputs=("sft",)),
              Phase("rl", sections=("",), outputs=("rl", "eval.json"))]   # "" = everything
    records = check_phases(workdir, phases, config, discard_stale=flags.discard_stale)

For each phase with outputs on disk, the recorded config (``<workdir>/resolved_config/
<phase>.json``, restricted to the phase's sections, minus fields that do not change results)
must equal the current one. If any differs, `StaleRunError` says in one line which fields
changed (old -> new), which phases are stale, and the two ways on: a new workdir, or the
discard option, which deletes the stale phases' outputs so they rerun. A phase without outputs
(never run, or discarded) just records the current config. Give a downstream phase the
sections of the phases it consumes, so a change upstream makes it stale too.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rstar_jax.errors import UserError

RECORD_DIR = "resolved_config"

# Fields that never change a phase's results: logging / progress intervals, checkpoint cadence
# and retention, output paths, worker counts, and how the weights reach the SGLang servers
# (transport, delta, colocation, staging path, server addresses: every push ends with a
# weight-version check, so the servers sample from the same policy whichever way it travelled),
# and the experiment-logging sinks (the ``log`` section: W&B, sample rollouts, TensorBoard).
# Glob patterns over dotted field names.
DEFAULT_IGNORE = (
  "*progress_every*",
  "*log_every*",
  "log.*",
  "*checkpoint_every",
  "*keep_checkpoints",
  "*async_checkpoints",
  "*workdir*",
  "*num_workers",
  "*eval_workers",
  "rollout.weight_transport",
  "rollout.weight_delta",
  "rollout.colocated",
  "rollout.staging_dir",
  "rollout.sglang_urls",
  "train.device_memory_gib",  # a start-up check's budget (planning/fit.py)
  "rl.routing_outlier_band",  # which tokens get a diagnostic record; the update is the same
)


class StaleRunError(UserError):
  """A run directory holds outputs made with a different config than this run's."""


@dataclasses.dataclass(frozen=True)
class Phase:
  """One phase of a run.

  Attributes:
      name: the record's file name (``<workdir>/resolved_config/<name>.json``).
      sections: dotted config prefixes whose values the phase's results depend on
          (``"model"`` covers ``model.*``; ``"rl.roc_mode"`` one field; ``""`` all fields).
      outputs: paths under the workdir the phase writes (files or folders); the phase counts
          as run when any exists, and discarding it deletes them.
  """

  name: str
  sections: tuple[str, ...]
  outputs: tuple[str, ...]


def plain(config: Any) -> Any:
  """A JSON-comparable copy of ``config``: ConfigDicts / dataclasses / mappings become dicts,
  tuples lists; other leaves go through JSON (``repr`` for what JSON cannot hold)."""
  return json.loads(json.dumps(_jsonable(config), sort_keys=True, default=_jsonable))


def _jsonable(x: Any) -> Any:
  if hasattr(x, "to_dict") and callable(x.to_dict):
    return x.to_dict()
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    return dataclasses.asdict(x)
  if isinstance(x, (set, frozenset)):
    return sorted(x, key=repr)
  if isinstance(x, Mapping) and not isinstance(x, dict):
    return dict(x)
  if isinstance(x, (dict, list, tuple, str, int, float, bool)) or x is None:
    return x
  return repr(x)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  """{dotted.name: leaf}; lists of dicts are indexed (``stages[1].steps``), other lists are
  leaves."""
  out: dict[str, Any] = {}
  if isinstance(tree, Mapping):
    for k, v in tree.items():
      out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
  elif isinstance(tree, list) and tree and all(isinstance(v, Mapping) for v in tree):
    for i, v in enumerate(tree):
      out.update(flatten(v, f"{prefix}[{i}]"))
  else:
    out[prefix] = tree
  return out


def _covered(name: str, sections: Iterable[str]) -> bool:
  for s in sections:
    if s == "" or name == s or name.startswith(s + ".") or name.startswith(s + "["):
      return True
  return False


def phase_view(
  config: Any, sections: Sequence[str], ignore: Sequence[str] = DEFAULT_IGNORE
) -> dict[str, Any]:
  """The flat {field: value} a phase's results depend on."""
  flat = flatten(plain(config))
  return {
    k: v
    for k, v in sorted(flat.items())
    if _covered(k, sections) and not any(fnmatch.fnmatchcase(k, p) for p in ignore)
  }


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
  """[(field, old, new)] for fields that differ; a missing side is ``<absent>``."""
  missing = "<absent>"
  return [
    (k, old.get(k, missing), new.get(k, missing))
    for k in sorted(set(old) | set(new))
    if old.get(k, missing) != new.get(k, missing)
  ]


def _fmt(v: Any) -> str:
  return v if v == "<absent>" else json.dumps(v)


def record_path(workdir: str, phase: str) -> str:
  return os.path.join(workdir, RECORD_DIR, f"{phase}.json")


def read_record(workdir: str, phase: str) -> dict[str, Any] | None:
  path = record_path(workdir, phase)
  if not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _write_record(workdir: str, phase: str, view: Mapping[str, Any]) -> None:
  path = record_path(workdir, phase)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  # Every process of a multi-process run records its phases: a shared temporary name let one
  # writer's os.replace take the other's file, which then failed with FileNotFoundError.
  fd, tmp = tempfile.mkstemp(
    prefix=os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(path)
  )
  try:
    # mkstemp's 0600 would hide the record from the run's other readers: the mode open() gives
    # under the usual umask.
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      json.dump(dict(view), f, indent=1, sort_keys=True)
    os.replace(tmp, path)
  except BaseException:
    if os.path.lexists(tmp):
      os.remove(tmp)
    raise


def _remove(path: str) -> None:
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path)
  elif os.path.lexists(path):
    os.remove(path)


def check_phases(
  workdir: str,
  phases: Sequence[Phase],
  config: Any,
  *,
  ignore: Sequence[str] = DEFAULT_IGNORE,
  discard_stale: bool = False,
  discard_hint: str = "--discard_stale",
) -> dict[str, dict[str, Any]]:
  """Checks every phase against its record before any work starts; see the module docstring.

  Returns {phase: the recorded (now current) config view}. Raises StaleRunError (one line)
  when a phase with outputs was run with a different config, or recorded none, unless
  ``discard_stale``: then those phases' outputs are deleted and they rerun.
  ``discard_hint`` is how the caller's user asks for the discard (named in the error).
  """
  views = {p.name: phase_view(config, p.sections, ignore) for p in phases}
  stale: dict[str, list[tuple[str, Any, Any]] | None] = {}
  for p in phases:
    if not any(os.path.lexists(os.path.join(workdir, o)) for o in p.outputs):
      continue
    old = read_record(workdir, p.name)
    if old is None:
      stale[p.name] = None
    elif old != views[p.name]:
      stale[p.name] = diff(old, views[p.name])
  if stale and not discard_stale:
    changes: dict[str, tuple[Any, Any]] = {}
    for d in stale.values():
      for k, a, b in d or ():
        changes[k] = (a, b)
    what = (
      ", ".join(f"{k} {_fmt(a)} -> {_fmt(b)}" for k, (a, b) in changes.items()) if changes else ""
    )
    unrecorded = [n for n, d in stale.items() if d is None]
    parts = []
    if what:
      parts.append(f"config changed since they ran: {what}")
    if unrecorded:
      parts.append(f"no recorded config for {', '.join(unrecorded)} (an older run)")
    raise StaleRunError(
      f"{workdir}: phases {', '.join(stale)} hold results of a different run ("
      f"{'; '.join(parts)}); use a new --workdir, or {discard_hint} to delete those "
      "phases' outputs and rerun them"
    )
  for p in phases:
    if p.name in stale:
      for o in p.outputs:
        _remove(os.path.join(workdir, o))
    _write_record(workdir, p.name, views[p.name])
  return views


def record_or_check(
  workdir: str,
  phase: str,
  config: Any,
  *,
  sections: Sequence[str] = ("",),
  outputs: Sequence[str] | None = None,
  ignore: Sequence[str] = DEFAULT_IGNORE,
  discard_stale: bool = False,
  discard_hint: str = "--discard_stale",
) -> dict[str, Any]:
  """`check_phases` for a single phase whose outputs default to ``<workdir>/<phase>``."""
  p = Phase(phase, tuple(sections), tuple(outputs) if outputs is not None else (phase,))
  return check_phases(
    workdir, [p], config, ignore=ignore, discard_stale=discard_stale, discard_hint=discard_hint
  )[phase]

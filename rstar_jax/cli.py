"""Launcher edge: user errors as one line, bugs as tracebacks, paths checked before any work.

    from rstar_jax import cli
    def main(argv):
        cli.check_workdir(_WORKDIR.value)
        run = cli.typed_config(_CONFIG.value, "rl", "launchers.train")
        cli.check_dir(run.model.hf_dir, "config.model.hf_dir")
        ...
    if __name__ == "__main__":
        cli.run(main)          # instead of absl.app.run(main)

`run` prints a `rstar_jax.errors.UserError` (a bad config value, a missing path, a stale run
directory, an incompatible checkpoint) as one absl ``logging.error`` line and exits with status
2 (a `rstar_jax.errors.CheckpointedStop`, e.g. every rollout server gone, as one line and
status 75); any other exception keeps its full traceback (it is a bug to report). Ctrl-C is one line
too (``interrupted at step N; rerun the same command to resume`` when the launcher says how to
find N) and exit status 130.

Every launcher using `run` also gets:
  * ``--describe_config``: prints each config field with its value (after the overrides), its
    default and its doc, then exits 0 (`describe_lines`);
  * ``--help`` exiting 0 (absl exits 1), fast when the launcher imports jax only in ``main``;
  * list fields (`LIST_FIELDS`, e.g. ``--config.rollout.sglang_urls=http://a:1,http://b:2``)
    overridable from the command line, which ml_collections refuses for lists;
  * ``--config.imports=my_pkg.my_losses`` on any recipe (the modules are imported before the
    config is checked, so what they register can be named: `rstar_jax.config.convert`);
  * a missing ``--config`` file as one line.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Sequence

from absl import app, flags, logging

from rstar_jax.config import eval_protocols, from_config_dict, schema
from rstar_jax.errors import CheckpointedStop, UserError, complete_steps, disk_full_reason
from rstar_jax.planning.kv_cache import kv_cache_bytes

USAGE_ERROR_EXIT = 2
INTERRUPTED_EXIT = 130  # the shell's code for SIGINT
_HELP_ARGS = ("--help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")

_DESCRIBE = flags.DEFINE_bool(
  "describe_config",
  False,
  "Print every config field with its value (after --config.* overrides), default and doc; exit 0.",
)


_MAX_RESTARTS = flags.DEFINE_integer(
  "max_restarts",
  0,
  "Supervise the run: when a learner process crashes (killed, out of memory, a JAX process "
  "of a multi-process run lost), restart every process from the last checkpoint with the same "
  "command, at most this many times (0 = no supervisor). <workdir>/supervisor.json records "
  "each attempt. launchers.train / launchers.sft.",
)
_NUM_PROCESSES = flags.DEFINE_integer(
  "num_processes",
  1,
  "With the supervisor: run the learner as this many JAX processes on this machine "
  "(RSTAR_* variables of rstar_jax.distributed.init; a crash of any restarts all).",
)
_DEVICES_PER_PROCESS = flags.DEFINE_integer(
  "devices_per_process",
  0,
  "With --num_processes: host-platform devices per process (XLA_FLAGS; 0 = unchanged).",
)


def _list_fields() -> frozenset[str]:
  out = {"imports", "data.synthetic.families"}
  for name, cls in schema.SECTIONS.items():
    for f in dataclasses.fields(cls):
      if f.metadata.get("check") is schema.STR_TUPLE:
        out.add(f"{name}.{f.name}")
  return frozenset(out)


# Config paths holding a list of strings: ml_collections cannot override a list from the
# command line, so `parse_flags` takes these overrides out of argv and sets them itself.
LIST_FIELDS = _list_fields()
# The launcher that runs each config mode (a recipe's variant sets ``mode``).
LAUNCHER_OF_MODE = {"rl": "launchers.train", "sft": "launchers.sft", "eval": "launchers.eval"}


def run(
  main: Callable[[Sequence[str]], object],
  on_interrupt: Callable[[], str] | None = None,
  required: Sequence[str] = (),
  workdir: Callable[[], str | None] | None = None,
  supervisable: bool = False,
) -> None:
  """`absl.app.run(main)` with `UserError` reported as one line and exit status 2; so is a
  ``--config.x.y=v`` override naming a field the config does not have, and a flag of
  ``required`` left unset (checked after ``--describe_config``, which needs none of them;
  `flags.mark_flags_as_required` would refuse it). Ctrl-C prints ``on_interrupt()`` (default:
  a generic line) and exits 130. A write that fails for lack of space (or quota) anywhere is
  one line naming the file and the last good checkpoint under ``workdir()``/ckpt, exit 2.

  ``supervisable``: the launcher accepts ``--max_restarts`` / ``--num_processes`` and then
  becomes the supervisor of its own learner processes (`supervised`)."""
  body = supervised(main, workdir) if supervisable else _refuse_supervisor_flags(main)
  app.run(wrap(body, on_interrupt, workdir), flags_parser=lambda argv: parse_flags(argv, required))


def _supervisor_flags_set() -> list[str]:
  return [f"--{f.name}" for f in (_MAX_RESTARTS, _NUM_PROCESSES, _DEVICES_PER_PROCESS) if f.present]


def _refuse_supervisor_flags(body: Callable[[Sequence[str]], object]):
  def checked(argv):
    bad = _supervisor_flags_set()
    if bad:
      raise UserError(
        f"{', '.join(bad)}: only launchers.train and launchers.sft supervise their learner "
        "processes"
      )
    return body(argv)

  return checked


def launcher_module() -> str | None:
  """The module this process runs as (``python -m launchers.train`` -> "launchers.train")."""
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  return spec.name if spec is not None else None


def supervised(
  body: Callable[[Sequence[str]], object], workdir: Callable[[], str | None] | None
) -> Callable[[Sequence[str]], object]:
  """``body``, or with ``--max_restarts`` > 0 or ``--num_processes`` > 1 a
  `rstar_jax.pipelines.supervisor.Supervisor` running ``body``'s launcher as learner processes
  (they see ``RSTAR_SUPERVISED=1`` and run ``body``). The flags are checked, and the config
  parsed (a bad override is one line before any process starts), here."""

  def run_or_supervise(argv):
    # Imported here: jax-free, but only a supervised launch needs it.
    from rstar_jax.pipelines import supervisor

    restarts, procs = _MAX_RESTARTS.value, _NUM_PROCESSES.value
    if supervisor.is_supervised_child() or (restarts == 0 and procs == 1):
      return body(argv)
    problems = []
    if restarts < 0:
      problems.append(f"--max_restarts: expected >= 0, got {restarts}")
    if procs < 1:
      problems.append(f"--num_processes: expected >= 1, got {procs}")
    if _DEVICES_PER_PROCESS.value < 0:
      problems.append(f"--devices_per_process: expected >= 0, got {_DEVICES_PER_PROCESS.value}")
    module = launcher_module()
    if module is None:
      problems.append("--max_restarts: run the launcher as a module (python -m launchers.train)")
    wd = workdir() if workdir else None
    if not wd:
      problems.append(
        "--max_restarts: the launcher needs --workdir (its ckpt/ is the resume point)"
      )
    if problems:
      raise UserError("; ".join(problems))
    check_workdir(wd)
    sup = supervisor.Supervisor(
      supervisor.child_argv(sys.argv, module),
      wd,
      max_restarts=restarts,
      num_processes=procs,
      devices_per_process=_DEVICES_PER_PROCESS.value,
    )
    sys.exit(sup.run())

  run_or_supervise.__name__ = getattr(body, "__name__", "main")
  run_or_supervise.__doc__ = body.__doc__
  return run_or_supervise


def parse_flags(argv: Sequence[str], required: Sequence[str] = ()):
  """`absl.app.parse_flags_with_usage` where the user errors raised while flags are parsed
  (a recipe's ``get_config`` rejecting a variant; ml_collections rejecting an override of an
  unknown field, which it raises as a KeyError / AttributeError with a traceback; a missing
  ``--config`` file) exit 2 with one line, ``--help`` exits 0, list overrides are applied and
  ``--describe_config`` prints the config and exits 0."""
  argv = list(argv)
  missing = missing_config_file(argv)
  if missing:
    _fail(missing)
  argv, lists = take_list_overrides(argv)
  wants_help = any(a.split("=", 1)[0] in _HELP_ARGS for a in argv[1:])
  saved = sys.argv
  if lists:  # config_flags finds its overrides in sys.argv itself
    sys.argv = list(argv)
  try:
    rest = app.parse_flags_with_usage(argv)
  except SystemExit as e:
    if wants_help and e.code in (0, 1, None):
      sys.exit(0)
    raise
  except UserError as e:
    _fail(str(e))
  except (KeyError, AttributeError) as e:
    msg = unknown_override(e, argv)
    if msg is None:
      raise
    _fail(msg)
  finally:
    sys.argv = saved
  cfg = _config_value()
  try:
    if lists:
      if cfg is None:
        raise UserError(f"--config.{lists[0][0]}: this launcher has no --config")
      apply_list_overrides(cfg, lists)
    if _DESCRIBE.value:
      if cfg is None:
        raise UserError("--config: required (--describe_config prints the config's fields)")
      sys.stdout.write("\n".join(describe_lines(cfg)) + "\n")
      sys.exit(0)
    unset = [f"--{n}" for n in required if flags.FLAGS[n].value is None]
    if unset:
      raise UserError(f"{', '.join(unset)}: required (see --help)")
  except UserError as e:
    _fail(str(e))
  return rest


def _config_value():
  fl = flags.FLAGS
  return fl["config"].value if "config" in fl else None


def missing_config_file(argv: Sequence[str]) -> str | None:
  """``--config: no such file 'x.py'`` when ``argv`` names a recipe file that is not there
  (ml_collections reports it as a multi-line flags error)."""
  for i, a in enumerate(argv[1:], 1):
    if a.startswith("--config="):
      value = a.split("=", 1)[1]
    elif a == "--config" and i + 1 < len(argv):
      value = argv[i + 1]
    else:
      continue
    path = value.split(":", 1)[0]
    if path and not os.path.isfile(path):
      where = "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"
      return f"--config: no such recipe file {path!r}{where}"
  return None


def take_list_overrides(argv: Sequence[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
  """(argv without the list-field overrides, [(path, values)]): ``--config.a.b=x,y`` or
  ``--config.a.b="['x', 'y']"`` for a path in `LIST_FIELDS`; '' is the empty list."""
  rest, found = [], []
  for a in argv:
    m = re.fullmatch(r"--config\.([\w.]+)=(.*)", a, flags=re.S)
    if not m or m.group(1) not in LIST_FIELDS:
      rest.append(a)
      continue
    found.append((m.group(1), parse_list(m.group(1), m.group(2))))
  return rest, found


def parse_list(path: str, text: str) -> list[str]:
  text = text.strip()
  if text[:1] in "[(" and text:
    try:
      v = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      raise UserError(
        f"--config.{path}: expected a comma-separated list or a Python list of strings, "
        f"got {text!r}"
      ) from None
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
      raise UserError(f"--config.{path}: expected a list of strings, got {text!r}")
    return list(v)
  return [x.strip() for x in text.split(",") if x.strip()]


def apply_list_overrides(cfg, lists: Sequence[tuple[str, list[str]]]) -> None:
  """Sets each (path, values) on the ConfigDict ``cfg`` (a list, a tuple or a comma-joined
  string, as the field already holds). ``imports`` may be absent from the recipe."""
  for path, values in lists:
    *parents, key = path.split(".")
    node = cfg
    for i, p in enumerate(parents):
      if p not in node or node[p] is None:
        raise UserError(f"config.{'.'.join(parents[: i + 1])}: unknown field (in {path})")
      node = node[p]
    if key not in node:
      if path != "imports":
        raise UserError(f"config.{path}: unknown field")
      with node.unlocked() if hasattr(node, "unlocked") else contextlib.nullcontext():
        node[key] = list(values)
      continue
    old = node[key]
    node[key] = ",".join(values) if isinstance(old, str) else type(old or [])(values)


def describe_lines(cfg) -> list[str]:
  """One line per config field: ``section.field = value  [default d]  doc``, for every
  section of the typed config of ``cfg``, its stages and the effect of ``eval.protocol``."""

  run = from_config_dict(cfg, check_inputs=False)
  out = [f"mode = {run.mode!r}", f"imports = {list(run.imports)!r}  [default []]"]

  def section(prefix: str, obj, cls) -> None:
    if obj is None:
      out.append(f"{prefix} = None  (section off)")
      return
    for name, default, doc in schema.describe(cls):
      value = getattr(obj, name)
      if dataclasses.is_dataclass(value):
        section(f"{prefix}.{name}", value, type(value))
        continue
      mark = "" if value == default else " *"
      out.append(f"{prefix}.{name} = {_show(value)}{mark}  [default {_show(default)}]  {doc}")

  for name, cls in schema.SECTIONS.items():
    section(name, getattr(run, name), cls)
  for i, st in enumerate(run.stages):
    section(f"stages[{i}]", st, schema.StageConfig)
  _, notes = eval_protocols.resolve_with_notes(run.eval)
  out += [f"# {n}" for n in notes]
  out.append("# '*' = differs from the default")
  return out


def _show(v) -> str:
  if isinstance(v, tuple):
    v = list(v)
  try:
    return json.dumps(v, ensure_ascii=False)
  except TypeError:
    return repr(v)


def unknown_override(err: BaseException, argv: Sequence[str]) -> str | None:
  """``config.rl.gruop_size: unknown field; did you mean group_size`` for ml_collections'
  error on the override ``--config.rl.gruop_size=4`` in ``argv``; None when ``err`` is not
  about an override there."""
  while err.args and isinstance(err.args[0], BaseException):  # AttributeError(KeyError(..))
    err = err.args[0]
  text = str(err.args[0]) if err.args else str(err)
  m = re.match(r"""\s*['"]?([\w-]+)""", text)
  if not m:
    return None
  key = m.group(1)
  hint = re.search(r'Did you mean "([^"]+)"', text)
  for arg in argv[1:]:
    o = re.match(r"--(\w+)\.([\w.]+)(=|$)", arg)
    if not o:
      continue
    parts = o.group(2).split(".")
    if key in parts:
      path = ".".join([o.group(1)] + parts[: parts.index(key) + 1])
      return f"{path}: unknown field" + (f"; did you mean {hint.group(1)}" if hint else "")
  return None


def _fail(msg: str) -> None:
  # Flags are not parsed yet, so absl logging would add a "logging before flag parsing" line.
  sys.stderr.write("ERROR: " + " ".join(msg.split()) + "\n")
  sys.exit(USAGE_ERROR_EXIT)


def wrap(
  main: Callable[[Sequence[str]], object],
  on_interrupt: Callable[[], str] | None = None,
  workdir: Callable[[], str | None] | None = None,
) -> Callable[[Sequence[str]], object]:
  """``main`` with `UserError` turned into one error line and ``SystemExit(2)``, a full disk
  into `disk_full_line` and ``SystemExit(2)``, and Ctrl-C into the line ``on_interrupt()``
  and ``SystemExit(130)``."""

  def wrapped(argv):
    try:
      return main(argv)
    except UserError as e:
      logging.error("%s", " ".join(str(e).split()))
      sys.exit(USAGE_ERROR_EXIT)
    except CheckpointedStop as e:  # an outside failure; the loop checkpointed first
      logging.error("%s", " ".join(str(e).split()))
      sys.exit(e.exit_code)
    except Exception as e:
      reason = disk_full_reason(e)
      if reason is None:
        raise
      logging.error("%s", disk_full_line(e, reason, workdir() if workdir else None))
      sys.exit(USAGE_ERROR_EXIT)
    except KeyboardInterrupt:
      try:
        line = on_interrupt() if on_interrupt else ""
      except Exception:  # the interrupt line must not turn into a traceback
        line = ""
      logging.error("%s", line or "interrupted; rerun the same command to resume")
      sys.exit(INTERRUPTED_EXIT)

  wrapped.__name__ = getattr(main, "__name__", "main")
  wrapped.__doc__ = main.__doc__
  return wrapped


def disk_full_line(err: BaseException, reason: str, workdir: str | None) -> str:
  """``<file>: cannot write (no space left on device); the last good checkpoint is step N
  (<workdir>/ckpt/N): free space, then rerun the same command to resume``."""
  where = getattr(err, "filename", None) or workdir or "a file"
  line = f"{where}: cannot write ({reason})"
  if workdir:
    ckpt = os.path.join(workdir, "ckpt")
    steps = complete_steps(ckpt)
    line += (
      f"; the last good checkpoint is step {steps[-1]} ({os.path.join(ckpt, str(steps[-1]))})"
      if steps
      else f"; there is no complete checkpoint in {ckpt} yet"
    )
  return line + ": free space, then rerun the same command to resume"


def last_logged_step(path: str) -> int:
  """The ``step`` of the last record of a metrics JSONL file (0 when there is none)."""
  step = 0
  try:
    with open(path, encoding="utf-8") as f:
      for line in f:
        try:
          step = int(json.loads(line).get("step", step))
        except (ValueError, AttributeError):
          continue
  except OSError:
    pass
  return step


def interrupted_line(workdir: str, metrics: str, checkpoint_step: int | None = None) -> str:
  """``interrupted at step N; rerun the same command to resume`` for a run whose last logged
  step (``<workdir>/<metrics>.jsonl``) is N, naming the checkpoint a resume starts from when it
  is older."""
  done = last_logged_step(os.path.join(workdir, metrics + ".jsonl"))
  line = f"interrupted at step {done}; rerun the same command to resume"
  if checkpoint_step is not None and checkpoint_step < done:
    line += f" (from the checkpoint of step {checkpoint_step}; the steps after it are redone)"
  return line


def sft_interrupted_line(workdir: str) -> str:
  """`interrupted_line` of an SFT workdir: the checkpoint an interrupt writes is the resume
  point (`sft_loop` records a step's state and metric row together, so they agree)."""
  steps = complete_steps(os.path.join(workdir, "ckpt"))
  return interrupted_line(workdir, "sft_metrics", steps[-1] if steps else 0)


def rl_interrupted_line(workdir: str) -> str:
  """`interrupted_line` of an RL workdir (its checkpointed loop position is the resume point)."""
  ckpt_step = 0
  try:
    with open(os.path.join(workdir, "ckpt", "loop_position.json"), encoding="utf-8") as f:
      ckpt_step = int(json.load(f)["loop"]["rl_step"])
  except (OSError, ValueError, KeyError, TypeError):
    pass
  return interrupted_line(workdir, "metrics", ckpt_step)


# The demo's phases in order with the folder of the two that train (`pipelines.demo`).
_DEMO_PHASES = ("data", "tokenizer", "sft", "eval_sft", "rl", "eval_rl", "report")


def demo_interrupted_line(workdir: str) -> str:
  """``interrupted in phase rl at step N; rerun the same command to resume`` for a
  `launchers.demo` workdir: the phase after the last finished one (``demo_state.json``), and
  for the training phases the step their checkpoint resumes from."""
  try:
    with open(os.path.join(workdir, "demo_state.json"), encoding="utf-8") as f:
      done = json.load(f).get("last_phase") or ""
  except (OSError, ValueError, AttributeError):
    done = ""
  if done == "rl (unfinished)":  # demo.rl_max_steps stopped the last run inside RL
    phase = "rl"
  else:
    i = _DEMO_PHASES.index(done) + 1 if done in _DEMO_PHASES else 0
    phase = _DEMO_PHASES[min(i, len(_DEMO_PHASES) - 1)]
  if phase == "rl":
    line = rl_interrupted_line(os.path.join(workdir, "rl"))
  elif phase == "sft":
    line = sft_interrupted_line(os.path.join(workdir, "sft"))
  else:
    return f"interrupted in phase {phase}; rerun the same command to resume"
  return line.replace("interrupted at step", f"interrupted in phase {phase} at step", 1)


def check_dir(path: str, field: str, *, must_exist: bool = True) -> None:
  """``path`` (the value of config field / flag ``field``) is a directory; empty is allowed
  (the field is unset)."""
  if not path:
    return
  if os.path.isdir(path):
    return
  if os.path.exists(path):
    raise UserError(f"{field}: expected a directory, got {path!r} (a file)")
  if must_exist:
    raise UserError(f"{field}: expected an existing directory, got {path!r} (not found)")


def check_checkpoint_dir(path: str, field: str) -> None:
  """``path`` is a directory holding at least one orbax checkpoint (a step-numbered folder)."""
  check_dir(path, field)
  if path and not any(n.isdigit() for n in os.listdir(path)):
    raise UserError(
      f"{field}: no checkpoint in {path!r} (expected step folders such as {path}/10; "
      "is it a run's ckpt/ directory, and did that run save a step?)"
    )


def check_mesh(run, num_devices: int) -> None:
  """The config's mesh fits ``num_devices`` (`sharding.mesh.resolve_axis_sizes`'s rule)."""
  import math

  m = run.mesh
  n = min(m.num_devices, num_devices) if m.num_devices else num_devices
  if m.num_devices > num_devices:
    raise UserError(
      f"config.mesh.num_devices: expected <= the {num_devices} devices here, got {m.num_devices}"
    )
  sizes = m.axes
  fixed = math.prod(v for v in sizes.values() if v != -1)
  free = any(v == -1 for v in sizes.values())
  if (free and n % fixed) or (not free and fixed != n):
    raise UserError(
      f"config.mesh: axes {sizes} need {'a multiple of ' if free else ''}{fixed} devices, "
      f"this run has {n}; e.g. --config.mesh.fsdp=-1 --config.mesh.tensor=1 "
      f"--config.mesh.data=1 (or --config.mesh.num_devices=1)"
    )


def device_memory_bytes() -> int | None:
  """Memory of the first local device (an accelerator's limit, or the host RAM for a CPU)."""
  import jax

  d = jax.local_devices()[0]
  stats = None
  try:
    stats = d.memory_stats()
  except Exception:  # some backends do not implement it
    stats = None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  if d.platform == "cpu":
    try:
      return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
      return None
  return None


def check_kv_cache(run, model_config, available: int | None) -> None:
  """With ``rollout.engine='jax'``: the sampler's KV cache alone fits ``available`` bytes (a
  lower bound of what it needs: params and activations come on top); else one line naming
  the settings to lower, before anything is allocated."""
  if run.rollout.engine != "jax" or not available:
    return
  need, max_len = kv_cache_bytes(run, model_config)
  if need > available:
    gib = 1 << 30
    raise UserError(
      f"rollout: the JaxSampler's KV cache needs {need / gib:.1f} GiB (rollout.max_batch="
      f"{run.rollout.max_batch} slots x max_len={max_len} positions x "
      f"{model_config.num_hidden_layers} layers), more than the device's "
      f"{available / gib:.1f} GiB; lower rollout.max_batch, rollout.max_len or the "
      "response budgets (stages, rollout / eval.response_budget, eval.protocol)"
    )


def check_devices(run) -> None:
  """`check_mesh` against this run's devices, then (rollout engine 'jax') `check_kv_cache`;
  call after `launch.maybe_initialize_distributed` (the device count is global then)."""
  import jax

  check_mesh(run, jax.device_count())
  if run.rollout.engine == "jax":
    check_kv_cache(run, run.model.qwen3_config(), device_memory_bytes())


def check_workdir(path: str, field: str = "--workdir") -> None:
  """``path`` is, or can be created as, a writable directory (checked without creating it)."""
  if not path:
    raise UserError(f"{field}: expected a directory path, got an empty value")
  path = os.path.abspath(path)
  if os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f"{field}: {path!r} is a file, expected a directory")
  parent = path
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise UserError(f"{field}: cannot create {path!r}: {parent!r} is a file, not a directory")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise UserError(f"{field}: cannot write under {parent!r} (permission denied)")


def typed_config(cfg, mode: str, launcher: str, **convert_kw):
  """The typed `RunConfig` of launcher ``launcher``'s ``--config``, which must be a ``mode``
  config: a recipe's ``:sft`` variant given to ``launchers.train`` (or the reverse) is one
  line naming the right launcher, not a list of fields the other mode lacks. Conversion
  problems (unknown or bad fields) are `ConfigError`s, also `UserError`s."""

  got = cfg.mode if "mode" in cfg else mode
  if got != mode:
    right = LAUNCHER_OF_MODE.get(got, "")
    raise UserError(
      f"{launcher}: --config is a {got!r} config, expected a {mode!r} one"
      + (f" (run it with {right}, or pass the recipe's :{mode} variant)" if right else "")
    )
  run = from_config_dict(cfg, mode, **convert_kw)

  # At start, not at the first evaluation: the fields eval.protocol replaces are logged (and
  # a strict protocol's conflict is an error) before any work.
  eval_protocols.resolve(run.eval)
  return run


def check_model_dirs(run, need_tokenizer: bool = True) -> None:
  """The typed config's ``model.hf_dir`` / ``model.tokenizer_dir``, when set, are directories,
  and (``need_tokenizer``) the one the tokenizer comes from (``tokenizer_dir``, else
  ``hf_dir``) holds one."""
  m = run.model
  check_dir(m.hf_dir, "config.model.hf_dir")
  check_dir(m.tokenizer_dir, "config.model.tokenizer_dir")
  field, path = (
    ("config.model.tokenizer_dir", m.tokenizer_dir)
    if m.tokenizer_dir
    else ("config.model.hf_dir", m.hf_dir)
  )
  if (
    need_tokenizer
    and path
    and not any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES)
  ):
    raise UserError(
      f"{field}: {path!r} holds no tokenizer (expected tokenizer.json or "
      "tokenizer_config.json); copy the model's tokenizer files there, or name a directory "
      "that has them with --config.model.tokenizer_dir=DIR"
    )


# What `rstar_jax.tokenization.bpe.load_tokenizer` reads (not imported: it loads transformers).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")

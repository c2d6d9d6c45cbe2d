"""What every launcher does before and after the run: logging, joining a multi-host job, and
printing the summary.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading

import jax
from absl import logging as absl_logging

from rstar_jax.distributed import init as dist_init

log = logging.getLogger(__name__)


def maybe_initialize_distributed() -> bool:
  """``jax.distributed.initialize()`` when a multi-host environment is detected.

  Detected from the variables JAX's own cluster detection or common launchers set
  (coordinator address, SLURM, Open MPI, Kubernetes JobSet / TPU pods), or the ``RSTAR_*``
  variables of `scripts/local_cluster.sh` (`rstar_jax.distributed.init`). Returns whether it ran.
  """
  if dist_init.initialize_from_env():
    return True
  keys = (
    "JAX_COORDINATOR_ADDRESS",
    "COORDINATOR_ADDRESS",
    "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_SIZE",
    "JOBSET_NAME",
    "MEGASCALE_COORDINATOR_ADDRESS",
  )
  num = (
    os.getenv("JAX_NUM_PROCESSES") or os.getenv("SLURM_NTASKS") or os.getenv("OMPI_COMM_WORLD_SIZE")
  )
  if not any(k in os.environ for k in keys):
    return False
  if num is not None and int(num) <= 1:
    return False
  jax.distributed.initialize()
  log.info(
    "jax.distributed initialised: process %d of %d", jax.process_index(), jax.process_count()
  )
  return True


def setup_logging(level: int = logging.INFO) -> None:
  """Launcher logging: our progress at INFO, orbax/absl chatter at WARNING."""
  logging.basicConfig(
    level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
  )
  for name in ("absl", "orbax", "jax", "jax._src"):
    logging.getLogger(name).setLevel(logging.WARNING)
  absl_logging.set_verbosity(absl_logging.WARNING)
  for h in logging.getLogger().handlers:
    h.addFilter(drop_orbax_records)
  # A background thread's uncaught exception goes to stderr directly; through logging, the
  # filter drops orbax's own (its writer threads after a failed save, at exit).
  threading.excepthook = _log_thread_exception
  # TensorStore completing a write after orbax's event loop closed (a failed save tears the
  # loop down while sibling writes run) reports each as an "unraisable" traceback.
  sys.unraisablehook = _log_unraisable


_ORBAX_DIR = os.sep + "orbax" + os.sep


def drop_orbax_records(record: logging.LogRecord) -> bool:
  """False for a record orbax logs itself (through absl, so only its source file tells).

  Every orbax failure a launcher can hit reaches it as an exception that
  `rstar_jax.learner.checkpoint` turns into one line (a full disk, another model's shape);
  orbax's own log of it is a stack of ERROR records per background thread (~80 tracebacks
  for a full disk) or advice about its own API (``strict=False``) that a user cannot act on.
  """
  if _ORBAX_DIR in (record.pathname or ""):
    return False
  # asyncio's "Task exception was never retrieved" for orbax's write tasks, a thread's death.
  exc = record.exc_info[1] if record.exc_info else None
  return exc is None or not _raised_in_orbax(exc)


def _raised_in_orbax(exc: BaseException) -> bool:
  tb = exc.__traceback__
  while tb is not None:
    if _ORBAX_DIR in tb.tb_frame.f_code.co_filename:
      return True
    tb = tb.tb_next
  return False


def _log_unraisable(args) -> None:
  exc = args.exc_value
  if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
    return
  where = f" in {args.object!r}" if args.object is not None else ""
  log.error(
    "%s%s",
    args.err_msg or "exception ignored",
    where,
    exc_info=(args.exc_type, exc, args.exc_traceback),
  )


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
  if args.exc_type is SystemExit:
    return
  name = args.thread.name if args.thread is not None else "?"
  log.error(
    "exception in thread %s", name, exc_info=(args.exc_type, args.exc_value, args.exc_traceback)
  )


def summary_json(d: dict) -> str:
  """The JSON-serialisable part of a loop's summary dict (objects like the learner dropped)."""
  out = {}
  for k, v in d.items():
    try:
      json.dumps(v)
    except TypeError:
      continue
    out[k] = v
  return json.dumps(out, indent=1, sort_keys=True)


def run_line(run, launcher: str) -> str:
  """One line saying what a run trains or evaluates with: the model source, the chat format,
  the reward and its verifier (RL / eval), the LoRA rank and the RL loss settings; logged at
  start so a custom reward, a LoRA run or another recipe's checkpoint is visible up front."""
  m, parts = run.model, []
  parts.append(f"model {m.hf_dir or 'from scratch (config.model)'}")
  parts.append(f"chat format {run.rollout.chat_format!r}")
  if run.mode != "sft":
    parts.append(f"reward {run.reward.name!r} (verifier {run.reward.verifier!r})")
  lora = f"rank {m.lora_rank}, alpha {m.lora_alpha:g}" if m.lora_rank else "off (full fine-tuning)"
  parts.append(f"LoRA {lora}")
  if run.mode == "rl":
    parts.append(f"policy loss {run.rl.policy_loss!r}, roc_mode {run.rl.roc_mode!r}")
  return f"{launcher}: " + "; ".join(parts)

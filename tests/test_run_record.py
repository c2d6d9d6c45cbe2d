"""run_record: phases record their resolved config; a changed config stops with one line that
names the changed fields and the two ways on; discarding deletes only the stale phases."""

import dataclasses
import json
import os

import ml_collections
import pytest

from rstar_jax import run_record
from rstar_jax.errors import UserError
from rstar_jax.run_record import Phase, StaleRunError

PHASES = [Phase("sft", ("model", "sft"), ("sft",)), Phase("rl", ("",), ("rl", "rl_eval.json"))]


def _cfg(**over):
  c = ml_collections.ConfigDict(
    dict(
      model=dict(hidden=64, layers=2),
      sft=dict(epochs=1.0, log_every_s=5.0),
      rl=dict(roc_mode="paper", group_size=4),
      stages=[dict(name="s1", steps=2), dict(name="s2", steps=1)],
      train=dict(progress_every_s=5.0, checkpoint_every=1),
    )
  )
  for k, v in over.items():
    node = c
    *path, last = k.split(".")
    for p in path:
      node = node[p]
    node[last] = v
  return c


def _run(w, phases=PHASES):
  for p in phases:
    for o in p.outputs:
      path = os.path.join(w, o)
      if o.endswith(".json"):
        open(path, "w").write("{}")
      else:
        os.makedirs(path, exist_ok=True)


def test_flatten_and_diff():
  flat = run_record.flatten(run_record.plain(_cfg()))
  assert flat["stages[1].steps"] == 1 and flat["model.hidden"] == 64
  assert run_record.diff({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == [
    ("b", 2, 3),
    ("c", "<absent>", 4),
  ]

  @dataclasses.dataclass
  class Typed:
    lr: float = 1e-3
    names: tuple = ("a", "b")

  assert run_record.flatten(run_record.plain({"optim": Typed()})) == {
    "optim.lr": 1e-3,
    "optim.names": ["a", "b"],
  }


def test_same_config_reuses_and_ignored_fields_do_not_count(tmp_path):
  w = str(tmp_path)
  run_record.check_phases(w, PHASES, _cfg())
  _run(w)
  rec = json.load(open(os.path.join(w, "resolved_config", "rl.json")))
  assert rec["rl.roc_mode"] == "paper" and "train.progress_every_s" not in rec
  # Logging / checkpoint cadence does not change results: no error, outputs kept.
  run_record.check_phases(
    w, PHASES, _cfg(**{"train.progress_every_s": 60.0, "sft.log_every_s": 1.0})
  )
  # Nor do the logging sinks: W&B switched on, sample rollouts added on a resume.
  logged = _cfg()
  logged.log = ml_collections.ConfigDict(dict(wandb=True, samples_every=5))
  run_record.check_phases(w, PHASES, logged)
  assert os.path.isdir(os.path.join(w, "sft")) and os.path.isdir(os.path.join(w, "rl"))


def test_weight_transport_settings_do_not_count_but_sampling_does(tmp_path):
  push = dict(
    weight_transport="disk",
    weight_delta=False,
    colocated=False,
    staging_dir="/dev/shm/a",
    sglang_urls=["http://127.0.0.1:1"],
  )
  other = ("distributed", True, True, "/dev/shm/b", ["http://127.0.0.1:2"])

  def cfg(**rollout):
    c = _cfg()
    c.rollout = ml_collections.ConfigDict(dict(push, temperature=1.0))
    c.rollout.update(rollout)
    return c

  w = str(tmp_path)
  run_record.check_phases(w, PHASES, cfg())
  _run(w)
  run_record.check_phases(w, PHASES, cfg(**dict(zip(push, other))))  # every push field moved
  with pytest.raises(StaleRunError, match=r"rollout\.temperature 1\.0 -> 0\.6"):
    run_record.check_phases(w, PHASES, cfg(temperature=0.6))


def test_changed_field_stops_with_one_line(tmp_path):
  w = str(tmp_path)
  run_record.check_phases(w, PHASES, _cfg())
  _run(w)
  with pytest.raises(StaleRunError) as e:
    run_record.check_phases(w, PHASES, _cfg(**{"rl.roc_mode": "random"}))
  msg = str(e.value)
  assert "\n" not in msg and isinstance(e.value, UserError)
  assert 'rl.roc_mode "paper" -> "random"' in msg
  assert "phases rl hold" in msg and "sft" not in msg.split("(")[0]
  assert "new --workdir" in msg and "--discard_stale" in msg
  # Nothing was touched: the old record and outputs stay.
  assert json.load(open(os.path.join(w, "resolved_config", "rl.json")))["rl.roc_mode"] == "paper"
  # An upstream change makes the downstream phase stale too, all named at once.
  with pytest.raises(
    StaleRunError,
    match=r"phases sft, rl hold .*sft\.epochs 1\.0 -> 2\.0, "
    r'rl\.roc_mode "paper" -> "random"',
  ):
    run_record.check_phases(w, PHASES, _cfg(**{"rl.roc_mode": "random", "sft.epochs": 2.0}))


def test_discard_deletes_only_stale_phases(tmp_path):
  w = str(tmp_path)
  run_record.check_phases(w, PHASES, _cfg())
  _run(w)
  open(os.path.join(w, "sft", "marker"), "w").write("kept")
  new = _cfg(**{"rl.roc_mode": "random"})
  run_record.check_phases(w, PHASES, new, discard_stale=True)
  assert not os.path.exists(os.path.join(w, "rl")) and not os.path.exists(
    os.path.join(w, "rl_eval.json")
  )
  assert open(os.path.join(w, "sft", "marker")).read() == "kept"
  assert run_record.read_record(w, "rl")["rl.roc_mode"] == "random"
  _run(w, PHASES[1:])
  run_record.check_phases(w, PHASES, new)  # the rerun's outputs now match


def test_unrun_phase_just_records_and_unrecorded_outputs_are_stale(tmp_path):
  w = str(tmp_path)
  run_record.check_phases(w, PHASES, _cfg())
  # Nothing ran yet: a different config simply replaces the records.
  run_record.check_phases(w, PHASES, _cfg(**{"model.hidden": 32}))
  assert run_record.read_record(w, "sft")["model.hidden"] == 32
  # Outputs of a run that recorded nothing (an older version) cannot be trusted.
  w2 = str(tmp_path / "old")
  os.makedirs(os.path.join(w2, "sft"))
  with pytest.raises(StaleRunError, match="no recorded config for sft"):
    run_record.check_phases(w2, PHASES, _cfg())


def test_record_or_check_single_phase(tmp_path):
  w = str(tmp_path)
  run_record.record_or_check(w, "sft", _cfg(), outputs=("ckpt",))
  os.makedirs(os.path.join(w, "ckpt"))
  with pytest.raises(StaleRunError, match=r"model\.layers 2 -> 3.*--discard_stale"):
    run_record.record_or_check(w, "sft", _cfg(**{"model.layers": 3}), outputs=("ckpt",))


def test_a_diagnostic_band_does_not_make_runs_stale():
  """`rl.routing_outlier_band` picks which tokens get a diagnostic record, not the update: a run
  (or a claims record) made before the field existed, or with another band, stays valid, while
  a field that changes the numbers (`rl.routing_replay`) still counts."""
  from configs import demo as demo_config
  from rstar_jax.config import from_config_dict

  cfg = demo_config.get_config("moe_smoke")
  old = run_record.phase_view(from_config_dict(cfg), ("",))
  cfg.rl.routing_outlier_band = 1.5
  assert run_record.phase_view(from_config_dict(cfg), ("",)) == old
  cfg.rl.routing_replay = "off" if cfg.rl.routing_replay != "off" else "rollout"
  assert "rl.routing_replay" in {
    k for k, _, _ in run_record.diff(old, run_record.phase_view(from_config_dict(cfg), ("",)))
  }


def _write_many(workdir, n):
  for i in range(n):
    run_record._write_record(workdir, "sft", {"i": i, "pid": os.getpid()})


def test_concurrent_writers_of_one_record_never_collide(tmp_path):
  # Both processes of a 2-process run write the same records after a restart; with one shared
  # temporary name the slower writer's os.replace raised FileNotFoundError.
  import multiprocessing as mp

  ctx = mp.get_context("fork")
  procs = [ctx.Process(target=_write_many, args=(str(tmp_path), 300)) for _ in range(3)]
  for p in procs:
    p.start()
  for p in procs:
    p.join(60)
  assert [p.exitcode for p in procs] == [0, 0, 0]
  rec = json.load(open(run_record.record_path(str(tmp_path), "sft")))
  assert rec["i"] == 299
  assert os.stat(run_record.record_path(str(tmp_path), "sft")).st_mode & 0o777 == 0o644
  left = [
    n
    for n in os.listdir(os.path.dirname(run_record.record_path(str(tmp_path), "sft")))
    if n.endswith(".tmp")
  ]
  assert left == []

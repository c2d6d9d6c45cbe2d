"""Launcher edge: a UserError is one absl error line and exit status 2, a bug keeps its
traceback, and bad paths are named before any work starts."""

import logging
import os
import subprocess
import sys

import pytest

from rstar_jax import cli
from rstar_jax.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_user_error_is_one_line_and_exit_2(caplog):
  def main(argv):
    raise UserError("config.rl.group_size: expected an int >= 1,\ngot 0")

  with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as e:
    cli.wrap(main)([])
  assert e.value.code == 2
  assert [r.getMessage() for r in caplog.records] == [
    "config.rl.group_size: expected an int >= 1, got 0"
  ]


def test_bugs_keep_their_traceback():
  def main(argv):
    raise KeyError("a bug")

  with pytest.raises(KeyError):
    cli.wrap(main)([])
  assert cli.wrap(lambda argv: 7)([]) == 7


def test_path_checks_name_the_field(tmp_path):
  f = tmp_path / "afile"
  f.write_text("x")
  with pytest.raises(
    UserError,
    match=r"--workdir: cannot create .*/afile/run.*afile' is a "
    r"file, not a directory",
  ):
    cli.check_workdir(str(f / "run" / "deeper"))
  with pytest.raises(UserError, match=r"--workdir: .*afile' is a file, expected a directory"):
    cli.check_workdir(str(f))
  cli.check_workdir(str(tmp_path / "new" / "run"))  # creatable: fine, not created
  assert not os.path.exists(tmp_path / "new")
  with pytest.raises(
    UserError,
    match=r"config.model.hf_dir: expected an existing directory, "
    r"got '.*/missing' \(not found\)",
  ):
    cli.check_dir(str(tmp_path / "missing"), "config.model.hf_dir")
  with pytest.raises(UserError, match=r"config.model.hf_dir: expected a directory, got .*a file"):
    cli.check_dir(str(f), "config.model.hf_dir")
  cli.check_dir("", "config.model.hf_dir")  # unset field


def _launch(*args, module="train", config="configs/rstar2_tiny_cpu.py"):
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  return subprocess.run(
    [sys.executable, "-m", f"launchers.{module}", f"--config={config}", *args],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )


def _one_line_error(proc, expected: str, key: str) -> None:
  """Exit 2, no traceback, and exactly one stderr line mentioning ``key``: ``expected``."""
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  lines = [ln for ln in proc.stderr.splitlines() if key in ln]
  assert len(lines) == 1 and expected in lines[0], proc.stderr[-3000:]


def test_launcher_reports_bad_paths_in_one_line(tmp_path):
  f = tmp_path / "afile"
  f.write_text("x")
  proc = _launch(f"--workdir={f}/run")
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  lines = [ln for ln in proc.stderr.splitlines() if "--workdir" in ln]
  assert len(lines) == 1 and "is a file, not a directory" in lines[0], proc.stderr[-3000:]
  proc = _launch(f"--workdir={tmp_path}/run", f"--config.model.hf_dir={tmp_path}/nope")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "config.model.hf_dir: expected an existing directory" in proc.stderr
  assert not os.path.exists(tmp_path / "run")  # checked before any work


def test_unknown_override_is_one_line(tmp_path):
  # ml_collections raises these while absl parses the flags (a 55-line traceback before).
  proc = _launch(f"--workdir={tmp_path}/run", "--config.rl.gruop_size=4")
  _one_line_error(
    proc, "config.rl.gruop_size: unknown field; did you mean group_size", "gruop_size"
  )
  proc = _launch(f"--workdir={tmp_path}/run", "--config.rll.group_size=4")
  _one_line_error(proc, "config.rll: unknown field; did you mean rl", "rll")
  assert not os.path.exists(tmp_path / "run")


def test_bad_config_value_is_one_line(tmp_path):
  proc = _launch(f"--workdir={tmp_path}/run", "--config.rl.group_size=0")
  _one_line_error(proc, "config.rl.group_size: expected an int >= 1, got 0", "group_size")
  assert not os.path.exists(tmp_path / "run")


def test_unknown_variant_is_one_line(tmp_path):
  # Before: ':sfT' ran the full RL job.
  proc = _launch(f"--workdir={tmp_path}/run", config="configs/rstar2_tiny_cpu.py:sfT")
  _one_line_error(
    proc,
    "configs/rstar2_tiny_cpu.py: unknown variant 'sfT'; expected one of 'rl', 'sft', 'eval'",
    "sfT",
  )
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize(
  "module,variant,right",
  [
    ("train", ":sft", "launchers.sft"),
    ("sft", "", "launchers.train"),
    ("eval", "", "launchers.train"),
  ],
)
def test_wrong_launcher_is_one_line(tmp_path, module, variant, right):
  extra = [f"--checkpoint_dir={tmp_path}", f"--out={tmp_path}/e.json"] if module == "eval" else []
  proc = _launch(
    f"--workdir={tmp_path}/run",
    *extra,
    module=module,
    config=f"configs/rstar2_tiny_cpu.py{variant}",
  )
  got = "sft" if variant else "rl"
  _one_line_error(proc, f"launchers.{module}: --config is a {got!r} config", "--config is a")
  assert f"run it with {right}" in proc.stderr
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("module,variant,phase", [("train", "", "rl"), ("sft", ":sft", "sft")])
def test_resume_with_a_changed_config_stops(tmp_path, module, variant, phase):
  """A workdir whose run used another config is not resumed: one line naming the change."""
  from configs import rstar2_tiny_cpu
  from rstar_jax import run_record
  from rstar_jax.config import from_config_dict

  old = rstar2_tiny_cpu.get_config(phase)
  old.rl.roc_mode = "random"
  w = tmp_path / "run"
  run_record.record_or_check(str(w), phase, from_config_dict(old, phase), outputs=("ckpt",))
  (w / "ckpt").mkdir()  # the old run's checkpoint
  proc = _launch(f"--workdir={w}", module=module, config=f"configs/rstar2_tiny_cpu.py{variant}")
  _one_line_error(
    proc, 'config changed since they ran: rl.roc_mode "random" -> "paper"', "roc_mode"
  )
  assert "--discard_stale" in proc.stderr and os.listdir(w / "ckpt") == []

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
      "config.rl.group_size: expected an int >= 1, got 0"]


def test_bugs_keep_their_traceback():
  def main(argv):
    raise KeyError("a bug")
  with pytest.raises(KeyError):
    cli.wrap(main)([])
  assert cli.wrap(lambda argv: 7)([]) == 7


def test_path_checks_name_the_field(tmp_path):
  f = tmp_path / "afile"
  f.write_text("x")
  with pytest.raises(UserError, match=r"--workdir: cannot create .*/afile/run.*afile' is a "
                                      r"file, not a directory"):
    cli.check_workdir(str(f / "run" / "deeper"))
  with pytest.raises(UserError, match=r"--workdir: .*afile' is a file, expected a directory"):
    cli.check_workdir(str(f))
  cli.check_workdir(str(tmp_path / "new" / "run"))          # creatable: fine, not created
  assert not os.path.exists(tmp_path / "new")
  with pytest.raises(UserError, match=r"config.model.hf_dir: expected an existing directory, "
                                      r"got '.*/missing' \(not found\)"):
    cli.check_dir(str(tmp_path / "missing"), "config.model.hf_dir")
  with pytest.raises(UserError, match=r"config.model.hf_dir: expected a directory, got .*a file"):
    cli.check_dir(str(f), "config.model.hf_dir")
  cli.check_dir("", "config.model.hf_dir")                 # unset field


def _launch(*args):
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "launchers.train",
                         "--config=configs/rstar2_tiny_cpu.py", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)


def test_launcher_reports_bad_paths_in_one_line(tmp_path):
  f = tmp_path / "afile"
  f.write_text("x")
  proc = _launch(f"--workdir={f}/run")
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  lines = [l for l in proc.stderr.splitlines() if "--workdir" in l]
  assert len(lines) == 1 and "is a file, not a directory" in lines[0], proc.stderr[-3000:]
  proc = _launch(f"--workdir={tmp_path}/run", f"--config.model.hf_dir={tmp_path}/nope")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "config.model.hf_dir: expected an existing directory" in proc.stderr
  assert not os.path.exists(tmp_path / "run")                # checked before any work

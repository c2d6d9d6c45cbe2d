"""scripts/setup.sh installs what the README's claims need (issue 29 row 6): the `hf` extra
(torch, jinja2: an export loads with AutoModelForCausalLM and its chat template renders) in
both the plain and the `test` set-up. The script runs for real in a copy of the repository
whose .venv/bin/python is a stub that records its arguments (nothing is installed)."""

import os
import shutil
import stat
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _stub(path, body):
  path.write_text("#!/usr/bin/env bash\n" + body)
  path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("arg,extras", [("", "hf"), ("test", "hf,test")])
def test_setup_installs_the_hf_extra(tmp_path, arg, extras):
  (tmp_path / "scripts").mkdir()
  shutil.copy(os.path.join(REPO, "scripts", "setup.sh"), tmp_path / "scripts" / "setup.sh")
  venv_bin = tmp_path / ".venv" / "bin"
  venv_bin.mkdir(parents=True)
  log = tmp_path / "calls.log"
  _stub(venv_bin / "python", f'echo "$*" >> {log}\n')
  tools = tmp_path / "tools"  # a bwrap on PATH: the script's apt branch stays off
  tools.mkdir()
  _stub(tools / "bwrap", "exit 0\n")
  env = dict(os.environ, PATH=f"{tools}:{os.environ['PATH']}")
  cmd = ["bash", str(tmp_path / "scripts" / "setup.sh")] + ([arg] if arg else [])
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  installs = [
    l for l in log.read_text().splitlines() if l.startswith("-m pip install") and "-e" in l
  ]
  assert installs == [f"-m pip install -q -e .[{extras}]"], log.read_text()


def test_hf_extra_names_torch_and_jinja2():
  """The extra the script installs holds what transformers needs to load an export."""
  import ast

  tree = ast.parse(open(os.path.join(REPO, "setup.py")).read())
  (call,) = [
    n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup"
  ]
  (extras,) = [k.value for k in call.keywords if k.arg == "extras_require"]
  extras = ast.literal_eval(extras)
  for name in ("hf", "test"):
    names = {r.split("=")[0].split(">")[0] for r in extras[name]}
    assert {"torch", "jinja2"} <= names, (name, extras[name])

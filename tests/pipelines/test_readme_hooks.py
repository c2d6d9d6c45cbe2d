"""The README's research-hook snippets, run as a user would: the Python written to files in the
current folder, the ``python -m launchers.train ...`` lines parsed by the same absl /
ml_collections flags and typed-config conversion as `launchers/train.py` (nothing trains).

  * a custom verifier in the user's own module, named by ``--config.reward.imports``, judging
    out of process (in a worker started before the module's folder was importable);
  * a parquet set with the user's column names;
  * the W&B / sample-rollout flags.
"""

import asyncio
import os
import re
import shlex
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from rstar_jax import cli
from rstar_jax.pipelines import data_sources
from rstar_jax.rewards import math_reward, registry

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
README = os.path.join(REPO, "README.md")


def readme_blocks(marker: str) -> tuple[str, str]:
  """The ```python block after ``<!-- marker -->`` and the ```bash block after it."""
  text = open(README, encoding="utf-8").read()
  m = re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```\s*```bash\n(.*?)```", text, re.S)
  assert m, f"README lost its {marker}"
  return m.group(1), m.group(2)


def readme_command(pattern: str) -> str:
  text = open(README, encoding="utf-8").read()
  cmds = [c for c in re.findall(r"```bash\n(.*?)```", text, re.S) if re.search(pattern, c)]
  assert len(cmds) == 1, f"README: expected one command matching {pattern!r}, got {cmds}"
  return cmds[0]


def launcher_config(command: str):
  """The `RunConfig` launchers.train builds from ``command`` (its flags, `cli.typed_config`
  with the paths checked), the recipe path made absolute since the test runs elsewhere."""
  args = shlex.split(command.replace("\\\n", " "))
  assert args[:3] == ["python", "-m", "launchers.train"], args
  args = [a.replace("--config=configs/", f"--config={REPO}/configs/") for a in args[3:]]
  argv = ["launchers.train", *args]
  fv = flags.FlagValues()
  cfg = config_flags.DEFINE_config_file(
    "config", None, "", flag_values=fv, lock_config=True, sys_argv=argv
  )
  flags.DEFINE_string("workdir", None, "", flag_values=fv)
  fv(argv)
  assert fv.workdir, "the README command must give --workdir (the launcher requires it)"
  return cli.typed_config(cfg.value, "rl", "launchers.train", check_paths=True)


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
  """An empty folder as the cwd, with sys.path, sys.modules and the reward registry restored
  afterwards (the README's names must not collide with other tests' registrations)."""
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", list(sys.path))
  monkeypatch.setattr(registry, "_TABLES", {k: dict(v) for k, v in registry._TABLES.items()})
  monkeypatch.setattr(registry, "_TARGETS", dict(registry._TARGETS))
  monkeypatch.setattr(registry, "_ROOTS", dict(registry._ROOTS))
  yield tmp_path
  sys.modules.pop("my_verifiers", None)


def test_readme_custom_verifier_from_the_launcher_command(user_folder, monkeypatch):
  code, command = readme_blocks("reward-snippet")
  # The process-wide worker pool already runs, started before my_verifiers.py existed: the
  # worker must still import the user's module (the registry sends the folder it came from).
  with math_reward.Verifier(num_workers=1, timeout_s=5.0) as pool:
    pool.verify("1", "1")
    monkeypatch.setattr(math_reward, "_default", pool)
    (user_folder / "my_verifiers.py").write_text(code)
    run = launcher_config(command)
    assert run.reward.imports == ("my_verifiers",) and run.reward.verifier == "mod_1000"
    score = registry.from_config(run)
    # math-verify alone: 2025 != 25; the user's verifier (mod 1000): equal
    assert asyncio.run(score("<answer>\\boxed{2025}</answer>", "25")) == 1.0
    assert asyncio.run(score("<answer>\\boxed{2026}</answer>", "25")) == 0.0
    assert asyncio.run(score("<answer>\\boxed{\\frac{1}{2}}</answer>", "25")) == 0.0
    assert pool.num_errors == 0 and pool.num_timeouts == 0


def test_readme_parquet_set_from_the_launcher_command(user_folder):
  pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install rstar_jax[data])")
  code, command = readme_blocks("parquet-snippet")
  exec(compile(code, "README-parquet-snippet", "exec"), {})
  run = launcher_config(command)
  assert run.data.train_path == "train.parquet" and run.data.question_field == "prompt"
  got = [(p.problem, p.answer) for p in data_sources.train_problems(run)]
  assert got == [("Compute 17 * 23.", "391"), ("Compute 2 ** 10.", "1024")]


def test_readme_wandb_and_samples_flags():
  run = launcher_config(readme_command(r"--config\.log\.wandb=True"))
  assert run.log.wandb and run.log.wandb_mode == "offline"
  assert run.log.wandb_project == "my_project" and run.log.samples_every == 5

"""The package's import layers (docs/architecture.md, pyproject.toml [tool.importlinter]) hold,
and an upward import breaks them with a message naming both modules (what the style gate in
scripts/format_check.sh shows in CI)."""

import os
import shutil
import subprocess
import sys

import importlinter  # noqa: F401  (the test extra installs it; the gate needs it too)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"


def _lint(root: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": root}  # this tree's package, not an installed one
  return subprocess.run(
    [sys.executable, "-c", LINT, "--no-cache", "--no-logo"],
    cwd=root,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )


def test_the_contracts_hold():
  proc = _lint(REPO)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
  assert "0 broken" in proc.stdout


def test_an_upward_import_fails_naming_both_modules(tmp_path):
  for name in ("rstar_jax", "configs", "launchers"):
    shutil.copytree(
      os.path.join(REPO, name), tmp_path / name, ignore=shutil.ignore_patterns("__pycache__")
    )
  shutil.copy(os.path.join(REPO, "pyproject.toml"), tmp_path / "pyproject.toml")
  with open(tmp_path / "rstar_jax" / "models" / "lora.py", "a") as f:
    f.write("\nfrom rstar_jax.learner import steps  # an upward import, on purpose\n")
  proc = _lint(str(tmp_path))
  assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
  assert "rstar_jax.models is not allowed to import rstar_jax.learner" in proc.stdout
  assert "rstar_jax.models.lora -> rstar_jax.learner.steps" in proc.stdout

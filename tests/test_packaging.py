"""What `pip install` puts into site-packages: only `rstar_jax` (no top-level `configs` or
`launchers`), with its version, license, typing marker and Python floor."""

import os
import re
import shutil
import subprocess
import sys
import zipfile

import rstar_jax

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_wheel_installs_only_rstar_jax(tmp_path):
  # Build from a copy so the test leaves no build/ or *.egg-info in the checkout.
  src = tmp_path / "src"
  src.mkdir()
  for name in ("setup.py", "LICENSE", "README.md"):
    shutil.copy(os.path.join(REPO, name), src / name)
  for name in ("rstar_jax", "launchers", "configs"):
    shutil.copytree(
      os.path.join(REPO, name), src / name, ignore=shutil.ignore_patterns("__pycache__")
    )
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "pip",
      "wheel",
      "-q",
      "--no-deps",
      "--no-build-isolation",
      "-w",
      str(tmp_path / "dist"),
      str(src),
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  (wheel,) = (tmp_path / "dist").iterdir()
  names = zipfile.ZipFile(wheel).namelist()
  dist_info = f"rstar_jax-{rstar_jax.__version__}.dist-info"
  assert {n.split("/")[0] for n in names} == {"rstar_jax", dist_info}
  assert "rstar_jax/py.typed" in names
  assert "rstar_jax/tools/sandbox_template.py" in names  # sub-packages are found
  meta = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
  assert re.search(r"^Requires-Python: >=3\.11$", meta, re.M), meta[:2000]
  assert re.search(r"^Version: " + re.escape(rstar_jax.__version__) + "$", meta, re.M)
  license_text = zipfile.ZipFile(wheel).read(f"{dist_info}/licenses/LICENSE").decode()
  assert "Apache License" in license_text and "END OF TERMS AND CONDITIONS" in license_text


def test_version_is_a_release_string():
  assert re.fullmatch(r"\d+\.\d+\.\d+", rstar_jax.__version__)

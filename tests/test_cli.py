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
  env = dict(os.environ, XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""), JAX_PLATFORMS="cpu")
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
    proc, 'config changed since they ran: rl.roc_mode "random" -> "paper"', "rl.roc_mode"
  )  # "rl.roc_mode": the start-up line names "roc_mode 'paper'" too
  assert "--discard_stale" in proc.stderr and os.listdir(w / "ckpt") == []


# --- issue 29 rows 3, 7, 8, 11: settings that say what they do, one-line failures ----------


@pytest.mark.parametrize(
  "module,config",
  [
    ("train", "configs/rstar2_qwen3_14b.py"),
    ("sft", "configs/rstar2_qwen3_14b.py:sft"),
    ("eval", "configs/aster_qwen3_4b.py:eval"),
    ("demo", "configs/demo.py:smoke"),
    ("plan", "configs/rstar2_qwen3_14b.py"),
    ("export_hf", "configs/rstar2_tiny_cpu.py"),
  ],
)
def test_describe_config_on_every_launcher(module, config):
  """Field, value (after overrides), default and doc; exit 0 with no other flag given
  (before: no way to list the fields)."""
  proc = _launch("--config.rl.group_size=5", "--describe_config", module=module, config=config)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  row = [ln for ln in lines if ln.startswith("rl.group_size = ")]
  assert len(row) == 1 and row[0].startswith("rl.group_size = 5 *  [default 16]")
  assert row[0].endswith("G rollouts kept per prompt (rStar2-Agent: 16).")
  assert any(ln.startswith("rollout.server_timeout_s = 600.0  [default 600.0]") for ln in lines)


def test_describe_config_shows_what_the_protocol_replaces():
  proc = _launch(
    "--config.eval.k=2",
    "--describe_config",
    module="eval",
    config="configs/rstar2_qwen3_14b.py:eval",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "# eval.max_turns: 30 -> 5 (eval.protocol='released')" in proc.stdout
  assert "# eval.k: keeping the given 2 (eval.protocol='released' sets 16)" in proc.stdout


def test_list_field_override_from_the_command_line():
  """Before: ml_collections refused any override of rollout.sglang_urls."""
  proc = _launch(
    "--config.rollout.sglang_urls=http://a:1,http://b:2",
    "--describe_config",
    config="configs/aster_qwen3_4b.py",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'rollout.sglang_urls = ["http://a:1", "http://b:2"] *' in proc.stdout
  proc = _launch(
    """--config.rollout.sglang_urls=['http://c:3']""",
    "--describe_config",
    config="configs/aster_qwen3_4b.py",
  )
  assert 'rollout.sglang_urls = ["http://c:3"] *' in proc.stdout, proc.stderr[-3000:]
  assert cli.parse_list("x", " a , b,") == ["a", "b"] and cli.parse_list("x", "") == []
  with pytest.raises(UserError, match=r"--config.x: expected a list of strings"):
    cli.parse_list("x", "[1, 2]")


def test_help_exits_0_without_importing_jax():
  """Before: exit 1 after 4-5 s (jax imported at module level)."""
  for module in ("train", "sft", "eval", "demo"):
    proc = subprocess.run(
      [sys.executable, "-m", f"launchers.{module}", "--help"],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--workdir" in proc.stdout + proc.stderr
  # jax is not imported for --help (what made it slow); the wall time is not asserted (a
  # loaded CI machine), the import is.
  code = (
    "import sys, runpy; sys.argv=['x','--help']\n"
    "try:\n  runpy.run_module('launchers.train', run_name='__main__')\n"
    "except SystemExit as e:\n  print('exit', e.code, 'jax' in sys.modules)"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
  ).stdout
  assert out.strip().splitlines()[-1] == "exit 0 False"


def test_missing_config_file_is_one_line(tmp_path):
  proc = _launch(f"--workdir={tmp_path}/run", config="configs/no_such_recipe.py:debug")
  _one_line_error(proc, "--config: no such recipe file 'configs/no_such_recipe.py'", "--config")


def test_required_flags_are_one_line():
  proc = _launch(config="configs/rstar2_tiny_cpu.py")
  _one_line_error(proc, "--workdir: required", "--workdir")


def test_mesh_that_does_not_fit_is_one_line(tmp_path):
  """Before: a ValueError traceback from the mesh builder after the run started."""
  from configs import rstar2_tiny_cpu
  from rstar_jax.config import from_config_dict

  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.mesh.num_devices, cfg.mesh.fsdp, cfg.mesh.tensor = 0, -1, 1
  cli.check_mesh(from_config_dict(cfg, check_inputs=False), 4)
  cfg.mesh.fsdp, cfg.mesh.tensor = 3, 1
  with pytest.raises(UserError, match=r"config.mesh: axes .* need 3 devices, this run has 4"):
    cli.check_mesh(from_config_dict(cfg, check_inputs=False), 4)
  cfg.mesh.fsdp, cfg.mesh.tensor = -1, 3
  with pytest.raises(UserError, match=r"need a multiple of 3 devices, this run has 4"):
    cli.check_mesh(from_config_dict(cfg, check_inputs=False), 4)
  cfg.mesh.num_devices = 8
  with pytest.raises(UserError, match=r"config.mesh.num_devices: expected <= the 4 devices"):
    cli.check_mesh(from_config_dict(cfg, check_inputs=False), 4)
  proc = _launch(
    f"--workdir={tmp_path}/run", "--config.mesh.tensor=2", "--config.mesh.num_devices=0"
  )
  _one_line_error(proc, "config.mesh: axes", "config.mesh")


def test_empty_checkpoint_dir_is_one_line(tmp_path):
  (tmp_path / "ckpt").mkdir()
  with pytest.raises(UserError, match=r"--checkpoint_dir: no checkpoint in .*ckpt"):
    cli.check_checkpoint_dir(str(tmp_path / "ckpt"), "--checkpoint_dir")
  (tmp_path / "ckpt" / "7").mkdir()
  cli.check_checkpoint_dir(str(tmp_path / "ckpt"), "--checkpoint_dir")
  (tmp_path / "empty").mkdir()
  proc = _launch(
    f"--checkpoint_dir={tmp_path}/empty",
    f"--out={tmp_path}/e.json",
    module="eval",
    config="configs/rstar2_tiny_cpu.py:eval",
  )
  _one_line_error(proc, "--checkpoint_dir: no checkpoint in", "--checkpoint_dir")


def test_kv_cache_that_cannot_fit_is_one_line_before_allocation(tmp_path):
  """Before: eval.protocol='released' on a CPU asked the sampler for 71 GB and died in XLA."""
  from configs import rstar2_tiny_cpu
  from rstar_jax.config import from_config_dict
  from rstar_jax.planning.kv_cache import kv_cache_bytes

  cfg = rstar2_tiny_cpu.get_config("rl")
  run = from_config_dict(cfg, check_inputs=False)
  mc = run.model.qwen3_config()
  need, max_len = kv_cache_bytes(run, mc)
  per_pos = 2 * mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim * 4
  assert need == run.rollout.max_batch * max_len * per_pos and max_len & (max_len - 1) == 0
  cli.check_kv_cache(run, mc, need)  # exactly fits
  with pytest.raises(UserError, match=r"KV cache needs .* GiB .*lower rollout.max_batch"):
    cli.check_kv_cache(run, mc, need - 1)
  proc = _launch(
    f"--workdir={tmp_path}/run",
    "--config.rollout.max_batch=100000000",
    "--config.mesh.num_devices=1",
  )
  _one_line_error(proc, "KV cache needs", "KV cache")
  assert not os.path.exists(tmp_path / "run" / "ckpt")


def test_strict_protocol_conflict_is_one_line_at_start(tmp_path):
  (tmp_path / "aime.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n')
  proc = _launch(
    f"--config.eval.path={tmp_path}/aime.jsonl",
    f"--checkpoint_dir={tmp_path}",
    f"--out={tmp_path}/e.json",
    "--config.eval.protocol_strict=true",
    "--config.eval.k=2",
    module="eval",
    config="configs/rstar2_qwen3_14b.py:eval",
  )
  _one_line_error(proc, "config.eval.k: expected 16 (eval.protocol='released'", "eval.k")


def test_policy_loss_registered_by_an_imported_module(tmp_path):
  """Issue 29 row 10: the README's --config.rl.policy_loss=positive_only failed from a launcher
  ("expected one of ['grpo_roc']"); --config.imports names the module that registers it."""
  (tmp_path / "my_losses.py").write_text(
    "import jax.numpy as jnp\n"
    "from rstar_jax.rl import losses, registry\n\n\n"
    '@registry.register("policy_loss", "positive_only")\n'
    "def positive_only(logp, old_logp, adv, loss_mask, **kw):\n"
    "  return losses.policy_loss(logp, old_logp, jnp.maximum(adv, 0.0), loss_mask, **kw)\n"
  )
  env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}", JAX_PLATFORMS="cpu")

  def launch(*args):
    return subprocess.run(
      [sys.executable, "-m", "launchers.train", "--config=configs/rstar2_tiny_cpu.py", *args],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
    )

  proc = launch("--config.rl.policy_loss=positive_only", "--describe_config")
  _one_line_error(proc, "config.rl.policy_loss: expected one of", "policy_loss")
  proc = launch(
    "--config.imports=my_losses", "--config.rl.policy_loss=positive_only", "--describe_config"
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "imports = ['my_losses']" in proc.stdout
  assert 'rl.policy_loss = "positive_only" *' in proc.stdout
  proc = launch("--config.imports=my_lossez", "--describe_config")
  _one_line_error(proc, "cannot import module 'my_lossez'", "my_lossez")

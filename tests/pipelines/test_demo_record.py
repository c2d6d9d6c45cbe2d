"""The demo's phases against their run records, on a fake workdir (no phase is run): the same
config reuses everything, a changed roc_mode stops with one line naming it (the SFT side is
still valid), --discard_stale deletes only the RL side, and run_demo checks before any work."""

import os

import pytest

from configs import demo as demo_config
from rstar_jax import run_record
from rstar_jax.config import from_config_dict
from rstar_jax.pipelines import demo, demo_record
from rstar_jax.run_record import StaleRunError

OUTPUTS = {
  "coldstart.jsonl": "file",
  "coldstart_stats.json": "file",
  "tokenizer": "dir",
  "sft": "dir",
  "eval_sft.json": "file",
  "rl": "dir",
  "eval_rl.json": "file",
  "summary.json": "file",
  "demo_state.json": "file",
}


def _typed(cfg):
  return from_config_dict(cfg, "rl")  # what launchers.demo hands run_demo


def _fake_finished_run(cfg, w):
  demo_record.check_demo(_typed(cfg), w)  # what run_demo does first
  for name, kind in OUTPUTS.items():
    p = os.path.join(w, name)
    if kind == "dir":
      os.makedirs(p, exist_ok=True)
    else:
      open(p, "w").write("{}")


def test_same_config_reuses_every_phase(tmp_path):
  w = str(tmp_path)
  _fake_finished_run(demo_config.get_config("smoke"), w)
  cfg = demo_config.get_config("smoke")
  cfg.train.progress_every_s = 1.0  # does not change results
  cfg.demo.rl_max_steps = 1
  views = demo_record.check_demo(_typed(cfg), w)
  assert set(OUTPUTS) <= set(os.listdir(w))
  assert views["eval_rl"]["rl.roc_mode"] == "paper"
  assert "rl.roc_mode" not in views["sft"] and "sft.epochs" in views["sft"]


def test_changed_roc_mode_stops_with_one_line(tmp_path):
  w = str(tmp_path)
  _fake_finished_run(demo_config.get_config("smoke"), w)
  cfg = demo_config.get_config("smoke")
  cfg.rl.roc_mode = "random"
  with pytest.raises(StaleRunError) as e:
    demo_record.check_demo(_typed(cfg), w)
  msg = str(e.value)
  assert "\n" not in msg
  assert msg.startswith(f"{w}: phases rl, eval_rl, report hold results of a different run")
  assert 'rl.roc_mode "paper" -> "random"' in msg
  assert "use a new --workdir, or --discard_stale" in msg
  # The case: SFT epochs changed too, so the SFT side is stale as well.
  cfg.sft.epochs = 2.5  # the smoke variant's is 80.0
  with pytest.raises(
    StaleRunError,
    match=r"phases sft, eval_sft, rl, eval_rl, report .*"
    r"sft\.epochs 80\.0 -> 2\.5",
  ):
    demo_record.check_demo(_typed(cfg), w)
  # run_demo itself refuses before any work (no phase output is touched or rewritten).
  before = {n: os.path.getmtime(os.path.join(w, n)) for n in OUTPUTS}
  with pytest.raises(StaleRunError):
    demo.run_demo(_typed(cfg), w)
  assert before == {n: os.path.getmtime(os.path.join(w, n)) for n in OUTPUTS}


def test_discard_stale_reruns_only_the_rl_side(tmp_path):
  w = str(tmp_path)
  _fake_finished_run(demo_config.get_config("smoke"), w)
  open(os.path.join(w, "sft", "marker"), "w").write("sft model")
  cfg = demo_config.get_config("smoke")
  cfg.rl.roc_mode = "random"
  demo_record.check_demo(_typed(cfg), w, discard_stale=True)
  left = set(os.listdir(w))
  assert {"rl", "eval_rl.json", "summary.json", "demo_state.json"}.isdisjoint(left)
  assert {"coldstart.jsonl", "tokenizer", "sft", "eval_sft.json"} <= left
  assert open(os.path.join(w, "sft", "marker")).read() == "sft model"
  assert run_record.read_record(w, "rl")["rl.roc_mode"] == "random"
  demo_record.check_demo(_typed(cfg), w)  # now consistent: no error


def test_reused_sft_must_match(tmp_path):
  src, dst = str(tmp_path / "paper"), str(tmp_path / "grpo")
  _fake_finished_run(demo_config.get_config("smoke"), src)
  cfg = demo_config.get_config("smoke")
  cfg.rl.roc_mode = "random"
  cfg.demo.reuse_sft_from = src
  os.makedirs(dst)
  for name in ("coldstart.jsonl", "eval_sft.json"):  # what demo._reuse copies
    open(os.path.join(dst, name), "w").write("{}")
  for name in ("tokenizer", "sft"):
    os.makedirs(os.path.join(dst, name))
  demo_record.check_demo(_typed(cfg), dst)  # the ablation: same SFT side, new RL
  cfg.sft.epochs = 3.0  # claims another SFT than the one copied
  dst2 = str(tmp_path / "grpo2")
  os.makedirs(os.path.join(dst2, "sft"))
  with pytest.raises(StaleRunError, match=r"sft\.epochs 80\.0 -> 3\.0"):
    demo_record.check_demo(_typed(cfg), dst2)


@pytest.mark.parametrize(
  "change,stale",
  [
    (lambda c: setattr(c.rollout, "system_prompt", "Be brief."), "data, tokenizer, sft"),
    (lambda c: setattr(c.tool, "show_time", True), "data, tokenizer, sft"),
    (lambda c: setattr(c.rollout, "with_tools", True), "tokenizer, sft"),
  ],
)
def test_prompt_and_tool_rendering_make_the_data_side_stale(tmp_path, change, stale):
  """The typed config's homes of the chat rendering (rollout.system_prompt / with_tools,
  tool.show_time) are in the records of the phases that bake them in."""
  w = str(tmp_path)
  _fake_finished_run(demo_config.get_config("smoke"), w)
  cfg = demo_config.get_config("smoke")
  change(cfg)
  with pytest.raises(StaleRunError, match=f"phases {stale}"):
    demo_record.check_demo(_typed(cfg), w)

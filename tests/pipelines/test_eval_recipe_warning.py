"""Issue 43 row 12: `launchers.eval` of an ASTER checkpoint under the rStar2 eval config ran
silently, scoring the model on prompts it never saw. Now a warning names both chat formats
and recipes, from the run record the training launcher wrote beside the checkpoint."""

import os

from configs import aster_qwen3_4b, rstar2_qwen3_14b
from rstar_jax import run_record
from rstar_jax.config import from_config_dict
from rstar_jax.pipelines import evaluation


def _aster_run(tmp_path):
  """An ASTER SFT run directory as `launchers.sft` leaves it: its record and a checkpoint."""
  run = from_config_dict(aster_qwen3_4b.get_config("sft_debug"), check_inputs=False)
  w = tmp_path / "aster_sft"
  run_record.record_or_check(str(w), "sft", run, outputs=("ckpt", "hf"))
  (w / "ckpt" / "2").mkdir(parents=True)
  (w / "hf").mkdir()
  return w


def test_eval_of_an_aster_checkpoint_under_the_rstar2_config_warns(tmp_path):
  w = _aster_run(tmp_path)
  rstar2 = from_config_dict(rstar2_qwen3_14b.get_config("eval_debug"), check_inputs=False)
  line = evaluation.recipe_mismatch_warning(rstar2, str(w / "ckpt"))
  assert line is not None and "\n" not in line
  assert line.startswith(
    "launchers.eval: the model was trained with chat format 'qwen3_thinking' (ASTER"
  )
  assert os.path.join(str(w), "resolved_config", "sft.json") in line
  assert f"this eval config renders {rstar2.rollout.chat_format!r} (rStar2-Agent" in line
  assert line.endswith("--config.rollout.chat_format=qwen3_thinking")


def test_the_exported_model_of_that_run_warns_too_and_its_own_recipe_does_not(tmp_path):
  w = _aster_run(tmp_path)
  cfg = rstar2_qwen3_14b.get_config("eval_debug")
  cfg.model.hf_dir = str(w / "hf")
  assert "'qwen3_thinking'" in evaluation.recipe_mismatch_warning(
    from_config_dict(cfg, check_inputs=False)
  )
  aster = aster_qwen3_4b.get_config("eval_debug")
  aster.model.hf_dir = str(w / "hf")
  run = from_config_dict(aster, check_inputs=False)
  assert evaluation.recipe_mismatch_warning(run, str(w / "ckpt")) is None
  # a model from elsewhere (no run record): nothing to compare
  assert evaluation.recipe_mismatch_warning(run, str(tmp_path / "elsewhere" / "ckpt")) is None

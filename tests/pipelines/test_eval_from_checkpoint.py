"""`evaluation.run_eval` with ``checkpoint_dir`` (``launchers.eval --checkpoint_dir``, which the
long tier's launcher chain runs on an RL run's ``ckpt/``): the policy evaluated is the latest
checkpoint's, restored into a learner of the run's structure. The sampling itself is stood in
for (evaluate's own tests run it), so this takes seconds."""

import contextlib

import jax
import numpy as np

from configs import demo as demo_config
from rstar_jax.config import from_config_dict
from rstar_jax.data.problems import Problem
from rstar_jax.learner.checkpoint import Checkpointer
from rstar_jax.pipelines import evaluation, wiring


def test_run_eval_evaluates_the_latest_checkpoint(tmp_path, monkeypatch):
  run = from_config_dict(demo_config.get_config("smoke"))
  learner = wiring.build_learner_for_restore(run)
  first = learner.state
  later = first.replace(step=first.step + 2, params=jax.tree.map(lambda x: x * 1.5, first.params))
  with Checkpointer(tmp_path / "ckpt") as ck:
    ck.save(first)
    ck.save(later)  # the latest: the one evaluated

  seen = {}

  @contextlib.asynccontextmanager
  async def runner(run_, model_config, params, tokenizer, engine=None):
    seen["params"] = params
    yield object()

  async def evaluate(runner_, problems, settings, **kw):
    return {"metrics": {"accuracy": 0.5, "k": 1}, "per_problem": []}

  monkeypatch.setattr(wiring, "open_runner", runner)
  monkeypatch.setattr(evaluation, "evaluate", evaluate)
  monkeypatch.setattr(wiring, "eval_settings", lambda *a, **k: None)
  monkeypatch.setattr(evaluation.data_sources, "check_vocab", lambda *a: None)
  rep = evaluation.run_eval(
    run,
    str(tmp_path / "eval.json"),
    problems=[Problem("Compute 2 * 3.", "6")],
    tokenizer=object(),
    checkpoint_dir=str(tmp_path / "ckpt"),
  )
  assert rep["checkpoint_dir"] == str(tmp_path / "ckpt")
  got = seen["params"]["embed_tokens"]["embedding"]
  np.testing.assert_allclose(
    np.asarray(got), np.asarray(later.params["embed_tokens"]["embedding"]), rtol=1e-6
  )

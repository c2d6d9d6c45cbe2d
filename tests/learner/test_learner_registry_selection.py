"""A user-registered policy loss selected from a recipe is the one the learner's rl_step calls
(the README "Configuration" snippet, run verbatim)."""

import os
import re

import numpy as np
from learner_toy_model import toy_apply, toy_batch, toy_params

from rstar_jax.learner import optim, steps
from rstar_jax.learner.train_state import TrainState
from rstar_jax.rl import registry

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def _snippet() -> str:
  text = open(README, encoding="utf-8").read()
  return re.search(r"<!-- registry-snippet -->\n```python\n(.*?)```", text, re.S).group(1)


def test_readme_loss_is_registered_selected_and_called():
  ns = {}
  exec(compile(_snippet(), "README-registry-snippet", "exec"), ns)
  assert registry.get("policy_loss", "positive_only") is ns["positive_only"]
  exec(compile(_snippet(), "README-registry-snippet", "exec"), ns)  # autoreload: no error
  calls = []
  inner = ns["positive_only"]

  def spy(*args, **kw):
    calls.append(kw["eps_high"])
    return inner(*args, **kw)

  spy.__module__, spy.__qualname__ = inner.__module__, inner.__qualname__
  registry.register("policy_loss", "positive_only")(spy)  # same name + qualname: a re-import
  try:
    sc = ns["step_config"]
    assert sc.policy_loss == "positive_only" and sc.eps_high == ns["run"].rl.eps_high
    tx = optim.make_optimizer(optim.OptimConfig(lr=1e-2))
    state = TrainState.create(toy_params(), tx, 0)
    batch = toy_batch()
    batch["advantages"] = -np.abs(batch["advantages"]) - 1.0  # every advantage negative
    _, m = steps.rl_step(state, batch, apply_fn=toy_apply, config=sc)
    assert calls, "the registered loss was not called"
    # max(adv, 0) = 0 everywhere: the selected loss (not grpo_roc) gives a zero loss.
    assert float(m["loss"]) == 0.0
    _, m_default = steps.rl_step(
      TrainState.create(toy_params(), tx, 0), batch, apply_fn=toy_apply, config=steps.StepConfig()
    )
    assert float(m_default["loss"]) != 0.0
  finally:
    registry.register("policy_loss", "positive_only")(inner)

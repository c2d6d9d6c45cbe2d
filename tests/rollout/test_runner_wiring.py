"""Issue 28: one settings type from the config to the agent loop, an `AgentRunner` that knows no
run config, and the import arrows between `rollout/`, `pipelines/` and the config."""

import ast
import asyncio
import dataclasses
import importlib
import os

import pytest
from rollout_helpers import FakePool, ScriptedEngine, make_tokenizer

import rstar_jax
from rstar_jax.config import RunConfig, StageConfig, schema
from rstar_jax.data.problems import Problem
from rstar_jax.pipelines import wiring
from rstar_jax.rollout.agent_loop import RolloutSettings

PKG = os.path.dirname(rstar_jax.__file__)


def _run(**sections) -> RunConfig:
  return RunConfig(mode="rl", **sections)


def test_rollout_settings_carry_every_section_into_one_object():
  run = _run(
    rollout=schema.RolloutConfig(
      temperature=0.7, top_p=0.9, top_k=5, max_parallel_calls=2, max_tool_calls=7
    ),
    tool=schema.ToolConfig(
      timeout_s=2.5, max_response_chars=333, stateful=True, truncation="released"
    ),
  )
  stage = StageConfig(name="s", steps=1, response_budget=96, max_turns=4)
  s = wiring.rollout_settings(run, stage)
  assert isinstance(s, RolloutSettings)
  assert (s.response_budget, s.max_turns) == (96, 4)  # the stage's, not the section's
  assert (s.temperature, s.top_p, s.top_k) == (0.7, 0.9, 5)
  assert (s.max_parallel_calls, s.max_tool_calls) == (2, 7)
  assert (s.tool_timeout_s, s.max_tool_response_chars, s.stateful_tool) == (2.5, 333, True)
  assert (s.tool_truncation, s.chat_format, s.stop_token_ids) == ("released", "rstar2", ())
  # Without a stage: the rollout section's own budget and turns.
  base = wiring.rollout_settings(run)
  assert (base.response_budget, base.max_turns) == (8192, 10)
  # Evaluation changes budget, turns and sampling only.
  e = wiring.eval_settings(run)
  assert (
    dataclasses.replace(
      e,
      response_budget=base.response_budget,
      max_turns=base.max_turns,
      temperature=base.temperature,
      top_p=base.top_p,
    )
    == base
  )


def test_the_loop_gets_the_settings_the_runner_was_given():
  tok = make_tokenizer()
  seen = []

  class Spy(ScriptedEngine):
    async def generate(self, reqs):
      seen.extend(r.sampling for r in reqs)
      return await super().generate(reqs)

  run = _run(rollout=schema.RolloutConfig(temperature=0.5, top_k=3))
  eng = Spy(tok, lambda r, t: "so <answer>\\boxed{4}</answer>")
  runner = wiring.make_runner(run, eng, FakePool(), tok)
  settings = wiring.rollout_settings(
    run, StageConfig(name="s", steps=1, response_budget=64, max_turns=2), tokenizer=tok
  )
  asyncio.run(runner.rollout(Problem("2+2?", "4"), seed=3, settings=settings))
  (sp,) = seen
  assert (sp.temperature, sp.top_k, sp.max_new_tokens) == (0.5, 3, 64)
  assert sp.stop_token_ids == settings.stop_token_ids != ()


def test_runner_refuses_settings_of_another_chat_format():
  tok = make_tokenizer()
  runner = wiring.make_runner(_run(), ScriptedEngine(tok, lambda r, t: "x"), FakePool(), tok)
  bad = RolloutSettings(response_budget=8, max_turns=1, chat_format="rstar2_released")
  with pytest.raises(ValueError, match="settings.chat_format 'rstar2_released' differs"):
    asyncio.run(runner.rollout(Problem("q", "1"), seed=0, settings=bad))


def _imports(path: str) -> set[str]:
  tree = ast.parse(open(path).read())
  out = set()
  for n in ast.walk(tree):
    if isinstance(n, ast.ImportFrom) and n.module:
      out.add(n.module)
      out.update(f"{n.module}.{a.name}" for a in n.names)
    elif isinstance(n, ast.Import):
      out.update(a.name for a in n.names)
  return out


def test_rollout_imports_neither_pipelines_nor_the_run_config():
  """`rollout/` sits below `pipelines/`: no arrow back up, and the runner takes no RunConfig."""
  bad = []
  for root, _, files in os.walk(os.path.join(PKG, "rollout")):
    for f in files:
      if f.endswith(".py"):
        mods = _imports(os.path.join(root, f))
        bad += [(f, m) for m in mods if m.startswith(("rstar_jax.pipelines", "rstar_jax.config"))]
  assert bad == []


def test_one_optim_config_and_no_runtime_mix():
  from rstar_jax.learner import optim

  assert optim.OptimConfig is schema.OptimConfig
  # The old mixed set-up module is gone: each job lives in the module named for it.
  with pytest.raises(ModuleNotFoundError):
    importlib.import_module("rstar_jax.pipelines.runtime")

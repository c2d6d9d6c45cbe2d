"""Reward / verifier registry: built-ins, a user's module named by the config (the README
snippet), the verifier running out of process with its timeout, and the runner hook."""

import asyncio
import os
import re
import sys
import textwrap
import time
import types

import pytest

from configs import rstar2_tiny_cpu
from rstar_jax.config import ConfigError, from_config_dict
from rstar_jax.pipelines import wiring
from rstar_jax.rewards import math_reward, registry
from rstar_jax.user_modules import ImportsError, import_user_modules, module_names

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")

# The user's module: the README's verifier plus ones that expose where and how they run.
EXTRA = textwrap.dedent("""
    import os
    import time

    @registry.register_verifier("not_my_pid")
    def not_my_pid(pred, gold):
      return str(os.getpid()) != gold  # gold = the test process's pid

    @registry.register_verifier("sleepy")
    def sleepy(pred, gold):
      time.sleep(60)
      return True

    @registry.register_verifier("broken")
    def broken(pred, gold):
      raise RuntimeError("no luck")

    @registry.register_reward("length_bonus")
    def length_bonus(response_text, gold, ctx):
      return 0.5 * ctx.verify(gold, gold) + 0.25 * (len(response_text) < 10)
""")


def readme_snippet() -> str:
  text = open(README, encoding="utf-8").read()
  m = re.search(r"<!-- reward-snippet -->\s*```python\n(.*?)```", text, re.S)
  assert m, "README lost its reward snippet"
  return m.group(1)


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
  """The README snippet (+ EXTRA) written as `my_verifiers_t.py` on sys.path."""
  d = tmp_path_factory.mktemp("usermod")
  (d / "my_verifiers_t.py").write_text(readme_snippet() + EXTRA)
  sys.path.insert(0, str(d))
  yield "my_verifiers_t"
  sys.path.remove(str(d))


@pytest.fixture(scope="module")
def pool(user_module):
  # started after the module's folder is on sys.path: the worker inherits the import path
  with math_reward.Verifier(num_workers=1, timeout_s=1.0) as v:
    yield v


def score(name, text, gold, pool, verifier="math_verify", answer_mode="answer_tag", timeout_s=5.0):
  ctx = registry.RewardContext(
    verifier=verifier, timeout_s=timeout_s, answer_mode=answer_mode, pool=pool
  )
  return asyncio.run(registry.scorer(name, ctx)(text, gold))


def test_builtins_are_registered_and_unknown_names_list_the_known():
  assert {"math", "released"} <= set(registry.names("reward"))
  assert {"math_verify", "math_verify_text"} <= set(registry.names("verifier"))
  with pytest.raises(KeyError, match=r"no reward named 'nope'; known: \['math', 'released'"):
    registry.get("reward", "nope")


def test_registration_rules():
  def fn(pred, gold):
    return True

  with pytest.raises(ValueError, match="module-level function of an importable module"):
    registry.register_verifier("local")(fn)  # a nested function: the worker cannot import it
  ns = {"__name__": "__main__"}
  exec("def v(p, g):\n  return True", ns)
  with pytest.raises(ValueError, match="__main__:v"):
    registry.register_verifier("main_fn")(ns["v"])
  registry.register_reward("reg_rule_t")(fn)
  registry.register_reward("reg_rule_t")(fn)  # the same function again: a reload, silent
  with pytest.raises(ValueError, match="already registered"):
    registry.register_reward("reg_rule_t")(lambda *a: 0.0)
  registry.register_reward("reg_rule_t", override=True)(lambda *a: 0.0)


def test_module_names_and_import_errors():
  assert module_names(" a, b.c ,,a") == ["a", "b.c"]
  assert module_names(["x"]) == ["x"] and module_names(None) == []
  with pytest.raises(ImportsError, match=r"^config.reward.imports: cannot import module 'no_such"):
    import_user_modules("no_such_module_t", field="reward.imports")


def test_builtin_math_reward_is_the_old_score(pool):
  text = "work</reason><answer>\\boxed{\\frac{1}{2}}</answer>"
  assert score("math", text, "0.5", pool) == 1.0
  assert score("math", text, "0.25", pool) == 0.0
  # answer_mode still selects the extraction: outside <answer> only "anywhere" finds it
  assert score("math", "\\boxed{7}", "7", pool) == 0.0
  assert score("math", "\\boxed{7}", "7", pool, answer_mode="anywhere") == 1.0
  assert score("released", "so the answer is 7.", "7", pool) == 1.0


def test_readme_verifier_from_the_config_runs_out_of_process(user_module, pool):
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.reward.imports = user_module  # the launcher's --config.reward.imports=...
  cfg.reward.verifier = "mod_1000"
  run = from_config_dict(cfg)
  assert run.reward.imports == (user_module,) and run.reward.verifier == "mod_1000"
  assert registry.verifier_target("mod_1000") == f"{user_module}:mod_1000"
  text = "<answer>\\boxed{2025}</answer>"
  # math-verify says 2025 != 25; the user's verifier (mod 1000) says equal
  assert score("math", text, "25", pool) == 0.0
  assert score("math", text, "25", pool, verifier="mod_1000") == 1.0
  assert score("math", text, "26", pool, verifier="mod_1000") == 0.0
  # it ran in the worker, not here
  assert score("math", "<answer>\\boxed{1}</answer>", str(os.getpid()), pool, "not_my_pid") == 1.0
  assert pool.num_errors == 0


def test_verifier_timeout_and_exception_score_zero_and_the_worker_recovers(pool):
  text = "<answer>\\boxed{3}</answer>"
  t0 = time.monotonic()
  assert score("math", text, "3", pool, verifier="sleepy", timeout_s=1.0) == 0.0
  assert time.monotonic() - t0 < 20 and pool.num_timeouts == 1  # killed, not waited for
  before = pool.num_errors
  assert score("math", text, "3", pool, verifier="broken") == 0.0
  assert pool.num_errors == before + 1
  assert score("math", text, "1003", pool, verifier="mod_1000") == 1.0  # a fresh worker


def test_config_rejects_unknown_names_and_released_with_a_custom_verifier(user_module):
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.reward.name = "nope"
  with pytest.raises(ConfigError, match=r"^config.reward.name: expected a registered reward"):
    from_config_dict(cfg)
  cfg.reward.name, cfg.reward.verifier = "math", "mod_1000"  # not imported yet in a fresh run
  cfg.reward.imports = "no_such_module_t"
  with pytest.raises(ConfigError, match=r"^config.reward.imports: cannot import module"):
    from_config_dict(cfg)
  cfg.reward.imports = user_module
  cfg.reward.name = "released"
  with pytest.raises(ConfigError, match=r"^config.reward.verifier: the 'released' reward judges"):
    from_config_dict(cfg)


def test_agent_runner_scores_with_the_configured_reward(user_module):
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.reward.imports = user_module
  cfg.reward.name = "length_bonus"
  run = from_config_dict(cfg)

  # from_config reads the tokenizer's pad and <|im_end|> ids only
  class Tok:
    pad_token_id, unk_token_id = 0, None

    def convert_tokens_to_ids(self, token):
      return 1

    def __len__(self):
      return 2

  tok = Tok()
  runner = wiring.make_runner(run, None, None, tok)
  trajs = [types.SimpleNamespace(response_text=t) for t in ("short", "a much longer response")]
  # the integer fast path answers ctx.verify("4", "4") without a worker
  assert asyncio.run(runner.rewards(trajs, ["4", "4"])) == [0.75, 0.5]


def test_a_missing_empty_or_oversized_answer_is_false_without_asking_the_verifier():
  """A configured verifier other than math_verify (which has its own fast path): no worker call
  for an answer that cannot match (issue 38 item 4: only the long tier's docs walk reached it)."""
  asked = []

  class Pool:  # stands in for the worker pool: every answer it is asked about matches
    def verify(self, pred, gold, timeout_s, kind, root):
      asked.append((pred, gold, kind))
      return True

  ctx = registry.RewardContext(verifier="math_verify_text", pool=Pool())
  for pred in (None, "", "  \n", "9" * (math_reward.MAX_ANSWER_CHARS + 1)):
    assert ctx.verify(pred, "9") is False
  assert asked == []
  assert ctx.verify("9", "9") is True
  assert asked == [("9", "9", registry.verifier_target("math_verify_text"))]

"""benchmarks/chaos.py (issue 41, item 5): the seeded kill schedule, the lost / twice-trained
accounting, the weights comparison, the availability checks, the scripted tool-call turn of the
stand-ins, the chaos thread killing a real stand-in mid-turn (and a tool node) and starting it
again on its port, and (long) whole small runs of the benchmark: a tool node killed (sync), the
learner killed (async)."""

import asyncio
import importlib.util
import json
import os
import threading
import time

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load():
  spec = importlib.util.spec_from_file_location(
    "chaos_bench", os.path.join(REPO, "benchmarks", "chaos.py")
  )
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


chaos = _load()


def test_kill_schedule_is_seeded_one_kill_per_step_in_the_window():
  a = chaos.kill_schedule(3, 3, 4, 3, 0.5)
  assert a == chaos.kill_schedule(3, 3, 4, 3, 0.5)
  assert a != chaos.kill_schedule(4, 3, 4, 3, 0.5)
  steps = [s for s, _, _ in a]
  assert steps == sorted(steps) and len(set(steps)) == 3 and set(steps) <= {1, 2, 3, 4}
  assert all(0 <= d < 0.5 and 0 <= i < 3 for _, d, i in a)
  assert len(chaos.kill_schedule(0, 6, 2, 2, 0.1)) == 6  # more kills than steps: repeats


def test_account_counts_lost_and_twice_trained():
  ref = ["a", "b", "c", "d"]
  ok = chaos.account(ref, ["b", "a", "d", "c"], [2, 2], 2)
  assert ok["trained_twice"] == 0 and ok["not_trained_vs_reference"] == 0
  assert ok["missing_from_groups"] == 0 and ok["extra_vs_reference"] == 0
  bad = chaos.account(ref, ["a", "a", "b", "d"], [2, 1], 2)
  assert bad["trained_twice"] == 1 and bad["not_trained_vs_reference"] == 1
  assert bad["missing_from_groups"] == 1
  assert chaos.trajectory_key("p", 1) != chaos.trajectory_key("p", 2)
  assert chaos.trajectory_key("p", 1) == chaos.trajectory_key("p", 1)


def test_compare_weights():
  a = [np.arange(4, dtype=np.float32), np.ones((2, 2), np.float32)]
  same = chaos.compare_weights(a, [x.copy() for x in a])
  assert same == {"equal_bytes": True, "max_abs_diff": 0.0, "rel_l2": 0.0}
  b = [a[0] + np.float32(1e-3), a[1]]
  d = chaos.compare_weights(a, b)
  assert not d["equal_bytes"] and abs(d["max_abs_diff"] - 1e-3) < 1e-6 and d["rel_l2"] > 0


def test_availability_checks_name_what_is_missing():
  for got in (chaos.tool_node_support(), chaos.learner_supervision_support()):
    assert isinstance(got["available"], bool)
    assert (got["why"] is None) == got["available"]


@pytest.mark.slow  # three stand-in process starts (~10-60 s on a loaded 2-core host)
def test_chaos_thread_kills_a_busy_stand_in_and_restarts_it_on_its_port(tmp_path):
  from rstar_jax.rollout.testing.processes import StandInProcess

  servers = [
    StandInProcess(str(tmp_path), f"s{i}", token_delay_s=0.01, seeded=True).start()
    for i in range(2)
  ]
  try:
    for s in servers:
      s.wait_ready()
    ports = [s.port for s in servers]
    started = {1: threading.Event()}
    monkey = chaos.Chaos(servers, [(1, 0.0, 0)], started, down_s=0.1)
    monkey.start()

    import json
    import urllib.request

    def long_request():  # a turn running on server 0 when the kill lands
      body = json.dumps(
        {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 100000}}
      ).encode()
      req = urllib.request.Request(
        servers[0].url + "/generate", body, {"Content-Type": "application/json"}
      )
      try:
        urllib.request.urlopen(req, timeout=120).read()
      except OSError:
        pass

    t = threading.Thread(target=long_request, daemon=True)
    t.start()
    while servers[0].running_requests() < 1:
      time.sleep(0.01)
    started[1].set()
    monkey.join(300)
    t.join(30)
    (ev,) = monkey.events
    assert ev["target"] == 0 and ev["busy_requests"] >= 1 and ev["back_after_s"] >= 0.1
    assert servers[0].alive() and servers[0].port == ports[0]  # back on the same port
    assert servers[0].running_requests() == 0 and servers[1].alive()
  finally:
    for s in servers:
      s.stop()


def test_a_scripted_stand_in_calls_the_tool_once_per_trajectory():
  """--script-ids: the scripted turn comes first while the input does not hold it; once it
  does (the next turn's prompt), the seeded model's tokens follow; same on every server."""
  from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer

  script = (5, 6, 7, 2)

  async def main():
    async with MockSGLangServer(seeded=True, script_ids=script) as a:
      async with MockSGLangServer(seeded=True, script_ids=script) as b:
        import aiohttp

        async with aiohttp.ClientSession() as s:

          async def gen(url, ids, n=6, seed=1):
            sp = {"max_new_tokens": n, "stop_token_ids": [2], "sampling_seed": seed}
            async with s.post(
              url + "/generate", json={"input_ids": ids, "sampling_params": sp}
            ) as r:
              return await r.json()

          first = await gen(a.url, [1, 9])
          again = await gen(b.url, [1, 9])
          later = await gen(a.url, [1, 9, *script, 4, 4], n=5)
          return first, again, later

  first, again, later = asyncio.run(main())
  assert (
    first["output_ids"] == [5, 6, 7, 2] and first["meta_info"]["finish_reason"]["type"] == "stop"
  )
  assert again["output_ids"] == first["output_ids"]
  assert later["output_ids"][:3] != [5, 6, 7] and len(later["output_ids"]) >= 1


def _run_chaos(flags, timeout):
  """`benchmarks/chaos.py --json` with ``flags`` in a subprocess; its report (exactly one JSON
  document on stdout). Without the test run's compilation cache: the benchmark compares the bytes
  of runs of which the first compiles and the next read the cache, and two undisturbed async
  runs then differed (2 of 2 tries; equal without the cache)."""
  import subprocess
  import sys

  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  p = subprocess.run(
    [sys.executable, os.path.join(REPO, "benchmarks", "chaos.py"), "--json", *flags],
    cwd=REPO,
    env=dict(env, PYTHONPATH=REPO),
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert p.returncode == 0, p.stderr[-3000:]
  return json.loads(p.stdout)


@pytest.mark.long
@pytest.mark.slow  # two RL runs of one step each with stand-ins and tool nodes (~2-3 min busy)
def test_one_small_run_kills_a_tool_node_and_loses_nothing():
  flags = ["--modes=sync", "--kinds=tool_node", "--steps=1", "--kills=1"]
  flags += ["--servers=2", "--tool_nodes=2", "--prompts=1", "--group=2", "--tool_sleep_s=1.0"]
  report = _run_chaos(flags, timeout=900)
  m = report["modes"]["sync"]["tool_node"]
  assert m["kills"] == 1 and m["restarts"] == 1
  assert m["kill_events"][0]["busy_requests"] >= 1  # killed with calls running on it
  assert m["tool_client"]["node_failures"] >= 1 and m["tool_client"]["resent_to_other_node"] >= 1
  assert m["trajectories_lost"] == 0 and m["trajectories_trained_twice"] == 0
  assert m["tool_calls_failed"] == 0 and m["final_weights_match"]
  assert report["learner_kills"]["injected"] is False


@pytest.mark.long
@pytest.mark.slow  # three supervised launcher runs with stand-ins and a tool node (~4-6 min busy)
def test_one_small_async_run_kills_the_learner_and_loses_nothing():
  """The async learner path end to end: two undisturbed supervised runs and one whose learner
  process is killed with SIGKILL; the ledgers and final checkpoints are compared."""
  flags = ["--modes=async", "--kinds=learner", "--steps=3", "--kills=1"]
  flags += ["--servers=2", "--tool_nodes=1", "--prompts=1", "--group=2"]
  m = _run_chaos(flags, timeout=1500)["modes"]["async"]["learner"]
  assert m["kills"] == 1 and m["restarts"] == 1 and m["supervisor_state"] == "done"
  assert m["steps_completed"] == 3 and m["ledger"]["steps_ok"]
  assert m["ledger"]["groups"] == 3 and m["trajectories_trained"] == 6
  assert m["trajectories_lost"] == 0 and m["trajectories_trained_twice"] == 0
  assert m["steps_with_other_groups_than_reference"] == 0
  assert m["undisturbed_spread"]["equal_bytes"] and m["final_state"]["equal_bytes"]


def test_the_learner_runs_config_is_valid_and_names_the_registered_reward(tmp_path):
  """`get_config` (the supervised launcher's config for learner kills): the fleet's URLs, its
  tokenizer and problems, the benchmark's reward (registered when imported as a module), a
  checkpoint every step."""
  import argparse

  from rstar_jax.config import from_config_dict
  from rstar_jax.rewards import registry

  importlib.import_module("benchmarks.chaos")  # as reward.imports does: registers the reward
  args = argparse.Namespace(seed=3, prompts=1, group=2, steps=2, budget=100)
  settings = tmp_path / "settings.json"
  settings.write_text(
    json.dumps(
      {
        "mode": "sync",
        "args": vars(args),
        "urls": ["http://127.0.0.1:9"],
        "tool_urls": ["http://127.0.0.1:8"],
        "staging": str(tmp_path / "staging"),
        "tokenizer_dir": str(tmp_path / "tok"),
        "problems_path": str(tmp_path / "p.jsonl"),
      }
    )
  )
  run = from_config_dict(chaos.get_config(str(settings)))
  assert run.rollout.sglang_urls == ("http://127.0.0.1:9",) and run.tool.urls == (
    "http://127.0.0.1:8",
  )
  assert run.model.tokenizer_dir == str(tmp_path / "tok") and run.train.checkpoint_every == 1
  assert run.reward.name == chaos.REWARD_NAME and run.rl.max_staleness == 0
  assert run.log.trajectory_ledger  # lost / twice are counted from <workdir>/trained.jsonl
  assert not run.tool.stateful and not run.tool.show_time
  fn = registry.get(registry.REWARD, chaos.REWARD_NAME)
  assert {fn("a", "1"), fn("b", "1")} == {0.0, 1.0}  # "a" = 97 (odd), "b" = 98 (even)

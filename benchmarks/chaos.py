"""Chaos benchmark (issue 41, item 5): the RL smoke recipe, synchronous and asynchronous, while
rollout servers, tool nodes and learner processes are killed at seeded random times.

Setup: the tiny CPU recipe (`configs/rstar2_tiny_cpu.py`, RL) with ``rollout.engine="sglang"``
against ``--servers`` stand-in SGLang servers and ``tool.backend="http"`` against
``--tool_nodes`` code-pool services (`launchers.code_pool_server`), each its own process on
127.0.0.1 (`rstar_jax.rollout.testing.processes`). The stand-ins are ``--seeded`` (a turn's
tokens depend only on its input ids and sampling seed, whichever server makes them) and
scripted: a trajectory's first turn is a tool call (``--tool_code``, a stateless call that
sleeps ``--tool_sleep_s`` so kills land while calls run), then seeded tokens. Tool responses
are shown without their time (``tool.show_time=False``), so a turn's input ids do not depend
on which node ran the call. Rewards are a fixed rule on the response ids (about half the
samples "correct"), so every step makes a real update. Per mode it runs:

  1. an undisturbed run (the reference; in async mode two, to measure the run-to-run spread);
  2. per failure kind, the same run while a chaos thread kills one of that kind with SIGKILL
     ``--kills`` times, each in a seeded random RL step at a seeded random delay after that
     step's rollouts began, and starts it again on the same port ``--down_s`` later (plus its
     own start-up time); one of each kind always stays up. ``rollout_server``: a stand-in is
     killed mid-turn (the first with a request running) and comes back with weight version 0;
     ``tool_node``: a code-pool service and its sandboxes are killed (process group).

Reported per mode and kind: steps completed, trajectories lost (sync: trained by the reference
but not by the chaos run; both modes: trained groups missing samples), trajectories trained
twice (a trajectory id, (problem, sampling seed), in more than one trained batch), tool calls
that failed (the policy saw a failure), failures injected, the engine's failovers /
re-generated turns / rejoins and the tool client's node failures / re-sent calls / rejoins,
the rollout time each failure cost ((chaos - reference rollout seconds) / failures; whole-run
wall times are given too but hold jit compiles; a busy machine makes all of them noisy), and
whether the final weights equal the reference's: sync byte for byte; async within the
documented tolerance (relative L2 distance at most 2x that of two undisturbed async runs, or
1e-6): which groups an asynchronous step trains can depend on finish order (with
``rl.max_staleness`` >= 2, or a stale group issued again), so undisturbed async runs may differ.
Here (k = 1) each step takes the groups issued while the step before trained, handed over in
issue order, and two undisturbed async runs were byte-equal (2026-12-07), so equal bytes is what
a run should show.

``learner`` (both modes): the run is ``launchers.train --max_restarts=N`` (issue 41 item 4's
supervisor; this file is its config, `get_config`, and registers its reward), with a checkpoint
every step and the trajectory ledger on (``log.trajectory_ledger``: ``<workdir>/trained.jsonl``
names the (problem, group seed, sample) of every trajectory each step trained; a resume drops the
rows of steps whose updates died with the killed process, so the file holds exactly what the
final checkpoint's lineage trained). A learner process (its pid from
``<workdir>/supervisor.json``) is killed with SIGKILL at a seeded random point of a seeded
random step and the supervisor restarts it from the last checkpoint; in async mode the groups
in flight at that checkpoint are generated again from their recorded problems and seeds.
Compared with an undisturbed supervised run (async: two, for the spread): the ledgers
(trajectories lost = trained by the reference but not by the chaos run, plus issue numbers no
step took; trained twice = an id in more than one step), the final checkpoint's params and
optimizer state (sync: equal bytes; async: equal bytes expected, since with
``rl.max_staleness=1`` each step takes exactly the groups issued during the step before and
the source hands them over in issue order, and the seeded stand-ins' tokens do not depend on
the weights; accepted within the tolerance above), restarts, the steps redone, and the wall
time each kill cost (restart, jax import, checkpoint restore, jit compile, the redone step).

    nice -n 10 python benchmarks/chaos.py --json --steps 3 --kills 3 > rollout_and_tools.json
    nice -n 10 python benchmarks/chaos.py --json --kinds learner --steps 4 --kills 3 \
        > learner.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import signal
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/json_stdout.py
import json_stdout  # noqa: E402


def say(msg: str) -> None:
  print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- pure parts


def kill_schedule(seed: int, n_kills: int, steps: int, n_servers: int, window_s: float):
  """[(step, delay_s, server index)]: ``n_kills`` kills, each in a different RL step (when
  ``n_kills <= steps``), ``delay_s`` (uniform in [0, window_s)) after that step's rollouts
  began, of a random server; seeded and sorted by step."""
  rng = random.Random(seed)
  chosen = sorted(rng.sample(range(1, steps + 1), min(n_kills, steps)))
  chosen += [rng.randrange(1, steps + 1) for _ in range(n_kills - len(chosen))]
  return sorted(
    (step, round(rng.uniform(0.0, window_s), 3), rng.randrange(n_servers)) for step in chosen
  )


def trajectory_key(problem: str, seed: int) -> str:
  """A trajectory's id: its problem and sampling seed (a retried or re-generated trajectory
  keeps it)."""
  return hashlib.blake2b(f"{seed}\x00{problem}".encode(), digest_size=8).hexdigest()


def account(reference: list[str], consumed: list[str], group_sizes: list[int], n: int) -> dict:
  """Lost and twice-trained counts: ``reference`` / ``consumed`` are the trajectory ids each
  run trained (in order), ``group_sizes`` the sample count of every group the chaos run
  trained, ``n`` the group size."""
  seen: dict[str, int] = {}
  for k in consumed:
    seen[k] = seen.get(k, 0) + 1
  twice = sum(c - 1 for c in seen.values() if c > 1)
  short = sum(max(0, n - g) for g in group_sizes)
  return {
    "trained": len(consumed),
    "trained_twice": twice,
    "missing_from_groups": short,
    "not_trained_vs_reference": len(set(reference) - set(seen)),
    "extra_vs_reference": len(set(seen) - set(reference)),
  }


def compare_weights(a: list[np.ndarray], b: list[np.ndarray]) -> dict:
  """Byte equality, max |a - b| and relative L2 distance of two param lists."""
  equal = len(a) == len(b) and all(
    x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in zip(a, b)
  )
  diff = float(np.sqrt(sum(float(np.sum((x.astype(np.float64) - y) ** 2)) for x, y in zip(a, b))))
  norm = float(np.sqrt(sum(float(np.sum(x.astype(np.float64) ** 2)) for x in a)))
  mx = max((float(np.max(np.abs(x.astype(np.float64) - y))) for x, y in zip(a, b)), default=0.0)
  return {"equal_bytes": equal, "max_abs_diff": mx, "rel_l2": diff / norm if norm else diff}


# ----------------------------------------------------------------------------- availability


def tool_node_support() -> dict:
  """Issue 41 item 3: several code-pool service URLs with failover in the HTTP client."""
  path = os.path.join(ROOT, "rstar_jax", "tools", "client.py")
  try:
    src = open(path, encoding="utf-8").read()
  except OSError:
    src = ""
  ok = "session_lost" in src
  return {
    "available": ok,
    "why": None
    if ok
    else "the multi-URL code-pool client (issue 41 item 3, session_lost) is not on this branch",
  }


def learner_supervision_support() -> dict:
  """Issue 41 item 4: the launchers' ``--max_restarts`` supervisor."""
  found = []
  for d in ("launchers", os.path.join("rstar_jax", "pipelines")):
    for name in sorted(os.listdir(os.path.join(ROOT, d))):
      if name.endswith(".py"):
        with open(os.path.join(ROOT, d, name), encoding="utf-8") as f:
          if "max_restarts" in f.read():
            found.append(os.path.join(d, name))
  return {
    "available": bool(found),
    "where": found,
    "why": None if found else "no --max_restarts supervisor (issue 41 item 4) on this branch",
  }


# ----------------------------------------------------------------------------- runs


class Chaos(threading.Thread):
  """Kills processes per ``plan`` [(step, delay_s, index)] (SIGKILL, during that step's
  rollouts) and starts each again on its port ``down_s`` later. ``targets``: the processes of
  one kind (`StandInProcess`: killed mid-turn when one has a request running; `ToolNodeProcess`:
  killed with its sandboxes, the first with a call running as the tool client counts them)."""

  def __init__(self, targets, plan, rollout_started, down_s: float, busy=None):
    super().__init__(daemon=True)
    self.targets, self.plan, self.started = targets, plan, rollout_started
    # busy(i): requests target i runs now (-1: unknown); default: what the process reports.
    self.busy = busy or (lambda i: self.targets[i].running_requests())
    self.down_s = down_s
    self.events: list[dict] = []
    self.stop_flag = threading.Event()
    self.restarting: set[int] = set()  # started again but not ready yet: not "up"

  def run(self):
    restarts = []
    for step, delay, idx in self.plan:
      while not self.started[step].wait(0.05):
        if self.stop_flag.is_set():
          break
      if self.stop_flag.is_set() or self.stop_flag.wait(delay):
        break
      # The scheduled one, or the next one alive (one still restarting is skipped); at least
      # one always stays up.
      n = len(self.targets)
      alive = [i for i in range(n) if self.targets[i].alive() and i not in self.restarting]
      if len(alive) < 2:
        say(f"step {step}: kill skipped, only {len(alive)} up")
        continue
      order = sorted(alive, key=lambda i: (i - idx) % n)
      # Mid-turn where the process reports its running requests (stand-ins): the first of them
      # (in that order) with one running, waiting up to 2 s for one (the asynchronous producer
      # may be between groups).
      end = time.monotonic() + 2.0
      while True:
        busy_now = {i: self.busy(i) for i in order}
        hit = [i for i in order if busy_now[i] > 0]
        if hit or time.monotonic() > end or self.stop_flag.is_set():
          break
        if all(b < 0 for b in busy_now.values()):  # not reported: kill the scheduled one
          break
        time.sleep(0.005)
      idx = hit[0] if hit else order[0]
      p = self.targets[idx]
      busy = busy_now[idx]
      p.kill9()
      ev = {"step": step, "after_rollout_start_s": delay, "target": idx}
      if busy >= 0:
        ev["busy_requests"] = busy
      self.events.append(ev)
      say(
        f"step {step}: killed {type(p).__name__} {idx} (-9)"
        + (f", {busy} running" if busy >= 0 else "")
      )
      self.restarting.add(idx)
      t = threading.Thread(target=self._restart, args=(idx, p, ev, time.monotonic()), daemon=True)
      t.start()
      restarts.append(t)
    for t in restarts:
      t.join(600)

  def _restart(self, idx, p, ev, t_kill):
    time.sleep(self.down_s)
    p.start(port=p.port)
    try:
      p.wait_ready()
      ev["back_after_s"] = round(time.monotonic() - t_kill, 2)
    finally:
      self.restarting.discard(idx)


def make_config(mode: str, args, urls, tool_urls, staging: str):
  from configs import rstar2_tiny_cpu

  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.mesh.num_devices = 1
  cfg.train.seed = args.seed
  cfg.train.batch_prompts = args.prompts
  cfg.train.eval_every = 0
  cfg.rl.group_size, cfg.rl.oversample = args.group, 1
  cfg.rl.drop_zero_variance = False
  cfg.rl.max_staleness = 0 if mode == "sync" else 1
  cfg.rollout.engine = "sglang"
  cfg.rollout.sglang_urls = list(urls)
  cfg.rollout.staging_dir = staging
  cfg.rollout.health_interval_s = 0.2
  cfg.rollout.health_timeout_s = 2.0
  cfg.rollout.max_server_failures = 2
  cfg.rollout.server_timeout_s = 120.0
  cfg.tool.backend = "http"
  cfg.tool.urls = list(tool_urls)
  cfg.tool.stateful = False  # stateless calls: a killed node's calls are re-sent elsewhere
  cfg.tool.show_time = False  # the response text (and so the next turn) is node-independent
  cfg.tool.timeout_s = 30.0
  cfg.stages = [
    dict(
      name="chaos",
      steps=args.steps,
      response_budget=args.budget,
      max_turns=2,
      data="full",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
    )
  ]
  return cfg


def tool_call_ids(tok, code: str) -> list[int]:
  """The scripted first turn: one tool call running ``code``, ended by <|im_end|>."""
  from rstar_jax.tokenization import chat_format

  text = "I will run code." + chat_format.format_tool_call(code)
  return tok.encode(text, add_special_tokens=False) + [chat_format.stop_token_id(tok)]


def run_once(mode: str, args, fleet, work: str, kind: str | None = None, plan=None) -> dict:
  """One RL run against the fleet (``kind`` / ``plan``: the kills to inject)."""
  import jax

  from rstar_jax.config import from_config_dict
  from rstar_jax.pipelines import rl_loop, wiring
  from rstar_jax.pipelines.metrics_log import read_jsonl_metrics
  from rstar_jax.rollout.agent_runner import AgentRunner

  servers, nodes = fleet["rollout_server"], fleet["tool_node"]
  cfg = make_config(
    mode, args, [s.url for s in servers], [n.url for n in nodes], os.path.join(work, "staging")
  )
  run = from_config_dict(cfg)
  learner = wiring.build_learner(run)

  class KeyedRunner(AgentRunner):
    async def rollout(self, problem, *, seed, settings):
      t = await super().rollout(problem, seed=seed, settings=settings)
      t.chaos_key = trajectory_key(problem.problem, seed)
      return t

  async def rule_rewards(trajs, answers):  # about half the samples "correct": real updates
    return [float(sum(t.response_ids) % 2) for t in trajs]

  consumed: list[str] = []
  group_sizes: list[int] = []
  tool_statuses: dict[str, int] = {}
  started = {k: threading.Event() for k in range(1, args.steps + 1)}

  class RecordingLoop(rl_loop.RLLoop):
    async def rollout(self, stage):
      started[self.pos.rl_step + 1].set()
      return await super().rollout(stage)

    def select(self, ro, scores):
      sel = super().select(ro, scores)
      for g in ro.groups:
        group_sizes.append(len({t.chaos_key for t in g}))
      for t in sel.trajectories:
        consumed.append(t.chaos_key)
        for c in t.tool_calls:
          tool_statuses[c.status] = tool_statuses.get(c.status, 0) + 1
      return sel

  async def main():
    async with wiring.open_runner(
      run, learner.model_config, None, fleet["tokenizer"], runner_cls=KeyedRunner
    ) as runner:
      runner.rewards = rule_rewards
      engine, pool = runner.engine, runner.pool
      # Calls in flight per tool node, as the client sends them (instrumentation only: the
      # chaos thread kills a node while it runs calls).
      in_flight = [0] * len(nodes)
      post_once = pool._post_once

      async def counted(node, entries):
        in_flight[node] += len(entries)
        try:
          return await post_once(node, entries)
        finally:
          in_flight[node] -= len(entries)

      pool._post_once = counted
      loop = RecordingLoop(
        run, learner, runner, os.path.join(work, "run"), problems=fleet["problems"]
      )
      chaos = None
      t0 = time.monotonic()
      if plan:
        busy = (lambda i: in_flight[i]) if kind == "tool_node" else None
        chaos = Chaos(fleet[kind], plan, started, args.down_s, busy)
        chaos.start()
      try:
        await loop.run()
      finally:
        wall = time.monotonic() - t0
        if chaos is not None:
          chaos.stop_flag.set()
          chaos.join(300)
        loop.ckpt.close()
      return loop, engine, dict(pool.stats), wall, (chaos.events if chaos else [])

  loop, engine, tool_stats, wall, events = asyncio.run(main())
  recs = read_jsonl_metrics(os.path.join(work, "run", "metrics.jsonl"))
  params = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(learner.state.params))]
  return {
    "steps": loop.pos.rl_step,
    "wall_s": wall,
    "consumed": consumed,
    "group_sizes": group_sizes,
    "tool_statuses": tool_statuses,
    "params": params,
    "kills": events,
    "engine": {
      "failovers": int(engine.fleet_stats["failovers"]),
      "regenerated_turns": int(engine.fleet_stats["regenerated_turns"]),
      "rejoins": int(engine.fleet_stats["rejoins"]),
    },
    "tool_client": {
      k: int(tool_stats.get(k, 0))
      for k in ("node_failures", "resent_to_other_node", "sessions_lost", "nodes_rejoined")
    },
    "logged_steps": [int(r["step"]) for r in recs],
    "rollout_s": float(sum(r["time_rollout_s"] for r in recs)),
  }


def start_fleet(args, work: str) -> dict:
  """The tokenizer, the problems, the stand-ins (scripted to call the tool once) and the tool
  nodes, all started; ``stop_fleet`` ends them."""
  from rstar_jax.config import from_config_dict
  from rstar_jax.data import synthetic_tasks
  from rstar_jax.pipelines import data_sources
  from rstar_jax.rollout.testing.processes import StandInProcess, ToolNodeProcess

  problems = synthetic_tasks.generate(args.seed, args.problems, families=["mul"])
  unused = ["http://127.0.0.1:1"]  # only the tokenizer settings are read from this config
  run = from_config_dict(make_config("sync", args, unused, unused, work))
  tok = data_sources.ensure_tokenizer(
    run, os.path.join(args.tmp, "tok"), data_sources.tokenizer_corpus(problems)
  )
  code = f"import time\ntime.sleep({args.tool_sleep_s})\nprint(6 * 7)"
  script = ",".join(str(i) for i in tool_call_ids(tok, code))
  problems_path = os.path.join(args.tmp, "problems.jsonl")
  with open(problems_path, "w", encoding="utf-8") as f:
    for p in problems:
      f.write(json.dumps({"problem": p.problem, "answer": p.answer}) + "\n")
  fleet = {
    "tokenizer": tok,
    "tokenizer_dir": os.path.join(args.tmp, "tok", "tokenizer"),
    "problems": problems,
    "problems_path": problems_path,
    "rollout_server": [],
    "tool_node": [],
  }
  try:
    for i in range(args.servers):
      fleet["rollout_server"].append(
        StandInProcess(
          work,
          f"s{i}",
          token_delay_s=args.token_delay_s,
          vocab_size=1024,
          seeded=True,
          script_ids=script,
        ).start()
      )
    for _ in range(args.tool_nodes):
      fleet["tool_node"].append(ToolNodeProcess(num_workers=4, num_templates=1).start())
    for p in fleet["rollout_server"] + fleet["tool_node"]:
      p.wait_ready()
  except BaseException:
    stop_fleet(fleet)
    raise
  return fleet


def stop_fleet(fleet: dict) -> None:
  for p in fleet["rollout_server"] + fleet["tool_node"]:
    p.stop()


def summarize(mode: str, args, ref: dict, chaos: dict, spread: dict | None) -> dict:
  acc = account(ref["consumed"], chaos["consumed"], chaos["group_sizes"], args.group)
  weights = compare_weights(ref["params"], chaos["params"])
  n_fail = len(chaos["kills"])
  lost = acc["missing_from_groups"] + (acc["not_trained_vs_reference"] if mode == "sync" else 0)
  failed_calls = sum(k for s, k in chaos["tool_statuses"].items() if s != "ok")
  out = {
    "steps_expected": args.steps,
    "steps_completed": chaos["steps"],
    "reference_wall_s": round(ref["wall_s"], 2),
    "chaos_wall_s": round(chaos["wall_s"], 2),
    "kills": n_fail,
    "kill_events": chaos["kills"],
    "restarts": sum("back_after_s" in k for k in chaos["kills"]),
    "engine": chaos["engine"],
    "tool_client": chaos["tool_client"],
    "tool_call_statuses": chaos["tool_statuses"],
    "reference_tool_call_statuses": ref["tool_statuses"],
    "tool_calls_failed": failed_calls,
    "reference_rollout_s": round(ref["rollout_s"], 2),
    "chaos_rollout_s": round(chaos["rollout_s"], 2),
    # Rollout phases only: the whole-run wall time also holds jit compiles, cached after the
    # first run in this process.
    "rollout_s_per_failure": round((chaos["rollout_s"] - ref["rollout_s"]) / n_fail, 2)
    if n_fail
    else None,
    "trajectories_trained": acc["trained"],
    "trajectories_lost": lost,
    "trajectories_trained_twice": acc["trained_twice"],
    "trained_set_equals_reference": acc["not_trained_vs_reference"] == 0
    and acc["extra_vs_reference"] == 0,
    "final_weights": weights,
  }
  if mode == "sync":
    out["final_weights_match"] = weights["equal_bytes"]
    out["weights_criterion"] = "equal bytes"
  else:
    tol = max(2.0 * spread["rel_l2"], 1e-6)
    out["final_weights_match"] = weights["rel_l2"] <= tol
    out["weights_criterion"] = f"rel_l2 <= max(2 x undisturbed run-to-run rel_l2, 1e-6) = {tol:.3g}"
  return out


def bench_mode(mode: str, args, kinds: list[str]) -> dict:
  work = tempfile.mkdtemp(prefix=f"chaos_{mode}_", dir=args.tmp)
  fleet = start_fleet(args, work)
  out: dict = {}
  try:
    in_process = [k for k in kinds if k != "learner"]
    ref = spread = None
    if in_process:
      say(f"{mode}: undisturbed reference run")
      ref = run_once(mode, args, fleet, os.path.join(work, "ref"))
      if mode == "async":
        say(f"{mode}: second undisturbed run (run-to-run spread)")
        ref2 = run_once(mode, args, fleet, os.path.join(work, "ref2"))
        spread = compare_weights(ref["params"], ref2["params"])
        out["undisturbed_spread"] = spread
      out["reference"] = {
        "steps_completed": ref["steps"],
        "wall_s": round(ref["wall_s"], 2),
        "rollout_s": round(ref["rollout_s"], 2),
        "trajectories_trained": len(ref["consumed"]),
        "tool_call_statuses": ref["tool_statuses"],
      }
      # Within the first part of a step's rollouts (the reference's mean rollout phase).
      window = 0.5 * ref["rollout_s"] / max(1, ref["steps"])
    for j, kind in enumerate(kinds):
      if kind == "learner":
        out[kind] = bench_learner(mode, args, fleet, work, args.seed + 10 * j)
        m = out[kind]
        say(
          f"{mode} learner: {m['steps_completed']}/{m['steps_expected']} steps, {m['kills']} "
          f"kills, {m['restarts']} restarts, lost {m['trajectories_lost']}, twice "
          f"{m['trajectories_trained_twice']}, weights match {m['final_weights_match']} "
          f"({m['final_state']})"
        )
        continue
      plan = kill_schedule(
        args.seed + 10 * j + (0 if mode == "sync" else 1),
        args.kills,
        args.steps,
        len(fleet[kind]),
        window,
      )
      say(f"{mode}: {kind} kills (step, s after its rollouts began, index): {plan}")
      chaos = run_once(mode, args, fleet, os.path.join(work, kind), kind, plan)
      out[kind] = summarize(mode, args, ref, chaos, spread)
      m = out[kind]
      say(
        f"{mode} {kind}: {m['steps_completed']}/{m['steps_expected']} steps, {m['kills']} kills, "
        f"lost {m['trajectories_lost']}, twice {m['trajectories_trained_twice']}, failed "
        f"tool calls {m['tool_calls_failed']}, weights match {m['final_weights_match']}"
      )
  finally:
    stop_fleet(fleet)
  return out


KINDS = ("rollout_server", "tool_node", "learner")


# ----------------------------------------------------------------------------- learner kills
#
# The learner runs as `launchers.train --max_restarts=N` (the supervisor of issue 41 item 4)
# with this file as its config (`get_config`, settings from a JSON file) and this module's
# reward; a thread kills a learner process (pid from <workdir>/supervisor.json) with SIGKILL.

REWARD_NAME = "chaos_parity"


def _register_reward():
  from rstar_jax.rewards import registry

  def chaos_parity(response_text: str, gold: str, ctx=None) -> float:
    """About half the samples "correct" (a fixed rule on the response): real updates."""
    return float(sum(response_text.encode("utf-8")) % 2)

  registry.register_reward(REWARD_NAME, override=True)(chaos_parity)


if __name__ != "__main__":  # imported by a launcher (reward.imports): register the reward
  _register_reward()


def get_config(arg: str):
  """The launcher's config (``--config=benchmarks/chaos.py:<settings.json>``): `make_config`
  with the fleet's URLs, its tokenizer and problems, this module's reward, a checkpoint every
  step."""
  with open(arg, encoding="utf-8") as f:
    d = json.load(f)
  cfg = make_config(
    d["mode"], argparse.Namespace(**d["args"]), d["urls"], d["tool_urls"], d["staging"]
  )
  cfg.model.tokenizer_dir = d["tokenizer_dir"]
  cfg.data.train_path = d["problems_path"]
  cfg.data.synthetic = None
  cfg.reward.imports = "benchmarks.chaos"
  cfg.reward.name = REWARD_NAME
  cfg.train.checkpoint_every = 1
  cfg.log.trajectory_ledger = True  # <workdir>/trained.jsonl: the trained trajectories' ids
  cfg.log.samples_every = 0
  return cfg


def _read_json(path: str):
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _metric_rows(workdir: str) -> list[dict]:
  rows = []
  try:
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
      for line in f:
        try:
          rows.append(json.loads(line))
        except ValueError:
          pass  # a line cut by the kill
  except OSError:
    pass
  return rows


class LearnerChaos(threading.Thread):
  """Kills a learner process of a supervised run per ``plan`` [(step, delay_s, _)]: ``delay_s``
  after the run logged step - 1 (step 1: after the learner process started), in the attempt
  the previous kill started."""

  def __init__(self, workdir: str, plan):
    super().__init__(daemon=True)
    self.workdir, self.plan = workdir, plan
    self.events: list[dict] = []
    self.stop_flag = threading.Event()

  def _attempt(self):
    st = _read_json(os.path.join(self.workdir, "supervisor.json")) or {}
    att = (st.get("attempts") or [None])[-1]
    return st, att

  def run(self):
    for k, (step, delay, _) in enumerate(self.plan):
      while not self.stop_flag.is_set():  # the attempt this kill belongs to is running ...
        st, att = self._attempt()
        if att and att.get("attempt") == k and att.get("pids") and st.get("state") == "running":
          rows = [r for r in _metric_rows(self.workdir) if r.get("restarts") == k]
          if step == 1 or any(int(r.get("step", 0)) >= step - 1 for r in rows):
            break  # ... and is in step `step`
        if st.get("state") in ("done", "failed", "interrupted"):
          return
        time.sleep(0.05)
      if self.stop_flag.wait(delay):
        return
      st, att = self._attempt()
      if not att or att.get("attempt") != k or st.get("state") != "running":
        continue
      pid = int(att["pids"][0])
      rows = _metric_rows(self.workdir)
      logged = max((int(r.get("step", 0)) for r in rows), default=0)
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        continue
      t = time.monotonic()
      say(f"step {step}: killed learner process {pid} (-9); last logged step {logged}")
      ev = {"step": step, "after_step_start_s": delay, "pid": pid, "last_logged_step": logged}
      self.events.append(ev)
      while not self.stop_flag.is_set():  # the supervisor starts the next attempt
        st, att = self._attempt()
        if att and att.get("attempt") == k + 1 and att.get("pids"):
          ev["restarted_after_s"] = round(time.monotonic() - t, 2)
          ev["resumed_from_step"] = att.get("resumed_from_step")
          break
        if st.get("state") in ("done", "failed", "interrupted"):
          return
        time.sleep(0.05)


def _final_state(workdir: str) -> tuple[int, list[np.ndarray]]:
  """(step, arrays) of the last complete checkpoint in <workdir>/ckpt (params and optimizer
  state, in tree order)."""
  import jax
  import orbax.checkpoint as ocp

  from rstar_jax.errors import complete_steps

  ckpt = os.path.join(workdir, "ckpt")
  step = complete_steps(ckpt)[-1]
  with ocp.CheckpointManager(ckpt) as mgr:
    out = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return step, [np.asarray(x) for x in jax.tree.leaves(out["state"])]


def run_launcher(mode: str, args, fleet, work: str, plan=None) -> dict:
  """One supervised `launchers.train` run against the fleet (``plan``: learner kills)."""
  import subprocess

  os.makedirs(work, exist_ok=True)
  settings = os.path.join(work, "settings.json")
  with open(settings, "w", encoding="utf-8") as f:
    json.dump(
      {
        "mode": mode,
        "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        "urls": [p.url for p in fleet["rollout_server"]],
        "tool_urls": [p.url for p in fleet["tool_node"]],
        "staging": os.path.join(work, "staging"),
        "tokenizer_dir": fleet["tokenizer_dir"],
        "problems_path": fleet["problems_path"],
      },
      f,
    )
  wd = os.path.join(work, "run")
  cmd = [sys.executable, "-m", "launchers.train", f"--config={__file__}:{settings}"]
  cmd += [f"--workdir={wd}", f"--max_restarts={len(plan or ()) + 1}"]
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env = {k: v for k, v in env.items() if not k.startswith("RSTAR_CODE_POOL_TOKEN")}
  log = open(os.path.join(work, "launcher.log"), "wb")
  t0 = time.monotonic()
  proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
  chaos = None
  if plan:
    chaos = LearnerChaos(wd, plan)
    chaos.start()
  try:
    rc = proc.wait(args.learner_timeout_s)
  except subprocess.TimeoutExpired:
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(120)
  finally:
    if chaos is not None:
      chaos.stop_flag.set()
      chaos.join(60)
    log.close()
  wall = time.monotonic() - t0
  if rc != 0:
    with open(os.path.join(work, "launcher.log"), encoding="utf-8", errors="replace") as f:
      tail = f.read()[-2000:]
    raise RuntimeError(f"launchers.train exited {rc}; log tail:\n{tail}")
  from rstar_jax.pipelines import trajectory_ledger

  rows = _metric_rows(wd)
  st = _read_json(os.path.join(wd, "supervisor.json")) or {}
  ledger = trajectory_ledger.read(os.path.join(wd, trajectory_ledger.FILE))
  step, arrays = _final_state(wd)
  last_attempt_rows = [r for r in rows if r.get("restarts") == st.get("restarts", 0)]
  return {
    "steps": step,
    "wall_s": wall,
    "arrays": arrays,
    "kills": chaos.events if chaos else [],
    "restarts": int(st.get("restarts", 0)),
    "supervisor_state": st.get("state"),
    # A step logged by an attempt that died before its checkpoint is redone by the next one
    # (its rows are dropped from metrics.jsonl and the ledger on resume: counted from the
    # kills).
    "steps_redone": sorted(
      s
      for e in (chaos.events if chaos else [])
      if e.get("resumed_from_step") is not None
      for s in range(int(e["resumed_from_step"]) + 1, int(e["last_logged_step"]) + 1)
    ),
    "rows": len(rows),
    "rollout_s": float(sum(r.get("time_rollout_s", 0.0) for r in last_attempt_rows)),
    "step_s": [float(r["time_step_s"]) for r in rows if "time_step_s" in r],
    "ledger": ledger,
  }


def step_groups(ledger: list[dict]) -> list[list[tuple[int, int]]]:
  """Per RL step, the (problem, seed) of the groups it took, in batch order."""
  return [[(p, sd) for _, p, sd in r["groups"]] for r in ledger]


def bench_learner(mode: str, args, fleet, work: str, ref_plan_seed: int) -> dict:
  """Learner kills: an undisturbed supervised run (async: two, for the run-to-run spread) and
  one whose learner is killed ``--kills`` times, each at a seeded random point of a seeded
  random step after the first. Trajectories are counted from the runs' ledgers
  (`trajectory_ledger`: what the final checkpoint's lineage trained)."""
  from rstar_jax.pipelines import trajectory_ledger

  say(f"{mode}: learner: undisturbed supervised run")
  ref = run_launcher(mode, args, fleet, os.path.join(work, "learner_ref"))
  spread = None
  if mode == "async":
    say(f"{mode}: learner: second undisturbed supervised run (run-to-run spread)")
    ref2 = run_launcher(mode, args, fleet, os.path.join(work, "learner_ref2"))
    spread = compare_weights(ref["arrays"], ref2["arrays"])
    spread["same_groups_per_step"] = step_groups(ref["ledger"]) == step_groups(ref2["ledger"])
  # Steps 2.. (step 1 also holds the process start and the jit compile), each kill within the
  # first 80% of a step as long as the reference's steps after the first.
  later = sorted(ref["step_s"][1:]) or [1.0]
  window = 0.8 * later[len(later) // 2]
  plan = [
    (step + 1, delay, i)
    for step, delay, i in kill_schedule(ref_plan_seed, args.kills, args.steps - 1, 1, window)
  ]
  say(f"{mode}: learner kills (step, s after the step began, _): {plan}")
  chaos = run_launcher(mode, args, fleet, os.path.join(work, "learner_chaos"), plan)
  weights = compare_weights(ref["arrays"], chaos["arrays"])
  acc = trajectory_ledger.audit(chaos["ledger"], ref["ledger"])
  n = len(chaos["kills"])
  ref_groups, chaos_groups = step_groups(ref["ledger"]), step_groups(chaos["ledger"])
  out = {
    "steps_expected": args.steps,
    "steps_completed": chaos["steps"],
    "kills": n,
    "kill_events": chaos["kills"],
    "restarts": chaos["restarts"],
    "supervisor_state": chaos["supervisor_state"],
    "steps_redone_after_a_kill": chaos["steps_redone"],
    "reference_wall_s": round(ref["wall_s"], 2),
    "chaos_wall_s": round(chaos["wall_s"], 2),
    # Whole supervised runs: each restart pays the process start, jax import, checkpoint
    # restore and jit compile again, and redoes the step it died in.
    "wall_s_per_failure": round((chaos["wall_s"] - ref["wall_s"]) / n, 2) if n else None,
    "final_state": weights,
    # The ledger (<workdir>/trained.jsonl) names every trajectory the final checkpoint's
    # lineage trained: a step that died with its process is dropped and trained again.
    "trajectory_accounting": "ledger of (problem, group seed, sample) per step vs the undisturbed run",
    "ledger": acc,
    "trajectories_trained": acc["trained"],
    # Lost: trained by the undisturbed run but not by this one (a whole group missing counts
    # its samples), plus issue numbers no step took; twice: an id in more than one step.
    "trajectories_lost": acc["lost_vs_reference"] + acc["seqs_missing"] * args.group,
    "trajectories_trained_twice": acc["trained_twice"],
    "groups_taken_twice": acc["groups_taken_twice"],
    "steps_with_other_groups_than_reference": sum(a != b for a, b in zip(ref_groups, chaos_groups))
    + abs(len(ref_groups) - len(chaos_groups)),
  }
  if mode == "sync":
    out["final_weights_match"] = weights["equal_bytes"]
    out["weights_criterion"] = "equal bytes (params and optimizer state)"
  else:
    out["undisturbed_spread"] = spread
    tol = max(2.0 * spread["rel_l2"], 1e-6)
    out["final_weights_match"] = weights["equal_bytes"] or weights["rel_l2"] <= tol
    out["weights_criterion"] = (
      f"equal bytes expected (each step's groups, in issue order, as the reference's); "
      f"accepted: rel_l2 <= max(2 x undisturbed run-to-run rel_l2, 1e-6) = {tol:.3g}"
    )
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
  ap.add_argument("--modes", default="sync,async")
  ap.add_argument("--kinds", default=",".join(KINDS), help=f"failure kinds among {KINDS}")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--kills", type=int, default=3, help="kills per failure kind and mode")
  ap.add_argument("--servers", type=int, default=3)
  ap.add_argument("--tool_nodes", type=int, default=2)
  ap.add_argument("--down_s", type=float, default=1.0, help="seconds a killed process stays down")
  ap.add_argument("--steps", type=int, default=4)
  ap.add_argument("--prompts", type=int, default=2)
  ap.add_argument("--group", type=int, default=4)
  ap.add_argument("--problems", type=int, default=16)
  ap.add_argument("--budget", type=int, default=160, help="response tokens per trajectory")
  ap.add_argument("--token_delay_s", type=float, default=0.01, help="stand-in decode pace")
  ap.add_argument("--tool_sleep_s", type=float, default=0.3, help="seconds each tool call runs")
  ap.add_argument("--learner_timeout_s", type=float, default=1200.0)
  ap.add_argument("--out", default="", help="also write the JSON here")
  args = ap.parse_args(argv)
  emit = json_stdout.reserve(args.json)  # --json: stdout holds the JSON only
  kinds = [k for k in args.kinds.split(",") if k]
  bad = sorted(set(kinds) - set(KINDS))
  if bad:
    ap.error(f"--kinds: unknown {bad}; expected some of {list(KINDS)}")
  logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
  with tempfile.TemporaryDirectory(prefix="rstar_chaos_") as tmp:
    args.tmp = tmp
    t0 = time.time()
    report = {
      "benchmark": "chaos",
      "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(t0)),
      "machine": "2-core CPU host shared with other jobs (busy); stand-in SGLang servers",
      "seed": args.seed,
      "config": {
        k: getattr(args, k)
        for k in (
          "kills",
          "servers",
          "tool_nodes",
          "down_s",
          "steps",
          "prompts",
          "group",
          "budget",
          "token_delay_s",
          "tool_sleep_s",
        )
      },
      "kinds": kinds,
      "tool_node_kills": tool_node_support(),
      "learner_kills": dict(learner_supervision_support(), injected="learner" in kinds),
      "modes": {},
    }
    for mode in [m for m in args.modes.split(",") if m]:
      report["modes"][mode] = bench_mode(mode, args, kinds)
    report["total_wall_s"] = round(time.time() - t0, 1)
  text = json.dumps(report, indent=1, sort_keys=True)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      f.write(text + "\n")
  if args.json:
    emit(report, indent=1, sort_keys=True)
  ok = all(
    m[k]["trajectories_lost"] == 0
    and m[k]["trajectories_trained_twice"] == 0
    and m[k]["steps_completed"] == m[k]["steps_expected"]
    for m in report["modes"].values()
    for k in kinds
    if "skipped" not in m[k]
  )
  return 0 if ok else 1


if __name__ == "__main__":
  with contextlib.suppress(KeyboardInterrupt):
    sys.exit(main())

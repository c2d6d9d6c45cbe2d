"""Chaos benchmark (issue 41, item 5): the RL smoke recipe, synchronous and asynchronous, while
rollout servers, tool nodes (and, where available, learner processes) are killed at seeded
random times.

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
1e-6): which groups an asynchronous step trains depends on finish order, so undisturbed async
runs differ too.

Learner kills need issue 41's item 4 (the ``--max_restarts`` supervisor); the report says
whether it was found and, if not, that nothing was injected (no fake results).

    python benchmarks/chaos.py --json > benchmarks/results/chaos.json
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
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
      alive = [i for i in range(n) if self.targets[i].alive()]
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
      t = threading.Thread(target=self._restart, args=(p, ev, time.monotonic()), daemon=True)
      t.start()
      restarts.append(t)
    for t in restarts:
      t.join(600)

  def _restart(self, p, ev, t_kill):
    time.sleep(self.down_s)
    p.start(port=p.port)
    p.wait_ready()
    ev["back_after_s"] = round(time.monotonic() - t_kill, 2)


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
  fleet = {"tokenizer": tok, "problems": problems, "rollout_server": [], "tool_node": []}
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
    say(f"{mode}: undisturbed reference run")
    ref = run_once(mode, args, fleet, os.path.join(work, "ref"))
    spread = None
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


KINDS = ("rollout_server", "tool_node")


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
  ap.add_argument("--out", default="", help="also write the JSON here")
  args = ap.parse_args(argv)
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
      "learner_kills": learner_supervision_support(),
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
    print(text)
  ok = all(
    m[k]["trajectories_lost"] == 0
    and m[k]["trajectories_trained_twice"] == 0
    and m[k]["steps_completed"] == m[k]["steps_expected"]
    for m in report["modes"].values()
    for k in kinds
  )
  return 0 if ok else 1


if __name__ == "__main__":
  with contextlib.suppress(KeyboardInterrupt):
    sys.exit(main())

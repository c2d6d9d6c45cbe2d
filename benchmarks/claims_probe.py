"""What `benchmarks/claims.py` costs, measured on a shortened run, and its --quick and full wall
times projected from that (issue 42: on a machine shared by many jobs neither finishes in a day).

A probe run is the claims pipeline itself with the SFT phase cut to ``--sft_epochs`` of the
config's, ``--steps`` RL steps (default 3) and ``--eval_problems`` held-out problems, for a few
arms (default: both roc group sizes and the dense start under 5 turns). It counts the CPU seconds
of its whole process tree (psutil: the process, its threads and the code-pool workers with the
tool processes they reaped) per unit: per SFT step, per RL step (the first, with its jit
compiles, apart), per evaluated trajectory, and per cold-start data + tokenizer phase. CPU
seconds hardly depend on how many other jobs share the cores, wall seconds do. `project` turns
the units into the CPU seconds of a plan (the arms, steps, seeds, evaluations and SFT models
that --quick or a full run executes) and a wall time on 2 idle cores between cpu / 2 (every
part runs on both cores) and cpu (none does).

The probe's SFT model is barely trained, so its rollouts run to the response budget more often
than a trained model's: the per-step and per-trajectory costs are upper bounds.

  python benchmarks/claims_probe.py --out=/tmp/claims_probe --json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # claims.py
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/

import claims  # noqa: E402
import json_stdout  # noqa: E402


def tree_cpu_s(proc=None) -> float:
  """CPU seconds (user + system) of ``proc`` (default: this process), its reaped children and
  every live descendant with theirs."""
  import psutil  # only the probe needs it

  proc = proc or psutil.Process()
  total = 0.0
  for p in [proc, *proc.children(recursive=True)]:
    with contextlib.suppress(psutil.Error):
      t = p.cpu_times()
      total += t.user + t.system + t.children_user + t.children_system
  return total


class Meter:
  """Wraps the demo's phases (module attributes, so run_demo calls the wrappers) and the RL
  metrics writer; ``events`` holds (kind, arm, cpu_s, wall_s, info) per measured unit."""

  def __init__(self):
    self.events: list[dict] = []
    self.arm = ""
    self._rl_mark = None

  def add(self, kind: str, cpu: float, wall: float, **info) -> None:
    self.events.append({"kind": kind, "arm": self.arm, "cpu_s": cpu, "wall_s": wall, **info})
    print(f"[probe] {self.arm} {kind}: {cpu:.1f} cpu-s, {wall:.1f} s {info}", file=sys.stderr)

  def install(self):
    from rstar_jax.pipelines import demo, sft_loop
    from rstar_jax.pipelines.metrics_log import MetricsWriter

    meter = self

    def timed(fn, kind, info=None):
      def wrapper(*a, **kw):
        c0, w0 = tree_cpu_s(), time.monotonic()
        out = fn(*a, **kw)
        meter.add(
          kind, tree_cpu_s() - c0, time.monotonic() - w0, **(info(a, kw, out) if info else {})
        )
        return out

      return wrapper

    def data_info(a, kw, out):
      return {"chats": len(out)}

    def sft_info(a, kw, out):
      return {"steps": int(out["steps"])}

    demo.phase_data = timed(demo.phase_data, "data", data_info)
    demo.phase_tokenizer = timed(demo.phase_tokenizer, "tokenizer")
    sft_loop.run_sft = timed(sft_loop.run_sft, "sft", sft_info)
    evaluate = demo._evaluate

    async def _evaluate(cfg, params, tokenizer, problems, k, seed):
      c0, w0 = tree_cpu_s(), time.monotonic()
      rep = await evaluate(cfg, params, tokenizer, problems, k, seed)
      m = rep["metrics"]
      meter.add(
        "eval", tree_cpu_s() - c0, time.monotonic() - w0, trajectories=len(problems) * k,
        tool_calls_per_traj=m.get("tool_calls_per_traj"),
        response_length_mean=m.get("response_length_mean"),
      )  # fmt: skip
      return rep

    demo._evaluate = _evaluate
    phase_rl = demo.phase_rl

    def rl(*a, **kw):
      meter._rl_mark = (tree_cpu_s(), time.monotonic())
      return phase_rl(*a, **kw)

    demo.phase_rl = rl
    write = MetricsWriter.write

    def write_step(self, step, metrics):
      if meter._rl_mark is not None and "reward_mean" in metrics:
        c, w = tree_cpu_s(), time.monotonic()
        meter.add(
          "rl_step", c - meter._rl_mark[0], w - meter._rl_mark[1], step=int(step),
          trajectories=float(metrics.get("rollouts_generated", 0.0)),
          response_length_mean=metrics.get("response_length_mean"),
        )  # fmt: skip
        meter._rl_mark = (c, w)
      return write(self, step, metrics)

    MetricsWriter.write = write_step
    return self


def units(events: Sequence[dict]) -> dict:
  """Per-unit CPU seconds from a probe's events: ``sft_step`` (per cold start variant),
  ``rl_first`` / ``rl_step`` (per arm; the later steps' median), ``traj`` (one rollout: the
  later RL steps' median per trajectory, all of a step's work counted), ``eval_call`` (an
  evaluation's fixed part, mostly its sampler's compile: its CPU less its trajectories at
  ``traj``, mean over evaluations), ``data`` (data + tokenizer phases, per variant)."""
  out: dict = {"sft_step": {}, "rl_first": {}, "rl_step": {}, "data": {}}
  later = [
    e["cpu_s"] / e["trajectories"]
    for e in events
    if e["kind"] == "rl_step" and e["step"] > 1 and e.get("trajectories")
  ]
  out["traj"] = statistics.median(later) if later else 0.0
  evals = [e for e in events if e["kind"] == "eval" and e["trajectories"]]
  out["eval_call"] = (
    statistics.mean(max(0.0, e["cpu_s"] - e["trajectories"] * out["traj"]) for e in evals)
    if evals
    else 0.0
  )
  for e in events:
    v = e.get("variant", e["arm"])
    if e["kind"] == "sft" and e["steps"]:
      out["sft_step"][v] = e["cpu_s"] / e["steps"]
    if e["kind"] in ("data", "tokenizer"):
      out["data"][v] = out["data"].get(v, 0.0) + e["cpu_s"]
  for arm in {e["arm"] for e in events if e["kind"] == "rl_step"}:
    steps = sorted(
      (e for e in events if e["kind"] == "rl_step" and e["arm"] == arm), key=lambda e: e["step"]
    )
    out["rl_first"][arm] = steps[0]["cpu_s"]
    later = [e["cpu_s"] for e in steps[1:]]
    out["rl_step"][arm] = statistics.median(later) if later else steps[0]["cpu_s"]
  return out


def plan(args) -> list[dict]:
  """What a claims.py invocation (its parsed ``args``) runs, per run: arm, variant, whether it
  trains its SFT model and evaluates it (a reused SFT model under another budget is
  re-evaluated), RL steps, curve evaluations, held-out problems x k."""
  from configs import demo as demo_config

  arms = claims.build_arms(args)
  seeds = range(1 if (args.quick or args.smoke) else args.seeds)
  runs, home = [], {}
  for arm in arms:
    cfg = demo_config.get_config(arm.variant)
    steps = args.steps or cfg.stages[0]["steps"]
    problems = args.eval_problems or cfg.eval.max_problems
    curve = cfg.demo.curve_eval_problems if args.curve_problems < 0 else args.curve_problems
    for s in seeds:
      first = arm.variant not in home
      budget = home.setdefault(arm.variant, arm.max_turns)
      runs.append(
        {
          "arm": arm.name,
          "variant": arm.variant,
          "group": arm.group,
          "trains_sft": first,
          "evals_sft": first or budget != arm.max_turns,
          "rl_steps": steps,
          "curve_evals": steps // cfg.train.eval_every if curve else 0,
          "curve_trajectories": curve * args.eval_k,
          "eval_trajectories": problems * args.eval_k,
          "sft_epochs": cfg.sft.epochs,
        }
      )
  return runs


def project(
  runs: Sequence[dict], u: dict, probe_epochs: dict, rl_unit, update_s: float = 0.0
) -> dict:
  """CPU seconds of ``runs`` (`plan`) from the units ``u`` (`units`). ``probe_epochs``: the
  probe's SFT epochs per variant (its SFT steps scale by epochs); ``rl_unit``: run -> the probed
  arm whose RL step stands for it; ``update_s``: CPU seconds of one RL step's policy update,
  added per step (a probe whose groups were all right or all wrong measured steps without one:
  `update_estimate`). Returns {"cpu_s", "wall_s_2cores": [cpu/2, cpu], "parts"}."""
  parts = {"data_sft": 0.0, "eval": 0.0, "rl": 0.0}
  for r in runs:
    # A start the probe did not train stands in with another's (similar chats per problem).
    v = r["variant"] if r["variant"] in u["sft_step"] else next(iter(u["sft_step"]))
    if r["trains_sft"]:
      parts["data_sft"] += u["data"].get(v, next(iter(u["data"].values()), 0.0))
      steps_probe = probe_epochs[v]["steps"]
      parts["data_sft"] += (
        u["sft_step"][v] * steps_probe * r["sft_epochs"] / probe_epochs[v]["epochs"]
      )
    calls = 2 if r["evals_sft"] else 1  # the curve evaluations reuse RL's sampler
    n_eval = r["eval_trajectories"] * calls + r["curve_evals"] * r["curve_trajectories"]
    parts["eval"] += calls * u["eval_call"] + n_eval * u["traj"]
    arm = rl_unit(r)
    parts["rl"] += u["rl_first"][arm] + (r["rl_steps"] - 1) * u["rl_step"][arm]
    parts["rl_update_estimate"] = parts.get("rl_update_estimate", 0.0) + r["rl_steps"] * update_s
  cpu = sum(parts.values())
  return {"cpu_s": cpu, "wall_s_2cores": [cpu / 2, cpu], "parts": parts}


def update_estimate(sft_step_s: float, rows: int, sft_batch: int, forward_frac: float = 1 / 3):
  """CPU seconds of an RL update over ``rows`` kept trajectories, from the SFT step's cost
  (same model and row length): one forward + backward per row (rows / sft_batch SFT steps)
  plus the old log-prob forward pass (``forward_frac`` of a step each)."""
  return sft_step_s * rows / sft_batch * (1.0 + forward_frac)


def events_from_log(path: str) -> list[dict]:
  """The events a probe printed (``[probe] <arm> <kind>: <cpu> cpu-s, <wall> s {info}``), e.g.
  of a probe stopped before its end; variant = the arm's configs/demo.py variant."""
  import ast
  import re

  pat = re.compile(r"^\[probe\] (\S+) (\w+): ([\d.]+) cpu-s, ([\d.]+) s (\{.*\})$")
  out = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      m = pat.match(line.strip())
      if not m:
        continue
      arm, kind, cpu, wall, info = m.groups()
      variant = "noisy" if arm.startswith(("roc_", "grpo_")) else arm.split("_t")[0]
      out.append(
        {"kind": kind, "arm": arm, "cpu_s": float(cpu), "wall_s": float(wall), "variant": variant,
         **ast.literal_eval(info)}
      )  # fmt: skip
  return out


def _rl_unit_for(probed: Sequence[str]):
  """Maps a run to a probed arm: the same arm, else the roc arm of its group, else the aster
  arm."""

  def pick(r):
    if r["arm"] in probed:
      return r["arm"]
    if r["group"]:
      n, k = r["group"]
      return next((a for a in probed if a.endswith(f"_{n}to{k}")), probed[0])
    return next((a for a in probed if "_t" in a), probed[-1])

  return pick


def _run_probe(a, cargs, arms) -> list[dict]:
  """Runs the probe's arms with the meter installed; returns its events."""
  meter = Meter().install()
  home: dict[str, str] = {}
  for arm in arms:
    wd = os.path.join(a.out, arm.name, "seed0")
    src = home.setdefault(arm.variant, wd)
    meter.arm = arm.name
    n0 = len(meter.events)
    claims.run_one(claims.arm_config(arm, 0, cargs, "" if src == wd else src), wd, True)
    for e in meter.events[n0:]:
      e["variant"] = arm.variant
  return meter.events


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", required=True)
  p.add_argument("--arms", default="roc_8to4,roc_32to16,dense_t5")
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--sft_epochs", type=float, default=0.1)
  p.add_argument("--eval_problems", type=int, default=16)
  p.add_argument(
    "--from_log", default="", help="project from a probe's stderr log instead of running one"
  )
  p.add_argument(
    "--sft_step_cpu",
    type=float,
    default=0.0,
    help="CPU seconds per SFT step measured elsewhere (a probe's few steps include the compile)",
  )
  p.add_argument(
    "--reference_quick_s",
    type=float,
    default=1497.0,
    help="wall seconds of issue 30's --quick on the quiet machine (2026-12-06): scales the CPU "
    "projections to wall time (0 = no calibration)",
  )
  p.add_argument("--json", action="store_true")
  a = p.parse_args(argv)
  cargs = claims.parse_args(
    [f"--out={a.out}", f"--steps={a.steps}", f"--eval_problems={a.eval_problems}", "--seeds=1"]
  )
  cargs.sft_epochs, cargs.curve_problems = a.sft_epochs, 0  # curve evaluations: per trajectory
  wanted = [x for x in a.arms.split(",") if x]
  arms = [arm for arm in claims.build_arms(cargs) if arm.name in wanted]
  if len(arms) != len(wanted):
    p.error(
      f"--arms: expected names from {[x.name for x in claims.build_arms(cargs)]}, got {wanted}"
    )
  emit = json_stdout.reserve(a.json)  # --json: stdout holds the JSON only
  t0 = time.monotonic()
  if a.from_log:
    events = events_from_log(a.from_log)
  else:
    events = _run_probe(a, cargs, arms)
  u = units(events)
  probe_epochs = {
    e["variant"]: {"steps": e["steps"], "epochs": a.sft_epochs}
    for e in events
    if e["kind"] == "sft"
  }
  if a.sft_step_cpu:
    u["sft_step"] = {v: a.sft_step_cpu for v in u["sft_step"]}
  pick = _rl_unit_for([x for x in wanted if x in u["rl_step"]])
  # The demo's RL batch: 32 prompts x 4 kept = 8 prompts x 16 kept = 128 rows; SFT batch 16.
  upd = update_estimate(next(iter(u["sft_step"].values())), 128, 16)
  res = {
    "probe": {"arms": wanted, "steps": a.steps, "sft_epochs": a.sft_epochs, "eval_problems": a.eval_problems,
              "wall_time_s": time.monotonic() - t0, "events": events,
              "from_log": a.from_log or None, "sft_step_cpu_override": a.sft_step_cpu or None},
    "units_cpu_s": u,
    "projections": {},
  }  # fmt: skip
  # Issue 30's --quick (4 arms, 20 steps, k=1 on 200 problems, budget 5), as claims.py runs it.
  issue30 = "--quick --steps=20 --group= --budgets=5 --starts=dense,sparse --eval_k=1"
  issue30 += " --eval_problems=200 --curve_problems=48"
  for name, argv2 in (
    ("quick", ["--quick"]),
    ("full_roc5_aster3", None),
    ("issue30_quick", issue30.split()),
  ):
    if argv2 is None:
      roc = plan(claims.parse_args(["--out=/x", "--claims=roc", "--seeds=5"]))
      aster = plan(claims.parse_args(["--out=/x", "--claims=aster", "--seeds=3"]))
      runs = roc + aster
    else:
      runs = plan(claims.parse_args(["--out=/x", *argv2]))
    res["projections"][name] = {"runs": len(runs), **project(runs, u, probe_epochs, pick, upd)}
  res["rl_update_estimate_cpu_s"] = upd
  if a.reference_quick_s:
    # Wall seconds per projected CPU second, from the one run measured on the quiet machine:
    # under contention JAX's thread pools spin, so CPU seconds counted here overstate a quiet
    # machine's (the ratio absorbs that, the junk probe model's longer rollouts and both cores).
    ratio = a.reference_quick_s / res["projections"]["issue30_quick"]["cpu_s"]
    res["wall_per_cpu_s"] = ratio
    for v in res["projections"].values():
      v["wall_s_calibrated"] = v["cpu_s"] * ratio
  if a.json:
    emit(res, sort_keys=True)
  else:
    for name, v in res["projections"].items():
      cal = v.get("wall_s_calibrated")
      print(
        f"{name}: {v['runs']} runs, {v['cpu_s']:.0f} cpu-s, wall on 2 cores "
        f"{v['wall_s_2cores'][0]:.0f}..{v['wall_s_2cores'][1]:.0f} s"
        + (f", calibrated {cal:.0f} s" if cal is not None else "")
      )


if __name__ == "__main__":
  main()

"""The two papers' claims at CPU scale (issue 30), each as two demo arms run side by side.

  roc    rStar2-Agent (GRPO-RoC): on the noisy environment (`configs/demo.py:noisy`), RoC
         (`rl.roc_mode=paper`) against plain GRPO (`random`), both from one SFT model. Claim:
         RoC drives the tool-error ratio of positive trajectories down (GRPO keeps or grows it),
         accuracy still rises, responses get shorter.
  aster  ASTER: an interaction-dense cold start (`:dense`) against an interaction-sparse one
         (`:sparse`, one late verification call), same problems, both under RoC. Claim: the
         sparse start collapses (tool calls per trajectory fall toward 1) and ends less accurate.

Every run is the demo pipeline itself (`rstar_jax.pipelines.demo.run_demo`): per claim and arm,
seed s sets ``train.seed`` (RL data order, rollout and update keys); the first run of each
cold start trains the SFT model and every other run of that cold start reuses it
(``demo.reuse_sft_from``), so arms and seeds differ only in RL. Runs live in
``--out/<arm>/seed<s>``; rerunning with the same --out reuses finished runs (the demo's own
resume and config records), so an interrupted benchmark picks up where it stopped.

Per arm the JSON has, from each run's ``rl/metrics.jsonl``, the per-step series (mean, std and
min/max over seeds, and each seed's) and first/last values of: ``pos_tool_error_ratio`` (tool
errors among the calls of positive trajectories, the paper's Fig. 4), ``format_penalty_rate``
(sampled trajectories whose answer-tag count is not exactly one: p_format > 0 in the paper's
mode, = 1 - ``answer_tags_eq1_frac``), ``response_length_mean``, ``tool_calls_per_traj``,
``reward_mean``; and held-out accuracy (plus tool calls / errors / length) before and after RL
from ``eval_sft.json`` / ``eval_rl.json``. One PNG per claim shows both arms, mean lines with the
min-max band over seeds shaded; ``claims_table.md`` has one row per arm and seed and one with
the mean over seeds (the README / issue-note table). ``noisy_start_ok`` says whether the noisy arms began RL with a
positive-trajectory tool-error ratio >= 0.1 (below that the environment is too clean to test
the claim; add ``--tool_failure_rate``).

  python benchmarks/claims.py --out=/tmp/claims --seeds=3 --json     full: 3 seeds x 4 arms
  python benchmarks/claims.py --out=/tmp/claims --quick --json        1 seed x 4 arms, 20 RL steps
  python benchmarks/claims.py --out=/tmp/claims --smoke --json        toy sizes (CI)
  python benchmarks/claims.py --out=/tmp/mt2 --claims=aster --steps=20 --seeds=1 \
      --max_turns=2 --sft_from=/tmp/claims --discard_stale --json     budget sweep point

A budget sweep reuses the SFT models of a finished run (``--sft_from``); the reused SFT
evaluation ran under the old budget, so it is stale and ``--discard_stale`` reruns it (without
it the run stops with one line naming the changed settings).

Wall time on 2 CPU cores (2026-12-06): --quick 1,497 s (25 min) on the quiet machine; the
full roc claim (5 seeds, 40 steps) 8,222 s and the aster claim (3 seeds, 20 steps) 3,733 s, both
on a machine shared with other jobs for most runs; the figures and what they show are in the
README's demo section.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/json_stdout.py
import json_stdout  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/

# (claim, arm, configs/demo.py variant, rl.roc_mode); an arm's cold start = its variant.
ARMS = (
  ("roc", "roc", "noisy", "paper"),
  ("roc", "grpo", "noisy", "random"),
  ("aster", "dense", "dense", "paper"),
  ("aster", "sparse", "sparse", "paper"),
)
CLAIMS = {"roc": ("roc", "grpo"), "aster": ("dense", "sparse")}
ARMS_VARIANT = {arm: variant for _, arm, variant, _ in ARMS}
# metrics.jsonl key -> JSON name (format_penalty_rate is derived, see module docstring).
SERIES = {
  "pos_tool_error_ratio": "pos_tool_error_ratio",
  "format_penalty_rate": "format_penalty_rate",
  "response_length_mean": "response_length_mean",
  "tool_calls_per_traj": "tool_calls_per_traj",
  "reward_mean": "reward_mean",
  "penalty_pos_mean": "penalty_pos_mean",
  "eval_accuracy": "curve_eval_accuracy",
}
HELDOUT = ("accuracy", "tool_calls_per_traj", "pos_tool_error_ratio", "response_length_mean")
NOISY_START_MIN = 0.1


def spread(values: Sequence[float | None]) -> dict:
  """mean, std (sample, 0 for one value), min, max and n over the non-missing values."""
  xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
  if not xs:
    return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
  m = sum(xs) / len(xs)
  var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
  return {"mean": m, "std": math.sqrt(var), "min": min(xs), "max": max(xs), "n": len(xs)}


def step_values(rows: Sequence[dict], key: str) -> list[float | None]:
  """One run's per-step values of ``key`` (a metrics.jsonl key or format_penalty_rate)."""
  out = []
  for r in rows:
    if key == "format_penalty_rate":
      v = r.get("answer_tags_eq1_frac")
      out.append(None if v is None else 1.0 - float(v))
    else:
      v = r.get(key)
      out.append(None if v is None else float(v))
  return out


def _first_last(vals: Sequence[float | None]) -> tuple[float | None, float | None]:
  present = [v for v in vals if v is not None]
  return (present[0], present[-1]) if present else (None, None)


def aggregate_arm(runs: Sequence[dict]) -> dict:
  """The arm's JSON entry from its runs: each {"seed", "rows" (metrics.jsonl rows in step
  order), "before"/"after" (eval metrics dicts), "wall_time_s"}."""
  if not runs:
    raise ValueError("aggregate_arm: no runs")
  n_steps = max(len(r["rows"]) for r in runs)
  series, first_last = {}, {}
  for key, name in SERIES.items():
    per_seed = [step_values(r["rows"], key) for r in runs]
    padded = [v + [None] * (n_steps - len(v)) for v in per_seed]
    stats = [spread([p[i] for p in padded]) for i in range(n_steps)]
    series[name] = {
      "step": list(range(1, n_steps + 1)),
      **{s: [st[s] for st in stats] for s in ("mean", "std", "min", "max")},
      "per_seed": per_seed,
    }
    fl = [_first_last(v) for v in per_seed]
    first_last[name] = {
      "first": spread([f for f, _ in fl]),
      "last": spread([la for _, la in fl]),
      "per_seed": [{"first": f, "last": la} for f, la in fl],
    }
  heldout = {}
  for k in HELDOUT:
    before = [r["before"].get(k) for r in runs]
    after = [r["after"].get(k) for r in runs]
    heldout[k] = {
      "before": spread(before),
      "after": spread(after),
      "gain": spread([a - b for a, b in zip(after, before) if a is not None and b is not None]),
      "per_seed": [{"before": b, "after": a} for b, a in zip(before, after)],
    }
  return {
    "seeds": [r["seed"] for r in runs],
    "rl_steps": n_steps,
    "series": series,
    "first_last": first_last,
    "heldout": heldout,
    "wall_time_s": {str(r["seed"]): r["wall_time_s"] for r in runs},
  }


def plot_claim(claim: str, arms: dict[str, dict], path: str) -> None:
  """Both arms side by side per metric: mean over seeds, min-max band shaded; the last panel
  is held-out accuracy before -> after (mean, error bars = min-max)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.ticker import MaxNLocator

  names = [
    ("pos_tool_error_ratio", "tool-error ratio, positive trajectories"),
    ("format_penalty_rate", "format-penalty rate"),
    ("response_length_mean", "response length (tokens)"),
    ("tool_calls_per_traj", "tool calls per trajectory"),
    ("reward_mean", "rollout reward"),
  ]
  fig, axes = plt.subplots(2, 3, figsize=(14, 8))
  colors = ("tab:blue", "tab:orange")
  for ax, (key, title) in zip(axes.flat, names):
    for (arm, a), c in zip(arms.items(), colors):
      s = a["series"][key]
      pts = [
        (x, m, lo, hi)
        for x, m, lo, hi in zip(s["step"], s["mean"], s["min"], s["max"])
        if m is not None
      ]
      if not pts:
        continue
      xs, ms, los, his = zip(*pts)
      ax.plot(xs, ms, color=c, marker=".", label=f"{arm} ({len(a['seeds'])} seeds)")
      ax.fill_between(xs, los, his, color=c, alpha=0.2)
    ax.set_title(title)
    ax.set_xlabel("RL step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)
  ax = axes.flat[-1]
  for i, ((arm, a), c) in enumerate(zip(arms.items(), colors)):
    h = a["heldout"]["accuracy"]
    for j, when in enumerate(("before", "after")):
      st = h[when]
      if st["mean"] is None:
        continue
      ax.errorbar(
        [j + 0.1 * i],
        [st["mean"]],
        yerr=[[st["mean"] - st["min"]], [st["max"] - st["mean"]]],
        color=c,
        marker="o",
        capsize=4,
        label=arm if j == 0 else None,
      )
  ax.set_xticks([0.05, 1.05], ["SFT (before RL)", "after RL"])
  ax.set_title("held-out accuracy")
  ax.legend(fontsize=8)
  fig.suptitle(f"claim '{claim}': {' vs '.join(arms)} (mean over seeds, band = min-max)")
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def arm_config(variant: str, roc_mode: str, seed: int, args, sft_from: str):
  """The typed RunConfig of one run (configs/demo.py variant + the benchmark's settings)."""
  from configs import demo as demo_config
  from rstar_jax.config import from_config_dict

  cfg = demo_config.get_config(f"{variant}_smoke" if args.smoke else variant)
  cfg.rl.roc_mode = roc_mode
  cfg.train.seed = seed
  cfg.demo.reuse_sft_from = sft_from
  cfg.demo.plot = False  # the claims' own plots replace the per-run one
  st = dict(cfg.stages[0])
  if args.steps:
    st["steps"] = args.steps
  if args.max_turns and variant in ("dense", "sparse"):
    st["max_turns"] = args.max_turns
    cfg.eval.max_turns = cfg.rollout.max_turns = args.max_turns
  cfg.stages = [st]
  if args.tool_failure_rate and variant == "noisy":
    cfg.tool.inject_failure_rate = args.tool_failure_rate
  return from_config_dict(cfg)


def _read_json(path: str):
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def sft_source(variant: str, workdir: str, sft_from: str) -> str:
  """Where the runs of cold start ``variant`` take their SFT model: ``workdir`` itself when it
  trains it, else the first arm of that cold start's seed 0 under ``sft_from`` (another claims
  run's --out)."""
  if not sft_from:
    return workdir
  arm = next(a for _, a, v, _ in ARMS if v == variant)
  return os.path.join(sft_from, arm, "seed0")


def run_one(run_cfg, workdir: str, discard_stale: bool = False) -> dict:
  """Runs (or reuses) one demo run; returns its rows, held-out metrics and wall time."""
  from rstar_jax.pipelines import demo
  from rstar_jax.pipelines.metrics_log import read_jsonl_metrics

  t0 = time.monotonic()
  summary = demo.run_demo(run_cfg, workdir, discard_stale=discard_stale)
  if not summary:
    raise RuntimeError(f"{workdir}: RL stopped early (demo.rl_max_steps?)")
  rows = sorted(
    read_jsonl_metrics(os.path.join(workdir, "rl", "metrics.jsonl")), key=lambda r: r["step"]
  )
  return {
    "seed": run_cfg.train.seed,
    "rows": rows,
    "before": _read_json(os.path.join(workdir, "eval_sft.json"))["metrics"],
    "after": _read_json(os.path.join(workdir, "eval_rl.json"))["metrics"],
    "wall_time_s": summary.get("wall_time_s", time.monotonic() - t0),
  }


def _fmt(v) -> str:
  return "-" if v is None else f"{v:.3f}"


def table_markdown(arms: dict[str, dict]) -> str:
  """One markdown row per arm and seed, then one per arm with the mean (sd) over seeds: held-out
  accuracy before -> after, each series' first -> last, wall time."""
  cols = [
    ("pos_tool_error_ratio", "pos. tool-error ratio"),
    ("format_penalty_rate", "format-penalty rate"),
    ("response_length_mean", "response length"),
    ("tool_calls_per_traj", "tool calls / traj"),
    ("reward_mean", "rollout reward"),
  ]
  head = ["arm", "seed", "held-out acc. before -> after"] + [f"{t}, first -> last" for _, t in cols]
  lines = ["| " + " | ".join(head + ["wall s"]) + " |", "|" + "---|" * (len(head) + 1)]
  for arm, a in arms.items():
    acc = a["heldout"]["accuracy"]["per_seed"]
    for i, seed in enumerate(a["seeds"]):
      cells = [arm, str(seed), f"{_fmt(acc[i]['before'])} -> {_fmt(acc[i]['after'])}"]
      for key, _ in cols:
        fl = a["first_last"][key]["per_seed"][i]
        cells.append(f"{_fmt(fl['first'])} -> {_fmt(fl['last'])}")
      cells.append(f"{a['wall_time_s'][str(seed)]:.0f}")
      lines.append("| " + " | ".join(cells) + " |")
    h = a["heldout"]["accuracy"]
    cells = [
      f"**{arm}**",
      f"mean (sd) of {len(a['seeds'])}",
      f"{_fmt(h['before']['mean'])} -> {_fmt(h['after']['mean'])} ({_fmt(h['gain']['std'])})",
    ]
    for key, _ in cols:
      f, la = a["first_last"][key]["first"], a["first_last"][key]["last"]
      cells.append(f"{_fmt(f['mean'])} -> {_fmt(la['mean'])} ({_fmt(la['std'])})")
    cells.append(f"{sum(a['wall_time_s'].values()):.0f}")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def run_claims(args) -> dict:
  t0 = time.monotonic()
  os.makedirs(args.out, exist_ok=True)
  seeds = list(range(1 if (args.quick or args.smoke) else args.seeds))
  sft_home: dict[str, str] = {}  # cold-start variant -> the workdir that trained its SFT model
  arms: dict[str, dict] = {}
  for claim, arm, variant, roc_mode in ARMS:
    if claim not in args.claims:
      continue
    runs = []
    for s in seeds:
      wd = os.path.join(args.out, arm, f"seed{s}")
      src = sft_home.setdefault(variant, sft_source(variant, wd, args.sft_from))
      cfg = arm_config(variant, roc_mode, s, args, "" if src == wd else src)
      print(f"[claims] {arm} seed {s} ({variant}, roc_mode={roc_mode}) -> {wd}", flush=True)
      runs.append(run_one(cfg, wd, args.discard_stale))
    arms[arm] = {"claim": claim, "variant": variant, "roc_mode": roc_mode, **aggregate_arm(runs)}
  out = {
    "claims": {},
    "arms": arms,
    "settings": {
      "seeds": seeds,
      "quick": args.quick,
      "smoke": args.smoke,
      "steps": args.steps or None,
      "max_turns": args.max_turns or None,
      "tool_failure_rate": args.tool_failure_rate,
      "sft_from": args.sft_from or None,
    },
  }
  for claim, pair in CLAIMS.items():
    if claim not in args.claims:
      continue
    png = os.path.join(args.out, f"claim_{claim}.png")
    plot_claim(claim, {a: arms[a] for a in pair}, png)
    out["claims"][claim] = {"arms": list(pair), "png": png}
  noisy = [a for a in arms.values() if a["variant"] == "noisy"]
  if noisy:
    starts = [a["first_last"]["pos_tool_error_ratio"]["first"]["mean"] for a in noisy]
    out["noisy_start_pos_tool_error_ratio"] = starts
    out["noisy_start_ok"] = all(v is not None and v >= NOISY_START_MIN for v in starts)
  out["wall_time_s"] = time.monotonic() - t0
  out["table"] = os.path.join(args.out, "claims_table.md")
  with open(out["table"], "w", encoding="utf-8") as f:
    f.write(table_markdown(arms))
  with open(os.path.join(args.out, "claims.json"), "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1, sort_keys=True)
  return out


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", required=True, help="folder for the runs, claims.json and the PNGs")
  p.add_argument("--seeds", type=int, default=3, help="RL seeds per arm (full run)")
  p.add_argument("--quick", action="store_true", help="one seed per arm, 20 RL steps")
  p.add_argument("--smoke", action="store_true", help="toy sizes (configs/demo.py:<v>_smoke)")
  p.add_argument("--steps", type=int, default=0, help="RL steps per run (0 = the config's)")
  p.add_argument(
    "--max_turns", type=int, default=0, help="interaction budget of the aster arms (0 = config's)"
  )
  p.add_argument(
    "--tool_failure_rate",
    type=float,
    default=0.0,
    help="noisy arms: tool.inject_failure_rate (transient failures, RL and eval)",
  )
  p.add_argument(
    "--sft_from",
    default="",
    help="another claims run's --out: every arm reuses its SFT models (<arm>/seed0 of each cold "
    "start) instead of training them, e.g. for an interaction-budget sweep",
  )
  p.add_argument(
    "--discard_stale",
    action="store_true",
    help="rerun phases whose settings changed instead of stopping (e.g. the SFT evaluation of a "
    "reused SFT model under another --max_turns)",
  )
  p.add_argument("--claims", default="roc,aster", help="comma-separated subset of roc,aster")
  p.add_argument("--json", action="store_true", help="print the JSON as the last line")
  args = p.parse_args(argv)
  args.claims = [c for c in args.claims.split(",") if c]
  bad = [c for c in args.claims if c not in CLAIMS]
  if bad or not args.claims:
    p.error(
      f"--claims: expected a comma-separated subset of {sorted(CLAIMS)}, got {bad or '(none)'}"
    )
  if args.seeds < 1:
    p.error(f"--seeds: expected >= 1, got {args.seeds}")
  if not 0.0 <= args.tool_failure_rate <= 1.0:
    p.error(f"--tool_failure_rate: expected a probability in [0, 1], got {args.tool_failure_rate}")
  if args.sft_from:
    args.sft_from = os.path.abspath(args.sft_from)
    missing = [
      sft_source(v, "", args.sft_from)
      for c in args.claims
      for v in {ARMS_VARIANT[a] for a in CLAIMS[c]}
      if not os.path.isdir(os.path.join(sft_source(v, "", args.sft_from), "sft"))
    ]
    if os.path.abspath(args.out) == args.sft_from:
      p.error("--sft_from: expected another run's --out, got --out itself")
    if missing:
      p.error(f"--sft_from: no SFT model in {', '.join(sorted(missing))} (run those arms first)")
  if args.quick and not args.steps:
    args.steps = 20
  return args


def main(argv=None) -> None:
  args = parse_args(argv)
  emit = json_stdout.reserve(args.json)  # --json: stdout holds the JSON only
  out = run_claims(args)
  with open(out["table"], encoding="utf-8") as f:
    print(f.read(), flush=True)
  if args.json:
    emit(out, sort_keys=True)


if __name__ == "__main__":
  main()

"""The two papers' claims at CPU scale (issues 30 and 42), each as demo arms run side by side.

  roc    rStar2-Agent (GRPO-RoC): on the noisy environment (`configs/demo.py:noisy`), RoC
         (`rl.roc_mode=paper`) against plain GRPO (`random`), both from one SFT model, at two
         group sizes with the same trajectories per step: the demo's 32 prompts x 8 rollouts
         kept to 4 (arms ``roc_8to4`` / ``grpo_8to4``) and the paper's 32 rollouts kept to 16
         (``--group=32:16``: 8 prompts, arms ``roc_32to16`` / ``grpo_32to16``). Claim: RoC drives
         the tool-error ratio of positive trajectories down (GRPO keeps or grows it), accuracy
         still rises, responses get shorter.
  aster  ASTER: an interaction-dense cold start (`:dense`) against one between dense and sparse
         (`:graded`, 1 to 4 calls per chat; issue 42's "mixed"), same problems, both under RoC,
         each under the turn budgets of ``--budgets`` (default 3, 5, 8; arms ``dense_t3``,
         ``graded_t3``, ...). Claim: from the lighter start, tool calls per trajectory fall under
         RL (interaction collapse), from the dense one they do not. ``--starts`` may add
         ``sparse`` (the issue-30 arm, one late call).

Every run is the demo pipeline itself (`rstar_jax.pipelines.demo.run_demo`): per arm and seed s,
``train.seed`` = s (RL data order, rollout and update keys); the first run of each cold start
trains the SFT model and every other run of that cold start reuses it (``demo.reuse_sft_from``;
under another turn budget its SFT evaluation is rerun), so arms and seeds differ only in RL.
Held-out accuracy is avg@k with ``--eval_k`` (default 4) samples per problem. Runs live in
``--out/<arm>/seed<s>``; rerunning with the same --out reuses finished runs (the demo's own
resume and config records), so an interrupted benchmark picks up where it stopped. With
``--records=DIR`` each finished run is also kept as one small JSON (``DIR/<arm>/seed<s>.json``:
its config view, rows, held-out metrics, wall time and the sha256 of the SFT weights it started
from) and reused, when its settings match, by any later call, on any machine: the full run is
spread over sessions that keep only ``DIR`` (in git: benchmarks/results/claims/runs/). A record
of other settings stops the run with one line (``--discard_stale`` reruns it instead). When a
cold start's SFT home run is a record, its SFT model is trained again there, up to its SFT
evaluation; ``sft_sha256`` per arm then shows whether the retrained model is the same.
``--arms`` runs a subset (the others' SFT homes do not move).

Per arm the JSON has, from each run's ``rl/metrics.jsonl``, the per-step series (mean, std and
min/max over seeds, and each seed's) and first/last values of: ``pos_tool_error_ratio`` (tool
errors among the calls of positive trajectories, the paper's Fig. 4), ``format_penalty_rate``
(1 - ``answer_tags_eq1_frac``), ``response_length_mean``, ``tool_calls_per_traj``,
``reward_mean``, and the curve evaluations' accuracy and calls per trajectory; held-out
metrics before and after RL (``eval_sft.json`` / ``eval_rl.json``); ``kept_cleaner`` (the share
of steps, among those whose positives made a failed call and where positives were kept, in
which the kept positives' tool-error ratio was below all positives'); and the trajectories
generated with the held-out accuracy gain per 1,000 of them. Per comparison (``comparisons``:
RoC vs GRPO at each group size, the larger group against the demo's for RoC, and each start
against the dense one under each budget) ``paired`` gives the per-seed differences of the first
arm minus the second, their mean and a percentile-bootstrap 95% interval (`paired_bootstrap`;
None below 2 seeds). PNGs: one per comparison (both arms, mean lines, min-max band over seeds)
and ``claim_calls.png`` (calls per trajectory across training and at evaluation, per budget).
``claims_table.md`` holds the per-seed table, the paired differences and the RoC extras.

  python benchmarks/claims.py --out=/tmp/claims --json               full: 5 seeds per roc arm, 3 per
                                                                     aster arm (--seeds, --aster_seeds)
  python benchmarks/claims.py --out=/tmp/claims --quick --json        1 seed per arm, short RL
  python benchmarks/claims.py --out=/tmp/claims --smoke --json        toy sizes (CI)
  python benchmarks/claims.py --out=/tmp/c --records=benchmarks/results/claims/runs \
      --claims=roc --arms=roc_32to16,grpo_32to16 --seeds=2 --json   a slice of the full run, kept
  python benchmarks/claims.py --out=/tmp/mt2 --claims=aster --budgets=2 --sft_from=/tmp/claims \
      --discard_stale --json                                         budget point, reused SFT

With --json, stdout holds exactly one JSON document; progress (and the demo's) goes to stderr.
A budget sweep reuses the SFT models of a finished run (``--sft_from``); the reused SFT
evaluation ran under the old budget, so it is stale and ``--discard_stale`` reruns it (without
it the run stops with one line naming the changed settings).

Wall time on 2 CPU cores: 2026-12-06 (issue 30's arms, k=1): --quick 1,497 s on the quiet
machine; roc (5 seeds, 40 steps) 8,222 s, aster (3 seeds, 20 steps) 3,733 s, on a shared machine.
Issue 42's arms were not run to the end on 2026-12-07 (a machine shared by seven jobs); the
projection from measured costs (benchmarks/claims_probe.py) puts this --quick near 30 minutes
and the full run near 4.3 hours on 2 idle cores: benchmarks/results/claims/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/json_stdout.py
import json_stdout  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/

ROC_MODES = {"roc": "paper", "grpo": "random"}  # arm prefix -> rl.roc_mode
# Cold starts of the aster claim (configs/demo.py variants); the first is the reference.
STARTS = ("dense", "graded", "sparse")
SERIES = {  # metrics.jsonl key -> JSON name (format_penalty_rate is derived, see docstring)
  "pos_tool_error_ratio": "pos_tool_error_ratio",
  "format_penalty_rate": "format_penalty_rate",
  "response_length_mean": "response_length_mean",
  "tool_calls_per_traj": "tool_calls_per_traj",
  "reward_mean": "reward_mean",
  "penalty_pos_mean": "penalty_pos_mean",
  "kept_pos_tool_error_ratio": "kept_pos_tool_error_ratio",
  "eval_accuracy": "curve_eval_accuracy",
  "eval_tool_calls_per_traj": "curve_eval_tool_calls_per_traj",
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


def paired_bootstrap(
  a: Sequence[float | None],
  b: Sequence[float | None],
  *,
  n_boot: int = 10_000,
  level: float = 0.95,
  seed: int = 0,
) -> dict:
  """Mean of the paired differences a[i] - b[i] (one pair per seed) and its percentile-bootstrap
  interval at ``level``.

  a, b: [n] values of two arms, index i = the same seed; a pair with a missing value (None or
  NaN) is left out. Returns {"mean", "lo", "hi", "n", "diffs"}; lo/hi are None below 2 pairs (a
  one-point resample has no spread), everything None with no pair. The resamples draw from
  ``numpy.random.default_rng(seed)``, so the interval is a pure function of its inputs. With
  few pairs (3-5 seeds) the percentile interval is narrower than its nominal level: read it as
  a lower bound on the uncertainty.
  """
  if len(a) != len(b):
    raise ValueError(f"paired_bootstrap: {len(a)} values against {len(b)}")
  if not 0.0 < level < 1.0:
    raise ValueError(f"paired_bootstrap: level expected in (0, 1), got {level}")
  pairs = [
    (float(x), float(y))
    for x, y in zip(a, b)
    if x is not None and y is not None and not (math.isnan(float(x)) or math.isnan(float(y)))
  ]
  d = np.asarray([x - y for x, y in pairs], np.float64)
  n = int(d.size)
  out = {"mean": None, "lo": None, "hi": None, "n": n, "diffs": d.tolist()}
  if n == 0:
    return out
  out["mean"] = float(d.mean())
  if n < 2:
    return out
  idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
  means = d[idx].mean(axis=1)
  tail = (1.0 - level) / 2.0
  lo, hi = np.quantile(means, [tail, 1.0 - tail])
  out["lo"], out["hi"] = float(lo), float(hi)
  return out


def kept_cleaner(rows: Sequence[dict]) -> dict:
  """How often RoC's selection kept cleaner positives than it was offered: among the steps
  whose positives made a failed call (``pos_tool_error_ratio`` > 0) and that kept a positive
  (``kept_reward_mean`` > 0), the share where ``kept_pos_tool_error_ratio`` was below
  ``pos_tool_error_ratio``. Returns {"steps", "cleaner", "share"} (share None with no such step).
  """
  steps = cleaner = 0
  for r in rows:
    pos, kept = r.get("pos_tool_error_ratio"), r.get("kept_pos_tool_error_ratio")
    if pos is None or kept is None or not pos > 0 or not r.get("kept_reward_mean", 0) > 0:
      continue
    steps += 1
    cleaner += float(kept) < float(pos)
  return {"steps": steps, "cleaner": cleaner, "share": cleaner / steps if steps else None}


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
  cleaner = [kept_cleaner(r["rows"]) for r in runs]
  generated = [sum(float(x.get("rollouts_generated", 0.0)) for x in r["rows"]) for r in runs]
  gains = [
    h["after"] - h["before"] if None not in h.values() else None
    for h in heldout["accuracy"]["per_seed"]
  ]
  return {
    "seeds": [r["seed"] for r in runs],
    "rl_steps": n_steps,
    "series": series,
    "first_last": first_last,
    "heldout": heldout,
    "kept_cleaner": {
      "per_seed": cleaner,
      "share": spread([c["share"] for c in cleaner]),
      "pooled": (sum(c["cleaner"] for c in cleaner) / sum(c["steps"] for c in cleaner))
      if sum(c["steps"] for c in cleaner)
      else None,
    },
    "trajectories_generated": {
      "per_seed": generated,
      "acc_gain_per_1k": spread(
        [g * 1000.0 / n if g is not None and n else None for g, n in zip(gains, generated)]
      ),
    },
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


@dataclasses.dataclass(frozen=True)
class Arm:
  """One arm: ``variant`` (configs/demo.py; the cold start, so arms of one variant share an SFT
  model), ``roc_mode``, ``group`` = (rollouts sampled, kept) per prompt or None (the config's),
  ``max_turns`` (0 = the config's)."""

  name: str
  claim: str
  variant: str
  roc_mode: str
  group: tuple[int, int] | None = None
  max_turns: int = 0


def parse_group(text: str) -> tuple[int, int]:
  """ "32:16" -> (32, 16): rollouts sampled per prompt and kept, kept dividing sampled."""
  try:
    n, k = (int(x) for x in text.split(":"))
  except ValueError:
    raise ValueError(f"--group: expected <sampled>:<kept> such as 32:16, got {text!r}") from None
  if not (2 <= k <= n and n % k == 0):
    raise ValueError(f"--group: expected 2 <= kept <= sampled, kept dividing sampled, got {text!r}")
  return n, k


def base_group(args) -> tuple[int, int, int]:
  """(prompts, sampled, kept) per step of the noisy config the roc arms start from."""
  from configs import demo as demo_config

  cfg = demo_config.get_config("noisy_smoke" if args.smoke else "noisy")
  k = cfg.rl.group_size
  return cfg.train.batch_prompts, k * cfg.rl.oversample, k


def build_arms(args) -> list[Arm]:
  """The arms in run order: per roc group size RoC then GRPO; per start and budget the aster."""
  arms = []
  if "roc" in args.claims:
    _, n0, k0 = base_group(args)
    for n, k in [(n0, k0)] + ([args.group] if args.group and args.group != (n0, k0) else []):
      for prefix, mode in ROC_MODES.items():
        arms.append(Arm(f"{prefix}_{n}to{k}", "roc", "noisy", mode, group=(n, k)))
  if "aster" in args.claims:
    for b in args.budgets:
      for start in args.starts:
        arms.append(Arm(f"{start}_t{b}", "aster", start, "paper", max_turns=b))
  return arms


def comparisons(arms: Sequence[Arm]) -> dict[str, tuple[str, str]]:
  """name -> (arm a, arm b), each read as a - b: RoC - GRPO per group size, the larger group's
  RoC - the demo's, and each start - dense under each budget."""
  names = {a.name for a in arms}
  out = {}
  roc = [a for a in arms if a.claim == "roc" and a.roc_mode == "paper"]
  for a in roc:
    g = a.name.split("_", 1)[1]
    if f"grpo_{g}" in names:
      out[f"roc_vs_grpo_{g}"] = (a.name, f"grpo_{g}")
  for a in roc[1:]:
    out[f"roc_{a.name.split('_', 1)[1]}_vs_{roc[0].name.split('_', 1)[1]}"] = (a.name, roc[0].name)
  for a in arms:
    if a.claim == "aster" and a.variant != "dense" and f"dense_t{a.max_turns}" in names:
      out[f"{a.variant}_vs_dense_t{a.max_turns}"] = (a.name, f"dense_t{a.max_turns}")
  return out


def arm_config(arm: Arm, seed: int, args, sft_from: str):
  """The typed RunConfig of one run (configs/demo.py variant + the arm's and benchmark's
  settings). A group keeps the config's trajectories per step: prompts = P0 * n0 / n."""
  from configs import demo as demo_config
  from rstar_jax.config import from_config_dict

  cfg = demo_config.get_config(f"{arm.variant}_smoke" if args.smoke else arm.variant)
  cfg.rl.roc_mode = arm.roc_mode
  cfg.train.seed = seed
  cfg.demo.reuse_sft_from = sft_from
  cfg.demo.plot = False  # the claims' own plots replace the per-run one
  cfg.eval.k = args.eval_k
  if args.eval_problems:
    cfg.eval.max_problems = args.eval_problems
  if getattr(args, "sft_epochs", 0):  # timing probes (benchmarks/claims_probe.py) only
    cfg.sft.epochs = args.sft_epochs
  if args.curve_problems >= 0:
    cfg.demo.curve_eval_problems = args.curve_problems
  if arm.group:
    p0, n0, _ = base_group(args)
    n, k = arm.group
    if (p0 * n0) % n:
      raise ValueError(f"--group={n}:{k}: {p0 * n0} trajectories per step do not split into {n}")
    cfg.rl.group_size, cfg.rl.oversample = k, n // k
    cfg.train.batch_prompts = p0 * n0 // n
  st = dict(cfg.stages[0])
  if args.steps:
    st["steps"] = args.steps
  if arm.max_turns:
    st["max_turns"] = arm.max_turns
    cfg.eval.max_turns = cfg.rollout.max_turns = arm.max_turns
  cfg.stages = [st]
  if args.tool_failure_rate and arm.variant == "noisy":
    cfg.tool.inject_failure_rate = args.tool_failure_rate
  return from_config_dict(cfg)


def _read_json(path: str):
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def sft_source(arms: Sequence[Arm], variant: str, workdir: str, sft_from: str) -> str:
  """Where the runs of cold start ``variant`` take their SFT model: ``workdir`` itself when it
  trains it, else the first arm of that cold start's seed 0 under ``sft_from`` (another claims
  run's --out, with the same arms)."""
  if not sft_from:
    return workdir
  arm = next(a for a in arms if a.variant == variant)
  return os.path.join(sft_from, arm.name, "seed0")


class StaleRecordError(ValueError):
  """A run record (--records) was made with settings other than this run's."""


def run_view(run_cfg) -> dict:
  """The flat config every number of a run depends on (the demo's run-record view)."""
  from rstar_jax import run_record
  from rstar_jax.pipelines import demo_record

  return run_record.phase_view(run_cfg, ("",), demo_record.IGNORE)


def sft_sha256(workdir: str) -> str | None:
  """sha256 of the run's SFT weights (``sft/hf/model.safetensors``): which SFT model it used."""
  path = os.path.join(workdir, "sft", "hf", "model.safetensors")
  if not os.path.isfile(path):
    return None
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def read_run_record(path: str, run_cfg, discard_stale: bool) -> dict | None:
  """The run kept in a record file (``--records``), or None when there is none (or it is stale
  and ``discard_stale``). A record of other settings raises StaleRecordError (one line)."""
  from rstar_jax import run_record

  if not os.path.isfile(path):
    return None
  try:
    rec = _read_json(path)
    old, run = rec["config"], rec["run"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise StaleRecordError(f"{path}: not a claims run record ({type(e).__name__}: {e})") from None
  changed = run_record.diff(old, run_view(run_cfg))
  if changed:
    if discard_stale:
      return None
    what = ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in changed[:6])
    more = f" (+{len(changed) - 6} more)" if len(changed) > 6 else ""
    raise StaleRecordError(
      f"{path}: recorded under other settings: {what}{more}; use another --records, or "
      "--discard_stale to rerun it"
    )
  return {**run, "from_record": path}


def write_run_record(path: str, run_cfg, run: dict) -> None:
  """Keeps a finished run as one small JSON (its config view, rows, held-out metrics, wall time
  and SFT weights' sha256), so a later session, on a machine without the run folders, reuses it."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  rec = {
    "config": run_view(run_cfg),
    "run": {k: v for k, v in run.items() if k != "from_record"},
    "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  }
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(rec, f, sort_keys=True, separators=(",", ":"))
  os.replace(tmp, path)


def prepare_sft(home_cfg, workdir: str, discard_stale: bool) -> dict:
  """Trains (or resumes) a cold start's SFT model in ``workdir`` up to its SFT evaluation."""
  from rstar_jax.pipelines import demo

  return demo.run_demo(home_cfg, workdir, discard_stale=discard_stale, sft_only=True)


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
    "sft_sha256": sft_sha256(workdir),
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


# (JSON name, where in an aggregated arm) of the paired differences of every comparison.
PAIRED = (
  ("heldout_accuracy_after", ("heldout", "accuracy", "after")),
  ("heldout_accuracy_gain", ("heldout", "accuracy", "gain")),
  ("heldout_pos_tool_error_ratio_after", ("heldout", "pos_tool_error_ratio", "after")),
  ("heldout_tool_calls_after", ("heldout", "tool_calls_per_traj", "after")),
  ("pos_tool_error_ratio_last", ("first_last", "pos_tool_error_ratio", "last")),
  ("response_length_last", ("first_last", "response_length_mean", "last")),
  ("tool_calls_last", ("first_last", "tool_calls_per_traj", "last")),
  ("tool_calls_change", ("first_last", "tool_calls_per_traj", "change")),
)


def per_seed_values(arm: dict, where: tuple[str, str, str]) -> dict[int, float | None]:
  """seed -> one value of an aggregated arm: a held-out metric before / after / gain, or a
  series' first / last / change (last - first)."""
  section, key, which = where
  out = {}
  for seed, v in zip(arm["seeds"], arm[section][key]["per_seed"]):
    x, y = (v["before"], v["after"]) if section == "heldout" else (v["first"], v["last"])
    if which in ("gain", "change"):
      out[seed] = None if x is None or y is None else y - x
    else:
      out[seed] = x if which in ("before", "first") else y
  return out


def paired(a: dict, b: dict, seed: int = 0) -> dict:
  """Every PAIRED metric of a - b over the seeds both arms ran (`paired_bootstrap`)."""
  out = {}
  for name, where in PAIRED:
    va, vb = per_seed_values(a, where), per_seed_values(b, where)
    seeds = [s for s in va if s in vb]
    out[name] = {
      "seeds": seeds,
      **paired_bootstrap([va[s] for s in seeds], [vb[s] for s in seeds], seed=seed),
    }
  return out


def _ci(p: dict) -> str:
  if p["mean"] is None:
    return "-"
  if p["lo"] is None:
    return f"{p['mean']:+.3f} (n={p['n']}, no interval)"
  return f"{p['mean']:+.3f} [{p['lo']:+.3f}, {p['hi']:+.3f}] (n={p['n']})"


def paired_markdown(comps: dict[str, dict]) -> str:
  """One row per comparison: each paired metric's mean difference [95% interval] (n seeds)."""
  head = ["comparison (a - b)"] + [name for name, _ in PAIRED]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, c in comps.items():
    cells = [f"{name}: {c['arms'][0]} - {c['arms'][1]}"]
    cells += [_ci(c["paired"][m]) for m, _ in PAIRED]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def roc_extras_markdown(arms: dict[str, dict]) -> str:
  """Per roc arm: the kept-cleaner share per seed and pooled, trajectories generated, held-out
  gain per 1,000 trajectories generated."""
  lines = [
    "| arm | kept positives cleaner than all (steps, per seed) | pooled share | trajectories "
    "generated / run | held-out gain per 1k trajectories |",
    "|---|---|---|---|---|",
  ]
  for name, a in arms.items():
    if a["claim"] != "roc":
      continue
    per = ", ".join(f"{c['cleaner']}/{c['steps']}" for c in a["kept_cleaner"]["per_seed"])
    gen = a["trajectories_generated"]
    n_gen = sum(gen["per_seed"]) / len(gen["per_seed"])
    lines.append(
      f"| {name} | {per} | {_fmt(a['kept_cleaner']['pooled'])} | {n_gen:.0f} | "
      f"{_fmt(gen['acc_gain_per_1k']['mean'])} |"
    )
  return "\n".join(lines) + "\n"


def plot_calls(arms: dict[str, dict], budgets: Sequence[int], path: str) -> None:
  """Calls per trajectory per budget: the training series (lines, min-max band over seeds) and
  the curve evaluations (dashed, markers) of each start; a last panel with the held-out calls
  before -> after RL."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(budgets) + 1, figsize=(4.5 * (len(budgets) + 1), 4))
  colors = {"dense": "tab:blue", "graded": "tab:orange", "sparse": "tab:green"}
  for ax, b in zip(axes, budgets):
    for name, a in arms.items():
      if a["claim"] != "aster" or a["max_turns"] != b:
        continue
      c = colors.get(a["variant"], "tab:gray")
      for key, style in (("tool_calls_per_traj", "-"), ("curve_eval_tool_calls_per_traj", "--")):
        s = a["series"][key]
        pts = [
          (x, m, lo, hi)
          for x, m, lo, hi in zip(s["step"], s["mean"], s["min"], s["max"])
          if m is not None
        ]
        if not pts:
          continue
        xs, ms, los, his = zip(*pts)
        label = f"{a['variant']} {'train' if style == '-' else 'eval'}"
        ax.plot(xs, ms, style, color=c, marker="." if style == "-" else "o", label=label)
        if style == "-":
          ax.fill_between(xs, los, his, color=c, alpha=0.2)
    ax.set_title(f"calls / trajectory, budget {b} turns")
    ax.set_xlabel("RL step")
    ax.legend(fontsize=8)
  ax = axes[-1]
  for name, a in arms.items():
    if a["claim"] != "aster":
      continue
    h = a["heldout"]["tool_calls_per_traj"]
    x = list(budgets).index(a["max_turns"])
    off = 0.15 * STARTS.index(a["variant"])
    ax.plot(
      [x + off, x + off],
      [h["before"]["mean"], h["after"]["mean"]],
      color=colors.get(a["variant"], "tab:gray"),
      marker="o",
      label=a["variant"] if x == 0 else None,
    )
    ax.annotate(
      "",
      (x + off, h["after"]["mean"]),
      (x + off, h["before"]["mean"]),
      arrowprops={"arrowstyle": "->", "color": colors.get(a["variant"], "tab:gray")},
    )
  ax.set_xticks(range(len(budgets)), [f"{b} turns" for b in budgets])
  ax.set_title("held-out calls / trajectory, SFT -> RL")
  ax.legend(fontsize=8)
  fig.suptitle("ASTER: calls per trajectory under RL (mean over seeds, band = min-max)")
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def run_claims(args) -> dict:
  t0 = time.monotonic()
  os.makedirs(args.out, exist_ok=True)
  seeds = list(range(1 if (args.quick or args.smoke) else args.seeds))
  aster_seeds = seeds[: args.aster_seeds] if args.aster_seeds else seeds
  all_arms = build_arms(args)
  arm_list = [a for a in all_arms if not args.arms or a.name in args.arms]
  # Each cold start's SFT model lives in its first arm's seed-0 run (of the full arm list, so an
  # --arms subset finds the same model); that run's budget is the one its SFT eval ran under.
  home_arm: dict[str, Arm] = {}
  for a in all_arms:
    home_arm.setdefault(a.variant, a)
  arms: dict[str, dict] = {}
  missing: list[str] = []  # --records_only: runs with no record yet
  for arm in arm_list:
    runs = []
    for s in aster_seeds if arm.claim == "aster" else seeds:
      wd = os.path.join(args.out, arm.name, f"seed{s}")
      h = home_arm[arm.variant]
      src = sft_source(
        all_arms, arm.variant, os.path.join(args.out, h.name, "seed0"), args.sft_from
      )
      cfg = arm_config(arm, s, args, "" if src == wd else src)
      # A reused SFT model evaluated under another budget: that evaluation is rerun.
      stale_ok = args.discard_stale or (src != wd and h.max_turns != arm.max_turns)
      rec = os.path.join(args.records, arm.name, f"seed{s}.json") if args.records else ""
      got = read_run_record(rec, cfg, args.discard_stale) if rec else None
      if got is not None:
        print(
          f"[claims] {arm.name} seed {s}: reusing the record {rec}", file=sys.stderr, flush=True
        )
        runs.append(got)
        continue
      if args.records_only:
        missing.append(f"{arm.name}/seed{s}")
        continue
      if src != wd and not os.path.isfile(os.path.join(src, "sft", "hf", "model.safetensors")):
        # The run that trains this cold start's SFT model is a record only (another session's):
        # train the model again there, up to its SFT evaluation.
        print(f"[claims] {arm.variant}: SFT model -> {src}", file=sys.stderr, flush=True)
        prepare_sft(arm_config(h, 0, args, ""), src, args.discard_stale)
      print(f"[claims] {arm.name} seed {s} ({arm}) -> {wd}", file=sys.stderr, flush=True)
      got = run_one(cfg, wd, stale_ok)
      if rec:
        write_run_record(rec, cfg, got)
      runs.append(got)
    if not runs:
      continue
    arms[arm.name] = {
      **dataclasses.asdict(arm),
      **aggregate_arm(runs),
      # More than one hash: the seeds' runs started from SFT models that differ (retrained).
      "sft_sha256": sorted({r["sft_sha256"] for r in runs if r.get("sft_sha256")}),
      "seeds_from_records": [r["seed"] for r in runs if r.get("from_record")],
    }
  comps = {}
  for name, (a, b) in comparisons(arm_list).items():
    if a not in arms or b not in arms:
      continue
    png = os.path.join(args.out, f"claim_{name}.png")
    plot_claim(name, {a: arms[a], b: arms[b]}, png)
    comps[name] = {"arms": [a, b], "png": png, "paired": paired(arms[a], arms[b])}
  out = {
    "comparisons": comps,
    "arms": arms,
    "settings": {
      "seeds": seeds,
      "aster_seeds": aster_seeds,
      "quick": args.quick,
      "smoke": args.smoke,
      "steps": args.steps or None,
      "eval_k": args.eval_k,
      "eval_problems": args.eval_problems or None,
      "curve_problems": None if args.curve_problems < 0 else args.curve_problems,
      "group": list(args.group) if args.group else None,
      "budgets": list(args.budgets),
      "starts": list(args.starts),
      "tool_failure_rate": args.tool_failure_rate,
      "sft_from": args.sft_from or None,
      "arms": args.arms or None,
      "records": args.records or None,
      "records_only": args.records_only,
    },
    "missing_runs": missing,
  }
  if any(a["claim"] == "aster" for a in arms.values()):
    out["calls_png"] = os.path.join(args.out, "claim_calls.png")
    plot_calls(arms, args.budgets, out["calls_png"])
  noisy = [a for a in arms.values() if a["variant"] == "noisy"]
  if noisy:
    starts = [a["first_last"]["pos_tool_error_ratio"]["first"]["mean"] for a in noisy]
    out["noisy_start_pos_tool_error_ratio"] = starts
    out["noisy_start_ok"] = all(v is not None and v >= NOISY_START_MIN for v in starts)
  out["wall_time_s"] = time.monotonic() - t0
  out["table"] = os.path.join(args.out, "claims_table.md")
  with open(out["table"], "w", encoding="utf-8") as f:
    f.write(table_markdown(arms))
    f.write("\nPaired differences (a - b), mean over seeds [bootstrap 95% interval]:\n\n")
    f.write(paired_markdown(comps))
    if noisy:
      f.write("\n" + roc_extras_markdown(arms))
    if missing:
      f.write(f"\nNot run yet (no record): {', '.join(missing)}.\n")
  with open(os.path.join(args.out, "claims.json"), "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1, sort_keys=True)
  return out


def _int_list(text: str, flag: str) -> list[int]:
  try:
    vals = [int(x) for x in text.split(",") if x]
  except ValueError:
    raise ValueError(f"{flag}: expected comma-separated integers, got {text!r}") from None
  if not vals or min(vals) < 1:
    raise ValueError(f"{flag}: expected integers >= 1, got {text!r}")
  return vals


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", required=True, help="folder for the runs, claims.json and the PNGs")
  p.add_argument("--seeds", type=int, default=5, help="RL seeds per arm (full run)")
  p.add_argument(
    "--aster_seeds",
    type=int,
    default=3,
    help="RL seeds per aster arm, the first of --seeds (0 = as many as --seeds)",
  )
  p.add_argument("--quick", action="store_true", help="one seed per arm, QUICK_STEPS RL steps")
  p.add_argument("--smoke", action="store_true", help="toy sizes (configs/demo.py:<v>_smoke)")
  p.add_argument("--steps", type=int, default=0, help="RL steps per run (0 = the config's)")
  p.add_argument(
    "--group",
    default="32:16",
    help="the second roc pair's rollouts sampled:kept per prompt, at the demo's trajectories "
    "per step ('' = only the demo's group)",
  )
  p.add_argument("--budgets", default="3,5,8", help="turn budgets of the aster arms")
  p.add_argument("--starts", default="dense,graded", help=f"aster cold starts, subset of {STARTS}")
  p.add_argument("--eval_k", type=int, default=4, help="held-out samples per problem (avg@k)")
  p.add_argument(
    "--eval_problems", type=int, default=0, help="held-out problems (0 = the config's 200)"
  )
  p.add_argument(
    "--curve_problems",
    type=int,
    default=-1,
    help="held-out problems of the evaluations every train.eval_every RL steps (-1 = config's 48)",
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
    help="another claims run's --out (same arms): every arm reuses its SFT models (the first "
    "arm of each cold start, seed 0) instead of training them, e.g. for a budget sweep",
  )
  p.add_argument(
    "--discard_stale",
    action="store_true",
    help="rerun phases whose settings changed instead of stopping (e.g. the SFT evaluation of a "
    "reused SFT model under another budget)",
  )
  p.add_argument("--claims", default="roc,aster", help="comma-separated subset of roc,aster")
  p.add_argument(
    "--arms",
    default="",
    help="comma-separated arm names to run (default: every arm of --claims); SFT models stay "
    "where the full arm list puts them",
  )
  p.add_argument(
    "--records",
    default="",
    help="folder of per-run records (<arm>/seed<s>.json, a few tens of KB each): a finished run "
    "is written there and, when its settings match, reused instead of rerun, so a benchmark "
    "spread over sessions (and machines) keeps its finished runs, e.g. in git",
  )
  p.add_argument(
    "--records_only",
    action="store_true",
    help="run nothing: report the runs kept in --records (a partial full run: missing_runs "
    "lists the others; an arm without records and its comparisons are left out)",
  )
  p.add_argument("--json", action="store_true", help="stdout: exactly one JSON document")
  args = p.parse_args(argv)
  args.claims = [c for c in args.claims.split(",") if c]
  bad = [c for c in args.claims if c not in ("roc", "aster")]
  if bad or not args.claims:
    p.error(f"--claims: expected a comma-separated subset of roc,aster, got {bad or '(none)'}")
  args.arms = [x for x in args.arms.split(",") if x]
  args.starts = [x for x in args.starts.split(",") if x]
  if not args.starts or any(x not in STARTS for x in args.starts):
    p.error(f"--starts: expected a comma-separated subset of {','.join(STARTS)}, got {args.starts}")
  try:
    args.group = parse_group(args.group) if args.group else None
    args.budgets = _int_list(args.budgets, "--budgets")
  except ValueError as e:
    p.error(str(e))
  if args.records_only and not args.records:
    p.error("--records_only: expected --records=DIR as well")
  if args.records:
    args.records = os.path.abspath(args.records)
  if args.smoke and args.group:
    # The toy config samples 4 rollouts for 2 prompts: the larger group is 8 kept to 4.
    args.group = (8, 4)
  if args.arms:
    known = [a.name for a in build_arms(args)]
    unknown = [a for a in args.arms if a not in known]
    if unknown:
      p.error(f"--arms: {','.join(unknown)} not among this run's arms ({','.join(known)})")
  if args.seeds < 1:
    p.error(f"--seeds: expected >= 1, got {args.seeds}")
  if args.aster_seeds < 0:
    p.error(f"--aster_seeds: expected >= 0, got {args.aster_seeds}")
  if args.eval_k < 1:
    p.error(f"--eval_k: expected >= 1, got {args.eval_k}")
  if not 0.0 <= args.tool_failure_rate <= 1.0:
    p.error(f"--tool_failure_rate: expected a probability in [0, 1], got {args.tool_failure_rate}")
  if args.sft_from:
    args.sft_from = os.path.abspath(args.sft_from)
    arm_list = build_arms(args)
    missing = sorted(
      {
        sft_source(arm_list, a.variant, "", args.sft_from)
        for a in arm_list
        if not os.path.isdir(
          os.path.join(sft_source(arm_list, a.variant, "", args.sft_from), "sft")
        )
      }
    )
    if os.path.abspath(args.out) == args.sft_from:
      p.error("--sft_from: expected another run's --out, got --out itself")
    if missing:
      p.error(f"--sft_from: no SFT model in {', '.join(missing)} (run those arms first)")
  if args.quick and not args.steps:
    args.steps = QUICK_STEPS
  if args.quick and not args.eval_problems:
    args.eval_problems = QUICK_EVAL_PROBLEMS
  if args.quick and args.curve_problems < 0:
    args.curve_problems = QUICK_CURVE_PROBLEMS
  return args


# --quick: one seed per arm, short RL, fewer held-out problems (x k = 4 samples each), sized by
# benchmarks/claims_probe.py's projection to about 30 minutes on 2 idle cores.
QUICK_STEPS = 8
QUICK_EVAL_PROBLEMS = 100
QUICK_CURVE_PROBLEMS = 24


def main(argv=None) -> None:
  args = parse_args(argv)
  emit = json_stdout.reserve(args.json)  # --json: stdout holds the JSON only
  try:
    out = run_claims(args)
  except StaleRecordError as e:
    sys.exit(f"claims: {e}")
  with open(out["table"], encoding="utf-8") as f:
    print(f.read(), flush=True)  # stderr under --json
  if args.json:
    emit(out, sort_keys=True)


if __name__ == "__main__":
  main()

"""Plots of a run's metrics (matplotlib, Agg backend). The demo imports this module only when
it writes a plot: matplotlib is an optional dependency and its import took 4.9-5.7 s on the
shared 2-core machine (2026-12-06)."""

from __future__ import annotations

import os

from rstar_jax.pipelines.metrics_log import read_jsonl_metrics


def plot_demo(workdir: str, summary: dict, path: str) -> None:
  """reward, held-out accuracy, tool calls / trajectory, tool-error ratios over RL steps."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = read_jsonl_metrics(os.path.join(workdir, "rl", "metrics.jsonl"))
  steps = [r["step"] for r in rows]
  fig, ax = plt.subplots(2, 2, figsize=(10, 7))
  ax[0, 0].plot(steps, [r.get("reward_mean") for r in rows], marker=".")
  ax[0, 0].set_title("mean reward of sampled rollouts")
  ev = [(r["step"], r["eval_accuracy"]) for r in rows if r.get("eval_accuracy") is not None]
  last = steps[-1] if steps else 1
  ax[0, 1].plot(
    [0] + [s for s, _ in ev],
    [summary["sft_eval_accuracy"]] + [a for _, a in ev],
    marker="o",
    label="held-out subset (in-loop)",
  )
  ax[0, 1].scatter(
    [0, last],
    [summary["sft_eval_accuracy"], summary["rl_eval_accuracy"]],
    color="red",
    zorder=3,
    label=f"full held-out ({summary['eval_problems']})",
  )
  ax[0, 1].set_title("held-out accuracy")
  ax[0, 1].legend(fontsize=8)
  ax[1, 0].plot(steps, [r.get("tool_calls_per_traj") for r in rows], marker=".")
  ax[1, 0].set_title("tool calls per trajectory")
  ax[1, 1].plot(steps, [r.get("tool_error_ratio") for r in rows], marker=".", label="all")
  ax[1, 1].plot(
    steps, [r.get("pos_tool_error_ratio") for r in rows], marker=".", label="positive trajectories"
  )
  ax[1, 1].set_title("tool-error ratio")
  ax[1, 1].legend(fontsize=8)
  for a in ax.flat:
    a.set_xlabel("RL step")
  fig.suptitle(
    f"rstar_jax CPU demo (roc_mode={summary.get('roc_mode')}): SFT "
    f"{summary['sft_eval_accuracy']:.3f} -> RL {summary['rl_eval_accuracy']:.3f}"
  )
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)

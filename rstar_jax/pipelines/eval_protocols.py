"""Named evaluation protocols and the per-problem CSV.

  released        the released rStar2-Agent AIME / MATH-500 scripts (microsoft/rStar
                  examples/aime_eval.sh): val_kwargs.n = 16, verl's validation sampling left at
                  its default (do_sample False, temperature 0: greedy), 5 assistant turns
                  (max_assistant_turns), 30,720 response tokens (data.max_response_length).
  paper_avg_at_k  the rStar2-Agent paper's avg@k: k = 16 samples at temperature 0.6, top-p 0.95,
                  up to 30 turns and 30,720 tokens; pass@1 averaged over the k samples.
Both report avg@k (mean correctness over all k samples of all problems) and pass@k (share of
problems solved at least once); `write_csv` writes one row per problem.
"""
from __future__ import annotations

import csv
import os
from typing import Any, Mapping

PROTOCOLS: dict[str, dict[str, Any]] = {
    "released": dict(k=16, temperature=0.0, top_p=1.0, max_turns=5, response_budget=30720),
    "paper_avg_at_k": dict(k=16, temperature=0.6, top_p=0.95, max_turns=30,
                           response_budget=30720),
}
FIELDS = ("k", "temperature", "top_p", "max_turns", "response_budget")


def resolve(eval_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The effective eval settings: the protocol's values when ``eval.protocol`` is set, else
    the config's own fields."""
    name = eval_cfg.get("protocol", "") or ""
    if name and name not in PROTOCOLS:
        raise ValueError(f"config.eval.protocol: expected one of {['', *PROTOCOLS]}, got {name!r}")
    base = {f: eval_cfg[f] for f in FIELDS}
    if name:
        base.update(PROTOCOLS[name])
    base["protocol"] = name
    return base


def write_csv(report: Mapping[str, Any], path: str | os.PathLike) -> None:
    """One row per problem: index, problem, answer, k, num_correct, avg_at_k, pass_at_k."""
    k = int(report["metrics"]["k"])
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["index", "problem", "answer", "k", "num_correct", "avg_at_k", "pass_at_k"])
        for i, row in enumerate(report["per_problem"]):
            n = int(row["num_correct"])
            w.writerow([i, row["problem"], row["answer"], k, n, n / k, int(n > 0)])

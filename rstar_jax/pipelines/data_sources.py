"""Where a run's problems, SFT items and tokenizer come from, decided by the config.

* Problems: ``data.train_path`` (JSONL, parquet or a local HF `datasets` directory, with
  ``data.format`` and the ``data.*_field`` column mapping: `rstar_jax.data.formats`) and
  ``eval.path`` (JSONL), or, when the path is empty and a
  ``data.synthetic`` section exists, the seeded tool-needing task generator
  (`rstar_jax.data.synthetic_tasks.make_splits`: disjoint train / held-out splits).
* SFT items: ``data.sft_path`` chats (same formats), or scripted tool-use chats built from synthetic
  problems (`scripted_tool_chats`: one code call whose output is the answer, then the boxed
  answer). The real interaction-dense cold start is built by the demo with the code pool.
* Tokenizer: ``model.tokenizer_dir`` or ``model.hf_dir``; a from-scratch model without either
  gets a byte-level BPE trained on the run's own texts, saved under ``<workdir>/tokenizer`` and
  reused on resume.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from rstar_jax.config import RunConfig
from rstar_jax.data import formats, synthetic_tasks
from rstar_jax.data.eval_sets import load_eval_problems
from rstar_jax.data.problems import Problem
from rstar_jax.data.sft_data import ChatExample
from rstar_jax.distributed import primary
from rstar_jax.rewards import math_reward
from rstar_jax.tokenization import bpe, chat_format
from rstar_jax.tools.code_pool import ExecResult
from rstar_jax.tools.render import render_tool_response


def _synthetic_splits(run: RunConfig) -> tuple[list[Problem], list[Problem]]:
  s = run.data.synthetic
  return synthetic_tasks.make_splits(
    s.seed, s.n_train, s.n_eval, families=list(s.families) or None, difficulty=s.difficulty or None
  )


def train_problems(run: RunConfig) -> list[Problem]:
  d = run.data
  if d.train_path:
    return formats.load_problem_set(
      d.train_path,
      fmt=d.format,
      question_field=d.question_field,
      answer_field=d.answer_field,
      split=d.split,
    )
  if run.data.synthetic is not None:
    return _synthetic_splits(run)[0]
  raise ValueError(
    "config.data.train_path: expected a problem file or datasets directory (or a data.synthetic section), got ''"
  )


def eval_problems(run: RunConfig) -> list[Problem]:
  if run.eval.path:
    probs = load_eval_problems(run.eval.path)  # MATH-500 / AIME layouts as published
  elif run.data.synthetic is not None:
    probs = _synthetic_splits(run)[1]
  else:
    return []
  cap = run.eval.max_problems
  return probs[:cap] if cap else probs


def scripted_tool_chats(
  problems: Sequence[Problem], max_response_chars: int = 1024
) -> list[ChatExample]:
  """One chat per problem with a reference ``solution_code``: the assistant calls the code tool
  with it, reads the (rendered) output and writes ``<answer>\\boxed{answer}</answer>``."""

  out = []
  for p in problems:
    if not p.solution_code:
      continue
    tool_text = render_tool_response(
      ExecResult(status="ok", stdout=p.answer + "\n", duration_s=0.01), max_response_chars
    )
    out.append(
      ChatExample(
        messages=(
          {"role": "user", "content": p.problem},
          {
            "role": "assistant",
            "content": "I will compute this with code.</reason>",
            "tool_calls": [
              {
                "function": {
                  "name": "execute_python_code_with_standard_io",
                  "arguments": {"code": p.solution_code, "input": ""},
                }
              }
            ],
          },
          {"role": "tool", "content": tool_text},
          {
            "role": "assistant",
            "content": f"The code printed {p.answer}.</reason><answer>\\boxed{{{p.answer}}}</answer>",
          },
        ),
        extra={"problem": p.problem, "answer": p.answer},
      )
    )
  return out


def sft_examples(run: RunConfig) -> list[ChatExample]:
  d = run.data
  if d.sft_path:
    return formats.load_chat_set(
      d.sft_path, fmt=d.format, messages_field=d.messages_field, split=d.split
    )
  if run.data.synthetic is not None:
    return scripted_tool_chats(_synthetic_splits(run)[0])
  raise ValueError(
    "config.data.sft_path: expected a chat file or datasets directory (or a data.synthetic section), got ''"
  )


def _content(message) -> str:
  """A chat message's text ('' for a content-less message, e.g. a pure tool call)."""
  return str(message.get("content", ""))


def tokenizer_corpus(problems: Sequence[Problem], chats: Sequence[ChatExample] = ()) -> list[str]:
  """Texts a from-scratch tokenizer is trained on: prompts, chats, digits and code idioms."""

  texts = [chat_format.prompt_text("rstar2", p.problem) for p in problems[:2000]]
  texts += [p.solution_code for p in problems[:2000] if p.solution_code]
  for c in chats[:2000]:
    texts += [_content(m) for m in c.messages]
  texts += [
    " ".join(str(i) for i in range(1000)),
    chat_format.tool_turn_text("rstar2", "Tool call success\nstdout: 0\nexecution time: 0.01s"),
  ]
  return texts


def ensure_tokenizer(run: RunConfig, workdir: str, corpus: Sequence[str] = ()):
  """The run's tokenizer (module docstring); trains and saves one for a from-scratch model."""

  path = run.tokenizer_dir()
  if path:
    return bpe.load_tokenizer(path)
  out = os.path.join(workdir, "tokenizer")
  have = os.path.isfile(os.path.join(out, "tokenizer.json"))
  if not have and not corpus:
    raise ValueError(
      "a from-scratch model with no model.tokenizer_dir needs a corpus to train its tokenizer"
    )

  # Every process passes the barrier exactly once, whatever it found on disk: deciding "the
  # file exists, no need to wait" per process raced with process 0's write (a slow process saw
  # the new file, skipped the barrier, and its next collective met process 0's barrier).
  tok = None
  if primary.is_primary() and not have:
    tok = bpe.train_bpe_tokenizer(corpus, run.model.vocab_size, out)
  primary.sync("ensure_tokenizer")
  return tok if tok is not None else bpe.load_tokenizer(out)


def _final_answer_ok(example: ChatExample) -> bool | None:
  """Whether the last assistant message's boxed answer equals ``extra['answer']``; None when
  the example carries no gold answer."""

  extra = example.extra or {}
  if "answer" not in extra or extra["answer"] is None:
    return None
  last = [m for m in example.messages if m["role"] == "assistant"][-1]
  pred = math_reward.extract_answer(_content(last), "answer_tag")
  return math_reward.is_equivalent(pred, str(extra["answer"]))


def select_interaction_dense(
  examples: Sequence[ChatExample],
  *,
  min_tool_calls: int,
  max_trajectories: int = 0,
  require_all_calls_ok: bool = True,
  require_correct: bool = True,
) -> tuple[list[ChatExample], dict]:
  """ASTER's cold-start selection (correct answer, every call succeeded, dense chats first).

  Keeps chats whose final answer matches the gold ``extra['answer']`` (when
  ``require_correct``; chats without a gold answer are dropped then), whose every tool
  response reports success (``Tool call success`` as rendered by `tools.render`, when
  ``require_all_calls_ok``) and that make at least ``min_tool_calls`` calls; then the densest
  ``max_trajectories`` (0 = all), ties kept in input order. Returns (kept, counts).
  """
  stats = {
    "candidates": len(examples),
    "dropped_incorrect": 0,
    "dropped_failed_call": 0,
    "dropped_sparse": 0,
  }
  ok = []
  for ex in examples:
    if require_correct and not _final_answer_ok(ex):
      stats["dropped_incorrect"] += 1
      continue
    tools = [_content(m) for m in ex.messages if m["role"] == "tool"]
    if require_all_calls_ok and not all(t.startswith("Tool call success") for t in tools):
      stats["dropped_failed_call"] += 1
      continue
    if len(tools) < min_tool_calls:
      stats["dropped_sparse"] += 1
      continue
    ok.append(ex)
  order = sorted(range(len(ok)), key=lambda i: -ok[i].num_tool_calls)
  if max_trajectories:
    order = sorted(order[:max_trajectories])
  kept = [ok[i] for i in order] if max_trajectories else ok
  stats["kept"] = len(kept)
  stats["mean_tool_calls_kept"] = (sum(e.num_tool_calls for e in kept) / len(kept)) if kept else 0.0
  return kept, stats


def load_tokenizer(path: str):
  """The policy's tokenizer from a directory (tokenizer.json + config) via transformers."""
  if not path:
    raise ValueError(
      "tokenizer: config.model.tokenizer_dir and model.hf_dir are both empty; "
      "a from-scratch model needs a tokenizer directory"
    )
  return bpe.load_tokenizer(path)


def check_vocab(tokenizer, model_config) -> None:
  """Every tokenizer id must index the embedding table (``model_config``: a `Qwen3Config`)."""
  n = len(tokenizer)
  if n > model_config.vocab_size:
    raise ValueError(
      f"tokenizer has {n} tokens but the model's vocab_size is "
      f"{model_config.vocab_size} (config.model.vocab_size)"
    )

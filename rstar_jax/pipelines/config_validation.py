"""Validation of run configs (``ml_collections.ConfigDict``) before anything starts.

Every error names the field by its dotted path, what was expected and what was found, e.g.
``config.rl.group_size: expected an int >= 1, got 0``. All problems are collected and reported
together, so one run of a launcher shows every typo at once.

The schema mirrors ``configs/common.py``; recipe files only override values. Sections a mode
does not use are not required (an SFT config has no ``stages``; an eval config needs no
``optim``).
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterable, Mapping

import ml_collections

MODES = ("rl", "sft", "eval")
ROC_MODES = ("paper", "released", "random")
P_ERR_MODES = ("paper", "released")
P_FORMAT_MODES = ("paper", "released")
LOSS_AGG = ("token-mean", "seq-mean", "seq-mean-token-mean", "seq-mean-token-sum")
ENGINES = ("jax", "sglang")
SCHEDULES = ("constant", "cosine")
DTYPES = ("float32", "bfloat16")
STAGE_DATA = ("full", "hard")


class ConfigError(ValueError):
  """A config value is missing or wrong; ``problems`` lists every (path, message) found."""

  def __init__(self, problems: list[tuple[str, str]]):
    self.problems = problems
    lines = [f"config.{path}: {msg}" for path, msg in problems]
    super().__init__("invalid config:\n  " + "\n  ".join(lines))


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
  return (isinstance(v, (int, float)) and not isinstance(v, bool)
          and math.isfinite(float(v)))


# A check returns None when fine, else the "expected ..." text.
Check = Callable[[Any], "str | None"]


def int_range(lo: int | None = None, hi: int | None = None) -> Check:
  def check(v):
    if not _is_int(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
      bounds = [f">= {lo}" if lo is not None else "", f"<= {hi}" if hi is not None else ""]
      return "an int " + " and ".join(b for b in bounds if b)
    return None
  return check


def num_range(lo: float | None = None, hi: float | None = None, *, lo_open=False,
              hi_open=False) -> Check:
  def check(v):
    if not _is_num(v):
      return "a finite number"
    x = float(v)
    bad = (lo is not None and (x <= lo if lo_open else x < lo)) or \
          (hi is not None and (x >= hi if hi_open else x > hi))
    if bad:
      parts = []
      if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo}")
      if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi}")
      return "a number " + " and ".join(parts)
    return None
  return check


def one_of(choices: Iterable[Any]) -> Check:
  choices = tuple(choices)
  return lambda v: None if v in choices else f"one of {list(choices)}"


def is_bool(v) -> str | None:
  return None if isinstance(v, bool) else "a bool"


def is_str(v) -> str | None:
  return None if isinstance(v, str) else "a string"


def str_list(v) -> str | None:
  ok = isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v)
  return None if ok else "a list of strings"


SCHEMA: dict[str, dict[str, Check]] = {
    "model": {
        "hf_dir": is_str,
        "vocab_size": int_range(2), "hidden_size": int_range(1),
        "intermediate_size": int_range(1), "num_hidden_layers": int_range(1),
        "num_attention_heads": int_range(1), "num_key_value_heads": int_range(1),
        "head_dim": int_range(1), "rope_theta": num_range(0, lo_open=True),
        "max_position_embeddings": int_range(2), "tie_word_embeddings": is_bool,
        "param_dtype": one_of(DTYPES), "dtype": one_of(DTYPES), "remat": is_bool,
        "attention": one_of(("xla", "blockwise", "fused")), "attention_block_size": int_range(1),
    },
    "mesh": {"data": int_range(-1), "fsdp": int_range(-1), "tensor": int_range(-1)},
    "optim": {
        "lr": num_range(0, lo_open=True), "warmup_steps": int_range(0),
        "schedule": one_of(SCHEDULES), "total_steps": int_range(0),
        "b1": num_range(0, 1, hi_open=True), "b2": num_range(0, 1, hi_open=True),
        "eps": num_range(0, lo_open=True), "weight_decay": num_range(0),
        "grad_clip": num_range(0),
    },
    "rl": {
        "group_size": int_range(1), "oversample": int_range(1), "roc_mode": one_of(ROC_MODES),
        "min_pos": int_range(0), "min_neg": int_range(0), "roc_eps": num_range(0, lo_open=True),
        "drop_zero_variance": is_bool, "p_err_mode": one_of(P_ERR_MODES),
        "p_format_mode": one_of(P_FORMAT_MODES), "adv_eps": num_range(0, lo_open=True),
        "unbiased_std": is_bool, "eps_low": num_range(0, 1, hi_open=True),
        "eps_high": num_range(0), "dual_clip_c": num_range(0), "kl_coef": num_range(0),
        "entropy_coef": num_range(0), "loss_agg": one_of(LOSS_AGG),
        "recompute_old_logprobs": is_bool,
    },
    "rollout": {
        "engine": one_of(ENGINES), "sglang_urls": str_list, "staging_dir": is_str,
        "temperature": num_range(0), "top_p": num_range(0, 1, lo_open=True),
        "top_k": int_range(-1), "max_prompt_tokens": int_range(1),
        "response_budget": int_range(1), "max_turns": int_range(1),
        "max_parallel_calls": int_range(0), "max_tool_calls": int_range(0),
        "max_batch": int_range(1),
    },
    "tool": {
        "num_workers": int_range(1), "timeout_s": num_range(0, lo_open=True),
        "memory_limit_mb": int_range(16), "max_response_chars": int_range(16),
        "stateful": is_bool,
    },
    "train": {
        "seed": int_range(0), "batch_prompts": int_range(1), "micro_batches": int_range(1),
        "checkpoint_every": int_range(0), "keep_checkpoints": int_range(1),
        "log_every": int_range(1), "eval_every": int_range(0),
    },
    "eval": {
        "path": is_str, "k": int_range(1), "temperature": num_range(0),
        "top_p": num_range(0, 1, lo_open=True), "max_turns": int_range(1),
        "response_budget": int_range(1),
    },
    "sft": {
        "epochs": num_range(0, lo_open=True), "warmup_ratio": num_range(0, 1),
        "batch_size": int_range(1), "max_seq_len": int_range(2),
    },
    "data": {},
}

STAGE_SCHEMA: dict[str, Check] = {
    "name": is_str, "steps": int_range(1), "response_budget": int_range(1),
    "max_turns": int_range(1), "data": one_of(STAGE_DATA), "reset_optimizer": is_bool,
    "drop_solved_k_of_k": int_range(0),
}

# Sections each mode needs (others are checked only if present).
REQUIRED = {
    "rl": ("model", "mesh", "optim", "rl", "rollout", "tool", "train", "eval", "data"),
    "sft": ("model", "mesh", "optim", "train", "data", "sft"),
    "eval": ("model", "mesh", "rollout", "tool", "eval"),
}


def _get(section, name):
  if isinstance(section, Mapping):
    return section[name] if name in section else _MISSING
  return getattr(section, name, _MISSING)


_MISSING = object()


def _keys(section) -> list[str]:
  if isinstance(section, ml_collections.ConfigDict):
    return list(section.keys())
  if isinstance(section, Mapping):
    return list(section.keys())
  return []


def _got(v) -> str:
  return f"{v!r} ({type(v).__name__})"


def validate_config(config: ml_collections.ConfigDict, mode: str | None = None,
                    *, check_paths: bool = False) -> ml_collections.ConfigDict:
  """Checks ``config`` for ``mode`` ("rl" | "sft" | "eval"; default ``config.mode``).

  Unknown keys in a known section are reported too (a typo such as ``rl.grup_size`` would
  otherwise silently keep the default). With ``check_paths`` the data files the mode reads
  must exist. Returns ``config`` unchanged; raises `ConfigError` listing every problem.
  """
  problems: list[tuple[str, str]] = []
  if mode is None:
    mode = _get(config, "mode")
    if mode is _MISSING:
      raise ConfigError([("mode", f"expected one of {list(MODES)}, got nothing (field missing)")])
  if mode not in MODES:
    raise ConfigError([("mode", f"expected one of {list(MODES)}, got {_got(mode)}")])

  for name, fields in SCHEMA.items():
    section = _get(config, name)
    if section is _MISSING:
      if name in REQUIRED[mode]:
        problems.append((name, "expected a config section, got nothing (section missing)"))
      continue
    for field, check in fields.items():
      v = _get(section, field)
      if v is _MISSING:
        if name in REQUIRED[mode]:
          problems.append((f"{name}.{field}", "expected a value, got nothing (field missing)"))
        continue
      want = check(v)
      if want is not None:
        problems.append((f"{name}.{field}", f"expected {want}, got {_got(v)}"))
    if fields:
      optional = OPTIONAL.get(name, {})
      known = set(fields) | set(optional)
      for extra in _keys(section):
        if extra not in known:
          problems.append((f"{name}.{extra}", f"unknown field (known: {sorted(known)})"))
        elif extra in optional:
          want = optional[extra](_get(section, extra))
          if want is not None:
            problems.append((f"{name}.{extra}",
                             f"expected {want}, got {_got(_get(section, extra))}"))

  problems += _cross_checks(config, mode, check_paths)
  if problems:
    raise ConfigError(problems)
  return config


# Optional fields (checked when present; older configs may lack them).
OPTIONAL: dict[str, dict[str, Check]] = {
    "model": {"tokenizer_dir": is_str, "rms_norm_eps": num_range(0, lo_open=True)},
    "mesh": {"num_devices": int_range(0)},
    "rl": {"answer_mode": one_of(("answer_tag", "anywhere")), "max_step_retries": int_range(0), "hard_subset_max_problems": int_range(0),
           "collapse_window": int_range(1), "ppo_mini_batches": int_range(1),
           "ppo_epochs": int_range(1), "neg_adv_scale": num_range(0, 1)},
    "rollout": {"decode_chunk": int_range(1), "max_len": int_range(0)},
    "train": {"progress_every_s": num_range(0), "length_bucket": int_range(2),
              "pack_rows": is_bool},
    "eval": {"seed": int_range(0), "max_problems": int_range(0)},
    "sft": {"shuffle": is_bool, "log_every_s": num_range(0)},
}


def _cross_checks(config, mode, check_paths) -> list[tuple[str, str]]:
  out: list[tuple[str, str]] = []
  mesh = _get(config, "mesh")
  if mesh is not _MISSING:
    sizes = [_get(mesh, k) for k in ("data", "fsdp", "tensor")]
    if all(_is_int(s) for s in sizes):
      if sum(1 for s in sizes if s == -1) > 1:
        out.append(("mesh", f"expected at most one axis = -1, got {sizes}"))
      if any(s == 0 for s in sizes):
        out.append(("mesh", f"expected axis sizes >= 1 or -1, got {sizes}"))
  model = _get(config, "model")
  if model is not _MISSING:
    h, kv = _get(model, "num_attention_heads"), _get(model, "num_key_value_heads")
    if _is_int(h) and _is_int(kv) and kv > 0 and h % kv:
      out.append(("model.num_key_value_heads",
                  f"expected a divisor of num_attention_heads={h}, got {kv}"))
  optim = _get(config, "optim")
  if optim is not _MISSING and _get(optim, "schedule") == "cosine" and mode == "rl":
    tot, warm = _get(optim, "total_steps"), _get(optim, "warmup_steps")
    if _is_int(tot) and _is_int(warm) and tot <= warm:
      out.append(("optim.total_steps",
                  f"expected > warmup_steps ({warm}) for a cosine schedule, got {tot}"))
  rl = _get(config, "rl")
  if mode == "rl" and rl is not _MISSING:
    g, mp, mn = _get(rl, "group_size"), _get(rl, "min_pos"), _get(rl, "min_neg")
    if _is_int(g) and _is_int(mp) and _is_int(mn) and mp + mn > g:
      out.append(("rl.min_pos", f"expected min_pos + min_neg <= group_size={g}, got "
                                f"{mp} + {mn}"))
    kl = _get(rl, "kl_coef")
    if _is_num(kl) and kl != 0:
      out.append(("rl.kl_coef", f"expected 0 (no reference-policy KL term is implemented; "
                                f"the paper uses none), got {kl!r}"))
    dc = _get(rl, "dual_clip_c")
    if _is_num(dc) and 0 < dc <= 1:
      out.append(("rl.dual_clip_c", f"expected 0 (off) or a value > 1, got {dc!r}"))
    if _is_int(g) and g < 2:
      out.append(("rl.group_size", f"expected >= 2 for GRPO (advantages need a group), got {g}"))
  if mode == "rl":
    stages = _get(config, "stages")
    if stages is _MISSING or not isinstance(stages, (list, tuple)) or not stages:
      out.append(("stages", f"expected a non-empty list of stages, got "
                            f"{'nothing' if stages is _MISSING else _got(stages)}"))
    else:
      for i, st in enumerate(stages):
        if not isinstance(st, (Mapping, ml_collections.ConfigDict)):
          out.append((f"stages[{i}]", f"expected a stage dict, got {_got(st)}"))
          continue
        for field, check in STAGE_SCHEMA.items():
          v = _get(st, field)
          if v is _MISSING:
            out.append((f"stages[{i}].{field}", "expected a value, got nothing (field missing)"))
            continue
          want = check(v)
          if want is not None:
            out.append((f"stages[{i}].{field}", f"expected {want}, got {_got(v)}"))
        for extra in _keys(st):
          if extra not in STAGE_SCHEMA:
            out.append((f"stages[{i}].{extra}",
                        f"unknown field (known: {sorted(STAGE_SCHEMA)})"))
        if _get(st, "data") == "hard" and _get(st, "drop_solved_k_of_k") in (0, _MISSING):
          out.append((f"stages[{i}].drop_solved_k_of_k",
                      "expected k >= 1 for a stage with data='hard', got 0"))
    data = _get(config, "data")
    if data is not _MISSING:
      tp = _get(data, "train_path")
      if tp == "" and _get(data, "synthetic") is not _MISSING:
        pass   # problems generated from data.synthetic
      elif tp is _MISSING or not isinstance(tp, str) or not tp:
        out.append(("data.train_path", f"expected a JSONL problem file path, got "
                                       f"{'nothing' if tp is _MISSING else _got(tp)}"))
      elif check_paths and not os.path.isfile(tp):
        out.append(("data.train_path", f"expected an existing file, got {tp!r} (not found)"))
  if mode == "sft":
    data = _get(config, "data")
    if data is not _MISSING:
      sp = _get(data, "sft_path")
      if sp == "" and _get(data, "synthetic") is not _MISSING:
        pass   # scripted tool chats built from data.synthetic
      elif sp is _MISSING or not isinstance(sp, str) or not sp:
        out.append(("data.sft_path", f"expected a chat-trajectory JSONL path, got "
                                     f"{'nothing' if sp is _MISSING else _got(sp)}"))
      elif check_paths and not os.path.isfile(sp):
        out.append(("data.sft_path", f"expected an existing file, got {sp!r} (not found)"))
  if mode == "eval":
    ev = _get(config, "eval")
    data = _get(config, "data")
    synthetic = data is not _MISSING and _get(data, "synthetic") is not _MISSING
    if ev is not _MISSING and check_paths and not (_get(ev, "path") == "" and synthetic):
      p = _get(ev, "path")
      if not isinstance(p, str) or not os.path.isfile(p):
        out.append(("eval.path", f"expected an existing JSONL problem file, got {p!r}"))
  rollout = _get(config, "rollout")
  if rollout is not _MISSING and mode in ("rl", "eval"):
    if _get(rollout, "engine") == "sglang" and not _get(rollout, "sglang_urls"):
      out.append(("rollout.sglang_urls", "expected at least one URL for engine='sglang', "
                                         "got []"))
  return out

"""Bytes of the embedded JaxSampler's KV cache for a run: what `rstar_jax.planning.fit` adds to
the learner's plan and what the launchers check against the device before any work
(`rstar_jax.cli.check_kv_cache`). jax-free: the launchers run it before jax starts."""

from __future__ import annotations

from rstar_jax.config import eval_protocols


def kv_cache_bytes(run, model_config) -> tuple[int, int]:
  """(bytes, max_len) of the embedded JaxSampler's KV cache for ``run``: ``rollout.max_batch``
  slots x ``max_len`` positions (``rollout.max_len``, else the next power of two >= the longest
  prompt + response budget of the stages and the eval, as the sampler sizes it) x K and V x
  layers x KV heads x head_dim in the model's compute dtype."""

  r = run.rollout
  budgets = [r.response_budget, eval_protocols.resolve_with_notes(run.eval)[0].response_budget]
  budgets += [st.response_budget for st in run.stages]
  need = r.max_prompt_tokens + max(budgets)
  max_len = r.max_len or max(64, 1 << (need - 1).bit_length())
  c = model_config
  itemsize = 2 if c.dtype in ("bfloat16", "float16") else 4
  per_pos = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * itemsize
  return r.max_batch * max_len * per_pos, max_len

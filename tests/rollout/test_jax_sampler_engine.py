"""JaxSampler's engine structure: compiled HLO (no conditionals, known trip counts), one
dispatch per decode chunk, no recompilation across varied requests, dispatch/read overlap,
the token-budget paged cache, and multi-turn prefix reuse under ``trajectory_lease``.

A tiny random Qwen3 built with ``qwen3.init_params`` (nothing downloaded).
"""

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import rstar_jax
from rstar_jax.models import qwen3
from rstar_jax.rollout.jax_sampler import JaxSampler
from rstar_jax.rollout.types import GenerateRequest, SamplingParams

CFG = qwen3.Qwen3Config(
  vocab_size=128,
  hidden_size=32,
  intermediate_size=64,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=8,
)
# (temperature, top_k, top_p): one request per static sampling variant.
VARIANT_SETTINGS = [(0.0, -1, 1.0), (1.0, -1, 1.0), (1.0, 5, 1.0), (0.9, -1, 0.9), (1.2, 5, 0.9)]
# The child imports the same rstar_jax as this process (whichever checkout is on the path).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(rstar_jax.__file__)))


@pytest.fixture(scope="module")
def params():
  p = qwen3.init_params(CFG, jax.random.key(0))
  # Sharper logits than the 0.02 init, so greedy paths differ between prompts.
  return jax.tree.map(lambda x: x * 5 if x.ndim == 2 else x, p)


def _gen(eng, reqs):
  return asyncio.run(eng.generate(reqs))


def _req(prompt, n, t=0.0, k=-1, p=1.0, seed=1, **kw):
  return GenerateRequest(
    list(prompt), SamplingParams(n, temperature=t, top_k=k, top_p=p, seed=seed, **kw)
  )


# Run in a child process with XLA's own module dump, so nothing the sampler compiles is
# missed: warm-up over every sampling variant x attention window x prefill shape, then 100
# calls with random fill, lengths, settings and stop ids.
_STRUCTURE_SCRIPT = """
import asyncio, json, sys
import jax, numpy as np
from rstar_jax.models import qwen3
from rstar_jax.rollout.jax_sampler import JaxSampler
from rstar_jax.rollout.types import GenerateRequest, SamplingParams
cfg = qwen3.{cfg!r}
eng = JaxSampler(cfg, qwen3.init_params(cfg, jax.random.key(0)), max_batch=2, max_len=16,
                 page_size=8, decode_chunk=4, prefill_buckets=(16,))
def req(n_prompt, n, t=0.0, k=-1, p=1.0, seed=1, stop=()):
  sp = SamplingParams(n, temperature=t, top_k=k, top_p=p, seed=seed, stop_token_ids=stop)
  return GenerateRequest([1 + i % 100 for i in range(n_prompt)], sp)
def gen(reqs):
  asyncio.run(eng.generate(reqs))
for t, k, p in {variants!r}:
  gen([req(1, 15, t, k, p)])  # decode windows of 1 and 2 pages
for a, b in ((4, 0), (12, 0), (4, 3), (12, 3)):  # prefill: 1 / 2 rows x 1 / 2 pages
  gen([req(a, 1)] + ([req(b, 1)] if b else []))
warm = dict(eng.compile_counts)
rng = np.random.default_rng(0)
for _ in range(100):
  reqs = []
  for _ in range(int(rng.integers(1, 4))):
    n_prompt = int(rng.integers(1, 11))
    t, k, p = {variants!r}[int(rng.integers(5))]
    stop = tuple(int(x) for x in rng.integers(0, cfg.vocab_size, 6))
    n = int(rng.integers(1, 16 - n_prompt + 1))
    reqs.append(req(n_prompt, n, t, k, p, int(rng.integers(1 << 30)), stop))
  gen(reqs)
print(json.dumps({{"warm": warm, "after": dict(eng.compile_counts)}}))
"""


def test_compiled_modules_have_no_conditional_known_trip_counts_and_never_recompile(tmp_path):
  script = _STRUCTURE_SCRIPT.format(cfg=CFG, variants=VARIANT_SETTINGS)
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    PYTHONPATH=ROOT,
    XLA_FLAGS=f"--xla_dump_to={tmp_path} --xla_dump_hlo_as_text",
  )
  # XLA writes the dump when it compiles: a persistent-cache hit (tests/conftest.py) would
  # load the program without compiling it, and dump nothing. And the structure checked is that
  # of the program users get: XLA's default optimizations, not the tests' quick compiles.
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
  out = subprocess.run(
    [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
  )
  assert out.returncode == 0, out.stderr[-2000:]
  counts = json.loads(out.stdout.strip().splitlines()[-1])
  # 5 sampling variants x 2 windows; prefill 2 row counts x 2 windows. Then nothing new.
  assert counts["warm"] == {"decode": 10, "prefill": 4}
  assert counts["after"] == counts["warm"]
  files = sorted(f for f in os.listdir(tmp_path) if f.endswith("after_optimizations.txt"))
  decode = [f for f in files if "_decode" in f]
  assert len(decode) == 10, files
  for f in files:
    text = (tmp_path / f).read_text()
    assert " conditional(" not in text, f"{f} has a conditional"
    whiles = [ln for ln in text.splitlines() if " while(" in ln]
    unknown = [ln for ln in whiles if "known_trip_count" not in ln]
    assert not unknown, f"{f}: while loop without a known trip count: {unknown[0][:200]}"
  # The decode chunk itself is one fixed-trip loop over its K = 4 steps.
  assert all('known_trip_count":{"n":"4"}' in (tmp_path / f).read_text() for f in decode)
  # Its steps attend over the chunk's window in place: no transpose or copy of a whole window
  # (B x W x Hkv x Dh, any order) inside the loop. Kept [B, W, Hkv, Dh], XLA transposed both
  # windows of every layer on every token (most of a batch-64 step on CPU; the same on ROCm).
  windows = [sorted((2, w, CFG.num_key_value_heads, CFG.head_dim)) for w in (8, 16)]
  for f in decode:
    for ln in (tmp_path / f).read_text().splitlines():
      if "while/body" not in ln or not (" transpose(" in ln or " copy(" in ln):
        continue
      shape = re.search(r"= \w+\[([\d,]*)\]", ln)
      dims = sorted(int(d) for d in shape.group(1).split(",")) if shape.group(1) else []
      assert dims not in windows, f"{f}: the decode loop copies a whole window: {ln[:160]}"
  # ... and each attention product takes the window as its right operand (G x Dh by Dh x W,
  # G x W by W x Dh per row and kv head). With the window on the left (W x Dh by Dh x G),
  # XLA:CPU's batched dot ran the batch-64 benchmark's attention at under half the speed.
  for f in decode:
    text = (tmp_path / f).read_text()
    dims_of = {
      m.group(1): sorted(int(d) for d in m.group(2).split(",") if d)
      for m in re.finditer(r"%([\w.-]+) = \w+\[([\d,]*)\]", text)
    }
    rhs = 0
    for ln in text.splitlines():
      m = re.search(r" dot\(%([\w.-]+), %([\w.-]+)\)", ln)
      if not m or "while/body" not in ln:
        continue
      assert dims_of[m.group(1)] not in windows, f"{f}: a window is a dot's left operand: {ln}"
      rhs += dims_of[m.group(2)] in windows
    assert rhs == 2 * CFG.num_hidden_layers, f"{f}: {rhs} attention dots over the window"


def test_one_dispatch_per_chunk_and_no_tail_chunk(params):
  eng = JaxSampler(CFG, params, max_batch=4, max_len=96, decode_chunk=16)
  res = _gen(eng, [_req([1, 2, 3], 64), _req([4, 5], 40), _req([6], 17)])
  assert [len(r.output_ids) for r in res] == [64, 40, 17]
  # 64 tokens at 16 per dispatch: 4 decode calls, all rows admitted in one prefill call.
  assert dict(eng.dispatch_counts) == {"prefill": 1, "decode": 4}


def test_dispatch_of_the_next_chunk_precedes_reading_the_previous(params):
  events = []

  class Traced(JaxSampler):
    def _dispatch(self):
      ok = super()._dispatch()
      if ok:
        events.append("dispatch")
      return ok

    def _read(self, chunk, finished):
      events.append("read")
      return super()._read(chunk, finished)

  eng = Traced(CFG, params, max_batch=2, max_len=64, decode_chunk=4)
  res = _gen(eng, [_req([1, 2, 3], 12)])[0]
  assert len(res.output_ids) == 12
  assert events == ["dispatch", "dispatch", "read", "dispatch", "read", "read"]


def test_token_budget_smaller_than_slots_times_max_len(params):
  """4 slots x 64 positions would be 256 tokens; 96 hold two 40-token requests at a time:
  the others wait for pages, and every result equals the request run alone."""
  reqs = [_req(np.arange(1, 11) + i, 30, seed=i) for i in range(5)]
  alone = JaxSampler(CFG, params, max_batch=1, max_len=64)
  ref = [_gen(alone, [r])[0].output_ids for r in reqs]
  eng = JaxSampler(CFG, params, max_batch=4, max_len=64, kv_budget_tokens=96, page_size=8)
  assert [r.output_ids for r in _gen(eng, reqs)] == ref
  assert eng.free_pages == 12


def test_cache_that_cannot_fit_fails_before_allocating(params):
  with pytest.raises(ValueError, match=r"kv_budget_tokens=.* needs .* GiB"):
    JaxSampler(CFG, params, kv_budget_tokens=10**13)
  with pytest.raises(ValueError, match="max_len=64 exceeds kv_budget_tokens=32"):
    JaxSampler(CFG, params, max_len=64, kv_budget_tokens=32)
  eng = JaxSampler(CFG, params, max_len=16)
  with pytest.raises(ValueError, match="exceeds max_len=16"):
    _gen(eng, [_req([1] * 10, 7)])


async def _conversation_async(eng, turns, seed, tid=None, before=None, after=None):
  """A multi-turn agent-style conversation: each turn appends the model's output and a
  random 'tool response'. ``before(t, seed)`` / ``after()`` (async) bracket each turn, for
  tests that fix the order of turns across trajectories. Returns (outputs, logprobs,
  inputs)."""
  rng = np.random.default_rng(seed)
  ids = list(rng.integers(0, CFG.vocab_size, 7))
  outs, lps, inputs = [], [], []
  lease = eng.trajectory_lease(tid, 512) if tid is not None else contextlib.nullcontext()
  async with lease:
    for t in range(turns):
      inputs.append(list(ids))
      if before is not None:
        await before(t, seed)
      res = (await eng.generate([_req(ids, 6, t=0.7, seed=seed * 100 + t)]))[0]
      if after is not None:
        await after()
      outs.append(res.output_ids)
      lps.append(res.logprobs)
      ids.extend(res.output_ids)
      ids.extend(int(x) for x in rng.integers(0, CFG.vocab_size, int(rng.integers(2, 6))))
      await asyncio.sleep(0)  # a tool call: other trajectories run meanwhile
  return outs, lps, inputs


def _conversation(eng, turns, seed, tid=None):
  return asyncio.run(_conversation_async(eng, turns, seed, tid))


def _new_tokens(inputs, outs):
  """Tokens a conversation prefills when every turn reuses the previous turn's cache: the
  first prompt, then per turn its tool tokens plus the previous turn's last output token
  (sampled, never fed back)."""
  return len(inputs[0]) + sum(
    len(inputs[t]) - len(inputs[t - 1]) - len(outs[t - 1]) + 1 for t in range(1, len(inputs))
  )


def test_ten_turn_conversation_prefills_only_new_tokens(params):
  plain = JaxSampler(CFG, params, max_batch=1, max_len=128, page_size=32)
  ref_out, ref_lp, inputs = _conversation(plain, 10, seed=3)
  eng = JaxSampler(CFG, params, max_batch=1, max_len=128, kv_budget_tokens=256, page_size=32)
  out, lp, inputs2 = _conversation(eng, 10, seed=3, tid="traj-a")
  assert out == ref_out and inputs2 == inputs
  np.testing.assert_allclose(np.concatenate(lp), np.concatenate(ref_lp), atol=1e-4)
  # Without reuse it would be the sum of all inputs.
  new = _new_tokens(inputs, out)
  assert eng.prefill_tokens["traj-a"] == new < sum(len(x) for x in inputs) // 3
  assert eng.free_pages == 256 // 32  # the lease's pages came back on exit


def test_kept_prefixes_are_evicted_when_admission_needs_room(params):
  """Three trajectories take turns (strict round robin, so the schedule does not depend on
  timing) in a budget too small to keep every prefix: admissions evict other trajectories'
  kept pages (a full prefill for them later) and every output stays exact."""
  plain = JaxSampler(CFG, params, max_batch=2, max_len=64)
  ref = [_conversation(plain, 4, seed=s)[0] for s in (5, 6, 7)]
  eng = JaxSampler(CFG, params, max_batch=2, max_len=64, kv_budget_tokens=80, page_size=16)
  order = [(t, s) for t in range(4) for s in (5, 6, 7)]

  async def main():
    turn = asyncio.Condition()
    at = [0]

    async def wait_turn(t, s):
      async with turn:
        await turn.wait_for(lambda: order[at[0]] == (t, s))

    async def done_turn():
      async with turn:
        at[0] += 1
        turn.notify_all()

    return await asyncio.gather(
      *(
        _conversation_async(eng, 4, s, tid=f"t{s}", before=wait_turn, after=done_turn)
        for s in (5, 6, 7)
      )
    )

  runs = asyncio.run(main())
  assert [r[0] for r in runs] == ref
  # 5 pages for three growing prefixes: from the second round on, admissions need pages the
  # other two trajectories keep (5 evictions with this order; a timing-dependent schedule
  # once made it 0 on a slower machine). An evicted trajectory prefills its whole prompt again.
  assert eng.evictions >= 3, eng.evictions
  assert sum(eng.prefill_tokens.values()) > sum(_new_tokens(r[2], r[0]) for r in runs)
  assert eng.free_pages == 80 // 16  # every lease's pages came back


def _scripted_model(vocab, successor):
  """A 1-layer Qwen3 whose next token is ``successor[current]`` by a logit margin of ~60
  (one-hot-like embeddings read back by the LM head), so the agent loop sees tool calls;
  the attention and MLP keep their random init, so the logprobs still depend on the cache."""
  cfg = qwen3.Qwen3Config(
    vocab_size=vocab,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    tie_word_embeddings=False,
  )
  p = qwen3.init_params(cfg, jax.random.key(2))
  emb = np.random.default_rng(0).normal(size=(vocab, 64)).astype(np.float32)
  head = np.zeros((64, vocab), np.float32)
  for a, b in successor.items():
    head[:, b] += emb[a]
  p["embed_tokens"]["embedding"] = jax.numpy.asarray(emb)
  p["lm_head"]["kernel"] = jax.numpy.asarray(head)
  return cfg, p


def test_agent_loop_ten_turns_prefill_only_new_tokens_through_the_lease_hook(tokenizer):
  """The real agent loop (``run_trajectory``) over 10 tool turns: under its
  ``trajectory_lease`` hook each turn prefills only the appended tool-turn tokens, and the
  trajectory equals one run by an engine without the hook (full re-prefill every turn)."""
  from rollout_helpers import FakePool

  from rstar_jax.rollout.agent_loop import RolloutSettings, run_trajectory
  from rstar_jax.tokenization import chat_format as cf

  loop_cfg = RolloutSettings(max_turns=10, response_budget=1400, seed=0)
  fmt = cf.get_format(loop_cfg.chat_format)
  prompt = cf.prompt_ids(tokenizer, fmt, "q0")
  tool_turn = cf.tool_turn_ids(tokenizer, fmt, ["x"])  # ends like the prompt
  call_open, call_close = (
    tokenizer.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>")
  )
  stop = cf.stop_token_id(tokenizer)
  body = tokenizer.encode("{", add_special_tokens=False)[0]
  # Each assistant turn is "<tool_call>{</tool_call><|im_end|>" (a call whose JSON does not
  # parse: the loop answers it with a parse_error tool turn and goes on).
  assert prompt[-1] == tool_turn[-1]
  cfg, params = _scripted_model(
    len(tokenizer), {prompt[-1]: call_open, call_open: body, body: call_close, call_close: stop}
  )

  class NoLease:  # the same engine without the hook
    def __init__(self, eng):
      self.generate = eng.generate

  kw = dict(max_batch=1, max_len=2048, page_size=16, decode_chunk=4)
  ref_engine = JaxSampler(cfg, params, **kw)
  eng = JaxSampler(cfg, params, **kw)

  async def run(engine):
    return await run_trajectory(
      engine, tokenizer, FakePool(), "q0", loop_cfg, trajectory_id="traj-0"
    )

  ref = asyncio.run(run(NoLease(ref_engine)))
  got = asyncio.run(run(eng))
  assert got.num_turns == 10 and got.finish_reason == "max_turns"
  assert [c.status for c in got.tool_calls] == ["parse_error"] * 9
  assert got.response_ids == ref.response_ids
  np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-5)
  # Turn 1 prefills the prompt; each later turn its tool-turn tokens plus the previous turn's
  # last sampled token (never fed back inside the turn that sampled it).
  mask = np.asarray(got.loss_mask)
  starts = np.flatnonzero(np.diff(np.concatenate([[1], mask])) == -1)  # tool turns begin
  tool_lens = [int(np.argmax(mask[s:] == 1)) for s in starts]
  assert len(tool_lens) == 9 and mask.sum() == 40
  new_tokens = len(prompt) + sum(n + 1 for n in tool_lens)
  turn_inputs = [len(prompt)] + [len(prompt) + s + n for s, n in zip(starts, tool_lens)]
  assert eng.prefill_tokens["traj-0"] == new_tokens
  assert got.prefill_tokens == new_tokens  # the trajectory carries the engine's count
  assert ref.prefill_tokens == sum(turn_inputs)  # without the lease every turn re-prefills
  assert sum(turn_inputs) > 5 * new_tokens  # what re-prefilling every turn costs
  assert eng.free_pages == 2048 // 16

"""JaxSampler against transformers and against itself (batching, seeds, stops, compile counts).

One tiny random Qwen3 (float32) is built with transformers, saved, and loaded with
``qwen3.load_hf_params``; one sampler is shared by most tests so its compiled functions are
reused (compile counts are checked as deltas).
"""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.models import qwen3
from rstar_jax.rollout.jax_sampler import JaxSampler
from rstar_jax.rollout.types import GenerateRequest, SamplingParams

VOCAB = 256
MAX_LEN = 64


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  import torch
  import transformers

  torch.manual_seed(0)
  cfg = transformers.Qwen3Config(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    initializer_range=0.1,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
  )
  model = transformers.Qwen3ForCausalLM(cfg).eval()
  out = tmp_path_factory.mktemp("tiny_qwen3")
  model.save_pretrained(out)
  return out


@pytest.fixture(scope="module")
def hf_model(hf_dir):
  import transformers

  model = transformers.Qwen3ForCausalLM.from_pretrained(hf_dir, local_files_only=True).eval()
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  return model


@pytest.fixture(scope="module")
def model(hf_dir):
  config = qwen3.Qwen3Config.from_hf(hf_dir)
  return config, qwen3.load_hf_params(hf_dir, config)


@pytest.fixture(scope="module")
def word_tokenizer():
  """Real `tokenizers` word-level tokenizer: "w17 w3" <-> [17, 3]."""
  from tokenizers import Tokenizer, models, pre_tokenizers

  tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  return tok


@pytest.fixture(scope="module")
def sampler(model, word_tokenizer):
  config, params = model
  return JaxSampler(
    config,
    params,
    max_batch=4,
    max_len=MAX_LEN,
    prefill_buckets=(8, 16, 32),
    decode_chunk=4,
    seed=0,
    tokenizer=word_tokenizer,
  )


@pytest.fixture(scope="module")
def full_logprobs(model):
  config, params = model
  fwd = jax.jit(qwen3.forward, static_argnames="config")

  def run(ids, p=None):
    # Right-padded to one length (one compile); padding never changes earlier positions.
    padded = np.zeros((1, 2 * MAX_LEN), np.int32)
    padded[0, : len(ids)] = ids
    logits = fwd(
      params if p is None else p,
      config,
      jnp.asarray(padded),
      attention_mask=(jnp.arange(2 * MAX_LEN) < len(ids))[None],
    )
    return np.asarray(jax.nn.log_softmax(logits[0, : len(ids)], -1))

  return run


def _prompt(n, seed):
  return np.random.default_rng(seed).integers(1, VOCAB, n).tolist()


def _req(n_prompt, max_new, seed=None, prompt_seed=0, **kw):
  return GenerateRequest(
    input_ids=_prompt(n_prompt, prompt_seed),
    sampling=SamplingParams(max_new_tokens=max_new, seed=seed, **kw),
    rid=f"r{prompt_seed}",
  )


def _gen(sampler, reqs):
  return asyncio.run(sampler.generate(reqs))


def _check_logprobs(full_logprobs, req, res, params=None):
  ids = list(req.input_ids) + res.output_ids
  logp = full_logprobs(ids, params)
  n = len(req.input_ids)
  expected = [logp[n - 1 + i, t] for i, t in enumerate(res.output_ids)]
  np.testing.assert_allclose(res.logprobs, expected, atol=2e-4, rtol=1e-4)


def test_greedy_matches_transformers_generate_and_logprobs_match_full_forward(
  sampler, hf_model, full_logprobs
):
  import torch

  reqs = [_req(n, 14, temperature=0.0, prompt_seed=s) for s, n in enumerate((5, 11, 17))]
  results = _gen(sampler, reqs)
  for req, res in zip(reqs, results):
    with torch.no_grad():
      ref = hf_model.generate(
        torch.tensor([req.input_ids]), do_sample=False, max_new_tokens=14, min_new_tokens=14
      )
    assert res.output_ids == ref[0, len(req.input_ids) :].tolist()
    assert res.finish_reason == "length" and len(res.logprobs) == 14
    _check_logprobs(full_logprobs, req, res)


def test_fused_attention_engine_matches_transformers_generate(model, hf_model, full_logprobs):
  """The `fused` path (``jax.nn.dot_product_attention``; on CPU its XLA implementation) reads
  the same head-major page pool through a transposed gather: same tokens and logprobs."""
  import torch

  config, params = model
  eng = JaxSampler(
    config, params, max_batch=2, max_len=MAX_LEN, decode_chunk=4, attention="fused", seed=0
  )
  assert eng.attention == "fused"
  # Three requests on two slots, rows over several pages; the third is admitted into a freed
  # slot mid-run.
  reqs = [
    _req(n, m, temperature=0.0, prompt_seed=s)
    for s, (n, m) in enumerate(((5, 30), (21, 6), (7, 40)))
  ]
  for req, res in zip(reqs, _gen(eng, reqs)):
    with torch.no_grad():
      ref = hf_model.generate(
        torch.tensor([req.input_ids]),
        do_sample=False,
        max_new_tokens=req.sampling.max_new_tokens,
        min_new_tokens=req.sampling.max_new_tokens,
      )
    assert res.output_ids == ref[0, len(req.input_ids) :].tolist()
    _check_logprobs(full_logprobs, req, res)


def test_sampled_logprobs_are_raw_model_logprobs(sampler, full_logprobs):
  reqs = [
    _req(9, 12, seed=5, temperature=0.7, top_k=20, top_p=0.9, prompt_seed=3),
    _req(4, 10, seed=6, temperature=1.3, prompt_seed=4),
  ]
  for req, res in zip(reqs, _gen(sampler, reqs)):
    _check_logprobs(full_logprobs, req, res)


def test_top_k_top_p_restrict_the_sampled_tokens(sampler, full_logprobs):
  # top_k=1 must reproduce greedy whatever the seed and temperature; top_p tiny likewise.
  greedy = _gen(sampler, [_req(7, 12, temperature=0.0, prompt_seed=9)])[0].output_ids
  for kw in (dict(top_k=1, temperature=1.5), dict(top_p=1e-6, temperature=2.0)):
    out = _gen(sampler, [_req(7, 12, seed=s, prompt_seed=9, **kw) for s in range(3)])
    assert all(r.output_ids == greedy for r in out), kw
  # top_k=3: every sampled token is among the 3 most likely under the model at its position.
  req = _req(6, 16, seed=1, temperature=3.0, top_k=3, prompt_seed=10)
  res = _gen(sampler, [req])[0]
  logp = full_logprobs(list(req.input_ids) + res.output_ids)
  for i, t in enumerate(res.output_ids):
    top3 = np.argsort(-logp[len(req.input_ids) - 1 + i])[:3]
    assert t in top3


def test_seeded_sampling_reproducible_and_independent_of_batch_composition(sampler):
  target = _req(10, 20, seed=1234, temperature=1.0, top_p=0.95, prompt_seed=21)
  alone = _gen(sampler, [target])[0]
  again = _gen(sampler, [target])[0]
  others = [
    _req(3 + 4 * i, 5 + 3 * i, seed=i, temperature=0.9, prompt_seed=30 + i) for i in range(5)
  ]
  crowded = _gen(sampler, others[:2] + [target] + others[2:])[2]
  assert alone.output_ids == again.output_ids == crowded.output_ids
  np.testing.assert_allclose(crowded.logprobs, alone.logprobs, atol=1e-5)
  other_seed = _gen(
    sampler, [_req(10, 20, seed=4321, temperature=1.0, top_p=0.95, prompt_seed=21)]
  )[0]
  assert other_seed.output_ids != alone.output_ids


def test_continuous_batching_matches_one_at_a_time(sampler):
  reqs = []
  for i in range(9):  # more requests than the 4 slots; mixed prompt and output lengths
    greedy = i % 3 == 0
    reqs.append(
      _req(
        2 + 3 * i,
        3 + (7 * i) % 17,
        seed=None if greedy else 100 + i,
        temperature=0.0 if greedy else 1.0,
        top_k=-1 if greedy else 50,
        prompt_seed=50 + i,
      )
    )
  batched = _gen(sampler, reqs)
  for req, res in zip(reqs, batched):
    single = _gen(sampler, [req])[0]
    assert res.output_ids == single.output_ids, req.rid
    assert res.finish_reason == single.finish_reason == "length"
    assert len(res.output_ids) == req.sampling.max_new_tokens
    np.testing.assert_allclose(res.logprobs, single.logprobs, atol=1e-5)


def test_finished_slots_are_refilled_while_long_rows_continue(sampler):
  order = []

  async def one(name, req):
    await sampler.generate([req])
    order.append(name)

  async def main():
    long = _req(4, 40, temperature=0.0, prompt_seed=1)
    shorts = [_req(4, 3, temperature=0.0, prompt_seed=2 + i) for i in range(5)]
    await asyncio.gather(one("long", long), *(one(f"s{i}", r) for i, r in enumerate(shorts)))

  asyncio.run(main())
  # 4 slots: s3 and s4 can only start once a short row frees its slot; they finish before
  # "long" only if slots are refilled while "long" keeps decoding.
  assert order[-1] == "long", order


def test_stop_token_ids_and_stop_sequences(sampler):
  base = _req(8, 24, temperature=0.0, prompt_seed=77)
  ref = _gen(sampler, [base])[0].output_ids
  first = {}
  for i, t in enumerate(ref):
    first.setdefault(t, i)
  i_stop = next(i for i, t in enumerate(ref) if i >= 2 and first[t] == i)
  pairs = [tuple(ref[j : j + 2]) for j in range(len(ref) - 1)]
  j_seq = next(j for j in range(3, len(pairs)) if pairs.index(pairs[j]) == j)

  def with_(**kw):
    return GenerateRequest(base.input_ids, SamplingParams(max_new_tokens=24, temperature=0.0, **kw))

  by_id, by_seq, both, stops_first = _gen(
    sampler,
    [
      with_(stop_token_ids=(ref[i_stop], VOCAB - 1)),
      with_(stop=(pairs[j_seq],)),
      with_(stop_token_ids=(ref[i_stop],), stop=(pairs[j_seq],)),
      with_(stop_token_ids=(ref[0],)),
    ],
  )
  assert by_id.output_ids == ref[: i_stop + 1] and by_id.finish_reason == "stop"
  assert by_seq.output_ids == ref[: j_seq + 2] and by_seq.finish_reason == "stop"
  assert both.output_ids == ref[: min(i_stop + 1, j_seq + 2)]
  assert stops_first.output_ids == ref[:1] and stops_first.finish_reason == "stop"
  assert len(by_id.logprobs) == len(by_id.output_ids)


def test_stop_strings_use_the_tokenizer(sampler, model):
  prompt = _prompt(6, 5)
  ref = _gen(sampler, [GenerateRequest(prompt, SamplingParams(16, temperature=0.0))])[0]
  ref = ref.output_ids
  j = next(j for j in range(2, 14) if ref[j : j + 3] not in [ref[k : k + 3] for k in range(j)])
  stop_text = " ".join(f"w{t}" for t in ref[j : j + 3])
  res = _gen(
    sampler,
    [GenerateRequest(prompt, SamplingParams(16, temperature=0.0, stop=("w9999 w1", stop_text)))],
  )
  assert res[0].output_ids == ref[: j + 3] and res[0].finish_reason == "stop"
  no_tok = JaxSampler(*model, max_len=MAX_LEN)
  with pytest.raises(ValueError, match="tokenizer"):
    _gen(no_tok, [GenerateRequest(prompt, SamplingParams(4, stop=("w1",)))])


def test_no_recompilation_within_a_bucket_and_longer_requests_reuse_the_cache(model, full_logprobs):
  config, params = model
  eng = JaxSampler(
    config,
    params,
    max_batch=2,
    max_len=None,
    kv_budget_tokens=256,
    page_size=16,
    prefill_buckets=(16, 32),
    decode_chunk=4,
  )
  # Without max_len one request may use the whole token budget; the pool is allocated once.
  assert eng.max_len == 256 and eng.free_pages == 16
  _gen(eng, [_req(9, 6, temperature=0.0, prompt_seed=1)])
  assert dict(eng.compile_counts) == {"prefill": 1, "decode": 1}
  # Other lengths in the same bucket and window, other sampling settings (the same static
  # variant), more stop ids than the device checks: no new trace.
  _gen(eng, [_req(12, 4, seed=3, temperature=0.0, prompt_seed=2)])
  _gen(
    eng,
    [_req(10, 3, seed=4, temperature=0.0, prompt_seed=3, stop_token_ids=(1, 2, 3, 4, 5, 6))],
  )
  assert dict(eng.compile_counts) == {"prefill": 1, "decode": 1}
  _gen(eng, [_req(20, 4, temperature=0.0, prompt_seed=4)])  # next prefill bucket and window
  assert dict(eng.compile_counts) == {"prefill": 2, "decode": 2}
  _gen(eng, [_req(3, 4, prompt_seed=5, seed=1), _req(5, 6, prompt_seed=6, seed=2)])  # 2 rows
  # 2-row prefill; the "sample" variant at window 1
  assert dict(eng.compile_counts) == {"prefill": 3, "decode": 3}

  # A much longer request arrives while another row is decoding: the pool is not rebuilt
  # and the row in flight is unaffected; only window buckets it had not used compile.
  a = _req(9, 40, temperature=0.0, prompt_seed=7)
  b = _req(12, 100, temperature=0.0, prompt_seed=8)
  a_alone = _gen(eng, [a])[0]
  before = eng.compile_counts["decode"]

  async def main():
    task_a = asyncio.create_task(eng.generate([a]))
    while not any(r is not None for r in eng._rows):
      await asyncio.sleep(0.001)
    res_b = await eng.generate([b])
    return (await task_a)[0], res_b[0]

  res_a, res_b = asyncio.run(main())
  assert res_a.output_ids == a_alone.output_ids
  assert len(res_b.output_ids) == 100
  _check_logprobs(full_logprobs, b, res_b)
  # ``a`` alone attended over at most 8 + 40 = 48 cached tokens (windows of 1..3 pages);
  # ``b`` over 11 + 100 = 111 = 7 pages: only the buckets 4, 6 and 8 are new.
  assert eng.compile_counts["decode"] - before == 3
  # The same again: every window is compiled now.
  counts = dict(eng.compile_counts)
  asyncio.run(main())
  assert dict(eng.compile_counts) == counts and eng.free_pages == 16


def test_update_weights_swaps_params_and_versions(sampler, model, full_logprobs):
  config, params = model
  req = _req(6, 10, temperature=0.0, prompt_seed=42)
  old = _gen(sampler, [req])[0]
  new_params = jax.tree.map(lambda x: x * 1.5, params)
  v0 = sampler.weight_version
  asyncio.run(sampler.update_weights(config, new_params, v0 + 7))
  assert sampler.weight_version == v0 + 7
  new = _gen(sampler, [req])[0]
  assert new.weight_version == v0 + 7 and old.weight_version == v0
  assert new.output_ids != old.output_ids
  _check_logprobs(full_logprobs, req, new, new_params)
  asyncio.run(sampler.update_weights(config, params))
  assert sampler.weight_version == v0 + 8
  assert _gen(sampler, [req])[0].output_ids == old.output_ids

  async def swap_mid_request():
    task = asyncio.create_task(sampler.generate([_req(6, 40, temperature=0.0, prompt_seed=42)]))
    while not any(r is not None and r.output_ids for r in sampler._rows):
      await asyncio.sleep(0.001)
    await sampler.update_weights(config, params)  # same weights, next version
    return (await task)[0]

  res = asyncio.run(swap_mid_request())
  versions = res.token_versions()
  assert versions[0] == v0 + 8 and versions[-1] == v0 + 9 and versions == sorted(versions)
  assert res.weight_version == v0 + 8


def test_abort_pending_and_running_requests(sampler):
  longs = [
    GenerateRequest(_prompt(5, i), SamplingParams(40, temperature=0.0), rid=f"long{i}")
    for i in range(4)
  ]
  waiting = GenerateRequest(_prompt(5, 9), SamplingParams(8, temperature=0.0), rid="waiting")

  async def main():
    task = asyncio.create_task(sampler.generate(longs + [waiting]))
    while not any(r is not None and r.output_ids for r in sampler._rows):
      await asyncio.sleep(0.001)
    assert await sampler.abort("waiting") and await sampler.abort("long2")
    assert not await sampler.abort("no-such-rid")
    return await task

  results = asyncio.run(main())
  assert results[4].finish_reason == "abort" and results[4].output_ids == []
  assert results[2].finish_reason == "abort" and 0 < len(results[2].output_ids) < 40
  full = _gen(sampler, [longs[2]])[0].output_ids
  assert results[2].output_ids == full[: len(results[2].output_ids)]
  assert [results[i].finish_reason for i in (0, 1, 3)] == ["length"] * 3


def test_generate_leaves_the_event_loop_free(sampler):
  """Other coroutines (tool calls, HTTP) run while a request decodes: a ticker sees the row
  part-way through its 48 tokens. Ordering, not timing: if decoding held the loop, every tick
  would see either no row or a finished one."""

  async def main():
    seen = set()
    task = asyncio.create_task(sampler.generate([_req(10, 48, temperature=0.0)]))
    while not task.done():
      seen.update(len(r.output_ids) for r in sampler._rows if r is not None)
      await asyncio.sleep(0)
    await task
    return seen

  seen = asyncio.run(main())
  assert any(0 < n < 48 for n in seen), sorted(seen)


def test_bad_requests_fail_clearly(sampler):
  with pytest.raises(ValueError, match="max_len=64"):
    _gen(sampler, [_req(40, 30)])
  with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 256\)"):
    _gen(sampler, [GenerateRequest([1, VOCAB], SamplingParams(4))])
  with pytest.raises(ValueError, match="top_p"):
    _gen(sampler, [GenerateRequest([1, 2], SamplingParams(4, top_p=0.0))])

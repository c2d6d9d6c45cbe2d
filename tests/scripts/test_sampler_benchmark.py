"""benchmarks/sampler.py (gpu_check's decode section reuses it; issue 38 item 4: only the long
tier's every-section gpu_check run reached it): the roofline's bytes per step, the interleaved
timing, and one tiny throughput and multi-turn prefill measurement (JAX and transformers on the
same random weights give the same greedy tokens; the lease prefills each turn's new tokens
only)."""

import importlib.util
import os
import types

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load():
  spec = importlib.util.spec_from_file_location(
    "sampler_bench_test", os.path.join(REPO, "benchmarks", "sampler.py")
  )
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


bench = _load()


def test_step_bytes_counts_every_weight_but_the_embedding_gather_and_the_kv_read():
  c = types.SimpleNamespace(
    hidden_size=4,
    intermediate_size=8,
    head_dim=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    num_hidden_layers=3,
    vocab_size=10,
  )
  # per layer: q,k,v (4 x 4 x 2) + o (4 x 4) + mlp (3 x 4 x 8) + 2 norms (4) + q/k norms (2)
  layer = 4 * 4 * 2 + 2 * 2 * 4 + 3 * 4 * 8 + 2 * 4 + 2 * 2
  weights = 3 * layer + 4 + 4 * 10
  assert bench.step_bytes(c, 1, 0, 2) == weights * 2
  kv_per_token_row = 3 * 2 * 1 * 2 * 2  # layers x (k, v) x kv heads x head_dim x bytes
  assert bench.step_bytes(c, 3, 5.5, 2) == weights * 2 + 3 * 5.5 * kv_per_token_row
  assert bench.dims_of("tiny")["num_key_value_heads"] == 2


def test_time_interleaved_warms_up_then_alternates_the_runners():
  calls = []

  def runner(name):
    def run(seed):
      calls.append((name, seed))
      return f"{name}{seed}"

    return run

  times, outs = bench.time_interleaved([runner("a"), runner("b")], repeats=2)
  assert calls == [("a", 0), ("b", 0), ("a", 1000), ("b", 1000), ("a", 2000), ("b", 2000)]
  assert outs == ["a2000", "b2000"] and len(times) == 2 and all(t >= 0 for t in times)


@pytest.mark.filterwarnings("ignore")
def test_tiny_throughput_max_len_and_conversation_prefill():
  dims = dict(bench.dims_of("tiny"), vocab_size=128, num_hidden_layers=1)
  model, config, params, n = bench.build_models(dims)
  assert n == sum(p.numel() for p in model.parameters()) > 0
  t = bench.throughput(
    model,
    config,
    params,
    batch=2,
    prompt_len=4,
    new_tokens=4,
    repeats=1,
    bandwidth=10.0,
    decode_chunk=4,
  )
  assert t["greedy_rows_identical"] == 1.0  # same weights, greedy: the same tokens
  assert t["jax_tokens_per_s"] > 0 and t["transformers_tokens_per_s"] > 0
  roof_ms = 1e3 * bench.step_bytes(config, 2, 4 + 4 / 2, 4) / 10e9
  assert t["roofline_ms_per_step"] == pytest.approx(roof_ms)
  assert t["fraction_of_roofline"] == pytest.approx(roof_ms / t["jax_ms_per_step"])
  m = bench.max_len_scaling(
    config, params, batch=1, lens=(16, 32), repeats=1, decode_chunk=4, prompt_len=4, new=4
  )
  assert m["row_tokens"] == 8 and m["max_len_16_ms_per_token"] > 0
  assert m["ratio"] == pytest.approx(m["max_len_32_ms_per_token"] / m["max_len_16_ms_per_token"])
  bw = bench.measure_bandwidth(mib=1)
  assert bw["gb_per_s"] > 0 and "1 MiB" in bw["method"]
  p = bench.conversation_prefill(config, params, turns=3)
  assert p["turns"] == 3 and p["final_input"] > 32
  # Turn 1 prefills its 32 tokens; later turns only what was appended (<= 12 + 5 each), far
  # less than re-prefilling every turn's whole input.
  assert 32 <= p["prefill_tokens"] <= 32 + 2 * 17 < p["sum_of_turn_inputs"]

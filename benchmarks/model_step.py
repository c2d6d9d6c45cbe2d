"""Forward+backward throughput of the JAX Qwen3 against transformers (torch eager), same run.

  python benchmarks/model_step.py [--quick] [--batch 8] [--seq 128] [--steps 10]

Both sides get the same tiny random Qwen3 (built with transformers, loaded into JAX with
``qwen3.load_hf_params``), the same token batch and the same loss (mean next-token cross
entropy). JAX: one ``jax.jit(value_and_grad)`` call per step. Torch: ``model(ids,
labels=ids).loss.backward()`` in eager mode with zeroed grads. Compile time is reported
separately and excluded from throughput. Rows: float32 and (JAX only) bf16 compute, with remat
on/off. The ratio column is JAX tokens/s divided by torch float32 eager tokens/s.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rstar_jax.models import qwen3  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/json_stdout.py
import json_stdout  # noqa: E402

TINY = dict(
  vocab_size=512,
  hidden_size=128,
  intermediate_size=384,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=32,
  rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
  tie_word_embeddings=True,
)


def timed(fn, steps):
  t0 = time.perf_counter()
  fn()
  compile_s = time.perf_counter() - t0
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return compile_s, statistics.median(times)


def jax_step(params, config, ids):
  def loss(p):
    logits = qwen3.forward(p, config, ids[:, :-1])
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, ids[:, 1:, None], -1).mean()

  f = jax.jit(jax.value_and_grad(loss))
  return lambda: jax.block_until_ready(f(params))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=128)
  ap.add_argument("--steps", type=int, default=10)
  ap.add_argument("--quick", action="store_true", help="3 steps, seq 64")
  ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
  a = ap.parse_args()
  emit = json_stdout.reserve(a.json)  # --json: stdout holds the JSON only
  if a.quick:
    a.steps, a.seq = 3, 64
  import torch
  import transformers

  torch.manual_seed(0)
  model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**TINY)).train()
  ids_np = np.random.default_rng(0).integers(0, TINY["vocab_size"], (a.batch, a.seq + 1))
  tokens = a.batch * a.seq
  rows = []

  ids_t = torch.as_tensor(ids_np)

  def torch_step():
    model.zero_grad(set_to_none=True)
    model(ids_t, labels=ids_t).loss.backward()

  c, t = timed(torch_step, a.steps)
  torch_tps = tokens / t
  rows.append(("torch eager float32", c, t, torch_tps))

  with tempfile.TemporaryDirectory() as d:
    model.save_pretrained(d)
    for dtype, remat in (("float32", False), ("float32", True), ("bfloat16", False)):
      config = qwen3.Qwen3Config.from_hf(d, dtype=dtype, remat=remat)
      params = qwen3.load_hf_params(d, config, dtype=jnp.dtype(dtype))
      c, t = timed(jax_step(params, config, jnp.asarray(ids_np, jnp.int32)), a.steps)
      rows.append((f"jax jit {dtype}{' remat' if remat else ''}", c, t, tokens / t))

  n_params = sum(p.numel() for p in model.parameters())
  print(
    f"\nQwen3 tiny ({n_params:,} params), batch {a.batch} x "
    f"seq {a.seq}, fwd+bwd, median of {a.steps} steps, {os.cpu_count()} CPU cores, "
    f"torch threads {torch.get_num_threads()}"
  )
  print(f"{'impl':<26}{'compile/first s':>16}{'step ms':>10}{'tokens/s':>12}{'vs torch':>10}")
  for name, c, t, tps in rows:
    print(f"{name:<26}{c:>16.2f}{t * 1e3:>10.1f}{tps:>12,.0f}{tps / torch_tps:>9.2f}x")
  if a.json:
    emit(
      {
        "params": n_params,
        "batch": a.batch,
        "seq": a.seq,
        "steps": a.steps,
        "rows": [
          {
            "impl": name,
            "compile_s": c,
            "step_s": t,
            "tokens_per_s": tps,
            "vs_torch": tps / torch_tps,
          }
          for name, c, t, tps in rows
        ],
      }
    )


if __name__ == "__main__":
  main()

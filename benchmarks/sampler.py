"""Decode speed of JaxSampler: against transformers `generate` (same run), against a bandwidth
roofline, across cache sizes, and the prefill a multi-turn conversation costs.

  python benchmarks/sampler.py [--quick] [--json [PATH]] [--sizes tiny,small] [--batches 1,8,64]
  python benchmarks/sampler.py --code-root /work/main ...   # the same measurements, other code

One random Qwen3 per size is built with transformers, saved, and loaded into JAX with
`qwen3.load_hf_params`, so both engines run the same float32 weights. Sections:

  throughput   per batch size: generated tokens/s of JaxSampler and of transformers `generate`
               (same prompts, exactly `--new-tokens` per row, greedy; the engines' timed runs
               alternate so both see the same machine load; median of `--repeats`), their
               ratio, and ms per decode step against the roofline: bytes a step must read
               (every weight but the embedding table, plus each row's cached K/V) / memory
               bandwidth. The bandwidth is measured in the same run (a jitted streaming add
               over 256 MiB: bytes read + written / time) and printed.
  max_len      ms per generated token for the same short rows (prompt 32 + 98 new = 130
               tokens) with the engine built for max_len 256 and 8192 (target: within 1.5x).
  prefill      a 10-turn conversation (each turn appends the output and 2..5 tool tokens) under
               `trajectory_lease`: the prompt tokens the engine ran, against the sum of the
               turns' inputs (what re-prefilling every turn costs).

`--code-root DIR` imports `rstar_jax` from another checkout (e.g. the main branch) to measure a
"before"; features that checkout lacks are reported as such, never estimated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/json_stdout.py
import json_stdout  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SIZES = {  # name: (vocab, hidden, intermediate, layers, q heads, kv heads, head_dim)
  "tiny": (1024, 64, 128, 2, 4, 2, 16),
  "small": (4096, 256, 768, 4, 4, 2, 64),
}


def dims_of(size: str) -> dict:
  v, d, f, n_layers, hq, hkv, dh = SIZES[size]
  return dict(
    vocab_size=v,
    hidden_size=d,
    intermediate_size=f,
    num_hidden_layers=n_layers,
    num_attention_heads=hq,
    num_key_value_heads=hkv,
    head_dim=dh,
    tie_word_embeddings=True,
  )


def build_models(dims: dict, torch_dtype=None, device="cpu", jax_dtype="float32"):
  """(transformers model, qwen3 config, JAX params, param count): the same random weights."""
  import jax.numpy as jnp
  import torch
  import transformers

  from rstar_jax.models import qwen3

  torch.manual_seed(0)
  cfg = transformers.Qwen3Config(**dims, max_position_embeddings=16384, initializer_range=0.1)
  model = transformers.Qwen3ForCausalLM(cfg).eval()
  with tempfile.TemporaryDirectory() as tmp:
    model.save_pretrained(tmp)
    config = qwen3.Qwen3Config.from_hf(tmp, dtype=jax_dtype)
    params = qwen3.load_hf_params(tmp, config, dtype=jnp.dtype(jax_dtype))
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  model = model.to(device=device, dtype=torch_dtype or torch.float32)
  return model, config, params, sum(p.numel() for p in model.parameters())


def measure_bandwidth(mib: int = 256) -> dict:
  """Device memory bandwidth: a jitted ``x + 1`` over ``mib`` MiB (reads and writes it)."""
  import jax
  import jax.numpy as jnp

  x = jnp.zeros(mib * 2**20 // 4, jnp.float32)
  f = jax.jit(lambda a: a + 1.0)
  f(x).block_until_ready()
  best = min(_timed(lambda: f(x).block_until_ready()) for _ in range(7))
  return {
    "method": f"jitted x + 1 over {mib} MiB, best of 7",
    "gb_per_s": 2 * x.nbytes / best / 1e9,
  }


def _timed(fn) -> float:
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


def step_bytes(config, batch: int, cached_tokens: float, itemsize: int) -> float:
  """Bytes one decode step must read: every weight except the embedding table (a step gathers
  ``batch`` rows of it) and the LM head (tied or not, it is read), plus each row's K/V."""
  d, f, dh = config.hidden_size, config.intermediate_size, config.head_dim
  hq, hkv, L, V = (
    config.num_attention_heads,
    config.num_key_value_heads,
    config.num_hidden_layers,
    config.vocab_size,
  )
  layer = d * (hq + 2 * hkv) * dh + hq * dh * d + 3 * d * f + 2 * d + 2 * dh
  weights = (L * layer + d + d * V) * itemsize
  kv = batch * cached_tokens * L * 2 * hkv * dh * itemsize
  return weights + kv


def make_sampler(config, params, *, batch, max_len, decode_chunk, **kw):
  from rstar_jax.rollout.jax_sampler import JaxSampler

  return JaxSampler(
    config, params, max_batch=batch, max_len=max_len, decode_chunk=decode_chunk, **kw
  )


def jax_runner(sampler, prompts, new_tokens, sample=False):
  from rstar_jax.rollout.types import GenerateRequest, SamplingParams

  sp = (
    SamplingParams(new_tokens, temperature=1.0, top_p=0.95)
    if sample
    else SamplingParams(new_tokens, temperature=0.0)
  )

  def run(seed0):
    reqs = [
      GenerateRequest(p, dataclasses.replace(sp, seed=seed0 + i)) for i, p in enumerate(prompts)
    ]
    return [r.output_ids for r in asyncio.run(sampler.generate(reqs))]

  return run


def hf_runner(model, prompts, new_tokens, sample=False, device="cpu"):
  import torch

  ids = torch.tensor(prompts, device=device)
  kw = (
    dict(do_sample=True, temperature=1.0, top_p=0.95, top_k=0) if sample else dict(do_sample=False)
  )

  def run(_):
    with torch.no_grad():
      out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
    if device != "cpu":
      torch.cuda.synchronize()
    return out[:, ids.shape[1] :].tolist()

  return run


def time_interleaved(runners, repeats):
  """Warm every runner up, then alternate timed runs so all see the same machine load."""
  outs = [run(0) for run in runners]
  times = [[] for _ in runners]
  for r in range(repeats):
    for i, run in enumerate(runners):
      t = time.perf_counter()
      outs[i] = run(1000 * (r + 1))
      times[i].append(time.perf_counter() - t)
  return [statistics.median(t) for t in times], outs


def throughput(
  hf_model,
  config,
  params,
  *,
  batch,
  prompt_len,
  new_tokens,
  repeats,
  bandwidth,
  decode_chunk,
  device="cpu",
  itemsize=4,
  sample=False,
) -> dict:
  import numpy as np

  rng = np.random.default_rng(batch)
  prompts = rng.integers(1, config.vocab_size, (batch, prompt_len)).tolist()
  sampler = make_sampler(
    config, params, batch=batch, max_len=prompt_len + new_tokens, decode_chunk=decode_chunk
  )
  (t_hf, t_jax), (out_hf, out_jax) = time_interleaved(
    [
      hf_runner(hf_model, prompts, new_tokens, sample, device),
      jax_runner(sampler, prompts, new_tokens, sample),
    ],
    repeats,
  )
  n = batch * new_tokens
  roof_s = step_bytes(config, batch, prompt_len + new_tokens / 2, itemsize) / (bandwidth * 1e9)
  ms_step = 1e3 * t_jax / new_tokens  # prefill of the short prompt included
  out = {
    "batch": batch,
    "transformers_tokens_per_s": n / t_hf,
    "jax_tokens_per_s": n / t_jax,
    "ratio": t_hf / t_jax,
    "jax_ms_per_step": ms_step,
    "roofline_ms_per_step": 1e3 * roof_s,
    "fraction_of_roofline": 1e3 * roof_s / ms_step,
    "compiles": dict(sampler.compile_counts),
  }
  if not sample:
    out["greedy_rows_identical"] = float(np.mean([a == b for a, b in zip(out_hf, out_jax)]))
  return out


def max_len_scaling(
  config, params, *, batch, lens, repeats, decode_chunk, prompt_len=32, new=98
) -> dict:
  """ms per generated token for the same short rows with the engine built for each max_len."""
  import numpy as np

  prompts = np.random.default_rng(1).integers(1, config.vocab_size, (batch, prompt_len)).tolist()
  runners = [
    jax_runner(
      make_sampler(config, params, batch=batch, max_len=n, decode_chunk=decode_chunk),
      prompts,
      new,
    )
    for n in lens
  ]
  times, _ = time_interleaved(runners, repeats)
  out = {
    "batch": batch,
    "row_tokens": prompt_len + new,
    **{f"max_len_{n}_ms_per_token": 1e3 * t / (batch * new) for n, t in zip(lens, times)},
  }
  out["ratio"] = times[-1] / times[0]
  return out


def conversation_prefill(config, params, *, turns=10, seed=0) -> dict:
  """Prompt tokens the engine ran for one ``turns``-turn conversation under its lease."""
  import numpy as np

  from rstar_jax.rollout.types import GenerateRequest, SamplingParams

  eng = make_sampler(config, params, batch=1, max_len=512, decode_chunk=8)
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, config.vocab_size, 32).tolist()
  inputs = []

  async def run():
    lease = getattr(eng, "trajectory_lease", None)
    async with lease("conv", 512) if lease else contextlib.nullcontext():
      for t in range(turns):
        inputs.append(len(ids))
        sp = SamplingParams(12, temperature=0.7, seed=seed * 100 + t)
        res = (await eng.generate([GenerateRequest(list(ids), sp)]))[0]
        ids.extend(res.output_ids)
        ids.extend(rng.integers(1, config.vocab_size, int(rng.integers(2, 6))).tolist())

  asyncio.run(run())
  out = {"turns": turns, "sum_of_turn_inputs": sum(inputs), "final_input": inputs[-1]}
  counts = getattr(eng, "prefill_tokens", None)
  if counts is None:
    out["prefill_tokens"] = None
    out["note"] = "this engine counts no prefill tokens (no prefix reuse: every turn re-prefills)"
  else:
    out["prefill_tokens"] = int(counts["conv"])
  return out


# ----------------------------------------------------------------------------- CLI


def _import_path(code_root):
  sys.path.insert(0, os.path.abspath(code_root or ROOT))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true", help="tiny model, batches 1,8, 1 repeat")
  ap.add_argument("--sizes", default="tiny,small", help=f"comma-separated, from {sorted(SIZES)}")
  ap.add_argument("--batches", default="1,8,64")
  ap.add_argument("--prompt-len", type=int, default=32)
  ap.add_argument("--new-tokens", type=int, default=128)
  ap.add_argument("--decode-chunk", type=int, default=32)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--sampled", action="store_true", help="also time sampled decoding")
  ap.add_argument("--max-lens", default="256,8192", help="max_len section: short,long")
  ap.add_argument("--sections", default="throughput,max_len,prefill")
  ap.add_argument("--torch-threads", type=int, default=0, help="0 = torch's default")
  ap.add_argument("--code-root", default=None, help="import rstar_jax from this checkout")
  ap.add_argument("--json", nargs="?", const="-", default=None, help="write JSON (- = stdout)")
  args = ap.parse_args(argv)
  emit = json_stdout.reserve(args.json == "-")  # --json / --json -: stdout holds the JSON only
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  _import_path(args.code_root)
  import jax
  import torch

  if args.torch_threads:
    torch.set_num_threads(args.torch_threads)
  if args.quick:
    args.sizes, args.batches, args.new_tokens, args.repeats = "tiny", "1,8", 32, 1
  sizes = args.sizes.split(",")
  for s in sizes:
    if s not in SIZES:
      raise SystemExit(f"--sizes: unknown size {s!r}; choose from {sorted(SIZES)}")
  batches = [int(b) for b in args.batches.split(",")]
  lens = [int(n) for n in args.max_lens.split(",")]
  import rstar_jax

  bw = measure_bandwidth()
  report = {
    "code": os.path.dirname(os.path.dirname(rstar_jax.__file__)),
    "device": jax.devices()[0].device_kind,
    "torch_threads": torch.get_num_threads(),
    "bandwidth": bw,
    "prompt_len": args.prompt_len,
    "new_tokens": args.new_tokens,
    "repeats": args.repeats,
    "sizes": {},
  }
  print(
    f"code {report['code']}; device {report['device']}; bandwidth {bw['gb_per_s']:.1f} GB/s "
    f"({bw['method']}); torch threads {report['torch_threads']}; median of {args.repeats}"
  )
  sections = args.sections.split(",")
  for size in sizes:
    hf_model, config, params, n_params = build_models(dims_of(size))
    r = report["sizes"][size] = {"params": n_params}
    print(f"\nmodel {size}: {n_params / 1e6:.2f}M params")
    if "throughput" in sections:
      print(
        f"{'batch':>5} {'mode':<8} {'HF tok/s':>9} {'JAX tok/s':>10} {'ratio':>6} "
        f"{'ms/step':>8} {'roofline':>9} {'of roof':>8}"
      )
      r["throughput"] = []
      for b in batches:
        for sample in (False, True) if args.sampled else (False,):
          t = throughput(
            hf_model,
            config,
            params,
            batch=b,
            prompt_len=args.prompt_len,
            new_tokens=args.new_tokens,
            repeats=args.repeats,
            bandwidth=bw["gb_per_s"],
            decode_chunk=args.decode_chunk,
            sample=sample,
          )
          t["mode"] = "sampled" if sample else "greedy"
          r["throughput"].append(t)
          print(
            f"{b:>5} {t['mode']:<8} {t['transformers_tokens_per_s']:>9.0f} "
            f"{t['jax_tokens_per_s']:>10.0f} {t['ratio']:>5.2f}x {t['jax_ms_per_step']:>8.2f} "
            f"{t['roofline_ms_per_step']:>9.3f} {t['fraction_of_roofline']:>8.1%}"
            + (f"  greedy identical {t['greedy_rows_identical']:.0%}" if not sample else "")
          )
    if "max_len" in sections:
      m = r["max_len"] = max_len_scaling(
        config, params, batch=8, lens=lens, repeats=args.repeats, decode_chunk=args.decode_chunk
      )
      print(
        f"max_len {lens[0]} vs {lens[-1]}, batch 8, {m['row_tokens']}-token rows: "
        f"{m[f'max_len_{lens[0]}_ms_per_token']:.3f} vs {m[f'max_len_{lens[-1]}_ms_per_token']:.3f}"
        f" ms/token ({m['ratio']:.2f}x)"
      )
    if "prefill" in sections:
      p = r["prefill"] = conversation_prefill(config, params)
      print(
        f"10-turn conversation: prefill tokens {p['prefill_tokens']} vs sum of turn inputs "
        f"{p['sum_of_turn_inputs']} (final input {p['final_input']})"
        + (f"  [{p['note']}]" if "note" in p else "")
      )
  if args.json:
    if args.json == "-":
      emit(report, indent=2)
    else:
      with open(args.json, "w") as f:
        f.write(json.dumps(report, indent=2))
  return report


if __name__ == "__main__":
  main()

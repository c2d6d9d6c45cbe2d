"""Decode throughput of JaxSampler against transformers `generate` (torch, CPU), same run.

  python benchmarks/sampler.py [--quick] [--batch 8] [--prompt-len 32] [--new-tokens 128]

One random Qwen3 is built with transformers, saved, and loaded into JAX with
`qwen3.load_hf_params`, so both engines run the same weights in float32. Each engine gets the
same batch of prompts (equal lengths, so transformers needs no padding) and generates exactly
`--new-tokens` tokens per row, greedy and sampled (temperature 1, top-p 0.95). Each engine is
warmed up first (JAX: compilation; torch: first-call allocation), then the engines' timed
runs alternate (`--repeats` each, so both see the same machine load); the table reports the
median. Generated tokens/s counts output tokens (prefill included
in the time for both). Greedy outputs are compared token for token as a sanity check.
"""

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from rstar_jax.models import qwen3  # noqa: E402
from rstar_jax.rollout.jax_sampler import JaxSampler  # noqa: E402
from rstar_jax.rollout.types import GenerateRequest, SamplingParams  # noqa: E402

SIZES = {  # name: (vocab, hidden, intermediate, layers, q heads, kv heads, head_dim)
  "tiny": (1024, 64, 128, 2, 4, 2, 16),
  "small": (4096, 256, 768, 4, 4, 2, 64),
}


def build_model(size, out_dir):
  v, d, f, n_layers, hq, hkv, dh = SIZES[size]
  torch.manual_seed(0)
  cfg = transformers.Qwen3Config(
    vocab_size=v,
    hidden_size=d,
    intermediate_size=f,
    num_hidden_layers=n_layers,
    num_attention_heads=hq,
    num_key_value_heads=hkv,
    head_dim=dh,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
    initializer_range=0.1,
  )
  model = transformers.Qwen3ForCausalLM(cfg).eval()
  model.save_pretrained(out_dir)
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  n_params = sum(p.numel() for p in model.parameters())
  return model, n_params


def hf_runner(model, prompts, new_tokens, sample):
  ids = torch.tensor(prompts)
  kw = (
    dict(do_sample=True, temperature=1.0, top_p=0.95, top_k=0) if sample else dict(do_sample=False)
  )

  def run(_):
    with torch.no_grad():
      out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
    return out[:, ids.shape[1] :].tolist()

  return run


def jax_runner(sampler, prompts, new_tokens, sample):
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


def time_interleaved(runners, repeats):
  """Warm every runner up, then alternate timed runs so both see the same machine load."""
  outs = [run(0) for run in runners]
  times = [[] for _ in runners]
  for r in range(repeats):
    for i, run in enumerate(runners):
      t = time.perf_counter()
      outs[i] = run(1000 * (r + 1))
      times[i].append(time.perf_counter() - t)
  return [statistics.median(t) for t in times], outs


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true", help="tiny model, 32 new tokens, 1 repeat")
  ap.add_argument(
    "--sizes", default="tiny,small", help=f"comma-separated model sizes from {sorted(SIZES)}"
  )
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--prompt-len", type=int, default=32)
  ap.add_argument("--new-tokens", type=int, default=128)
  ap.add_argument("--decode-chunk", type=int, default=32)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--torch-threads", type=int, default=0, help="0 = torch's default")
  args = ap.parse_args()
  if args.torch_threads:
    torch.set_num_threads(args.torch_threads)
  if args.quick:
    args.sizes, args.new_tokens, args.repeats = "tiny", 32, 1
  for size in args.sizes.split(","):
    if size not in SIZES:
      raise SystemExit(f"--sizes: unknown size {size!r}; choose from {sorted(SIZES)}")
    bench_size(size, args)


def bench_size(size, args):
  with tempfile.TemporaryDirectory() as tmp:
    hf_model, n_params = build_model(size, tmp)
    config = qwen3.Qwen3Config.from_hf(tmp)
    params = qwen3.load_hf_params(tmp, config)
  rng = np.random.default_rng(0)
  prompts = rng.integers(1, config.vocab_size, (args.batch, args.prompt_len)).tolist()
  sampler = JaxSampler(
    config,
    params,
    max_batch=args.batch,
    max_len=args.prompt_len + args.new_tokens,
    decode_chunk=args.decode_chunk,
  )
  n_tok = args.batch * args.new_tokens
  print(
    f"\nmodel {size}: {n_params / 1e6:.2f}M params, vocab {config.vocab_size}; "
    f"batch {args.batch}, prompt {args.prompt_len}, {args.new_tokens} new tokens/row, "
    f"torch threads {torch.get_num_threads()}, median of {args.repeats}"
  )
  print(f"{'mode':<8} {'engine':<22} {'time s':>8} {'tok/s':>9} {'ratio':>7}")
  for sample in (False, True):
    (t_hf, t_jax), (out_hf, out_jax) = time_interleaved(
      [
        hf_runner(hf_model, prompts, args.new_tokens, sample),
        jax_runner(sampler, prompts, args.new_tokens, sample),
      ],
      args.repeats,
    )
    mode = "sampled" if sample else "greedy"
    print(f"{mode:<8} {'transformers generate':<22} {t_hf:>8.3f} {n_tok / t_hf:>9.0f} {1.0:>6.2f}x")
    print(f"{mode:<8} {'JaxSampler':<22} {t_jax:>8.3f} {n_tok / t_jax:>9.0f} {t_hf / t_jax:>6.2f}x")
    if not sample:
      same = np.mean([a == b for a, b in zip(out_hf, out_jax)])
      first_diff = [
        next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        for a, b in zip(out_hf, out_jax)
      ]
      print(
        f"  greedy rows identical to transformers: {same:.0%} "
        f"(first mismatch per row: {first_diff})"
      )
  print(f"JaxSampler compilations: {dict(sampler.compile_counts)}")


if __name__ == "__main__":
  main()

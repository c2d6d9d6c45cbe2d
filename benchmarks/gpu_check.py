"""One prepared accelerator check: learner step MFU, decode vs transformers and roofline, DLPack, tiny RL.

  bash scripts/gpu_check.sh --out report.json            # on one GPU, < 10 minutes
  bash scripts/gpu_check.sh --sections decode --out r.json   # the decode section alone
  bash scripts/gpu_check.sh --smoke --out report.json    # CPU, small sizes (CI smoke test)

Needs only JAX, torch and transformers (no SGLang, nothing downloaded: random weights). Each
section runs in its own subprocess with its own time limit, so a crash, an out-of-memory or a
hang loses only that section; the JSON report is rewritten after every section. Sections:

  env          versions, devices, the dense bf16 peak used for MFU.
  learner      one SFT update (forward + backward + AdamW) of a ~1.7B Qwen3 (Qwen3-1.7B's
               shape) in bf16 compute with remat, for attention xla / blockwise / fused:
               tokens/s and MFU = model FLOPs (6 x matmul params x tokens + causal attention)
               / time / peak.
  decode       JaxSampler decode (benchmarks/sampler.py's measurements, Qwen3-0.6B shape, bf16,
               < 4 min): tokens/s at batch 1 / 8 / 64 against transformers ``generate`` (same
               GPU, same random weights, greedy, fixed output length; ratio JAX / torch), ms
               per step against the roofline (bytes per step / bandwidth measured on the
               device), max_len 256 vs 8192 for 130-token rows, prefill tokens of a 10-turn
               conversation under ``trajectory_lease``.
  dlpack       JAX -> torch hand-off of a 1 GiB array via DLPack: GB/s and whether it is
               zero-copy (same device pointer on both sides).
  rl_loop      2 RL steps of the tiny recipe (configs/rstar2_tiny_cpu.py: embedded JaxSampler,
               real code pool at whatever isolation the machine allows) on the default device.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/json_stdout.py
import json_stdout  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = ("env", "learner", "decode", "dlpack", "rl_loop")
# Seconds per section on a GPU (sum < 10 min including process starts); smoke mode on CPU.
BUDGET = {"env": 40, "learner": 170, "decode": 230, "dlpack": 30, "rl_loop": 100}
SMOKE_BUDGET = {"env": 60, "learner": 240, "decode": 300, "dlpack": 60, "rl_loop": 300}

# Dense bf16 peak TFLOP/s per device kind (vendor datasheets, no sparsity).
PEAK_TFLOPS = {
  "h100": 989.0,
  "h200": 989.0,
  "h800": 989.0,
  "gh200": 989.0,
  "a100": 312.0,
  "mi300x": 1307.0,
  "b200": 2250.0,
}

# Qwen3-1.7B's shape (28 layers, d 2048, 16/8 heads of 128, FFN 6144, tied 151936 vocab).
QWEN3_1P7B = dict(
  vocab_size=151936,
  hidden_size=2048,
  intermediate_size=6144,
  num_hidden_layers=28,
  num_attention_heads=16,
  num_key_value_heads=8,
  head_dim=128,
  tie_word_embeddings=True,
)
# Qwen3-0.6B's shape, for the decode comparison (fits transformers' eager generate quickly).
QWEN3_0P6B = dict(
  vocab_size=151936,
  hidden_size=1024,
  intermediate_size=3072,
  num_hidden_layers=28,
  num_attention_heads=16,
  num_key_value_heads=8,
  head_dim=128,
  tie_word_embeddings=True,
)
TINY = dict(
  vocab_size=512,
  hidden_size=64,
  intermediate_size=128,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=16,
  tie_word_embeddings=True,
)


def peak_tflops(device_kind: str) -> float | None:
  kind = device_kind.lower().replace(" ", "")
  for k, v in PEAK_TFLOPS.items():
    if k in kind:
      return v
  return None


def train_flops(dims: dict, rows: int, seq: int) -> float:
  """Model FLOPs of one forward + backward: 6 x matmul params x tokens + causal attention
  (QK^T and PV over the lower triangle, x3 for the backward)."""
  d, f, dh = dims["hidden_size"], dims["intermediate_size"], dims["head_dim"]
  hq, hkv, L, v = (
    dims["num_attention_heads"],
    dims["num_key_value_heads"],
    dims["num_hidden_layers"],
    dims["vocab_size"],
  )
  matmul = L * (d * (hq + 2 * hkv) * dh + hq * dh * d + 3 * d * f) + d * v
  attn = L * 2 * 2 * (seq * seq / 2) * hq * dh
  return 3.0 * rows * (2.0 * seq * matmul + attn)


# ----------------------------------------------------------------------------- sections


def section_env(args) -> dict:
  import jax

  out = {
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "devices": [d.device_kind for d in jax.devices()],
    "python": sys.version.split()[0],
  }
  out["peak_bf16_tflops"] = peak_tflops(jax.devices()[0].device_kind)
  for mod in ("torch", "transformers", "flax", "optax"):
    try:
      out[mod] = __import__(mod).__version__
    except Exception as e:  # noqa: BLE001 (report, do not fail)
      out[mod] = f"unavailable: {type(e).__name__}: {e}"
  try:
    import torch

    out["torch_cuda"] = torch.cuda.is_available()
    if torch.cuda.is_available():
      out["torch_device"] = torch.cuda.get_device_name(0)
  except Exception:  # noqa: BLE001
    pass
  return out


def section_learner(args) -> dict:
  import functools

  import jax
  import jax.numpy as jnp
  import numpy as np

  from rstar_jax.learner import optim, steps
  from rstar_jax.learner.train_state import TrainState
  from rstar_jax.models import qwen3

  dims = TINY if args.smoke else QWEN3_1P7B
  rows, seq = (2, 64) if args.smoke else (args.rows, args.seq)
  dtype = "float32" if args.smoke else "bfloat16"
  peak = peak_tflops(jax.devices()[0].device_kind)
  rng = np.random.default_rng(0)
  batch = {
    "input_ids": jnp.asarray(rng.integers(0, dims["vocab_size"], (rows, seq)), jnp.int32),
    "attention_mask": jnp.ones((rows, seq), jnp.int32),
    "loss_mask": jnp.ones((rows, seq), jnp.float32),
  }
  flops = train_flops(dims, rows, seq)
  out = {
    "model": "tiny" if args.smoke else "qwen3-1.7b-shape",
    "rows": rows,
    "seq_len": seq,
    "compute_dtype": dtype,
    "param_dtype": "float32",
    "remat": True,
    "model_flops_per_step": flops,
    "peak_bf16_tflops": peak,
    "results": {},
  }
  opt = optim.OptimConfig(lr=1e-5, warmup_steps=0)
  tx = optim.make_optimizer(opt)
  base = qwen3.Qwen3Config(**dims, dtype=dtype, remat=True)
  out["params"] = sum(
    int(np.prod(s))
    for s in jax.tree.leaves(qwen3.param_shapes(base), is_leaf=lambda x: isinstance(x, tuple))
  )
  params = qwen3.init_params(base, jax.random.key(0))
  deadline = time.monotonic() + args.budget - 20
  for impl in ("xla", "blockwise", "fused"):
    if time.monotonic() > deadline:
      out["results"][impl] = {"skipped": "section time budget spent"}
      continue
    try:
      cfg = base.replace(attention=impl)
      apply_fn = lambda p, ids, m, cfg=cfg: qwen3.forward(p, cfg, ids, attention_mask=m)
      step = jax.jit(
        functools.partial(steps.sft_step, apply_fn=apply_fn, config=steps.StepConfig()),
        donate_argnums=(0,),
      )
      state = TrainState.create(jax.tree.map(jnp.copy, params), tx, 0)
      t0 = time.perf_counter()
      state, m = step(state, batch)
      jax.block_until_ready(m)
      compile_s = time.perf_counter() - t0
      times = []
      for _ in range(args.repeats):
        t0 = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t0)
        if time.monotonic() > deadline:
          break
      t = float(np.median(times))
      r = {
        "compile_plus_first_step_s": round(compile_s, 2),
        "step_s": t,
        "tokens_per_s": rows * seq / t,
        "loss": float(m["loss"]),
        "steps_timed": len(times),
      }
      if peak:
        r["mfu"] = flops / t / (peak * 1e12)
      if impl == "fused":  # did cuDNN run, or the logged XLA fallback?
        from rstar_jax.models import attention

        r["fallback"] = sorted(attention._logged) or None
      out["results"][impl] = r
      del state
    except Exception as e:  # noqa: BLE001 (one implementation failing keeps the others)
      out["results"][impl] = {"error": f"{type(e).__name__}: {e}"[:2000]}
  return out


def _sampler_bench():
  """benchmarks/sampler.py as a module (the decode section reuses its measurements)."""
  import importlib.util

  spec = importlib.util.spec_from_file_location(
    "sampler_bench", os.path.join(ROOT, "benchmarks", "sampler.py")
  )
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def section_decode(args) -> dict:
  """JaxSampler decode on the device: tokens/s at batch 1 / 8 / 64 against transformers
  ``generate`` (same device, same random weights, greedy, fixed output length), ms per step
  against the bandwidth roofline (bandwidth measured here), max_len 256 vs 8192 for short rows,
  and the prefill tokens of a 10-turn conversation under ``trajectory_lease``."""
  import jax
  import torch

  bench = _sampler_bench()
  gpu = torch.cuda.is_available() and not args.smoke
  device = "cuda" if gpu else "cpu"
  dims = TINY if args.smoke else QWEN3_0P6B
  jdtype = "bfloat16" if gpu else "float32"
  prompt_len, new = (16, 16) if args.smoke else (64, 128)
  batches = (1, 4) if args.smoke else (1, 8, 64)
  lens = (64, 512) if args.smoke else (256, 8192)
  # Larger pages on the accelerator: fewer window buckets, so fewer compiles in the budget.
  page = 16 if args.smoke else 64
  model, config, params, n_params = bench.build_models(
    dims, torch.bfloat16 if gpu else torch.float32, device, jdtype
  )
  from rstar_jax.models import qwen3

  params = qwen3.inference_params(params, config)
  bw = bench.measure_bandwidth(64 if args.smoke else 1024)
  out = {
    "model": "tiny" if args.smoke else "qwen3-0.6b-shape",
    "params": n_params,
    "device": jax.devices()[0].device_kind,
    "torch_device": device,
    "dtype": jdtype,
    "prompt_len": prompt_len,
    "new_tokens": new,
    "page_size": page,
    "bandwidth": bw,
    "results": {},
  }
  deadline = time.monotonic() + args.budget - 20

  def guarded(name, fn):
    if time.monotonic() > deadline:
      out["results"][name] = {"skipped": "section time budget spent"}
      return
    try:
      out["results"][name] = fn()
    except Exception as e:  # noqa: BLE001 (one part failing keeps the others)
      out["results"][name] = {"error": f"{type(e).__name__}: {e}"[:2000]}

  make = bench.make_sampler
  bench.make_sampler = lambda *a, **kw: make(*a, page_size=page, **kw)
  for b in batches:
    guarded(
      f"batch{b}",
      lambda b=b: bench.throughput(
        model,
        config,
        params,
        batch=b,
        prompt_len=prompt_len,
        new_tokens=new,
        repeats=1,
        bandwidth=bw["gb_per_s"],
        decode_chunk=32,
        device=device,
        itemsize=2 if gpu else 4,
      ),
    )
  guarded(
    "max_len",
    lambda: bench.max_len_scaling(
      config,
      params,
      batch=2 if args.smoke else 8,
      lens=lens,
      repeats=1,
      decode_chunk=32,
      **(dict(prompt_len=8, new=24) if args.smoke else {}),
    ),
  )
  guarded("prefill_10_turns", lambda: bench.conversation_prefill(config, params))
  return out


def section_dlpack(args) -> dict:
  import jax
  import jax.numpy as jnp
  import torch

  n_bytes = (16 << 20) if args.smoke else (1 << 30)
  x = jnp.ones((n_bytes // 2,), jnp.bfloat16) * 3
  x.block_until_ready()
  out = {"bytes": n_bytes, "jax_device": str(x.devices())}
  times = []
  t_obj = None
  for _ in range(5):
    t0 = time.perf_counter()
    t_obj = torch.from_dlpack(x)
    if t_obj.is_cuda:
      torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
  best = min(times)
  jptr = x.unsafe_buffer_pointer()
  out.update(
    {
      "torch_device": str(t_obj.device),
      "seconds": best,
      "gb_per_s": n_bytes / best / 1e9,
      "zero_copy": int(t_obj.data_ptr()) == int(jptr),
      "values_ok": bool(float(t_obj[:8].float().sum()) == 24.0),
    }
  )
  # And back: torch -> JAX.
  t0 = time.perf_counter()
  back = jax.dlpack.from_dlpack(t_obj)
  back.block_until_ready()
  dt = time.perf_counter() - t0
  out["torch_to_jax"] = {
    "seconds": dt,
    "gb_per_s": n_bytes / dt / 1e9,
    "zero_copy": int(back.unsafe_buffer_pointer()) == int(t_obj.data_ptr()),
  }
  return out


def section_rl_loop(args) -> dict:
  from configs import rstar2_tiny_cpu
  from rstar_jax.config import from_config_dict
  from rstar_jax.pipelines import rl_loop

  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.train.eval_every = 0
  with tempfile.TemporaryDirectory() as tmp:
    t0 = time.perf_counter()
    summary = rl_loop.run_rl(from_config_dict(cfg, "rl"), tmp, max_steps=2)
    dt = time.perf_counter() - t0
    metrics = []
    path = os.path.join(tmp, "metrics.jsonl")
    if os.path.exists(path):
      with open(path) as f:
        metrics = [json.loads(line) for line in f if line.strip()]
  import jax

  last = summary.get("last_metrics") or {}
  return {
    "seconds": dt,
    "device": jax.devices()[0].device_kind,
    "rl_step": summary.get("rl_step"),
    "steps_logged": len([m for m in metrics if "rl_step" in m]),
    # Every numeric metric of the last step (an update happens only when RoC keeps a
    # group: a random tiny policy often solves nothing, then no batch/* metrics).
    "last_metrics": {k: v for k, v in last.items() if isinstance(v, (int, float))},
  }


# ----------------------------------------------------------------------------- driver


def run_section(name: str, args) -> dict:
  t0 = time.perf_counter()
  try:
    res = globals()[f"section_{name}"](args)
    res = {"ok": True, **res}
  except Exception as e:  # noqa: BLE001
    res = {
      "ok": False,
      "error": f"{type(e).__name__}: {e}"[:4000],
      "traceback": traceback.format_exc()[-4000:],
    }
  res["section_seconds"] = round(time.perf_counter() - t0, 2)
  return res


def _child_env(name: str, smoke: bool) -> dict:
  env = dict(os.environ)
  env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  env.setdefault("HF_HUB_OFFLINE", "1")
  env.setdefault("TRANSFORMERS_OFFLINE", "1")
  # JAX must not take the whole GPU: torch shares it in the decode / dlpack sections.
  env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  if name in ("decode", "dlpack"):
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = env.get("GPU_CHECK_JAX_MEM_FRACTION", "0.45")
  if smoke:
    env["JAX_PLATFORMS"] = "cpu"
    env["CUDA_VISIBLE_DEVICES"] = ""
  return env


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", default=None, help="JSON report path (default $OUT/gpu_check.json)")
  ap.add_argument("--smoke", action="store_true", help="CPU, small sizes (CI)")
  ap.add_argument("--sections", default=",".join(SECTIONS))
  ap.add_argument("--rows", type=int, default=8, help="learner batch rows")
  ap.add_argument("--seq", type=int, default=2048, help="learner row length")
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument(
    "--json", action="store_true", help="also print the report on stdout (progress on stderr)"
  )
  ap.add_argument("--section", default=None, help=argparse.SUPPRESS)  # child mode
  ap.add_argument("--budget", type=float, default=0.0, help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.section:  # child: run one section, print its JSON as the last line
    print("GPU_CHECK_RESULT " + json.dumps(run_section(args.section, args)), flush=True)
    return 0
  emit = json_stdout.reserve(args.json)  # --json: stdout holds the report only
  out = args.out or os.path.join(os.environ.get("OUT", "."), "gpu_check.json")
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  budgets = SMOKE_BUDGET if args.smoke else BUDGET
  report = {
    "smoke": args.smoke,
    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "budgets_s": budgets,
    "sections": {},
  }
  names = [s for s in args.sections.split(",") if s]
  for name in names:
    if name not in SECTIONS:
      raise SystemExit(f"--sections: unknown section {name!r}; choose from {SECTIONS}")
  t_all = time.perf_counter()
  for name in names:
    cmd = [
      sys.executable,
      os.path.abspath(__file__),
      "--section",
      name,
      "--budget",
      str(budgets[name]),
      "--rows",
      str(args.rows),
      "--seq",
      str(args.seq),
      "--repeats",
      str(args.repeats),
    ] + (["--smoke"] if args.smoke else [])
    t0 = time.perf_counter()
    print(f"[gpu_check] {name} (limit {budgets[name]} s) ...", flush=True)
    try:
      p = subprocess.run(
        cmd,
        cwd=ROOT,
        env=_child_env(name, args.smoke),
        capture_output=True,
        text=True,
        timeout=budgets[name],
      )
      line = next(
        (l for l in reversed(p.stdout.splitlines()) if l.startswith("GPU_CHECK_RESULT ")), None
      )
      if line is None:
        res = {
          "ok": False,
          "error": f"section process exited {p.returncode} without a result",
          "stderr_tail": p.stderr[-4000:],
        }
      else:
        res = json.loads(line[len("GPU_CHECK_RESULT ") :])
        if not res.get("ok"):
          res["stderr_tail"] = p.stderr[-3000:]
    except subprocess.TimeoutExpired as e:
      err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
      res = {"ok": False, "error": f"timed out after {budgets[name]} s", "stderr_tail": err[-3000:]}
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    report["sections"][name] = res
    report["total_s"] = round(time.perf_counter() - t_all, 2)
    with open(out, "w") as f:  # after every section: a later crash keeps what ran
      json.dump(report, f, indent=2)
    print(
      f"[gpu_check] {name}: {'ok' if res.get('ok') else 'FAILED: ' + res['error'][:200]}"
      f" ({res['wall_s']} s)",
      flush=True,
    )
  print(f"[gpu_check] report: {out}")
  if args.json:
    emit(report, indent=2)
  failed = [n for n, r in report["sections"].items() if not r.get("ok")]
  if failed:
    print(f"[gpu_check] FAILED sections: {', '.join(failed)} (details in {out})", flush=True)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())

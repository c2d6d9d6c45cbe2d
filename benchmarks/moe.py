"""MoE expert layer speed: each grouped form against the all-experts reference and a dense
SwiGLU MLP of the same active FLOPs, same run.

  python benchmarks/moe.py [--json] [--quick] [--tokens 4096] [--hidden 256] [--ffn 256]
                           [--experts 8] [--topk 2] [--decode-batch 16] [--steps 5]

Rows (one per form: "block", "ragged", "dense" = every expert on every token, and
"dense_mlp" = one SwiGLU of width k * F, the FLOPs a token's k experts do):
  * train: ``jax.jit(value_and_grad)`` of the layer (router + experts) over T tokens, grads
    for the input, router and expert weights;
  * decode: the layer's forward over ``--decode-batch`` tokens (one decode step of a batch).
``ratio`` is the dense MLP's median time over the form's (1.0 = as fast as a dense MLP with the
same active FLOPs; higher is faster). Compile time is excluded. ``--json`` prints exactly one
JSON document on stdout (progress on stderr).
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/json_stdout.py

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import json_stdout  # noqa: E402

from rstar_jax.models import moe  # noqa: E402

FORMS = ("block", "ragged", "dense")


class _Cfg:
  def __init__(self, k, impl, block):
    self.num_experts_per_tok, self.norm_topk_prob = k, True
    self.moe_implementation, self.moe_block_size = impl, block


def _median_time(fn, args, steps):
  jax.block_until_ready(fn(*args))  # compile
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def _params(key, D, F, E, dtype):
  ks = jax.random.split(key, 4)
  s = D**-0.5
  return {
    "gate": {"kernel": (s * jax.random.normal(ks[0], (D, E))).astype(dtype)},
    "experts": {
      "gate_proj": {"kernel": (s * jax.random.normal(ks[1], (E, D, F))).astype(dtype)},
      "up_proj": {"kernel": (s * jax.random.normal(ks[2], (E, D, F))).astype(dtype)},
      "down_proj": {"kernel": (F**-0.5 * jax.random.normal(ks[3], (E, F, D))).astype(dtype)},
    },
  }


def _dense_params(key, D, W, dtype):
  ks = jax.random.split(key, 3)
  return {
    "gate_proj": (D**-0.5 * jax.random.normal(ks[0], (D, W))).astype(dtype),
    "up_proj": (D**-0.5 * jax.random.normal(ks[1], (D, W))).astype(dtype),
    "down_proj": (W**-0.5 * jax.random.normal(ks[2], (W, D))).astype(dtype),
  }


def _dense_mlp(x, p):
  return (jax.nn.silu(x @ p["gate_proj"]) * (x @ p["up_proj"])) @ p["down_proj"]


def run(args) -> dict:
  D, F, E, k = args.hidden, args.ffn, args.experts, args.topk
  dtype = jnp.dtype(args.dtype)
  key = jax.random.key(0)
  p = _params(key, D, F, E, dtype)
  pd = _dense_params(jax.random.key(1), D, k * F, dtype)
  rows = []
  for phase, T in (("train", args.tokens), ("decode", args.decode_batch)):
    x = jax.random.normal(jax.random.key(2), (T, D), dtype)

    def mlp_loss(pd, x):
      return jnp.sum(_dense_mlp(x, pd).astype(jnp.float32) ** 2)

    if phase == "train":
      ref_fn = jax.jit(jax.value_and_grad(mlp_loss, argnums=(0, 1)))
    else:
      ref_fn = jax.jit(_dense_mlp)
    ref_args = (pd, x) if phase == "train" else (x, pd)
    print(f"[moe bench] {phase}: dense_mlp T={T}", file=sys.stderr)
    t_ref = _median_time(ref_fn, ref_args, args.steps)
    rows.append(dict(phase=phase, form="dense_mlp", tokens=T, seconds=t_ref, ratio=1.0))
    for form in args.forms.split(","):
      cfg = _Cfg(k, form, args.block)

      def layer(p, x, cfg=cfg):
        return moe.sparse_mlp(x, p, cfg)[0]

      if phase == "train":

        def loss(p, x, layer=layer):
          return jnp.sum(layer(p, x).astype(jnp.float32) ** 2)

        fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
      else:
        fn = jax.jit(layer)
      print(f"[moe bench] {phase}: {form} T={T}", file=sys.stderr)
      t = _median_time(fn, (p, x), args.steps)
      rows.append(dict(phase=phase, form=form, tokens=T, seconds=t, ratio=t_ref / t))
  default = moe.resolve_implementation("auto")
  by = {(r["phase"], r["form"]): r["ratio"] for r in rows}
  by.setdefault(("train", default), None)
  by.setdefault(("decode", default), None)
  return {
    "benchmark": "moe",
    "backend": jax.default_backend(),
    "device": str(jax.devices()[0].device_kind),
    "shape": dict(tokens=args.tokens, hidden=D, ffn=F, experts=E, topk=k, dtype=args.dtype),
    "decode_batch": args.decode_batch,
    "block": args.block,
    "steps": args.steps,
    "default_form": default,
    "default_train_ratio": by[("train", default)],
    "default_decode_ratio": by[("decode", default)],
    "target_train_ratio": 0.5,
    "rows": rows,
  }


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--json", action="store_true")
  ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
  ap.add_argument("--tokens", type=int, default=4096)
  ap.add_argument("--hidden", type=int, default=256)
  ap.add_argument("--ffn", type=int, default=256)
  ap.add_argument("--experts", type=int, default=8)
  ap.add_argument("--topk", type=int, default=2)
  ap.add_argument("--decode-batch", type=int, default=16)
  ap.add_argument("--block", type=int, default=256, help="largest row block of the block form")
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--forms", default=",".join(FORMS), help=f"subset of {FORMS}")
  args = ap.parse_args(argv)
  bad = [f for f in args.forms.split(",") if f not in FORMS]
  if bad:
    ap.error(f"--forms: unknown {bad}; choose from {FORMS}")
  if args.quick:
    args.tokens, args.hidden, args.ffn, args.steps = 256, 32, 32, 2
  return args


def main(argv=None):
  args = parse_args(argv)
  emit = json_stdout.reserve(args.json)  # --json: stdout holds the document only
  out = run(args)
  if args.json:
    emit(out)
  else:
    for r in out["rows"]:
      print(
        f"{r['phase']:7s} {r['form']:10s} T={r['tokens']:6d} {r['seconds'] * 1e3:9.2f} ms  x{r['ratio']:.2f}"
      )
    print(f"default form {out['default_form']}: train x{out['default_train_ratio']:.2f}")


if __name__ == "__main__":
  main()

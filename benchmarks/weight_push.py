"""Weight-push throughput per transport, against a raw safetensors write of the same bytes.

  python benchmarks/weight_push.py [--layers 16] [--dir /dev/shm/rstar_weight_push] [--json]

Model: Qwen3-1.7B widths (hidden 2048, MLP 6144, 16 q / 8 kv heads of 128, vocab 151936, tied
embeddings) with 16 of its 28 layers = 1.12 B params, 2.24 GB in bf16. Rows (best of
--repeats, same arrays, same run):
  * memcpy: np.copyto of the same number of bytes (RAM ceiling);
  * raw write (reference): ``safetensors.numpy.save_file`` of the HF-layout tensors, already
    transposed and on the host, to the same tmpfs;
  * disk: ``weight_transfer.disk.write_hf_dir`` from the learner's JAX arrays (kernel
    transposes included) -- the staging write the learner does per push; plus the whole push
    (staging + the stand-in's load of every file + version check);
  * tensor: ``SGLangEngine.update_weights`` with the tensor transport to the in-process SGLang
    stand-in (shared-memory flattened buckets, deserialised with torch's reductions, copied
    into the stand-in's store);
  * distributed: the same with a gloo broadcast group (learner rank 0, stand-in rank 1, TCP on
    127.0.0.1);
  * delta: after a full push the last 4 layers change; a tensor-transport push with
    ``weight_delta`` sends only those; ``delta_compare_s`` times the changed-tensor selection
    alone (one bit-pattern compare per leaf) inside that push.
GB/s = parameter bytes / seconds. ``verified``: the stand-in's received tensors equal the
learner's HF-layout bytes for every transport. Extrapolation to Qwen3-14B (14.77 B params x 2 B)
is by bytes. With --json stdout holds one JSON object only (the table goes to stderr).
"""

import argparse
import asyncio
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

from rstar_jax.models import qwen3  # noqa: E402
from rstar_jax.models import qwen3_hf_layout as layout  # noqa: E402
from rstar_jax.rollout.sglang_engine import SGLangEngine  # noqa: E402
from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer  # noqa: E402
from rstar_jax.rollout.weight_transfer import disk, source  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/json_stdout.py
import json_stdout  # noqa: E402

QWEN3_1P7B_WIDTHS = dict(
  vocab_size=151936,
  hidden_size=2048,
  intermediate_size=6144,
  num_attention_heads=16,
  num_key_value_heads=8,
  head_dim=128,
  tie_word_embeddings=True,
  rope_theta=1e6,
)
QWEN3_14B_BYTES = 14.77e9 * 2


def _best(fn, repeats, setup=None):
  times = []
  for _ in range(repeats):
    if setup is not None:
      setup()
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def _same(got: dict, want: dict) -> bool:
  return set(got) == set(want) and all(
    got[k].shape == v.shape
    and np.array_equal(got[k].reshape(-1).view(np.uint8), v.reshape(-1).view(np.uint8))
    for k, v in want.items()
  )


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--layers", type=int, default=16)
  ap.add_argument("--dir", default="/dev/shm/rstar_weight_push")
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--bucket-mb", type=int, default=256)
  ap.add_argument("--json", action="store_true")
  args = ap.parse_args()
  emit = json_stdout.reserve(args.json)  # --json: stdout holds the JSON only

  config = qwen3.Qwen3Config(**QWEN3_1P7B_WIDTHS, num_hidden_layers=args.layers, dtype="bfloat16")
  rng = np.random.default_rng(0)
  # Leaf by leaf from numpy (values do not matter for I/O; init_params' float32 program
  # would peak near 6x the bf16 size).
  params = jax.tree.map(
    lambda s: jnp.asarray((0.02 * rng.standard_normal(s, np.float32)).astype(jnp.bfloat16)),
    qwen3.param_shapes(config),
    is_leaf=lambda x: isinstance(x, tuple),
  )
  jax.block_until_ready(params)
  table = layout.hf_table(config)
  host = jax.tree.map(np.asarray, params)
  want = {
    t.name: np.ascontiguousarray(layout.to_hf(layout.get_leaf(host, t.path), t)) for t in table
  }
  nbytes = sum(v.nbytes for v in want.values())
  gb = nbytes / 1e9
  print(
    f"model: Qwen3-1.7B widths, {args.layers} layers, "
    f"{sum(x.size for x in jax.tree.leaves(params)) / 1e9:.3f} B params, {gb:.2f} GB bf16"
  )
  os.makedirs(args.dir, exist_ok=True)
  ref = os.path.join(args.dir, "ref.safetensors")
  staged = os.path.join(args.dir, "staged")
  res: dict = {"bytes": nbytes}
  verified = []
  try:
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros_like(src)
    t_copy = _best(lambda: np.copyto(dst, src), args.repeats)  # noqa: F821
    del src, dst
    rm_ref = lambda: os.path.exists(ref) and os.remove(ref)  # noqa: E731
    t_raw = _best(lambda: save_file(want, ref), args.repeats, setup=rm_ref)
    rm_ref()
    rm_staged = lambda: shutil.rmtree(staged, ignore_errors=True)  # noqa: E731
    t_disk = _best(
      lambda: disk.write_hf_dir(staged, config, params, table), args.repeats, setup=rm_staged
    )
    rm_staged()

    async def push(transport, **kw):
      server = await MockSGLangServer().start()
      server.check_finite = False  # its float conversion of 2 GB would dominate
      try:
        opts = {} if transport == "disk" else {"bucket_bytes": args.bucket_mb << 20}
        async with SGLangEngine(
          [server.url],
          os.path.join(args.dir, "stage"),
          keep_versions=1,
          weight_transport=transport,
          transport_options=opts,
          admin_timeout_s=600,
          **kw,
        ) as eng:
          out = []
          for r in range(args.repeats):
            server.weights.clear()
            out.append(await eng.update_weights(config, params, r + 1))
          ok = _same(server.weights, want)
          server.weights.clear()
          if transport != "tensor":
            return min(m["push/seconds"] for m in out), ok, None
          # delta: the last 4 layers change, the rest is as pushed
          eng.weight_delta = True
          await eng.update_weights(config, params, 100)  # baseline kept
          p2 = dict(
            params,
            layers=jax.tree.map(
              lambda x: x.at[-4:].add(jnp.asarray(0.01, x.dtype)), params["layers"]
            ),
          )
          jax.block_until_ready(p2)
          t0 = time.perf_counter()
          source.changed_tensors(p2, params, table)
          compare_s = time.perf_counter() - t0
          m = await eng.update_weights(config, p2, 101)
          return min(x["push/seconds"] for x in out), ok, dict(m, compare_s=compare_s)
      finally:
        server.weights.clear()
        await server.close()

    t_disk_push, ok, _ = asyncio.run(push("disk"))
    verified.append(ok)
    shutil.rmtree(os.path.join(args.dir, "stage"), ignore_errors=True)
    t_tensor, ok, dm = asyncio.run(push("tensor"))
    verified.append(ok)
    t_dist, ok, _ = asyncio.run(push("distributed"))
    verified.append(ok)
  finally:
    shutil.rmtree(args.dir, ignore_errors=True)

  g = lambda t: gb / t  # noqa: E731
  res.update(
    memcpy_gbps=g(t_copy),
    raw_write_gbps=g(t_raw),
    disk_gbps=g(t_disk),
    disk_push_gbps=g(t_disk_push),
    tensor_gbps=g(t_tensor),
    distributed_gbps=g(t_dist),
    delta_fraction=dm["push/delta_fraction"],
    delta_seconds=dm["push/seconds"],
    delta_bytes=dm["push/bytes"],
    delta_compare_s=dm["compare_s"],
    disk_vs_raw=t_raw / t_disk,
    verified=all(verified),
  )
  rows = [
    ("memcpy (RAM ceiling)", t_copy),
    ("raw safetensors save_file (reference)", t_raw),
    ("disk: staging write (write_hf_dir)", t_disk),
    ("disk: full push (write + stand-in load)", t_disk_push),
    ("tensor: full push (shm buckets)", t_tensor),
    ("distributed: full push (gloo bcast)", t_dist),
  ]
  print(f"{'transport':42} {'s':>7} {'GB/s':>7} {'vs raw':>7} {'14B s':>7}")
  for name, t in rows:
    print(f"{name:42} {t:7.2f} {g(t):7.2f} {t_raw / t:7.2f} {QWEN3_14B_BYTES / 1e9 / g(t):7.1f}")
  print(
    f"delta (tensor, last 4 of {args.layers} layers changed): sent "
    f"{dm['push/delta_fraction']:.1%} of tensors, {dm['push/bytes'] / 1e9:.2f} GB in "
    f"{dm['push/seconds']:.2f} s (selection {dm['compare_s']:.2f} s of it); "
    f"verified={all(verified)}"
  )
  if args.json:
    emit({k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items()})


if __name__ == "__main__":
  main()

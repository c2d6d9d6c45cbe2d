"""JAX -> torch DLPack hand-off: GB/s and whether it is zero-copy, on the default JAX device.

  python benchmarks/dlpack_handoff.py [--mb 1024] [--repeats 5] [--json]

The tensor weight transport hands each learner array to torch with ``torch.from_dlpack`` (then
an IPC handle on GPU). Zero-copy means torch's tensor points at the JAX buffer
(``data_ptr() == unsafe_buffer_pointer()``); GB/s is array bytes / hand-off seconds (a
zero-copy hand-off costs microseconds, so this is large; a copying one runs near memory
bandwidth). Reference in the same run: a device copy of the same array (``x + 0``).
With --json stdout holds one JSON object only (the table goes to stderr).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/json_stdout.py
import json_stdout  # noqa: E402


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--mb", type=int, default=1024)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--dtype", default="bfloat16")
  ap.add_argument("--json", action="store_true")
  args = ap.parse_args()
  emit = json_stdout.reserve(args.json)  # --json: stdout holds the JSON only
  import jax
  import jax.numpy as jnp
  import torch

  dev = jax.devices()[0]
  n = (args.mb << 20) // jnp.dtype(args.dtype).itemsize
  x = jax.block_until_ready(jnp.ones((n // 4096, 4096), args.dtype))
  nbytes = x.size * x.dtype.itemsize
  copy = jax.jit(lambda a: a + jnp.zeros((), a.dtype))
  jax.block_until_ready(copy(x))
  times, ctimes, zero_copy = [], [], True
  for _ in range(args.repeats):
    t0 = time.perf_counter()
    t = torch.from_dlpack(x)
    if t.is_cuda:
      torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    zero_copy &= t.data_ptr() == x.unsafe_buffer_pointer()
    del t
    t0 = time.perf_counter()
    jax.block_until_ready(copy(x))
    ctimes.append(time.perf_counter() - t0)
  res = {
    "device_kind": dev.device_kind,
    "platform": dev.platform,
    "bytes": nbytes,
    "dtype": args.dtype,
    "handoff_s": min(times),
    "gbps": nbytes / min(times) / 1e9,
    "zero_copy": bool(zero_copy),
    "device_copy_gbps": nbytes / min(ctimes) / 1e9,
    "torch": torch.__version__,
    "jax": jax.__version__,
  }
  print(
    f"{dev.platform} ({dev.device_kind}): {nbytes / 1e9:.2f} GB {args.dtype} hand-off "
    f"{min(times) * 1e6:.0f} us = {res['gbps']:.0f} GB/s, zero_copy={zero_copy}; "
    f"device copy {res['device_copy_gbps']:.1f} GB/s"
  )
  if args.json:
    emit(res)


if __name__ == "__main__":
  main()

"""Weight-push cost: `qwen3.save_hf` to tmpfs and `qwen3.load_hf_params` back, in GB/s.

  python benchmarks/weight_push.py [--layers 16] [--dir /dev/shm/rstar_weight_push] [--repeats 2]

The RL loop pushes new weights every step by writing an HF directory (`save_hf`) that each
SGLang server re-reads (`POST /update_weights_from_disk`). This measures that write and a
reload (our own loader; SGLang's reader does the same safetensors work) for a 1B-parameter-
shaped Qwen3 in bf16: Qwen3-1.7B widths (hidden 2048, MLP 6144, 16 q / 8 kv heads of 128,
vocab 151936, tied embeddings) with 16 of its 28 layers = 1.12 B params, 2.2 GB, which fits
this 24 GiB machine twice over. Time is linear in bytes (per-tensor overhead is negligible at
these sizes), so the figure scales to Qwen3-14B by bytes: 14.77 B params x 2 B = 29.5 GB.

Reference rows, measured side by side in the same run on the same arrays:
  * memcpy: np.copyto of the same bytes in RAM (upper bound of any tmpfs write);
  * safetensors.numpy save_file / load_file of the same tensors (the library floor: what
    save_hf / load_hf_params add on top is name mapping, dtype handling and the JAX transfer).
The ratio column is GB/s of the row divided by GB/s of the matching safetensors reference.
"""
import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from rstar_jax.models import qwen3  # noqa: E402

QWEN3_1P7B_WIDTHS = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                         tie_word_embeddings=True, rope_theta=1e6)
QWEN3_14B_PARAMS = 14.77e9


def _dir_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def _best(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _memcpy_time(nbytes, repeats):
    src = np.ones(nbytes, np.uint8)    # pages touched: time the copy, not page faults
    dst = np.zeros_like(src)
    return _best(lambda: np.copyto(dst, src), repeats)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--dir", default="/dev/shm/rstar_weight_push")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    config = qwen3.Qwen3Config(**QWEN3_1P7B_WIDTHS, num_hidden_layers=args.layers,
                               dtype="bfloat16")
    t0 = time.perf_counter()
    # Leaf by leaf from numpy (values do not matter for I/O): `init_params` draws all weights
    # in one float32 program, whose temporaries peak near 6x the bf16 size on this host.
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: jnp.asarray((0.02 * rng.standard_normal(s, np.float32)).astype(jnp.bfloat16)),
        qwen3.param_shapes(config), is_leaf=lambda x: isinstance(x, tuple))
    jax.block_until_ready(params)
    n = sum(x.size for x in jax.tree.leaves(params))
    nbytes = sum(x.nbytes for x in jax.tree.leaves(params))
    print(f"model: Qwen3-1.7B widths, {args.layers} layers, {n / 1e9:.3f} B params, "
          f"{nbytes / 1e9:.2f} GB bf16 (init {time.perf_counter() - t0:.1f} s)")

    ours = os.path.join(args.dir, "save_hf")
    ref = os.path.join(args.dir, "ref.safetensors")
    os.makedirs(args.dir, exist_ok=True)
    rows = []
    try:
        # The reference tensors: the same arrays as host numpy, flat names.
        host = {"/".join(str(k.key) for k in path): np.asarray(x)
                for path, x in jax.tree_util.tree_flatten_with_path(params)[0]}

        def save_ours():
            shutil.rmtree(ours, ignore_errors=True)
            qwen3.save_hf(ours, config, params)

        def save_ref():
            save_file(host, ref)

        def load_ours():
            jax.block_until_ready(qwen3.load_hf_params(ours, config, dtype=jnp.bfloat16))

        def load_ref():
            load_file(ref)

        t_copy = _memcpy_time(nbytes, args.repeats)
        t_save_ref = _best(save_ref, args.repeats)
        t_save = _best(save_ours, args.repeats)
        written = _dir_bytes(ours)
        t_load_ref = _best(load_ref, args.repeats)
        t_load = _best(load_ours, args.repeats)
        gbs = lambda t: nbytes / t / 1e9
        rows = [("memcpy (RAM, reference)", t_copy, gbs(t_copy), gbs(t_copy) / gbs(t_save_ref)),
                ("safetensors save_file (reference)", t_save_ref, gbs(t_save_ref), 1.0),
                ("qwen3.save_hf -> tmpfs", t_save, gbs(t_save), gbs(t_save) / gbs(t_save_ref)),
                ("safetensors load_file (reference)", t_load_ref, gbs(t_load_ref), 1.0),
                ("qwen3.load_hf_params <- tmpfs", t_load, gbs(t_load),
                 gbs(t_load) / gbs(t_load_ref))]
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)

    print(f"{'operation':36} {'best s':>8} {'GB/s':>7} {'ratio':>6}")
    for name, t, g, r in rows:
        print(f"{name:36} {t:8.2f} {g:7.2f} {r:6.2f}")
    print(f"(HF dir written: {written / 1e9:.2f} GB; ratio = GB/s / the safetensors reference "
          "of the same direction; memcpy ratio vs safetensors save)")
    b14 = QWEN3_14B_PARAMS * 2
    push = b14 / 1e9 / rows[2][2] + b14 / 1e9 / rows[4][2]
    print(f"extrapolated Qwen3-14B bf16 ({b14 / 1e9:.1f} GB): save {b14 / 1e9 / rows[2][2]:.1f} s "
          f"+ reload {b14 / 1e9 / rows[4][2]:.1f} s = {push:.1f} s per step on this host's tmpfs "
          "(one writer; each server node reloads in parallel)")


if __name__ == "__main__":
    main()

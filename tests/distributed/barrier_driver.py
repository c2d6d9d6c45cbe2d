"""One of 2 processes under scripts/local_cluster.sh: process 1 waits until process 0 has
written the tokenizer before it asks for it (the slow process of a real run), then both meet in
a second barrier. Run by test_barriers.py."""

import os
import sys
import time


def main():
  workdir = sys.argv[1]
  from rstar_jax.pipelines import data_sources, launch

  launch.maybe_initialize_distributed()
  import jax

  from configs import rstar2_tiny_cpu
  from rstar_jax.config import from_config_dict
  from rstar_jax.distributed import primary

  run = from_config_dict(rstar2_tiny_cpu.get_config("rl"))
  corpus = [f"what is {i} + {i * 7}? the answer is {i * 8}." for i in range(200)]
  if jax.process_index() == 1:
    target = os.path.join(workdir, "tokenizer", "tokenizer.json")
    deadline = time.monotonic() + 120
    while not os.path.isfile(target):
      if time.monotonic() > deadline:
        raise SystemExit("process 0 never wrote the tokenizer")
      time.sleep(0.05)
  tok = data_sources.ensure_tokenizer(run, workdir, corpus)
  primary.sync("after_tokenizer")
  print(f"barrier ok: process {jax.process_index()} vocab {tok.vocab_size}", flush=True)


if __name__ == "__main__":
  main()

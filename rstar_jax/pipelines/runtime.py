"""The old home of the run set-up, kept as re-exports for code that still imports it (SFT's loop
sits in another branch's fence). New code imports from where the things live:

* `wiring`: the learner (`build_learner`, `build_learner_for_restore`, `initial_params`,
  `Learner`, `mesh_from`) and the rollout side built from a `RunConfig`;
* `data_sources`: `load_tokenizer`, `check_vocab`;
* `hf_export`: `export_checkpoint`;
* `launch`: `setup_logging`, `maybe_initialize_distributed`, `summary_json`.
"""

from rstar_jax.pipelines.data_sources import check_vocab, load_tokenizer
from rstar_jax.pipelines.hf_export import export_checkpoint
from rstar_jax.pipelines.launch import maybe_initialize_distributed, setup_logging, summary_json
from rstar_jax.pipelines.wiring import (
  Learner,
  build_learner,
  build_learner_for_restore,
  data_parallel_size,
  initial_params,
  mesh_from,
)

__all__ = [
  "Learner",
  "build_learner",
  "build_learner_for_restore",
  "check_vocab",
  "data_parallel_size",
  "export_checkpoint",
  "initial_params",
  "load_tokenizer",
  "maybe_initialize_distributed",
  "mesh_from",
  "setup_logging",
  "summary_json",
]

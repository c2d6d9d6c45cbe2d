"""Export of (sharded) learner params to an HF directory that transformers loads and agrees with."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.learner.checkpoint import export_hf
from rstar_jax.models import qwen3
from rstar_jax.sharding import make_mesh


@pytest.mark.parametrize("tied", [True, False])
def test_export_hf_loads_in_transformers(tmp_path, tied):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  cfg = qwen3.Qwen3Config(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    tie_word_embeddings=tied,
  )
  params = qwen3.init_params(cfg, jax.random.key(1))
  # Perturb every leaf (norm scales included) so a mis-mapped tensor changes the logits.
  keys = iter(jax.random.split(jax.random.key(2), len(jax.tree.leaves(params))))
  params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), params)
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  params = jax.device_put(params, qwen3.param_shardings(cfg, mesh))
  export_hf(tmp_path / "hf", cfg, params)

  model = transformers.AutoModelForCausalLM.from_pretrained(
    str(tmp_path / "hf"), local_files_only=True, dtype=torch.float32
  )
  ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 9))
  with torch.no_grad():
    want = model(torch.tensor(ids)).logits.numpy()
  got = np.asarray(qwen3.forward(jax.device_get(params), cfg, jnp.asarray(ids, jnp.int32)))
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)

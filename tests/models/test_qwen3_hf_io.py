"""HF safetensors I/O: transformers reload, exact round trips, sharded files, clear errors."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_test_utils import torch_logits
from safetensors.numpy import load_file, save_file

from rstar_jax.models import qwen3
from rstar_jax.models.qwen3_hf_io import CheckpointError

fwd = jax.jit(qwen3.forward, static_argnames="config")


def _ids(config, shape, seed=0):
  return np.random.default_rng(seed).integers(0, config.vocab_size, shape).astype(np.int32)


def _reload_torch(path):
  import transformers

  return transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()


@pytest.mark.parametrize("case", ["qwen3_gqa4_untied", "qwen2_gqa2"])
def test_export_reloads_in_transformers_with_identical_logits(hf_models, tmp_path, case):
  hf_dir, model = hf_models(case)
  config = qwen3.Qwen3Config.from_hf(hf_dir)
  params = qwen3.load_hf_params(hf_dir, config)
  qwen3.save_hf(tmp_path, config, params, max_shard_size_bytes=16_000)  # force many shards
  assert os.path.isfile(tmp_path / "model.safetensors.index.json")
  reloaded = _reload_torch(tmp_path)
  assert type(reloaded).__name__ == type(model).__name__
  ids = _ids(config, (2, 7))
  np.testing.assert_array_equal(torch_logits(reloaded, ids), torch_logits(model, ids))


def test_fresh_jax_params_export_match_transformers(tmp_path):
  """Params made in JAX (not read from HF), tied + biased, exported: transformers agrees."""
  config = qwen3.Qwen3Config(
    vocab_size=70,
    hidden_size=24,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=4,
    tie_word_embeddings=True,
    attention_bias=True,
    rope_theta=777.0,
    rms_norm_eps=1e-5,
  )
  params = qwen3.init_params(config, jax.random.key(3))
  # Non-trivial norms and biases so a dropped or misnamed tensor would show.
  params = jax.tree_util.tree_map_with_path(
    lambda p, x: (
      x + 0.3 * jax.random.normal(jax.random.key(len(str(p))), x.shape)
      if p[-1].key in ("scale", "bias")
      else x
    ),
    params,
  )
  qwen3.save_hf(tmp_path, config, params)
  cfg = json.load(open(tmp_path / "config.json"))
  assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": 777.0}
  assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["dtype"] == "float32"
  assert os.path.isfile(tmp_path / "model.safetensors")
  ids = _ids(config, (2, 9))
  err = np.abs(
    torch_logits(_reload_torch(tmp_path), ids) - np.asarray(fwd(params, config, jnp.asarray(ids)))
  ).max()
  assert err < 1e-4, err


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_load_export_load_is_exact(hf_models, tmp_path, dtype):
  hf_dir, _ = hf_models("qwen3_mha_tied_bias")
  config = qwen3.Qwen3Config.from_hf(hf_dir)
  p1 = qwen3.load_hf_params(hf_dir, config, dtype=dtype)
  qwen3.save_hf(tmp_path, config, p1, max_shard_size_bytes=10_000)
  assert qwen3.Qwen3Config.from_hf(tmp_path) == config
  p2 = qwen3.load_hf_params(tmp_path, config, dtype=dtype)
  assert jax.tree.structure(p1) == jax.tree.structure(p2)
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
    assert a.dtype == b.dtype == dtype
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
  if dtype == jnp.bfloat16:
    assert json.load(open(tmp_path / "config.json"))["dtype"] == "bfloat16"


# ----------------------------------------------------------------------------- bad input


@pytest.fixture
def broken_copy(hf_models, tmp_path):
  hf_dir, _ = hf_models("qwen3_mha_tied_bias")
  dst = tmp_path / "ckpt"
  shutil.copytree(hf_dir, dst)
  return dst


def test_missing_config_file_is_named(broken_copy):
  os.remove(broken_copy / "config.json")
  with pytest.raises(FileNotFoundError, match="config.json"):
    qwen3.Qwen3Config.from_hf(broken_copy)


def test_missing_safetensors_is_named(broken_copy):
  config = qwen3.Qwen3Config.from_hf(broken_copy)
  os.remove(broken_copy / "model.safetensors")
  with pytest.raises(FileNotFoundError, match="safetensors"):
    qwen3.load_hf_params(broken_copy, config)


def test_missing_shard_listed_in_index_is_named(hf_models, tmp_path):
  hf_dir, _ = hf_models("qwen3_mha_tied_bias")
  config = qwen3.Qwen3Config.from_hf(hf_dir)
  qwen3.save_hf(tmp_path, config, qwen3.load_hf_params(hf_dir, config), max_shard_size_bytes=10_000)
  shards = sorted(tmp_path.glob("model-*.safetensors"))
  assert len(shards) > 2
  os.remove(shards[1])
  with pytest.raises(FileNotFoundError, match=r"model-00002-of-\d+\.safetensors"):
    qwen3.load_hf_params(tmp_path, config)


def test_missing_tensor_is_named(broken_copy):
  config = qwen3.Qwen3Config.from_hf(broken_copy)
  tensors = load_file(broken_copy / "model.safetensors")
  del tensors["model.layers.1.self_attn.k_norm.weight"]
  save_file(tensors, broken_copy / "model.safetensors")
  with pytest.raises(CheckpointError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight"):
    qwen3.load_hf_params(broken_copy, config)


def test_wrong_shape_is_named_with_expected_and_got(broken_copy):
  config = qwen3.Qwen3Config.from_hf(broken_copy)
  tensors = load_file(broken_copy / "model.safetensors")
  tensors["model.layers.0.mlp.up_proj.weight"] = np.zeros((63, 32), np.float32)
  save_file(tensors, broken_copy / "model.safetensors")
  with pytest.raises(CheckpointError, match=r"up_proj\.weight.*\(63, 32\).*expected \(64, 32\)"):
    qwen3.load_hf_params(broken_copy, config)


def test_unsupported_model_type_is_named(broken_copy):
  cfg = json.load(open(broken_copy / "config.json"))
  cfg["model_type"] = "llama"
  json.dump(cfg, open(broken_copy / "config.json", "w"))
  with pytest.raises(ValueError, match="unsupported model_type 'llama'"):
    qwen3.Qwen3Config.from_hf(broken_copy)
  with pytest.raises(ValueError, match="llama"):
    qwen3.load_hf_params(broken_copy)

"""HF export (issue 29 row 4): a checkpoint of a run that started from a bf16 Qwen3-style
directory exports bf16 by default (``dtype`` overrides), writes generation_config.json with the
run's stop ids, and its tokenizer carries the run's chat template; transformers loads the
export, `apply_chat_template` reproduces the training prompt ids, and greedy generation agrees
with our model."""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.config import from_config_dict
from rstar_jax.errors import UserError
from rstar_jax.learner.checkpoint import Checkpointer
from rstar_jax.models import qwen3
from rstar_jax.pipelines import hf_export, wiring
from rstar_jax.tokenization import chat_format as cf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("jinja2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tokenization"))
from qwen3_reference import QWEN3_HYBRID, qwen3_like_tokenizer  # noqa: E402

Q = "Compute 7 * 8."
_forward = jax.jit(qwen3.forward, static_argnums=1)
SYSTEM = "Solve it with the tool; answer in \\boxed{}."


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A bf16 Qwen3-style source directory: weights, config.json (dtype bfloat16), a tokenizer
  with Qwen3's specials and Qwen3's own chat template, generation_config.json with Qwen3's two
  EOS ids and a sampling setting."""
  d = str(tmp_path_factory.mktemp("src"))
  corpus = [cf.prompt_text(f, Q, s, t) for f in cf.FORMATS for s in (None, SYSTEM) for t in (0, 1)]
  tok = qwen3_like_tokenizer(corpus, QWEN3_HYBRID, out_dir=d, vocab_size=600)
  cfg = qwen3.Qwen3Config(
    vocab_size=len(tok),
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    tie_word_embeddings=False,
    max_position_embeddings=512,
  )
  params = qwen3.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(1)  # numpy: no per-shape compile
  params = jax.tree.map(lambda x: np.asarray(x) + 0.1 * rng.standard_normal(x.shape), params)
  qwen3.save_hf(d, cfg, params, dtype="bfloat16")
  eos = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
  with open(os.path.join(d, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": eos, "temperature": 0.6}, f)
  return d


def _run(src, fmt="rstar2", system_prompt="", with_tools=True):
  from configs import rstar2_tiny_cpu

  c = rstar2_tiny_cpu.get_config("rl")
  c.model.hf_dir = src
  c.mesh.num_devices = 1
  c.rollout.chat_format = fmt
  c.rollout.system_prompt = system_prompt
  c.rollout.with_tools = with_tools
  return from_config_dict(c, "rl")


@pytest.fixture(scope="module")
def checkpoint(source, tmp_path_factory):
  """A checkpoint of a run from ``source`` whose params moved off the bf16 grid (as training
  moves them), so a float32 export differs from a bf16 one."""
  run = _run(source)
  learner = wiring.build_learner_for_restore(run)
  params = jax.tree.map(
    lambda x: jax.device_put(np.asarray(x) * np.float32(1 + 1e-3), x.sharding), learner.state.params
  )
  state = learner.state.replace(params=params, step=jnp.asarray(3, learner.state.step.dtype))
  d = str(tmp_path_factory.mktemp("ckpt"))
  with Checkpointer(d) as ck:
    ck.save(state, {"stage": 0})
  return d, jax.device_get(params)


def _prompt_via_template(tok, system_prompt=""):
  msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
    {"role": "user", "content": Q}
  ]
  text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
  return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize(
  "fmt,system_prompt,with_tools",
  [("rstar2", "", True), ("qwen3_thinking", "", True), ("rstar2_released", SYSTEM, False)],
)
def test_export_is_bf16_with_trained_template_and_stop_ids(
  source, checkpoint, tmp_path, fmt, system_prompt, with_tools
):
  ckpt, params = checkpoint
  run = _run(source, fmt, system_prompt, with_tools)
  out = str(tmp_path / "hf")
  assert hf_export.export_checkpoint(run, ckpt, out, tokenizer_path=source) == 3

  # bf16, as the source; the values are the trained params rounded to bf16.
  from safetensors.numpy import load_file

  tensors = load_file(os.path.join(out, "model.safetensors"))
  assert {str(t.dtype) for t in tensors.values()} == {"bfloat16"}
  assert json.load(open(os.path.join(out, "config.json")))["dtype"] == "bfloat16"
  want = np.asarray(params["embed_tokens"]["embedding"]).astype(jnp.bfloat16)
  np.testing.assert_array_equal(tensors["model.embed_tokens.weight"], want)

  # generation_config.json: the stop ids training used, the source's other settings kept.
  tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
  gen = json.load(open(os.path.join(out, "generation_config.json")))
  stop = list(cf.stop_token_ids(tok, source))
  assert gen["eos_token_id"] == stop and len(stop) == 2
  assert gen["temperature"] == 0.6 and isinstance(gen["pad_token_id"], int)

  # The exported template renders the training prompt token for token (rStar2's <reason>
  # prefill included); the source's stock Qwen3 template would not.
  train_ids = cf.prompt_ids(tok, fmt, Q, system_prompt or None, with_tools)
  assert _prompt_via_template(tok, system_prompt) == train_ids
  src_tok = transformers.AutoTokenizer.from_pretrained(source, local_files_only=True)
  assert _prompt_via_template(src_tok, system_prompt) != train_ids

  # transformers loads it and generates greedily what our model (same bf16 weights) picks:
  # one forward of ours over prompt + generated tokens has the same logits, and its argmax at
  # each position is the next generated token.
  model = transformers.AutoModelForCausalLM.from_pretrained(
    out, local_files_only=True, dtype=torch.float32
  )
  assert list(model.generation_config.eos_token_id) == stop
  with torch.no_grad():
    seq = model.generate(torch.tensor([train_ids]), max_new_tokens=3, do_sample=False)
    theirs = model(seq).logits[0].numpy()
  seq = seq[0].tolist()
  assert len(seq) == len(train_ids) + 3 and seq[: len(train_ids)] == train_ids
  bf = jax.tree.map(lambda x: jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), params)
  ours = np.asarray(_forward(bf, run.model.qwen3_config(), jnp.asarray([seq], jnp.int32))[0])
  np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
  assert ours[len(train_ids) - 1 : -1].argmax(-1).tolist() == seq[len(train_ids) :]


def test_dtype_flag_overrides_the_source(source, checkpoint, tmp_path):
  ckpt, params = checkpoint
  run = _run(source)
  from safetensors.numpy import load_file

  for dtype in ("float32", "float16"):
    out = str(tmp_path / dtype)
    hf_export.export_checkpoint(run, ckpt, out, tokenizer_path=source, dtype=dtype)
    tensors = load_file(os.path.join(out, "model.safetensors"))
    assert {str(t.dtype) for t in tensors.values()} == {dtype}
    assert json.load(open(os.path.join(out, "config.json")))["dtype"] == dtype
  np.testing.assert_array_equal(
    load_file(os.path.join(tmp_path / "float32", "model.safetensors"))["model.norm.weight"],
    np.asarray(params["norm"]["scale"]),
  )
  with pytest.raises(UserError, match=r"export_hf --dtype: expected one of .*got 'fp8'"):
    hf_export.export_checkpoint(
      run, ckpt, str(tmp_path / "bad"), tokenizer_path=source, dtype="fp8"
    )
  assert not os.path.exists(tmp_path / "bad")


def test_source_dtype(source, tmp_path):
  """bf16 from the checkpoint's config.json or from bf16 params; float32 otherwise."""
  assert hf_export.source_dtype(_run(source)) == "bfloat16"
  from configs import rstar2_tiny_cpu

  c = rstar2_tiny_cpu.get_config("rl")
  assert hf_export.source_dtype(from_config_dict(c, "rl")) == "float32"  # from scratch, f32
  c.model.param_dtype = "bfloat16"
  assert hf_export.source_dtype(from_config_dict(c, "rl")) == "bfloat16"
  legacy = tmp_path / "legacy"
  legacy.mkdir()
  (legacy / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
  assert hf_export._hf_dtype(str(legacy)) == "float16"


def test_launcher_bad_dtype_is_one_line(tmp_path):
  import subprocess

  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  ckpt = tmp_path / "ckpt"
  ckpt.mkdir()
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "launchers.export_hf",
      "--config=configs/rstar2_tiny_cpu.py",
      f"--checkpoint_dir={ckpt}",
      f"--tokenizer_dir={ckpt}",
      f"--out_dir={tmp_path}/out",
      "--dtype=fp8",
    ],
    cwd=repo,
    env=dict(os.environ, XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""), JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "export_hf --dtype: expected one of ['float32', 'bfloat16', 'float16'], got 'fp8'" in (
    proc.stderr
  )

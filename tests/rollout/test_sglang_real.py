"""Against a real SGLang server: runs only where `sglang` is importable and a GPU is present.

SGLang pins its own torch/transformers and its server does not start on CPU (no CPU build of its kernels on PyPI),
so this runs in a GPU environment with sglang installed; everywhere else it is skipped.
"""

import asyncio
import importlib.util
import os
import shutil
import socket
import subprocess
import sys

import pytest


def _gpu_present() -> bool:
  if shutil.which("nvidia-smi") or shutil.which("rocm-smi"):
    return True
  return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/kfd")


_REASON = (
  "needs `sglang` importable and a GPU (sglang importable: "
  f"{importlib.util.find_spec('sglang') is not None}, GPU: {_gpu_present()})"
)
pytestmark = pytest.mark.skipif(
  importlib.util.find_spec("sglang") is None or not _gpu_present(), reason=_REASON
)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.timeout(900)
def test_real_sglang_generate_and_weight_push(tmp_path):
  import jax
  from rollout_helpers import make_tokenizer

  from rstar_jax.models import qwen3
  from rstar_jax.rollout import GenerateRequest, SamplingParams, SGLangEngine

  tok = make_tokenizer(str(tmp_path / "model"))
  cfg = qwen3.Qwen3Config(
    vocab_size=len(tok),
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    max_position_embeddings=2048,
  )
  params = qwen3.init_params(cfg, jax.random.PRNGKey(0))
  qwen3.save_hf(str(tmp_path / "model"), cfg, params)
  port = _free_port()
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "sglang.launch_server",
      "--model-path",
      str(tmp_path / "model"),
      "--host",
      "127.0.0.1",
      "--port",
      str(port),
      "--skip-tokenizer-init",
      "--mem-fraction-static",
      "0.3",
      "--disable-cuda-graph",
    ]
  )
  try:

    async def main():
      async with SGLangEngine(
        [f"http://127.0.0.1:{port}"], staging_dir=str(tmp_path / "staging")
      ) as eng:
        await eng.wait_healthy(timeout_s=600)
        caps = await eng.refresh_capacity()
        assert list(caps.values())[0] > 0
        req = GenerateRequest([1, 2, 3], SamplingParams(8, temperature=0.0), rid="r:0")
        a = (await eng.generate([req]))[0]
        assert len(a.output_ids) == 8 and len(a.logprobs) == 8
        assert a.finish_reason == "length"
        await eng.update_weights(cfg, params, 1)
        b = (await eng.generate([req]))[0]
        assert b.output_ids == a.output_ids and b.weight_version == 1

    asyncio.run(main())
  finally:
    proc.terminate()
    try:
      proc.wait(60)
    except subprocess.TimeoutExpired:
      proc.kill()

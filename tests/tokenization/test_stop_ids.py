"""Stop ids: <|im_end|> plus the EOS ids of the checkpoint's generation_config.json, chosen
where a run is wired (`wiring.rollout_settings`), so the JaxSampler and SGLang requests both
stop on them."""

import asyncio
import dataclasses
import json

import pytest
from rollout_helpers import FakePool, ScriptedEngine, make_tokenizer

from rstar_jax.config import RunConfig, schema
from rstar_jax.data.problems import Problem
from rstar_jax.pipelines import wiring
from rstar_jax.rollout.sglang_engine import sampling_to_sglang
from rstar_jax.tokenization import chat_format as cf


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("ckpt")
  tok = make_tokenizer(str(d))
  eot = tok.convert_tokens_to_ids("<|endoftext|>")
  # Qwen3's generation_config lists <|im_end|> and <|endoftext|>.
  (d / "generation_config.json").write_text(
    json.dumps({"eos_token_id": [cf.stop_token_id(tok), eot], "top_k": 20})
  )
  return d, tok, eot


def test_stop_token_ids_read_generation_config(model_dir, tmp_path):
  d, tok, eot = model_dir
  im_end = cf.stop_token_id(tok)
  assert cf.stop_token_ids(tok, str(d)) == (im_end, eot)
  assert cf.stop_token_ids(tok, "") == (im_end,)
  assert cf.stop_token_ids(tok, str(tmp_path)) == (im_end,)  # no generation_config.json
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eot}))
  assert cf.stop_token_ids(tok, str(tmp_path)) == (im_end, eot)
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
  with pytest.raises(ValueError, match="eos_token_id: expected an id or a list of ids"):
    cf.stop_token_ids(tok, str(tmp_path))
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [10**6]}))
  with pytest.raises(ValueError, match="outside the tokenizer"):
    cf.stop_token_ids(tok, str(tmp_path))


def test_runner_requests_stop_on_checkpoint_eos_ids(model_dir):
  d, tok, eot = model_dir
  run = RunConfig(mode="rl", model=schema.ModelConfig(hf_dir=str(d)))
  eng = ScriptedEngine(tok, lambda r, t: "so 4 <answer>\\boxed{4}</answer>")
  runner = wiring.make_runner(run, eng, FakePool(), tok)
  settings = dataclasses.replace(
    wiring.rollout_settings(run, tokenizer=tok), response_budget=64, max_turns=2
  )
  asyncio.run(runner.rollout(Problem("What is 2+2?", "4"), seed=0, settings=settings))
  sp = eng.requests[0].sampling
  assert sp.stop_token_ids == (cf.stop_token_id(tok), eot)
  assert sampling_to_sglang(sp)["stop_token_ids"] == [cf.stop_token_id(tok), eot]

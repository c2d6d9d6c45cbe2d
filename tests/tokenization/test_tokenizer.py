import os
import time

import pytest
from rollout_helpers import CORPUS, make_tokenizer
from transformers import AutoTokenizer

from rstar_jax.tokenization import chat_format
from rstar_jax.tokenization.bpe import SPECIAL_TOKENS, load_tokenizer, train_bpe_tokenizer


def test_trains_fast_and_round_trips(tmp_path):
  t0 = time.perf_counter()
  tok = make_tokenizer(str(tmp_path))
  assert time.perf_counter() - t0 < 30  # generous: imports included; training itself is ms
  assert len(tok) <= 512
  for text in [
    "Hello, wörld! 数学 🙂\r\n\tx = 1",
    "print(2+2)\n",
    "  leading spaces",
    '<tool_call>\n{"a": 1}\n</tool_call><|im_end|>',
  ]:
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_are_single_ids(tokenizer):
  ids = set()
  for t in SPECIAL_TOKENS:
    enc = tokenizer.encode(t, add_special_tokens=False)
    assert len(enc) == 1, (t, enc)
    ids.add(enc[0])
    # also inside running text
    enc2 = tokenizer.encode("ab" + t + "cd", add_special_tokens=False)
    assert enc[0] in enc2
  assert len(ids) == len(SPECIAL_TOKENS)
  assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_autotokenizer_loads_saved_dir(tmp_path):
  tok = make_tokenizer(str(tmp_path))
  assert os.path.isfile(tmp_path / "tokenizer.json")
  auto = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
  text = chat_format.prompt_text("rstar2", "What is 7*6?")
  assert auto.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
  assert load_tokenizer(str(tmp_path)).encode(text, add_special_tokens=False) == auto.encode(
    text, add_special_tokens=False
  )


def test_bad_inputs(tmp_path):
  with pytest.raises(ValueError, match="vocab_size"):
    train_bpe_tokenizer(CORPUS, 100)
  with pytest.raises(ValueError, match="texts is empty"):
    train_bpe_tokenizer([], 400)
  with pytest.raises(FileNotFoundError, match="not a directory"):
    load_tokenizer(str(tmp_path / "nope"))
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    load_tokenizer(str(tmp_path))

"""A small byte-level BPE tokenizer trained offline with `tokenizers` (tests and the CPU demo).

With a real checkpoint use its own tokenizer (`load_tokenizer(checkpoint_dir)`). For tiny random
models there is no hub, so `train_bpe_tokenizer` trains a byte-level BPE on given text, adds the
ChatML / tool / answer special tokens as single ids and the ChatML chat template of
`chat_format`, and saves a directory that `transformers.AutoTokenizer.from_pretrained` loads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from rstar_jax.errors import UserError
from rstar_jax.tokenization.chat_format import chat_template

SPECIAL_TOKENS = (
  "<|endoftext|>",
  "<|im_start|>",
  "<|im_end|>",
  "<tool_call>",
  "</tool_call>",
  "<tool_response>",
  "</tool_response>",
  "<answer>",
  "</answer>",
  "<reason>",
  "</reason>",
)
PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | None = None):
  """Trains a byte-level BPE on `texts` and returns a transformers fast tokenizer.

  The special tokens (SPECIAL_TOKENS) get ids 0..10 and are never split; every byte is in the
  base alphabet, so any text round-trips. `vocab_size` counts specials + 256 bytes + merges.
  If `out_dir` is given the tokenizer is saved there (tokenizer.json, tokenizer_config.json,
  chat_template.jinja) and `AutoTokenizer.from_pretrained(out_dir)` loads it.
  """
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  minimum = len(SPECIAL_TOKENS) + 256
  if not isinstance(vocab_size, int) or vocab_size < minimum:
    raise ValueError(
      f"train_bpe_tokenizer: vocab_size must be an int >= {minimum} "
      f"(specials + 256 bytes), got {vocab_size!r}"
    )
  texts = list(texts)
  if not texts:
    raise ValueError("train_bpe_tokenizer: texts is empty")
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=list(SPECIAL_TOKENS),
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(texts, trainer=trainer)
  fast = PreTrainedTokenizerFast(
    tokenizer_object=tok,
    eos_token=EOS_TOKEN,
    pad_token=PAD_TOKEN,
    additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (EOS_TOKEN, PAD_TOKEN)],
    chat_template=chat_template(),
    clean_up_tokenization_spaces=False,
  )
  if out_dir is not None:
    os.makedirs(out_dir, exist_ok=True)
    fast.save_pretrained(out_dir)
  return fast


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


class TokenizerNotFoundError(UserError, FileNotFoundError):
  """A model / tokenizer directory without tokenizer files."""


def has_tokenizer(path: str) -> bool:
  """Whether directory ``path`` holds tokenizer files transformers can load."""
  return any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES)


def load_tokenizer(path: str):
  """`AutoTokenizer.from_pretrained(path)` offline, with a clear error for a bad directory."""
  from transformers import AutoTokenizer

  if not os.path.isdir(path):
    raise TokenizerNotFoundError(f"load_tokenizer: {path!r} is not a directory")
  if not has_tokenizer(path):
    raise TokenizerNotFoundError(
      f"load_tokenizer: {path!r} holds no tokenizer.json / tokenizer_config.json"
    )
  tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
  missing = [
    t
    for t in (EOS_TOKEN, "<|im_start|>")
    if tok.convert_tokens_to_ids(t) in (None, tok.unk_token_id)
  ]
  if missing:
    raise ValueError(f"load_tokenizer: {path!r} lacks the ChatML special tokens {missing}")
  return tok

"""A from-scratch tokenizer for a tiny model: byte-level BPE plus whole "domain" tokens.

On a 2-core CPU the prompt cost matters: the chat format's fixed strings (the user prefix and
the text around a tool call's code) become single tokens, digits can be split one per token
(numbers are then spelled the same wherever they appear), and whole numbers "0".."n-1" can be
single tokens (copying a number from the question into code and from the tool output into the
answer is then copying one token, which a ~1M-parameter model learns from a few hundred SFT
steps). Used by the CPU demo; at 14B scale use the checkpoint's own tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence

from rstar_jax.tokenization import bpe, chat_format


def domain_tokens() -> list[str]:
  """The chat format's fixed strings that become single tokens: the user-message prefix and
  the text before / after the code of a tool call. (Byte-level BPE pre-splits on punctuation,
  so no number of merges would join them.)"""

  head, tail = chat_format.format_tool_call("@CODE@", "").split("@CODE@")
  return [chat_format.USER_PREFIX, head, tail]


def train_domain_tokenizer(
  texts: Sequence[str],
  vocab_size: int,
  out_dir: str,
  added: Sequence[str] = (),
  split_digits: bool = False,
):
  """`bpe.train_bpe_tokenizer` with ``added`` strings as extra whole tokens (``vocab_size``
  counts them) and, with ``split_digits``, every digit its own token. Saved to ``out_dir``
  and reloaded with `bpe.load_tokenizer`."""
  from tokenizers import AddedToken, pre_tokenizers

  tok = bpe.train_bpe_tokenizer(texts, vocab_size - len(added), None)
  if split_digits:
    # Digits split before the byte-level step; merges that join digits simply never apply.
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
      [
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
      ]
    )
  if added:
    tok.add_tokens([AddedToken(a, normalized=False, special=False) for a in added])
  tok.save_pretrained(out_dir)
  return bpe.load_tokenizer(out_dir)

"""Tokenizer (offline byte-level BPE for tests/demo) and the rStar2-Agent / ASTER chat formats (docs/fidelity.md)."""

from rstar_jax.tokenization.bpe import SPECIAL_TOKENS, load_tokenizer, train_bpe_tokenizer
from rstar_jax.tokenization.chat_format import (
  RenderedChat,
  ToolCall,
  chat_template,
  get_format,
  parse_tool_calls,
  prompt_ids,
  prompt_text,
  render_chat_ids,
  stop_token_id,
  stop_token_ids,
  tool_turn_ids,
  tool_turn_text,
)

__all__ = [
  "SPECIAL_TOKENS",
  "load_tokenizer",
  "train_bpe_tokenizer",
  "RenderedChat",
  "ToolCall",
  "chat_template",
  "get_format",
  "parse_tool_calls",
  "prompt_ids",
  "prompt_text",
  "render_chat_ids",
  "stop_token_id",
  "stop_token_ids",
  "tool_turn_ids",
  "tool_turn_text",
]

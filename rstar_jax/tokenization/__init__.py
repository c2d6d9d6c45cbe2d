"""Tokenizer (offline byte-level BPE for tests/demo) and the rStar2-Agent / ASTER chat formats (docs/fidelity.md)."""

from rstar_jax.tokenization.bpe import SPECIAL_TOKENS, load_tokenizer, train_bpe_tokenizer
from rstar_jax.tokenization.chat_format import (
  RenderedChat,
  ToolCall,
  build_prompt_ids,
  build_prompt_text,
  parse_tool_calls,
  render_chat_ids,
  stop_token_id,
  tool_turn_ids,
  tool_turn_text,
)

__all__ = [
  "SPECIAL_TOKENS",
  "load_tokenizer",
  "train_bpe_tokenizer",
  "RenderedChat",
  "ToolCall",
  "build_prompt_ids",
  "build_prompt_text",
  "parse_tool_calls",
  "render_chat_ids",
  "stop_token_id",
  "tool_turn_ids",
  "tool_turn_text",
]

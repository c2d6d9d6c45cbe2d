"""Policy models: the Qwen3 / Qwen2 decoder (``qwen3``), its KV cache and HF checkpoint I/O."""

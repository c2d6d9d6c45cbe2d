"""Policy models: the Qwen3 / Qwen2 decoder (``qwen3``), its KV cache, the LoRA adapters
(``lora``) and the HF checkpoint / PEFT I/O."""
